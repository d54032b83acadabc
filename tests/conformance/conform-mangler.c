/* SPDX-License-Identifier: MIT */
/*
 * A deliberately broken back-end for uvsock-conform's own test: a vhost-user proxy between a
 * front-end and a real back-end (uvsockd) that relays every message unchanged, except that the
 * back-end writes the RX queue's used ring into a shadow ring in memory of the proxy's own (an
 * extra region added to SET_MEM_TABLE, the used address of SET_VRING_ADDR moved there, the RX
 * call eventfd replaced). The proxy copies each used element to the real ring and signals the
 * front-end, after breaking it the way one of the bugs uvsock-conform looks for would:
 *
 *   --mode shared-fwd-cnt  every RX header's fwd_cnt becomes the sum over all connections (one
 *                          fwd_cnt shared by every stream);
 *   --mode cut             an RW packet's used length is cut to half its payload while the header
 *                          still claims the whole (a packet cut to the buffer, len unchanged);
 *   --mode no-shutdown     a SHUTDOWN becomes a CREDIT_UPDATE (a back-end that never passes the
 *                          host's half-close on to the guest);
 *   --mode none            nothing changed (the proxy itself is transparent).
 *
 * EVENT_IDX, IN_ORDER and RING_PACKED are taken out of the features the back-end offers, so that
 * the rings are split ones and every used element is written and signalled. Sessions are served one after the other until
 * SIGTERM. usage: conform-mangler --listen PATH --backend PATH --mode MODE
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vhost_user/msg.h"
#include "vsock/hdr.h"

#define SHADOW_SIZE 65536u

enum mode { M_NONE, M_SHARED, M_CUT, M_NO_SHUTDOWN };

struct region {
	uint64_t gpa, size, uva;
	uint8_t *map;
	size_t maplen;
	uint8_t *base; /* map + mmap_offset */
};

struct sess {
	enum mode mode;
	struct region r[VHU_MAX_FDS];
	unsigned nr;
	int shadow_fd;
	uint8_t *shadow;
	uint64_t shadow_uva;
	unsigned num;
	uint8_t *desc, *used; /* RX queue: the front-end's descriptor table and used ring */
	int call_ours, call_real, stop;
	uint16_t seen;
	pthread_t th;
	bool running;
	struct { uint32_t a, b, fwd; } ports[4096];
	unsigned nports;
};

static uint8_t *uva_ptr(struct sess *s, uint64_t uva)
{
	for (unsigned i = 0; i < s->nr; i++)
		if (uva >= s->r[i].uva && uva - s->r[i].uva < s->r[i].size)
			return s->r[i].base + (uva - s->r[i].uva);
	return NULL;
}

static uint8_t *gpa_ptr(struct sess *s, uint64_t gpa, uint64_t len)
{
	for (unsigned i = 0; i < s->nr; i++)
		if (gpa >= s->r[i].gpa && gpa - s->r[i].gpa + len <= s->r[i].size)
			return s->r[i].base + (gpa - s->r[i].gpa);
	return NULL;
}

static uint32_t shared_fwd(struct sess *s, const struct vsock_hdr *h)
{
	uint32_t sum = 0;
	unsigned i;

	for (i = 0; i < s->nports; i++)
		if (s->ports[i].a == h->src_port && s->ports[i].b == h->dst_port)
			break;
	if (i == s->nports && s->nports < 4096)
		s->ports[s->nports++] = (typeof(s->ports[0])){ h->src_port, h->dst_port, 0 };
	if (i < s->nports)
		s->ports[i].fwd = h->fwd_cnt;
	for (i = 0; i < s->nports; i++)
		sum += s->ports[i].fwd;
	return sum;
}

static void mangle(struct sess *s, uint32_t id, uint32_t *len)
{
	uint64_t addr;
	uint8_t *hp;
	struct vsock_hdr h;

	if (id >= s->num)
		return;
	memcpy(&addr, s->desc + 16 * id, 8);
	hp = gpa_ptr(s, addr, VSOCK_HDR_SIZE);
	if (!hp || *len < VSOCK_HDR_SIZE)
		return;
	vsock_hdr_decode(hp, &h);
	if (s->mode == M_SHARED) {
		h.fwd_cnt = shared_fwd(s, &h);
		vsock_hdr_encode(&h, hp);
	} else if (s->mode == M_NO_SHUTDOWN && h.op == VSOCK_OP_SHUTDOWN) {
		h.op = VSOCK_OP_CREDIT_UPDATE;
		h.flags = 0;
		vsock_hdr_encode(&h, hp);
	} else if (s->mode == M_CUT && h.op == VSOCK_OP_RW && h.len > 1 &&
		   *len == VSOCK_HDR_SIZE + h.len) {
		*len = VSOCK_HDR_SIZE + h.len / 2;
	}
}

