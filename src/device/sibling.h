/* SPDX-License-Identifier: MIT */
/*
 * The sibling port (sibling.c): what a device keeps to hand packets to the devices linked to it
 * and to take theirs, declared next to its code. struct dev_sib is sibling.c's part of struct
 * vsock_dev (d->sib); the core (device.c) reaches it only through the functions below and the
 * RX producer dev_sib_rx (device_internal.h, struct dev_rx_src).
 */
#ifndef UVSOCK_DEVICE_SIBLING_H
#define UVSOCK_DEVICE_SIBLING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "vsock/hdr.h"

struct loop_async;
struct loop_timer;
struct rec_reader;
struct rec_writer;
struct vsock_dev;
struct dev_rx_src;

/* Sibling hand-off queue per target device. */
#define DEV_INBOX_PKTS 512u
#define DEV_INBOX_BYTES (4u * 1024 * 1024)
/* Longest our guest's packets for a sibling whose inbox is full are held (sib_hold) without the
 * sibling making room; then they are dropped and the target is "congested": what is sent to it
 * is dropped at once until it drains to half. */
#define DEV_SIB_STALL_NS (1000ull * 1000000ull)
/*
 * Senders told apart in one inbox (struct sib_src): the group's siblings, the host (datagrams,
 * CID 2) and the RSTs a device makes. A sender beyond these shares nothing: it is refused once
 * the inbox is half full.
 */
#define DEV_INBOX_SRCS 64u
#define DEV_INBOX_SRC_NONE UINT16_MAX
/*
 * Packets (and payload bytes, but at least one packet) a device takes out of its inbox under one
 * lock (struct dev_sib taken[]): they wait there for its RX ring, out of the senders' shares.
 */
#define DEV_SIB_TAKE 64u
#define DEV_SIB_TAKE_BYTES (512u * 1024)
/* Packets and payload bytes held per sending device, over all its full siblings. */
#define DEV_SIB_HOLD_PKTS 256u
#define DEV_SIB_HOLD_BYTES (1u << 20)
/*
 * The REQUEST budget of one sender towards one sibling (sibling.c, "REQUESTs a sibling does
 * not accept"): REQUESTs our guest sent it that it did not (yet) accept with a RESPONSE, at
 * most DEV_SIB_REQ_BURST at once, one more every DEV_SIB_REQ_NS; beyond that our TX ring
 * waits for the next one.
 */
#define DEV_SIB_REQ_BURST 1024u
#define DEV_SIB_REQ_NS (1000ull * 1000ull)

/* A guest packet on its way to a sibling (header in host order, payload copied). */
struct sib_pkt {
	struct vsock_hdr hdr;
	uint32_t off; /* payload bytes already delivered (RX splitting) */
	bool made;    /* an RST a device made (sib_queue_rst), not a guest's packet */
	uint16_t src; /* its sender's slot in the inbox's src[] (DEV_INBOX_SRC_NONE: none) */
	struct sib_pkt *next; /* in a struct sib_hold */
	uint8_t data[];
};

/*
 * The sender's side of one sibling link: our guest's packets for that sibling, in order, while
 * its inbox is full (sibling.c). Owned by the sending device's thread.
 */
struct sib_hold {
	struct sib_pkt *head, *tail;
	uint64_t deadline; /* mono_ns(): dropped unless the sibling makes room by then */
	/* the REQUEST budget towards that sibling: REQUESTs charged and not yet paid back (by
	 * time or by its RESPONSEs), and since when the oldest unpaid one counts (mono_ns()) */
	uint32_t req_debt;
	uint64_t req_since;
};

/*
 * One sender's part of an inbox (by the source CID of its packets): what it has queued there, and
 * when it was last refused. A sender refused within DEV_SIB_STALL_NS counts as one that wants a
 * share even with nothing queued (sibling.c, "Fair shares").
 */
struct sib_src {
	uint32_t cid;        /* 0: a free slot */
	uint32_t pkts;
	size_t bytes;
	uint64_t refused_ns; /* mono_ns() of its last refused packet; 0: never */
};

/* Bounded multi-producer queue of packets for one device. Protected by lock. */
struct sib_inbox {
	pthread_mutex_t lock;
	struct sib_pkt *ring[DEV_INBOX_PKTS];
	unsigned head;
	atomic_uint count; /* written under lock; read without it as a hint (relaxed) */
	size_t bytes;
	bool want_room; /* a sender found it full and waits for room_async */
	bool congested; /* a sender waited DEV_SIB_STALL_NS in vain: drop while full */
	struct sib_src src[DEV_INBOX_SRCS]; /* the senders' shares (sibling.c) */
	unsigned n_src;                     /* src[] slots ever used (the rest are free) */
};

