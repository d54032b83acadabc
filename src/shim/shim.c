/* SPDX-License-Identifier: MIT */
/*
 * libuvsock-preload.so: the libc calls an AF_VSOCK host program makes, given uvsockd's hybrid
 * sockets instead of the kernel's vsock (docs/shim.md has the mapping table and the limits).
 *
 *   socket(AF_VSOCK)   an AF_UNIX socket of the same type (SOCK_DGRAM: EAFNOSUPPORT)
 *   connect(CID, P)    Unix connect to the VM's <uds_path> (<uds_path>_seqpacket), "CONNECT P\n",
 *                      "OK <local port>\n" within SO_VM_SOCKETS_CONNECT_TIMEOUT; a refusal is
 *                      ECONNRESET, the timeout ETIMEDOUT. Non-blocking: the handshake is done
 *                      before connect() returns EINPROGRESS, its result is SO_ERROR
 *   bind + listen(P)   Unix listeners at <uds_path>_P of every VM ($UVSOCK_LISTEN_VMS: those);
 *                      accept() learns the guest's (CID, port) from the name uvsockd binds its
 *                      socket to (docs/uvsockd.md "Who is calling"), checked with SO_PEERCRED
 *   open("/dev/vsock") a /dev/null fd whose IOCTL_VM_SOCKETS_GET_LOCAL_CID answers 2
 *
 * Nothing here ever creates an AF_VSOCK socket or opens /dev/vsock: every AF_VSOCK request is
 * answered by the code below, and socketpair(AF_VSOCK) is refused. uvsock-run adds a seccomp
 * filter under it for what the shim cannot see (static programs, raw system calls).
 *
 * Context: any thread of the program; errors are the program's errno, as the kernel gives them.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim/shim.h"
#include "util/macros.h"
#include "util/time.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1u << 2)
#endif
#define EXPORT __attribute__((visibility("default")))
#define SHIM_ENV_FDS "UVSOCK_SHIM_FDS"
#define VIRTIO_MAX_BUF 0xffffffffull /* include/linux/virtio_vsock.h VIRTIO_VSOCK_MAX_BUF_SIZE */

/* struct sockaddr_vm of linux/vm_sockets.h. */
struct shim_sockaddr_vm {
	sa_family_t svm_family;
	unsigned short svm_reserved1;
	unsigned int svm_port;
	unsigned int svm_cid;
	unsigned char svm_flags;
	unsigned char svm_zero[3];
};

struct shim_real shim_real;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;

static void resolve_all(void)
{
#define R(f) (*(void **)&shim_real.f = dlsym(RTLD_NEXT, #f))
	R(socket); R(socketpair); R(connect); R(bind); R(listen); R(accept); R(accept4);
	R(getsockname); R(getpeername); R(getsockopt); R(setsockopt); R(close); R(dup); R(dup2);
	R(dup3); R(fcntl); R(ioctl); R(open); R(openat); R(recvfrom); R(recvmsg); R(execve);
	R(execvpe); R(fexecve); R(close_range); R(closefrom);
#undef R
}

void shim_resolve(void)
{
	pthread_once(&resolve_once, resolve_all);
}

/* errno = -r and -1 for r < 0, else r: the return convention of the wrapped calls. */
static int ret_errno(int r)
{
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return r;
}

static void fill_addr(struct sockaddr *addr, socklen_t *len, uint32_t cid, uint32_t port)
{
	struct shim_sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_port = port, .svm_cid = cid };

	if (!addr || !len)
		return;
	memcpy(addr, &a, MIN((size_t)*len, sizeof(a)));
	*len = sizeof(a);
}

/* The address of bind/connect; -EINVAL as af_vsock.c gives for anything not a sockaddr_vm. */
static int take_addr(const struct sockaddr *addr, socklen_t len, uint32_t *cid, uint32_t *port)
{
	struct shim_sockaddr_vm a;

	if (!addr || len < sizeof(a))
		return -EINVAL;
	memcpy(&a, addr, sizeof(a));
	if (a.svm_family != AF_VSOCK)
		return -EINVAL;
	*cid = a.svm_cid;
	*port = a.svm_port;
	return 0;
}

static bool fd_nonblocking(int fd)
{
	int fl = shim_real.fcntl(fd, F_GETFL);

	return fl >= 0 && (fl & O_NONBLOCK);
}

static bool fd_cloexec(int fd)
{
	int fl = shim_real.fcntl(fd, F_GETFD);

	return fl >= 0 && (fl & FD_CLOEXEC);
}

/*
 * Puts the open file `src` at fd (dup3), keeping fd's close-on-exec and non-blocking flags, and
 * closes src. Returns 0 or -errno (src closed either way).
 */
