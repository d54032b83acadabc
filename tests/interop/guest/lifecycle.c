// SPDX-License-Identifier: MIT
/*
 * uvsock-lifecycle: the in-guest half of the back-end restart and migration cases
 * (tests/interop/qemu-lifecycle.py, docs/interop.md "Back-end restart and live migration").
 * Runs ONLY inside the QEMU guest booted by those tests (statically linked); AF_VSOCK is used
 * only there. It serves one command per line from the host on /dev/ttyS1 and answers each with
 * one line, "OK [text]" or "ERR text"; its own notes go to the console (stdout).
 *
 *   cid                 this guest's CID
 *   listen PORT         accept stream connections on PORT for ever, echoing each (a child)
 *   accepted            how many connections the listener has accepted
 *   hold S PORT         connect to the host's PORT and keep the socket in slot S (0..7)
 *   ping S              16 bytes through slot S and back (the host end echoes)
 *   wait_reset S MS     wait up to MS ms for slot S to fail; "OK <errno name>" once it does
 *                       (SO_ERROR first: a TRANSPORT_RESET leaves ECONNRESET there)
 *   close S             close slot S
 *   echo PORT N         a new connection to the host's PORT, N bytes there and back, closed
 *   stream S            a child reads slot S until it fails, checking every byte against the
 *                       host's pattern (byte i of the stream is pattern(i))
 *   streamstat          "OK bytes=B bad=M end=E": what the stream child saw (E: errno name
 *                       once it ended, "EOF" at its end, "-" while it runs)
 *   send S N            a child sends N bytes of the pattern through slot S (byte i is
 *                       pattern(i)), then shuts its sending side (the host checks them)
 *   sendstat            "OK bytes=B end=E": what the send child has sent (E: "-" while it runs,
 *                       "DONE" once all N went, else the errno name of its failure)
 *   idle N PORT         N more connections to the host's PORT, held idle (at most IDLE_MAX)
 *   idleping            one byte there and back through every idle connection (the host end
 *                       echoes): "OK N", or "ERR I <errno name>" for the first that fails
 *   kmsg                the kernel's log lines that name vsock or virtio at warning or worse
 *                       (/dev/kmsg, from boot): "OK N [the first]"
 *   memload MB          a child rewrites MB MiB over and over (a memory load)
 *   memcheck            stop the load after its current pass and check that every word holds
 *                       what the last complete pass wrote: "OK passes=P" or "ERR ..."
 *   poweroff            end the VM
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

#define SLOTS 8
#define IO_MS 5000
#define IDLE_MAX 256
/* pattern(i) repeats every PERIOD bytes: i * 131 every 256, (i >> 12) * 7 every 256 * 4096. */
#define PERIOD (1u << 20)

static int ctl = -1;
static int slot[SLOTS] = { -1, -1, -1, -1, -1, -1, -1, -1 };
static int idle[IDLE_MAX];
static int idle_n;
/* pattern(0 .. 2 * PERIOD): any PERIOD bytes of the stream from offset % PERIOD, in one piece. */
static uint8_t *period;

/* Shared with the children (MAP_SHARED | MAP_ANONYMOUS survives fork). */
struct shared {
	volatile uint64_t accepted;
	volatile uint64_t stream_bytes, stream_bad;
	volatile int stream_end; /* 0 while running, else the errno (or -1: EOF) */
	volatile uint64_t send_bytes;
	volatile int send_end; /* 0 while running, -2 once all went, else the errno */
	volatile uint64_t passes;
	volatile int mem_stop, mem_done, mem_bad;
};
static struct shared *sh;
static pid_t mem_pid = -1;

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 131 + (i >> 12) * 7 + 1);
}

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0 || n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (write(ctl, buf, (size_t)n) != n)
		_exit(3);
}

static const char *ename(int e)
{
	switch (e) {
	case ECONNRESET: return "ECONNRESET";
	case ECONNREFUSED: return "ECONNREFUSED";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EPIPE: return "EPIPE";
	case ENOTCONN: return "ENOTCONN";
	case -1: return "EOF";
	case -2: return "DONE";
	case 0: return "-";
	default: return strerror(e);
	}
}

