/* SPDX-License-Identifier: MIT */
/*
 * Datagrams (host_dgram.c): the per-VM socket <uds_path>.dgram, host destinations and senders,
 * declared next to their code. struct dev_dgram is host_dgram.c's part of struct vsock_dev
 * (d->dgram).
 */
#ifndef UVSOCK_DEVICE_HOST_DGRAM_H
#define UVSOCK_DEVICE_HOST_DGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>

#include "device/host_uds.h"
#include "device/sibling.h"
#include "util/uds.h"
#include "vsock/hdr.h"

struct loop_watch;
struct vsock_dev;
struct vsock_dev_config;

/*
 * Datagrams (host_dgram.c, docs/uvsockd.md "Datagrams"): the largest payload (64 KiB - the
 * header, the design's VSOCK_DGRAM_MAX), host senders remembered for replies (bounded, LRU), the
 * host port of datagrams from an unbound host sender (replies to it are dropped), and the host
 * datagrams read per wakeup of the per-VM socket.
 */
#define DEV_DGRAM_MAX (65536u - VSOCK_HDR_SIZE)
#define DEV_DGRAM_PEERS 256u
#define DEV_DGRAM_UNBOUND_PORT DEV_HOST_PORT_HI
#define DEV_DGRAM_READ_BATCH 64u
/* Host datagrams taken by one recvmmsg (each into its own buffer of d->dgram.rlen bytes). */
#define DEV_DGRAM_MMSG 8u
/*
 * Host destinations <uds_path>_<port>.dgram with a socket connected to them (host_dgram.c), how
 * often the path is checked again for a socket bound there anew while the old one lives, and
 * the SO_SNDBUF of those sockets.
 */
#define DEV_DGRAM_DESTS 8u
#define DEV_DGRAM_RECHECK_MS 50u
/* What a host program connected back to one may have queued (twice this, kernel accounting). */
#define DEV_DGRAM_SNDBUF (512 * 1024)
/*
 * Remembered senders (struct dgram_peer) with a sending socket of their own open at once (the
 * least recently used one closed first): the guest's replies to one sender leave through that
 * socket, so a sender that never reads fills only its own socket's buffer, never the replies to
 * the others (docs/security.md). Counted in uvsockd's per-VM fd budget (daemon/fd_budget.h).
 */
#define DEV_DGRAM_PEER_SOCKS 8u

struct dgram_dest {
	bool live;          /* sfd is open and watched */
	uint32_t port;
	int sfd;            /* connected to the socket file; autobound abstract name, replies read */
	struct loop_watch *w;
	dev_t dev;          /* the socket file it was connected to: a replaced file is connected */
	ino_t ino;          /* to again */
	uint64_t checked_ms; /* mono_ms() of the last check of the path */
	uint64_t used;      /* d->dgram.tick (LRU) */
};

/*
 * A host datagram sender not bound at <uds_path>_<port>.dgram, the host port it got, and the
 * socket the guest's replies to it leave through (dgram_peer_sock).
 */
struct dgram_peer {
	struct sockaddr_un sa;
	socklen_t salen;
	uint32_t port;
	uint64_t used;      /* d->dgram.tick when last seen or replied to (LRU) */
	int sfd;            /* connected to sa, autobound, replies read; -1: none open */
	struct loop_watch *w;
	uint64_t shared_ms; /* mono_ms() when sa refused our own socket (connected to the per-VM
			     * socket): replies leave from that one until DEV_DGRAM_RECHECK_MS later */
};

/* host_dgram.c's state in struct vsock_dev (d->dgram). Device thread only. */
struct dev_dgram {
	bool off;                      /* not offered (vsock_dev_config.no_dgram) */
	uint32_t max;                  /* largest payload accepted either way */
	char path[108];                /* <uds_path>.dgram */
	struct uds_listener l;         /* bound there (fd -1: datagrams off) */
	struct loop_watch *w;
	struct dgram_peer *peers;      /* DEV_DGRAM_PEERS entries, n_peers used */
	unsigned n_peers;
	unsigned n_peer_socks;         /* peers with sfd open, at most DEV_DGRAM_PEER_SOCKS */
	uint32_t next_port;            /* next ephemeral host port to try */
	struct dgram_dest dests[DEV_DGRAM_DESTS];
	uint64_t tick;
	uint8_t *rbuf;                 /* DEV_DGRAM_MMSG buffers of rlen bytes (recvmmsg) */
	size_t rlen;                   /* max + the longest line + 1: more is oversize */
};

/* Binds <uds_path>.dgram (datagrams on; stale/live rules of uds_listen). Returns 0 or -errno. */
int dev_dgram_open(struct vsock_dev *d, const struct vsock_dev_config *cfg);
/* Unbinds and removes <uds_path>.dgram (if still ours). Safe when never opened. */
void dev_dgram_close(struct vsock_dev *d);
/* Our guest negotiated VIRTIO_VSOCK_F_DGRAM (and the device offers it). */
bool dev_dgram_negotiated(const struct vsock_dev *d);
/* The rings started with new features: tells senders whether our guest takes datagrams. */
void dev_dgram_features(struct vsock_dev *d);
/*
 * A DGRAM packet h (src_cid checked) from our guest's TX chain iov (n entries, header first;
 * the row has DEV_TX_IOV_MAX entries): sent to the host socket of its port, handed to a sibling,
 * or dropped and counted. Never an RST. Returns DEV_TX_SIBLING_SENT or DEV_TX_DROP.
 */
enum dev_tx_verdict dev_dgram_tx(struct vsock_dev *d, const struct vsock_hdr *h, struct iovec *iov,
				 unsigned n);
/*
 * The RX half (the sibling inbox's RX fill, dev_sib_rx): a datagram p about to go into a guest RX buffer of room payload
 * bytes. Returns true if it goes in whole (counted), false if it is dropped (counted: not
 * negotiated, or larger than the buffer).
 */
bool dev_dgram_rx_ok(struct vsock_dev *d, const struct vsock_hdr *h, size_t room);

/* ---- state save and restore (docs/upgrade.md, "The device's part") ----------------------- */

struct rec_writer;
struct rec_reader;

/* Stops watching the datagram sockets (the kernel keeps what arrives); thaw watches them again.
 * Device thread. */
void dev_dgram_freeze(struct vsock_dev *d);
int dev_dgram_thaw(struct vsock_dev *d);
/* Writes the datagram side as items of the list w is in: the bound socket, the senders
 * remembered for replies, the open destinations. Frozen device. */
void dev_dgram_save(struct vsock_dev *d, struct rec_writer *w);
/*
 * Reads it into d (made with vsock_dev_config.restore, datagrams as configured: a record with
 * datagrams for a device without them is refused). fds are duplicated. Returns 0 or -errno with
 * the reason in r's document; on error d's datagram side is as before.
 */
int dev_dgram_restore(struct vsock_dev *d, struct rec_reader *r);
/* Undoes a successful dev_dgram_restore (a later part of the record was refused). */
void dev_dgram_restore_undo(struct vsock_dev *d);

#endif
