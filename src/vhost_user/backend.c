/* SPDX-License-Identifier: MIT */
/*
 * vhost-user back-end for vsock (see backend.h): a table-driven dispatcher over the requests
 * QEMU 7.2's vhost-user-vsock-pci sends, the device state (features, guest memory, two rings)
 * and the ring start/stop decisions handed to the device role.
 *
 * Security model: the front-end is one step removed from a possibly malicious guest and is not
 * trusted either. Do not assume any received field holds a sensible value: the dispatcher
 * checks each message against its table line (fd count, payload size, SET_OWNER first, the
 * protocol feature it needs) and every handler validates every field before it changes state.
 * Any violation ends the connection (a -errno from vhu_backend_process(), with a reason in
 * vhu_backend_error()); it never reaches an assert.
 *
 * Fd ownership: fds received with a message belong to it until a handler claims one with
 * vhu_msg_take_fd(); vhu_backend_process() closes the rest on every path.
 */
#include "vhost_user/backend.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fdcheck.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "vhost_user/msg.h"
#include "vring/dirty_log.h"

/* Handler result besides 0 and -errno: refused (REPLY_ACK says failure), connection stays. */
#define VHU_REFUSED 1

struct vhu_ring {
	unsigned num;            /* 0 until SET_VRING_NUM */
	uint16_t last_avail_idx; /* SET_VRING_BASE, or what queue_stop returned */
	bool addr_set;
	struct vhu_vring_addr addr; /* front-end virtual addresses */
	int kick_fd, call_fd, err_fd;
	bool started;  /* SET_VRING_KICK seen, no GET_VRING_BASE since */
	bool enabled;  /* see backend.h "Ring lifecycle" */
	bool running;  /* the device was told queue_start and not yet queue_stop */
	struct vhu_vring_info info; /* what queue_start got; stable while running */
};

struct vhu_reply {
	uint32_t size;
	union {
		uint64_t u64;
		struct vhu_vring_state state;
		struct vhu_config config;
	} p;
};

struct vhu_backend {
	int sock;
	struct vhu_backend_config cfg;
	const struct vhu_backend_ops *ops;
	void *opaque;

	uint64_t offered_features; /* GET_FEATURES answer */
	uint64_t offered_proto;    /* GET_PROTOCOL_FEATURES answer */
	uint64_t features;         /* acked by SET_FEATURES */
	uint64_t proto_features;   /* acked by SET_PROTOCOL_FEATURES */
	bool owner;

	struct guest_mem *mem;
	/* The table mem was built from, with the regions' fds kept open (-1 past mem_n): the
	 * state record carries them to the process that takes over (docs/upgrade.md). */
	struct guest_mem_region_desc mem_desc[VHU_MAX_FDS];
	unsigned mem_n;
	struct vhu_ring rings[VHU_NUM_QUEUES];
	struct vring_log log; /* dirty log; every map gets it (guest_mem_set_log) */
	int log_fd;           /* the SET_LOG_BASE fd of the mapped log, kept open; -1 */
	uint64_t log_offset;  /* its mmap_offset (the size is log.size) */

	/* Called after every message that may change what vhu_backend_snapshot() writes. */
	void (*change_hook)(void *arg);
	void *change_arg;

	bool frozen;   /* saved (vhu_backend_save) or restored, not resumed: serves nothing */
	bool restored; /* restored and the device not yet told the features and memory */

	int error; /* sticky -errno once the connection failed */
	char errbuf[256];
	struct vhu_msg msg; /* the message being handled (4 KiB payload; kept off the stack) */
};

/* Policy flags of a table line. */
#define P_REPLY 0x1 /* has its own reply (payload in struct vhu_reply) */
#define P_OWNER 0x2 /* only after SET_OWNER */
#define NO_PROTO (-1)

typedef int (*vhu_handler)(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r);

/*
 * The requests we serve: name, handler, fd count [min, max], payload size [min, max], policy,
 * protocol feature that must have been acked (or NO_PROTO). Handlers narrow the ranges further
 * where the exact value depends on the payload (SET_MEM_TABLE, the "no fd" bit, GET_CONFIG).
 * Everything else (inflight, back-end channel, status, memory slots...) is not offered
 * and therefore a protocol violation.
 */
#define VHU_HANDLED_REQUESTS(X)                                                                    \
	X(GET_FEATURES, h_get_features, 0, 0, 0, 0, P_REPLY, NO_PROTO)                             \
	X(SET_FEATURES, h_set_features, 0, 0, 8, 8, 0, NO_PROTO)                                   \
	X(SET_OWNER, h_set_owner, 0, 0, 0, 0, 0, NO_PROTO)                                         \
	X(RESET_OWNER, h_reset_owner, 0, 0, 0, 0, 0, NO_PROTO)                                     \
	X(SET_MEM_TABLE, h_set_mem_table, 1, VHU_MAX_FDS, 8 + 32, 8 + 32 * VHU_MAX_FDS, P_OWNER,  \
	  NO_PROTO)                                                                                \
	X(SET_LOG_BASE, h_set_log_base, 1, 1, 16, 16, P_OWNER | P_REPLY, VHU_PROTO_F_LOG_SHMFD)    \
	X(SET_LOG_FD, h_set_log_fd, 1, 1, 0, 8, P_OWNER, VHU_PROTO_F_LOG_SHMFD)                    \
	X(SET_VRING_NUM, h_set_vring_num, 0, 0, 8, 8, P_OWNER, NO_PROTO)                           \
	X(SET_VRING_ADDR, h_set_vring_addr, 0, 0, 40, 40, P_OWNER, NO_PROTO)                       \
	X(SET_VRING_BASE, h_set_vring_base, 0, 0, 8, 8, P_OWNER, NO_PROTO)                         \
	X(GET_VRING_BASE, h_get_vring_base, 0, 0, 8, 8, P_OWNER | P_REPLY, NO_PROTO)               \
	X(SET_VRING_KICK, h_set_vring_kick, 0, 1, 8, 8, P_OWNER, NO_PROTO)                         \
	X(SET_VRING_CALL, h_set_vring_call, 0, 1, 8, 8, P_OWNER, NO_PROTO)                         \
	X(SET_VRING_ERR, h_set_vring_err, 0, 1, 8, 8, P_OWNER, NO_PROTO)                           \
	X(GET_PROTOCOL_FEATURES, h_get_protocol_features, 0, 0, 0, 0, P_REPLY, NO_PROTO)           \
	X(SET_PROTOCOL_FEATURES, h_set_protocol_features, 0, 0, 8, 8, 0, NO_PROTO)                 \
	X(GET_QUEUE_NUM, h_get_queue_num, 0, 0, 0, 0, P_REPLY, VHU_PROTO_F_MQ)                     \
	X(SET_VRING_ENABLE, h_set_vring_enable, 0, 0, 8, 8, P_OWNER, NO_PROTO)                     \
	X(GET_CONFIG, h_get_config, 0, 0, VHU_CONFIG_HDR_SIZE,                                     \
	  VHU_CONFIG_HDR_SIZE + VHU_CONFIG_MAX, P_REPLY, VHU_PROTO_F_CONFIG)                       \
	X(SET_CONFIG, h_set_config, 0, 0, VHU_CONFIG_HDR_SIZE,                                     \
	  VHU_CONFIG_HDR_SIZE + VHU_CONFIG_MAX, 0, VHU_PROTO_F_CONFIG)                             \
	X(SET_DEVICE_STATE_FD, h_set_device_state_fd, 0, VHU_MAX_FDS, 0, VHU_PAYLOAD_MAX,           \
	  P_OWNER | P_REPLY,                                                                       \
	  VHU_PROTO_F_DEVICE_STATE)                                                                \
	X(CHECK_DEVICE_STATE, h_check_device_state, 0, 0, 0, 0, P_OWNER | P_REPLY,                 \
	  VHU_PROTO_F_DEVICE_STATE)

/* Every request id we can name (for logs), handled or not. */
#define VHU_ALL_REQUESTS(N)                                                                        \
	N(GET_FEATURES) N(SET_FEATURES) N(SET_OWNER) N(RESET_OWNER) N(SET_MEM_TABLE)               \
	N(SET_LOG_BASE) N(SET_LOG_FD) N(SET_VRING_NUM) N(SET_VRING_ADDR) N(SET_VRING_BASE)         \
	N(GET_VRING_BASE) N(SET_VRING_KICK) N(SET_VRING_CALL) N(SET_VRING_ERR)                     \
	N(GET_PROTOCOL_FEATURES) N(SET_PROTOCOL_FEATURES) N(GET_QUEUE_NUM) N(SET_VRING_ENABLE)     \
	N(SEND_RARP) N(NET_SET_MTU) N(SET_BACKEND_REQ_FD) N(IOTLB_MSG) N(SET_VRING_ENDIAN)           \
	N(GET_CONFIG) N(SET_CONFIG) N(CREATE_CRYPTO_SESSION) N(CLOSE_CRYPTO_SESSION)               \
	N(POSTCOPY_ADVISE) N(POSTCOPY_LISTEN) N(POSTCOPY_END) N(GET_INFLIGHT_FD)                   \
	N(SET_INFLIGHT_FD) N(GPU_SET_SOCKET) N(RESET_DEVICE) N(VRING_KICK) N(GET_MAX_MEM_SLOTS)    \
	N(ADD_MEM_REG) N(REM_MEM_REG) N(SET_STATUS) N(GET_STATUS) N(GET_SHARED_OBJECT)             \
	N(SET_DEVICE_STATE_FD) N(CHECK_DEVICE_STATE)

