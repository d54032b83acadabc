/* SPDX-License-Identifier: MIT */
/*
 * The device API of <uvsock/device.h>: a C VMM drives the device role directly. A struct
 * uvsock_dev is a struct vsock_dev (device.c) created without a vhost-user socket; the functions
 * here check their arguments, hand the work to the device thread with dev_call() (run directly
 * when called on that thread, as the vhost-user glue (vhu.c) is, or before the thread is
 * started), and call the device's entry points (dev_queue_start, dev_queue_stop, dev_reset).
 * With UVSOCK_DEV_EXTERNAL_LOOP there is no device thread: the VMM's loop thread runs the
 * device's event loop one non-blocking iteration at a time (uvsock_dev_process), and the
 * configuration calls run directly on it (api_run), each followed by a settle as on the thread.
 * Memory tables given here are owned by the device (mem_owned); rings use guest-physical
 * addresses translated through them.
 *
 * Devices made here (uvsockd's too) share one process-wide router, so that any two of them can
 * be linked as siblings (uvsock_dev_link); it is freed with the last of them. The router only
 * says which devices may be linked: a device routes to the devices linked to it, nothing else.
 */
#include "uvsock/device.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/device_internal.h"
#include "device/vhu.h"
#include "ops/stats.h"
#include "util/abisize.h"
#include "util/fdcheck.h"
#include "util/log.h"
#include "util/rec.h"
#include "util/tune.h"
#include "vhost_user/backend.h"
#include "vring/guest_mem.h"
#include "vsock/hdr.h"

#define API_FEATURES                                                                               \
	((1ull << UVSOCK_DEV_F_SEQPACKET) | (1ull << UVSOCK_DEV_F_INDIRECT_DESC) |                 \
	 (1ull << UVSOCK_DEV_F_EVENT_IDX) | (1ull << UVSOCK_DEV_F_VERSION_1) |                    \
	 (1ull << UVSOCK_DEV_F_DGRAM) | (1ull << UVSOCK_DEV_F_IN_ORDER) |                          \
	 (1ull << UVSOCK_DEV_F_RING_PACKED))

/* The API's feature bits are the vhost-user back-end's device bits (same numbers). */
_Static_assert(UVSOCK_DEV_F_SEQPACKET == VIRTIO_VSOCK_F_SEQPACKET, "seqpacket bit");
_Static_assert(UVSOCK_DEV_F_DGRAM == VIRTIO_VSOCK_F_DGRAM, "dgram bit");
_Static_assert(UVSOCK_DEV_F_INDIRECT_DESC == VRING_FEAT_INDIRECT_DESC, "indirect bit");
_Static_assert(UVSOCK_DEV_F_EVENT_IDX == VRING_FEAT_EVENT_IDX, "event idx bit");
_Static_assert(UVSOCK_DEV_F_IN_ORDER == VRING_FEAT_IN_ORDER, "in-order bit");

#define API_CONFIG_FLAGS (UVSOCK_DEV_EXTERNAL_LOOP | UVSOCK_DEV_NO_DGRAM | UVSOCK_DEV_OK_GUEST_PORT)

_Static_assert(DEV_DGRAM_MAX == 65492, "dgram_max's documented limit");

static struct vsock_dev *dev_of(struct uvsock_dev *u)
{
	return (struct vsock_dev *)(void *)u;
}

/* ---- external-loop mode: the thread that runs the device ----------------------------------- */

/* Its address tells threads apart: a device's api_owner is the mark of its loop thread. */
static _Thread_local char thread_mark;

/*
 * True if the calling thread may call into d: always in thread mode (calls are handed to the
 * device thread); in external-loop mode, any thread until the first uvsock_dev_process (the VMM
 * serialises those calls), afterwards only the thread that made it.
 */
static bool caller_ok(struct vsock_dev *d)
{
	const void *o;

	if (!d->embed.ext_loop)
		return true;
	/* acquire: pairs with the release in claim_owner (the owner is set once). */
	o = atomic_load_explicit(&d->embed.owner, memory_order_acquire);
	return !o || o == &thread_mark;
}