static int replace_fd(int fd, int src)
{
	bool nb = fd_nonblocking(fd), ce = fd_cloexec(fd);
	int fl, r = 0;

	if (shim_real.dup3(src, fd, ce ? O_CLOEXEC : 0) < 0)
		r = -errno;
	shim_real.close(src);
	if (r == 0) {
		fl = shim_real.fcntl(fd, F_GETFL);
		if (fl >= 0)
			(void)shim_real.fcntl(fd, F_SETFL, nb ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
	}
	return r;
}

/* Makes fd a fresh unconnected Unix socket again (after a failed connect), flags kept. */
static void reset_socket(int fd, const struct vsk *v)
{
	int n = shim_real.socket(AF_UNIX, v->type | SOCK_CLOEXEC, 0);

	if (n >= 0)
		(void)replace_fd(fd, n);
}

/* ---- socket, socketpair ------------------------------------------------------------------- */

EXPORT int socket(int domain, int type, int protocol)
{
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), fd, r;
	struct vsk *v;

	shim_resolve();
	if (domain != AF_VSOCK) {
		fd = shim_real.socket(domain, type, protocol);
		if (fd >= 0)
			shim_drop(fd); /* an fd number we missed the close of */
		return fd;
	}
	if (base == SOCK_DGRAM)
		return ret_errno(-EAFNOSUPPORT); /* datagrams: not carried yet (docs/shim.md) */
	if (base != SOCK_STREAM && base != SOCK_SEQPACKET)
		return ret_errno(-ESOCKTNOSUPPORT);
	if (protocol != 0 && protocol != AF_VSOCK)
		return ret_errno(-EPROTONOSUPPORT);
	fd = shim_real.socket(AF_UNIX, type, 0);
	if (fd < 0)
		return fd;
	v = shim_vsk_new(VK_SOCKET, base);
	r = v ? shim_set(fd, v) : -ENOMEM;
	shim_put(v); /* the table holds it now (or nobody does) */
	if (r < 0) {
		shim_real.close(fd);
		return ret_errno(r);
	}
	return fd;
}

EXPORT int socketpair(int domain, int type, int protocol, int sv[2])
{
	shim_resolve();
	if (domain == AF_VSOCK)
		return ret_errno(-EOPNOTSUPP); /* as af_vsock.c: sock_no_socketpair */
	return shim_real.socketpair(domain, type, protocol, sv);
}

/* ---- connect ------------------------------------------------------------------------------ */

static int remaining_ms(uint64_t deadline)
{
	uint64_t now = mono_ns();

	if (now >= deadline)
		return 0;
	return (int)MIN((deadline - now + NS_PER_MS - 1) / NS_PER_MS, (uint64_t)INT_MAX);
}

/* Unix connect of fd to path; a full backlog (EAGAIN) is retried until the deadline. */
static int unix_connect(int fd, const char *path, uint64_t deadline)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENETUNREACH;
	strcpy(sa.sun_path, path);
	for (;;) {
		if (shim_real.connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return errno == ENOENT || errno == ECONNREFUSED ? -ENETUNREACH : -errno;
		if (remaining_ms(deadline) == 0)
			return -ETIMEDOUT;
		(void)poll(NULL, 0, 5);
	}
}