/*
 * A device's end of its sibling links: everything a linked device may touch from its own thread
 * (the inbox, the two wakeups of the owner's loop, CID and name for routing and logs). It is
 * reference-counted, one reference held by its device and one by every device linked to it, so
 * a sibling's pointer to it stays valid after its device is freed. vsock_dev_free closes it
 * under inbox.lock: from then on pushes fail (-EPIPE) and the wakeups are not used (they belong
 * to the freed device's loop), so holding inbox.lock and seeing !closed is what makes touching
 * inbox_async / room_async safe. Senders take that lock once per packet pushed (as before) and
 * once per target per TX batch for the wakeup, the owner once per batch it takes (sib_take,
 * DEV_SIB_TAKE); nothing else on the data path locks.
 */
struct sib_port {
	struct sib_inbox inbox;
	atomic_uint refs;              /* the last sib_port_unref frees the port */
	uint32_t cid;                  /* constant */
	char name[32];                 /* constant (log name of the device) */
	atomic_bool closed;            /* written under inbox.lock; read without it as a hint */
	struct loop_async *inbox_async; /* the owner's: packets arrived (valid while !closed) */
	struct loop_async *room_async;  /* the owner's: a sibling's inbox has room again (same) */
	/* this device's guest packets dropped because the sibling holding them was freed (added by
	 * that sibling's vsock_dev_free; reported in sibling_dropped); relaxed */
	_Atomic uint64_t peer_dropped;
	struct sib_pool *pool;         /* our guest's sibling packet buffers (sibling.c) */
	/* our guest negotiated VIRTIO_VSOCK_F_DGRAM at its last queue start (a hint for senders:
	 * the owner checks again at delivery); relaxed */
	atomic_bool dgram;
};

/*
 * sibling.c's state in struct vsock_dev (d->sib). Owned by the device's thread; the port is the
 * one part linked devices touch, from their own threads, under its inbox.lock (struct sib_port).
 */
struct dev_sib {
	struct sib_port *port;          /* ours: our inbox and wakeups */
	struct loop_async *inbox_async; /* packets arrived in our inbox */
	struct loop_async *room_async;  /* a sibling's inbox has room again */
	struct sib_port **sibs;         /* linked devices' ports (references), sorted by cid;
					 * fixed once the device runs; a closed one is a freed
					 * sibling: packets to it are dropped, answered with RST */
	unsigned n_sibs;
	struct sib_pkt *rx_cur;         /* taken from the inbox, partly delivered */
	struct sib_pkt *taken[DEV_SIB_TAKE]; /* taken from the inbox in one batch (sib_take): */
	unsigned n_taken, i_taken;      /* taken[i_taken..n_taken) wait, oldest first */
	struct loop_timer *stage_timer; /* the earliest DEV_SIB_STALL_NS deadline of hold[] */
	struct sib_hold *hold;          /* parallel to sibs: what waits for room in each */
	unsigned hold_pkts;             /* packets and payload bytes in hold[], bounded by */
	size_t hold_bytes;              /* DEV_SIB_HOLD_PKTS / DEV_SIB_HOLD_BYTES */
	struct sib_port **wake;         /* targets to wake at the end of a TX batch */
	unsigned n_wake;
	struct sib_pkt *paced;          /* a REQUEST of our guest over its budget: the TX ring */
	uint32_t paced_cid;             /* waits until paced_cid's budget lets it go */
	struct loop_timer *pace_timer;  /* when paced's budget has room again */
	uint32_t req_burst;             /* the REQUEST budget: DEV_SIB_REQ_BURST, DEV_SIB_REQ_NS */
	uint64_t req_ns;                /* (0: never paid back by time; tests only) */
	/* Restored (dev_sib_restore) before the links are: what our guest had held for each
	 * sibling, handed to hold[] at the thaw (dev_sib_thaw), once the links exist again. */
	struct sib_pend *pend;
	unsigned n_pend;
};

/* Packets held for the sibling with that CID, restored before it is linked (dev_sib_restore). */
struct sib_pend {
	uint32_t cid;
	struct sib_pkt *head, *tail;   /* none, if only the budget is owed */
	uint32_t req_debt;             /* the REQUEST budget towards it (struct sib_hold) */
	uint64_t req_since;
};

