/* SPDX-License-Identifier: MIT */
/*
 * libuvsock device API: the virtio-vsock *device* for C virtual machine monitors. A VMM that
 * emulates a virtio-vsock device (VIRTIO device id 19) hands this API what its transport
 * (virtio-pci, virtio-mmio) negotiated with the guest driver — guest memory, the two rings, the
 * features, the kick and call eventfds — and gets a working device: guest connections to the
 * host (CID 2) reach Unix sockets in the Firecracker "hybrid vsock" convention (uds-path), host
 * programs reach guest ports with "CONNECT <port>\n", and devices linked as siblings route
 * guest-to-guest traffic. This is exactly what uvsockd does: it creates each VM's device with
 * uvsock_dev_new, links the VMs of a group with uvsock_dev_link, and its vhost-user callbacks
 * call these functions (src/device/vhu.c), so vhost-user is one way to drive this API, a VMM's
 * own virtio transport is another.
 *
 * Queues: 0 is RX (device to guest), 1 is TX (guest to device), 2 the event queue (optional:
 * a VMM that starts it gets TRANSPORT_RESET events posted there by the device; one that does
 * not may keep it to itself). Split and packed virtqueues (VIRTIO_F_RING_PACKED), with
 * EVENT_IDX, INDIRECT_DESC and IN_ORDER; virtio 1.x only (little-endian, VIRTIO_F_VERSION_1).
 * uvsock_dev_features() lists what the device offers.
 *
 * Typical life:
 *   uvsock_dev_new(&cfg, &d);                      host side listening on cfg.uds_path
 *   offer uvsock_dev_features() to the guest; on FEATURES_OK: uvsock_dev_set_features(d, acked)
 *   uvsock_dev_set_mem_table(d, regions, n);       guest RAM (memfd / file + offset, or pointers)
 *   uvsock_dev_queue_start(d, 0, &rx); uvsock_dev_queue_start(d, 1, &tx);   on DRIVER_OK
 *   uvsock_dev_start(d);                           the device thread runs from now on
 *   ... guest driver reset (status 0): uvsock_dev_reset(d), then again from set_features ...
 *   uvsock_dev_free(d);
 * (uvsock_dev_start() may come first: the configuration calls then run on the device thread.)
 *
 * Threads: a device runs in one of two modes, chosen at creation.
 *
 * - Device thread (default): each device runs on a thread of its own, started by
 *   uvsock_dev_start(): it watches the kick eventfds and the host sockets, moves packets and
 *   writes the call eventfds; nothing of the VMM's event loop is needed on the data path. Every
 *   function may be called from any thread; configuration calls are handed to the device thread
 *   and return when it has done them (synchronous, so a VMM can reuse a stopped ring's memory as
 *   soon as queue_stop returns). Calls on one device are serialised.
 *
 * - External loop (cfg.flags UVSOCK_DEV_EXTERNAL_LOOP): no thread is started; the VMM's own event
 *   loop runs the device. It polls uvsock_dev_fd() for POLLIN (readable while a kick eventfd,
 *   a host socket or a sibling device has work for it) with a timeout no longer than
 *   uvsock_dev_timeout_ms(), asked right before each wait (calls and processing may leave work
 *   due at once: the timeout is then 0), and calls uvsock_dev_process() when the fd is readable
 *   or the timeout expired. uvsock_dev_process() never blocks; all the device's work (packets,
 *   host sockets, timers) runs inside it. The first thread that calls uvsock_dev_process() is the
 *   device's loop thread for the rest of its life: from then on every call on the device must
 *   come from that thread, except uvsock_dev_features, uvsock_dev_fd and uvsock_dev_get_stats
 *   (any thread) and uvsock_dev_free (any thread, while no other call runs). A call from another
 *   thread does nothing and returns -EPERM (uvsock_dev_timeout_ms returns 0 so that the caller's
 *   uvsock_dev_process reports the -EPERM). Before that first call, any one thread at a time may
 *   make the calls (the VMM serialises them), e.g. its main thread at set-up. Configuration calls
 *   run directly on the calling thread and are done when they return, as in thread mode.
 *   uvsock_dev_start() is not used (-EINVAL).
 *
 * None may be called from a signal handler.
 *
 * Ownership: the eventfds and the memory-region fds are borrowed. The device never closes them:
 * a kick or call fd must stay open until its queue is stopped (uvsock_dev_queue_stop,
 * uvsock_dev_reset, uvsock_dev_free) or the call fd is replaced (uvsock_dev_set_call_fd); region
 * fds may be closed as soon as uvsock_dev_set_mem_table returns (the device keeps its own
 * mapping). Host pointers given as regions must stay mapped until the table is replaced or the
 * device is freed.
 *
 * Security model: the guest is untrusted. Ring errors (bad indexes, descriptor loops, addresses
 * outside the memory table) mark the device broken (uvsock_dev_get_stats: broken) until the
 * queues are restarted; malformed or spoofed packets are dropped and counted; every
 * guest-driven resource is bounded. Host programs are untrusted too. The VMM is trusted to pass
 * what it negotiated, but every value is still checked (-EINVAL, never a crash).
 *
 * Errors: functions return 0 or a negative errno; the errno values each one returns are listed.
 */