/* Waits until fd is readable; -ETIMEDOUT at the deadline. Signals do not end the wait. */
static int wait_readable(int fd, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int ms = remaining_ms(deadline), r;

		if (ms == 0)
			return -ETIMEDOUT;
		r = poll(&p, 1, ms);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/*
 * Reads "OK <port>\n" (not a byte more: stream data may follow at once). Returns 0 and *port,
 * -ECONNRESET (closed: the guest refused or is not there; or not an OK line), -ETIMEDOUT.
 */
static int read_ok(int fd, bool seqpacket, uint64_t deadline, uint32_t *port)
{
	char line[32];
	size_t len = 0;

	for (;;) {
		char *nl, *end;
		ssize_t n;
		unsigned long p;
		int r = wait_readable(fd, deadline);

		if (r < 0)
			return r;
		n = recv(fd, line + len, sizeof(line) - 1 - len,
			 MSG_DONTWAIT | (seqpacket ? 0 : MSG_PEEK));
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			return -ECONNRESET;
		nl = memchr(line + len, '\n', (size_t)n);
		if (!seqpacket) {
			size_t take = nl ? (size_t)(nl - (line + len)) + 1 : (size_t)n;

			if (recv(fd, line + len, take, MSG_DONTWAIT) != (ssize_t)take)
				return -ECONNRESET;
			n = (ssize_t)take;
		}
		len += (size_t)n;
		if (!nl) {
			if (seqpacket || len >= sizeof(line) - 1)
				return -ECONNRESET;
			continue;
		}
		line[len] = '\0';
		if (strncmp(line, "OK ", 3) != 0)
			return -ECONNRESET;
		errno = 0;
		p = strtoul(line + 3, &end, 10);
		if (errno || end == line + 3 || *end != '\n' || p >= SHIM_PORT_ANY)
			return -ECONNRESET;
		*port = (uint32_t)p;
		return 0;
	}
}

/* The VM of cid among the daemon's; -ENETUNREACH (no daemon), -ENODEV (no such VM). */
static int find_vm(uint32_t cid, struct shim_vm *ret)
{
	struct shim_vm *vms = malloc(SHIM_MAX_VMS * sizeof(*vms));
	int n, r = -ENODEV;

	if (!vms)
		return -ENOMEM;
	n = shim_vms(vms, SHIM_MAX_VMS);
	if (n < 0)
		r = n;
	for (int i = 0; i < n; i++)
		if (vms[i].cid == cid) {
			*ret = vms[i];
			r = 0;
			break;
		}
	free(vms);
	return r;
}

static int handshake(int fd, struct vsk *v, const struct shim_vm *vm, uint32_t port,
		     uint64_t deadline, uint32_t *lport)
{
	char path[SHIM_PATH_MAX + 16], line[24];
	int n, r;

	snprintf(path, sizeof(path), "%s%s", vm->uds_path,
		 v->type == SOCK_SEQPACKET ? "_seqpacket" : "");
	r = unix_connect(fd, path, deadline);
	if (r < 0)
		return r;
	n = snprintf(line, sizeof(line), "CONNECT %u\n", port);
	if (send(fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) != n)
		return -ECONNRESET;
	return read_ok(fd, v->type == SOCK_SEQPACKET, deadline, lport);
}

static int do_connect(int fd, struct vsk *v, const struct sockaddr *addr, socklen_t len)
{
	bool nonblock = fd_nonblocking(fd);
	struct shim_vm vm;
	uint32_t cid, port, lport = 0;
	int r;

	if (v->kind != VK_SOCKET)
		return -ENOTSOCK;
	if (v->state == VS_CONNECTED)
		return -EISCONN;
	if (v->state == VS_LISTEN || take_addr(addr, len, &cid, &port) < 0)
		return -EINVAL;
	v->so_error = 0;
	r = find_vm(cid, &vm);
	if (r == 0)
		r = handshake(fd, v, &vm, port, mono_ns() + v->connect_timeout_ns, &lport);
	if (r < 0) {
		reset_socket(fd, v);
		if (!nonblock)
			return r;
		v->so_error = -r;
		return -EINPROGRESS;
	}
	v->state = VS_CONNECTED;
	v->lcid = SHIM_CID_HOST;
	v->lport = lport;
	v->pcid = cid;
	v->pport = port;
	return nonblock ? -EINPROGRESS : 0;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct vsk *v;
	int r;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.connect(fd, addr, len);
	r = do_connect(fd, v, addr, len);
	shim_put(v);
	return ret_errno(r);
}

/* ---- bind, listen, accept ----------------------------------------------------------------- */

/* The VMs a listener serves: every VM, or those of $UVSOCK_LISTEN_VMS ("3,4"). */
static int listen_vms(struct shim_vm *vms, int max)
{
	const char *only = getenv("UVSOCK_LISTEN_VMS");
	int n = shim_vms(vms, max), k = 0;

	if (n < 0 || !only || !only[0])
		return n;
	for (int i = 0; i < n; i++) {
		char *p = (char *)only;

		while (*p) {
			char *end;
			unsigned long c = strtoul(p, &end, 10);

			if (end != p && c == vms[i].cid) {
				vms[k++] = vms[i];
				break;
			}
			p = *end ? end + 1 : end;
		}
	}
	return k;
}

/* True if <uds_path>_<port> of any VM has a live listener of this type. */
static bool port_busy_on_vms(uint32_t port, int type, const struct shim_vm *vms, int n)
{
	for (int i = 0; i < n; i++) {
		char path[SHIM_PATH_MAX + 12];

		snprintf(path, sizeof(path), "%s_%u", vms[i].uds_path, port);
		if (uds_probe(path, type) == -EADDRINUSE)
			return true;
	}
	return false;
}

static int do_bind(struct vsk *v, const struct sockaddr *addr, socklen_t len)
{
	struct shim_vm *vms;
	uint32_t cid, port;
	int n, r = 0;

	if (v->kind != VK_SOCKET)
		return -ENOTSOCK;
	if (take_addr(addr, len, &cid, &port) < 0 || v->state != VS_NEW)
		return -EINVAL;
	if (cid != SHIM_CID_ANY && cid != SHIM_CID_HOST)
		return -EADDRNOTAVAIL;
	vms = malloc(SHIM_MAX_VMS * sizeof(*vms));
	if (!vms)
		return -ENOMEM;
	n = MAX(listen_vms(vms, SHIM_MAX_VMS), 0);
	if (port == SHIM_PORT_ANY) {
		/* As af_vsock.c __vsock_bind_connectible: above the reserved ports, from a random
		 * start. */
		uint32_t start = 1024 + (uint32_t)(mono_ns() % 50000);

		r = -EADDRNOTAVAIL;
		for (uint32_t i = 0; i < 50000; i++) {
			uint32_t p = start + i;

			if (!shim_port_taken(p, v->type, v) &&
			    !port_busy_on_vms(p, v->type, vms, n)) {
				port = p;
				r = 0;
				break;
			}
		}
	} else if (shim_port_taken(port, v->type, v) || port_busy_on_vms(port, v->type, vms, n)) {
		r = -EADDRINUSE;
	}
	free(vms);
	if (r < 0)
		return r;
	v->state = VS_BOUND;
	v->lcid = cid;
	v->lport = port;
	return 0;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct vsk *v;
	int r;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.bind(fd, addr, len);
	r = do_bind(v, addr, len);
	shim_put(v);
	return ret_errno(r);
}

static void close_listeners(struct vsk_listener *l, int n)
{
	for (int i = 0; i < n; i++) {
		(void)uds_unlink_owned(l[i].path, &l[i].ul);
		shim_real.close(l[i].fd);
	}
}

/* Listens at <uds_path>_<port> of each VM; fd becomes the listener, or an epoll fd over them. */
static int start_listening(int fd, struct vsk *v, int backlog)
{
	struct shim_vm *vms = malloc(SHIM_MAX_VMS * sizeof(*vms));
	struct vsk_listener *l = NULL;
	int n, r = 0, ep;

	if (!vms)
		return -ENOMEM;
	n = listen_vms(vms, SHIM_MAX_VMS);
	if (n <= 0) {
		r = n < 0 ? n : -EADDRNOTAVAIL;
		goto out;
	}
	l = calloc((size_t)n, sizeof(*l));
	if (!l) {
		r = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		snprintf(l[i].path, sizeof(l[i].path), "%s_%u", vms[i].uds_path, v->lport);
		l[i].cid = vms[i].cid;
		r = uds_listen(l[i].path, v->type, backlog, 0, &l[i].ul);
		if (r < 0) {
			close_listeners(l, i);
			r = r == -EEXIST ? -EADDRINUSE : r;
			goto out;
		}
		l[i].fd = l[i].ul.fd;
	}
	if (n == 1) {
		r = replace_fd(fd, l[0].fd);
		l[0].fd = fd;
	} else {
		ep = epoll_create1(EPOLL_CLOEXEC);
		r = ep < 0 ? -errno : 0;
		for (int i = 0; i < n && r == 0; i++) {
			struct epoll_event e = { .events = EPOLLIN, .data.u32 = (uint32_t)i };

			if (epoll_ctl(ep, EPOLL_CTL_ADD, l[i].fd, &e) < 0)
				r = -errno;
		}
		if (r == 0)
			r = replace_fd(fd, ep);
		else if (ep >= 0)
			shim_real.close(ep);
	}
	if (r < 0) {
		close_listeners(l, n == 1 ? 0 : n);
		if (n == 1)
			(void)uds_unlink_owned(l[0].path, &l[0].ul);
		goto out;
	}
	v->l = l;
	l = NULL;
	v->nl = n;
	v->owner = getpid();
	v->pcid = v->l[0].cid;
	v->state = VS_LISTEN;
out:
	free(l);
	free(vms);
	return r;
}

EXPORT int listen(int fd, int backlog)
{
	struct vsk *v;
	int r = 0;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.listen(fd, backlog);
	if (v->kind != VK_SOCKET)
		r = -ENOTSOCK;
	else if (v->state == VS_LISTEN) {
		/* A new backlog, as listen() again does. */
		for (int i = 0; i < v->nl; i++)
			(void)shim_real.listen(v->l[i].fd, backlog);
	} else if (v->state != VS_BOUND)
		r = -EINVAL;
	else
		r = start_listening(fd, v, backlog);
	shim_put(v);
	return ret_errno(r);
}

/*
 * The guest's port of an accepted connection: from the abstract name uvsockd bound its socket
 * to ("uvsock-peer PID CID PORT HOSTPORT", docs/uvsockd.md "Who is calling"), believed only if
 * the connection comes from uvsockd: its SO_PEERCRED uid owns the VM's uds-path (the socket
 * file the daemon created; any local program can bind a look-alike name for its own PID, not
 * run as the daemon's user), PID is its SO_PEERCRED pid, and CID and HOSTPORT are this
 * listener's. Else SHIM_PORT_ANY. lpath is the listener's "<uds_path>_<lport>".
 */
static uint32_t peer_port(int fd, const struct sockaddr_un *sa, socklen_t len, uint32_t cid,
			  uint32_t lport, const char *lpath)
{
	size_t off = offsetof(struct sockaddr_un, sun_path), plen = strlen(lpath);
	struct ucred cr;
	socklen_t crl = sizeof(cr);
	char name[sizeof(sa->sun_path)], uds[SHIM_PATH_MAX], sfx[16];
	struct stat st;
	unsigned c, p, hp;
	int pid, sl;

	if (len <= off + 1 || len > sizeof(*sa) || sa->sun_path[0] != '\0')
		return SHIM_PORT_ANY;
	memcpy(name, sa->sun_path + 1, len - off - 1);
	name[len - off - 1] = '\0';
	if (sscanf(name, "uvsock-peer %d %u %u %u", &pid, &c, &p, &hp) != 4)
		return SHIM_PORT_ANY;
	if (shim_real.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 || cr.pid != pid ||
	    c != cid || hp != lport)
		return SHIM_PORT_ANY;
	/* The VM's uds-path: the listener's path without its "_<lport>". */
	sl = snprintf(sfx, sizeof(sfx), "_%u", lport);
	if (plen <= (size_t)sl || strcmp(lpath + plen - (size_t)sl, sfx) != 0)
		return SHIM_PORT_ANY;
	snprintf(uds, sizeof(uds), "%.*s", (int)(plen - (size_t)sl), lpath);
	if (stat(uds, &st) < 0 || !S_ISSOCK(st.st_mode) || st.st_uid != cr.uid)
		return SHIM_PORT_ANY;
	return p;
}

/* One accept4 on listener i of v (non-blocking members), or on fd itself with one listener. */
static int accept_one(int fd, struct vsk *v, int flags, int *which, struct sockaddr_un *sa,
		      socklen_t *salen)
{
	if (v->nl == 1) {
		*which = 0;
		return shim_real.accept4(fd, (struct sockaddr *)sa, salen, flags);
	}
	for (int k = 0; k < v->nl; k++) {
		int i = (int)((v->next + (unsigned)k) % (unsigned)v->nl), n;

		*salen = sizeof(*sa);
		n = shim_real.accept4(v->l[i].fd, (struct sockaddr *)sa, salen, flags);
		if (n >= 0) {
			v->next = (unsigned)i + 1;
			*which = i;
			return n;
		}
		if (errno != EAGAIN && errno != ECONNABORTED)
			return -1;
	}
	errno = EAGAIN;
	return -1;
}

static int do_accept(int fd, struct vsk *v, struct sockaddr *addr, socklen_t *alen, int flags)
{
	struct sockaddr_un sa;
	socklen_t salen = sizeof(sa);
	struct vsk *c;
	int n, which = 0, r;

	if (v->kind != VK_SOCKET)
		return -ENOTSOCK;
	if (v->state != VS_LISTEN)
		return -EINVAL;
	for (;;) {
		n = accept_one(fd, v, flags, &which, &sa, &salen);
		if (n >= 0)
			break;
		if (errno != EAGAIN || v->nl == 1 || fd_nonblocking(fd))
			return -errno;
		/* Several listeners, a blocking accept: wait for any of them. */
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -errno;
	}
	shim_drop(n);
	c = shim_vsk_new(VK_SOCKET, v->type);
	if (!c) {
		shim_real.close(n);
		return -ENOMEM;
	}
	c->state = VS_CONNECTED;
	c->lcid = SHIM_CID_HOST;
	c->lport = v->lport;
	c->pcid = v->l[which].cid;
	c->pport = peer_port(n, &sa, salen, c->pcid, v->lport, v->l[which].path);
	c->connect_timeout_ns = v->connect_timeout_ns;
	c->buf_size = v->buf_size;
	c->buf_min = v->buf_min;
	c->buf_max = v->buf_max;
	r = shim_set(n, c);
	shim_put(c);
	if (r < 0) {
		shim_real.close(n);
		return r;
	}
	fill_addr(addr, alen, c->pcid, c->pport);
	return n;
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *alen, int flags)
{
	struct vsk *v;
	int r;

	shim_resolve();
	v = shim_get(fd);
	if (!v) {
		r = shim_real.accept4(fd, addr, alen, flags);
		if (r >= 0)
			shim_drop(r);
		return r;
	}
	r = do_accept(fd, v, addr, alen, flags);
	shim_put(v);
	return ret_errno(r);
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *alen)
{
	return accept4(fd, addr, alen, 0);
}

/* ---- names and options -------------------------------------------------------------------- */

EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct vsk *v;
	int r = 0;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.getsockname(fd, addr, len);
	if (v->kind != VK_SOCKET)
		r = -ENOTSOCK;
	else
		fill_addr(addr, len, v->lcid, v->lport);
	shim_put(v);
	return ret_errno(r);
}

EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct vsk *v;
	int r = 0;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.getpeername(fd, addr, len);
	if (v->kind != VK_SOCKET)
		r = -ENOTSOCK;
	else if (v->state != VS_CONNECTED)
		r = -ENOTCONN;
	else
		fill_addr(addr, len, v->pcid, v->pport);
	shim_put(v);
	return ret_errno(r);
}

/* af_vsock.c vsock_update_buffer_size, with virtio's cap. */
static void update_buffer_size(struct vsk *v, uint64_t val)
{
	if (val > v->buf_max)
		val = v->buf_max;
	if (val < v->buf_min)
		val = v->buf_min;
	v->buf_size = MIN(val, VIRTIO_MAX_BUF);
}

static int vsock_setsockopt(struct vsk *v, int name, const void *val, socklen_t len)
{
	uint64_t u;

	switch (name) {
	case SHIM_SO_BUFFER_SIZE:
	case SHIM_SO_BUFFER_MIN_SIZE:
	case SHIM_SO_BUFFER_MAX_SIZE:
		if (!val || len < sizeof(u))
			return -EINVAL;
		memcpy(&u, val, sizeof(u));
		if (name == SHIM_SO_BUFFER_MIN_SIZE)
			v->buf_min = u;
		if (name == SHIM_SO_BUFFER_MAX_SIZE)
			v->buf_max = u;
		update_buffer_size(v, name == SHIM_SO_BUFFER_SIZE ? u : v->buf_size);
		return 0;
	case SHIM_SO_CONNECT_TIMEOUT_OLD:
	case SHIM_SO_CONNECT_TIMEOUT_NEW: {
		struct timeval tv; /* on x86_64 both forms are two 64-bit words */

		if (!val || len < sizeof(tv))
			return -EINVAL;
		memcpy(&tv, val, sizeof(tv));
		if (tv.tv_sec < 0 || tv.tv_usec < 0 || tv.tv_usec >= 1000000 ||
		    (uint64_t)tv.tv_sec >= UINT64_MAX / NS_PER_SEC - 1)
			return -ERANGE;
		v->connect_timeout_ns = (uint64_t)tv.tv_sec * NS_PER_SEC +
					(uint64_t)tv.tv_usec * 1000;
		if (v->connect_timeout_ns == 0)
			v->connect_timeout_ns = SHIM_DEFAULT_CONNECT_TIMEOUT_NS;
		return 0;
	}
	default:
		return -ENOPROTOOPT;
	}
}