/* Makes the calling thread d's loop thread if it has none. Returns 0 or -EPERM (another). */
static int claim_owner(struct vsock_dev *d)
{
	const void *expected = NULL;

	/* release on success: what the set-up calls before did is visible to a thread that sees
	 * the owner (caller_ok); acquire on failure: pairs with the winner's release. */
	if (atomic_compare_exchange_strong_explicit(&d->embed.owner, &expected, &thread_mark,
						    memory_order_release, memory_order_acquire))
		return 0;
	return expected == &thread_mark ? 0 : -EPERM;
}

/*
 * Runs a configuration call: on the device thread (dev_call) in thread mode; directly in
 * external-loop mode, followed by the settle the device thread does after each call.
 * Returns fn's result, or -EPERM (external loop, not its thread).
 */
static int api_run_any(struct uvsock_dev *u, int (*fn)(struct vsock_dev *d, void *arg),
		       void *arg)
{
	struct vsock_dev *d = dev_of(u);
	int r;

	if (!d->embed.ext_loop)
		return dev_call(d, fn, arg);
	if (!caller_ok(d))
		return -EPERM;
	r = fn(d, arg);
	dev_settle(d);
	return r;
}

/* The same, refused (-EBUSY) while the device's state is saved (uvsock_dev_save). */
static int api_run(struct uvsock_dev *u, int (*fn)(struct vsock_dev *d, void *arg), void *arg)
{
	if (atomic_load_explicit(&dev_of(u)->embed.saved, memory_order_relaxed))
		return -EBUSY;
	return api_run_any(u, fn, arg);
}

/* ---- the process-wide router of API devices ---------------------------------------------- */

/*
 * Shared by every device made by uvsock_dev_new (so that any two can be linked): created by the
 * first, freed with the last (api_router_refs counts the devices). Under router_lock.
 */
static pthread_mutex_t router_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vsock_router *api_router;
static unsigned api_router_refs;

/* Takes a reference on the shared router, creating it if needed. Returns 0 or -ENOMEM. */
static int router_get(struct vsock_router **ret)
{
	int r = 0;

	pthread_mutex_lock(&router_lock);
	if (!api_router)
		r = vsock_router_new(&api_router);
	if (r == 0) {
		api_router_refs++;
		*ret = api_router;
	}
	pthread_mutex_unlock(&router_lock);
	return r;
}

/* Drops a reference; the last one frees the router (its devices are all freed by then). */
static void router_put(void)
{
	pthread_mutex_lock(&router_lock);
	if (api_router_refs && --api_router_refs == 0) {
		vsock_router_free(api_router);
		api_router = NULL;
	}
	pthread_mutex_unlock(&router_lock);
}

unsigned dev_embed_router_refs(void)
{
	unsigned n;

	pthread_mutex_lock(&router_lock);
	n = api_router ? api_router_refs : 0;
	pthread_mutex_unlock(&router_lock);
	return n;
}

/* ---- life -------------------------------------------------------------------------------- */

uint64_t uvsock_dev_features(void)
{
	uint64_t f = API_FEATURES;

	/* The event-idx, in-order and packed switches off (src/util/tune.h): not offered, for
	 * before/after figures. */
	if (!tune_get()->event_idx)
		f &= ~(1ull << UVSOCK_DEV_F_EVENT_IDX);
	if (!tune_get()->in_order)
		f &= ~(1ull << UVSOCK_DEV_F_IN_ORDER);
	if (!tune_get()->packed)
		f &= ~(1ull << UVSOCK_DEV_F_RING_PACKED);
	return f;
}

