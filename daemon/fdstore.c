/* SPDX-License-Identifier: MIT */
/*
 * Crash survival through systemd's file descriptor store (see fdstore.h; docs/upgrade.md,
 * "Without --isolate: the systemd fd store"): the keeper that stores each VM's record and fds,
 * and the start-up that rebuilds them from LISTEN_FDS.
 */
#include "fdstore.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "device/vhu_keep.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"

/*
 * The stored memfd: this header, the id of the stored fd that is each of the record's fds (u64
 * each, little-endian as the host: the store never leaves the machine), then the record.
 */
#define IDX_MAGIC "UVSKFDX1"
struct idx_hdr {
	char magic[8];
	uint32_t nfds;
	uint32_t rec_len;
};

/* A distinct fd in the store (our own duplicate) and the id in its name. */
struct sfd {
	uint64_t id;
	int fd;
};

/* What the store holds of one VM. */
struct svm {
	uint32_t cid;
	bool has_rec;   /* r<gen> is stored */
	bool refreshed; /* the device wrote a record since start-up */
	uint64_t gen, next_id;
	/* The fds of the stored record, and while a new one is stored, its new fds too. */
	struct sfd f[2 * VHU_KEEP_MAX_FDS];
	size_t n;
};

static struct {
	pthread_mutex_t lock;
	struct svm *vm;
	size_t nvm;
	bool kcmp_ok;
	int sock; /* ours, to NOTIFY_SOCKET (sa) */
	struct sockaddr_un sa;
	socklen_t salen;
} ks = { .lock = PTHREAD_MUTEX_INITIALIZER, .sock = -1 };

/* How long a device thread may wait for the service manager to take a message. */
#define NOTIFY_SEND_TIMEOUT_MS 1000

/*
 * sd_pid_notify_with_fds(3) with a bounded wait: its send blocks as long as the service
 * manager's queue is full, and the sender here is a device thread with a VMM waiting for its
 * reply. Returns 0 or -errno (-EAGAIN: not taken within NOTIFY_SEND_TIMEOUT_MS).
 */
static int notify(const char *text, const int *fds, size_t nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} c;
	struct iovec iov = { (void *)text, strlen(text) };
	struct msghdr m = { .msg_name = &ks.sa, .msg_namelen = ks.salen, .msg_iov = &iov,
			    .msg_iovlen = 1 };

	if (ks.sock < 0)
		return -ENOTCONN;
	if (nfds == 1) {
		memset(&c, 0, sizeof(c));
		m.msg_control = c.b;
		m.msg_controllen = sizeof(c.b);
		c.h.cmsg_level = SOL_SOCKET;
		c.h.cmsg_type = SCM_RIGHTS;
		c.h.cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(&c.h), fds, sizeof(int));
	}
	if (sendmsg(ks.sock, &m, MSG_NOSIGNAL) < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	return 0;
}

/* Our socket to NOTIFY_SOCKET (a path, or @ for the abstract namespace). */
static int notify_open(const char *ns)
{
	struct timeval tv = { .tv_sec = NOTIFY_SEND_TIMEOUT_MS / 1000,
			      .tv_usec = NOTIFY_SEND_TIMEOUT_MS % 1000 * 1000 };
	size_t l = strlen(ns);

	if ((ns[0] != '/' && ns[0] != '@') || l >= sizeof(ks.sa.sun_path))
		return -EAFNOSUPPORT;
	ks.sa.sun_family = AF_UNIX;
	memcpy(ks.sa.sun_path, ns, l);
	if (ns[0] == '@')
		ks.sa.sun_path[0] = 0;
	ks.salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + l + (ns[0] == '/'));
	ks.sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (ks.sock < 0)
		return -errno;
	(void)setsockopt(ks.sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return 0;
}