#define X_DECL(name, handler, ...)                                                                 \
	static int handler(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r);
VHU_HANDLED_REQUESTS(X_DECL)
#undef X_DECL

struct vhu_policy {
	vhu_handler handler;
	uint8_t fds_min, fds_max;
	uint16_t size_min, size_max;
	uint8_t flags;
	int8_t proto; /* protocol feature bit required, NO_PROTO for none */
};

static const struct vhu_policy policies[_VHU_REQ_MAX] = {
#define X_POLICY(name, handler_, fmin, fmax, smin, smax, flags_, proto_)                           \
	[VHU_REQ_##name] = { .handler = handler_, .fds_min = fmin, .fds_max = fmax,               \
			     .size_min = smin, .size_max = smax, .flags = flags_, .proto = proto_ },
	VHU_HANDLED_REQUESTS(X_POLICY)
#undef X_POLICY
};

static const char *const request_names[_VHU_REQ_MAX] = {
#define N_NAME(name) [VHU_REQ_##name] = #name,
	VHU_ALL_REQUESTS(N_NAME)
#undef N_NAME
};

const char *vhu_request_to_string(uint32_t request)
{
	if (request < ARRAY_SIZE(request_names) && request_names[request])
		return request_names[request];
	return "UNKNOWN";
}

/* Records why the connection fails and returns err (a -errno). */
__attribute__((format(printf, 3, 4))) static int fail(struct vhu_backend *b, int err,
						      const char *fmt, ...)
{
	va_list ap;
	int n;

	n = snprintf(b->errbuf, sizeof(b->errbuf), "%s: ",
		     vhu_request_to_string(b->msg.request));
	if (n < 0 || (size_t)n >= sizeof(b->errbuf))
		n = 0;
	va_start(ap, fmt);
	vsnprintf(b->errbuf + n, sizeof(b->errbuf) - (size_t)n, fmt, ap);
	va_end(ap);
	return err;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* ---- ring state ------------------------------------------------------------------------- */

static void ring_stop(struct vhu_backend *b, unsigned q)
{
	struct vhu_ring *ring = &b->rings[q];

	if (!ring->running)
		return;
	if (b->ops && b->ops->queue_stop)
		ring->last_avail_idx = b->ops->queue_stop(b->opaque, q);
	ring->running = false;
	memset(&ring->info, 0, sizeof(ring->info));
}

/* VIRTIO_F_RING_PACKED acked: rings are virtio 1.2 §2.8 packed rings (docs/vring.md). */
static bool ring_packed(const struct vhu_backend *b)
{
	return b->features & VHU_BIT(VHU_F_RING_PACKED);
}

static void stop_all(struct vhu_backend *b)
{
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++)
		ring_stop(b, q);
}

/*
 * Translates the ring's front-end addresses through the memory table (userspace_addr, not the
 * guest-physical address: QEMU sends its own virtual addresses). Each part must lie in one
 * region and be aligned as VIRTIO 1.x 2.7 requires, in front-end and host address alike.
 */
static int ring_translate(struct vhu_backend *b, unsigned q, struct vhu_vring_info *info)
{
	struct vhu_ring *ring = &b->rings[q];
	const struct vhu_vring_addr *a = &ring->addr;
	uint64_t dsz = 16ull * ring->num, asz = 6 + 2ull * ring->num, usz = 6 + 8ull * ring->num;
	uintptr_t amask = 1;

	if (ring_packed(b)) {
		asz = usz = 4; /* the two event suppression areas, 4-byte aligned */
		amask = 3;
	}

	info->desc = guest_mem_uva_range(b->mem, a->desc_user_addr, dsz);
	info->avail = guest_mem_uva_range(b->mem, a->avail_user_addr, asz);
	info->used = guest_mem_uva_range(b->mem, a->used_user_addr, usz);
	if (!info->desc || !info->avail || !info->used)
		return fail(b, -EFAULT,
			    "queue %u (size %u): ring desc 0x%llx avail 0x%llx used 0x%llx not "
			    "inside guest memory",
			    q, ring->num, (unsigned long long)a->desc_user_addr,
			    (unsigned long long)a->avail_user_addr,
			    (unsigned long long)a->used_user_addr);
	if (((uintptr_t)info->desc & 15) || ((uintptr_t)info->avail & amask) ||
	    ((uintptr_t)info->used & 3))
		return fail(b, -EINVAL, "queue %u: ring parts misaligned in host memory", q);
	/* VHOST_VRING_F_LOG: used-ring writes are logged at log_guest_addr, which the device
	 * derives from the used ring's place in memory; the two must agree. */
	if (a->flags & VHU_VRING_F_LOG) {
		uint64_t gpa = 0;

		if (!guest_mem_hva_to_gpa(b->mem, info->used, &gpa) || gpa != a->log_guest_addr)
			return fail(b, -EINVAL,
				    "queue %u: log_guest_addr 0x%llx is not the used ring's "
				    "guest-physical address 0x%llx",
				    q, (unsigned long long)a->log_guest_addr, (unsigned long long)gpa);
	}
	return 0;
}

/* Starts or stops ring q so that "running" matches what its state allows. */
static int ring_reconcile(struct vhu_backend *b, unsigned q)
{
	struct vhu_ring *ring = &b->rings[q];
	bool should = ring->started && ring->enabled && ring->num && ring->addr_set && b->mem;
	struct vhu_vring_info info = { 0 };
	int r;

	if (ring->running && !should)
		ring_stop(b, q);
	if (ring->running || !should)
		return 0;
	r = ring_translate(b, q, &info);
	if (r < 0)
		return r;
	info.num = ring->num;
	info.last_avail_idx = ring->last_avail_idx;
	info.kick_fd = ring->kick_fd;
	info.call_fd = ring->call_fd;
	info.features = b->features;
	info.mem = b->mem;
	if (b->ops && b->ops->queue_start) {
		r = b->ops->queue_start(b->opaque, q, &info);
		if (r < 0)
			return fail(b, r, "queue %u: device refused to start: %s", q, strerror(-r));
	}
	ring->info = info;
	ring->running = true;
	return 0;
}

static int reconcile_all(struct vhu_backend *b)
{
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		int r = ring_reconcile(b, q);

		if (r < 0)
			return r;
	}
	return 0;
}

static int check_index(struct vhu_backend *b, uint64_t idx)
{
	if (idx >= VHU_NUM_QUEUES)
		return fail(b, -EINVAL, "queue index %llu (only 0 rx, 1 tx and 2 event exist)",
			    (unsigned long long)idx);
	return 0;
}

/* ---- handlers --------------------------------------------------------------------------- */

/* A u64 reply (GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM). Returns 0. */
static int reply_u64(struct vhu_reply *r, uint64_t v)
{
	r->p.u64 = v;
	r->size = 8;
	return 0;
}

/*
 * The value of a SET_*FEATURES message into *ret, which must be a subset of what we offered.
 * Returns 0 or -EINVAL (recorded; *ret untouched).
 */
static int take_offered(struct vhu_backend *b, const struct vhu_msg *m, const char *what,
			uint64_t offered, uint64_t *ret)
{
	uint64_t f = m->payload.u64;

	if (f & ~offered)
		return fail(b, -EINVAL, "%s 0x%llx include bits not offered (0x%llx)", what,
			    (unsigned long long)f, (unsigned long long)(f & ~offered));
	*ret = f;
	return 0;
}

static int h_get_features(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	return reply_u64(r, b->offered_features);
}

static int h_set_features(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	uint64_t f = 0;
	int ret = take_offered(b, m, "features", b->offered_features, &f);

	if (ret < 0)
		return ret;
	/* QEMU turns dirty logging on and off (LOG_ALL alone) while the rings run. */
	if ((f ^ b->features) == VHU_BIT(VHU_F_LOG_ALL) && b->features) {
		b->features = f;
		vring_log_set_enabled(&b->log, f & VHU_BIT(VHU_F_LOG_ALL));
		log_debug("vhost-user %s: dirty logging %s", b->cfg.name ? b->cfg.name : "-",
			  (f & VHU_BIT(VHU_F_LOG_ALL)) ? "on" : "off");
		return 0;
	}
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++)
		if (b->rings[q].started)
			return fail(b, -EBUSY, "queue %u is started", q);
	b->features = f;
	vring_log_set_enabled(&b->log, f & VHU_BIT(VHU_F_LOG_ALL));
	log_debug("vhost-user %s: features 0x%llx acked", b->cfg.name ? b->cfg.name : "-",
		  (unsigned long long)f);
	/* vhost-user.rst: with PROTOCOL_FEATURES negotiated, rings start disabled (decided by
	 * what was acked here, not by what was offered). */
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++)
		b->rings[q].enabled = !(f & VHU_BIT(VHU_F_PROTOCOL_FEATURES));
	if (b->ops && b->ops->features_set)
		b->ops->features_set(b->opaque, f);
	return 0;
}