/* uvsock_dev_new, or (restore) a frozen device to restore a record into. */
static int dev_new(const struct uvsock_dev_config *ucfg, bool restore, struct vsock_dev **ret)
{
	struct vsock_router *router = NULL;
	struct uvsock_dev_config c, *cfg = &c;
	struct vsock_dev_config dc;
	struct vsock_dev *d;
	int r;

	if (!ucfg || !ret ||
	    abi_struct_in(&c, sizeof(c), ucfg, ABI_SIZE_0(struct uvsock_dev_config, flags)) < 0 ||
	    !cfg->uds_path)
		return -EINVAL;
	if (cfg->queue_size_max && !vring_size_valid(cfg->queue_size_max))
		return -EINVAL;
	if (cfg->buf_alloc && cfg->buf_alloc < 4096)
		return -EINVAL;
	if (cfg->flags & ~API_CONFIG_FLAGS || cfg->dgram_max > DEV_DGRAM_MAX)
		return -EINVAL;
	r = router_get(&router);
	if (r < 0)
		return r;
	dc = (struct vsock_dev_config){
		.guest_cid = cfg->guest_cid,
		.uds_path = cfg->uds_path,
		.buf_alloc = cfg->buf_alloc ? cfg->buf_alloc : 256u * 1024,
		.queue_size_max = cfg->queue_size_max,
		.max_conns = cfg->max_conns,
		.name = cfg->name,
		.ok_guest_port = !!(cfg->flags & UVSOCK_DEV_OK_GUEST_PORT),
		.no_dgram = !!(cfg->flags & UVSOCK_DEV_NO_DGRAM),
		.dgram_max = cfg->dgram_max,
		.restore = restore,
	};
	r = vsock_dev_new(router, &dc, &d);
	if (r < 0) {
		router_put();
		return r == -ENAMETOOLONG ? -EINVAL : r;
	}
	d->embed.ext_loop = !!(cfg->flags & UVSOCK_DEV_EXTERNAL_LOOP);
	*ret = d;
	return 0;
}

int dev_vhu_new_device_frozen(const struct uvsock_dev_config *cfg, struct uvsock_dev **ret)
{
	struct vsock_dev *d;
	int r = dev_new(cfg, true, &d);

	if (r < 0)
		return r;
	/* The socket files stay the old process's until the restored device runs. */
	vsock_dev_hand_over(d, true);
	*ret = (struct uvsock_dev *)(void *)d;
	return 0;
}

int uvsock_dev_new(const struct uvsock_dev_config *ucfg, struct uvsock_dev **ret)
{
	struct vsock_dev *d;
	int r = dev_new(ucfg, false, &d);

	if (r == 0)
		*ret = (struct uvsock_dev *)(void *)d;
	return r;
}

int uvsock_dev_link(struct uvsock_dev *a, struct uvsock_dev *b)
{
	struct vsock_dev *da = dev_of(a), *db = dev_of(b);

	/* A running device thread makes the link itself (dev_call); an external loop cannot be
	 * reached from here once it runs. */
	if (!a || !b ||
	    /* acquire: as in caller_ok */
	    atomic_load_explicit(&da->embed.owner, memory_order_acquire) ||
	    atomic_load_explicit(&db->embed.owner, memory_order_acquire))
		return -EINVAL;
	return vsock_dev_link_sibling(da, db);
}

static void *dev_thread_main(void *arg)
{
	struct vsock_dev *d = arg;
	char name[16];
	int r;

	snprintf(name, sizeof(name), "uvsock-%u", d->cid);
	pthread_setname_np(pthread_self(), name);
	r = vsock_dev_run(d);
	if (r < 0)
		log_error("%s: device event loop failed: %s", d->name, strerror(-r));
	return NULL;
}

/* Tells the device thread to run what the queues started before it need. */
static int kick_all(struct vsock_dev *d, void *arg)
{
	(void)arg;
	(void)d;
	return 0;
}

int uvsock_dev_start(struct uvsock_dev *u)
{
	struct vsock_dev *d = dev_of(u);
	int r;

	if (d->embed.ext_loop)
		return -EINVAL;
	if (d->embed.thread_started)
		return -EALREADY;
	r = pthread_create(&d->embed.thread, NULL, dev_thread_main, d);
	if (r)
		return -r;
	d->embed.thread_started = true;
	/* Wait until the thread runs its loop: afterwards every call goes through dev_call. */
	/* acquire: pairs with the release in vsock_dev_run (d->thread is set). */
	while (!atomic_load_explicit(&d->thread_running, memory_order_acquire))
		sched_yield();
	return dev_call(d, kick_all, NULL);
}

