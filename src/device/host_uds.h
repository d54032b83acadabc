/* SPDX-License-Identifier: MIT */
/*
 * The host side (host_uds.c): the Unix sockets of the hybrid-vsock convention at <uds_path>,
 * each host connection paired with one engine socket, declared next to its code. struct dev_host
 * is host_uds.c's part of struct vsock_dev (d->host); the core reaches it through the functions
 * below and the RX producer dev_host_rx (device_internal.h, struct dev_rx_src).
 */
#ifndef UVSOCK_DEVICE_HOST_UDS_H
#define UVSOCK_DEVICE_HOST_UDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "device/uds_connect.h"
#include "util/uds.h"

struct loop_timer;
struct loop_watch;
struct vsock_dev;
struct vsock_sock;
struct dev_rx_src;

/* Host side: the CONNECT line and the guest's answer must both come within this. */
#define DEV_HOST_CONNECT_TIMEOUT_NS (2ull * 1000000000ull)
/* Host-initiated connections get local ports in [2^30, 2^31), as Firecracker. */
#define DEV_HOST_PORT_LO (1u << 30)
#define DEV_HOST_PORT_HI ((1u << 31) - 1)

enum hconn_state {
	HC_READ_CONNECT,   /* host-initiated: reading "CONNECT <port>\n" */
	HC_GUEST_CONNECT,  /* host-initiated: REQUEST sent, waiting for the guest */
	HC_HOST_CONNECT,   /* guest-initiated: connect(<uds>_<port>) in progress */
	HC_OPEN,           /* data flows */
};

/* One host Unix socket paired with one engine socket. */
struct hconn {
	struct vsock_dev *dev;
	struct hconn *prev, *next;   /* dev->conns */
	struct hconn *next_dirty;    /* dev->dirty while dirty */
	bool dirty;
	enum hconn_state state;
	bool seqpacket;
	int fd;
	struct loop_watch *w;
	struct vsock_sock *s;         /* NULL until created (host-initiated) */
	struct loop_timer *timer;     /* HC_READ_CONNECT / HC_GUEST_CONNECT deadline */
	uint64_t deadline;            /* loop_now_ns() the timer was armed for (while armed) */
	bool frozen_timer;            /* dev_host_freeze disarmed the timer: rearmed at thaw */
	uint64_t restore_id;          /* dev_host_restore: the engine socket's id to adopt (0:
				       * none), until dev_host_adopt finds it */
	struct uds_connect_reader rd;
	uint32_t local_port;          /* our port (host side) */
	bool host_rd_eof;             /* read 0 from the host: SHUTDOWN(SEND) sent to the guest */
	bool host_wr_shut;            /* shutdown(SHUT_WR) done on the host socket */
	bool host_wr_blocked;         /* the host socket would block: EPOLLOUT wanted */
	bool guest_blocked;           /* no guest credit: EPOLLIN off until POLLOUT */
	bool host_hup;                /* epoll said EPOLLHUP/EPOLLERR: the host hung up */
	/* zero-copy host -> guest (dev_host_rx): on d->host.rd_head's list while the host socket
	 * has bytes (or EOF) for the guest's RX buffers */
	struct hconn *rd_next;
	bool rd_queued;
	bool rd_parked;               /* EPOLLIN off while queued: the RX ring has no buffers */
	/* guest per-packet overhead (h2g_budget.h): small packets and bytes of big ones sent and
	 * maybe still queued in the guest, each with the stream offset the guest must pass to
	 * have consumed them */
	uint32_t h2g_small, h2g_small_end, h2g_big_end;
	uint64_t h2g_big;
};

/* host_uds.c's state in struct vsock_dev (d->host). Device thread only. */
struct dev_host {
	char uds_seq_path[108];        /* <uds_path>_seqpacket */
	struct uds_listener uds_l, uds_seq_l; /* <uds_path>, <uds_path>_seqpacket */
	struct loop_watch *uds_w, *uds_seq_w;
	struct hconn *conns;
	struct hconn *dirty;
	unsigned n_conns;
	uint8_t *scratch;              /* bounce buffer: seqpacket messages, and host reads with
					* the zerocopy switch off */
	size_t scratch_len;
	struct hconn *rd_head, *rd_tail; /* STREAM connections whose host bytes wait for RX */
	/* the connection dev_host_rx.pending chose and the bytes it may send (reserved there once,
	 * for its fill: nothing feeds the engine in between) */
	struct hconn *rd_cur;
	size_t rd_credit;
	uint32_t rd_tx_end;            /* rd_cur's tx_cnt then: where the fill's packets start */
	/* against hostile host programs (from dev_host_open) */
	bool aux;                      /* reserve_fd, dir_fd, pause_timer are set */
	int reserve_fd;                /* /dev/null, given up to shed one connection at EMFILE */
	struct loop_timer *pause_timer; /* accepting paused (no fd left): resume then */
	unsigned n_handshakes;         /* host connections in HC_READ_CONNECT (capped) */
	int dir_fd;                    /* O_PATH of uds_path's directory: <uds-path>_<port> */
	/* dev_host_restore until dev_host_check_adopted: the restored connections that wait for
	 * their engine socket, sorted by its id (dev_host_adopt looks them up) */
	struct hconn **by_id;
	unsigned n_by_id;
};

