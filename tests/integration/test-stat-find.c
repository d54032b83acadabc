/* SPDX-License-Identifier: MIT */
/*
 * How uvsock-stat finds a daemon's control socket (suite 'integration'): a live
 * uvsockd with two VMs (tests/harness/uvsockd-proc.h, stopped by PID), uvsock-stat run
 * in-process (statrun.h) on a thread of its own. uvsock-stat must never connect to a vhost-user
 * socket: pointed at any VM's socket it finds the control socket that lists that VM, and when
 * there is none it fails at once naming the path. A VMM (the project's own front-end, through a
 * guest-role context) attaching to that VM meanwhile is served.
 *
 * "Never connected" is read from the daemon's own log at level info, which has one "VMM
 * connected" line per accepted vhost-user connection.
 */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "guestside.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "statrun.h"
#include "test.h"
#include "uvsockd-proc.h"

/*
 * Starts uvsockd with VMs 3 and 4 in u->dir at level info; control: "" for the default
 * (<first VM's socket>.ctl), else a --control path. Waits (bounded) until the control socket
 * answers.
 */
static void start2(struct uvd *u, const char *control_rel, char *ctl, size_t ctl_len)
{
	static const uint32_t cids[] = { 3, 4 };
	char vmarg[2][400], carg[300];
	char *argv[8];
	int argc = 0, fd = -1;

	memset(u, 0, sizeof(*u));
	u->nvms = 2;
	snprintf(u->dir, sizeof(u->dir), "/tmp/uvsock-sf-XXXXXX");
	ASSERT_TRUE(mkdtemp(u->dir) != NULL);
	snprintf(u->log, sizeof(u->log), "%s/uvsockd.log", u->dir);
	argv[argc++] = (char *)uvd_binary();
	for (int i = 0; i < 2; i++) {
		u->cid[i] = cids[i];
		snprintf(u->sock[i], sizeof(u->sock[i]), "%s/vm%u.sock", u->dir, cids[i]);
		snprintf(u->uds[i], sizeof(u->uds[i]), "%s/vm%u.vsock", u->dir, cids[i]);
		snprintf(vmarg[i], sizeof(vmarg[i]), "guest-cid=%u,socket=%s,uds-path=%s", cids[i],
			 u->sock[i], u->uds[i]);
		argv[argc++] = "--vm";
		argv[argc++] = vmarg[i];
	}
	if (control_rel[0]) {
		snprintf(ctl, ctl_len, "%s/%s", u->dir, control_rel);
		snprintf(carg, sizeof(carg), "--control=%s", ctl);
		argv[argc++] = carg;
	} else {
		snprintf(ctl, ctl_len, "%s.ctl", u->sock[0]);
	}
	argv[argc++] = "--log-level=info";
	argv[argc] = NULL;
	uvd_spawn(u, argv, false);
	uvd_wait_ready(u, "start-up");
	if (!WAIT_FOR(ops_ctl_connect_exact(ctl, &fd) >= 0, WAIT_MS))
		test_fail(__FILE__, __LINE__, "%s does not answer", ctl);
	close(fd);
}

/* Lines of the daemon's log that contain needle. */
static int log_count(const struct uvd *u, const char *needle)
{
	char line[1024];
	FILE *f = fopen(u->log, "r");
	int n = 0;

	ASSERT_TRUE(f != NULL);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, needle))
			n++;
	fclose(f);
	return n;
}

struct bg_stat {
	const char *args[8];
	struct run r;
	atomic_bool done;
};

static void *bg_stat_main(void *arg)
{
	struct bg_stat *b = arg;

	b->r = stat_run_version("find", b->args);
	atomic_store_explicit(&b->done, true, memory_order_release); /* publishes b->r */
	return NULL;
}

/*
 * Runs uvsock-stat args on a thread while a VMM attaches to `vmm_sock` and talks to the host
 * once; returns the run once both are done. The bound on uvsock-stat's run is a hang bound
 * below the daemon's 5 s vhost-user message timeout (the old behaviour), not a speed target.
 */
static struct run stat_while_vmm_attaches(const struct uvd *u, int vm, const char *const *args)
{
	struct bg_stat b = { .done = false };
	struct uvsock_ctx *g;
	pthread_t th;
	char buf[4];
	int lfd, hfd, gfd;