void uvsock_dev_free(struct uvsock_dev *u)
{
	struct vsock_dev *d = dev_of(u);

	if (!u)
		return;
	if (d->embed.thread_started) {
		vsock_dev_stop(d);
		pthread_join(d->embed.thread, NULL);
		d->embed.thread_started = false;
	}
	vsock_dev_free(d);
	router_put();
}

int uvsock_dev_fd(struct uvsock_dev *u)
{
	struct vsock_dev *d = dev_of(u);

	if (!u || !d->embed.ext_loop)
		return -EINVAL;
	return loop_fd(d->loop);
}

int uvsock_dev_process(struct uvsock_dev *u)
{
	struct vsock_dev *d = dev_of(u);
	int r;

	if (!u || !d->embed.ext_loop)
		return -EINVAL;
	r = claim_owner(d);
	if (r < 0)
		return r;
	r = loop_run_once(d->loop, 0);
	return r < 0 ? r : 0;
}

int uvsock_dev_timeout_ms(struct uvsock_dev *u)
{
	struct vsock_dev *d = dev_of(u);

	if (!u || !d->embed.ext_loop)
		return -1;
	/* Not the loop thread: "process now", which then tells it -EPERM. */
	if (!caller_ok(d))
		return 0;
	return loop_next_timeout_ms(d->loop);
}

/* ---- configuration: each runs on the device thread (or the external loop's) ---------------- */

static int do_set_features(struct vsock_dev *d, void *arg)
{
	d->features = *(const uint64_t *)arg;
	return 0;
}

int uvsock_dev_set_features(struct uvsock_dev *u, uint64_t features)
{
	if (features & ~API_FEATURES)
		return -EINVAL;
	return api_run(u, do_set_features, &features);
}

static int do_set_mem(struct vsock_dev *d, void *arg)
{
	struct guest_mem *m = arg;

	if (d->rxq.running || d->txq.running || d->evq.running)
		return -EBUSY;
	guest_mem_free(d->mem_owned);
	d->mem_owned = m;
	d->mem = m;
	return 0;
}

int uvsock_dev_set_mem_table(struct uvsock_dev *u, const struct uvsock_dev_mem_region *regions,
			     unsigned n)
{
	struct guest_mem_region_desc desc[GUEST_MEM_MAX_REGIONS];
	void *host[GUEST_MEM_MAX_REGIONS];
	struct guest_mem *m;
	unsigned n_host = 0;
	int r;

	if (!caller_ok(dev_of(u)))
		return -EPERM;
	if (!regions || n == 0)
		return -EINVAL;
	if (n > GUEST_MEM_MAX_REGIONS)
		return -E2BIG;
	for (unsigned i = 0; i < n; i++) {
		const struct uvsock_dev_mem_region *g = &regions[i];

		if (g->host_addr)
			n_host++;
		else if (g->fd < 0)
			return -EINVAL;
		/* For host-pointer regions the "front-end address" is the host pointer itself,
		 * which lets UVSOCK_DEV_QUEUE_HOST_ADDRS rings be checked against the table. */
		desc[i] = (struct guest_mem_region_desc){
			.guest_phys_addr = g->guest_phys_addr,
			.memory_size = g->size,
			.userspace_addr = g->host_addr ? (uint64_t)(uintptr_t)g->host_addr : 0,
			.mmap_offset = g->fd_offset,
			.fd = g->host_addr ? -1 : g->fd,
		};
		host[i] = g->host_addr;
	}
	if (n_host != 0 && n_host != n)
		return -EINVAL;
	if (n_host)
		r = guest_mem_new_local(desc, host, n, &m);
	else
		r = guest_mem_new(desc, n, &m);
	if (r < 0)
		return r;
	r = api_run(u, do_set_mem, m);
	if (r < 0)
		guest_mem_free(m);
	return r;
}