static void *mangler(void *arg)
{
	struct sess *s = arg;
	struct pollfd p[2] = { { .fd = s->call_ours, .events = POLLIN },
			       { .fd = s->stop, .events = POLLIN } };
	uint64_t v;

	/*
	 * The back-end skips the interrupt while the front-end has set VRING_AVAIL_F_NO_INTERRUPT in
	 * the (real) avail ring, and the front-end re-checks only the real used ring before it
	 * sleeps: so the shadow ring is also looked at every millisecond, not only when signalled.
	 */
	while (poll(p, 2, 1) >= 0 && !p[1].revents) {
		uint16_t idx;

		if (p[0].revents)
			(void)!read(s->call_ours, &v, sizeof(v));
		idx = __atomic_load_n((uint16_t *)(s->shadow + 2), __ATOMIC_ACQUIRE);
		if (idx == s->seen)
			continue;
		while (s->seen != idx) {
			uint8_t *se = s->shadow + 4 + 8 * (s->seen % s->num);
			uint8_t *re = s->used + 4 + 8 * (s->seen % s->num);
			uint32_t id, len;

			memcpy(&id, se, 4);
			memcpy(&len, se + 4, 4);
			mangle(s, id, &len);
			memcpy(re, &id, 4);
			memcpy(re + 4, &len, 4);
			s->seen++;
		}
		__atomic_store_n((uint16_t *)(s->used + 2), idx, __ATOMIC_RELEASE);
		v = 1;
		if (s->call_real >= 0)
			(void)!write(s->call_real, &v, sizeof(v));
	}
	return NULL;
}

/* Rewrites a front-end message on its way to the back-end; fds to send in fds/nfds. */
static void from_front(struct sess *s, struct vhu_msg *m, int *fds, unsigned *nfds)
{
	*nfds = m->nfds;
	memcpy(fds, m->fds, sizeof(int) * m->nfds);
	if (m->request == VHU_REQ_SET_MEM_TABLE && m->payload.mem.nregions < VHU_MAX_FDS &&
	    m->payload.mem.nregions == m->nfds) {
		uint64_t top = 0;

		s->nr = 0;
		for (unsigned i = 0; i < m->payload.mem.nregions; i++) {
			struct vhu_mem_region *g = &m->payload.mem.regions[i];
			struct region *r = &s->r[s->nr];

			r->maplen = g->memory_size + g->mmap_offset;
			r->map = mmap(NULL, r->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, m->fds[i], 0);
			if (r->map == MAP_FAILED)
				continue;
			r->gpa = g->guest_phys_addr;
			r->size = g->memory_size;
			r->uva = g->userspace_addr;
			r->base = r->map + g->mmap_offset;
			s->nr++;
			if (g->userspace_addr + g->memory_size > top)
				top = g->userspace_addr + g->memory_size;
		}
		s->shadow_uva = (top + (1ull << 30)) & ~((1ull << 30) - 1);
		m->payload.mem.regions[m->payload.mem.nregions++] = (struct vhu_mem_region){
			.guest_phys_addr = 1ull << 40, .memory_size = SHADOW_SIZE,
			.userspace_addr = s->shadow_uva };
		m->size += sizeof(struct vhu_mem_region);
		fds[(*nfds)++] = s->shadow_fd;
	} else if (m->request == VHU_REQ_SET_VRING_NUM && m->payload.state.index == 0) {
		s->num = m->payload.state.num;
	} else if (m->request == VHU_REQ_SET_VRING_ADDR && m->payload.addr.index == 0) {
		s->desc = uva_ptr(s, m->payload.addr.desc_user_addr);
		s->used = uva_ptr(s, m->payload.addr.used_user_addr);
		memset(s->shadow, 0, SHADOW_SIZE);
		s->seen = 0;
		m->payload.addr.used_user_addr = s->shadow_uva;
	} else if (m->request == VHU_REQ_SET_VRING_CALL && (m->payload.u64 & 0xff) == 0 &&
		   !(m->payload.u64 & VHU_VRING_NOFD_MASK) && m->nfds == 1) {
		if (s->call_real >= 0)
			close(s->call_real);
		s->call_real = vhu_msg_take_fd(m, 0);
		fds[0] = s->call_ours;
		if (!s->running && s->desc && s->used && s->num &&
		    pthread_create(&s->th, NULL, mangler, s) == 0)
			s->running = true;
	}
}