/* Where a guest TX packet went (device.c routes, sibling.c and host_dgram.c hand over). */
enum dev_tx_verdict { DEV_TX_ENGINE, DEV_TX_SIBLING_SENT, DEV_TX_SIBLING_FULL, DEV_TX_DROP };

/* Creates d's port and the loop objects siblings wake it with. Returns 0, -ENOMEM. */
int dev_sib_init(struct vsock_dev *d);
/* The port of the sibling with that CID, or NULL (not linked). */
struct sib_port *dev_sib_lookup(struct vsock_dev *d, uint64_t cid);
/*
 * Copies a packet of our guest for sibling t and hands it over, holds it if t is full, or drops
 * it (an RST for a full t; anything for a congested, gone or over-full one; see sibling.c).
 * Returns DEV_TX_SIBLING_SENT (handed over or held), DEV_TX_SIBLING_FULL (held, and the hold
 * reached its bound: the TX ring waits) or DEV_TX_DROP.
 */
enum dev_tx_verdict dev_sib_send(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
				 const struct iovec *iov, unsigned n);
/* Hands held packets over to the siblings that have room now. Returns false while the hold is
 * at its bound (the TX ring waits for room). */
bool dev_sib_retry_staged(struct vsock_dev *d);
/* The packets held for full siblings reached DEV_SIB_HOLD_PKTS or DEV_SIB_HOLD_BYTES, or a
 * REQUEST waits for its budget (the TX ring waits in both cases). */
bool dev_sib_hold_full(const struct vsock_dev *d);
/* Drops every held packet uncounted (the session ends) and stops their timer. */
void dev_sib_drop_staged(struct vsock_dev *d);
/* Wakes the siblings our last TX batch handed packets to. */
void dev_sib_wake_targets(struct vsock_dev *d);
/*
 * Datagrams through the sibling port (host_dgram.c uses them). dev_sib_send_dgram: copies our
 * guest's datagram h for sibling t and hands it over, or drops it (full, gone: no hold, no RST).
 * dev_sib_queue_self: queues a datagram from the host (h, payload data) for our own guest's RX
 * ring. Both return 0, -ENOBUFS (full), -EPIPE (gone), -ENOMEM.
 */
int dev_sib_send_dgram(struct vsock_dev *d, struct sib_port *t, const struct vsock_hdr *h,
		       const struct iovec *iov, unsigned n);
int dev_sib_queue_self(struct vsock_dev *d, const struct vsock_hdr *h, const void *data);
/* Drops everything queued for our guest (RX not running), counted in sibling_dropped. */
void dev_sib_drop_all(struct vsock_dev *d);
/* vsock_dev_free's part: see sibling.c. */
void dev_sib_detach(struct vsock_dev *d);

/*
 * Sets d's REQUEST budget towards each sibling (burst, and one more every ns; ns 0: none back
 * by time, only by RESPONSEs). Before d runs; for tests (the defaults are DEV_SIB_REQ_*).
 */
void dev_sib_set_req_budget(struct vsock_dev *d, uint32_t burst, uint64_t ns);

/*
 * A live upgrade (docs/upgrade.md, "The sibling part"). dev_sib_freeze: the device is frozen
 * (vsock_dev_freeze): nothing of sibling.c runs on its thread until the thaw, so it hands
 * nothing to any inbox. dev_sib_save: writes the inbox (its packets in order, with the senders'
 * shares), what our guest holds for each sibling, and the drops the siblings counted for us, into
 * the list w is in; every device of the group frozen. dev_sib_restore: reads them back into a
 * new, unlinked device (0, -EBADMSG with the reason in the record's error, -ENOMEM, -EBUSY if
 * the device has queued packets already); nothing is kept on failure. dev_sib_thaw: after the
 * links are made again, hands the restored held packets to their siblings' holds, gives every
 * hold a new stall deadline (the pause is nobody's fault) and wakes the siblings.
 */
void dev_sib_freeze(struct vsock_dev *d);
void dev_sib_save(struct vsock_dev *d, struct rec_writer *w);
int dev_sib_restore(struct vsock_dev *d, struct rec_reader *r);
void dev_sib_thaw(struct vsock_dev *d);
/* Undoes a dev_sib_restore (a later part of the record was refused): nothing is queued. */
void dev_sib_unrestore(struct vsock_dev *d);

/* Frees what dev_sib_init made (after dev_sib_detach). Safe on a half-made device. */
void dev_sib_free(struct vsock_dev *d);

#endif
