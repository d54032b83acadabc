/* SPDX-License-Identifier: MIT */
/*
 * The control server (ctl.c, ctl_cmds.c) over a VM set that changes: requests run under the
 * ops' lock, vm-remove reaches the daemon's callback with the lock held, and a capture running
 * over the VMs forgets a removed one (its tap detached, the indexes above it moved down) and
 * goes on recording the others (ops_ctl_vm_removed).
 */
#include <pthread.h>

#include "fakectl.h"
#include "ctlproto/json.h"
#include "ctlproto/client.h"
#include "test.h"

/* Three VMs, CIDs 3, 4, 5, each with its tap; vm-remove by CID. */
struct set {
	struct fake_daemon f;
	uint32_t cid[FAKE_MAX_VMS];
	struct ops_tap *tap[FAKE_MAX_VMS];
	unsigned n;
	pthread_mutex_t lock;
	bool held;       /* the lock is held (set and read by the lock holder) */
	unsigned locked; /* times taken */
};

static struct set *set_of(void *opaque)
{
	return opaque;
}

static unsigned set_count(void *o)
{
	return set_of(o)->n;
}

static uint32_t set_cid(void *o, unsigned idx)
{
	return set_of(o)->cid[idx];
}

static void set_stats(void *o, unsigned idx, struct ops_vm_stats *ret)
{
	ret->cid = set_of(o)->cid[idx];
}

static struct ops_tap *set_tap(void *o, unsigned idx)
{
	return set_of(o)->tap[idx];
}

static void set_lock(void *o)
{
	pthread_mutex_lock(&set_of(o)->lock);
	set_of(o)->held = true;
	set_of(o)->locked++;
}

static void set_unlock(void *o)
{
	set_of(o)->held = false;
	pthread_mutex_unlock(&set_of(o)->lock);
}

static int set_remove(void *o, const char *which, uint32_t *ret_cid, char *err, size_t errlen)
{
	struct set *s = set_of(o);
	unsigned long cid = strtoul(which, NULL, 10);

	if (!s->held) {
		snprintf(err, errlen, "called without the lock");
		return -EIO;
	}
	for (unsigned i = 0; i < s->n; i++) {
		if (s->cid[i] != cid)
			continue;
		ops_ctl_vm_removed(s->f.ctl, i);
		memmove(&s->cid[i], &s->cid[i + 1], (s->n - i - 1) * sizeof(s->cid[0]));
		memmove(&s->tap[i], &s->tap[i + 1], (s->n - i - 1) * sizeof(s->tap[0]));
		s->n--;
		*ret_cid = (uint32_t)cid;
		return 0;
	}
	snprintf(err, errlen, "no VM with CID or name '%s'", which);
	return -ENOENT;
}

static const struct ops_ctl_ops set_ops = {
	.vm_count = set_count,
	.vm_cid = set_cid,
	.vm_stats = set_stats,
	.vm_tap = set_tap,
	.lock = set_lock,
	.unlock = set_unlock,
	.vm_remove = set_remove,
};

/* The CIDs a running capture records, as "3,5". */
static void capture_vms(int fd, char *buf, size_t len)
{
	struct ops_jv *v = NULL;
	const struct ops_jv *vms;
	size_t n = 0;

	ASSERT_OK(ops_ctl_request(fd, "capture status", -1, 5000, NULL, &v));
	vms = ops_json_get(ops_json_get(v, "capture"), "vms");
	buf[0] = '\0';
	for (const struct ops_jv *e = vms ? vms->child : NULL; e; e = e->next)
		n += (size_t)snprintf(buf + n, len - n, "%s%llu", n ? "," : "",
				      (unsigned long long)e->u);
	ops_json_free(v);
}

static void answer_ok(int fd, const char *line)
{
	struct ops_jv *v = NULL;

	ASSERT_OK(ops_ctl_request(fd, line, -1, 5000, NULL, &v));
	if (!ops_json_bool(v, "ok", false))
		test_fail(__FILE__, __LINE__, "%s: %s", line, ops_json_str(v, "error", "?"));
	ops_json_free(v);
}

TEST(removed_vm_leaves_a_running_capture)
{
	struct ops_ctl_config cfg = { .ops = &set_ops, .any_uid = true };
	struct set s = { .n = 3 };
	char pcap[128], got[64], start[160];
	int fd = -1;

	pthread_mutex_init(&s.lock, NULL);
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++) {
		ops_tap_init(&s.f.taps[i]);
		s.tap[i] = &s.f.taps[i];
		s.cid[i] = 3 + i;
	}
	snprintf(s.f.dir, sizeof(s.f.dir), "/tmp/uvsock-ctlrt-XXXXXX");
	ASSERT_TRUE(mkdtemp(s.f.dir) != NULL);
	snprintf(s.f.path, sizeof(s.f.path), "%s/d.ctl", s.f.dir);
	snprintf(pcap, sizeof(pcap), "%s/all.pcap", s.f.dir);
	cfg.path = s.f.path;
	cfg.opaque = &s;
	ASSERT_OK(ops_ctl_start(&cfg, &s.f.ctl));
	ASSERT_OK(ops_ctl_connect(s.f.path, &fd));

	snprintf(start, sizeof(start), "capture start %s", pcap);
	answer_ok(fd, start);
	capture_vms(fd, got, sizeof(got));
	ASSERT_STREQ(got, "3,4,5");
	answer_ok(fd, "vm-remove 4");
	ASSERT_FALSE(ops_tap_attached(&s.f.taps[1]));
	ASSERT_TRUE(ops_tap_attached(&s.f.taps[0]) && ops_tap_attached(&s.f.taps[2]));
	capture_vms(fd, got, sizeof(got));
	ASSERT_STREQ(got, "3,5");
	answer_ok(fd, "vm-remove 3");
	capture_vms(fd, got, sizeof(got));
	ASSERT_STREQ(got, "5");
	answer_ok(fd, "capture stop");
	ASSERT_FALSE(ops_tap_attached(&s.f.taps[2]));
	ASSERT_GE(s.locked, 7); /* every request above, under the lock */
	ASSERT_FALSE(s.held);
	close(fd);
	ops_ctl_stop(s.f.ctl);
	for (unsigned i = 0; i < FAKE_MAX_VMS; i++)
		ops_tap_destroy(&s.f.taps[i]);
	unlink(pcap);
	rmdir(s.f.dir);
	pthread_mutex_destroy(&s.lock);
}

TEST_MAIN()