static void serve(int front, const char *backend, enum mode mode)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct sess *s = calloc(1, sizeof(*s));
	int back = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), stop[2];

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", backend);
	if (!s || back < 0 || connect(back, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    pipe(stop) < 0) {
		fprintf(stderr, "conform-mangler: back-end %s: %s\n", backend, strerror(errno));
		exit(1);
	}
	s->mode = mode;
	s->call_real = -1;
	s->stop = stop[0];
	s->call_ours = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->shadow_fd = memfd_create("shadow-used", MFD_CLOEXEC);
	if (s->shadow_fd < 0 || ftruncate(s->shadow_fd, SHADOW_SIZE) < 0 ||
	    (s->shadow = mmap(NULL, SHADOW_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s->shadow_fd,
			      0)) == MAP_FAILED) {
		perror("conform-mangler: shadow ring");
		exit(1);
	}
	for (;;) {
		struct pollfd p[2] = { { .fd = front, .events = POLLIN },
				       { .fd = back, .events = POLLIN } };
		struct vhu_msg m;
		int fds[VHU_MAX_FDS + 1];
		unsigned nfds;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			if (vhu_msg_recv(front, &m, 5000) < 0)
				break;
			from_front(s, &m, fds, &nfds);
			if (vhu_msg_send(back, m.request, m.flags, m.payload.raw, m.size, fds, nfds,
					 5000) < 0)
				break;
			vhu_msg_close_fds(&m);
		}
		if (p[1].revents) {
			if (vhu_msg_recv(back, &m, 5000) < 0)
				break;
			if (m.request == VHU_REQ_GET_FEATURES && m.size == 8)
				m.payload.u64 &= ~(VHU_BIT(VHU_F_EVENT_IDX) | VHU_BIT(VHU_F_IN_ORDER) |
						   VHU_BIT(VHU_F_RING_PACKED));
			if (vhu_msg_send(front, m.request, m.flags, m.payload.raw, m.size, m.fds,
					 m.nfds, 5000) < 0)
				break;
			vhu_msg_close_fds(&m);
		}
	}
	(void)!write(stop[1], "x", 1);
	if (s->running)
		pthread_join(s->th, NULL);
	for (unsigned i = 0; i < s->nr; i++)
		munmap(s->r[i].map, s->r[i].maplen);
	munmap(s->shadow, SHADOW_SIZE);
	close(s->shadow_fd);
	close(s->call_ours);
	if (s->call_real >= 0)
		close(s->call_real);
	close(stop[0]);
	close(stop[1]);
	close(back);
	close(front);
	free(s);
}

int main(int argc, char **argv)
{
	const char *listen_path = NULL, *backend = NULL, *mode_s = "none";
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	enum mode mode;
	int lfd;

	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--listen"))
			listen_path = argv[i + 1];
		else if (!strcmp(argv[i], "--backend"))
			backend = argv[i + 1];
		else if (!strcmp(argv[i], "--mode"))
			mode_s = argv[i + 1];
	}
	mode = !strcmp(mode_s, "shared-fwd-cnt") ? M_SHARED
	       : !strcmp(mode_s, "cut")          ? M_CUT
	       : !strcmp(mode_s, "no-shutdown")  ? M_NO_SHUTDOWN
						 : M_NONE;
	if (!listen_path || !backend || (mode == M_NONE && strcmp(mode_s, "none"))) {
		fprintf(stderr, "usage: conform-mangler --listen PATH --backend PATH "
				"--mode none|shared-fwd-cnt|cut|no-shutdown\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", listen_path);
	unlink(listen_path);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 4) < 0) {
		perror("conform-mangler: listen");
		return 1;
	}
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (fd >= 0)
			serve(fd, backend, mode);
	}
}