#ifndef UVSOCK_DEVICE_API_H
#define UVSOCK_DEVICE_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What this header declares is libuvsock's API: exported (src/libuvsock.map). */
#pragma GCC visibility push(default)

/* Feature bits (bit numbers in the 64-bit virtio feature word). */
#define UVSOCK_DEV_F_SEQPACKET 1        /* VIRTIO_VSOCK_F_SEQPACKET */
#define UVSOCK_DEV_F_DGRAM 3            /* VIRTIO_VSOCK_F_DGRAM (docs/vsock-protocol.md) */
#define UVSOCK_DEV_F_INDIRECT_DESC 28   /* VIRTIO_RING_F_INDIRECT_DESC */
#define UVSOCK_DEV_F_EVENT_IDX 29       /* VIRTIO_RING_F_EVENT_IDX */
#define UVSOCK_DEV_F_VERSION_1 32       /* VIRTIO_F_VERSION_1 */
#define UVSOCK_DEV_F_RING_PACKED 34     /* VIRTIO_F_RING_PACKED */
#define UVSOCK_DEV_F_IN_ORDER 35        /* VIRTIO_F_IN_ORDER */

/* Queue indexes. */
#define UVSOCK_DEV_QUEUE_RX 0u
#define UVSOCK_DEV_QUEUE_TX 1u
#define UVSOCK_DEV_QUEUE_EVENT 2u /* the event queue (virtio 1.2 §5.10.2) */

struct uvsock_dev;

/* struct uvsock_dev_config flags. */
#define UVSOCK_DEV_EXTERNAL_LOOP 1u /* no device thread: the VMM's event loop runs the device
				     * (uvsock_dev_fd, uvsock_dev_timeout_ms, uvsock_dev_process) */
#define UVSOCK_DEV_NO_DGRAM 2u      /* no datagrams: no <uds_path>.dgram socket, and the VMM
				     * offers uvsock_dev_features() without UVSOCK_DEV_F_DGRAM
				     * (a guest that acks it anyway gets no datagram service) */
#define UVSOCK_DEV_OK_GUEST_PORT 4u /* answer a host program's "CONNECT <port>" with
				     * "OK <port>\n", the guest port it asked for (as
				     * vhost-device-vsock does; systemd's ssh-proxy reads at most
				     * "OK 65535\n"), not "OK <host-side port>\n" with the port in
				     * [2^30, 2^31) that uvsock-run reads (docs/uvsockd.md) */

/* What the device serves. Set size, zero the rest (see "Structs that grow" in
 * <uvsock/uvsock.h>), then set guest_cid and uds_path. */