/*
 * Why a socket ended: its pending error (SO_ERROR; a TRANSPORT_RESET leaves ECONNRESET there,
 * while recv answers ENOTCONN), else what recv said (e; -1: EOF).
 */
static int sock_error(int fd, int e)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err)
		return err;
	return e;
}

static int vconnect(unsigned port)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_HOST,
				 .svm_port = port };
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

/* Waits for fd to be readable (or in error) for at most ms. Returns 1, 0 (timeout). */
static int wait_in(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) > 0;
}

/* n bytes there and back through fd. Returns 0 or an errno (-1: EOF, ETIMEDOUT). */
static int roundtrip(int fd, size_t n)
{
	static uint8_t out[65536], in[65536];
	size_t got = 0;

	if (n > sizeof(out))
		n = sizeof(out);
	for (size_t i = 0; i < n; i++)
		out[i] = pattern(i);
	if (send(fd, out, n, MSG_NOSIGNAL) != (ssize_t)n)
		return errno ? errno : EPIPE;
	while (got < n) {
		ssize_t r;

		if (!wait_in(fd, IO_MS))
			return ETIMEDOUT;
		r = recv(fd, in + got, n - got, 0);
		if (r < 0)
			return errno;
		if (r == 0)
			return -1;
		got += (size_t)r;
	}
	return memcmp(in, out, n) ? EBADMSG : 0;
}

static void echo_conn(int fd)
{
	char buf[65536];
	ssize_t n;

	while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
		if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n)
			break;
	_exit(0);
}

static void listener(unsigned port)
{
	struct sockaddr_vm a = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY,
				 .svm_port = port };
	int fd = socket(AF_VSOCK, SOCK_STREAM, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 128) < 0)
		_exit(2);
	signal(SIGCHLD, SIG_IGN);
	for (;;) {
		int c = accept(fd, NULL, NULL);

		if (c < 0)
			continue;
		__atomic_fetch_add(&sh->accepted, 1, __ATOMIC_SEQ_CST);
		if (fork() == 0) {
			close(fd);
			echo_conn(c);
		}
		close(c);
	}
}

static void streamer(int fd)
{
	static uint8_t buf[65536];
	uint64_t off = 0;

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n <= 0) {
			sh->stream_end = sock_error(fd, n == 0 ? -1 : errno);
			printf("lifecycle: stream ended after %llu bytes, %llu bad: %s\n",
			       (unsigned long long)off, (unsigned long long)sh->stream_bad,
			       ename(sh->stream_end));
			_exit(0);
		}
		/* n <= sizeof(buf) < PERIOD: period[] holds the whole expected run. */
		if (memcmp(buf, period + off % PERIOD, (size_t)n))
			for (ssize_t i = 0; i < n; i++)
				if (buf[i] != pattern(off + (uint64_t)i))
					sh->stream_bad++;
		off += (uint64_t)n;
		sh->stream_bytes = off;
	}
}

/* Sends n bytes of the pattern through fd, then shuts the sending side (the host sees EOF). */
static void sender(int fd, uint64_t n)
{
	uint64_t off = 0;

	while (off < n) {
		size_t len = n - off < 65536 ? (size_t)(n - off) : 65536;
		ssize_t r = send(fd, period + off % PERIOD, len, MSG_NOSIGNAL);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			sh->send_end = r < 0 ? errno : EPIPE;
			printf("lifecycle: send failed after %llu bytes: %s\n",
			       (unsigned long long)off, ename(sh->send_end));
			_exit(0);
		}
		off += (uint64_t)r;
		sh->send_bytes = off;
	}
	shutdown(fd, SHUT_WR);
	sh->send_end = -2;
	printf("lifecycle: sent %llu bytes\n", (unsigned long long)off);
	_exit(0);
}

/*
 * Counts the kernel's log records about vsock or virtio at warning or worse (a record is
 * "PRIO,SEQ,TIME,FLAGS;TEXT", Documentation/ABI/testing/dev-kmsg); the first goes into first.
 */