static int h_set_owner(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	b->owner = true;
	return 0;
}

static int h_reset_owner(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	stop_all(b);
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		b->rings[q].started = false;
		b->rings[q].enabled = true;
		close_fd(&b->rings[q].kick_fd);
	}
	b->features = 0;
	b->owner = false;
	vring_log_reset(&b->log);
	close_fd(&b->log_fd);
	return 0;
}

/*
 * Logs the reason fail() recorded for a refused fd or memory table (the device only logs the
 * errno when it closes the connection) and returns err.
 */
static int warn_refusal(struct vhu_backend *b, int err)
{
	/* Rate-limited: a VMM that reconnects in a loop must not grow the log without bound. */
	log_guest(LOG_LVL_WARN, "vhost-user %s: %s", b->cfg.name ? b->cfg.name : "-", b->errbuf);
	return err;
}

static void mem_fds_close(struct vhu_backend *b)
{
	for (unsigned i = 0; i < b->mem_n; i++)
		close_fd(&b->mem_desc[i].fd);
	b->mem_n = 0;
}

static int h_set_mem_table(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_mem_table *t = &m->payload.mem;
	struct guest_mem_region_desc d[VHU_MAX_FDS];
	struct guest_mem *nm = NULL, *old;
	int ret;

	if (t->nregions == 0 || t->nregions > VHU_MAX_FDS)
		return fail(b, -EINVAL, "%u regions (1 to %u allowed)", t->nregions, VHU_MAX_FDS);
	if (m->size != 8 + 32 * t->nregions)
		return fail(b, -EPROTO, "payload %u bytes for %u regions", m->size, t->nregions);
	if (m->nfds != t->nregions)
		return fail(b, -EPROTO, "%u fds for %u regions", m->nfds, t->nregions);
	for (unsigned i = 0; i < t->nregions; i++) {
		d[i] = (struct guest_mem_region_desc){
			.guest_phys_addr = t->regions[i].guest_phys_addr,
			.memory_size = t->regions[i].memory_size,
			.userspace_addr = t->regions[i].userspace_addr,
			.mmap_offset = t->regions[i].mmap_offset,
			.fd = m->fds[i], /* borrowed; the dispatcher closes it (the map stays) */
		};
		/* guest_mem_new() checks this too; here for an error that says which and why. */
		ret = fd_check_guest_memory(d[i].fd, d[i].mmap_offset + d[i].memory_size);
		if (ret == -EINVAL || ret == -ERANGE) {
			ret = fail(b, -EINVAL, "region %u: %s", i,
				   ret == -EINVAL
					   ? "the fd is not a regular file or memfd"
					   : "the file is shorter than mmap_offset + memory_size");
			return warn_refusal(b, ret);
		}
	}
	ret = guest_mem_new(d, t->nregions, &nm);
	if (ret < 0) {
		uint64_t per_map, process;

		guest_mem_get_limits(&per_map, &process);
		if (ret == -E2BIG)
			ret = fail(b, ret, "guest memory over the per-VM cap of %llu bytes",
				   (unsigned long long)per_map);
		else if (ret == -ENOMEM)
			ret = fail(b, ret,
				   "out of memory, or the process cap on mapped guest memory "
				   "(%llu bytes, %llu in use) would be passed",
				   (unsigned long long)process,
				   (unsigned long long)guest_mem_mapped_bytes());
		else
			ret = fail(b, ret, "cannot map %u regions: %s", t->nregions,
				   strerror(-ret));
		return warn_refusal(b, ret);
	}
	if (b->log.active && b->log.size < vring_log_bytes_for(guest_mem_gpa_end(nm))) {
		guest_mem_free(nm);
		return fail(b, -EINVAL, "the dirty log (%llu bytes) does not cover the new memory",
			    (unsigned long long)b->log.size);
	}
	guest_mem_set_log(nm, &b->log);

	/* The device must drop every guest pointer before the old map goes away. */
	stop_all(b);
	if (b->mem && b->ops && b->ops->mem_table_changing)
		b->ops->mem_table_changing(b->opaque);
	old = b->mem;
	b->mem = nm;
	guest_mem_free(old);
	/* The regions' fds are kept (the map needs them no more, the state record does). */
	mem_fds_close(b);
	for (unsigned i = 0; i < t->nregions; i++) {
		b->mem_desc[i] = d[i];
		b->mem_desc[i].fd = vhu_msg_take_fd(m, i);
	}
	b->mem_n = t->nregions;
	if (b->ops && b->ops->mem_table_changed)
		b->ops->mem_table_changed(b->opaque, b->mem);
	return reconcile_all(b);
}

/*
 * The payload of SET_VRING_NUM/BASE into *ret, for a valid queue that is not started.
 * Returns 0, -EINVAL or -EBUSY (recorded).
 */
static int stopped_ring_state(struct vhu_backend *b, const struct vhu_msg *m,
			      const struct vhu_vring_state **ret)
{
	const struct vhu_vring_state *s = &m->payload.state;
	int r = check_index(b, s->index);

	if (r < 0)
		return r;
	if (b->rings[s->index].started)
		return fail(b, -EBUSY, "queue %u is started", s->index);
	*ret = s;
	return 0;
}

static int h_set_vring_num(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_vring_state *s = NULL;
	int ret = stopped_ring_state(b, m, &s);

	if (ret < 0)
		return ret;
	/* virtio 1.2 §2.7: Queue Size value is always a power of 2, at most 32768; a packed
	 * ring (§2.8) may have any size up to that. */
	if (s->num == 0 || s->num > b->cfg.queue_size_max ||
	    (!ring_packed(b) && (s->num & (s->num - 1))))
		return fail(b, -EINVAL, "queue %u size %u is not a %s in [1, %u]", s->index, s->num,
			    ring_packed(b) ? "size" : "power of 2", b->cfg.queue_size_max);
	b->rings[s->index].num = s->num;
	return 0;
}

static int h_set_vring_addr(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_vring_addr *a = &m->payload.addr;
	struct vhu_ring *ring;
	int ret = check_index(b, a->index);

	if (ret < 0)
		return ret;
	ring = &b->rings[a->index];
	if (a->flags & ~VHU_VRING_F_LOG)
		return fail(b, -EINVAL, "queue %u: unknown flags 0x%x", a->index, a->flags);
	if ((a->flags & VHU_VRING_F_LOG) && !(b->offered_features & VHU_BIT(VHU_F_LOG_ALL)))
		return fail(b, -EINVAL, "queue %u: VRING_F_LOG without LOG_ALL offered", a->index);
	if ((a->desc_user_addr & 15) || (a->avail_user_addr & (ring_packed(b) ? 3 : 1)) ||
	    (a->used_user_addr & 3))
		return fail(b, -EINVAL, "queue %u: misaligned ring addresses", a->index);
	/* Logging turned on or off for a running ring (QEMU does this at migration start and
	 * end): same addresses, so the ring keeps running; only the log address is checked. */
	if (ring->running && a->desc_user_addr == ring->addr.desc_user_addr &&
	    a->used_user_addr == ring->addr.used_user_addr &&
	    a->avail_user_addr == ring->addr.avail_user_addr) {
		struct vhu_ring saved = *ring;
		struct vhu_vring_info info;

		ring->addr = *a;
		ret = ring_translate(b, a->index, &info);
		if (ret < 0)
			ring->addr = saved.addr;
		return ret;
	}
	ring_stop(b, a->index);
	ring->addr = *a;
	ring->addr_set = true;
	if (b->mem && ring->num) {
		struct vhu_vring_info info;

		ret = ring_translate(b, a->index, &info);
		if (ret < 0) {
			ring->addr_set = false;
			return ret;
		}
	}
	return ring_reconcile(b, a->index);
}

static int h_set_vring_base(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_vring_state *s = NULL;
	int ret = stopped_ring_state(b, m, &s);

	if (ret < 0)
		return ret;
	/* Packed rings: QEMU (hw/virtio/virtio.c, virtio_queue_packed_get_last_avail_idx()) sends
	 * avail slot | wrap << 15 in the low half and the used position in the high half; ours
	 * restarts the used position at the avail one (nothing is in flight across a stop). */
	if (s->num > UINT16_MAX && !ring_packed(b))
		return fail(b, -EINVAL, "queue %u base %u is not a 16-bit index", s->index, s->num);
	b->rings[s->index].last_avail_idx = (uint16_t)s->num;
	return 0;
}