/* Sets up d->host before anything can fail (no listener, nothing to close). */
void dev_host_init(struct vsock_dev *d);
/* Listens on <uds_path> and <uds_path>_seqpacket. Returns 0, -ENOMEM or the errno of listening. */
int dev_host_open(struct vsock_dev *d);
/* Closes the listeners (removes their files if still ours) and frees what dev_host_open
 * made. Safe after dev_host_init alone. */
void dev_host_close(struct vsock_dev *d);
/* Some connection waits to be serviced (dev_host_service_dirty). */
bool dev_host_has_dirty(const struct vsock_dev *d);
/* Closes every host connection (their engine sockets are released without sending). */
void dev_host_close_all(struct vsock_dev *d);
/* Confirms or rejects the pending children of the wildcard listeners (guest-initiated). */
void dev_host_accept_guest_conns(struct vsock_dev *d);
/* Services every connection whose engine socket changed state. */
void dev_host_service_dirty(struct vsock_dev *d);
void dev_host_mark_dirty(struct hconn *c);
/*
 * Zero-copy guest -> host (the engine's ops->deliver, engine.h): writes what the host socket of
 * the connection `user` takes of the guest's payload, straight from its TX buffer. Returns the
 * bytes taken; 0 when the connection cannot take bytes now (not open yet, blocked, shut down).
 * Called by the engine with that socket's lock held: touches only the connection.
 */
size_t dev_host_deliver(struct vsock_dev *d, void *user, const struct iovec *iov, int iovcnt,
		    size_t len);
/*
 * The engine's ops->tx_sent (engine.h): a packet of len bytes of what the copying path queued
 * for connection `user` left for the guest, ending at tx_cnt end; counted for the host -> guest
 * budget (h2g_budget.h). Called by the engine with that socket's lock held: touches only the
 * connection.
 */
void dev_host_tx_sent(void *user, uint32_t len, uint32_t end);

/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

struct rec_writer;
struct rec_reader;

/*
 * Stops watching every host fd and disarms every host timer (the listeners, each connection,
 * the accept pause): from then on nothing of the host side runs, and the kernel keeps whatever
 * host programs send or connect. dev_host_thaw undoes it (watches and timers as the state
 * asks, every connection serviced once). Device thread.
 */
void dev_host_freeze(struct vsock_dev *d);
int dev_host_thaw(struct vsock_dev *d);
/*
 * Writes the host side into w (items of the list w is in): the two listeners and every
 * connection with its fd, its engine socket's id and its state. Frozen device.
 */
void dev_host_save(struct vsock_dev *d, struct rec_writer *w);
/*
 * Reads what dev_host_save wrote into d (made with vsock_dev_config.restore: no listener
 * bound, no connection). Connections get their engine sockets afterwards from
 * dev_host_adopt, and the device stays frozen until dev_host_thaw. fds are duplicated.
 * Returns 0 or -errno with the reason in r's document; on error d's host side is as before.
 */
int dev_host_restore(struct vsock_dev *d, struct rec_reader *r);
/*
 * The restored engine hands back the application's socket s (vsock_engine_restore's adopt):
 * true if a connection of the record claims it (its user set), false if none does.
 */
bool dev_host_adopt(struct vsock_dev *d, struct vsock_sock *s);
/* Undoes a successful dev_host_restore (a later part of the record was refused): the restored
 * connections and listener fds closed, nothing sent, no file removed. */
void dev_host_unrestore(struct vsock_dev *d);
/* Every restored connection that needs an engine socket got one: 0 or -EBADMSG (message). */
int dev_host_check_adopted(struct vsock_dev *d, struct rec_reader *r);
#endif
