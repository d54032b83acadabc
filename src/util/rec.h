/* SPDX-License-Identifier: MIT */
/*
 * The state record: a versioned, checksummed tag-length-value document that carries a running
 * uvsockd's state to the process that takes over from it (docs/upgrade.md, "The record"). It
 * travels in a sealed memfd, with the file descriptors it names passed beside it (SCM_RIGHTS);
 * inside the record an fd is only an index into that array.
 *
 * Layout, all integers little-endian:
 *
 *   header (REC_HDR_SIZE = 40 bytes)
 *     0  magic "UVSOCKRC"   8  u32 kind   12  u32 version   16  u64 total length (header + body)
 *    24  u32 fd count      28  u32 flags (0)   32  u32 CRC32C   36  u32 reserved (0)
 *   body: items, each  u32 tag (never 0) | u32 length | length bytes of value
 *
 * The CRC32C (Castagnoli, reflected, as iSCSI and ext4) covers the whole record with the CRC
 * field read as zero. A value is a u32, a u64, bytes, an fd (u32 index into the fd array) or a
 * nested list of items; which one is fixed by the tag in the schema of the record's kind and
 * version (the tables of docs/upgrade.md).
 *
 * Security model: a record is untrusted until it has been decoded completely: it may come from
 * another binary, a corrupted file or a hostile process. The reader checks the header (magic,
 * kind, a version the caller knows, lengths, flags, the CRC), every item's bounds before
 * reading it, the size of every scalar, the nesting depth, fd indices against the fd count and
 * that each fd is claimed once; rec_scan() adds unknown, duplicate and missing fields. Every
 * refusal is a -errno (-EBADMSG for a malformed record, -EPROTONOSUPPORT for an unknown version,
 * -E2BIG for a size over a limit) and a message saying where and why (rec_error()).
 *
 * Plain data structures: no locks, one thread at a time per writer or document.
 */
#ifndef UVSOCK_UTIL_REC_H
#define UVSOCK_UTIL_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define REC_MAGIC "UVSOCKRC"
#define REC_HDR_SIZE 40u
#define REC_CRC_OFFSET 32u
/* Limits: the record's length, the fds it may carry, lists nested in lists (the writer and
 * the reader take REC_MAX_DEPTH levels, no more). */
#define REC_MAX_LEN (16ull << 30)
#define REC_MAX_FDS 65536u
#define REC_MAX_DEPTH 8u

/* Record kinds. */
enum {
	REC_KIND_ENGINE = 1, /* one vsock engine (src/vsock/save.c) */
	REC_KIND_DEVICE = 2, /* one device: core, engine, host side (src/device/device.c) */
	REC_KIND_VHOST_USER = 3, /* one vhost-user back-end (src/vhost_user/backend.c) */
	REC_KIND_VM = 4, /* a VM of uvsockd: its config, glue, back-end, device (daemon/upgrade.c) */
	REC_KIND_CRASH = 5, /* one VM's crash-survival record (src/device/vhu_keep.h) */
	REC_KIND_DEVICE_STATE = 6, /* VHOST_USER_PROTOCOL_F_DEVICE_STATE (src/device/vhu_state.c) */
	REC_KIND_ISO_MAIN = 7, /* the --isolate main process's state (daemon/isolate.c) */
};

/* CRC32C of n bytes, continuing from crc (start with 0): SSE4.2's crc32 where the CPU has it. */
uint32_t rec_crc32c(uint32_t crc, const void *p, size_t n);
/* The same with a table, byte by byte: what rec_crc32c does without SSE4.2 (and for tests). */
uint32_t rec_crc32c_sw(uint32_t crc, const void *p, size_t n);

/* ---- writing ---------------------------------------------------------------------------------- */

/*
 * A record being built in a growable buffer. Errors are sticky: after the first failure
 * (-ENOMEM, -E2BIG, -EINVAL for an unbalanced rec_end) every call does nothing and
 * rec_writer_finish() returns it, so a writer need not check each put.
 */
