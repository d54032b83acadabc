/* SPDX-License-Identifier: MIT */
/*
 * Two VMs linked as siblings moved to new devices in this process the way uvsockd's upgrade
 * moves them (daemon/upgrade.c, docs/upgrade.md "The sibling part"): the old VMs run with this
 * project's front-end and guest driver in each; VM 3 is stopped first (dev_vhu_stop), and guest
 * 4 then sends it datagrams and 900 one-byte SEQPACKET messages on 3 connections, which wait in VM 3's inbox (512 of
 * them: it is full) and in VM 4's hold for VM 3 (the rest: the TX ring waits). Then VM 4 is
 * stopped, both devices are written (dev_vhu_save_device), each record is read back by the new
 * process's reader (upgrade_vm_rec_read) into new frozen devices, linked again, and the new VMs
 * go. Guest 3 then reads every byte once and in order, and every datagram, with no RST and no
 * drop. The inbox and the hold are deterministic here (the integration test `upgrade` catches
 * them only now and then).
 *
 * A second case moves the REQUEST budget (sibling.c, "REQUESTs a sibling does not accept"):
 * guest 4's connect waits for its budget towards VM 3 when both are stopped; the REQUEST and
 * the debt travel in VM 4's record, and the connect completes in the new devices.
 *
 * With --write-seeds DIR it also writes the records as inputs of fuzz/fuzz-vmrec.c.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uvsock/device.h>

#include "device/device_internal.h"
#include "device/vhu.h"
#include "device/vsock_dev.h"
#include "guestside.h"
#include "test.h"
#include "upgrade.h"
#include "util/rec.h"

#define NCONN 3u
#define NMSG 300u /* per connection: more than one connection's credit lets go at once */
#define NDGRAMS 5u

static const char *seed_dir;

struct vm {
	struct uvsockd_vm_config cfg;
	struct uvsock_dev *dev;
	struct vsock_dev *core;
	struct dev_vhu *vhu;
	pthread_t th;
	bool running;
};

static void cfg_init(struct uvsockd_vm_config *c, const char *dir, uint32_t cid)
{
	memset(c, 0, sizeof(*c));
	c->guest_cid = cid;
	snprintf(c->name, sizeof(c->name), "vm%u", cid);
	snprintf(c->socket_path, sizeof(c->socket_path), "%s/vm%u.sock", dir, cid);
	snprintf(c->uds_path, sizeof(c->uds_path), "%s/vm%u.vsock", dir, cid);
	c->tx_buffer_size = UVSOCKD_DEFAULT_TX_BUFFER_SIZE;
	c->queue_size = UVSOCKD_DEFAULT_QUEUE_SIZE;
	c->n_groups = 1;
	strcpy(c->groups[0], "g");
}

static void dev_config(const struct uvsockd_vm_config *c, struct uvsock_dev_config *dc)
{
	memset(dc, 0, sizeof(*dc));
	dc->size = sizeof(*dc);
	dc->guest_cid = c->guest_cid;
	dc->uds_path = c->uds_path;
	dc->buf_alloc = c->tx_buffer_size;
	dc->queue_size_max = c->queue_size;
	dc->name = c->name;
}

static void *vm_main(void *arg)
{
	struct vm *v = arg;

	ASSERT_EQ(vsock_dev_run(v->core), 0);
	return NULL;
}

static void vm_start(struct vm *v)
{
	ASSERT_EQ(pthread_create(&v->th, NULL, vm_main, v), 0);
	v->running = true;
}

static void vm_join(struct vm *v)
{
	if (!v->running)
		return;
	vsock_dev_stop(v->core);
	pthread_join(v->th, NULL);
	v->running = false;
}

/* The new process's restore (daemon/vms.c, vm_restore): a frozen device, the glue, the links;
 * the REQUEST budget of the VM with CID budget_cid set as given (0: the defaults). */
struct restoring {
	struct vm *vms;
	unsigned n;
	uint32_t budget_cid, burst;
	uint64_t ns;
};

static int restore_cb(void *arg, const struct uvsockd_vm_config *c, uint32_t max_conns,
		      struct rec_reader *r, char *err, size_t errlen)
{
	struct restoring *rs = arg;
	struct vm *v = &rs->vms[rs->n];
	struct uvsock_dev_config dc;
	int e;

