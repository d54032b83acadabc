/* SPDX-License-Identifier: MIT */
/*
 * The new process's side of the live upgrade (daemon/upgrade.c, upgrade_takeover) against a
 * hand-driven old process on a SOCK_SEQPACKET socketpair: the hello, a VM record read and its
 * configuration (daemon/upgrade.c's part of the record, docs/upgrade.md "A VM of uvsockd")
 * handed to the restore callback, "ready", then go with the control socket's fd, or abort. Bad
 * records are refused with a reason naming what is wrong, and nothing reaches the callback:
 * another record kind, a version this binary does not read, a CID out of range, an empty or
 * NUL-bearing name, a path longer than a socket path, a group item of the wrong tag, an unknown
 * top-level item, a missing glue list, an fd sent that no item claims.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test.h"
#include "upgrade.h"
#include "util/rec.h"

/* What the callback saw. */
struct seen {
	int calls;
	struct uvsockd_vm_config cfg;
	uint32_t granted;
};

static int restore_cb(void *arg, const struct uvsockd_vm_config *cfg, uint32_t max_conns,
		      struct rec_reader *r, char *err, size_t errlen)
{
	struct seen *s = arg;
	struct rec_item it;

	(void)err;
	(void)errlen;
	s->calls++;
	s->cfg = *cfg;
	s->granted = max_conns;
	/* the glue list is the callback's: consume it as dev_vhu_restore would (empty here) */
	while (rec_next(r, &it) == 1)
		;
	return 0;
}

struct takeover {
	int fd, rc;
	struct seen seen;
	struct uds_listener ctl;
};

static void *takeover_main(void *arg)
{
	struct takeover *t = arg;

	t->rc = upgrade_takeover(t->fd, restore_cb, &t->seen, &t->ctl);
	return NULL;
}

/* Options of one record built by make_rec. */
struct recopt {
	uint32_t kind, version, cid;
	const char *name, *socket;
	uint32_t group_tag;
	uint32_t txbuf, qsize; /* 0: 262144, 1024 */
	bool extra_top, no_glue;
};

static void put_str(struct rec_writer *w, uint32_t tag, const char *s)
{
	rec_put_bytes(w, tag, s, strlen(s));
}

/* A record as an old process writes it (config + an empty glue), into a sealed memfd. */
static int make_rec(const struct recopt *o, int stray)
{
	struct rec_writer w;
	const uint8_t *buf;
	size_t len;
	int memfd = -1;

	rec_writer_init(&w, o->kind ? o->kind : REC_KIND_VM,
			o->version ? o->version : UPGRADE_VM_REC_VERSION);
	rec_begin(&w, 1);
	rec_put_u32(&w, 1, o->cid ? o->cid : 7);
	if (o->name)
		rec_put_bytes(&w, 2, o->name, strlen(o->name) + (strchr(o->name, '!') ? 1 : 0));
	else
		put_str(&w, 2, "vm7");
	put_str(&w, 3, o->socket ? o->socket : "/run/vm7.sock");
	put_str(&w, 4, "/run/vm7.vsock");
	rec_put_u32(&w, 5, o->txbuf ? o->txbuf : 262144);
	rec_put_u32(&w, 6, o->qsize ? o->qsize : 1024);
	rec_put_u32(&w, 7, 0);
	rec_put_u32(&w, 8, 900);
	rec_put_u32(&w, 9, 1);
	rec_begin(&w, 10);
	put_str(&w, o->group_tag ? o->group_tag : 1, "web");
	rec_end(&w);
	rec_end(&w);
	if (!o->no_glue) {
		rec_begin(&w, 2);
		rec_end(&w);
	}
	if (o->extra_top)
		rec_put_u32(&w, 9, 1);
	(void)stray;
	ASSERT_EQ(rec_writer_finish(&w, &buf, &len), 0);
	ASSERT_EQ(rec_memfd(buf, len, "test-vm", &memfd), 0);
	rec_writer_free(&w);
	return memfd;
}

static void recv_msg(int fd, char *buf, size_t len)
{
	ssize_t n = recv(fd, buf, len - 1, 0);

	ASSERT_GT(n, 0);
	buf[n] = '\0';
}

/* Runs a takeover with one record; returns what the new side answered to it. */
static void one_record(const struct recopt *o, int nfds, char *answer, size_t alen,
		       struct takeover *t)
{
	int sv[2], memfd, fds[1];
	char buf[256];
	pthread_t th;

	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	memset(t, 0, sizeof(*t));
	t->fd = sv[1];
	ASSERT_EQ(pthread_create(&th, NULL, takeover_main, t), 0);
	recv_msg(sv[0], buf, sizeof(buf));
	ASSERT_EQ(strncmp(buf, "hello ", 6), 0);
	ASSERT_EQ(send(sv[0], "vms 1", 5, 0), 5);
	memfd = make_rec(o, 0);
	fds[0] = memfd; /* a stray fd: any open fd no item names */
	ASSERT_EQ(rec_send(sv[0], memfd, fds, (size_t)nfds), 0);
	close(memfd);
	recv_msg(sv[0], answer, alen);
	if (strcmp(answer, "ready") == 0)
		ASSERT_EQ(send(sv[0], "abort", 5, 0), 5);
	pthread_join(th, NULL);
	close(sv[0]);
	close(sv[1]);
}

