/* SPDX-License-Identifier: MIT */
/*
 * A fake service manager's notification socket and file descriptor store, for the tests of
 * uvsockd's crash survival through systemd's fd store (daemon/fdstore.h) on a machine whose
 * systemd must not be touched: a datagram Unix socket given to uvsockd as NOTIFY_SOCKET, read by
 * a thread that keeps the fds of FDSTORE=1 messages under their FDNAME= (as systemd does: a
 * file stored already is not stored twice, compared with kcmp(KCMP_FILE)), removes them on
 * FDSTOREREMOVE=1, and closes the fds of any other message. A new process is started with the
 * store as LISTEN_FDS (fds from 3 in store order), LISTEN_FDNAMES and LISTEN_PID, as
 * sd_listen_fds_with_names(3) reads them, and FDSTORE= its maximum (as systemd 254 and later
 * export FileDescriptorStoreMax=; 0: not exported). systemd.service(5), sd_pid_notify_with_fds(3).
 * Not modelled: systemd's removal of a stored fd that reports EPOLLHUP/EPOLLERR.
 *
 * Used by tests/integration/test-fdstore.c and tests/harness/fake-fdstore.c; no test.h here
 * (errors are returned as -errno).
 */
#ifndef UVSOCK_TESTS_FAKESD_H
#define UVSOCK_TESTS_FAKESD_H

#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#define FAKESD_MAX 4096

struct fakesd_fd {
	int fd;
	char name[256];
};

struct fakesd {
	char path[108]; /* the NOTIFY_SOCKET */
	int sock;
	pthread_t thr;
	atomic_bool stop;
	pthread_mutex_t lock;
	struct fakesd_fd e[FAKESD_MAX];
	size_t n;
	unsigned stored, dups, removed, msgs, ready; /* counters, under lock */
	unsigned max; /* exported as FDSTORE= (systemd 254 and later: FileDescriptorStoreMax=) */
};

static inline bool fakesd_same(int a, int b)
{
	return syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, a, b) == 0;
}

/* One message (lock held): its text and fds (taken over). */
static inline void fakesd_handle(struct fakesd *s, char *text, int *fds, size_t nfds)
{
	bool store = false, remove = false;
	char name[256] = "stored";

	s->msgs++;
	for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) {
		if (strcmp(l, "FDSTORE=1") == 0)
			store = true;
		else if (strcmp(l, "FDSTOREREMOVE=1") == 0)
			remove = true;
		else if (strcmp(l, "READY=1") == 0)
			s->ready++;
		else if (strncmp(l, "FDNAME=", 7) == 0)
			snprintf(name, sizeof(name), "%s", l + 7);
	}
	if (remove) {
		size_t k = 0;

		for (size_t i = 0; i < s->n; i++) {
			if (strcmp(s->e[i].name, name) == 0) {
				close(s->e[i].fd);
				s->removed++;
			} else {
				s->e[k++] = s->e[i];
			}
		}
		s->n = k;
	}
	for (size_t i = 0; i < nfds; i++) {
		bool dup = false;

		for (size_t j = 0; store && j < s->n && !dup; j++)
			dup = fakesd_same(s->e[j].fd, fds[i]);
		if (!store || dup || s->n >= FAKESD_MAX) {
			s->dups += store && dup;
			close(fds[i]);
			continue;
		}
		s->e[s->n].fd = fds[i];
		snprintf(s->e[s->n].name, sizeof(s->e[s->n].name), "%s", name);
		s->n++;
		s->stored++;
	}
}

static inline void *fakesd_main(void *arg)
{
	struct fakesd *s = arg;

	while (!atomic_load(&s->stop)) {
		struct pollfd p = { .fd = s->sock, .events = POLLIN };
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * 253) + CMSG_SPACE(64)];
		} c;
		char text[4097];
		struct iovec iov = { text, sizeof(text) - 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.b,
				    .msg_controllen = sizeof(c.b) };
		int fds[253];
		size_t nfds = 0;
		ssize_t n;

		if (poll(&p, 1, 50) != 1)
			continue;
		/* Received and handled under the lock: fakesd_drain's empty queue is a handled one. */
		pthread_mutex_lock(&s->lock);
		n = recvmsg(s->sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0) {
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		text[n] = 0;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
			if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
				size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);

				for (size_t i = 0; i < k && nfds < 253; i++)
					memcpy(&fds[nfds++], CMSG_DATA(h) + i * sizeof(int),
					       sizeof(int));
			}
		fakesd_handle(s, text, fds, nfds);
		pthread_mutex_unlock(&s->lock);
	}
	return NULL;
}

/* Binds dir/notify and starts reading it. Returns 0 or -errno. */
static inline int fakesd_init(struct fakesd *s, const char *dir)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int r;

	memset(s, 0, sizeof(*s));
	s->max = FAKESD_MAX;
	pthread_mutex_init(&s->lock, NULL);
	if ((size_t)snprintf(s->path, sizeof(s->path), "%s/notify", dir) >= sizeof(s->path))
		return -ENAMETOOLONG;
	memcpy(a.sun_path, s->path, strlen(s->path) + 1);
	s->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s->sock < 0)
		return -errno;
	if (bind(s->sock, (struct sockaddr *)&a, sizeof(a)) < 0) {
		r = -errno;
		close(s->sock);
		return r;
	}
	r = pthread_create(&s->thr, NULL, fakesd_main, s);
	if (r) {
		close(s->sock);
		unlink(s->path);
		return -r;
	}
	return 0;
}