static int kmsg_count(char *first, size_t len)
{
	char rec[2048];
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC), n = 0;

	first[0] = '\0';
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t r = read(fd, rec, sizeof(rec) - 1);
		char *text;

		if (r < 0 && errno == EPIPE)
			continue; /* records overwritten while we read: go on with the next */
		if (r <= 0)
			break;
		rec[r] = '\0';
		text = strchr(rec, ';');
		if (!text || (atoi(rec) & 7) > 4)
			continue;
		text++;
		text[strcspn(text, "\n")] = '\0';
		if (strstr(text, "vsock") || strstr(text, "virtio")) {
			if (!n++)
				snprintf(first, len, "%s", text);
		}
	}
	close(fd);
	return n;
}

/* Rewrites every word with its pass number; a checked pass must find the previous one. */
static void memload(size_t mb)
{
	size_t words = (mb << 20) / 8;
	uint64_t *m = malloc(words * 8);

	if (!m)
		_exit(2);
	memset(m, 0, words * 8);
	for (uint64_t p = 1;; p++) {
		for (size_t i = 0; i < words; i++) {
			if (m[i] != ((p - 1) ^ i) && p > 1)
				sh->mem_bad++;
			m[i] = p ^ i;
		}
		sh->passes = p;
		if (sh->mem_stop) {
			for (size_t i = 0; i < words; i++)
				if (m[i] != (p ^ i))
					sh->mem_bad++;
			sh->mem_done = 1;
			_exit(0);
		}
	}
}

static int parse_slot(const char *s)
{
	int i = atoi(s);

	return i >= 0 && i < SLOTS ? i : -1;
}

