/* SPDX-License-Identifier: MIT */
/*
 * What the two halves of the control socket share (not for other modules): ctl.c is the server
 * (listener, clients, line reader, writes, the control thread and its loop), ctl_cmds.c the
 * commands and their JSON answers, including the capture they start and stop. Everything here
 * is used on the control thread only (and by ops_ctl_stop() after that thread has ended).
 */
#ifndef UVSOCK_OPS_CTL_INTERNAL_H
#define UVSOCK_OPS_CTL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "ctl.h"
#include "ctlproto/json.h"
#include "util/uds.h"

/* Room kept free in an answer for the members written after a listing. */
#define CTL_TAIL_ROOM 512u
/* Largest JSON of one connection in a listing (host path escaped included). */
#define CTL_CONN_ROOM 1536u

struct loop;
struct loop_watch;
struct loop_timer;

/* One control connection; owned by ctl.c (ctl.c creates and frees it). */
struct ctl_client {
	struct ops_ctl *ctl;
	struct loop_watch *watch;
	int fd;
	uid_t uid;
	char in[OPS_CTL_MAX_REQUEST];
	size_t in_len;
	int pass_fd;          /* received with SCM_RIGHTS, for `capture start -`; -1 if none */
	char *out;            /* answer being written */
	size_t out_len, out_off;
	bool closing;         /* close once the answer is written */
	uint64_t deadline_ms; /* idle (reading) or write deadline, mono_ms() time base */
};

/* The capture started by `capture start`; owned by ctl_cmds.c. */
struct ctl_capture {
	bool active;
	struct ops_pcap *pcap;
	char file[128];
	unsigned *idx;            /* VMs whose tap we attached */
	unsigned n_idx;
	uint64_t end_ms;          /* mono_ms() time; 0: no duration */
	struct ctl_client *owner; /* stops when it disconnects; NULL: detached */
	bool have_last;           /* the last capture's final status, for `capture status` */
	struct ops_pcap_status last;
	char last_file[128];
	char last_reason[32];
};

struct ops_ctl {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char server[64];
	const struct ops_ctl_ops *ops;
	void *opaque;
	unsigned max_clients;
	size_t max_response;
	unsigned idle_ms;
	bool any_uid;
	struct uds_listener listener;
	struct loop *loop;
	struct loop_watch *listen_watch;
	struct loop_timer *timer;    /* the next deadline: idle clients, accept pause, capture */
	uint64_t accept_pause_until; /* accept failed for lack of resources: retry then (ms) */
	uint64_t last_flush_ms;      /* last periodic flush of a running capture */
	pthread_t th;
	struct ctl_client **clients;
	unsigned n_clients;
	struct ctl_capture cap;
	int exit_after; /* -1, or: an upgrade gave the VMs away; exit with it once answered */
};

/*
 * Answers one request line (NUL-terminated, no newline, may be modified) into w, which the
 * caller initialised. May take cl->pass_fd (setting it to -1), set cl->closing (`quit`) and make
 * cl the owner of a capture. Never fails: errors are answers.
 */
void ctl_cmd_run(struct ops_ctl *c, struct ctl_client *cl, char *line, struct ops_jw *w);

/* Replaces whatever w holds with an error answer {"proto":1,"ok":false,"error":...,"errno":...}. */
void ctl_error_answer(struct ops_jw *w, int e, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/*
 * Ends the running capture, if any: detaches every tap, flushes the file and keeps its final
 * status for `capture status` with reason as "stopped_by".
 */
void ctl_capture_end(struct ops_ctl *c, const char *reason);

#endif