/* Stops reading, closes every stored fd and the socket (its file removed). */
static inline void fakesd_fini(struct fakesd *s)
{
	atomic_store(&s->stop, true);
	pthread_join(s->thr, NULL);
	for (size_t i = 0; i < s->n; i++)
		close(s->e[i].fd);
	s->n = 0;
	close(s->sock);
	unlink(s->path);
}

/*
 * Waits until every message sent so far is handled (as systemd, which reads the notification
 * socket before it acts on a SIGCHLD). Returns 0, or -ETIMEDOUT after about timeout_ms.
 */
static inline int fakesd_drain(struct fakesd *s, int timeout_ms)
{
	for (int t = 0; t <= timeout_ms; t++) {
		int q = 0;

		pthread_mutex_lock(&s->lock);
		if (ioctl(s->sock, SIOCINQ, &q) < 0)
			q = 0;
		pthread_mutex_unlock(&s->lock);
		if (q == 0)
			return 0;
		usleep(1000);
	}
	return -ETIMEDOUT;
}

/* How many READY=1 came so far. */
static inline unsigned fakesd_ready(struct fakesd *s)
{
	unsigned n;

	pthread_mutex_lock(&s->lock);
	n = s->ready;
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* How many stored fds have a name starting with prefix. */
static inline size_t fakesd_count(struct fakesd *s, const char *prefix)
{
	size_t n = 0;

	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->n; i++)
		n += strncmp(s->e[i].name, prefix, strlen(prefix)) == 0;
	pthread_mutex_unlock(&s->lock);
	return n;
}

/*
 * Forks and executes argv (argv[0] a path) as the service: NOTIFY_SOCKET, and with_store the
 * store as LISTEN_FDS/LISTEN_FDNAMES/LISTEN_PID. log_fd >= 0: its stdout and stderr. The child
 * dies with this process (PR_SET_PDEATHSIG). Returns the pid or -errno.
 */
static inline pid_t fakesd_spawn(struct fakesd *s, char *const *argv, int log_fd, bool with_store)
{
	/* Everything the child needs is made before fork: it only dup2s and execs (this process
	 * has threads; the child must not allocate). */
	static char names[FAKESD_MAX * 64 + 32], nfds[32], pidv[32], notify[160], max[32];
	extern char **environ;
	pid_t parent = getpid(), pid;
	char **env;
	size_t n, ne = 0, k = 0;

	for (char **e = environ; *e; e++)
		ne++;
	env = calloc(ne + 8, sizeof(*env));
	if (!env)
		return -ENOMEM;
	for (char **e = environ; *e; e++)
		if (strncmp(*e, "NOTIFY_SOCKET=", 14) && strncmp(*e, "LISTEN_", 7) &&
		    strncmp(*e, "FDSTORE=", 8))
			env[k++] = *e;
	snprintf(notify, sizeof(notify), "NOTIFY_SOCKET=%s", s->path);
	env[k++] = notify;
	snprintf(max, sizeof(max), "FDSTORE=%u", s->max);
	if (s->max)
		env[k++] = max;
	(void)fakesd_drain(s, 5000);
	pthread_mutex_lock(&s->lock);
	n = with_store ? s->n : 0;
	snprintf(names, sizeof(names), "LISTEN_FDNAMES=");
	for (size_t i = 0; i < n; i++) {
		size_t l = strlen(names);

		snprintf(names + l, sizeof(names) - l, "%s%s", i ? ":" : "", s->e[i].name);
	}
	snprintf(nfds, sizeof(nfds), "LISTEN_FDS=%zu", n);
	memcpy(pidv, "LISTEN_PID=", 11);
	if (n) {
		env[k++] = nfds;
		env[k++] = names;
		env[k++] = pidv;
	}
	pid = fork();
	if (pid == 0) {
		int hi[FAKESD_MAX];
		char rev[16];
		size_t d = 0, p = 11;
		pid_t me = getpid();

		sigset_t none;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL); /* the mask survives execve */
		do {
			rev[d++] = (char)('0' + me % 10);
			me /= 10;
		} while (me);
		while (d)
			pidv[p++] = rev[--d];
		pidv[p] = 0;
		if (log_fd >= 0) {
			dup2(log_fd, 1);
			dup2(log_fd, 2);
		}
		/* Above every target first, then into place (dup2 clears FD_CLOEXEC). */
		for (size_t i = 0; i < n; i++)
			if ((hi[i] = fcntl(s->e[i].fd, F_DUPFD_CLOEXEC, (int)(3 + n))) < 0)
				_exit(127);
		for (size_t i = 0; i < n; i++)
			if (dup2(hi[i], (int)(3 + i)) < 0)
				_exit(127);
		execve(argv[0], argv, env);
		_exit(127);
	}
	pthread_mutex_unlock(&s->lock);
	free(env);
	return pid < 0 ? -errno : pid;
}

#endif
