/* SPDX-License-Identifier: MIT */
/*
 * vhost-user front-end for vsock (see frontend.h): the QEMU side of the protocol, with one
 * memfd region as guest memory and eventfds for kicks and interrupts.
 *
 * Security model: the back-end is not trusted. Every reply is checked (flags exactly
 * version|REPLY, same request id, exact size) and received fds are closed; a malformed reply
 * fails the call with -EPROTO and never touches memory outside what we allocated.
 */
#include "vhost_user/frontend.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/time.h"
#include "vhost_user/msg.h"

#define FRONT_NUM_QUEUES 3u /* capacity: rx, tx and, with cfg.num_queues 3, event */

struct vhu_front {
	int sock;
	struct vhu_front_config cfg;

	uint64_t offered_features, features;
	uint64_t offered_proto, proto_features;
	uint64_t guest_cid;

	int memfd;
	uint8_t *mem;
	uint64_t mem_used; /* bump allocator offset */

	bool rings_allocated;
	struct vhu_front_ring rings[FRONT_NUM_QUEUES];
	int err_fd[FRONT_NUM_QUEUES];
	uint16_t next_base[FRONT_NUM_QUEUES]; /* SET_VRING_BASE value for the next start */
	unsigned nq;                          /* queues handed to the back-end: 2 or 3 */

	int log_fd;        /* dirty log memfd (vhu_front_set_log_base), -1: none */
	uint8_t *log;      /* its mapping */
	uint64_t log_size; /* bytes */
	bool logging;      /* LOG_ALL acked and VRING_F_LOG set (vhu_front_set_logging) */

	struct vhu_msg reply; /* 4 KiB payload: kept off the stack */
};

void vhu_front_config_init(struct vhu_front_config *cfg)
{
	*cfg = (struct vhu_front_config){
		.mem_size = 64ull << 20,
		.gpa_base = 0,
		.features = VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_INDIRECT_DESC) |
			    VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_IN_ORDER),
		.queue_size = 128,
		.timeout_ms = VHU_MSG_TIMEOUT_MS,
	};
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

int vhu_front_new(int sock, const struct vhu_front_config *cfg, struct vhu_front **ret)
{
	const uint64_t wantable = VHU_BIT(VHU_VSOCK_F_SEQPACKET) | VHU_BIT(VHU_F_NOTIFY_ON_EMPTY) |
				  VHU_BIT(VHU_F_INDIRECT_DESC) | VHU_BIT(VHU_F_EVENT_IDX) |
				  VHU_BIT(VHU_VSOCK_F_DGRAM) | VHU_BIT(VHU_F_IN_ORDER) |
				  VHU_BIT(VHU_F_RING_PACKED);
	struct vhu_front *f;
	int r;

	if (sock < 0 || !cfg || !ret || cfg->mem_size == 0 || (cfg->mem_size & 4095) ||
	    cfg->mem_size > SIZE_MAX / 2 || cfg->gpa_base + cfg->mem_size < cfg->gpa_base ||
	    (cfg->features & ~wantable) || cfg->queue_size == 0 ||
	    (cfg->queue_size & (cfg->queue_size - 1)) || cfg->queue_size > VHU_QUEUE_SIZE_MAX ||
	    (cfg->num_queues != 0 && cfg->num_queues != 2 && cfg->num_queues != 3))
		return -EINVAL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->sock = -1;
	f->memfd = -1;
	f->log_fd = -1;
	f->mem = MAP_FAILED;
	for (unsigned q = 0; q < FRONT_NUM_QUEUES; q++) {
		f->rings[q].kick_fd = f->rings[q].call_fd = f->err_fd[q] = -1;
	}
	f->cfg = *cfg;
	f->nq = cfg->num_queues == 3 ? 3 : 2;
	if (f->cfg.timeout_ms <= 0)
		f->cfg.timeout_ms = VHU_MSG_TIMEOUT_MS;

	f->memfd = memfd_create("uvsock-guest-mem", MFD_CLOEXEC);
	if (f->memfd < 0)
		goto fail_errno;
	if (ftruncate(f->memfd, (off_t)cfg->mem_size) < 0)
		goto fail_errno;
	f->mem = mmap(NULL, cfg->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
	if (f->mem == MAP_FAILED)
		goto fail_errno;
	for (unsigned q = 0; q < f->nq; q++) {
		f->rings[q].kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		f->rings[q].call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		f->err_fd[q] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (f->rings[q].kick_fd < 0 || f->rings[q].call_fd < 0 || f->err_fd[q] < 0)
			goto fail_errno;
	}
	f->sock = sock;
	*ret = f;
	return 0;

fail_errno:
	r = -errno;
	vhu_front_free(f);
	return r;
}

void vhu_front_free(struct vhu_front *f)
{
	if (!f)
		return;
	for (unsigned q = 0; q < FRONT_NUM_QUEUES; q++) {
		close_fd(&f->rings[q].kick_fd);
		close_fd(&f->rings[q].call_fd);
		close_fd(&f->err_fd[q]);
	}
	if (f->mem != MAP_FAILED)
		munmap(f->mem, f->cfg.mem_size);
	if (f->log)
		munmap(f->log, f->log_size);
	close_fd(&f->log_fd);
	close_fd(&f->memfd);
	close_fd(&f->sock);
	free(f);
}

int vhu_front_connect(const char *path, const struct vhu_front_config *cfg,
		      struct vhu_front **ret)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int timeout = cfg && cfg->timeout_ms > 0 ? cfg->timeout_ms : VHU_MSG_TIMEOUT_MS;
	int64_t deadline = (int64_t)mono_ms() + timeout;
	int fd, r;

	if (!path || !cfg || !ret)
		return -EINVAL;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	for (;;) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		r = -errno;
		close(fd);
		if (r != -ECONNREFUSED && r != -ENOENT && r != -EAGAIN)
			return r;
		if ((int64_t)mono_ms() >= deadline)
			return -ETIMEDOUT;
		/* The back-end may not be listening yet: poll for it every 10 ms. */
		poll(NULL, 0, 10);
	}
	r = vhu_front_new(fd, cfg, ret);
	if (r < 0)
		close(fd);
	return r;
}