	(void)max_conns;
	v->cfg = *c;
	dev_config(&v->cfg, &dc);
	ASSERT_EQ(dev_vhu_new_device_frozen(&dc, &v->dev), 0);
	v->core = vsock_dev_of(v->dev);
	if (rs->budget_cid && rs->budget_cid == c->guest_cid)
		dev_sib_set_req_budget(v->core, rs->burst, rs->ns);
	e = dev_vhu_restore(v->core, r, v->cfg.socket_path, 0, &v->vhu);
	if (e < 0) {
		snprintf(err, errlen, "%s", rec_error(r->doc));
		return e;
	}
	for (unsigned i = 0; i < rs->n; i++)
		ASSERT_EQ(uvsock_dev_link(rs->vms[i].dev, v->dev), 0);
	rs->n++;
	return 0;
}

/* What kind of fd the fuzz target makes for f (fuzz/fuzz-vmrec.c, fz_fd). */
static uint8_t fd_kind(int f)
{
	int type = 0, acc = 0;
	socklen_t l = sizeof(int);
	char link[64], path[64];
	ssize_t n;

	if (getsockopt(f, SOL_SOCKET, SO_TYPE, &type, &l) == 0) {
		l = sizeof(int);
		(void)getsockopt(f, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l);
		if (type == SOCK_DGRAM)
			return 2;
		if (acc)
			return type == SOCK_SEQPACKET ? 1 : 0;
		return type == SOCK_SEQPACKET ? 4 : 3;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", f);
	n = readlink(path, link, sizeof(link) - 1);
	link[n > 0 ? n : 0] = '\0';
	return strstr(link, "eventfd") ? 5 : 6;
}

static void write_seed(const char *name, const uint8_t *buf, size_t len, const struct rec_writer *w)
{
	uint8_t head[17] = { 1 };
	char path[512];
	FILE *f;

	if (!seed_dir)
		return;
	ASSERT_LE(w->nfds, 16u);
	for (uint32_t i = 0; i < w->nfds; i++)
		head[1 + i] = fd_kind(w->fds[i]);
	snprintf(path, sizeof(path), "%s/%s", seed_dir, name);
	f = fopen(path, "wb");
	ASSERT_TRUE(f != NULL);
	ASSERT_EQ(fwrite(head, 1, sizeof(head), f), sizeof(head));
	ASSERT_EQ(fwrite(buf, 1, len, f), len);
	fclose(f);
	test_note("seed %s: %zu bytes, %u fds", path, len, w->nfds);
}

static uint64_t tx_pkts(struct uvsock_dev *d)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_dev_get_stats(d, &st), 0);
	return st.tx_pkts;
}

static uint64_t dropped(struct uvsock_dev *d)
{
	struct uvsock_dev_stats st = { .size = sizeof(st) };

	ASSERT_EQ(uvsock_dev_get_stats(d, &st), 0);
	return st.dropped;
}