static void command(char *line)
{
	char *argv[4] = { 0 };
	int argc = 0, s, r;

	for (char *t = strtok(line, " \t\r"); t && argc < 4; t = strtok(NULL, " \t\r"))
		argv[argc++] = t;
	if (argc == 0)
		return;
	if (!strcmp(argv[0], "cid")) {
		unsigned cid = 0;
		int fd = open("/dev/vsock", O_RDONLY | O_CLOEXEC);

		if (fd >= 0 && ioctl(fd, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid) == 0)
			reply("OK %u", cid);
		else
			reply("ERR %s", strerror(errno));
		if (fd >= 0)
			close(fd);
	} else if (!strcmp(argv[0], "listen") && argc == 2) {
		if (fork() == 0)
			listener((unsigned)atoi(argv[1]));
		reply("OK");
	} else if (!strcmp(argv[0], "accepted")) {
		reply("OK %llu", (unsigned long long)sh->accepted);
	} else if (!strcmp(argv[0], "hold") && argc == 3 && (s = parse_slot(argv[1])) >= 0) {
		if (slot[s] >= 0)
			close(slot[s]);
		slot[s] = vconnect((unsigned)atoi(argv[2]));
		if (slot[s] < 0) {
			reply("ERR %s", ename(-slot[s]));
			slot[s] = -1;
		} else {
			reply("OK");
		}
	} else if (!strcmp(argv[0], "ping") && argc == 2 && (s = parse_slot(argv[1])) >= 0 &&
		   slot[s] >= 0) {
		r = roundtrip(slot[s], 16);
		r ? reply("ERR %s", ename(r)) : reply("OK");
	} else if (!strcmp(argv[0], "wait_reset") && argc == 3 &&
		   (s = parse_slot(argv[1])) >= 0 && slot[s] >= 0) {
		char buf[4096];
		int ms = atoi(argv[2]);

		for (;;) {
			ssize_t n;

			if (!wait_in(slot[s], ms)) {
				reply("ERR TIMEOUT");
				break;
			}
			n = recv(slot[s], buf, sizeof(buf), MSG_DONTWAIT);
			if (n > 0)
				continue;
			if (n < 0 && errno == EAGAIN)
				continue;
			reply("OK %s", ename(sock_error(slot[s], n == 0 ? -1 : errno)));
			break;
		}
	} else if (!strcmp(argv[0], "close") && argc == 2 && (s = parse_slot(argv[1])) >= 0) {
		if (slot[s] >= 0)
			close(slot[s]);
		slot[s] = -1;
		reply("OK");
	} else if (!strcmp(argv[0], "echo") && argc == 3) {
		int fd = vconnect((unsigned)atoi(argv[1]));

		if (fd < 0) {
			reply("ERR connect %s", ename(-fd));
			return;
		}
		r = roundtrip(fd, (size_t)atol(argv[2]));
		close(fd);
		r ? reply("ERR %s", ename(r)) : reply("OK");
	} else if (!strcmp(argv[0], "stream") && argc == 2 && (s = parse_slot(argv[1])) >= 0 &&
		   slot[s] >= 0) {
		if (fork() == 0)
			streamer(slot[s]);
		reply("OK");
	} else if (!strcmp(argv[0], "streamstat")) {
		reply("OK bytes=%llu bad=%llu end=%s", (unsigned long long)sh->stream_bytes,
		      (unsigned long long)sh->stream_bad, ename(sh->stream_end));
	} else if (!strcmp(argv[0], "send") && argc == 3 && (s = parse_slot(argv[1])) >= 0 &&
		   slot[s] >= 0) {
		if (fork() == 0)
			sender(slot[s], strtoull(argv[2], NULL, 10));
		reply("OK");
	} else if (!strcmp(argv[0], "sendstat")) {
		reply("OK bytes=%llu end=%s", (unsigned long long)sh->send_bytes,
		      ename(sh->send_end));
	} else if (!strcmp(argv[0], "idle") && argc == 3) {
		int n = atoi(argv[1]);

		for (r = 0; r < n; r++) {
			int fd;

			if (idle_n == IDLE_MAX) {
				reply("ERR more than %d idle connections", IDLE_MAX);
				return;
			}
			fd = vconnect((unsigned)atoi(argv[2]));
			if (fd < 0) {
				reply("ERR connect %d: %s", idle_n, ename(-fd));
				return;
			}
			idle[idle_n++] = fd;
		}
		reply("OK %d", idle_n);
	} else if (!strcmp(argv[0], "idleping")) {
		for (s = 0; s < idle_n; s++) {
			r = roundtrip(idle[s], 1);
			if (r) {
				reply("ERR %d %s", s, ename(sock_error(idle[s], r)));
				return;
			}
		}
		reply("OK %d", idle_n);
	} else if (!strcmp(argv[0], "kmsg")) {
		char first[200];

		r = kmsg_count(first, sizeof(first));
		r < 0 ? reply("ERR /dev/kmsg: %s", strerror(-r)) : reply("OK %d %s", r, first);
	} else if (!strcmp(argv[0], "memload") && argc == 2) {
		mem_pid = fork();
		if (mem_pid == 0)
			memload((size_t)atoi(argv[1]));
		reply(mem_pid > 0 ? "OK" : "ERR fork");
	} else if (!strcmp(argv[0], "memcheck") && mem_pid > 0) {
		sh->mem_stop = 1;
		waitpid(mem_pid, NULL, 0);
		mem_pid = -1;
		if (!sh->mem_done || sh->mem_bad)
			reply("ERR passes=%llu bad=%d", (unsigned long long)sh->passes, sh->mem_bad);
		else
			reply("OK passes=%llu", (unsigned long long)sh->passes);
	} else if (!strcmp(argv[0], "poweroff")) {
		reply("OK");
		sync();
		reboot(RB_POWER_OFF);
	} else {
		reply("ERR unknown command '%s'", argv[0]);
	}
}

int main(void)
{
	struct termios t;
	char line[256];
	size_t len = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	period = malloc(2 * PERIOD);
	for (uint64_t i = 0; period && i < 2 * PERIOD; i++)
		period[i] = pattern(i);
	ctl = open("/dev/ttyS1", O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (sh == MAP_FAILED || !period || ctl < 0 || tcgetattr(ctl, &t) < 0) {
		printf("lifecycle: no control channel: %s\n", strerror(errno));
		return 2;
	}
	cfmakeraw(&t);
	tcsetattr(ctl, TCSANOW, &t);
	signal(SIGPIPE, SIG_IGN);
	printf("UVSOCK-LIFECYCLE ready\n");
	reply("READY");
	for (;;) {
		char c;
		ssize_t n = read(ctl, &c, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 1;
		if (c == '\n') {
			line[len] = '\0';
			printf("lifecycle: > %s\n", line);
			command(line);
			len = 0;
		} else if (len < sizeof(line) - 1) {
			line[len++] = c;
		}
	}
}