struct start_arg {
	unsigned qidx;
	const struct uvsock_dev_queue *q; /* the library's copy of the caller's */
};

static int do_queue_start(struct vsock_dev *d, void *arg)
{
	const struct start_arg *a = arg;
	const struct uvsock_dev_queue *q = a->q;
	struct vring_dev_config cfg = {
		.mem = d->mem,
		.num = q->num,
		.desc_addr = q->desc_addr,
		.avail_addr = q->avail_addr,
		.used_addr = q->used_addr,
		.features = d->features,
		.last_avail_idx = q->last_avail_idx,
	};

	if (!d->mem)
		return -EINVAL;
	if (q->num > d->queue_size_max)
		return -EINVAL;
	if (!(q->flags & UVSOCK_DEV_QUEUE_HOST_ADDRS))
		cfg.addr_kind = VRING_ADDR_GPA;
	else if (d->mem_owned)
		/* Host pointers into the API's table: checked through the regions' host range. */
		cfg.addr_kind = VRING_ADDR_UVA;
	else
		/* vhost-user: the back-end translated and checked them against its own map. */
		cfg.addr_kind = VRING_ADDR_HOST;
	return dev_queue_start(d, a->qidx, &cfg, q->kick_fd, q->call_fd);
}

int uvsock_dev_queue_start(struct uvsock_dev *u, unsigned qidx, const struct uvsock_dev_queue *uq)
{
	struct uvsock_dev_queue cq, *q = &cq;
	struct start_arg a = { .qidx = qidx, .q = q };
	int r;

	if (!uq || abi_struct_in(&cq, sizeof(cq), uq, ABI_SIZE_0(struct uvsock_dev_queue, flags)) < 0)
		return -EINVAL;
	if (qidx > UVSOCK_DEV_QUEUE_EVENT || q->kick_fd < 0 ||
	    (q->flags & ~UVSOCK_DEV_QUEUE_HOST_ADDRS) || !vring_size_valid(q->num))
		return -EINVAL;
	/* Only eventfds: a pipe at EOF as kick fd would spin the device thread, a full pipe as
	 * call fd would block it. A kick fd that is not open stays -EBADF (as epoll_ctl said). */
	r = fd_check_eventfd(q->kick_fd);
	if (r == 0 && q->call_fd >= 0)
		r = fd_check_eventfd(q->call_fd);
	if (r < 0)
		return r == -EBADF ? r : -EINVAL;
	return api_run(u, do_queue_start, &a);
}

struct stop_arg {
	unsigned qidx;
	uint16_t idx;
};

static int do_queue_stop(struct vsock_dev *d, void *arg)
{
	struct stop_arg *a = arg;

	a->idx = dev_queue_stop(d, a->qidx);
	return 0;
}

int uvsock_dev_queue_stop(struct uvsock_dev *u, unsigned qidx, uint16_t *ret_last_avail_idx)
{
	struct stop_arg a = { .qidx = qidx };
	int r;

	if (qidx > UVSOCK_DEV_QUEUE_EVENT)
		return -EINVAL;
	r = api_run(u, do_queue_stop, &a);
	if (r == 0 && ret_last_avail_idx)
		*ret_last_avail_idx = a.idx;
	return r;
}

struct call_arg {
	unsigned qidx;
	int fd;
};

static int do_set_call_fd(struct vsock_dev *d, void *arg)
{
	const struct call_arg *a = arg;

	dev_set_call_fd(d, a->qidx, a->fd);
	return 0;
}

int uvsock_dev_set_call_fd(struct uvsock_dev *u, unsigned qidx, int call_fd)
{
	struct call_arg a = { .qidx = qidx, .fd = call_fd < 0 ? -1 : call_fd };

	if (call_fd >= 0 && fd_check_eventfd(call_fd) < 0)
		return -EINVAL;

	if (qidx > UVSOCK_DEV_QUEUE_EVENT)
		return -EINVAL;
	return api_run(u, do_set_call_fd, &a);
}