/* ---- request/reply ---------------------------------------------------------------------- */

static int read_reply(struct vhu_front *f, uint32_t request, void *reply, uint32_t size)
{
	struct vhu_msg *m = &f->reply;
	int r = vhu_msg_recv(f->sock, m, f->cfg.timeout_ms);

	if (r < 0)
		return r;
	/* Replies carry no fds for anything we send. */
	vhu_msg_close_fds(m);
	if (m->flags != VHU_REPLY_FLAGS || m->request != request || m->size != size)
		return -EPROTO;
	memcpy(reply, m->payload.raw, size);
	return 0;
}

static bool reply_ack(const struct vhu_front *f)
{
	return f->proto_features & VHU_BIT(VHU_PROTO_F_REPLY_ACK);
}

int vhu_front_request(struct vhu_front *f, uint32_t request, bool need_reply, const void *payload,
		      uint32_t size, const int *fds, unsigned nfds, void *reply, uint32_t reply_size)
{
	uint32_t flags = VHU_FLAG_VERSION | (need_reply ? VHU_FLAG_NEED_REPLY : 0);
	int r = vhu_msg_send(f->sock, request, flags, payload, size, fds, nfds, f->cfg.timeout_ms);

	if (r < 0 || reply_size == 0)
		return r;
	return read_reply(f, request, reply, reply_size);
}

/* A request without a reply of its own; with REPLY_ACK, ask for and check the ack. */
static int set_req(struct vhu_front *f, uint32_t request, const void *payload, uint32_t size,
		   const int *fds, unsigned nfds)
{
	uint64_t ack = 0;
	int r;

	if (!reply_ack(f))
		return vhu_front_request(f, request, false, payload, size, fds, nfds, NULL, 0);
	r = vhu_front_request(f, request, true, payload, size, fds, nfds, &ack, sizeof(ack));
	if (r < 0)
		return r;
	return ack == 0 ? 0 : -EPROTO;
}

static int get_u64(struct vhu_front *f, uint32_t request, uint64_t *ret)
{
	return vhu_front_request(f, request, false, NULL, 0, NULL, 0, ret, sizeof(*ret));
}

int vhu_front_get_features(struct vhu_front *f, uint64_t *ret)
{
	uint64_t v;
	int r = get_u64(f, VHU_REQ_GET_FEATURES, &v);

	if (r < 0)
		return r;
	f->offered_features = v;
	*ret = v;
	return 0;
}

