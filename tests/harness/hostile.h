/* SPDX-License-Identifier: MIT */
/*
 * The attacker's tools for the hostile-VM integration tests (tests/integration/test-hostile.c),
 * all driving a real uvsockd through its sockets:
 *
 *  - raw vhost-user sessions: a plain Unix socket to a VM's vhost-user socket for messages
 *    written by hand (src/vhost_user/msg.h), or a front-end (src/vhost_user/frontend.h) that
 *    stops wherever the caller wants and then sends what it likes (vhu_front_request);
 *  - a raw guest (struct rawg): the front-end with both rings started and driven through
 *    src/vring/vring_drv.h directly, so that any header, any chain layout and any flood can be
 *    put on the TX ring, with RX buffers posted and recycled or never posted at all;
 *  - the daemon's counters of one VM, through uvsock-stat run in-process against the control
 *    socket (<first VM's vhost-user socket>.ctl), and a few /proc readings of the daemon.
 *
 * Every wait is bounded; failures fail the case through the harness (test.h).
 * Context: a struct rawg is used by one thread.
 */
#ifndef UVSOCK_TESTS_HOSTILE_H
#define UVSOCK_TESTS_HOSTILE_H

#include <dirent.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "hostside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "statrun.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "vhost_user/frontend.h"
#include "vhost_user/msg.h"
#include "vring/vring_drv.h"
#include "vsock/hdr.h"

/* ---- raw vhost-user sessions --------------------------------------------------------------- */

/* A plain stream socket connected to the vhost-user socket at path (asserted). */
static inline int hv_connect(const char *path)
{
	struct sockaddr_un a = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		test_fail(__FILE__, __LINE__, "connect %s: %s", path, strerror(errno));
	return fd;
}

/*
 * A front-end on path after vhu_front_init() (features, protocol features, SET_OWNER, the call
 * fds, the CID read), with mem bytes of guest memory and rings of qsize; asserted.
 */
static inline struct vhu_front *hv_front(const char *path, uint64_t mem, unsigned qsize)
{
	struct vhu_front_config cfg;
	struct vhu_front *f;

	vhu_front_config_init(&cfg);
	cfg.mem_size = mem;
	cfg.queue_size = qsize;
	cfg.timeout_ms = 5000;
	ASSERT_OK(vhu_front_connect(path, &cfg, &f));
	ASSERT_OK(vhu_front_init(f));
	return f;
}

/* True once the back-end has closed the session on fd (EOF or reset) within ms. */
static inline bool hv_dropped(int fd, int ms)
{
	return hs_wait_eof(fd, ms);
}

/* ---- a raw guest: both rings started, driven by hand ------------------------------------- */

#define RAWG_SLOTS     64            /* TX buffers */
#define RAWG_SLOT_SIZE (128u * 1024) /* room for an oversize packet */
#define RAWG_RX        256           /* RX buffers (when posted) */
#define RAWG_RX_SIZE   (VSOCK_HDR_SIZE + 4096)
#define RAWG_MEM       (16u << 20)
#define RAWG_QSIZE     256

struct rawg {
	struct vhu_front *f;
	const struct vhu_front_ring *rq, *tq;
	struct vring_drv *rx, *tx;
	uint32_t cid;
	bool post_rx; /* recycle RX buffers (else never give the device any) */
	uint8_t *slot[RAWG_SLOTS];
	uint64_t slot_gpa[RAWG_SLOTS];
	bool busy[RAWG_SLOTS];
	uint64_t rx_gpa[RAWG_RX];
	bool rx_busy[RAWG_RX];
	uint64_t tx_sent, tx_done, rx_pkts;
};

/* One element of a TX chain: len bytes of data (NULL: zeros), device-writable if write. */
struct rawg_seg {
	const void *data;
	uint32_t len;
	bool write;
};

/* Posts every free RX buffer (if post_rx) after taking what the device returned. */
static inline void rawg_rx_refill(struct rawg *g)
{
	uint32_t len;
	void *cookie;
	uint64_t one = 1;

	while (vring_drv_get_used(g->rx, &len, &cookie) == 0) {
		g->rx_busy[(uintptr_t)cookie - 1] = false;
		g->rx_pkts++;
	}
	if (!g->post_rx)
		return;
	for (unsigned i = 0; i < RAWG_RX; i++) {
		struct vring_drv_buf b = { .addr = g->rx_gpa[i],
			                   .len = RAWG_RX_SIZE,
			                   .write = true };

		if (!g->rx_busy[i] && vring_drv_add(g->rx, &b, 1, (void *)(uintptr_t)(i + 1)) >= 0)
			g->rx_busy[i] = true;
	}
	if (vring_drv_kick_prepare(g->rx))
		(void)!write(g->rq->kick_fd, &one, sizeof(one));
}