struct uvsock_dev_config {
	uint32_t size;            /* sizeof(struct uvsock_dev_config) */
	uint32_t guest_cid;       /* the guest's CID: 3 .. 0xfffffffe (the VMM's config space) */
	const char *uds_path;     /* host side: listen here and at <uds_path>_seqpacket, connect to
				   * <uds_path>_<port>; datagrams at <uds_path>.dgram and
				   * <uds_path>_<port>.dgram; at most 96 bytes; copied */
	uint32_t buf_alloc;       /* receive buffer advertised per connection; 0: 262144 */
	uint32_t queue_size_max;  /* largest queue size accepted (power of two); 0: 1024 */
	uint32_t max_conns;       /* host-side connections at a time; 0: 1024 */
	const char *name;         /* for log lines ("vm3"); copied; NULL: "cid<N>" */
	unsigned flags;           /* UVSOCK_DEV_EXTERNAL_LOOP, _NO_DGRAM, _OK_GUEST_PORT, or 0 */
	/* Added after the first version: a caller built before reads as 0 here (a smaller size,
	 * or on 64-bit targets the first version's tail padding, zeroed as it asked). */
	uint32_t dgram_max;       /* largest datagram payload accepted, 1 .. 65492 (64 KiB less
				   * the header); 0: 65492 */
};

/*
 * The feature bits to offer the guest driver (VERSION_1, SEQPACKET, DGRAM, INDIRECT_DESC,
 * EVENT_IDX, IN_ORDER, RING_PACKED; datagrams: docs/uvsockd.md "Datagrams").
 * The VMM adds its transport's own bits (e.g. VIRTIO_F_ACCESS_PLATFORM is not supported: do
 * not offer it). Pure; any thread.
 */
uint64_t uvsock_dev_features(void);

/*
 * Creates a device: binds and listens on cfg->uds_path and <uds_path>_seqpacket, binds the
 * datagram socket <uds_path>.dgram (stale socket files there are replaced; another kind of file
 * is an error). No thread yet, no queue.
 * Returns 0, -EINVAL (cfg NULL, bad size, reserved CID, uds_path NULL or too long,
 * queue_size_max not a power of two up to 32768, buf_alloc under 4096, dgram_max over 65492,
 * unknown flags), -ENOMEM,
 * -EEXIST (a non-socket file at a path), or the errno of socket/bind/listen. *ret is written
 * only on success.
 */
int uvsock_dev_new(const struct uvsock_dev_config *cfg, struct uvsock_dev **ret);

/*
 * Lets the guests of a and b connect to each other by CID (they share a group, as uvsockd's
 * groups=): guest-to-guest packets are routed between the two devices (whatever their mode,
 * each on its own thread). Both directions. A device-thread device may be running (the link is
 * made on its thread, as a VM hot-plugged into a group needs), not concurrently with its
 * uvsock_dev_start(); an external-loop device must not have run yet (before its first
 * uvsock_dev_process()). A device of the same CID as a freed one it was linked to takes its
 * place. Linked devices are freed
 * independently: when one is freed (uvsock_dev_free) the others keep running; what they had
 * queued for it is dropped, and what their guests send its CID from then on is dropped too,
 * each such packet counted in the sender's `dropped` and answered with an RST from that CID
 * (except an RST), so their connections to it fail at once.
 * Returns 0, -EINVAL (same device, same CID, a live device of b's CID linked to a already, or
 * an external-loop device that has run), -ENOMEM.
 */
int uvsock_dev_link(struct uvsock_dev *a, struct uvsock_dev *b);

/*
 * Starts the device thread (named "uvsock-<cid>"). Queues started before run from now on.
 * Returns 0, -EALREADY (already started), -EINVAL (created with UVSOCK_DEV_EXTERNAL_LOOP: there
 * is no thread to start), or the errno of pthread_create.
 */
int uvsock_dev_start(struct uvsock_dev *d);

/*
 * External-loop mode: the fd the VMM's loop polls for POLLIN (the device's epoll fd). Readable
 * while the device has events to handle; timers do not make it readable (uvsock_dev_timeout_ms).
 * Owned by the device: do not close, read or epoll_ctl it (adding it to the VMM's own epoll set,
 * or polling it, is fine); the same fd for the device's life. Any thread.
 * Returns the fd (>= 0), or -EINVAL (d NULL or a device-thread device).
 */
int uvsock_dev_fd(struct uvsock_dev *d);

/*
 * External-loop mode: milliseconds the VMM's loop may sleep at most before the next
 * uvsock_dev_process() (the next internal timer: connect and close timeouts of connections, the
 * 2 s limit of a host program's CONNECT, work a configuration call left to do), rounded up;
 * 0: call uvsock_dev_process() now; -1: no timer (wait for uvsock_dev_fd() only). Ask right
 * before each wait. Loop thread.
 * Returns -1 for a device-thread device, 0 when called from a thread that is not the loop thread.
 */