static int h_get_vring_base(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_vring_state *s = &m->payload.state;
	struct vhu_ring *ring;
	int ret = check_index(b, s->index);

	if (ret < 0)
		return ret;
	ring = &b->rings[s->index];
	/* vhost-user.rst: stops the ring; the reply is the next avail index to process. */
	ring_stop(b, s->index);
	ring->started = false;
	close_fd(&ring->kick_fd);
	r->p.state.index = s->index;
	r->p.state.num = ring->last_avail_idx;
	if (ring_packed(b)) /* the used position too, equal to avail's (see h_set_vring_base) */
		r->p.state.num |= (uint32_t)ring->last_avail_idx << 16;
	r->size = sizeof(r->p.state);
	return 0;
}

/*
 * Common part of SET_VRING_KICK/CALL/ERR: validates the u64 and claims the fd (-1 for "none"),
 * which must be an eventfd: a pipe whose writer is gone polls readable for ever (a spinning
 * thread), and a write to anything else may block the thread. what names the fd in errors.
 */
static int vring_file(struct vhu_backend *b, struct vhu_msg *m, const char *what, unsigned *ret_q,
		      int *ret_fd)
{
	uint64_t v = m->payload.u64;
	bool nofd = v & VHU_VRING_NOFD_MASK;
	int ret;

	if (v & ~(VHU_VRING_IDX_MASK | VHU_VRING_NOFD_MASK))
		return fail(b, -EINVAL, "reserved bits set in 0x%llx", (unsigned long long)v);
	ret = check_index(b, v & VHU_VRING_IDX_MASK);
	if (ret < 0)
		return ret;
	if (m->nfds != (nofd ? 0u : 1u))
		return fail(b, -EPROTO, "%u fds with the no-fd bit %s", m->nfds,
			    nofd ? "set" : "clear");
	*ret_q = v & VHU_VRING_IDX_MASK;
	if (!nofd && fd_check_eventfd(m->fds[0]) < 0) {
		ret = fail(b, -EINVAL, "queue %u: the %s fd is not an eventfd", *ret_q, what);
		return warn_refusal(b, ret);
	}
	*ret_fd = nofd ? -1 : vhu_msg_take_fd(m, 0);
	return 0;
}

static int h_set_vring_kick(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	unsigned q;
	int fd, ret = vring_file(b, m, "kick", &q, &fd);

	if (ret < 0)
		return ret;
	ring_stop(b, q);
	close_fd(&b->rings[q].kick_fd);
	b->rings[q].kick_fd = fd;
	/* vhost-user.rst: the back-end starts a ring when it receives its kick fd. */
	b->rings[q].started = true;
	return ring_reconcile(b, q);
}

static int h_set_vring_call(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	struct vhu_ring *ring;
	unsigned q;
	int old, fd, ret = vring_file(b, m, "call", &q, &fd);

	if (ret < 0)
		return ret;
	/* QEMU re-sends this (masked notifier, then irqfd) and may do so while the ring runs. */
	ring = &b->rings[q];
	old = ring->call_fd;
	ring->call_fd = fd;
	if (ring->running) {
		ring->info.call_fd = fd;
		if (b->ops && b->ops->call_fd_changed)
			b->ops->call_fd_changed(b->opaque, q, fd);
	}
	close_fd(&old);
	return 0;
}

static int h_set_vring_err(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	unsigned q;
	int fd, ret = vring_file(b, m, "error", &q, &fd);

	if (ret < 0)
		return ret;
	close_fd(&b->rings[q].err_fd);
	b->rings[q].err_fd = fd;
	return 0;
}

/*
 * SET_LOG_BASE (with LOG_SHMFD): maps the front-end's dirty bitmap. It must cover the guest
 * memory we know of; a smaller one is refused. The reply is a u64 0 (QEMU waits for it).
 */
static int h_set_log_base(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_log *l = &m->payload.log;
	uint64_t need = vring_log_bytes_for(guest_mem_gpa_end(b->mem));
	int ret;

	if (l->mmap_size < need)
		return warn_refusal(b, fail(b, -EINVAL,
					    "log of %llu bytes is too small for the guest memory "
					    "(%llu bytes needed)",
					    (unsigned long long)l->mmap_size,
					    (unsigned long long)need));
	ret = vring_log_map(&b->log, m->fds[0], l->mmap_size, l->mmap_offset);
	if (ret < 0)
		return warn_refusal(b, fail(b, ret, "cannot map a log of %llu bytes at offset %llu: %s",
					    (unsigned long long)l->mmap_size,
					    (unsigned long long)l->mmap_offset, strerror(-ret)));
	close_fd(&b->log_fd);
	b->log_fd = vhu_msg_take_fd(m, 0); /* kept for the state record */
	b->log_offset = l->mmap_offset;
	log_debug("vhost-user %s: dirty log of %llu bytes", b->cfg.name ? b->cfg.name : "-",
		  (unsigned long long)l->mmap_size);
	return reply_u64(r, 0);
}

/* SET_LOG_FD: an eventfd signalled after a used-ring publication that marked pages. */
static int h_set_log_fd(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	if (fd_check_eventfd(m->fds[0]) < 0)
		return warn_refusal(b, fail(b, -EINVAL, "the log fd is not an eventfd"));
	vring_log_set_fd(&b->log, vhu_msg_take_fd(m, 0));
	return 0;
}

static int h_get_protocol_features(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	return reply_u64(r, b->offered_proto);
}

static int h_set_protocol_features(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	return take_offered(b, m, "protocol features", b->offered_proto, &b->proto_features);
}

static int h_get_queue_num(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	return reply_u64(r, VHU_NUM_QUEUES);
}

static int h_set_vring_enable(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_vring_state *s = &m->payload.state;
	int ret = check_index(b, s->index);

	if (ret < 0)
		return ret;
	if (s->num > 1)
		return fail(b, -EINVAL, "queue %u enable value %u", s->index, s->num);
	b->rings[s->index].enabled = s->num;
	return ring_reconcile(b, s->index);
}

/* GET/SET_CONFIG: the size field must match the payload (vhost-user.rst "device config"). */
static int config_check(struct vhu_backend *b, const struct vhu_msg *m)
{
	const struct vhu_config *c = &m->payload.config;

	if (c->size > VHU_CONFIG_MAX || m->size != VHU_CONFIG_HDR_SIZE + c->size)
		return fail(b, -EPROTO, "config size %u in a %u-byte payload", c->size, m->size);
	return 0;
}

static int h_get_config(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_config *c = &m->payload.config;
	uint8_t space[VHU_VSOCK_CONFIG_SIZE];
	uint64_t cid = b->cfg.guest_cid;
	int ret = config_check(b, m);

	if (ret < 0)
		return ret;
	if ((uint64_t)c->offset + c->size > VHU_VSOCK_CONFIG_SIZE)
		return fail(b, -EINVAL, "config range [%u, +%u) outside the %u-byte vsock config",
			    c->offset, c->size, VHU_VSOCK_CONFIG_SIZE);
	/* struct virtio_vsock_config { le64 guest_cid; } */
	for (unsigned i = 0; i < sizeof(space); i++)
		space[i] = (uint8_t)(cid >> (8 * i));
	r->p.config.offset = c->offset;
	r->p.config.size = c->size;
	r->p.config.flags = c->flags;
	memcpy(r->p.config.region, space + c->offset, c->size);
	r->size = VHU_CONFIG_HDR_SIZE + c->size;
	return 0;
}

static int h_set_config(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	int ret = config_check(b, m);

	if (ret < 0)
		return ret;
	/* The vsock config space is read-only: refuse, but keep the connection. */
	return VHU_REFUSED;
}

/* ---- back-end state transfer (VHOST_USER_PROTOCOL_F_DEVICE_STATE) ------------------------ */

static bool device_state_offered(const struct vhu_backend_ops *ops)
{
	return ops && ops->state_save && ops->state_load && ops->state_check;
}

/*
 * The u64 reply of SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE for err (0 or -errno): the errno
 * in bits 0-7 (never 0 on failure), bit 8 for SET_DEVICE_STATE_FD (the device uses the
 * front-end's fd). A refusal is logged and keeps the connection: the front-end fails its
 * migration and the VM goes on.
 */
static int state_reply(struct vhu_backend *b, struct vhu_reply *r, int err, uint64_t nofd)
{
	uint64_t code = 0;

	if (err < 0) {
		code = (uint64_t)-err & VHU_STATE_REPLY_ERR_MASK;
		if (!code)
			code = 1;
		log_guest(LOG_LVL_WARN, "vhost-user %s: %s", b->cfg.name ? b->cfg.name : "-",
			  b->errbuf);
	}
	return reply_u64(r, code | nofd);
}

/*
 * SET_DEVICE_STATE_FD: only in the phase "stopped" with every ring stopped (vhost-user.rst: the
 * device's state is then complete and nothing changes it), with one pipe (or socket) end open
 * for writing (save) or reading (load). Everything wrong is an error reply, not a disconnect:
 * a migration that fails must leave the VM running.
 */