/*
 * Connects to the vhost-user socket at path and starts both rings the way QEMU does
 * (vhu_front_init + vhu_front_start), asserted. post_rx: give the device RX buffers and
 * recycle them in rawg_reap(); false: never post one (a guest that takes nothing).
 */
static inline void rawg_open(struct rawg *g, const char *path, bool post_rx)
{
	memset(g, 0, sizeof(*g));
	g->post_rx = post_rx;
	g->f = hv_front(path, RAWG_MEM, RAWG_QSIZE);
	g->cid = (uint32_t)vhu_front_guest_cid(g->f);
	for (unsigned i = 0; i < RAWG_SLOTS; i++)
		ASSERT_OK(vhu_front_alloc(g->f, RAWG_SLOT_SIZE, 64, (void **)&g->slot[i],
		                          &g->slot_gpa[i]));
	for (unsigned i = 0; i < RAWG_RX; i++)
		ASSERT_OK(vhu_front_alloc(g->f, RAWG_RX_SIZE, 64, NULL, &g->rx_gpa[i]));
	ASSERT_OK(vhu_front_start(g->f));
	g->rq = vhu_front_ring(g->f, 0);
	g->tq = vhu_front_ring(g->f, 1);
	ASSERT_OK(vring_drv_new(g->rq->num, g->rq->desc, g->rq->avail, g->rq->used,
	                        vhu_front_features(g->f), &g->rx));
	ASSERT_OK(vring_drv_new(g->tq->num, g->tq->desc, g->tq->avail, g->tq->used,
	                        vhu_front_features(g->f), &g->tx));
	rawg_rx_refill(g);
}

/* Takes back the TX buffers the device is done with and recycles RX buffers. */
static inline void rawg_reap(struct rawg *g)
{
	uint32_t len;
	void *cookie;

	while (vring_drv_get_used(g->tx, &len, &cookie) == 0) {
		g->busy[(uintptr_t)cookie - 1] = false;
		g->tx_done++;
	}
	rawg_rx_refill(g);
}

/*
 * Puts one chain on the TX ring (visible at the next rawg_kick): the n elements are laid out one
 * after the other in a free TX buffer. Returns 0, or -ENOSPC if no buffer or descriptor is free.
 */
static inline int rawg_send(struct rawg *g, const struct rawg_seg *s, unsigned n)
{
	struct vring_drv_buf b[8];
	uint32_t off = 0;
	unsigned i;

	ASSERT_LE(n, 8);
	for (i = 0; i < RAWG_SLOTS && g->busy[i]; i++)
		;
	if (i == RAWG_SLOTS)
		return -ENOSPC;
	for (unsigned k = 0; k < n; k++) {
		ASSERT_LE(off + s[k].len, RAWG_SLOT_SIZE);
		if (s[k].data)
			memcpy(g->slot[i] + off, s[k].data, s[k].len);
		else
			memset(g->slot[i] + off, 0, s[k].len);
		b[k] = (struct vring_drv_buf){ .addr = g->slot_gpa[i] + off,
			                       .len = s[k].len,
			                       .write = s[k].write };
		off += s[k].len;
	}
	if (vring_drv_add(g->tx, b, n, (void *)(uintptr_t)(i + 1)) < 0)
		return -ENOSPC;
	g->busy[i] = true;
	g->tx_sent++;
	return 0;
}

/* A header (and plen bytes of payload, NULL: zeros) in one element. */
static inline int rawg_send_pkt(struct rawg *g, const struct vsock_hdr *h, const void *payload,
                                uint32_t plen)
{
	uint8_t wire[VSOCK_HDR_SIZE];
	struct rawg_seg s[2] = { { wire, VSOCK_HDR_SIZE, false }, { payload, plen, false } };

	vsock_hdr_encode(h, wire);
	return rawg_send(g, s, plen ? 2 : 1);
}