	for (int i = 0; args[i]; i++)
		b.args[i] = args[i];
	ASSERT_EQ(pthread_create(&th, NULL, bg_stat_main, &b), 0);
	g = g_guest_new(u->sock[vm], NULL);
	gfd = g_connect_host(g, u->uds[vm], SOCK_STREAM, 5000, WAIT_MS, &lfd, &hfd);
	ASSERT_EQ(uvsock_send(gfd, "ping", 4, 0), 4);
	ASSERT_EQ(hs_read_full(hfd, buf, 4, WAIT_MS), 4);
	if (!WAIT_FOR(atomic_load_explicit(&b.done, memory_order_acquire), 4000))
		test_fail(__FILE__, __LINE__, "uvsock-stat still runs after 4 s");
	pthread_join(th, NULL);
	uvsock_close(gfd);
	close(hfd);
	close(lfd);
	uvsock_ctx_free(g);
	return b.r;
}

/* The answer lists VM cid with its vhost-user socket path. */
static void assert_lists(const char *json, uint32_t cid, const char *sock)
{
	const struct ops_jv *vms;
	struct ops_jv *v;
	bool found = false;

	ASSERT_OK(ops_json_parse(json, strlen(json), &v));
	vms = ops_json_get(ops_json_get(v, "stats"), "vms");
	ASSERT_TRUE(vms != NULL);
	for (const struct ops_jv *m = vms->child; m; m = m->next)
		if (ops_json_u64(m, "cid", 0) == cid) {
			ASSERT_STREQ(ops_json_str(m, "socket", ""), sock);
			found = true;
		}
	ASSERT_TRUE(found);
	ops_json_free(v);
}

/*
 * The default control socket is <first VM's socket>.ctl: pointed at the second VM's socket,
 * uvsock-stat finds it (it lists that socket) and never connects to the vhost-user socket.
 */
TEST(second_vms_socket_finds_the_control_socket)
{
	struct uvd u;
	char ctl[300];

	start2(&u, "", ctl, sizeof(ctl));
	struct run r = stat_while_vmm_attaches(
		&u, 1, (const char *[]){ "-s", u.sock[1], "--json", "--counters", NULL });
	if (r.rc != 0)
		test_fail(__FILE__, __LINE__, "uvsock-stat failed (%d): %s", r.rc, r.err);
	assert_lists(r.out, 4, u.sock[1]);
	assert_lists(r.out, 3, u.sock[0]);
	run_free(&r);
	/* Exactly one VMM connection was accepted on VM 4's socket: the front-end's. */
	ASSERT_EQ(log_count(&u, "vm4: VMM connected"), 1);
	ASSERT_EQ(uvd_stop(&u), 0);
}

/*
 * With the control socket elsewhere under a name that is not *.ctl, nothing near the VM's socket
 * lists it: uvsock-stat fails at once with a message naming the path, connects to nothing
 * vhost-user, and works when given the control socket.
 */