int uvsock_dev_timeout_ms(struct uvsock_dev *d);

/*
 * External-loop mode: runs the work that is ready (events of uvsock_dev_fd() and due timers),
 * never waiting for more, then returns. The first call makes the calling thread the device's
 * loop thread. Work is done in passes (256 packets or 512 KiB per queue) and a pass that hits
 * that budget continues at once, within the same call, until the rings are drained or blocked.
 * Returns 0, -EINVAL (d NULL or a device-thread device), -EPERM (not the loop thread), or the
 * errno of epoll_wait (-ENOMEM...).
 */
int uvsock_dev_process(struct uvsock_dev *d);

/*
 * Stops the device thread, stops the queues (dropping every connection: host sockets closed),
 * removes the socket files the device created, unmaps its memory table and frees everything
 * (the last device of the process also frees what the API's devices share). Borrowed fds are
 * not closed; in external-loop mode the VMM removes uvsock_dev_fd() from its poll set first.
 * Devices linked to d may be running meanwhile and go on (see uvsock_dev_link); packets d's
 * guest had sent them are still delivered.
 * Safe on NULL. Any thread; no other call on d may run concurrently or later.
 */
void uvsock_dev_free(struct uvsock_dev *d);

/*
 * The features the guest driver acked (FEATURES_OK). They apply to queues started afterwards
 * (EVENT_IDX, INDIRECT_DESC) and to the connections of the next session (SEQPACKET: a session
 * starts when the TX queue starts after new/reset). Set them before starting the queues.
 * Returns 0, -EINVAL (a bit not in uvsock_dev_features()), -EPERM (see Threads: external loop,
 * not its loop thread; the same for every configuration call below).
 */
int uvsock_dev_set_features(struct uvsock_dev *d, uint64_t features);

/* One guest RAM region. Either host_addr or fd. */
struct uvsock_dev_mem_region {
	uint64_t guest_phys_addr; /* first guest-physical address */
	uint64_t size;            /* bytes, > 0 */
	void *host_addr;          /* non-NULL: the region is mapped here in this process already
				   * (the VMM's own mapping; must stay mapped); fd is then ignored */
	int fd;                   /* host_addr NULL: a shareable file (memfd, hugetlbfs, file)
				   * mapped MAP_SHARED at fd_offset; borrowed */
	uint64_t fd_offset;       /* where the region starts in fd */
};

/*
 * Replaces the guest memory table: up to 8 regions, all given by host_addr or all by fd (not
 * mixed), guest-physical ranges disjoint. Descriptor addresses and the ring addresses of
 * uvsock_dev_queue_start are guest-physical addresses in this table. Both queues must be stopped
 * (as vhost-user's SET_MEM_TABLE stops them); connections survive, so stop, replace, restart
 * (with the last_avail_idx queue_stop returned) keeps them.
 * Returns 0, -EPERM, -EBUSY (a queue is running), -EINVAL (n 0, NULL regions, mixed kinds,
 * size 0, overlap, an fd region that is not a regular file or memfd or whose file is too short),
 * -E2BIG (more than 8 regions, or a region above the per-device cap on mapped guest memory,
 * 1 TiB by default), -ENOMEM (the process-wide cap, 16 TiB by default, or no memory), -ENOSPC
 * (the SIGBUS guard's region slots are used up), or the errno of mmap/fstat. On error the old
 * table stays. A memfd that allows sealing is sealed against shrinking (F_SEAL_SHRINK), so the
 * memory can no longer be truncated under the device; see docs/security.md.
 */
int uvsock_dev_set_mem_table(struct uvsock_dev *d, const struct uvsock_dev_mem_region *regions,
			     unsigned n);