TEST(an_inbox_and_a_hold_move_with_the_group)
{
	char dir[] = "/tmp/uvsock-upgrade-sib-XXXXXX", cmd[128];
	struct vm old[2] = { 0 }, nv[2] = { 0 };
	struct restoring rs = { .vms = nv };
	struct rec_writer w[2];
	struct dev_vhu_saved sv;
	struct upgrade_vm uv[2];
	struct uvsock_ctx *g3, *g4;
	struct sockaddr_vm to = vm_addr(3, 9100), da = vm_addr(VMADDR_CID_ANY, 9100);
	int ls, c[NCONN], s[NCONN], dg3, dg4;
	uint8_t buf[NMSG];
	uint64_t before, prev;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	for (int i = 0; i < 2; i++) {
		struct uvsock_dev_config dc;

		cfg_init(&old[i].cfg, dir, 3 + (uint32_t)i);
		dev_config(&old[i].cfg, &dc);
		ASSERT_EQ(uvsock_dev_new(&dc, &old[i].dev), 0);
		old[i].core = vsock_dev_of(old[i].dev);
		ASSERT_EQ(dev_vhu_new(old[i].core, old[i].cfg.socket_path, 0, &old[i].vhu), 0);
	}
	ASSERT_EQ(uvsock_dev_link(old[0].dev, old[1].dev), 0);
	vm_start(&old[0]);
	vm_start(&old[1]);
	g3 = g_guest_new(old[0].cfg.socket_path, NULL);
	g4 = g_guest_new(old[1].cfg.socket_path, NULL);
	/* SEQPACKET: each message its own packet (a stream's small writes may be coalesced) */
	ls = g_listen(g3, SOCK_SEQPACKET, 9000);
	for (unsigned k = 0; k < NCONN; k++) {
		c[k] = g_connect(g4, SOCK_SEQPACKET, 3, 9000);
		ASSERT_GE(c[k], 0);
		s[k] = uvsock_accept(ls, NULL, NULL);
		ASSERT_GE(s[k], 0);
		g_set_timeouts(c[k], WAIT_MS);
		g_set_timeouts(s[k], WAIT_MS);
	}
	dg3 = uvsock_socket(g3, SOCK_DGRAM, 0);
	ASSERT_GE(dg3, 0);
	ASSERT_EQ(uvsock_bind(dg3, (struct sockaddr *)&da, sizeof(da)), 0);
	dg4 = uvsock_socket(g4, SOCK_DGRAM, 0);
	ASSERT_GE(dg4, 0);

	/* VM 3 stops: from here what guest 4 sends it waits in its inbox, then in VM 4's hold. */
	for (int i = 0; i < 2; i++)
		uv[i] = (struct upgrade_vm){ .cfg = &old[i].cfg, .core = old[i].core,
					     .vhu = old[i].vhu };
	upgrade_vm_rec_begin(&w[0], &uv[0]);
	ASSERT_EQ(dev_vhu_stop(old[0].vhu, &w[0], &sv), 0);
	before = tx_pkts(old[1].dev);
	for (unsigned i = 0; i < NDGRAMS; i++) {
		char m[16];

		snprintf(m, sizeof(m), "dgram %u", i);
		ASSERT_EQ(uvsock_sendto(dg4, m, strlen(m), 0, (struct sockaddr *)&to, sizeof(to)),
			  (ssize_t)strlen(m));
	}
	for (unsigned i = 0; i < NMSG; i++)
		for (unsigned k = 0; k < NCONN; k++) {
			uint8_t b = (uint8_t)(i * 7 + k);

			ASSERT_EQ(uvsock_send(c[k], &b, 1, MSG_EOR), 1);
		}
	/* Until VM 4 took what it can (its TX ring waits once the hold is at its bound). */
	prev = 0;
	for (int quiet = 0, k = 0; quiet < 5 && k < 500; k++) {
		uint64_t now = tx_pkts(old[1].dev);

		quiet = now == prev ? quiet + 1 : 0;
		prev = now;
		usleep(10 * 1000);
	}
	test_note("guest 4 sent %llu packets while VM 3 was stopped",
		  (unsigned long long)(prev - before));
	ASSERT_GE(prev - before, 512u + NDGRAMS); /* more than the inbox holds */
	upgrade_vm_rec_begin(&w[1], &uv[1]);
	ASSERT_EQ(dev_vhu_stop(old[1].vhu, &w[1], &sv), 0);

	/* Both written, then read by the new process's reader into new devices. */
	for (int i = 0; i < 2; i++) {
		const uint8_t *rb;
		size_t len;
		char why[400];

		ASSERT_EQ(dev_vhu_save_device(old[i].vhu, &w[i], &sv), 0);
		rec_end(&w[i]);
		ASSERT_EQ(rec_writer_finish(&w[i], &rb, &len), 0);
		write_seed(i ? "vm4-holding" : "vm3-inbox", rb, len, &w[i]);
		if (upgrade_vm_rec_read(rb, len, w[i].fds, w[i].nfds, restore_cb, &rs, why,
					sizeof(why)) != 0)
			test_fail(__FILE__, __LINE__, "record of vm%d refused: %s", 3 + i, why);
	}
	ASSERT_EQ(rs.n, 2u);
	for (int i = 0; i < 2; i++) {
		dev_vhu_given(old[i].vhu);
		vm_join(&old[i]);
	}
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(dev_vhu_go(nv[i].vhu), 0);
		vm_start(&nv[i]);
	}

	/* Guest 3: the datagrams, then every byte once and in order. */
	g_set_timeouts(dg3, WAIT_MS);
	for (unsigned i = 0; i < NDGRAMS; i++) {
		char m[16], want[16];
		ssize_t n = uvsock_recvfrom(dg3, m, sizeof(m) - 1, 0, NULL, NULL);

		ASSERT_GE(n, 0);
		m[n] = '\0';
		snprintf(want, sizeof(want), "dgram %u", i);
		if (strcmp(m, want) != 0)
			test_fail(__FILE__, __LINE__, "datagram %u: \"%s\"", i, m);
	}
	for (unsigned k = 0; k < NCONN; k++) {
		for (size_t got = 0; got < NMSG; got++) /* one message each */
			ASSERT_EQ(uvsock_recv(s[k], buf + got, NMSG - got, 0), 1);
		for (unsigned i = 0; i < NMSG; i++)
			if (buf[i] != (uint8_t)(i * 7 + k))
				test_fail(__FILE__, __LINE__, "connection %u, message %u: %u", k, i,
					  buf[i]);
		/* and the connection goes on, both ways */
		ASSERT_EQ(uvsock_send(s[k], "k", 1, MSG_EOR), 1);
		ASSERT_EQ(uvsock_recv(c[k], buf, 1, 0), 1);
		ASSERT_EQ(buf[0], 'k');
	}
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(dropped(nv[i].dev), 0);

	for (unsigned k = 0; k < NCONN; k++) {
		uvsock_close(c[k]);
		uvsock_close(s[k]);
	}
	uvsock_close(ls);
	uvsock_close(dg3);
	uvsock_close(dg4);
	uvsock_ctx_free(g3);
	uvsock_ctx_free(g4);
	for (int i = 0; i < 2; i++) {
		vm_join(&nv[i]);
		dev_vhu_free(nv[i].vhu);
		uvsock_dev_free(nv[i].dev);
	}
	for (int i = 0; i < 2; i++) {
		dev_vhu_free(old[i].vhu);
		uvsock_dev_free(old[i].dev);
		rec_writer_free(&w[i]);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)!system(cmd);
}