static int vsock_getsockopt(struct vsk *v, int name, void *val, socklen_t *len)
{
	uint64_t u;
	struct timeval tv;

	if (!val || !len)
		return -EFAULT;
	switch (name) {
	case SHIM_SO_BUFFER_SIZE:
	case SHIM_SO_BUFFER_MIN_SIZE:
	case SHIM_SO_BUFFER_MAX_SIZE:
		if (*len < sizeof(u))
			return -EINVAL;
		u = name == SHIM_SO_BUFFER_SIZE ? v->buf_size
		    : name == SHIM_SO_BUFFER_MIN_SIZE ? v->buf_min : v->buf_max;
		memcpy(val, &u, sizeof(u));
		*len = sizeof(u);
		return 0;
	case SHIM_SO_CONNECT_TIMEOUT_OLD:
	case SHIM_SO_CONNECT_TIMEOUT_NEW:
		if (*len < sizeof(tv))
			return -EINVAL;
		tv.tv_sec = (time_t)(v->connect_timeout_ns / NS_PER_SEC);
		tv.tv_usec = (suseconds_t)(v->connect_timeout_ns % NS_PER_SEC / 1000);
		memcpy(val, &tv, sizeof(tv));
		*len = sizeof(tv);
		return 0;
	default:
		return -ENOPROTOOPT;
	}
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	struct vsk *v;
	int r = 1;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.getsockopt(fd, level, name, val, len);
	if (v->kind != VK_SOCKET)
		r = -ENOTSOCK;
	else if (level == AF_VSOCK)
		r = vsock_getsockopt(v, name, val, len);
	else if (level == SOL_SOCKET && (name == SO_DOMAIN || (name == SO_ERROR && v->so_error))) {
		int x = name == SO_DOMAIN ? AF_VSOCK : v->so_error;

		if (!val || !len || *len < sizeof(x)) {
			r = -EINVAL;
		} else {
			memcpy(val, &x, sizeof(x));
			*len = sizeof(x);
			if (name == SO_ERROR)
				v->so_error = 0;
			r = 0;
		}
	}
	shim_put(v);
	if (r == 1) /* SO_RCVLOWAT, SO_RCVTIMEO, SO_SNDTIMEO, SO_TYPE...: the Unix socket's own */
		return shim_real.getsockopt(fd, level, name, val, len);
	return ret_errno(r);
}

EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	struct vsk *v;
	int r = 1;

	shim_resolve();
	v = shim_get(fd);
	if (!v)
		return shim_real.setsockopt(fd, level, name, val, len);
	if (v->kind != VK_SOCKET)
		r = -ENOTSOCK;
	else if (level == AF_VSOCK)
		r = vsock_setsockopt(v, name, val, len);
	shim_put(v);
	if (r == 1)
		return shim_real.setsockopt(fd, level, name, val, len);
	return ret_errno(r);
}

/* ---- /dev/vsock --------------------------------------------------------------------------- */

/* The emulated /dev/vsock: an fd of /dev/null, so it is a real fd (close, dup, fork work). */
static int open_dev_vsock(int flags)
{
	int fd = shim_real.open("/dev/null", O_RDONLY | (flags & O_CLOEXEC)), r;
	struct vsk *v;

	if (fd < 0)
		return fd;
	v = shim_vsk_new(VK_DEV, 0);
	r = v ? shim_set(fd, v) : -ENOMEM;
	shim_put(v);
	if (r < 0) {
		shim_real.close(fd);
		return ret_errno(r);
	}
	return fd;
}

static bool is_dev_vsock(const char *path)
{
	return path && strcmp(path, "/dev/vsock") == 0;
}

static mode_t open_mode(int flags, va_list ap)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
}

static int open_common(int dirfd, const char *path, int flags, mode_t mode)
{
	int fd;

	shim_resolve();
	if (is_dev_vsock(path))
		return open_dev_vsock(flags);
	fd = dirfd == AT_FDCWD && !shim_real.openat ? shim_real.open(path, flags, mode)
						   : shim_real.openat(dirfd, path, flags, mode);
	if (fd >= 0)
		shim_drop(fd);
	return fd;
}

EXPORT int open(const char *path, int flags, ...)
{
	va_list ap;
	mode_t m;

	va_start(ap, flags);
	m = open_mode(flags, ap);
	va_end(ap);
	return open_common(AT_FDCWD, path, flags, m);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	mode_t m;

	va_start(ap, flags);
	m = open_mode(flags, ap);
	va_end(ap);
	return open_common(dirfd, path, flags, m);
}

/* The large-file and _FORTIFY_SOURCE entry points glibc programs really call (the build
 * leaves _FILE_OFFSET_BITS unset here, so open is open and open64 its alias). */
int __open_2(const char *path, int flags);
int __open64_2(const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags);

EXPORT int open64(const char *path, int flags, ...) __attribute__((alias("open")));
EXPORT int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

EXPORT int __open_2(const char *path, int flags)
{
	return open_common(AT_FDCWD, path, flags, 0);
}

EXPORT int __open64_2(const char *path, int flags) __attribute__((alias("__open_2")));

EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	return open_common(dirfd, path, flags, 0);
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags)
	__attribute__((alias("__openat_2")));

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	void *arg;
	struct vsk *v;
	va_list ap;
	int r = 1;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	shim_resolve();
	v = shim_get(fd);
	if (v && v->kind == VK_DEV) {
		unsigned cid = SHIM_CID_HOST;

		if (req != SHIM_IOCTL_GET_LOCAL_CID)
			r = -ENOTTY;
		else if (!arg)
			r = -EFAULT;
		else {
			memcpy(arg, &cid, sizeof(cid));
			r = 0;
		}
	}
	shim_put(v);
	if (r == 1)
		return shim_real.ioctl(fd, req, arg);
	return ret_errno(r);
}