static void refused(const struct recopt *o, int nfds, const char *why)
{
	struct takeover t;
	char a[512];

	one_record(o, nfds, a, sizeof(a), &t);
	if (strncmp(a, "refused ", 8) != 0 || !strstr(a, why))
		test_fail(__FILE__, __LINE__, "answer '%s', wanted a refusal with '%s'", a, why);
	test_note("%s", a);
	ASSERT_LT(t.rc, 0);
	ASSERT_EQ(t.seen.calls, 0);
}

TEST(a_good_record_is_restored_then_abort_ends_the_takeover)
{
	struct recopt o = { 0 };
	struct takeover t;
	char a[512];

	one_record(&o, 0, a, sizeof(a), &t);
	ASSERT_STREQ(a, "ready");
	ASSERT_EQ(t.seen.calls, 1);
	ASSERT_EQ(t.seen.cfg.guest_cid, 7);
	ASSERT_STREQ(t.seen.cfg.name, "vm7");
	ASSERT_STREQ(t.seen.cfg.socket_path, "/run/vm7.sock");
	ASSERT_STREQ(t.seen.cfg.uds_path, "/run/vm7.vsock");
	ASSERT_EQ(t.seen.cfg.tx_buffer_size, 262144);
	ASSERT_EQ(t.seen.cfg.queue_size, 1024);
	ASSERT_EQ(t.seen.granted, 900);
	ASSERT_TRUE(t.seen.cfg.ok_guest_port);
	ASSERT_EQ(t.seen.cfg.n_groups, 1);
	ASSERT_STREQ(t.seen.cfg.groups[0], "web");
	ASSERT_EQ(t.rc, -ECANCELED); /* abort */
}

TEST(go_carries_the_control_socket)
{
	struct recopt o = { 0 };
	int sv[2], memfd, lsv[2];
	char buf[256];
	struct takeover t = { 0 };
	pthread_t th;
	struct msghdr m = { 0 };
	struct iovec iov = { .iov_base = "go 5 9", .iov_len = 6 };
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr a;
	} u;
	struct cmsghdr *c;

	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lsv), 0);
	t.fd = sv[1];
	ASSERT_EQ(pthread_create(&th, NULL, takeover_main, &t), 0);
	recv_msg(sv[0], buf, sizeof(buf));
	ASSERT_EQ(send(sv[0], "vms 1", 5, 0), 5);
	memfd = make_rec(&o, 0);
	ASSERT_EQ(rec_send(sv[0], memfd, NULL, 0), 0);
	close(memfd);
	recv_msg(sv[0], buf, sizeof(buf));
	ASSERT_STREQ(buf, "ready");
	memset(&u, 0, sizeof(u));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.b;
	m.msg_controllen = sizeof(u.b);
	c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &lsv[0], sizeof(int));
	ASSERT_EQ(sendmsg(sv[0], &m, 0), 6);
	pthread_join(th, NULL);
	ASSERT_EQ(t.rc, 0);
	ASSERT_GE(t.ctl.fd, 0);
	ASSERT_EQ((unsigned long long)t.ctl.dev, 5);
	ASSERT_EQ((unsigned long long)t.ctl.ino, 9);
	close(t.ctl.fd);
	/* the old side hears when each VM served */
	upgrade_takeover_done(sv[1], (const uint64_t[]){ 1234 }, 1);
	recv_msg(sv[0], buf, sizeof(buf));
	ASSERT_EQ(strncmp(buf, "started ", 8), 0);
	ASSERT_TRUE(strstr(buf, " 1234") != NULL);
	close(sv[0]);
	close(lsv[0]);
	close(lsv[1]);
}

TEST(bad_records_are_refused_before_the_restore)
{
	char longpath[200];

	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	refused(&(struct recopt){ .kind = REC_KIND_DEVICE }, 0, "kind");
	refused(&(struct recopt){ .version = UPGRADE_VM_REC_VERSION + 1 }, 0, "version");
	refused(&(struct recopt){ .cid = 2 }, 0, "guest-cid 2");
	refused(&(struct recopt){ .cid = 0xffffffffu }, 0, "guest-cid");
	refused(&(struct recopt){ .name = "" }, 0, "empty");
	refused(&(struct recopt){ .name = "vm!" }, 0, "NUL");
	refused(&(struct recopt){ .socket = longpath }, 0, "socket");
	refused(&(struct recopt){ .group_tag = 2 }, 0, "groups");
	refused(&(struct recopt){ .extra_top = true }, 0, "unknown field");
	refused(&(struct recopt){ .no_glue = true }, 0, "glue");
	/* sizes as the command line takes them (fuzz-vmrec: a 4 GiB buffer was allocated) */
	refused(&(struct recopt){ .txbuf = 0xf8000000u }, 0, "tx-buffer-size");
	refused(&(struct recopt){ .txbuf = 100 }, 0, "tx-buffer-size");
	refused(&(struct recopt){ .qsize = 1000 }, 0, "queue-size");
	refused(&(struct recopt){ 0 }, 1, "fd");
}

TEST_MAIN()