/* Kicks the TX ring if the device asked for it. */
static inline void rawg_kick(struct rawg *g)
{
	uint64_t one = 1;

	if (vring_drv_kick_prepare(g->tx))
		(void)!write(g->tq->kick_fd, &one, sizeof(one));
}

/* Waits (bounded by ms) until every TX buffer came back or a ring broke; true if they all did. */
static inline bool rawg_wait_tx(struct rawg *g, int ms)
{
	rawg_kick(g);
	return WAIT_FOR((rawg_reap(g), g->tx_done == g->tx_sent) || vring_drv_broken(g->tx) ||
	                        vring_drv_broken(g->rx),
	                ms) &&
	       g->tx_done == g->tx_sent;
}

/* Ends the session (closes the socket: the back-end sees the VMM go). Touches no guest memory. */
static inline void rawg_close(struct rawg *g)
{
	vring_drv_free(g->rx);
	vring_drv_free(g->tx);
	vhu_front_free(g->f);
	memset(g, 0, sizeof(*g));
}

/* A header from src to dst of type STREAM with op, 256 KiB of buffer advertised. */
static inline struct vsock_hdr rawg_hdr(uint32_t src_cid, uint32_t src_port, uint32_t dst_cid,
                                        uint32_t dst_port, unsigned op)
{
	return (struct vsock_hdr){
		.src_cid = src_cid,
		.dst_cid = dst_cid,
		.src_port = src_port,
		.dst_port = dst_port,
		.type = VSOCK_TYPE_STREAM,
		.op = (uint16_t)op,
		.buf_alloc = 256 * 1024,
	};
}

/* ---- the daemon's view: counters of one VM, /proc ------------------------------------------ */

/* Waits (bounded) until the daemon's control socket <sock>.ctl answers. */
static inline void hv_wait_ctl(const char *sock)
{
	char ctl[200];
	int fd = -1;

	snprintf(ctl, sizeof(ctl), "%s.ctl", sock);
	if (!WAIT_FOR(ops_ctl_connect(ctl, &fd) >= 0, 5000))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

/* `uvsock-stat -s sock --vm cid --counters --json`, parsed: the VM's object (free the root). */
static inline const struct ops_jv *hv_vm_stats(const char *sock, uint32_t cid,
                                               struct ops_jv **ret_root)
{
	char cidarg[16];
	struct run r;
	const struct ops_jv *vms;

	snprintf(cidarg, sizeof(cidarg), "%u", cid);
	r = stat_run_version("hostile", (const char *[]){ "-s", sock, "--vm", cidarg, "--counters",
	                                                  "--json", NULL });
	if (r.rc != 0)
		test_fail(__FILE__, __LINE__, "uvsock-stat --vm %u failed (%d): %s", cid, r.rc,
		          r.err);
	ASSERT_OK(ops_json_parse(r.out, strlen(r.out), ret_root));
	run_free(&r);
	vms = ops_json_get(ops_json_get(*ret_root, "stats"), "vms");
	ASSERT_TRUE(vms && vms->child);
	return vms->child;
}

/*
 * One value of a VM's stats: "broken", "vmm_connected", a counter ("tx_pkts") or a drop reason
 * ("dropped.spoofed_cid"). Booleans read as 0/1.
 */
static inline uint64_t hv_stat(const char *sock, uint32_t cid, const char *what)
{
	struct ops_jv *root;
	const struct ops_jv *vm = hv_vm_stats(sock, cid, &root);
	const struct ops_jv *c = ops_json_get(vm, "counters");
	uint64_t v;

	if (!strcmp(what, "broken") || !strcmp(what, "vmm_connected"))
		v = ops_json_bool(vm, what, false);
	else if (!strncmp(what, "dropped.", 8))
		v = ops_json_u64(ops_json_get(c, "dropped"), what + 8, UINT64_MAX);
	else
		v = ops_json_u64(c, what, UINT64_MAX);
	ops_json_free(root);
	if (v == UINT64_MAX)
		test_fail(__FILE__, __LINE__, "VM %u has no '%s' in its stats", cid, what);
	return v;
}

/* Open fds of process pid (entries of /proc/<pid>/fd), or -1. */
static inline int hv_proc_fds(pid_t pid)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d)) != NULL)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

#endif