static int h_set_device_state_fd(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	const struct vhu_device_state *st = &m->payload.state_xfer;
	int fd, fl, err;
	struct stat sb;

	if (m->size != sizeof(*st) || m->nfds != 1) {
		err = fail(b, -EINVAL, "payload of %u bytes with %u fds (8 and 1 expected)", m->size,
			   m->nfds);
		goto out;
	}
	if (st->direction != VHU_STATE_DIR_SAVE && st->direction != VHU_STATE_DIR_LOAD) {
		err = fail(b, -EINVAL, "direction %u (0 save, 1 load)", st->direction);
		goto out;
	}
	if (st->phase != VHU_STATE_PHASE_STOPPED) {
		err = fail(b, -EINVAL, "phase %u (only 0, stopped, exists)", st->phase);
		goto out;
	}
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++)
		if (b->rings[q].started) {
			err = fail(b, -EBUSY, "queue %u is started (the state moves only while every "
				   "ring is stopped)", q);
			goto out;
		}
	fd = m->fds[0];
	fl = fcntl(fd, F_GETFL);
	if (fstat(fd, &sb) < 0 || fl < 0 || !(S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))) {
		err = fail(b, -EINVAL, "the state fd is not a pipe or a socket");
		goto out;
	}
	if ((fl & O_ACCMODE) != O_RDWR &&
	    (fl & O_ACCMODE) != (st->direction == VHU_STATE_DIR_SAVE ? O_WRONLY : O_RDONLY)) {
		err = fail(b, -EINVAL, "the state fd is not open for %s",
			   st->direction == VHU_STATE_DIR_SAVE ? "writing" : "reading");
		goto out;
	}
	fd = vhu_msg_take_fd(m, 0);
	err = st->direction == VHU_STATE_DIR_SAVE ? b->ops->state_save(b->opaque, fd)
						  : b->ops->state_load(b->opaque, fd);
	if (err < 0)
		err = fail(b, err, "the device refused to %s its state: %s",
			   st->direction == VHU_STATE_DIR_SAVE ? "save" : "load", strerror(-err));
out:
	return state_reply(b, r, err, VHU_STATE_REPLY_NOFD);
}

/* CHECK_DEVICE_STATE: the device says whether the last transfer succeeded (and logs why not). */
static int h_check_device_state(struct vhu_backend *b, struct vhu_msg *m, struct vhu_reply *r)
{
	int err = b->ops->state_check(b->opaque);

	if (err < 0)
		err = fail(b, err, "the state transfer failed: %s", strerror(-err));
	return state_reply(b, r, err, 0);
}

/* ---- dispatcher ------------------------------------------------------------------------- */

static int send_reply(struct vhu_backend *b, uint32_t request, const void *p, uint32_t size)
{
	int ret = vhu_msg_send(b->sock, request, VHU_REPLY_FLAGS, p, size, NULL, 0,
			       b->cfg.msg_timeout_ms);

	if (ret < 0)
		return fail(b, ret, "cannot send reply: %s", strerror(-ret));
	return 0;
}

/*
 * After a handled request, before its reply: everything but the pure questions may have changed
 * the configuration. The change hook (crash survival, docs/upgrade.md) runs before the reply,
 * so that the front-end never sees a reply to a change its keeper does not know yet.
 */
static void config_changed(struct vhu_backend *b, uint32_t request)
{
	switch (request) {
	case VHU_REQ_GET_FEATURES:
	case VHU_REQ_GET_PROTOCOL_FEATURES:
	case VHU_REQ_GET_QUEUE_NUM:
	case VHU_REQ_GET_CONFIG:
		return;
	default:
		if (b->change_hook)
			b->change_hook(b->change_arg);
	}
}

static int dispatch(struct vhu_backend *b, struct vhu_msg *m)
{
	const struct vhu_policy *p;
	struct vhu_reply reply = { 0 };
	int ret;

	if ((m->flags & VHU_FLAG_VERSION_MASK) != VHU_FLAG_VERSION ||
	    (m->flags & ~(VHU_FLAG_VERSION_MASK | VHU_FLAG_NEED_REPLY)))
		return fail(b, -EPROTO, "bad header flags 0x%x", m->flags);
	p = m->request < ARRAY_SIZE(policies) ? &policies[m->request] : NULL;
	if (!p || !p->handler)
		return fail(b, -EOPNOTSUPP, "request %u not supported", m->request);

	if (m->nfds < p->fds_min || m->nfds > p->fds_max)
		ret = fail(b, -EPROTO, "%u fds (expected %u to %u)", m->nfds, p->fds_min,
			   p->fds_max);
	else if (m->size < p->size_min || m->size > p->size_max)
		ret = fail(b, -EPROTO, "payload %u bytes (expected %u to %u)", m->size, p->size_min,
			   p->size_max);
	else if ((p->flags & P_OWNER) && !b->owner)
		ret = fail(b, -EPERM, "before SET_OWNER");
	else if (p->proto != NO_PROTO && !(b->proto_features & VHU_BIT(p->proto)))
		ret = fail(b, -EPERM, "protocol feature %d not negotiated", p->proto);
	else
		ret = p->handler(b, m, &reply);
	if (ret >= 0)
		config_changed(b, m->request);

	if (p->flags & P_REPLY) {
		if (ret < 0)
			return ret;
		return send_reply(b, m->request, &reply.p, reply.size);
	}
	/* REPLY_ACK: a request without a reply of its own gets u64 0 (success) or non-zero. */
	if ((m->flags & VHU_FLAG_NEED_REPLY) && (b->proto_features & VHU_BIT(VHU_PROTO_F_REPLY_ACK))) {
		uint64_t v = ret == 0 ? 0 : 1;
		int sret = vhu_msg_send(b->sock, m->request, VHU_REPLY_FLAGS, &v, sizeof(v), NULL, 0,
					b->cfg.msg_timeout_ms);

		if (ret >= 0 && sret < 0)
			return fail(b, sret, "cannot send reply: %s", strerror(-sret));
	}
	return ret < 0 ? ret : 0;
}

int vhu_backend_process(struct vhu_backend *b)
{
	int ret;

	struct pollfd pfd = { .fd = b->sock, .events = POLLIN };

	if (b->error)
		return b->error;
	if (b->frozen)
		return -EBUSY;
	/* Nothing at all to read (a spurious wake-up): not an error, and no waiting. Once the
	 * first byte is there, the whole message must follow within the deadline. */
	if (poll(&pfd, 1, 0) == 0)
		return 0;
	ret = vhu_msg_recv(b->sock, &b->msg, b->cfg.msg_timeout_ms);
	if (ret < 0) {
		b->msg.request = 0;
		if (ret == -ECONNRESET)
			snprintf(b->errbuf, sizeof(b->errbuf), "front-end closed the connection");
		else
			snprintf(b->errbuf, sizeof(b->errbuf), "cannot read message: %s",
				 strerror(-ret));
		b->error = ret;
		return ret;
	}
	log_debug("vhost-user %s: %s (%u) flags 0x%x size %u fds %u",
		  b->cfg.name ? b->cfg.name : "-", vhu_request_to_string(b->msg.request),
		  b->msg.request, b->msg.flags, b->msg.size, b->msg.nfds);
	ret = dispatch(b, &b->msg);
	vhu_msg_close_fds(&b->msg);
	if (ret < 0)
		b->error = ret;
	return ret;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

void vhu_backend_config_init(struct vhu_backend_config *cfg)
{
	*cfg = (struct vhu_backend_config){
		.guest_cid = 3,
		.features = VHU_BACKEND_DEFAULT_FEATURES,
		.queue_size_max = VHU_QUEUE_SIZE_MAX,
		.msg_timeout_ms = VHU_MSG_TIMEOUT_MS,
	};
}

int vhu_backend_new(int sock, const struct vhu_backend_config *cfg,
		    const struct vhu_backend_ops *ops, void *opaque, struct vhu_backend **ret)
{
	struct vhu_backend *b;
	uint32_t qmax = cfg ? cfg->queue_size_max : 0;

	if (sock < 0 || !cfg || !ret || cfg->guest_cid < 3 || cfg->guest_cid >= UINT32_MAX ||
	    (cfg->features & ~VHU_BACKEND_OPTIONAL_FEATURES) || qmax == 0 ||
	    (qmax & (qmax - 1)) || qmax > VHU_QUEUE_SIZE_MAX)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->sock = sock;
	b->cfg = *cfg;
	if (b->cfg.msg_timeout_ms <= 0)
		b->cfg.msg_timeout_ms = VHU_MSG_TIMEOUT_MS;
	b->ops = ops;
	b->opaque = opaque;
	b->offered_features = VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
			      cfg->features;
	b->offered_proto = VHU_BIT(VHU_PROTO_F_CONFIG) | VHU_BIT(VHU_PROTO_F_REPLY_ACK) |
			   (cfg->offer_mq ? VHU_BIT(VHU_PROTO_F_MQ) : 0) |
			   ((cfg->features & VHU_BIT(VHU_F_LOG_ALL)) ? VHU_BIT(VHU_PROTO_F_LOG_SHMFD)
								     : 0) |
			   (device_state_offered(ops) ? VHU_BIT(VHU_PROTO_F_DEVICE_STATE) : 0);
	vring_log_init(&b->log);
	b->log_fd = -1;
	for (unsigned i = 0; i < VHU_MAX_FDS; i++)
		b->mem_desc[i].fd = -1;
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		b->rings[q].kick_fd = b->rings[q].call_fd = b->rings[q].err_fd = -1;
		b->rings[q].enabled = true; /* nothing acked yet: see h_set_features */
	}
	for (unsigned i = 0; i < VHU_MAX_FDS; i++)
		b->msg.fds[i] = -1;
	*ret = b;
	return 0;
}

