/* SPDX-License-Identifier: MIT */
/*
 * uvsock-ctl (tools/ctlcli.c), in-process: its usage errors, --help against man/uvsock-ctl.1,
 * and the requests it sends and the answers it prints, against the control server (ctl.c) over a
 * fake daemon whose vm-add / vm-remove callbacks record what they got. The live daemon's side
 * is tests/integration/test-runtime-vms.c.
 */
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "fakectl.h"
#include "hostside.h"
#include "manpage.h"
#include "ctlcli.h"
#include "ctlproto/client.h"
#include "test.h"

struct out {
	int rc;
	char out[2048], err[512];
};

static struct out run(char **argv)
{
	struct out o = { 0 };
	FILE *out = fmemopen(o.out, sizeof(o.out) - 1, "w");
	FILE *err = fmemopen(o.err, sizeof(o.err) - 1, "w");
	int argc = 0;

	ASSERT_TRUE(out && err);
	while (argv[argc])
		argc++;
	o.rc = uvsock_ctl_main(argc, argv, "9.9", out, err);
	fclose(out);
	fclose(err);
	return o;
}

/* What the fake's vm-add / vm-remove got; vm-add of "guest-cid=7,..." adds VM 7. */
static char last_spec[OPS_CTL_MAX_REQUEST];
static unsigned n_added;

static int fake_vm_add(void *opaque, const char *spec, uint32_t *ret_cid, char *err,
		       size_t errlen)
{
	snprintf(last_spec, sizeof(last_spec), "%s", spec);
	if (strncmp(spec, "guest-cid=7,", 12) != 0) {
		snprintf(err, errlen, "fake: only guest-cid 7");
		return -EINVAL;
	}
	n_added++;
	*ret_cid = 7;
	return 0;
}

static int fake_vm_remove(void *opaque, const char *which, uint32_t *ret_cid, char *err,
			  size_t errlen)
{
	snprintf(last_spec, sizeof(last_spec), "%s", which);
	if (strcmp(which, "seven") != 0 || !n_added) {
		snprintf(err, errlen, "no VM with CID or name '%s'", which);
		return -ENOENT;
	}
	n_added--;
	*ret_cid = 7;
	return 0;
}

static unsigned runtime_count(void *opaque)
{
	return fake_vm_count(opaque) + n_added;
}

static const struct ops_ctl_ops runtime_ops = {
	.vm_count = runtime_count,
	.vm_cid = fake_vm_cid,
	.vm_stats = fake_vm_stats,
	.vm_add = fake_vm_add,
	.vm_remove = fake_vm_remove,
};

/* A control server with one VM and runtime_ops, its socket "<temporary directory>/name". */
static void runtime_fake_start(struct fake_daemon *f, const char *name)
{
	struct ops_ctl_config cfg = { .ops = &runtime_ops, .any_uid = true };

	memset(f, 0, sizeof(*f));
	f->n_vms = 1;
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++)
		ops_tap_init(&f->taps[i]);
	snprintf(f->dir, sizeof(f->dir), "/tmp/uvsock-ctlcli-XXXXXX");
	ASSERT_TRUE(mkdtemp(f->dir) != NULL);
	snprintf(f->path, sizeof(f->path), "%s/%s", f->dir, name);
	cfg.path = f->path;
	cfg.opaque = f;
	ASSERT_OK(ops_ctl_start(&cfg, &f->ctl));
}

TEST(usage_errors_exit_2)
{
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", NULL }).rc, 2);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "-s", "/nonexistent", "frobnicate", "x", NULL }).rc,
		  2);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "-s", "/x", "add-vm", NULL }).rc, 2);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "-s", "/x", "add-vm", "a b", NULL }).rc, 2);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "--bogus", "add-vm", "x", NULL }).rc, 2);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "-s", "/nonexistent/ctl", "remove-vm", "3", NULL })
			  .rc, 1);
	ASSERT_EQ(run((char *[]){ "uvsock-ctl", "-s", "/x", "--control", "/y", "remove-vm", "3",
				  NULL })
			  .rc,
		  2);
}

/*
 * The rule of docs/operations.md: without -s or --control, $UVSOCK_CONTROL, else the packaged
 * /run/uvsockd/control.sock, each failure naming the path and its cause: no such socket, or a
 * socket file nobody listens on (a daemon that is gone).
 */
TEST(control_socket_rule_and_causes)
{
	char dir[] = "/tmp/uvsock-ctlcli-XXXXXX", stale[200];
	struct out o;

	unsetenv(OPS_STATCLI_ENV);
	if (access("/run/uvsockd/control.sock", F_OK) == 0) {
		test_note("a uvsockd serves /run/uvsockd/control.sock here: default not tried");
	} else {
		o = run((char *[]){ "uvsock-ctl", "remove-vm", "3", NULL });
		ASSERT_EQ(o.rc, 1);
		ASSERT_TRUE(strstr(o.err, "uvsock-ctl: /run/uvsockd/control.sock: no such socket") !=
			    NULL);
		ASSERT_TRUE(strstr(o.err, "(the default; give -s PATH or set $UVSOCK_CONTROL)") !=
			    NULL);
	}
	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(stale, sizeof(stale), "%s/gone.ctl", dir);
	close(hs_listen(stale, SOCK_STREAM)); /* the file stays, as a killed daemon leaves it */
	setenv(OPS_STATCLI_ENV, stale, 1);
	o = run((char *[]){ "uvsock-ctl", "remove-vm", "3", NULL });
	unsetenv(OPS_STATCLI_ENV);
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, stale) != NULL);
	ASSERT_TRUE(strstr(o.err, "nobody listens there: a socket file left by a uvsockd that is "
				  "gone") != NULL);
	unlink(stale);
	rmdir(dir);
}