/* ---- close, dup, fcntl -------------------------------------------------------------------- */

EXPORT int close(int fd)
{
	shim_resolve();
	shim_drop(fd); /* first: a listener's socket file goes while its socket is still open */
	return shim_real.close(fd);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	shim_resolve();
	if (!shim_real.close_range)
		return ret_errno(-ENOSYS);
	if (!(flags & CLOSE_RANGE_CLOEXEC) && first <= last)
		shim_drop_range(first, last);
	return shim_real.close_range(first, last, flags);
}

EXPORT void closefrom(int lowfd)
{
	shim_resolve();
	if (lowfd >= 0)
		shim_drop_range((unsigned)lowfd, UINT_MAX);
	if (shim_real.closefrom)
		shim_real.closefrom(lowfd);
}

/* newfd now refers to what oldfd does (after a successful dup of any kind). */
static void copy_entry(int oldfd, int newfd)
{
	struct vsk *v;

	if (oldfd == newfd)
		return;
	v = shim_get(oldfd);
	if (v) {
		if (shim_set(newfd, v) < 0)
			shim_drop(newfd);
	} else {
		shim_drop(newfd);
	}
	shim_put(v);
}

EXPORT int dup(int fd)
{
	int r;

	shim_resolve();
	r = shim_real.dup(fd);
	if (r >= 0)
		copy_entry(fd, r);
	return r;
}

EXPORT int dup2(int fd, int newfd)
{
	int r;

	shim_resolve();
	r = shim_real.dup2(fd, newfd);
	if (r >= 0)
		copy_entry(fd, r);
	return r;
}

EXPORT int dup3(int fd, int newfd, int flags)
{
	int r;

	shim_resolve();
	r = shim_real.dup3(fd, newfd, flags);
	if (r >= 0)
		copy_entry(fd, r);
	return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	void *arg;
	va_list ap;
	int r;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	shim_resolve();
	r = shim_real.fcntl(fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC))
		copy_entry(fd, r);
	return r;
}

EXPORT int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));

/* ---- receive: no Unix address leaks out ------------------------------------------------- */

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr,
			socklen_t *alen)
{
	ssize_t n;

	shim_resolve();
	n = shim_real.recvfrom(fd, buf, len, flags, addr, alen);
	/* A connected vsock socket has no source address per message (af_vsock.c). */
	if (n >= 0 && addr && alen && shim_is_ours(fd))
		*alen = 0;
	return n;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	ssize_t n;

	shim_resolve();
	n = shim_real.recvmsg(fd, msg, flags);
	if (n >= 0 && msg && shim_is_ours(fd))
		msg->msg_namelen = 0;
	return n;
}

/* ---- exec: the state of inherited sockets travels in $UVSOCK_SHIM_FDS --------------------- */

struct export_buf {
	char *s;
	size_t len, cap;
};

static void export_one(int fd, struct vsk *v, void *arg)
{
	struct export_buf *b = arg;
	int n;

	/* Only what the new program inherits; a listener over several VMs cannot be carried. */
	if (fd_cloexec(fd) || (v->state == VS_LISTEN && v->nl != 1) || b->len + 200 > b->cap)
		return;
	n = snprintf(b->s + b->len, b->cap - b->len,
		     "%s%d,%d,%d,%d,%u,%u,%u,%u,%llu,%llu,%llu,%llu", b->len ? ";" : "", fd,
		     (int)v->kind, v->type, (int)v->state, v->lcid, v->lport, v->pcid, v->pport,
		     (unsigned long long)v->connect_timeout_ns, (unsigned long long)v->buf_size,
		     (unsigned long long)v->buf_min, (unsigned long long)v->buf_max);
	if (n > 0)
		b->len += (size_t)n;
}

/*
 * envp without any $UVSOCK_SHIM_FDS, plus the one describing this process's inheritable vsock
 * fds. Returns a malloc'd array (its strings borrowed from envp but for the new entry, which
 * is *ret_entry) or NULL (then exec with envp as it is).
 */
static char **export_env(char *const envp[], char **ret_entry)
{
	struct export_buf b = { .cap = 64 * 1024 };
	size_t n = 0, k = 0, pre = strlen(SHIM_ENV_FDS "=");
	char **out;

	*ret_entry = NULL;
	b.s = malloc(b.cap);
	if (!b.s)
		return NULL;
	b.s[0] = '\0';
	shim_foreach(export_one, &b);
	while (envp && envp[n])
		n++;
	out = malloc((n + 2) * sizeof(*out));
	*ret_entry = malloc(pre + b.len + 1);
	if (!out || !*ret_entry) {
		free(out);
		free(*ret_entry);
		free(b.s);
		*ret_entry = NULL;
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], SHIM_ENV_FDS "=", pre) != 0)
			out[k++] = envp[i];
	if (b.len) {
		memcpy(*ret_entry, SHIM_ENV_FDS "=", pre);
		memcpy(*ret_entry + pre, b.s, b.len + 1);
		out[k++] = *ret_entry;
	}
	out[k] = NULL;
	free(b.s);
	return out;
}

enum exec_how { EX_PATH, EX_SEARCH, EX_FD };