/* An fd inherited from the store at start-up, until daemon_fdstore_start. */
struct taken {
	uint32_t cid;
	char kind; /* 'r' record, 'f' fd, 'x' a name this module does not write */
	bool used;
	uint64_t num;
	int fd;
	char name[256];
};
static struct taken *tk;
static size_t ntk;

static int store_fd(int fd, const char *what, uint32_t cid, uint64_t num)
{
	char msg[96];

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=" FDSTORE_PREFIX "%u-%s%llu", cid, what,
		 (unsigned long long)num);
	return notify(msg, &fd, 1);
}

static void remove_name(const char *name)
{
	char msg[320];

	/* A name read from LISTEN_FDNAMES goes back in a message of lines: nothing but printable
	 * characters (systemd's own rule for FDNAME=), or it could add a line of its own. */
	for (const char *c = name; *c; c++)
		if (*c < 0x20 || *c > 0x7e || *c == ':')
			return;
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	if (notify(msg, NULL, 0) < 0)
		log_warn("fd store: %s could not be removed (the service manager did not take the "
			 "message)", name);
}

static void remove_one(uint32_t cid, const char *what, uint64_t num)
{
	char name[64];

	snprintf(name, sizeof(name), FDSTORE_PREFIX "%u-%s%llu", cid, what, (unsigned long long)num);
	remove_name(name);
}

/* Whether a and b are one open file (what systemd's duplicate check compares). */
static bool same_file(int a, int b)
{
	return syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, a, b) == 0;
}

/* Removes everything the store holds of vm (lock held). */
static void vm_drop(struct svm *vm)
{
	if (vm->has_rec)
		remove_one(vm->cid, "r", vm->gen);
	vm->has_rec = false;
	for (size_t i = 0; i < vm->n; i++) {
		remove_one(vm->cid, "f", vm->f[i].id);
		close(vm->f[i].fd);
	}
	vm->n = 0;
}

static struct svm *vm_get(uint32_t cid)
{
	struct svm *n;

	for (size_t i = 0; i < ks.nvm; i++)
		if (ks.vm[i].cid == cid)
			return &ks.vm[i];
	n = realloc(ks.vm, (ks.nvm + 1) * sizeof(*n));
	if (!n)
		return NULL;
	ks.vm = n;
	n = &ks.vm[ks.nvm++];
	*n = (struct svm){ .cid = cid };
	return n;
}

/* The id under which fd is stored for vm: an fd already stored keeps its own. */
static int vm_fd_id(struct svm *vm, int fd, uint64_t *ret_id)
{
	int dup, r;

	for (size_t i = 0; i < vm->n; i++)
		if (same_file(vm->f[i].fd, fd)) {
			*ret_id = vm->f[i].id;
			return 0;
		}
	if (vm->n >= ARRAY_SIZE(vm->f))
		return -E2BIG; /* cannot be: a record names at most VHU_KEEP_MAX_FDS */
	dup = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (dup < 0)
		return -errno;
	r = store_fd(dup, "f", vm->cid, vm->next_id);
	if (r < 0) {
		close(dup);
		return r;
	}
	vm->f[vm->n++] = (struct sfd){ .id = vm->next_id, .fd = dup };
	*ret_id = vm->next_id++;
	return 0;
}

/* Removes vm's stored fds that none of ids[n] is (lock held). */
static void vm_prune(struct svm *vm, const uint64_t *ids, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < vm->n; i++) {
		bool used = false;

		for (size_t j = 0; j < n && !used; j++)
			used = ids[j] == vm->f[i].id;
		if (used) {
			vm->f[k++] = vm->f[i];
		} else {
			remove_one(vm->cid, "f", vm->f[i].id);
			close(vm->f[i].fd);
		}
	}
	vm->n = k;
}