void vhu_backend_free(struct vhu_backend *b)
{
	if (!b)
		return;
	stop_all(b);
	if (b->mem && !b->restored && b->ops && b->ops->mem_table_changing)
		b->ops->mem_table_changing(b->opaque);
	guest_mem_free(b->mem);
	mem_fds_close(b);
	vring_log_reset(&b->log);
	close_fd(&b->log_fd);
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		close_fd(&b->rings[q].kick_fd);
		close_fd(&b->rings[q].call_fd);
		close_fd(&b->rings[q].err_fd);
	}
	vhu_msg_close_fds(&b->msg);
	close_fd(&b->sock);
	free(b);
}

int vhu_backend_fd(const struct vhu_backend *b)
{
	return b->sock;
}

const char *vhu_backend_error(const struct vhu_backend *b)
{
	return b->error ? b->errbuf : "";
}

uint64_t vhu_backend_features(const struct vhu_backend *b)
{
	return b->features;
}

uint64_t vhu_backend_protocol_features(const struct vhu_backend *b)
{
	return b->proto_features;
}

const struct guest_mem *vhu_backend_mem(const struct vhu_backend *b)
{
	return b->mem;
}

const struct vring_log *vhu_backend_log(const struct vhu_backend *b)
{
	return &b->log;
}

bool vhu_backend_queue_running(const struct vhu_backend *b, unsigned qidx)
{
	return qidx < VHU_NUM_QUEUES && b->rings[qidx].running;
}

/* ---- state save and restore (docs/upgrade.md, "The vhost-user back-end's part") ---------- */

/* Tags of the back-end's part: top level, a memory region (0x10) and a ring (0x11). */
enum {
	T_SCHEMA = 1, T_CID, T_OFFERED, T_OFFERED_PROTO, T_FEATURES, T_PROTO, T_FLAGS, T_SOCK,
	T_MEM, T_RINGS, T_LOG, T_LOG_CALL,
};
enum { T_REGION = 0x10, T_RING = 0x11 };
enum { R_GPA = 1, R_SIZE, R_UVA, R_OFFSET, R_FD };
enum {
	Q_INDEX = 1, Q_NUM, Q_BASE, Q_FLAGS, Q_ADDR_FLAGS, Q_DESC, Q_USED, Q_AVAIL, Q_LOG_GPA,
	Q_KICK, Q_CALL, Q_ERR,
};
enum { L_FD = 1, L_SIZE, L_OFFSET };

#define SAVE_F_OWNER 0x1u
#define RING_F_ADDR 0x1u
#define RING_F_STARTED 0x2u
#define RING_F_ENABLED 0x4u

/* The items of the back-end's part; the connection is the first fd put. */
static void write_items(const struct vhu_backend *b, struct rec_writer *w)
{
	rec_put_u32(w, T_SCHEMA, VHU_BACKEND_SAVE_VERSION);
	rec_put_u64(w, T_CID, b->cfg.guest_cid);
	rec_put_u64(w, T_OFFERED, b->offered_features);
	rec_put_u64(w, T_OFFERED_PROTO, b->offered_proto);
	rec_put_u64(w, T_FEATURES, b->features);
	rec_put_u64(w, T_PROTO, b->proto_features);
	rec_put_u32(w, T_FLAGS, b->owner ? SAVE_F_OWNER : 0);
	rec_put_fd(w, T_SOCK, b->sock);
	if (b->mem) {
		rec_begin(w, T_MEM);
		for (unsigned i = 0; i < b->mem_n; i++) {
			const struct guest_mem_region_desc *d = &b->mem_desc[i];

			rec_begin(w, T_REGION);
			rec_put_u64(w, R_GPA, d->guest_phys_addr);
			rec_put_u64(w, R_SIZE, d->memory_size);
			rec_put_u64(w, R_UVA, d->userspace_addr);
			rec_put_u64(w, R_OFFSET, d->mmap_offset);
			rec_put_fd(w, R_FD, d->fd);
			rec_end(w);
		}
		rec_end(w);
	}
	rec_begin(w, T_RINGS);
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		const struct vhu_ring *ring = &b->rings[q];

		rec_begin(w, T_RING);
		rec_put_u32(w, Q_INDEX, q);
		rec_put_u32(w, Q_NUM, ring->num);
		rec_put_u32(w, Q_BASE, ring->last_avail_idx);
		rec_put_u32(w, Q_FLAGS, (ring->addr_set ? RING_F_ADDR : 0) |
						(ring->started ? RING_F_STARTED : 0) |
						(ring->enabled ? RING_F_ENABLED : 0));
		if (ring->addr_set) {
			rec_put_u32(w, Q_ADDR_FLAGS, ring->addr.flags);
			rec_put_u64(w, Q_DESC, ring->addr.desc_user_addr);
			rec_put_u64(w, Q_USED, ring->addr.used_user_addr);
			rec_put_u64(w, Q_AVAIL, ring->addr.avail_user_addr);
			rec_put_u64(w, Q_LOG_GPA, ring->addr.log_guest_addr);
		}
		if (ring->kick_fd >= 0)
			rec_put_fd(w, Q_KICK, ring->kick_fd);
		if (ring->call_fd >= 0)
			rec_put_fd(w, Q_CALL, ring->call_fd);
		if (ring->err_fd >= 0)
			rec_put_fd(w, Q_ERR, ring->err_fd);
		rec_end(w);
	}
	rec_end(w);
	if (b->log.bits && b->log_fd >= 0) {
		rec_begin(w, T_LOG);
		rec_put_fd(w, L_FD, b->log_fd);
		rec_put_u64(w, L_SIZE, b->log.size);
		rec_put_u64(w, L_OFFSET, b->log_offset);
		rec_end(w);
	}
	if (b->log.call_fd >= 0)
		rec_put_fd(w, T_LOG_CALL, b->log.call_fd);
}

int vhu_backend_save(struct vhu_backend *b, struct rec_writer *w)
{
	if (b->error)
		return -EIO;
	/* The device gives back each ring's next avail index, which the record carries. */
	stop_all(b);
	b->frozen = true;
	write_items(b, w);
	return 0;
}

int vhu_backend_snapshot(const struct vhu_backend *b, struct rec_writer *w)
{
	if (b->error)
		return -EIO;
	write_items(b, w);
	return 0;
}

void vhu_backend_set_change_hook(struct vhu_backend *b, void (*fn)(void *arg), void *arg)
{
	b->change_hook = fn;
	b->change_arg = arg;
}

/* A close-on-exec duplicate of a record's fd into *ret: the record's fds stay the caller's. */
static int dup_fd(struct rec_doc *doc, int fd, const char *what, int *ret)
{
	int nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);

	if (nfd < 0)
		return rec_fail(doc, -errno, "vhost-user: cannot duplicate the %s fd: %s", what,
				strerror(errno));
	*ret = nfd;
	return 0;
}

/* An fd of the record that must be an eventfd (kick, call, error, log call), duplicated. */
static int restore_eventfd(struct rec_doc *doc, int fd, const char *what, unsigned q, int *ret)
{
	if (fd_check_eventfd(fd) < 0)
		return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: the %s fd is not an eventfd",
				q, what);
	return dup_fd(doc, fd, what, ret);
}

/* The connection: a connected (not listening) Unix stream socket. */
static int check_conn_sock(struct rec_doc *doc, int fd)
{
	int dom = -1, type = -1, acc = 1;
	socklen_t l1 = sizeof(dom), l2 = sizeof(type), l3 = sizeof(acc);

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l1) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l2) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l3) < 0 || dom != AF_UNIX ||
	    type != SOCK_STREAM || acc)
		return rec_fail(doc, -EBADMSG,
				"vhost-user: the connection fd is not a connected Unix stream socket");
	return 0;
}