static int exec_with_state(enum exec_how how, const char *file, int fd, char *const argv[],
			   char *const envp[])
{
	char *entry, **env;
	int r, e;

	shim_resolve();
	env = export_env(envp, &entry);
	r = how == EX_PATH ? shim_real.execve(file, argv, env ? env : envp)
	    : how == EX_SEARCH ? shim_real.execvpe(file, argv, env ? env : envp)
			       : shim_real.fexecve(fd, argv, env ? env : envp);
	e = errno;
	free(env);
	free(entry);
	errno = e;
	return r;
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	return exec_with_state(EX_PATH, path, -1, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return exec_with_state(EX_PATH, path, -1, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	return exec_with_state(EX_SEARCH, file, -1, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return exec_with_state(EX_SEARCH, file, -1, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	return exec_with_state(EX_FD, NULL, fd, argv, envp);
}

/* The argument list of execl/execlp/execle as an argv (malloc'd), and execle's envp. */
static char **collect_args(const char *arg0, va_list ap, bool want_env, char *const **envp)
{
	size_t n = 1, cap = 16;
	char **argv = malloc(cap * sizeof(*argv));
	const char *a;

	if (!argv)
		return NULL;
	argv[0] = (char *)arg0;
	do {
		a = arg0 ? va_arg(ap, const char *) : NULL;
		if (n + 1 >= cap) {
			char **g = realloc(argv, 2 * cap * sizeof(*argv));

			if (!g) {
				free(argv);
				return NULL;
			}
			argv = g;
			cap *= 2;
		}
		argv[n++] = (char *)a;
	} while (a);
	if (want_env)
		*envp = va_arg(ap, char *const *);
	return argv;
}

static int execl_common(enum exec_how how, const char *file, bool want_env, char **argv,
			char *const *envp)
{
	int r, e;

	if (!argv)
		return ret_errno(-ENOMEM);
	r = exec_with_state(how, file, -1, argv, want_env ? envp : environ);
	e = errno;
	free(argv);
	errno = e;
	return r;
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	char **argv;

	va_start(ap, arg);
	argv = collect_args(arg, ap, false, NULL);
	va_end(ap);
	return execl_common(EX_PATH, path, false, argv, NULL);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	char **argv;

	va_start(ap, arg);
	argv = collect_args(arg, ap, false, NULL);
	va_end(ap);
	return execl_common(EX_SEARCH, file, false, argv, NULL);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	char *const *envp = NULL;
	va_list ap;
	char **argv;

	va_start(ap, arg);
	argv = collect_args(arg, ap, true, &envp);
	va_end(ap);
	return execl_common(EX_PATH, path, true, argv, envp);
}

/* ---- start-up: the state a program that exec'd us passed on ----------------------------- */

static void import_one(const char *e)
{
	int fd, kind, type, state;
	unsigned lcid, lport, pcid, pport;
	unsigned long long tmo, bs, bmin, bmax;
	struct sockaddr_un sa;
	socklen_t sl = sizeof(sa);
	struct stat st;
	struct vsk *v;

	if (sscanf(e, "%d,%d,%d,%d,%u,%u,%u,%u,%llu,%llu,%llu,%llu", &fd, &kind, &type, &state,
		   &lcid, &lport, &pcid, &pport, &tmo, &bs, &bmin, &bmax) != 12)
		return;
	if (fd < 0 || fstat(fd, &st) < 0 || (kind == VK_SOCKET) != !!S_ISSOCK(st.st_mode) ||
	    (kind != VK_SOCKET && kind != VK_DEV) || state < VS_NEW || state > VS_CONNECTED)
		return;
	v = shim_vsk_new((enum vsk_kind)kind, type);
	if (!v)
		return;
	v->state = (enum vsk_state)state;
	v->lcid = lcid;
	v->lport = lport;
	v->pcid = pcid;
	v->pport = pport;
	v->connect_timeout_ns = tmo;
	v->buf_size = bs;
	v->buf_min = bmin;
	v->buf_max = bmax;
	if (state == VS_LISTEN) {
		/* The socket files stay the creator's: never removed from here (owner 0). */
		v->l = calloc(1, sizeof(*v->l));
		if (!v->l) {
			shim_put(v);
			return;
		}
		v->nl = 1;
		v->l[0].fd = fd;
		v->l[0].cid = pcid;
		v->l[0].ul.fd = -1;
		/* Its path (peer_port() finds the VM's uds-path from it): the listener's name. */
		if (shim_real.getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 &&
		    sa.sun_family == AF_UNIX && sl > offsetof(struct sockaddr_un, sun_path) + 1 &&
		    sa.sun_path[0] != '\0')
			snprintf(v->l[0].path, sizeof(v->l[0].path), "%.*s",
				 (int)(sl - offsetof(struct sockaddr_un, sun_path)), sa.sun_path);
	}
	(void)shim_set(fd, v);
	shim_put(v);
}

__attribute__((constructor)) static void shim_init(void)
{
	const char *env;

	shim_resolve();
	pthread_atfork(shim_table_atfork_prepare, shim_table_atfork_parent,
		       shim_table_atfork_child);
	env = getenv(SHIM_ENV_FDS);
	if (!env)
		return;
	for (const char *p = env; p && *p;) {
		const char *semi = strchr(p, ';');

		import_one(p);
		p = semi ? semi + 1 : NULL;
	}
	unsetenv(SHIM_ENV_FDS);
}
