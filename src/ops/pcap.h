/* SPDX-License-Identifier: MIT */
/*
 * Packet capture of vsock traffic in the format Linux's vsockmon device produces, so that
 * tshark, Wireshark and tcpdump read it as they read `tcpdump -i vsockmon0`: a classic pcap
 * file (microsecond or nanosecond timestamps) with link type LINKTYPE_VSOCK (271), each record
 * being a struct af_vsockmon_hdr (linux/vsockmon.h, 32 bytes, little-endian) followed by the
 * 44-byte virtio vsock header and the payload, truncated to the snap length.
 *
 * Two objects:
 *   struct ops_pcap  one open capture file: buffered writer, its own lock, reference counted
 *                    (several VMs may write into one file).
 *   struct ops_tap   one per VM, embedded in the VM's state and never freed while the VM
 *                    thread runs. The data path calls OPS_TAP() on every packet: one relaxed
 *                    load and a predictable branch while nobody captures. The control thread
 *                    attaches a file to it and detaches it; the tap's lock makes detaching
 *                    safe against a VM thread in the middle of a write (no grace period needed).
 *
 * Security model: packets are guest data, written verbatim; nothing in them is interpreted
 * except the header fields copied into the vsockmon header. Files are bounded by max_bytes.
 */
#ifndef UVSOCK_OPS_PCAP_H
#define UVSOCK_OPS_PCAP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vsock/hdr.h"

#define OPS_LINKTYPE_VSOCK 271u
#define OPS_VSOCKMON_HDR_SIZE 32u
/* vsockmon header + virtio header + largest payload: the default snap length keeps everything. */
#define OPS_PCAP_SNAPLEN_MAX (OPS_VSOCKMON_HDR_SIZE + VSOCK_HDR_SIZE + VSOCK_MAX_PKT_PAYLOAD)

/* af_vsockmon_hdr.op (linux/vsockmon.h). */
enum ops_vsockmon_op {
	OPS_VSOCKMON_OP_UNKNOWN = 0,
	OPS_VSOCKMON_OP_CONNECT = 1,
	OPS_VSOCKMON_OP_DISCONNECT = 2,
	OPS_VSOCKMON_OP_CONTROL = 3,
	OPS_VSOCKMON_OP_PAYLOAD = 4,
};
#define OPS_VSOCKMON_TRANSPORT_VIRTIO 2u

/* The vsockmon op for a virtio op, as Linux's virtio_transport_build_skb() maps it. */
enum ops_vsockmon_op ops_vsockmon_op(uint16_t virtio_op);

/*
 * Encodes the 32-byte af_vsockmon_hdr for h into out (any alignment): CIDs, ports, op mapped
 * with ops_vsockmon_op(), transport VIRTIO, len 44. Pure.
 */
void ops_vsockmon_hdr_encode(const struct vsock_hdr *h, void *out);

struct ops_pcap_opts {
	bool nanosecond;   /* nanosecond timestamps (magic 0xa1b23c4d); default microseconds */
	uint32_t snaplen;  /* bytes kept per record, >= 76 (the two headers); 0: everything */
	uint64_t max_bytes; /* file size limit; records beyond it are counted, not written; 0: 1 GiB */
};

struct ops_pcap_status {
	uint64_t pkts, bytes;      /* records and file bytes written (header included) */
	uint64_t dropped;          /* records not written: file limit reached or write error */
	int error;                 /* first write error (positive errno), 0 if none */
	uint32_t snaplen;
	bool nanosecond;
};

struct ops_pcap;

/*
 * Starts a capture file on fd (a regular file or pipe opened for writing; taken over: closed on
 * the last unref, or on failure). Writes the pcap global header at once.
 * Returns 0, -EINVAL (snaplen below 76), -ENOMEM, or the errno of the first write.
 * The caller owns the one reference in *ret. Context: any thread.
 */
int ops_pcap_open_fd(int fd, const struct ops_pcap_opts *o, struct ops_pcap **ret);

/*
 * Same on a new file: created with O_EXCL|O_NOFOLLOW, mode 0600 (an existing file is never
 * overwritten). Returns 0, -EEXIST, the errno of open, or as ops_pcap_open_fd.
 */
int ops_pcap_open_path(const char *path, const struct ops_pcap_opts *o, struct ops_pcap **ret);

/* Takes another reference; returns p. */
struct ops_pcap *ops_pcap_ref(struct ops_pcap *p);
/* Drops a reference; the last one flushes and closes the file. Safe on NULL. */
void ops_pcap_unref(struct ops_pcap *p);

/*
 * Appends one record: vsockmon header, h encoded, then h->len payload bytes from iov (fewer if
 * iov holds fewer), all cut at the snap length; timestamp ts_ns (CLOCK_REALTIME ns; 0: now).
 * Buffered: the data reaches the file when the buffer fills, a second has passed since the last
 * flush, on ops_pcap_flush(), or on the last unref. Errors are recorded in the status, never
 * returned (the data path must not care). Context: any thread (takes p's lock).
 */
void ops_pcap_write(struct ops_pcap *p, const struct vsock_hdr *h, const struct iovec *iov,
		    int iovcnt, uint64_t ts_ns);

/* Writes buffered records to the file. Returns 0 or the recorded write error (-errno). */
int ops_pcap_flush(struct ops_pcap *p);
void ops_pcap_get_status(struct ops_pcap *p, struct ops_pcap_status *ret);

/* ---- Per-VM tap ----------------------------------------------------------------------- */

struct ops_tap {
	atomic_int on;         /* relaxed-read on the data path: nonzero while a file is attached */
	pthread_mutex_t lock;  /* protects pcap */
	struct ops_pcap *pcap; /* one reference, or NULL */
};

/* Initialises a detached tap. */
void ops_tap_init(struct ops_tap *t);
/* Detaches (dropping the file's reference) and destroys the lock. No VM thread may use t. */
void ops_tap_destroy(struct ops_tap *t);

/*
 * Attaches p (takes a new reference). Returns 0 or -EBUSY if a file is already attached.
 * Context: any thread (the control thread).
 */
int ops_tap_attach(struct ops_tap *t, struct ops_pcap *p);
/*
 * Detaches the current file, if any; once this returns no VM thread writes to it anymore.
 * Returns true if a file was attached. Context: any thread.
 */
bool ops_tap_detach(struct ops_tap *t);
/* True while a file is attached (control thread's view). */
bool ops_tap_attached(struct ops_tap *t);

/* Slow path of OPS_TAP: writes the packet to the attached file, if still attached. */
void ops_tap_packet(struct ops_tap *t, const struct vsock_hdr *h, const struct iovec *iov,
		    int iovcnt);

/*
 * Data path hook: call once per packet in each direction (guest TX after the header is decoded,
 * guest RX after the packet is built), with the payload iov. Costs one relaxed load and a
 * predictable branch while capture is off.
 */
#define OPS_TAP(t, h, iov, iovcnt)                                                                 \
	do {                                                                                       \
		if (__builtin_expect(atomic_load_explicit(&(t)->on, memory_order_relaxed), 0))     \
			ops_tap_packet((t), (h), (iov), (iovcnt));                                 \
	} while (0)

#endif