static int restore_mem(struct vhu_backend *b, struct rec_reader *r, const struct rec_item *it)
{
	static const struct rec_field fields[] = {
		{ R_GPA, REC_U64, true, "guest_phys_addr" },
		{ R_SIZE, REC_U64, true, "memory_size" },
		{ R_UVA, REC_U64, true, "userspace_addr" },
		{ R_OFFSET, REC_U64, true, "mmap_offset" },
		{ R_FD, REC_FD, true, "fd" },
	};
	struct guest_mem_region_desc d[VHU_MAX_FDS];
	struct rec_reader list, sub;
	struct rec_item ri;
	unsigned n = 0;
	int ret;

	ret = rec_enter(r, it, "memory table", &list);
	if (ret < 0)
		return ret;
	while ((ret = rec_next(&list, &ri)) > 0) {
		struct rec_val v[ARRAY_SIZE(fields)] = { 0 };

		if (ri.tag != T_REGION)
			return rec_fail(r->doc, -EBADMSG, "vhost-user: memory table: tag %u at %zu",
					ri.tag, ri.off);
		if (n == VHU_MAX_FDS)
			return rec_fail(r->doc, -EBADMSG, "vhost-user: more than %u regions",
					VHU_MAX_FDS);
		ret = rec_enter(&list, &ri, "region", &sub);
		if (ret < 0)
			return ret;
		ret = rec_scan(&sub, fields, ARRAY_SIZE(fields), v);
		if (ret < 0)
			return ret;
		d[n] = (struct guest_mem_region_desc){ .guest_phys_addr = v[0].u,
						       .memory_size = v[1].u,
						       .userspace_addr = v[2].u,
						       .mmap_offset = v[3].u,
						       .fd = (int)v[4].u };
		if (d[n].mmap_offset + d[n].memory_size < d[n].mmap_offset ||
		    fd_check_guest_memory(d[n].fd, d[n].mmap_offset + d[n].memory_size) < 0)
			return rec_fail(r->doc, -EBADMSG,
					"vhost-user: region %u: the fd is not a regular file or memfd "
					"of mmap_offset + memory_size bytes",
					n);
		n++;
	}
	if (ret < 0)
		return ret;
	if (n == 0)
		return rec_fail(r->doc, -EBADMSG, "vhost-user: a memory table without regions");
	ret = guest_mem_new(d, n, &b->mem);
	if (ret < 0)
		return rec_fail(r->doc, ret, "vhost-user: cannot map the %u regions: %s", n,
				strerror(-ret));
	for (unsigned i = 0; i < n; i++) {
		b->mem_desc[i] = d[i];
		b->mem_desc[i].fd = -1;
	}
	b->mem_n = n;
	for (unsigned i = 0; i < n; i++) {
		ret = dup_fd(r->doc, d[i].fd, "region", &b->mem_desc[i].fd);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static int restore_log(struct vhu_backend *b, struct rec_reader *r, const struct rec_item *it)
{
	static const struct rec_field fields[] = {
		{ L_FD, REC_FD, true, "fd" },
		{ L_SIZE, REC_U64, true, "size" },
		{ L_OFFSET, REC_U64, true, "offset" },
	};
	struct rec_val v[ARRAY_SIZE(fields)] = { 0 };
	struct rec_reader sub;
	int ret = rec_enter(r, it, "dirty log", &sub);

	if (ret < 0)
		return ret;
	ret = rec_scan(&sub, fields, ARRAY_SIZE(fields), v);
	if (ret < 0)
		return ret;
	if (!(b->proto_features & VHU_BIT(VHU_PROTO_F_LOG_SHMFD)))
		return rec_fail(r->doc, -EBADMSG, "vhost-user: a dirty log without LOG_SHMFD");
	if (v[1].u < vring_log_bytes_for(guest_mem_gpa_end(b->mem)))
		return rec_fail(r->doc, -EBADMSG,
				"vhost-user: a dirty log of %llu bytes does not cover the memory",
				(unsigned long long)v[1].u);
	ret = vring_log_map(&b->log, (int)v[0].u, v[1].u, v[2].u);
	if (ret < 0)
		return rec_fail(r->doc, ret == -EINVAL ? -EBADMSG : ret,
				"vhost-user: cannot map the dirty log (%llu bytes at %llu): %s",
				(unsigned long long)v[1].u, (unsigned long long)v[2].u,
				strerror(-ret));
	b->log_offset = v[2].u;
	return dup_fd(r->doc, (int)v[0].u, "log", &b->log_fd);
}

static int restore_ring(struct vhu_backend *b, struct rec_reader *r, const struct rec_item *it,
			bool *seen)
{
	static const struct rec_field fields[] = {
		{ Q_INDEX, REC_U32, true, "index" },
		{ Q_NUM, REC_U32, true, "num" },
		{ Q_BASE, REC_U32, true, "last_avail_idx" },
		{ Q_FLAGS, REC_U32, true, "flags" },
		{ Q_ADDR_FLAGS, REC_U32, false, "address flags" },
		{ Q_DESC, REC_U64, false, "desc" },
		{ Q_USED, REC_U64, false, "used" },
		{ Q_AVAIL, REC_U64, false, "avail" },
		{ Q_LOG_GPA, REC_U64, false, "log_guest_addr" },
		{ Q_KICK, REC_FD, false, "kick fd" },
		{ Q_CALL, REC_FD, false, "call fd" },
		{ Q_ERR, REC_FD, false, "error fd" },
	};
	struct rec_val v[ARRAY_SIZE(fields)] = { 0 };
	struct rec_doc *doc = r->doc;
	struct rec_reader sub;
	struct vhu_ring *ring;
	bool packed = ring_packed(b), addr;
	uint32_t q, num, flags;
	int ret = rec_enter(r, it, "ring", &sub);

	if (ret < 0)
		return ret;
	ret = rec_scan(&sub, fields, ARRAY_SIZE(fields), v);
	if (ret < 0)
		return ret;
	q = (uint32_t)v[0].u;
	num = (uint32_t)v[1].u;
	flags = (uint32_t)v[3].u;
	if (q >= VHU_NUM_QUEUES || seen[q])
		return rec_fail(doc, -EBADMSG, "vhost-user: ring index %u out of range or twice", q);
	seen[q] = true;
	ring = &b->rings[q];
	if (num && (num > b->cfg.queue_size_max || (!packed && (num & (num - 1)))))
		return rec_fail(doc, -EBADMSG, "vhost-user: queue %u size %u is not a %s in [1, %u]",
				q, num, packed ? "size" : "power of 2", b->cfg.queue_size_max);
	if (v[2].u > UINT16_MAX)
		return rec_fail(doc, -EBADMSG, "vhost-user: queue %u base %llu is not 16 bits", q,
				(unsigned long long)v[2].u);
	if (flags & ~(RING_F_ADDR | RING_F_STARTED | RING_F_ENABLED))
		return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: unknown flags 0x%x", q, flags);
	addr = flags & RING_F_ADDR;
	for (unsigned i = 4; i <= 8; i++)
		if (v[i].present != addr)
			return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: %s %s", q,
					fields[i].name, addr ? "missing" : "without addresses");
	if (v[9].present && !(flags & RING_F_STARTED))
		return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: a kick fd on a stopped ring",
				q);
	ring->num = num;
	ring->last_avail_idx = (uint16_t)v[2].u;
	ring->started = flags & RING_F_STARTED;
	ring->enabled = flags & RING_F_ENABLED;
	if (addr) {
		struct vhu_vring_addr *a = &ring->addr;

		*a = (struct vhu_vring_addr){ .index = q,
					      .flags = (uint32_t)v[4].u,
					      .desc_user_addr = v[5].u,
					      .used_user_addr = v[6].u,
					      .avail_user_addr = v[7].u,
					      .log_guest_addr = v[8].u };
		if (a->flags & ~VHU_VRING_F_LOG)
			return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: address flags 0x%x", q,
					a->flags);
		if ((a->flags & VHU_VRING_F_LOG) &&
		    !(b->offered_features & VHU_BIT(VHU_F_LOG_ALL)))
			return rec_fail(doc, -EBADMSG,
					"vhost-user: queue %u: VRING_F_LOG without LOG_ALL offered", q);
		if ((a->desc_user_addr & 15) || (a->avail_user_addr & (packed ? 3 : 1)) ||
		    (a->used_user_addr & 3))
			return rec_fail(doc, -EBADMSG, "vhost-user: queue %u: misaligned addresses",
					q);
		ring->addr_set = true;
	}
	if (v[9].present) {
		ret = restore_eventfd(doc, (int)v[9].u, "kick", q, &ring->kick_fd);
		if (ret < 0)
			return ret;
	}
	if (v[10].present) {
		ret = restore_eventfd(doc, (int)v[10].u, "call", q, &ring->call_fd);
		if (ret < 0)
			return ret;
	}
	if (v[11].present) {
		ret = restore_eventfd(doc, (int)v[11].u, "error", q, &ring->err_fd);
		if (ret < 0)
			return ret;
	}
	/* A ring that will run at the resume: its parts must lie in the memory, as
	 * ring_reconcile() will find them (and a packed ring's slot inside the ring). */
	if (ring->started && ring->enabled && ring->num && ring->addr_set && b->mem) {
		struct vhu_vring_info info;

		b->msg.request = VHU_REQ_SET_VRING_ADDR; /* names the check in the message */
		if (ring_translate(b, q, &info) < 0)
			return rec_fail(doc, -EBADMSG, "vhost-user: %s", b->errbuf);
		if (packed && (ring->last_avail_idx & 0x7fff) >= ring->num)
			return rec_fail(doc, -EBADMSG,
					"vhost-user: queue %u: packed base 0x%x outside a ring of %u",
					q, ring->last_avail_idx, ring->num);
	}
	return 0;
}

