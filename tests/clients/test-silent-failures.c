/* SPDX-License-Identifier: MIT */
/*
 * Mistakes that used to fail silently, each now one log line at uvsockd's default level that
 * names the cause (suite 'integration'):
 *
 *   - a guest connect to a host port nobody listens on: an info line naming the path tried;
 *   - the two sockets swapped: a VMM (a vhost-user header) on the host-side socket, and a host
 *     program's CONNECT line on the vhost-user socket: a warning naming the other socket;
 *   - the liveness probe of a second uvsockd started on the same paths: the running one logs no
 *     "VMM connected" and no warning for it;
 *   - guest memory the VMM did not share (QEMU's memory backend without share=on): the guest
 *     writes a private copy, so its kicks come while the rings uvsockd maps never move: one
 *     warning per VMM session naming share=on, and the guest_mem_unshared counter.
 */
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "ctlquery.h"
#include "guestside.h"
#include "test.h"
#include "uvsockd-proc.h"
#include "vhost_user/frontend.h"
#include "vring/vring.h"

/* Lines of the daemon's log that hold both a and b. */
static unsigned log_lines_with(const struct uvd *u, const char *a, const char *b)
{
	char line[2048];
	unsigned n = 0;
	FILE *f = fopen(u->log, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, a) && (!b || strstr(line, b)))
			n++;
	fclose(f);
	return n;
}

static void start_info(struct uvd *u)
{
	uint32_t cid = 3;

	uvd_start(u, 1, &cid, NULL, "--log-level=info");
}