/* What one queue needs (the VMM's virtio transport knows all of it at DRIVER_OK). Set size. */
struct uvsock_dev_queue {
	uint32_t size;            /* sizeof(struct uvsock_dev_queue) */
	unsigned num;             /* queue size: power of two, <= queue_size_max (RING_PACKED
				   * acked: any size) */
	uint64_t desc_addr;       /* descriptor table (16 * num bytes, 16-byte aligned) */
	uint64_t avail_addr;      /* driver area (6 + 2 * num bytes, 2-byte aligned; packed: 4) */
	uint64_t used_addr;       /* device area (6 + 8 * num bytes, 4-byte aligned; packed: 4) */
	uint16_t last_avail_idx;  /* next avail index to process: 0 at first start, else what
				   * uvsock_dev_queue_stop returned (packed: slot | wrap << 15,
				   * 0x8000 at first start) */
	int kick_fd;              /* eventfd the guest's notifications are written to; required */
	int call_fd;              /* eventfd the device writes to interrupt the guest; -1: none */
	unsigned flags;           /* UVSOCK_DEV_QUEUE_* */
};
/* The three ring addresses are host pointers in this process, not guest-physical addresses
 * (they must still point into the memory table's regions). vhost-user uses this. */
#define UVSOCK_DEV_QUEUE_HOST_ADDRS 1u

/*
 * Starts queue qidx (UVSOCK_DEV_QUEUE_RX, _TX or _EVENT: the event queue is optional and the
 * device posts only TRANSPORT_RESET there). The used index is taken from the ring in guest
 * memory (never assumed 0). Starting TX after uvsock_dev_new or uvsock_dev_reset begins a new
 * session (fresh connection table, the device's wildcard listeners for guest connects).
 * Returns 0, -EPERM, -EINVAL (bad size, qidx, num, kick_fd < 0, a kick or call fd that is not an
 * eventfd, unknown flags, misaligned addresses, no memory table), -EFAULT (a ring part outside
 * the memory table), -EBUSY (already running), -ENOMEM, or the errno of epoll_ctl on kick_fd
 * (-EBADF...).
 */
int uvsock_dev_queue_start(struct uvsock_dev *d, unsigned qidx, const struct uvsock_dev_queue *q);

/*
 * Stops queue qidx: when this returns the device no longer touches the ring or its eventfds.
 * Connections are kept (restart the queue to go on; uvsock_dev_reset drops them).
 * *ret_last_avail_idx (may be NULL) gets the next avail index the device would have processed.
 * Returns 0 (also if it was not running), -EINVAL (qidx), -EPERM.
 */
int uvsock_dev_queue_stop(struct uvsock_dev *d, unsigned qidx, uint16_t *ret_last_avail_idx);

/*
 * Replaces the call eventfd of a queue (e.g. the guest changed its MSI-X vector and the VMM its
 * irqfd); -1: no interrupts. The old fd is not used after this returns.
 * Returns 0, -EINVAL (qidx, or a call fd that is not an eventfd), -EPERM.
 */
int uvsock_dev_set_call_fd(struct uvsock_dev *d, unsigned qidx, int call_fd);

/*
 * Guest driver reset (the driver wrote 0 to the device status): both queues stop, every
 * connection of the guest is dropped (host sockets closed, nothing sent to the guest), a broken
 * device is repaired. The host-side listeners stay; counters stay. Start again from
 * uvsock_dev_set_features. Returns 0, or -EPERM.
 */
int uvsock_dev_reset(struct uvsock_dev *d);

/*
 * Transport reset, as a VMM does after restoring or migrating a VM (QEMU: vhost-vsock-common's
 * TRANSPORT_RESET on load): every connection of the guest is dropped (host sockets closed), a
 * VIRTIO_VSOCK_EVENT_TRANSPORT_RESET is posted on the event queue (UVSOCK_DEV_QUEUE_EVENT, when
 * the VMM started it; otherwise when it starts) so that the guest resets its sockets and
 * re-reads its CID, and a new session begins at once if TX runs. The device posts the same
 * event by itself whenever it drops connections the guest may still hold (a reset, rings
 * stopped). Queues keep running. Returns 0, -EPERM, -ENOMEM.
 */
int uvsock_dev_transport_reset(struct uvsock_dev *d);