int vhu_front_set_features(struct vhu_front *f, uint64_t features)
{
	int r = set_req(f, VHU_REQ_SET_FEATURES, &features, sizeof(features), NULL, 0);

	if (r == 0)
		f->features = features;
	return r;
}

static int vring_file(struct vhu_front *f, uint32_t request, unsigned qidx, int fd)
{
	uint64_t v = qidx;

	return set_req(f, request, &v, sizeof(v), &fd, 1);
}

int vhu_front_get_config(struct vhu_front *f, uint32_t offset, uint32_t size, void *buf)
{
	struct vhu_config c = { .offset = offset, .size = size, .flags = 0 };
	struct vhu_config rep;
	int r;

	if (size > VHU_CONFIG_MAX)
		return -EINVAL;
	r = vhu_front_request(f, VHU_REQ_GET_CONFIG, false, &c, VHU_CONFIG_HDR_SIZE + size, NULL, 0,
			      &rep, VHU_CONFIG_HDR_SIZE + size);
	if (r < 0)
		return r;
	if (rep.offset != offset || rep.size != size)
		return -EPROTO;
	memcpy(buf, rep.region, size);
	return 0;
}

int vhu_front_init(struct vhu_front *f)
{
	const uint64_t need = VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES);
	uint64_t offered, proto, qnum, cid = 0;
	uint8_t cfgspace[VHU_VSOCK_CONFIG_SIZE];
	int r;

	r = vhu_front_get_features(f, &offered);
	if (r < 0)
		return r;
	if ((offered & need) != need)
		return -EPROTONOSUPPORT;
	r = get_u64(f, VHU_REQ_GET_PROTOCOL_FEATURES, &proto);
	if (r < 0)
		return r;
	f->offered_proto = proto;
	/* vhost-user-vsock in QEMU 7.2 refuses a back-end without CONFIG. */
	if (!(proto & VHU_BIT(VHU_PROTO_F_CONFIG)))
		return -EPROTONOSUPPORT;
	proto &= VHU_BIT(VHU_PROTO_F_CONFIG) | VHU_BIT(VHU_PROTO_F_REPLY_ACK) |
		 VHU_BIT(VHU_PROTO_F_MQ) | VHU_BIT(VHU_PROTO_F_LOG_SHMFD) |
		 VHU_BIT(VHU_PROTO_F_DEVICE_STATE);
	/* Sent before REPLY_ACK is in force, as QEMU does. */
	r = vhu_front_request(f, VHU_REQ_SET_PROTOCOL_FEATURES, false, &proto, sizeof(proto), NULL,
			      0, NULL, 0);
	if (r < 0)
		return r;
	f->proto_features = proto;
	if (proto & VHU_BIT(VHU_PROTO_F_MQ)) {
		r = get_u64(f, VHU_REQ_GET_QUEUE_NUM, &qnum);
		if (r < 0)
			return r;
		if (qnum < f->nq)
			return -EPROTONOSUPPORT;
	}
	r = set_req(f, VHU_REQ_SET_OWNER, NULL, 0, NULL, 0);
	if (r < 0)
		return r;
	r = vhu_front_get_features(f, &offered);
	if (r < 0)
		return r;
	if ((offered & need) != need)
		return -EPROTONOSUPPORT;
	/* What vhu_front_start() will ack: QEMU 7.2 puts PROTOCOL_FEATURES into SET_FEATURES when
	 * it was offered (so rings start disabled and SET_VRING_ENABLE turns them on). */
	f->features = VHU_BIT(VHU_F_VERSION_1) | VHU_BIT(VHU_F_PROTOCOL_FEATURES) |
		      (f->cfg.features & offered);
	/* Packed rings start at slot 0 with the wrap counters at 1 (virtio 1.2 §2.8.1): the
	 * vhost-user base says so in bit 15. The ring memory layout of the split ring holds one.
	 * Rings placed already keep the indices of their last stop (vhu_front_move). */
	if ((f->features & VHU_BIT(VHU_F_RING_PACKED)) && !f->rings_allocated)
		for (unsigned q = 0; q < FRONT_NUM_QUEUES; q++)
			f->next_base[q] = 1u << 15;
	for (unsigned q = 0; q < f->nq; q++) {
		r = vring_file(f, VHU_REQ_SET_VRING_CALL, q, f->rings[q].call_fd);
		if (r < 0)
			return r;
		r = vring_file(f, VHU_REQ_SET_VRING_ERR, q, f->err_fd[q]);
		if (r < 0)
			return r;
	}
	r = vhu_front_get_config(f, 0, sizeof(cfgspace), cfgspace);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < sizeof(cfgspace); i++)
		cid |= (uint64_t)cfgspace[i] << (8 * i);
	/* Linux checks the same: 0, 1, 2 and U32_MAX are reserved, the CID is 32-bit. */
	if (cid < 3 || cid >= UINT32_MAX)
		return -EINVAL;
	f->guest_cid = cid;
	return 0;
}