static uint64_t paced(struct vsock_dev *d)
{
	struct vsock_dev_stats st;

	vsock_dev_get_stats(d, &st);
	return st.sibling_requests_paced;
}

struct connecting {
	struct uvsock_ctx *g;
	int fd, err;
};

static void *connect_main(void *arg)
{
	struct connecting *c = arg;

	c->fd = g_connect(c->g, SOCK_STREAM, 3, 9000);
	c->err = c->fd < 0 ? errno : 0;
	return NULL;
}

TEST(a_request_waiting_for_its_budget_and_the_debt_move_with_the_group)
{
	char dir[] = "/tmp/uvsock-upgrade-sib-XXXXXX", cmd[128];
	struct vm old[2] = { 0 }, nv[2] = { 0 };
	/* The new VM 4 pays one REQUEST back every ms: the debt lets the waiting one go. */
	struct restoring rs = { .vms = nv, .budget_cid = 4, .burst = 1, .ns = 1000 * 1000 };
	struct rec_writer w[2];
	struct dev_vhu_saved sv;
	struct upgrade_vm uv[2];
	struct uvsock_ctx *g3, *g4;
	struct connecting cn = { 0 };
	const struct sib_pend *pd = NULL;
	pthread_t th;
	int ls, s, c;
	char b = 0;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	for (int i = 0; i < 2; i++) {
		struct uvsock_dev_config dc;

		cfg_init(&old[i].cfg, dir, 3 + (uint32_t)i);
		dev_config(&old[i].cfg, &dc);
		ASSERT_EQ(uvsock_dev_new(&dc, &old[i].dev), 0);
		old[i].core = vsock_dev_of(old[i].dev);
		ASSERT_EQ(dev_vhu_new(old[i].core, old[i].cfg.socket_path, 0, &old[i].vhu), 0);
	}
	/* The old VM 4: one REQUEST towards VM 3 not accepted, and none paid back by time. */
	dev_sib_set_req_budget(old[1].core, 1, 0);
	ASSERT_EQ(uvsock_dev_link(old[0].dev, old[1].dev), 0);
	vm_start(&old[0]);
	vm_start(&old[1]);
	g3 = g_guest_new(old[0].cfg.socket_path, NULL);
	g4 = g_guest_new(old[1].cfg.socket_path, NULL);
	ls = g_listen(g3, SOCK_STREAM, 9000);
	g_set_timeouts(ls, WAIT_MS);
	/* refused (nobody listens on 9999): the budget's one REQUEST is spent */
	ASSERT_LT(g_connect(g4, SOCK_STREAM, 3, 9999), 0);
	/* the next connect waits in VM 4 for its budget */
	cn.g = g4;
	ASSERT_EQ(pthread_create(&th, NULL, connect_main, &cn), 0);
	ASSERT_WAIT_FOR(paced(old[1].core) == 1, WAIT_MS);

	for (int i = 0; i < 2; i++) {
		uv[i] = (struct upgrade_vm){ .cfg = &old[i].cfg, .core = old[i].core,
					     .vhu = old[i].vhu };
		upgrade_vm_rec_begin(&w[i], &uv[i]);
		ASSERT_EQ(dev_vhu_stop(old[i].vhu, &w[i], &sv), 0);
	}
	for (int i = 0; i < 2; i++) {
		const uint8_t *rb;
		size_t len;
		char why[400];

		ASSERT_EQ(dev_vhu_save_device(old[i].vhu, &w[i], &sv), 0);
		rec_end(&w[i]);
		ASSERT_EQ(rec_writer_finish(&w[i], &rb, &len), 0);
		if (i)
			write_seed("vm4-paced", rb, len, &w[i]);
		if (upgrade_vm_rec_read(rb, len, w[i].fds, w[i].nfds, restore_cb, &rs, why,
					sizeof(why)) != 0)
			test_fail(__FILE__, __LINE__, "record of vm%d refused: %s", 3 + i, why);
	}
	ASSERT_EQ(rs.n, 2u);
	/* Before go (frozen, no thread): the waiting REQUEST and the debt are VM 4's again. */
	ASSERT_TRUE(nv[1].core->sib.paced != NULL);
	ASSERT_EQ(nv[1].core->sib.paced_cid, 3u);
	for (unsigned i = 0; i < nv[1].core->sib.n_pend; i++)
		if (nv[1].core->sib.pend[i].cid == 3)
			pd = &nv[1].core->sib.pend[i];
	ASSERT_TRUE(pd != NULL);
	ASSERT_EQ(pd->req_debt, 1u);
	for (int i = 0; i < 2; i++) {
		dev_vhu_given(old[i].vhu);
		vm_join(&old[i]);
	}
	for (int i = 0; i < 2; i++) {
		ASSERT_EQ(dev_vhu_go(nv[i].vhu), 0);
		vm_start(&nv[i]);
	}

	/* The REQUEST reaches guest 3's listener: the connect completes, bytes both ways. */
	s = uvsock_accept(ls, NULL, NULL);
	ASSERT_GE(s, 0);
	pthread_join(th, NULL);
	if (cn.fd < 0)
		test_fail(__FILE__, __LINE__, "the paced connect failed: %s", strerror(cn.err));
	c = cn.fd;
	g_set_timeouts(c, WAIT_MS);
	g_set_timeouts(s, WAIT_MS);
	ASSERT_EQ(uvsock_send(c, "p", 1, 0), 1);
	ASSERT_EQ(uvsock_recv(s, &b, 1, 0), 1);
	ASSERT_EQ(b, 'p');
	ASSERT_EQ(uvsock_send(s, "q", 1, 0), 1);
	ASSERT_EQ(uvsock_recv(c, &b, 1, 0), 1);
	ASSERT_EQ(b, 'q');
	ASSERT_EQ(paced(nv[1].core), 1); /* the counter travelled; released, not paced again */
	for (int i = 0; i < 2; i++)
		ASSERT_EQ(dropped(nv[i].dev), 0);

	uvsock_close(c);
	uvsock_close(s);
	uvsock_close(ls);
	uvsock_ctx_free(g3);
	uvsock_ctx_free(g4);
	for (int i = 0; i < 2; i++) {
		vm_join(&nv[i]);
		dev_vhu_free(nv[i].vhu);
		uvsock_dev_free(nv[i].dev);
	}
	for (int i = 0; i < 2; i++) {
		dev_vhu_free(old[i].vhu);
		uvsock_dev_free(old[i].dev);
		rec_writer_free(&w[i]);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	(void)!system(cmd);
}

int main(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], "--write-seeds") == 0) {
			seed_dir = argv[i + 1];
			memmove(&argv[i], &argv[i + 2], (size_t)(argc - i - 1) * sizeof(*argv));
			argc -= 2;
			break;
		}
	return test_main(argc, argv);
}