/* Counters (monotonic for the device's life, across resets) and state. */
struct uvsock_dev_stats {
	uint32_t size;                   /* sizeof(struct uvsock_dev_stats), set by the caller */
	uint64_t tx_pkts, tx_bytes;      /* guest packets accepted (to the host or a sibling) */
	uint64_t rx_pkts, rx_bytes;      /* packets put into the guest's RX buffers */
	uint64_t dropped;                /* guest packets dropped: malformed chain, spoofed source
					  * CID, no route, a sibling not taking packets, or a
					  * sibling freed (also what it had not delivered yet) */
	uint64_t ring_errors;            /* times the device was marked broken */
	uint64_t interrupts;             /* call eventfd writes */
	uint64_t conns_open;             /* connections now (gauge) */
	uint64_t conns_total;            /* connections ever */
	uint64_t host_connects_refused;  /* guest connects to the host answered with RST: nobody
					  * listened at <uds_path>_<port>, no accept within 2 s,
					  * or max_conns (device or engine limit) was reached */
	int broken;                      /* 1 while a ring error stops the device */
	int running;                     /* 1 while the TX queue runs (a session exists) */
};

/*
 * Fills *ret (as far as ret->size, set by the caller, reaches). Any thread, never blocks the data
 * path (takes a short lock). Returns 0, or -EINVAL (d or ret NULL, bad ret->size).
 */
int uvsock_dev_get_stats(struct uvsock_dev *d, struct uvsock_dev_stats *ret);

/*
 * State save and restore (docs/upgrade.md): a device's whole state moves into a new device, in
 * this process or another (a VMM that restarts or upgrades itself while its guest runs), and
 * every connection goes on there: no byte lost, duplicated or reordered, no RST, nothing the
 * guest can see but a pause. The state is a versioned, checksummed record in a sealed memfd
 * plus file descriptors (the host-side sockets: listeners, each host connection, datagram
 * sockets) that go with it, e.g. over a Unix socket with SCM_RIGHTS.
 *
 * The front-end's part is not in the record: guest memory and the rings are the VMM's, as at
 * any start. So, on the old device: stop the three queues (uvsock_dev_queue_stop, keeping the
 * indices it gives), then uvsock_dev_save. On the new one: uvsock_dev_restore, then
 * uvsock_dev_set_mem_table and uvsock_dev_queue_start with those indices (the features are
 * restored; a set_features with the same bits is harmless), then uvsock_dev_start. Finally
 * free the old device: it leaves the socket files to the new one and sends nothing.
 *
 * uvsock_dev_save: from then on d is frozen: host programs' bytes and connects wait in the
 * kernel, no timer runs, and every call but uvsock_dev_resume, uvsock_dev_get_stats and
 * uvsock_dev_free returns -EBUSY. Returns 0 with a sealed memfd in *ret_memfd and a malloc'd
 * array of *ret_nfds duplicated fds in *ret_fds (all close-on-exec; the caller owns and closes
 * them, and frees the array; NULL when there are none), or -EINVAL (NULL arguments), -EBUSY
 * (a queue runs, or saved already: -EALREADY), -EOPNOTSUPP (linked to other devices:
 * uvsock_dev_link; not saved yet), -EPERM (external loop, not its thread), -ENOMEM, or the
 * errno of memfd_create/fcntl. On error d goes on as before.
 *
 * uvsock_dev_resume: d goes on after a save (the restore failed, or was never made): nothing
 * was lost, the save cost a pause. Returns 0, -EINVAL (not saved), -EPERM, -ENOMEM.
 *
 * uvsock_dev_restore: creates a device from cfg (guest_cid must be the saved one's; uds_path
 * the same, whose sockets come from the record: nothing is bound) and the record (memfd, and
 * the nfds fds that came with it, in order; borrowed: the device keeps duplicates). The record
 * is checked completely first: its header, version (a version this library does not know is
 * refused, -EPROTONOSUPPORT), checksum and every field, each fd's kind. On any error nothing
 * is created, the log says why, and the saved device may resume. Returns 0 and *ret, or
 * -EINVAL (arguments, cfg as uvsock_dev_new), -EBADMSG (a malformed or inconsistent record),
 * -EPROTONOSUPPORT, -E2BIG (more connections than cfg's max_conns), -EPERM (memfd not
 * sealed), -ENOMEM, or the errno of duplicating an fd.
 */
int uvsock_dev_save(struct uvsock_dev *d, int *ret_memfd, int **ret_fds, size_t *ret_nfds);
int uvsock_dev_resume(struct uvsock_dev *d);
int uvsock_dev_restore(const struct uvsock_dev_config *cfg, int memfd, const int *fds,
		       size_t nfds, struct uvsock_dev **ret);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