static int do_transport_reset(struct vsock_dev *d, void *arg)
{
	(void)arg;
	return dev_transport_reset(d);
}

int uvsock_dev_transport_reset(struct uvsock_dev *u)
{
	return api_run(u, do_transport_reset, NULL);
}

static int do_reset(struct vsock_dev *d, void *arg)
{
	(void)arg;
	dev_reset(d);
	return 0;
}

int uvsock_dev_reset(struct uvsock_dev *u)
{
	return api_run(u, do_reset, NULL);
}

int uvsock_dev_get_stats(struct uvsock_dev *u, struct uvsock_dev_stats *uret)
{
	struct vsock_dev *d = dev_of(u);
	struct uvsock_dev_stats r, *ret = &r;
	struct vsock_dev_status st;
	struct vsock_dev_stats ds;
	struct ops_vm_counters c;

	if (!u || !uret)
		return -EINVAL;
	vsock_dev_get_status(d, &st);
	vsock_dev_get_stats(d, &ds);
	/* Connections and refusals summed over every session of the device (see struct
	 * vsock_dev_status); host_connects_refused: refused by the device (no host listener,
	 * connection limit, host connect timeout) plus refused by the engine before the device saw
	 * them (accept queue full, or no socket left under max_conns + 8): every one got an RST. */
	vsock_dev_counters_from(&c, &ds, &st.eng_total, st.listeners);
	memset(ret, 0, sizeof(*ret));
	ret->tx_pkts = OPS_CTR_GET(&c, tx_pkts);
	ret->tx_bytes = OPS_CTR_GET(&c, tx_bytes);
	ret->rx_pkts = OPS_CTR_GET(&c, rx_pkts);
	ret->rx_bytes = OPS_CTR_GET(&c, rx_bytes);
	/* Only what the device itself dropped (the engine's header drops are not counted here). */
	ret->dropped = ds.tx_bad_chain + ds.tx_bad_src_cid + ds.tx_bad_dst_cid + ds.sibling_dropped;
	ret->ring_errors = OPS_CTR_GET(&c, ring_errors);
	ret->interrupts = ds.interrupts;
	ret->conns_open = OPS_CTR_GET(&c, conns_open);
	ret->conns_total = OPS_CTR_GET(&c, conns_total);
	ret->host_connects_refused = OPS_CTR_GET(&c, host_connects_refused);
	ret->broken = st.broken;
	ret->running = st.have_engine;
	return abi_struct_out(uret, &r, sizeof(r), ABI_SIZE_0(struct uvsock_dev_stats, running));
}

/* ---- for the project's programs (vsock_dev.h): uvsockd on top of the API -------------------- */

struct vsock_dev *vsock_dev_of(struct uvsock_dev *u)
{
	return dev_of(u);
}

/* ---- state save and restore (docs/upgrade.md) -------------------------------------------- */

struct save_arg {
	int memfd;
	int *fds;
	size_t nfds;
};

static int do_save(struct vsock_dev *d, void *arg)
{
	struct save_arg *a = arg;
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;
	int r;

	if (atomic_load_explicit(&d->embed.saved, memory_order_relaxed))
		return -EALREADY;
	/* Its siblings would stay here: a group moves as one (uvsockd's upgrade, which stops
	 * every device of it first), not a device alone. */
	if (d->sib.n_sibs && !d->rxq.running && !d->txq.running && !d->evq.running)
		return -EOPNOTSUPP;
	vsock_dev_freeze(d);
	rec_writer_init(&w, REC_KIND_DEVICE, VSOCK_DEV_SAVE_VERSION);
	r = vsock_dev_save(d, &w);
	if (r == 0)
		r = rec_writer_finish(&w, &buf, &len);
	if (r == 0)
		r = rec_memfd(buf, len, "uvsock-device-state", &a->memfd);
	if (r == 0 && w.nfds) {
		a->fds = calloc(w.nfds, sizeof(int));
		if (!a->fds)
			r = -ENOMEM;
		for (uint32_t i = 0; r == 0 && i < w.nfds; i++) {
			a->fds[i] = fcntl(w.fds[i], F_DUPFD_CLOEXEC, 3);
			if (a->fds[i] < 0) {
				r = -errno;
				while (i-- > 0)
					close(a->fds[i]);
			}
		}
		if (r < 0) {
			free(a->fds);
			a->fds = NULL;
			close(a->memfd);
		}
	}
	a->nfds = w.nfds;
	rec_writer_free(&w);
	if (r < 0) {
		(void)vsock_dev_thaw(d);
		return r;
	}
	vsock_dev_hand_over(d, true);
	atomic_store_explicit(&d->embed.saved, true, memory_order_relaxed);
	log_info("%s: state saved (%zu fds)", d->name, a->nfds);
	return 0;
}