struct rec_writer {
	uint8_t *buf;
	size_t len, cap;
	int *fds; /* borrowed numbers, in index order */
	uint32_t nfds, fd_cap;
	uint32_t kind, version;
	size_t open[REC_MAX_DEPTH]; /* offsets of the nested items not yet ended */
	uint32_t depth;
	int err;
};

void rec_writer_init(struct rec_writer *w, uint32_t kind, uint32_t version);
/* Frees the buffer and the fd array (closes no fd). Safe on a zeroed writer. */
void rec_writer_free(struct rec_writer *w);

void rec_put_u32(struct rec_writer *w, uint32_t tag, uint32_t v);
void rec_put_u64(struct rec_writer *w, uint32_t tag, uint64_t v);
void rec_put_bytes(struct rec_writer *w, uint32_t tag, const void *p, size_t n);
/* One bytes item made of the iovecs' bytes in order (e.g. a ring that wraps). */
void rec_put_iov(struct rec_writer *w, uint32_t tag, const struct iovec *iov, size_t iovcnt);
/* An fd item: fd is appended to the fd array (borrowed: keep it open until it is sent). */
void rec_put_fd(struct rec_writer *w, uint32_t tag, int fd);
/* Opens a nested list item; everything put until the matching rec_end() is its value. */
void rec_begin(struct rec_writer *w, uint32_t tag);
void rec_end(struct rec_writer *w);

/*
 * Writes the header (length, fd count, CRC). Returns 0 and the record in *ret_buf / *ret_len
 * (owned by w, valid until rec_writer_free), or the writer's error.
 */
int rec_writer_finish(struct rec_writer *w, const uint8_t **ret_buf, size_t *ret_len);

/*
 * Recomputes the CRC of a finished record of len bytes (len >= REC_HDR_SIZE) in place: for tests
 * and fuzzers that change a record on purpose, so that the check under test is the one that
 * fires.
 */
void rec_reseal(uint8_t *buf, size_t len);

/*
 * A memfd holding the len bytes of buf, sealed against writing, growing and shrinking (so that
 * the reader may map it without copying: nothing can change it under its checks). name is the
 * memfd's name (for /proc). Returns 0 and a close-on-exec fd in *ret_fd, or -errno.
 */
int rec_memfd(const void *buf, size_t len, const char *name, int *ret_fd);
/*
 * Maps a record memfd read-only. Refuses (-EPERM) a file that is not sealed against write,
 * grow and shrink, and (-E2BIG) one over REC_MAX_LEN; -EBADMSG if it is empty. Returns 0 and
 * the mapping; release it with rec_unmap().
 */
int rec_map_fd(int fd, const uint8_t **ret_buf, size_t *ret_len);
void rec_unmap(const uint8_t *buf, size_t len);

/*
 * Passing a record and its fds to another process over a connected SOCK_SEQPACKET socket
 * (docs/upgrade.md, "The hand-over"): one message with the memfd, then the fds in order, at most
 * REC_FDS_PER_MSG per message (SCM_RIGHTS carries at most 253 per message, SCM_MAX_FD). Each
 * message names its place (the fd count, then each batch's first index), so the receiver
 * checks that it got every fd once and in order.
 *
 * rec_send: fds are borrowed (the kernel duplicates them). Returns 0 or -errno (-EINVAL: more
 * than REC_MAX_FDS; socket errors).
 * rec_recv: waits at most timeout_ms (in all) for the whole set. Returns 0 with the memfd and a
 * malloc'd array of *ret_nfds close-on-exec fds (the caller owns all), or -errno with nothing
 * left open: -ETIMEDOUT, -ECONNRESET (the sender closed), -EBADMSG (a malformed or out-of-order
 * message, fds missing or extra, a truncated control message), -E2BIG, -ENOMEM.
 */
