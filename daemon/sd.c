/* SPDX-License-Identifier: MIT */
/*
 * uvsockd's inherited sockets and readiness notification (see sd.h): --fd checks, the match of
 * socket-activated fds to VMs, and sd_notify.
 */
#include "sd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "fdstore.h"
#include "util/log.h"
#include "util/uds.h"

/* The VM an activated socket belongs to: by its bound address, else by its name; or -1. */
static int match_vm(const struct uvsockd_config *cfg, int fd, const char *name)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);
	bool have_addr;

	memset(&sa, 0, sizeof(sa));
	have_addr = getsockname(fd, (struct sockaddr *)&sa, &len) == 0 &&
		    len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0];
	for (unsigned i = 0; have_addr && i < cfg->n_vms; i++)
		if (cfg->vms[i].fd <= 0 && strcmp(cfg->vms[i].socket_path, sa.sun_path) == 0)
			return (int)i;
	for (unsigned i = 0; name && i < cfg->n_vms; i++) {
		const char *p = cfg->vms[i].socket_path;

		if (cfg->vms[i].fd <= 0 &&
		    (strcmp(name, p) == 0 || strcmp(name, basename(p)) == 0 ||
		     (cfg->vms[i].name[0] && strcmp(name, cfg->vms[i].name) == 0)))
			return (int)i;
	}
	return -1;
}

static int adopt_activated(const struct uvsockd_config *cfg, char *err, size_t errlen)
{
	char **names = NULL;
	int n = sd_listen_fds_with_names(1, &names), r = 0;

	if (n < 0) {
		snprintf(err, errlen, "socket activation (LISTEN_FDS): %s", strerror(-n));
		return n;
	}
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i, vm;
		const char *name = names ? names[i] : NULL;

		if (r < 0) {
			close(fd);
			continue;
		}
		/* The fd store's (crash survival, fdstore.h) come back beside the sockets. */
		if (name && strncmp(name, FDSTORE_PREFIX, strlen(FDSTORE_PREFIX)) == 0) {
			daemon_fdstore_take(fd, name);
			continue;
		}
		if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
			snprintf(err, errlen,
				 "socket activation: fd %d (%s) is not a listening AF_UNIX stream "
				 "socket", fd, name ? name : "no name");
			r = -ENOTSOCK;
			close(fd);
			continue;
		}
		vm = match_vm(cfg, fd, name);
		if (vm < 0) {
			snprintf(err, errlen,
				 "socket activation: fd %d (%s) is no VM's socket (match: the VM's "
				 "socket path, or its basename or name= as FileDescriptorName=)", fd,
				 name ? name : "no name");
			r = -ENOENT;
			close(fd);
			continue;
		}
		r = uds_adopt(cfg->vms[vm].socket_path, fd);
		if (r < 0) {
			snprintf(err, errlen, "socket activation: fd %d: %s has a socket already",
				 fd, cfg->vms[vm].socket_path);
			close(fd);
			continue;
		}
		(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
		log_info("vm%u: socket-activated vhost-user socket %s (fd %d, %s)",
			 cfg->vms[vm].guest_cid, cfg->vms[vm].socket_path, fd,
			 name ? name : "no name");
	}
	for (int i = 0; names && names[i]; i++)
		free(names[i]);
	free(names);
	return r;
}

int daemon_sd_adopt(const struct uvsockd_config *cfg, char *err, size_t errlen)
{
	for (unsigned i = 0; i < cfg->n_vms; i++) {
		const struct uvsockd_vm_config *v = &cfg->vms[i];
		bool listening = false;
		int r;

		if (v->fd <= 0)
			continue;
		r = uds_check_fd(v->fd, SOCK_STREAM, &listening);
		if (r < 0) {
			const char *why = r == -EBADF ? "not open" :
					  r == -EPROTOTYPE ? "not a stream socket" :
					  r == -ENOTSOCK ? "not a Unix socket" : strerror(-r);

			snprintf(err, errlen,
				 "guest-cid %u: fd %d: %s (a vhost-user socket is needed: an "
				 "AF_UNIX stream socket, listening or connected)", v->guest_cid,
				 v->fd, why);
			return r;
		}
		r = uds_adopt(v->socket_path, v->fd);
		if (r < 0) {
			snprintf(err, errlen, "guest-cid %u: fd %d: %s", v->guest_cid, v->fd,
				 strerror(-r));
			return r;
		}
		(void)fcntl(v->fd, F_SETFD, FD_CLOEXEC);
		log_info("vm%u: vhost-user socket is the inherited fd %d (%s)", v->guest_cid, v->fd,
			 listening ? "listening" : "connected");
	}
	return adopt_activated(cfg, err, errlen);
}

void daemon_sd_ready(unsigned n_vms, unsigned n_workers)
{
	if (n_workers)
		(void)sd_notifyf(0, "READY=1\nSTATUS=serving %u VM%s in %u worker process%s",
				 n_vms, n_vms == 1 ? "" : "s", n_workers,
				 n_workers == 1 ? "" : "es");
	else
		(void)sd_notifyf(0, "READY=1\nSTATUS=serving %u VM%s", n_vms,
				 n_vms == 1 ? "" : "s");
}

void daemon_sd_mainpid(void)
{
	(void)sd_notifyf(0, "MAINPID=%d", (int)getpid());
}

void daemon_sd_stopping(void)
{
	(void)sd_notify(0, "STOPPING=1\nSTATUS=stopping");
}