/* Everything of the record into b (made by the caller, frozen, without ops yet). */
static int restore_into(struct vhu_backend *b, struct rec_reader *r, const struct rec_val *v)
{
	struct rec_reader list;
	struct rec_item it;
	bool seen[VHU_NUM_QUEUES] = { false };
	int ret;

	/* The VMM negotiated with the old offer; it stays the offer (GET_FEATURES may come
	 * again), and must be one this back-end could make. */
	if (v[2].u & ~b->offered_features || v[3].u & ~b->offered_proto)
		return rec_fail(r->doc, -EBADMSG,
				"vhost-user: offered features 0x%llx / protocol 0x%llx not all "
				"offered by this back-end (0x%llx / 0x%llx)",
				(unsigned long long)v[2].u, (unsigned long long)v[3].u,
				(unsigned long long)b->offered_features,
				(unsigned long long)b->offered_proto);
	if (v[4].u & ~v[2].u || v[5].u & ~v[3].u)
		return rec_fail(r->doc, -EBADMSG, "vhost-user: acked features not offered");
	if (v[6].u & ~SAVE_F_OWNER)
		return rec_fail(r->doc, -EBADMSG, "vhost-user: unknown flags 0x%llx",
				(unsigned long long)v[6].u);
	b->offered_features = v[2].u;
	b->offered_proto = v[3].u;
	b->features = v[4].u;
	b->proto_features = v[5].u;
	b->owner = v[6].u & SAVE_F_OWNER;
	vring_log_set_enabled(&b->log, b->features & VHU_BIT(VHU_F_LOG_ALL));
	if (v[8].present) {
		ret = restore_mem(b, r, &v[8].it);
		if (ret < 0)
			return ret;
	}
	if (v[10].present) {
		ret = restore_log(b, r, &v[10].it);
		if (ret < 0)
			return ret;
	}
	if (b->mem)
		guest_mem_set_log(b->mem, &b->log);
	if (v[11].present) {
		int fd = -1;

		if (!(b->proto_features & VHU_BIT(VHU_PROTO_F_LOG_SHMFD)))
			return rec_fail(r->doc, -EBADMSG, "vhost-user: a log fd without LOG_SHMFD");
		ret = restore_eventfd(r->doc, (int)v[11].u, "log", 0, &fd);
		if (ret < 0)
			return ret;
		vring_log_set_fd(&b->log, fd);
	}
	ret = rec_enter(r, &v[9].it, "rings", &list);
	if (ret < 0)
		return ret;
	while ((ret = rec_next(&list, &it)) > 0) {
		if (it.tag != T_RING)
			return rec_fail(r->doc, -EBADMSG, "vhost-user: rings: tag %u at %zu", it.tag,
					it.off);
		ret = restore_ring(b, &list, &it, seen);
		if (ret < 0)
			return ret;
	}
	return ret;
}

int vhu_backend_restore(struct rec_reader *r, const struct vhu_backend_config *cfg,
			const struct vhu_backend_ops *ops, void *opaque, struct vhu_backend **ret)
{
	static const struct rec_field fields[] = {
		{ T_SCHEMA, REC_U32, true, "schema" },
		{ T_CID, REC_U64, true, "guest CID" },
		{ T_OFFERED, REC_U64, true, "offered features" },
		{ T_OFFERED_PROTO, REC_U64, true, "offered protocol features" },
		{ T_FEATURES, REC_U64, true, "features" },
		{ T_PROTO, REC_U64, true, "protocol features" },
		{ T_FLAGS, REC_U32, true, "flags" },
		{ T_SOCK, REC_FD, true, "connection" },
		{ T_MEM, REC_LIST, false, "memory table" },
		{ T_RINGS, REC_LIST, true, "rings" },
		{ T_LOG, REC_LIST, false, "dirty log" },
		{ T_LOG_CALL, REC_FD, false, "log fd" },
	};
	struct rec_val v[ARRAY_SIZE(fields)] = { 0 };
	struct vhu_backend *b = NULL;
	int sock = -1, err;

	err = rec_scan(r, fields, ARRAY_SIZE(fields), v);
	if (err < 0)
		return err;
	if (v[0].u != VHU_BACKEND_SAVE_VERSION)
		return rec_fail(r->doc, -EPROTONOSUPPORT,
				"vhost-user: schema %llu (this back-end reads %u)",
				(unsigned long long)v[0].u, VHU_BACKEND_SAVE_VERSION);
	if (!cfg || v[1].u != cfg->guest_cid)
		return rec_fail(r->doc, -EINVAL, "vhost-user: guest CID %llu, configured %llu",
				(unsigned long long)v[1].u,
				(unsigned long long)(cfg ? cfg->guest_cid : 0));
	err = check_conn_sock(r->doc, (int)v[7].u);
	if (err < 0)
		return err;
	err = dup_fd(r->doc, (int)v[7].u, "connection", &sock);
	if (err < 0)
		return err;
	/* No callbacks until the restore succeeded: a refused record tells the device nothing. */
	err = vhu_backend_new(sock, cfg, NULL, NULL, &b);
	if (err < 0) {
		close(sock);
		return rec_fail(r->doc, err, "vhost-user: bad configuration: %s", strerror(-err));
	}
	/* What the new back-end offers depends on ops too (the state transfer's callbacks); the
	 * record's offer is checked against that. */
	if (device_state_offered(ops))
		b->offered_proto |= VHU_BIT(VHU_PROTO_F_DEVICE_STATE);
	b->frozen = b->restored = true;
	err = restore_into(b, r, v);
	if (err < 0) {
		vhu_backend_free(b);
		return err;
	}
	b->ops = ops;
	b->opaque = opaque;
	*ret = b;
	return 0;
}

int vhu_backend_resume(struct vhu_backend *b)
{
	if (b->error)
		return b->error;
	if (!b->frozen)
		return 0;
	b->frozen = false;
	if (b->restored) {
		/* What the device of a fresh back-end learnt from SET_FEATURES and SET_MEM_TABLE. */
		b->restored = false;
		if (b->features && b->ops && b->ops->features_set)
			b->ops->features_set(b->opaque, b->features);
		if (b->mem && b->ops && b->ops->mem_table_changed)
			b->ops->mem_table_changed(b->opaque, b->mem);
	}
	b->msg.request = 0;
	b->error = reconcile_all(b);
	return b->error;
}

/*
 * Crash survival (docs/upgrade.md): the back-end was restored from a snapshot taken while its
 * rings ran, so the next avail index of a running ring is unknown; what the dead process had
 * completed is in guest memory. A split ring restarts at its used index: every chain the guest
 * made available after it is processed (again). Chains the dead process popped but had not
 * completed yet are among them. That is correct here because nothing of the old session
 * survives: a TX packet read again belongs to a connection the fresh engine does not have (it
 * is answered with an RST, and the guest's socket ends anyway with the TRANSPORT_RESET or the
 * RST sent for it), and an RX buffer read again was empty for the guest (the driver only
 * looks at buffers the used ring returned), so it is simply filled now. With VIRTIO_F_IN_ORDER
 * the same holds: the used index still counts every chain completed, in order.
 *
 * A packed ring has no used index: where the device stopped can only be derived from the
 * descriptors' AVAIL/USED flags, and a popped but uncompleted slot looks exactly like one not
 * yet popped, so the boundary between "used" and "in flight" cannot be told from "available"
 * once the device wrote used entries out of order or batched them. Adoption refuses it.
 */
int vhu_backend_resume_adopted(struct vhu_backend *b)
{
	int r;

	if (b->error)
		return b->error;
	if (!b->frozen || !b->restored)
		return -EINVAL;
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		struct vhu_ring *ring = &b->rings[q];
		struct vhu_vring_info info = { 0 };
		bool should = ring->started && ring->enabled && ring->num && ring->addr_set && b->mem;

		/* A stopped ring keeps the index its GET_VRING_BASE answered (in the snapshot). */
		if (!should)
			continue;
		if (ring_packed(b)) {
			snprintf(b->errbuf, sizeof(b->errbuf), "queue %u: a running packed ring "
				 "cannot be adopted after a crash (its next avail slot is unknown)",
				 q);
			return b->error = -EOPNOTSUPP;
		}
		r = ring_translate(b, q, &info);
		if (r < 0)
			return b->error = r;
		/* struct vring_used: le16 flags, le16 idx (virtio 1.2 §2.7.8). */
		ring->last_avail_idx = le16toh(
			__atomic_load_n((const uint16_t *)info.used + 1, __ATOMIC_ACQUIRE));
	}
	r = vhu_backend_resume(b);
	if (r < 0)
		return r;
	/* One interrupt per running ring: the dead process may have completed chains and died
	 * before signalling them; a spurious interrupt is harmless, a lost one is not. */
	for (unsigned q = 0; q < VHU_NUM_QUEUES; q++) {
		uint64_t one = 1;

		if (b->rings[q].running && b->rings[q].call_fd >= 0)
			(void)!write(b->rings[q].call_fd, &one, sizeof(one));
	}
	return 0;
}