TEST(no_control_socket_near_the_path_fails_at_once)
{
	struct uvd u;
	char ctl[300];

	start2(&u, "control", ctl, sizeof(ctl));
	struct run r = stat_while_vmm_attaches(
		&u, 1, (const char *[]){ "-s", u.sock[1], "--counters", NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_STREQ(r.out, "");
	ASSERT_TRUE(strstr(r.err, u.sock[1]) != NULL);
	ASSERT_TRUE(strstr(r.err, "not a control socket") != NULL);
	ASSERT_TRUE(strstr(r.err, "logs its control socket") != NULL);
	run_free(&r);
	ASSERT_EQ(log_count(&u, "vm4: VMM connected"), 1);
	ASSERT_EQ(log_count(&u, "vm3: VMM connected"), 0);

	/* The first VM's socket: the same (PATH.ctl does not exist, no *.ctl lists it). */
	r = stat_run_version("find", (const char *[]){ "-s", u.sock[0], NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, u.sock[0]) != NULL);
	run_free(&r);
	ASSERT_EQ(log_count(&u, "vm3: VMM connected"), 0);

	/* A VM's socket named as the control socket: a bounded probe, an error naming the path
	 * and what to give instead (no wait for the daemon's 5 s vhost-user handshake limit). */
	r = stat_run_version("find", (const char *[]){ "--control", u.sock[1], NULL });
	ASSERT_EQ(r.rc, 1);
	ASSERT_TRUE(strstr(r.err, u.sock[1]) != NULL);
	ASSERT_TRUE(strstr(r.err, "did not answer as a uvsockd control socket") != NULL);
	ASSERT_TRUE(strstr(r.err, "vhost-user socket or uds-path is not one") != NULL);
	run_free(&r);

	/* Named as the control socket, it is used as is. */
	r = stat_run_version("find", (const char *[]){ "--control", ctl, "--json", NULL });
	ASSERT_EQ(r.rc, 0);
	assert_lists(r.out, 4, u.sock[1]);
	run_free(&r);
	ASSERT_EQ(uvd_stop(&u), 0);
}

#define SETPRIV "/usr/bin/setpriv"

/* Exit status and output (stdout and stderr together) of one client run as uid 65534. */
struct nobody_run {
	int rc;
	char out[8192];
};

/*
 * Runs argv (argv[0] a built client) as uid/gid 65534 through setpriv, with its output in
 * r->out; bounded to 10 s (then SIGKILL by PID).
 */
static void run_as_nobody(char *const *argv, struct nobody_run *r)
{
	char *full[16] = { SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups" };
	uint64_t end = test_now_ms() + 10000;
	pid_t parent = getpid(), pid;
	size_t len = 0;
	int out[2], st = 0, n = 4;

	for (int i = 0; argv[i] && n < 15; i++)
		full[n++] = argv[i];
	full[n] = NULL;
	ASSERT_OK(pipe2(out, O_CLOEXEC));
	pid = fork();
	ASSERT_GE(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(out[1], 1);
		dup2(out[1], 2);
		execv(full[0], full);
		_exit(127);
	}
	close(out[1]);
	for (;;) {
		struct pollfd pf = { .fd = out[0], .events = POLLIN };
		ssize_t k;

		if (test_now_ms() >= end || poll(&pf, 1, 100) < 0)
			break;
		k = read(out[0], r->out + len, sizeof(r->out) - 1 - len);
		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
			break;
		if (k > 0)
			len += (size_t)k;
	}
	close(out[0]);
	while (len && r->out[len - 1] == '\n')
		len--;
	r->out[len] = '\0';
	if (!WAIT_FOR(waitpid(pid, &st, WNOHANG) == pid, 1000)) {
		kill(pid, SIGKILL);
		waitpid(pid, &st, 0);
	}
	r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
	test_note("as uid 65534: %s %s -> %d: %s", argv[0], argv[1], r->rc, r->out);
}

/* The output names permission on the control socket ctl, and neither no control socket nor
 * a VM socket probe. */
static void assert_permission_named(const struct nobody_run *r, const char *ctl)
{
	ASSERT_EQ(r->rc, 1);
	ASSERT_TRUE(strstr(r->out, ctl) != NULL);
	ASSERT_TRUE(strstr(r->out, "permission denied: the control socket (mode 0600)") != NULL);
	ASSERT_TRUE(strstr(r->out, "not a control socket") == NULL);
	ASSERT_TRUE(strstr(r->out, "did not answer") == NULL);
}

/*
 * uvsock-stat and uvsock-ctl of a user other than the daemon's (65534, through setpriv; the
 * directory is open to everyone, so the EACCES is the 0600 control socket's own) are told
 * permission denied with the control socket's path, whether given the control socket, the
 * first VM's socket (<socket>.ctl next to it) or the second's (found among the *.ctl of the
 * directory), never "not a control socket". The daemon's own user still gets its answer.
 */
TEST(another_users_clients_are_told_permission_denied)
{
	struct nobody_run r;
	struct uvd u;
	char ctl[300];

	if (geteuid() != 0)
		test_skip("running as another user needs root");
	if (access(SETPRIV, X_OK) != 0)
		test_skip(SETPRIV " is not installed");
	start2(&u, "", ctl, sizeof(ctl));
	ASSERT_EQ(chmod(u.dir, 0755), 0);
	run_as_nobody((char *[]){ UVSOCK_STAT_PATH, "--control", ctl, NULL }, &r);
	assert_permission_named(&r, ctl);
	run_as_nobody((char *[]){ UVSOCK_STAT_PATH, "-s", ctl, NULL }, &r);
	assert_permission_named(&r, ctl);
	for (int i = 0; i < 2; i++) {
		run_as_nobody((char *[]){ UVSOCK_STAT_PATH, "-s", u.sock[i], NULL }, &r);
		assert_permission_named(&r, ctl);
		run_as_nobody((char *[]){ UVSOCK_CTL_PATH, "-s", u.sock[i], "remove-vm", "9",
					  NULL },
			      &r);
		assert_permission_named(&r, ctl);
	}
	run_as_nobody((char *[]){ UVSOCK_CTL_PATH, "-s", ctl, "remove-vm", "9", NULL }, &r);
	assert_permission_named(&r, ctl);

	struct run ok = stat_run_version("find", (const char *[]){ "-s", u.sock[1], "--json",
								  NULL });
	ASSERT_EQ(ok.rc, 0);
	assert_lists(ok.out, 4, u.sock[1]);
	run_free(&ok);
	ASSERT_EQ(log_count(&u, "VMM connected"), 0);
	ASSERT_EQ(uvd_stop(&u), 0);
}

TEST_MAIN()