TEST(help_and_version)
{
	struct out o = run((char *[]){ "uvsock-ctl", "--help", NULL });

	ASSERT_EQ(o.rc, 0);
	ASSERT_TRUE(strstr(o.out, "add-vm SPEC") != NULL);
	man_check_help_documented(o.out, "uvsock-ctl", UVSOCK_CTL_MAN, false, 4);
	o = run((char *[]){ "uvsock-ctl", "-V", NULL });
	ASSERT_STREQ(o.out, "uvsock-ctl 9.9\n");
}

TEST(vm_socket_given_as_control_socket_is_named)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[] = "/tmp/uvsock-ctlcli-XXXXXX";
	struct pollfd p;
	struct out o;
	int fd;

	/* A listener nobody answers on, as a VM's vhost-user socket is for a control client, with
	 * no control socket next to it: a clear error at once, and never a connection. */
	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/vm3.sock", dir);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ASSERT_EQ(listen(fd, 4), 0);
	o = run((char *[]){ "uvsock-ctl", "-s", sa.sun_path, "remove-vm", "3", NULL });
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, sa.sun_path) != NULL);
	ASSERT_TRUE(strstr(o.err, "not a control socket") != NULL);
	p = (struct pollfd){ .fd = fd, .events = POLLIN };
	ASSERT_EQ(poll(&p, 1, 0), 0);

	/* Given as --control, it is connected to and named once it does not answer "stats"
	 * within 2 s (a VM's socket waits for a vhost-user header). */
	o = run((char *[]){ "uvsock-ctl", "--control", sa.sun_path, "remove-vm", "3", NULL });
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, sa.sun_path) != NULL);
	ASSERT_TRUE(strstr(o.err, "did not answer as a uvsockd control socket within 2 s") != NULL);
	close(fd);
	unlink(sa.sun_path);
	rmdir(dir);
}

TEST(server_without_runtime_vms_says_so)
{
	struct fake_daemon f;
	struct out o;

	fake_start(&f, 1, NULL);
	o = run((char *[]){ "uvsock-ctl", "-s", f.path, "add-vm", "guest-cid=7", NULL });
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "cannot add VMs at runtime") != NULL);
	ASSERT_TRUE(strstr(o.err, "(ENOTSUP)") != NULL);
	fake_stop(&f);
}

TEST(add_and_remove_requests_and_answers)
{
	struct fake_daemon f;
	struct out o;

	runtime_fake_start(&f, "d.ctl");

	o = run((char *[]){ "uvsock-ctl", "-s", f.path, "add-vm", "guest-cid=7,socket=/s,uds-path=/u",
			    NULL });
	ASSERT_EQ(o.rc, 0);
	ASSERT_STREQ(o.out, "added VM 7 (2 VMs now)\n");
	ASSERT_STREQ(last_spec, "guest-cid=7,socket=/s,uds-path=/u");
	o = run((char *[]){ "uvsock-ctl", "-s", f.path, "add-vm", "guest-cid=8", NULL });
	ASSERT_EQ(o.rc, 1);
	ASSERT_STREQ(o.err, "uvsock-ctl: fake: only guest-cid 7 (EINVAL)\n");
	o = run((char *[]){ "uvsock-ctl", "-s", f.path, "--json", "remove-vm", "seven", NULL });
	ASSERT_EQ(o.rc, 0);
	ASSERT_STREQ(o.out, "{\"proto\":1,\"ok\":true,\"removed\":7,\"vms\":1}\n");
	setenv(OPS_STATCLI_ENV, f.path, 1);
	o = run((char *[]){ "uvsock-ctl", "remove-vm", "seven", NULL });
	unsetenv(OPS_STATCLI_ENV);
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "no VM with CID or name 'seven' (ENOENT)") != NULL);
	fake_stop(&f);
}

/*
 * A control socket whose name does not end in .ctl (uvsockd --control PATH): -s takes it for a
 * VM's socket and finds no control socket listing it; --control uses it as it is, and wins
 * over $UVSOCK_CONTROL.
 */
TEST(control_option_takes_a_control_socket_of_any_name)
{
	struct fake_daemon f;
	struct out o;

	runtime_fake_start(&f, "control");

	o = run((char *[]){ "uvsock-ctl", "-s", f.path, "remove-vm", "seven", NULL });
	ASSERT_EQ(o.rc, 1);
	ASSERT_TRUE(strstr(o.err, "not a control socket") != NULL);
	setenv(OPS_STATCLI_ENV, "/nonexistent/uvsock-ctlcli.ctl", 1);
	o = run((char *[]){ "uvsock-ctl", "--control", f.path, "add-vm",
			    "guest-cid=7,socket=/s,uds-path=/u", NULL });
	unsetenv(OPS_STATCLI_ENV);
	ASSERT_EQ(o.rc, 0);
	ASSERT_STREQ(o.out, "added VM 7 (2 VMs now)\n");
	o = run((char *[]){ "uvsock-ctl", "--control", f.path, "remove-vm", "seven", NULL });
	ASSERT_EQ(o.rc, 0);
	fake_stop(&f);
}

TEST_MAIN()