/* A raw Unix stream connection to path. */
static int raw_connect(const char *path)
{
	struct sockaddr_un a = hs_addr(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ASSERT_GE(fd, 0);
	ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

TEST(guest_connect_without_listener_names_the_path)
{
	char want[200];
	struct uvsock_ctx *g;
	struct uvd u;

	start_info(&u);
	g = g_guest_new(u.sock[0], NULL);
	ASSERT_EQ(g_connect(g, SOCK_STREAM, VMADDR_CID_HOST, 7000), -1);
	snprintf(want, sizeof(want), "nobody listens on %s_7000", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " info: ", want) == 1, WAIT_MS);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(vmm_on_the_host_side_socket_is_named)
{
	/* What QEMU sends first: VHOST_USER_GET_FEATURES (1), flags version 1, no payload. */
	static const uint32_t hdr[3] = { 1, 1, 0 };
	struct uvsock_ctx *g;
	char want[200];
	struct uvd u;
	int fd;

	start_info(&u);
	/* With a guest attached the header may come after the accept (the handshake path); a
	 * VMM-less uvsockd sees it only if it came with the connection (the usual case). */
	g = g_guest_new(u.sock[0], NULL);
	fd = raw_connect(u.uds[0]);
	ASSERT_EQ(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	snprintf(want, sizeof(want), "vhost-user message on the host-side socket %s:", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " warn: ", want) == 1, WAIT_MS);
	ASSERT_EQ(log_lines_with(&u, " warn: ", "VM's vhost-user socket"), 1);
	close(fd);
	uvsock_ctx_free(g);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(connect_line_on_the_vhost_user_socket_is_named)
{
	static const char line[] = "CONNECT 5000\n";
	char want[200];
	struct uvd u;
	int fd;

	start_info(&u);
	fd = raw_connect(u.sock[0]);
	ASSERT_EQ(write(fd, line, strlen(line)), (ssize_t)strlen(line));
	snprintf(want, sizeof(want), "uds-path (%s)", u.uds[0]);
	ASSERT_WAIT_FOR(log_lines_with(&u, " warn: ", want) == 1, WAIT_MS);
	ASSERT_EQ(log_lines_with(&u, "VMM connected", NULL), 0);
	close(fd);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(second_daemons_probe_is_not_a_vmm)
{
	char vm[400], out[1024] = "", cmd[600];
	uint32_t cid = 3;
	struct uvd u;
	size_t n;
	FILE *p;

	/* At debug level, to see when the probe's connection has been handled. */
	uvd_start(&u, 1, &cid, NULL, "--log-level=debug");
	snprintf(vm, sizeof(vm), "guest-cid=3,socket=%s,uds-path=%s", u.sock[0], u.uds[0]);
	snprintf(cmd, sizeof(cmd), "%s --vm %s 2>&1", uvd_binary(), vm);
	p = popen(cmd, "r");
	ASSERT_TRUE(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	ASSERT_TRUE(WEXITSTATUS(pclose(p)) == 1);
	ASSERT_TRUE(strstr(out, "another process serves it") != NULL);
	/* The running daemon saw a connection come and go: nothing above debug about it. */
	ASSERT_WAIT_FOR(log_lines_with(&u, " debug: ", "before any vhost-user message") == 1,
			WAIT_MS);
	ASSERT_TRUE(uvd_alive(&u));
	ASSERT_EQ(log_lines_with(&u, "VMM connected", NULL), 0);
	ASSERT_EQ(log_lines_with(&u, "VMM disconnected", NULL), 0);
	ASSERT_EQ(log_lines_with(&u, " warn: ", NULL), 0);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * A VMM session on sock (rings 0 and 1 started) whose guest writes the front-end's memory. With
 * shared false uvsockd gets another memfd of the same size instead, zero-filled and never written:
 * what it sees of a QEMU guest whose memory backend has share=off.
 */
static struct vhu_front *vmm_start(const char *sock, bool shared)
{
	struct vhu_mem_table t = { .nregions = 1 };
	struct vhu_front_config cfg;
	struct vhu_front *f;
	int fd;

	vhu_front_config_init(&cfg);
	cfg.mem_size = 1u << 20;
	ASSERT_EQ(vhu_front_connect(sock, &cfg, &f), 0);
	ASSERT_EQ(vhu_front_init(f), 0);
	ASSERT_EQ(vhu_front_set_features(f, vhu_front_features(f)), 0);
	if (shared) {
		ASSERT_EQ(vhu_front_set_mem_table(f), 0);
	} else {
		fd = memfd_create("share-off", MFD_CLOEXEC);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(ftruncate(fd, (off_t)cfg.mem_size), 0);
		t.regions[0] = (struct vhu_mem_region){
			.memory_size = cfg.mem_size,
			.userspace_addr = (uintptr_t)vhu_front_mem(f),
		};
		ASSERT_EQ(vhu_front_request(f, VHU_REQ_SET_MEM_TABLE, false, &t, 8 + 32, &fd, 1,
					    NULL, 0),
			  0);
		close(fd);
	}
	for (unsigned q = 0; q < 2; q++) {
		ASSERT_EQ(vhu_front_setup_ring(f, q, 0), 0);
		if (vhu_front_features(f) & VHU_BIT(VHU_F_PROTOCOL_FEATURES))
			ASSERT_EQ(vhu_front_enable_ring(f, q, true), 0);
	}
	return f;
}

/* The guest driver's first step: one 4 KiB buffer made available on the RX ring. */
static void guest_fill_rx(struct vhu_front *f)
{
	const struct vhu_front_ring *r = vhu_front_ring(f, 0);
	struct vring_desc_le *desc = r->desc;
	struct vring_avail_le *avail = r->avail;
	uint64_t gpa;

	ASSERT_EQ(vhu_front_alloc(f, 4096, 4096, NULL, &gpa), 0);
	desc[0] = (struct vring_desc_le){ .addr = gpa, .len = 4096, .flags = VRING_DESC_F_WRITE };
	avail->ring[0] = 0;
	__atomic_store_n(&avail->idx, 1, __ATOMIC_RELEASE);
}

static bool fd_readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

/* Kicks ring q and returns once uvsockd has handled the kick: its device thread read the eventfd,
 * then answered a request on the same thread. */
static void kick_handled(struct vhu_front *f, unsigned q)
{
	const struct vhu_front_ring *r = vhu_front_ring(f, q);
	uint64_t one = 1, cid;

	ASSERT_EQ(write(r->kick_fd, &one, sizeof(one)), (ssize_t)sizeof(one));
	ASSERT_WAIT_FOR(!fd_readable(r->kick_fd), WAIT_MS);
	ASSERT_EQ(vhu_front_get_config(f, 0, sizeof(cid), &cid), 0);
}

TEST(unshared_guest_memory_is_named_once_per_session)
{
	struct vhu_front *f;
	struct uvd u;

	start_info(&u);
	for (unsigned session = 1; session <= 2; session++) {
		f = vmm_start(u.sock[0], false);
		guest_fill_rx(f);
		/* A guest's kicks: the RX fill, then connects (TX); more after the warning. */
		for (unsigned i = 0; i < 6; i++)
			kick_handled(f, i % 2);
		ASSERT_EQ(log_lines_with(&u, " warn: ", "share=on"), session);
		ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "guest_mem_unshared"), session);
		vhu_front_free(f);
		ASSERT_WAIT_FOR(log_lines_with(&u, "VMM disconnected", NULL) == session, WAIT_MS);
	}
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST(shared_guest_memory_logs_nothing)
{
	struct vhu_front *f;
	struct uvd u;

	start_info(&u);
	f = vmm_start(u.sock[0], true);
	guest_fill_rx(f);
	for (unsigned i = 0; i < 6; i++)
		kick_handled(f, i % 2);
	ASSERT_EQ(log_lines_with(&u, " warn: ", NULL), 0);
	ASSERT_EQ_U64(uvd_vm_counter(&u, 3, "guest_mem_unshared"), 0);
	vhu_front_free(f);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