int uvsock_dev_save(struct uvsock_dev *u, int *ret_memfd, int **ret_fds, size_t *ret_nfds)
{
	struct save_arg a = { .memfd = -1 };
	int r;

	if (!u || !ret_memfd || !ret_fds || !ret_nfds)
		return -EINVAL;
	r = api_run_any(u, do_save, &a);
	if (r < 0)
		return r;
	*ret_memfd = a.memfd;
	*ret_fds = a.fds;
	*ret_nfds = a.nfds;
	return 0;
}

static int do_resume(struct vsock_dev *d, void *arg)
{
	(void)arg;
	if (!atomic_load_explicit(&d->embed.saved, memory_order_relaxed))
		return -EINVAL;
	atomic_store_explicit(&d->embed.saved, false, memory_order_relaxed);
	vsock_dev_hand_over(d, false);
	log_info("%s: resumed after a save", d->name);
	return vsock_dev_thaw(d);
}

int uvsock_dev_resume(struct uvsock_dev *u)
{
	if (!u)
		return -EINVAL;
	return api_run_any(u, do_resume, NULL);
}

int uvsock_dev_restore(const struct uvsock_dev_config *cfg, int memfd, const int *fds,
		       size_t nfds, struct uvsock_dev **ret)
{
	struct rec_doc doc;
	const uint8_t *buf;
	struct vsock_dev *d;
	size_t len;
	int r;

	if (!ret || (nfds && !fds) || memfd < 0)
		return -EINVAL;
	r = dev_new(cfg, true, &d);
	if (r < 0)
		return r;
	/* Whatever happens, the socket files are the saved device's until this one succeeds. */
	vsock_dev_hand_over(d, true);
	r = rec_map_fd(memfd, &buf, &len);
	if (r < 0) {
		log_warn("%s: state record refused: cannot map it: %s", d->name, strerror(-r));
		goto out_free;
	}
	r = rec_open(&doc, buf, len, REC_KIND_DEVICE, 1, VSOCK_DEV_SAVE_VERSION, fds, nfds);
	if (r == 0) {
		r = vsock_dev_restore(d, &doc);
		if (r == 0) {
			r = rec_check_fds_claimed(&doc);
			if (r < 0) {
				log_warn("%s: state record refused: %s", d->name, rec_error(&doc));
				rec_doc_fini(&doc);
				rec_unmap(buf, len);
				goto out_free; /* everything restored goes with the device */
			}
		}
		if (r < 0)
			log_warn("%s: state record refused: %s", d->name, rec_error(&doc));
		rec_doc_fini(&doc);
	} else {
		log_warn("%s: state record refused: %s", d->name, rec_error(&doc));
	}
	rec_unmap(buf, len);
	if (r < 0)
		goto out_free;
	vsock_dev_hand_over(d, false);
	r = vsock_dev_thaw(d);
	if (r < 0) {
		vsock_dev_hand_over(d, true);
		goto out_free;
	}
	log_info("%s: state restored", d->name);
	*ret = (struct uvsock_dev *)(void *)d;
	return 0;

out_free:
	uvsock_dev_free((struct uvsock_dev *)(void *)d);
	return r;
}