/* The index and the record, as a sealed memfd. */
static int idx_memfd(const uint64_t *ids, size_t nfds, const uint8_t *buf, size_t len,
		     int *ret_fd)
{
	struct idx_hdr h = { .nfds = (uint32_t)nfds, .rec_len = (uint32_t)len };
	size_t total = sizeof(h) + nfds * sizeof(*ids) + len;
	uint8_t *m = malloc(total);
	int r;

	if (!m)
		return -ENOMEM;
	memcpy(h.magic, IDX_MAGIC, sizeof(h.magic));
	memcpy(m, &h, sizeof(h));
	memcpy(m + sizeof(h), ids, nfds * sizeof(*ids));
	memcpy(m + sizeof(h) + nfds * sizeof(*ids), buf, len);
	r = rec_memfd(m, total, "uvsockd-fdstore", ret_fd);
	free(m);
	return r;
}

/* dev_vhu_keep_fn: stores cid's new record, then removes the previous one (vhu_keep.h). */
static void fdstore_keep(void *arg, uint32_t cid, const uint8_t *buf, size_t len, const int *fds,
			 size_t nfds)
{
	uint64_t ids[VHU_KEEP_MAX_FDS];
	struct svm *vm;
	size_t nconns = 0;
	uint32_t c;
	int conn = -1, memfd = -1, r;

	(void)arg;
	pthread_mutex_lock(&ks.lock);
	vm = vm_get(cid);
	if (!vm) {
		log_error("vm%u: crash survival: out of memory: nothing is stored", cid);
		goto out;
	}
	vm->refreshed = true;
	r = dev_vhu_keep_peek(buf, len, fds, nfds, &c, &conn, &nconns);
	if (r < 0 || conn < 0) {
		vm_drop(vm); /* the VMM went: nothing to adopt */
		goto out;
	}
	/* Without kcmp an fd stored already cannot be told from a new one, and systemd would
	 * drop the new copy as a duplicate of the one removed next: remove first (a crash in
	 * between loses this VM's connection). */
	if (!ks.kcmp_ok)
		vm_drop(vm);
	for (size_t i = 0; i < nfds; i++) {
		r = vm_fd_id(vm, fds[i], &ids[i]);
		if (r < 0)
			goto fail;
	}
	r = idx_memfd(ids, nfds, buf, len, &memfd);
	if (r == 0)
		r = store_fd(memfd, "r", cid, vm->gen + 1);
	if (memfd >= 0)
		close(memfd);
	if (r < 0)
		goto fail;
	if (vm->has_rec)
		remove_one(cid, "r", vm->gen);
	vm->gen++;
	vm->has_rec = true;
	vm_prune(vm, ids, nfds);
	log_debug("vm%u: crash-survival record stored in the fd store: generation %llu, %zu fds, "
		  "%zu connections", cid, (unsigned long long)vm->gen, nfds, nconns);
	goto out;
fail:
	/* The record before describes an older configuration: adopting it would be wrong. */
	log_warn("vm%u: cannot store the crash-survival record in the service manager's fd store: "
		 "%s; nothing is kept for this VM until its next record", cid, strerror(-r));
	vm_drop(vm);
out:
	pthread_mutex_unlock(&ks.lock);
}

/* Parses FDSTORE_PREFIX "<cid>-r<n>" or "...-f<n>". */
static bool parse_name(const char *name, uint32_t *cid, char *kind, uint64_t *num)
{
	const char *p = name + strlen(FDSTORE_PREFIX);
	unsigned long long v;
	char *end;

	if (strlen(name) >= 64 || !isdigit((unsigned char)*p))
		return false;
	errno = 0;
	v = strtoull(p, &end, 10);
	if (errno || v > UINT32_MAX || *end != '-' || (end[1] != 'r' && end[1] != 'f'))
		return false;
	*cid = (uint32_t)v;
	*kind = end[1];
	p = end + 2;
	if (!isdigit((unsigned char)*p))
		return false;
	v = strtoull(p, &end, 10);
	if (errno || *end || v == UINT64_MAX)
		return false;
	*num = v;
	return true;
}