#define REC_FDS_PER_MSG 250u
int rec_send(int sock, int memfd, const int *fds, size_t nfds);
int rec_recv(int sock, int timeout_ms, int *ret_memfd, int **ret_fds, size_t *ret_nfds);

/* ---- reading ---------------------------------------------------------------------------------- */

/* A checked record being read: the buffer and fds are borrowed for the document's life. */
struct rec_doc {
	const uint8_t *buf;
	size_t len;
	uint32_t kind, version;
	const int *fds;
	uint32_t nfds;
	uint8_t *fd_claimed; /* one byte per fd */
	char err[192];
};

/* A cursor over one list of items (the body, or a nested item's value). */
struct rec_reader {
	struct rec_doc *doc;
	const uint8_t *p, *end;
	uint32_t depth;
	const char *where; /* for messages: "socket", "listener 3"... (borrowed) */
};

struct rec_item {
	uint32_t tag, len;
	const uint8_t *val;
	size_t off; /* of the item in the record, for messages */
};

/*
 * Checks the header of the record in buf (len bytes) and opens it: magic, kind, version in
 * [vmin, vmax], total length == len, header size, flags and reserved 0, fd count == nfds (the
 * fds that came with it) and the CRC. Returns 0, -EBADMSG, -EPROTONOSUPPORT (version),
 * -E2BIG, -ENOMEM; on failure rec_error(d) says why and d needs no rec_doc_fini().
 */
int rec_open(struct rec_doc *d, const void *buf, size_t len, uint32_t kind, uint32_t vmin,
	     uint32_t vmax, const int *fds, size_t nfds);
void rec_doc_fini(struct rec_doc *d);
/* Why the last call on d failed ("" if none). */
const char *rec_error(const struct rec_doc *d);
/* Records a failure (printf-style message) and returns err; for the schema's own checks. */
int rec_fail(struct rec_doc *d, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Every fd of the record was claimed by an fd item: 0, or -EBADMSG naming the first that was not. */
int rec_check_fds_claimed(struct rec_doc *d);

/* A reader over the body. */
void rec_root(struct rec_doc *d, struct rec_reader *r, const char *where);
/* The next item: 1 and *it, 0 at the end, -EBADMSG (tag 0, length past the end). */
int rec_next(struct rec_reader *r, struct rec_item *it);
/* A reader over nested item it of r (depth checked). Returns 0 or -EBADMSG. */
int rec_enter(struct rec_reader *r, const struct rec_item *it, const char *where,
	      struct rec_reader *sub);
/* Typed values of an item: -EBADMSG if its length is not the type's. */
int rec_get_u32(struct rec_reader *r, const struct rec_item *it, uint32_t *v);
int rec_get_u64(struct rec_reader *r, const struct rec_item *it, uint64_t *v);
/* An fd item: the fd it names (index checked, each fd claimed at most once). */
int rec_get_fd(struct rec_reader *r, const struct rec_item *it, int *fd);

/* ---- schemas: a list of named fields read at once --------------------------------------------- */

enum rec_type { REC_U32, REC_U64, REC_BYTES, REC_LIST, REC_FD };

struct rec_field {
	uint32_t tag;
	enum rec_type type;
	bool required;
	const char *name;
};

/* What rec_scan() found for one field. */
struct rec_val {
	bool present;
	uint64_t u;          /* REC_U32, REC_U64; REC_FD: the fd */
	struct rec_item it;  /* REC_BYTES, REC_LIST: the item (val, len); rec_enter() a list */
};

/*
 * Reads every item of r against fields[0..n): each item's tag must be one of them (unknown
 * tags are refused: a version's schema is complete), of its type and size, and appear at most
 * once; every required field must be there. vals[i] gets what fields[i] found. Returns 0,
 * -EBADMSG (with the field's name in the message).
 */
int rec_scan(struct rec_reader *r, const struct rec_field *fields, size_t n, struct rec_val *vals);

#endif