int vhu_front_set_mem_table(struct vhu_front *f)
{
	struct vhu_mem_table t = { .nregions = 1 };

	t.regions[0] = (struct vhu_mem_region){
		.guest_phys_addr = f->cfg.gpa_base,
		.memory_size = f->cfg.mem_size,
		.userspace_addr = (uintptr_t)f->mem,
		.mmap_offset = 0,
	};
	return set_req(f, VHU_REQ_SET_MEM_TABLE, &t, 8 + 32, &f->memfd, 1);
}

int vhu_front_alloc(struct vhu_front *f, size_t size, size_t align, void **ret_ptr,
		    uint64_t *ret_gpa)
{
	uint64_t off;

	if (align == 0)
		align = 8;
	if (size == 0 || (align & (align - 1)) || align > 4096)
		return -EINVAL;
	off = (f->mem_used + align - 1) & ~(uint64_t)(align - 1);
	if (off > f->cfg.mem_size || size > f->cfg.mem_size - off)
		return -ENOMEM;
	f->mem_used = off + size;
	if (ret_ptr)
		*ret_ptr = f->mem + off;
	if (ret_gpa)
		*ret_gpa = f->cfg.gpa_base + off;
	return 0;
}

static int alloc_rings(struct vhu_front *f)
{
	unsigned n = f->cfg.queue_size;

	if (f->rings_allocated)
		return 0;
	for (unsigned q = 0; q < f->nq; q++) {
		struct vhu_front_ring *ring = &f->rings[q];
		int r;

		ring->num = n;
		/* VIRTIO 1.x 2.7 alignment: desc 16, avail 2, used 4; 64 keeps parts apart in
		 * cache lines. The event-idx trailers are included in the sizes. */
		r = vhu_front_alloc(f, 16 * (size_t)n, 64, &ring->desc, &ring->desc_gpa);
		if (r == 0)
			r = vhu_front_alloc(f, 6 + 2 * (size_t)n, 64, &ring->avail, &ring->avail_gpa);
		if (r == 0)
			r = vhu_front_alloc(f, 6 + 8 * (size_t)n, 64, &ring->used, &ring->used_gpa);
		if (r < 0)
			return r;
	}
	f->rings_allocated = true;
	return 0;
}

static uint64_t uva_of(const struct vhu_front *f, uint64_t gpa)
{
	return (uintptr_t)f->mem + (gpa - f->cfg.gpa_base);
}

