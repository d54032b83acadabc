/* SPDX-License-Identifier: MIT */
/*
 * libuvsock-preload.so, internals shared by its files: the per-fd state of the AF_VSOCK sockets
 * it emulates (table.c), the VM lookup through uvsockd's control socket (vms.c), and the libc
 * functions it wraps, resolved with dlsym(RTLD_NEXT) (shim.c). docs/shim.md is the reference.
 *
 * Every AF_VSOCK socket is a real AF_UNIX socket of the same type: unconnected until connect()
 * connects it to the VM's hybrid socket, or replaced (dup3) by the Unix listener(s) of
 * <uds_path>_<port> at listen(). Reads, writes, poll, epoll, shutdown, fcntl and fork therefore
 * need nothing from us; what the kernel keeps for a vsock socket besides (addresses, vsock
 * options, a non-blocking connect's result) is a struct vsk, reached from each fd that refers to
 * the socket (dup aware, refcounted).
 *
 * Threads: the table is safe from any thread (one mutex, held only around table updates and
 * never across a call into another wrapped function; taken around fork() so a child never
 * inherits it locked). Fields of one vsk are changed by the thread that calls into that socket;
 * two threads connecting or listening on one socket at once are not serialized (the kernel
 * does serialize them: such a program is racy anyway).
 */
#ifndef UVSOCK_SHIM_SHIM_H
#define UVSOCK_SHIM_SHIM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "util/uds.h"

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif

/* linux/vm_sockets.h, written out so the build needs no kernel headers. */
#define SHIM_CID_ANY 0xffffffffu
#define SHIM_CID_HOST 2u
#define SHIM_PORT_ANY 0xffffffffu
#define SHIM_SO_BUFFER_SIZE 0
#define SHIM_SO_BUFFER_MIN_SIZE 1
#define SHIM_SO_BUFFER_MAX_SIZE 2
#define SHIM_SO_CONNECT_TIMEOUT_OLD 6
#define SHIM_SO_CONNECT_TIMEOUT_NEW 8
#define SHIM_IOCTL_GET_LOCAL_CID 0x7b9 /* _IO(7, 0xb9) */

/* net/vmw_vsock/af_vsock.c: the defaults of a new socket. */
#define SHIM_DEFAULT_BUF (256u * 1024)
#define SHIM_DEFAULT_BUF_MIN 128u
#define SHIM_DEFAULT_CONNECT_TIMEOUT_NS (2ull * 1000000000ull)

/* The most fds the table covers (sockets above it are refused with EMFILE). */
#define SHIM_MAX_FD (1 << 20)
#define SHIM_MAX_VMS 64
#define SHIM_PATH_MAX 108

enum vsk_kind {
	VK_SOCKET,   /* an AF_VSOCK socket */
	VK_DEV,      /* /dev/vsock as opened through the shim (a /dev/null fd) */
};

enum vsk_state {
	VS_NEW,       /* as socket() left it */
	VS_BOUND,     /* bind() took a port; nothing listens yet */
	VS_LISTEN,    /* listening: fd is the Unix listener, or an epoll fd over several */
	VS_CONNECTED, /* connected through the hybrid handshake */
};

/* One Unix listener of a listening socket: <uds_path of VM cid>_<port>. */
struct vsk_listener {
	int fd;            /* the fd itself when the socket has one listener; else our own fd */
	uint32_t cid;
	struct uds_listener ul;
	char path[SHIM_PATH_MAX];
};

struct vsk {
	int refs;          /* fds of this process that refer to it; under the table lock */
	enum vsk_kind kind;
	int type;          /* SOCK_STREAM or SOCK_SEQPACKET */
	enum vsk_state state;
	uint32_t lcid, lport, pcid, pport;
	int so_error;      /* result of a non-blocking connect, until SO_ERROR reads it */
	uint64_t connect_timeout_ns;
	uint64_t buf_size, buf_min, buf_max;
	/* Listening: the process that created the socket files (only it removes them). */
	pid_t owner;
	int nl;
	unsigned next;     /* round robin over l[] */
	struct vsk_listener *l;
};

/*
 * The table: fd -> struct vsk. shim_vsk_new() returns a vsk with one reference, the caller's.
 * shim_get() returns the vsk of fd with a reference (drop it with
 * shim_put) or NULL. shim_set() makes fd refer to v (taking a reference; an older entry of fd
 * is dropped). shim_drop() forgets fd (what close() does). shim_is_ours() is a lock-free test
 * for the hot paths. shim_put() of the last reference frees v and closes its extra listeners.
 */
struct vsk *shim_vsk_new(enum vsk_kind kind, int type);
struct vsk *shim_get(int fd);
void shim_put(struct vsk *v);
int shim_set(int fd, struct vsk *v);
void shim_drop(int fd);
/* shim_drop() of every fd in [first, last] (close_range, closefrom). */
void shim_drop_range(unsigned first, unsigned last);
bool shim_is_ours(int fd);
/* Calls fn on every fd in the table (under the lock: fn must not call wrapped functions). */
void shim_foreach(void (*fn)(int fd, struct vsk *v, void *arg), void *arg);
/* True if another socket of this process is bound to or listens on port. */
bool shim_port_taken(uint32_t port, int type, const struct vsk *except);
void shim_table_atfork_prepare(void);
void shim_table_atfork_parent(void);
void shim_table_atfork_child(void);

struct shim_vm {
	uint32_t cid;
	char uds_path[SHIM_PATH_MAX];
};

/*
 * The VMs of the running uvsockd: $UVSOCK_VMS ("CID=PATH[,CID=PATH...]") if set, else the
 * answer of `vms` on the control socket ($UVSOCK_CONTROL, else SHIM_DEFAULT_CONTROL).
 * Returns the number of VMs written to vms (at most max), or -ENETUNREACH (no daemon, or an
 * answer that is not a list of VMs) or -ENOMEM.
 */
#define SHIM_DEFAULT_CONTROL "/run/uvsockd/control.sock" /* ctlproto/proto.h OPS_CTL_DEFAULT_PATH */
int shim_vms(struct shim_vm *vms, int max);
/* Around fork(): the VM cache's mutex (prepare takes it; parent and child release it). */
void shim_vms_atfork_prepare(void);
void shim_vms_atfork_release(void);

/* The real libc functions (dlsym RTLD_NEXT), resolved by the library's constructor. */
struct shim_real {
	int (*socket)(int, int, int);
	int (*socketpair)(int, int, int, int *);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*bind)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept)(int, struct sockaddr *, socklen_t *);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	int (*getsockname)(int, struct sockaddr *, socklen_t *);
	int (*getpeername)(int, struct sockaddr *, socklen_t *);
	int (*getsockopt)(int, int, int, void *, socklen_t *);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	int (*close)(int);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*ioctl)(int, unsigned long, ...);
	int (*open)(const char *, int, ...);
	int (*openat)(int, const char *, int, ...);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	int (*execve)(const char *, char *const[], char *const[]);
	int (*execvpe)(const char *, char *const[], char *const[]);
	int (*fexecve)(int, char *const[], char *const[]);
	int (*close_range)(unsigned, unsigned, int);
	void (*closefrom)(int);
};
extern struct shim_real shim_real;

/* Resolves shim_real once (any thread; the constructor calls it first). */
void shim_resolve(void);

#endif