void daemon_fdstore_take(int fd, const char *name)
{
	struct taken t = { .fd = fd }, *n;

	(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
	if (!parse_name(name, &t.cid, &t.kind, &t.num))
		t.kind = 'x'; /* closed and removed by daemon_fdstore_start, with a log line */
	snprintf(t.name, sizeof(t.name), "%s", name);
	n = realloc(tk, (ntk + 1) * sizeof(*n));
	if (!n) {
		log_error("fd store: %s: out of memory: closed", name);
		close(fd);
		return;
	}
	tk = n;
	tk[ntk++] = t;
}

/* Whether same_file tells one open file from another here. */
static bool kcmp_works(void)
{
	int p[2], a;
	bool ok;

	if (pipe2(p, O_CLOEXEC) < 0)
		return false;
	a = fcntl(p[0], F_DUPFD_CLOEXEC, 3);
	ok = a >= 0 && same_file(p[0], a) && !same_file(p[0], p[1]);
	if (a >= 0)
		close(a);
	close(p[0]);
	close(p[1]);
	return ok;
}

bool daemon_fdstore_available(const struct uvsockd_config *cfg, char *why, size_t whylen)
{
	const char *ns = getenv("NOTIFY_SOCKET"), *max = getenv("FDSTORE");
	unsigned long long m = 0;
	char *end = NULL;
	int r;

	if (!ns || !*ns) {
		snprintf(why, whylen, "not --isolate, no service manager (NOTIFY_SOCKET unset)");
		return false;
	}
	if (max) {
		errno = 0;
		m = strtoull(max, &end, 10);
		if (errno || *end || end == max)
			m = 0;
	}
	if (m == 0) {
		snprintf(why, whylen, "not --isolate, no fd store (FDSTORE= unset or 0: the unit sets "
			 "FileDescriptorStoreMax= and, before systemd 254, Environment=FDSTORE=)");
		return false;
	}
	if (m < (unsigned long long)FDSTORE_PER_VM * (cfg->n_vms + 1))
		log_warn("crash survival: FileDescriptorStoreMax=%llu is under %u for %u VMs "
			 "(docs/upgrade.md): records the store refuses are lost", m,
			 FDSTORE_PER_VM * (cfg->n_vms + 1), cfg->n_vms);
	r = notify_open(ns);
	if (r < 0) {
		snprintf(why, whylen, "not --isolate, NOTIFY_SOCKET=%.64s: %s", ns, strerror(-r));
		return false;
	}
	/* kcmp may be compiled out (CONFIG_KCMP): then each record replaces the last by removing
	 * it first. */
	ks.kcmp_ok = kcmp_works();
	if (!ks.kcmp_ok)
		log_warn("crash survival: kcmp(KCMP_FILE) unavailable: a record is removed before "
			 "the next is stored (a crash in between loses the VM)");
	snprintf(why, whylen, "systemd fd store, FDSTORE=%llu", m);
	return true;
}

static void taken_discard(struct taken *t)
{
	close(t->fd);
	remove_name(t->name);
	t->fd = -1;
	t->used = true;
}

static struct taken *taken_find(uint32_t cid, char kind, uint64_t num)
{
	for (size_t i = 0; i < ntk; i++)
		if (tk[i].fd >= 0 && tk[i].cid == cid && tk[i].kind == kind && tk[i].num == num)
			return &tk[i];
	return NULL;
}

/*
 * Rebuilds the record t of its VM and offers it. Everything in it is checked (a crashed process
 * wrote it): the memfd sealed and bounded (rec_map_fd), the header, the fd count, each fd
 * present, then the record itself (dev_vhu_adopt_offer). ids gets the ids it names. Returns 0 or
 * -errno with why.
 */
static int rebuild(const struct taken *t, uint64_t *ids, size_t *ret_n, char *why, size_t wl)
{
	const uint8_t *buf;
	struct idx_hdr h;
	size_t len, nfds = 0;
	int *fds = NULL, memfd = -1, conn, r;
	uint32_t cid;

	r = rec_map_fd(t->fd, &buf, &len);
	if (r < 0) {
		snprintf(why, wl, "not a sealed record memfd: %s", strerror(-r));
		return r;
	}
	r = -EBADMSG;
	if (len < sizeof(h)) {
		snprintf(why, wl, "%zu bytes", len);
		goto out;
	}
	memcpy(&h, buf, sizeof(h));
	if (memcmp(h.magic, IDX_MAGIC, sizeof(h.magic)) != 0) {
		snprintf(why, wl, "not uvsockd's index (magic)");
		goto out;
	}
	if (h.nfds > VHU_KEEP_MAX_FDS ||
	    len - sizeof(h) < (size_t)h.nfds * sizeof(*ids) ||
	    len - sizeof(h) - (size_t)h.nfds * sizeof(*ids) != h.rec_len || !h.rec_len) {
		snprintf(why, wl, "sizes do not add up (%u fds, %u record bytes, %zu in all)",
			 h.nfds, h.rec_len, len);
		goto out;
	}
	nfds = h.nfds;
	memcpy(ids, buf + sizeof(h), nfds * sizeof(*ids));
	r = -ENOMEM;
	fds = calloc(nfds ? nfds : 1, sizeof(*fds));
	if (!fds)
		goto out;
	for (size_t i = 0; i < nfds; i++) {
		const struct taken *f = taken_find(t->cid, 'f', ids[i]);

		if (!f) {
			snprintf(why, wl, "its fd %zu (" FDSTORE_PREFIX "%u-f%llu) is not in the store "
				 "(systemd drops a socket whose peer closed: the VMM went?)", i,
				 t->cid, (unsigned long long)ids[i]);
			r = -ENOENT;
			nfds = i;
			goto out;
		}
		fds[i] = fcntl(f->fd, F_DUPFD_CLOEXEC, 3);
		if (fds[i] < 0) {
			r = -errno;
			snprintf(why, wl, "dup: %s", strerror(-r));
			nfds = i;
			goto out;
		}
	}
	r = rec_memfd(buf + len - h.rec_len, h.rec_len, "uvsockd-keep", &memfd);
	if (r == 0) {
		r = dev_vhu_keep_peek(buf + len - h.rec_len, h.rec_len, fds, nfds, &cid, &conn, NULL);
		if (r == 0 && (cid != t->cid || conn < 0))
			r = -EBADMSG;
	}
	if (r < 0) {
		snprintf(why, wl, "the record: %s", strerror(-r));
		goto out;
	}
	rec_unmap(buf, len);
	*ret_n = nfds;
	r = dev_vhu_adopt_offer(memfd, fds, nfds); /* takes memfd and fds */
	if (r < 0)
		snprintf(why, wl, "the record: %s", strerror(-r));
	return r;
out:
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	free(fds);
	if (memfd >= 0)
		close(memfd);
	rec_unmap(buf, len);
	return r;
}

/* Offers cid's newest record that rebuilds, and seeds the keeper with what it names. */
static void start_vm(uint32_t cid)
{
	uint64_t ids[VHU_KEEP_MAX_FDS], max_id = 0;
	struct taken *best = NULL;
	size_t nids = 0;
	char why[256];

	for (;;) {
		best = NULL;
		for (size_t i = 0; i < ntk; i++)
			if (tk[i].fd >= 0 && !tk[i].used && tk[i].cid == cid && tk[i].kind == 'r' &&
			    (!best || tk[i].num > best->num))
				best = &tk[i];
		if (!best)
			break;
		best->used = true;
		if (rebuild(best, ids, &nids, why, sizeof(why)) == 0)
			break;
		log_warn("vm%u: the fd store's crash-survival record %s is refused: %s", cid,
			 best->name, why);
	}
	for (size_t i = 0; i < ntk; i++)
		if (tk[i].cid == cid && tk[i].kind == 'f' && tk[i].num > max_id)
			max_id = tk[i].num;
	if (best) {
		struct svm *vm = vm_get(cid);

		log_info("vm%u: crash-survival record %s from the fd store offered (%zu fds)", cid,
			 best->name, nids);
		if (vm) {
			vm->gen = best->num;
			vm->has_rec = true;
			vm->next_id = max_id + 1;
			/* Its name is removed when the next record is stored. */
			close(best->fd);
			best->fd = -1;
			for (size_t i = 0; i < nids; i++) {
				struct taken *f = taken_find(cid, 'f', ids[i]);

				if (f) { /* two indices may be one fd: stored once */
					vm->f[vm->n++] = (struct sfd){ .id = f->num, .fd = f->fd };
					f->fd = -1;
				}
			}
		}
	}
	for (size_t i = 0; i < ntk; i++)
		if (tk[i].cid == cid && tk[i].fd >= 0) {
			if (tk[i].kind == 'r' && best && tk[i].num < best->num)
				log_info("vm%u: older crash-survival record %s removed from the fd store",
					 cid, tk[i].name);
			else if (tk[i].kind == 'r' || !best)
				log_warn("vm%u: %s removed from the fd store (no record to adopt)", cid,
					 tk[i].name);
			taken_discard(&tk[i]);
		}
}

void daemon_fdstore_start(const struct uvsockd_config *cfg)
{
	pthread_mutex_lock(&ks.lock);
	for (size_t i = 0; i < ntk; i++)
		if (tk[i].kind == 'x') {
			log_warn("fd store: fd %d named '%.64s' is not one uvsockd stores: closed and "
				 "removed", tk[i].fd, tk[i].name);
			taken_discard(&tk[i]);
		}
	for (size_t i = 0; i < ntk; i++) {
		bool configured = false;

		if (tk[i].fd < 0)
			continue;
		for (unsigned v = 0; v < cfg->n_vms && !configured; v++)
			configured = cfg->vms[v].guest_cid == tk[i].cid;
		if (!configured) {
			log_warn("vm%u: not configured: %s removed from the fd store", tk[i].cid,
				 tk[i].name);
			taken_discard(&tk[i]);
			continue;
		}
		start_vm(tk[i].cid);
	}
	free(tk);
	tk = NULL;
	ntk = 0;
	pthread_mutex_unlock(&ks.lock);
	dev_vhu_set_keeper(fdstore_keep, NULL);
}

void daemon_fdstore_settled(void)
{
	pthread_mutex_lock(&ks.lock);
	for (size_t i = 0; i < ks.nvm; i++)
		if (!ks.vm[i].refreshed && (ks.vm[i].has_rec || ks.vm[i].n)) {
			log_warn("vm%u: its crash-survival record was not adopted: removed from the "
				 "fd store", ks.vm[i].cid);
			vm_drop(&ks.vm[i]);
		}
	pthread_mutex_unlock(&ks.lock);
}

void daemon_fdstore_stop(void)
{
	size_t n = 0;

	dev_vhu_set_keeper(NULL, NULL);
	pthread_mutex_lock(&ks.lock);
	for (size_t i = 0; i < ks.nvm; i++) {
		n += ks.vm[i].has_rec || ks.vm[i].n;
		vm_drop(&ks.vm[i]);
	}
	free(ks.vm);
	ks.vm = NULL;
	ks.nvm = 0;
	for (size_t i = 0; i < ntk; i++)
		if (tk[i].fd >= 0) {
			log_warn("fd store: %s inherited but not used (crash survival off): closed",
				 tk[i].name);
			close(tk[i].fd);
		}
	free(tk);
	tk = NULL;
	ntk = 0;
	pthread_mutex_unlock(&ks.lock);
	if (n)
		log_info("crash survival: %zu VM%s' records removed from the fd store (clean stop)",
			 n, n == 1 ? "" : "s");
}