/* SET_VRING_ADDR of ring qidx, with VHOST_VRING_F_LOG (log_guest_addr: the used ring) if log. */
static int set_addr(struct vhu_front *f, unsigned qidx, bool log)
{
	const struct vhu_front_ring *ring = &f->rings[qidx];
	struct vhu_vring_addr a = { .index = qidx };

	/* QEMU user virtual addresses, i.e. addresses in our own mapping; wire order desc, used,
	 * avail. */
	a.desc_user_addr = uva_of(f, ring->desc_gpa);
	a.used_user_addr = uva_of(f, ring->used_gpa);
	a.avail_user_addr = uva_of(f, ring->avail_gpa);
	if (log) {
		a.flags = VHU_VRING_F_LOG;
		a.log_guest_addr = ring->used_gpa;
	}
	return set_req(f, VHU_REQ_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
}

int vhu_front_setup_ring(struct vhu_front *f, unsigned qidx, uint16_t base)
{
	struct vhu_vring_state st = { .index = qidx };
	struct vhu_front_ring *ring;
	int r;

	if (qidx >= f->nq)
		return -EINVAL;
	r = alloc_rings(f);
	if (r < 0)
		return r;
	ring = &f->rings[qidx];
	st.num = ring->num;
	r = set_req(f, VHU_REQ_SET_VRING_NUM, &st, sizeof(st), NULL, 0);
	if (r < 0)
		return r;
	st.num = base;
	r = set_req(f, VHU_REQ_SET_VRING_BASE, &st, sizeof(st), NULL, 0);
	if (r < 0)
		return r;
	r = set_addr(f, qidx, f->logging);
	if (r < 0)
		return r;
	r = vring_file(f, VHU_REQ_SET_VRING_KICK, qidx, ring->kick_fd);
	if (r < 0)
		return r;
	return vring_file(f, VHU_REQ_SET_VRING_CALL, qidx, ring->call_fd);
}

int vhu_front_enable_ring(struct vhu_front *f, unsigned qidx, bool enable)
{
	struct vhu_vring_state st = { .index = qidx, .num = enable };

	return set_req(f, VHU_REQ_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0);
}

int vhu_front_get_vring_base(struct vhu_front *f, unsigned qidx, uint16_t *ret)
{
	struct vhu_vring_state st = { .index = qidx }, rep;
	int r = vhu_front_request(f, VHU_REQ_GET_VRING_BASE, false, &st, sizeof(st), NULL, 0, &rep,
				  sizeof(rep));

	if (r < 0)
		return r;
	/* A packed ring's base may carry the used position in the high half (QEMU's encoding). */
	if (rep.index != qidx ||
	    (rep.num > UINT16_MAX && !(f->features & VHU_BIT(VHU_F_RING_PACKED))))
		return -EPROTO;
	*ret = (uint16_t)rep.num;
	return 0;
}

int vhu_front_start(struct vhu_front *f)
{
	uint64_t acked = f->features;
	int r;

	if (!(acked & VHU_BIT(VHU_F_VERSION_1)))
		return -EINVAL; /* vhu_front_init() did not succeed */
	r = vhu_front_set_features(f, acked);
	if (r < 0)
		return r;
	r = vhu_front_set_mem_table(f);
	if (r < 0)
		return r;
	for (unsigned q = 0; q < f->nq; q++) {
		r = vhu_front_setup_ring(f, q, f->next_base[q]);
		if (r < 0)
			return r;
	}
	if (acked & VHU_BIT(VHU_F_PROTOCOL_FEATURES))
		for (unsigned q = 0; q < f->nq; q++) {
			r = vhu_front_enable_ring(f, q, true);
			if (r < 0)
				return r;
		}
	return 0;
}

int vhu_front_stop(struct vhu_front *f, uint16_t *ret_bases)
{
	uint16_t bases[FRONT_NUM_QUEUES];
	int r;

	if (f->features & VHU_BIT(VHU_F_PROTOCOL_FEATURES))
		for (unsigned q = 0; q < f->nq; q++) {
			r = vhu_front_enable_ring(f, q, false);
			if (r < 0)
				return r;
		}
	for (unsigned q = 0; q < f->nq; q++) {
		r = vhu_front_get_vring_base(f, q, &bases[q]);
		if (r < 0)
			return r;
	}
	for (unsigned q = 0; q < f->nq; q++) {
		f->next_base[q] = bases[q];
		if (ret_bases)
			ret_bases[q] = bases[q];
	}
	return 0;
}

/* ---- device state ----------------------------------------------------------------------- */

int vhu_front_set_device_state_fd(struct vhu_front *f, uint32_t direction, uint32_t phase, int fd,
				  uint64_t *ret_reply)
{
	struct vhu_device_state st = { .direction = direction, .phase = phase };

	return vhu_front_request(f, VHU_REQ_SET_DEVICE_STATE_FD, false, &st, sizeof(st), &fd, 1,
				 ret_reply, sizeof(*ret_reply));
}

int vhu_front_check_device_state(struct vhu_front *f, uint64_t *ret_result)
{
	return get_u64(f, VHU_REQ_CHECK_DEVICE_STATE, ret_result);
}

void vhu_front_move(struct vhu_front *f, int sock)
{
	close_fd(&f->sock);
	f->sock = sock;
}

/* ---- accessors -------------------------------------------------------------------------- */

uint64_t vhu_front_log_size_needed(const struct vhu_front *f)
{
	/* QEMU's hw/virtio/vhost.c sizing: 64 pages per u64 of the bitmap. */
	uint64_t end = f->cfg.gpa_base + f->cfg.mem_size, chunk = 64ull * 4096;

	return ((end - 1) / chunk + 1) * 8;
}

int vhu_front_set_log_base(struct vhu_front *f, uint64_t size)
{
	struct vhu_log l = { .mmap_offset = 0 };
	uint64_t rep = 1;
	uint8_t *map;
	int fd, r;

	if (!(f->proto_features & VHU_BIT(VHU_PROTO_F_LOG_SHMFD)))
		return -EPROTONOSUPPORT;
	if (size == 0)
		size = vhu_front_log_size_needed(f);
	if (size > SIZE_MAX)
		return -EINVAL;
	fd = memfd_create("uvsock-dirty-log", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0)
		goto fail_errno;
	map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		goto fail_errno;
	l.mmap_size = size;
	/* QEMU waits for a reply (any u64) to SET_LOG_BASE when LOG_SHMFD is negotiated. */
	r = vhu_front_request(f, VHU_REQ_SET_LOG_BASE, false, &l, sizeof(l), &fd, 1, &rep,
			      sizeof(rep));
	if (r < 0) {
		munmap(map, (size_t)size);
		close(fd);
		return r;
	}
	if (f->log)
		munmap(f->log, f->log_size);
	close_fd(&f->log_fd);
	f->log_fd = fd;
	f->log = map;
	f->log_size = size;
	return 0;

fail_errno:
	r = -errno;
	close(fd);
	return r;
}

int vhu_front_set_logging(struct vhu_front *f, bool on)
{
	uint64_t feats = on ? f->features | VHU_BIT(VHU_F_LOG_ALL)
			    : f->features & ~VHU_BIT(VHU_F_LOG_ALL);
	int r;

	if (on && !(f->offered_features & VHU_BIT(VHU_F_LOG_ALL)))
		return -EPROTONOSUPPORT;
	/* QEMU's order (hw/virtio/vhost.c, vhost_dev_set_log): features, then each ring. */
	r = vhu_front_set_features(f, feats);
	if (r < 0)
		return r;
	f->logging = on;
	if (!f->rings_allocated)
		return 0;
	for (unsigned q = 0; q < f->nq; q++) {
		r = set_addr(f, q, on);
		if (r < 0)
			return r;
	}
	return 0;
}

const uint8_t *vhu_front_log(const struct vhu_front *f, uint64_t *ret_size)
{
	if (ret_size)
		*ret_size = f->log_size;
	return f->log;
}

int vhu_front_fd(const struct vhu_front *f)
{
	return f->sock;
}

uint64_t vhu_front_guest_cid(const struct vhu_front *f)
{
	return f->guest_cid;
}

uint64_t vhu_front_features(const struct vhu_front *f)
{
	return f->features;
}

uint64_t vhu_front_protocol_features(const struct vhu_front *f)
{
	return f->proto_features;
}

const struct vhu_front_ring *vhu_front_ring(const struct vhu_front *f, unsigned qidx)
{
	if (qidx >= f->nq || !f->rings_allocated)
		return NULL;
	return &f->rings[qidx];
}

void *vhu_front_mem(const struct vhu_front *f)
{
	return f->mem;
}

uint64_t vhu_front_mem_size(const struct vhu_front *f)
{
	return f->cfg.mem_size;
}

int vhu_front_memfd(const struct vhu_front *f)
{
	return f->memfd;
}

uint64_t vhu_front_gpa(const struct vhu_front *f, const void *ptr)
{
	uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)f->mem;

	if (p < base || p - base >= f->cfg.mem_size)
		return UINT64_MAX;
	return f->cfg.gpa_base + (p - base);
}

void *vhu_front_hva(const struct vhu_front *f, uint64_t gpa, uint64_t len)
{
	uint64_t off = gpa - f->cfg.gpa_base;

	if (gpa < f->cfg.gpa_base || off > f->cfg.mem_size || len > f->cfg.mem_size - off)
		return NULL;
	return f->mem + off;
}
