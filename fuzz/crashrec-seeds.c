/* SPDX-License-Identifier: MIT */
/*
 * Writes fuzz-crashrec's seeds (fuzz/corpus/crashrec) from records the real code writes: each
 * input of fuzz/corpus/vhurec that vhu_backend_restore() accepts becomes a back-end that
 * vhu_backend_snapshot() writes into a crash record laid out as vhu.c's keep_update() lays it
 * out (guest CID, connection index, back-end, connections), and the same record inside the fd
 * store's index (daemon/fdstore.c's idx_memfd: header, the id of each fd, the record). The list
 * of connections has the layout of vsock_engine_save_conns() (src/vsock/save.c), written here
 * since no engine runs. Also a drop record (CID only). Each file is named by its SHA-256 as
 * libFuzzer names inputs.
 *
 * Usage: fuzz-crashrec-seeds VHUREC-CORPUS-DIR OUT-DIR  (a one-off tool, not a test)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/vhu_keep.h"
#include "util/log.h"
#include "util/rec.h"
#include "vhost_user/backend.h"
#include "vsock/engine.h"

#define VHUREC_FDS 16
#define CRASH_FDS (VHU_KEEP_MAX_FDS + 1)
#define FZ_CID 3u

static int start(void *o, unsigned q, const struct vhu_vring_info *i)
{
	return 0;
}

static uint16_t stop(void *o, unsigned q)
{
	return 0;
}

static const struct vhu_backend_ops ops = { .queue_start = start, .queue_stop = stop };

static int mkfd(unsigned k)
{
	int sv[2], fd;
	sa_family_t fam = AF_UNIX;

	switch (k % 5) {
	case 0:
		return eventfd(0, EFD_CLOEXEC);
	case 1:
		fd = memfd_create("seed", MFD_CLOEXEC);
		if (fd >= 0 && ftruncate(fd, 1u << 20) < 0)
			return -1;
		return fd;
	case 2:
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			return -1;
		return sv[0]; /* the peer stays open for the tool's life */
	case 3:
		if (pipe2(sv, O_CLOEXEC) < 0)
			return -1;
		return sv[0];
	default:
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0 || bind(fd, (struct sockaddr *)&fam, sizeof(fam)) < 0 || listen(fd, 1) < 0)
			return -1;
		return fd;
	}
}

/* SHA-256 through sha256sum(1): the name libFuzzer gives an input. */
static int put(const char *dir, const uint8_t *p, size_t n)
{
	char tmp[4096], cmd[8300], sum[65];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s/.seed.tmp", dir);
	f = fopen(tmp, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0)
		return -1;
	snprintf(cmd, sizeof(cmd), "sha256sum '%s'", tmp);
	f = popen(cmd, "r");
	if (!f || fscanf(f, "%64s", sum) != 1) {
		if (f)
			pclose(f);
		return -1;
	}
	pclose(f);
	snprintf(cmd, sizeof(cmd), "%s/%s", dir, sum);
	return rename(tmp, cmd);
}

/* The kind (fuzz-crashrec's numbering) of fd: the back-end's fds are its own duplicates. */
static uint8_t kind_of(int fd)
{
	struct stat st;
	int acc = 0;
	socklen_t l = sizeof(acc);

	if (fstat(fd, &st) < 0)
		return 0;
	if (S_ISREG(st.st_mode))
		return 1;
	if (S_ISFIFO(st.st_mode))
		return 3;
	if (S_ISSOCK(st.st_mode))
		return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc ? 4 : 2;
	return 0; /* an eventfd */
}

/* Writes the record-mode and the fd-store-mode inputs of one crash record. */
static int emit(const char *out, const uint8_t *rec, size_t len, const int *wfds, size_t nfds)
{
	size_t idx = 16 + 8 * nfds, total = 1 + CRASH_FDS + idx + len;
	uint8_t *in = calloc(1, total);
	uint32_t n32 = (uint32_t)nfds, l32 = (uint32_t)len;
	int r;

	if (!in)
		return -1;
	for (size_t i = 0; i < nfds; i++)
		in[1 + i] = kind_of(wfds[i]);
	/* Record mode: byte 0, kinds, the record. */
	in[0] = 0;
	memcpy(in + 1 + CRASH_FDS, rec, len);
	r = put(out, in, 1 + CRASH_FDS + len);
	/* Fd store mode: the index (the fds named f0, f1... in order), then the record. */
	in[0] = 2;
	memcpy(in + 1 + CRASH_FDS, "UVSKFDX1", 8);
	memcpy(in + 1 + CRASH_FDS + 8, &n32, 4);
	memcpy(in + 1 + CRASH_FDS + 12, &l32, 4);
	for (size_t i = 0; i < nfds; i++) {
		uint64_t id = i;

		memcpy(in + 1 + CRASH_FDS + 16 + 8 * i, &id, 8);
	}
	memcpy(in + 1 + CRASH_FDS + idx, rec, len);
	if (r == 0)
		r = put(out, in, total);
	free(in);
	return r;
}

static void put_conn(struct rec_writer *w, uint32_t type, uint32_t lport, uint32_t cid,
		     uint32_t pport)
{
	rec_begin(w, 0x13); /* E_CONN, src/vsock/save.c */
	rec_put_u32(w, 1, type);
	rec_put_u32(w, 2, lport);
	rec_put_u32(w, 3, cid);
	rec_put_u32(w, 4, pport);
	rec_end(w);
}

int main(int argc, char **argv)
{
	struct dirent *de;
	DIR *d;
	int made = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: %s VHUREC-CORPUS-DIR OUT-DIR\n", argv[0]);
		return 2;
	}
	log_set_level(LOG_LVL_ERROR);
	d = opendir(argv[1]);
	if (!d)
		return 1;
	while ((de = readdir(d)) && made < 6) {
		char path[4096];
		uint8_t buf[1 << 16];
		int fds[VHUREC_FDS];
		struct vhu_backend_config cfg;
		struct vhu_backend *b = NULL;
		struct rec_reader rr;
		struct rec_doc doc;
		struct rec_writer w;
		const uint8_t *out;
		size_t n, len, nfds;
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", argv[1], de->d_name);
		f = fopen(path, "rb");
		if (!f)
			continue;
		n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		if (n < 1 + VHUREC_FDS + REC_HDR_SIZE)
			continue;
		len = n - 1 - VHUREC_FDS;
		nfds = buf[1 + VHUREC_FDS + 24] % (VHUREC_FDS + 1);
		for (size_t i = 0; i < nfds; i++)
			fds[i] = mkfd(buf[1 + i]);
		vhu_backend_config_init(&cfg);
		cfg.features = VHU_BACKEND_OPTIONAL_FEATURES;
		cfg.offer_mq = true;
		cfg.guest_cid = FZ_CID;
		if (rec_open(&doc, buf + 1 + VHUREC_FDS, len, REC_KIND_VHOST_USER, 1, 1, fds, nfds))
			continue; /* its fds stay open: a one-off tool */
		rec_root(&doc, &rr, "vhost-user");
		if (vhu_backend_restore(&rr, &cfg, &ops, NULL, &b) == 0 &&
		    rec_check_fds_claimed(&doc) == 0) {
			/* keep_update's layout (src/device/vhu.c). */
			rec_writer_init(&w, REC_KIND_CRASH, VHU_KEEP_VERSION);
			rec_put_u32(&w, VHU_KEEP_T_CID, FZ_CID);
			rec_put_u32(&w, VHU_KEEP_T_CONN, (uint32_t)w.nfds);
			rec_begin(&w, VHU_KEEP_T_BACKEND);
			if (vhu_backend_snapshot(b, &w) == 0) {
				rec_end(&w);
				rec_begin(&w, VHU_KEEP_T_CONNS);
				if (made % 2) {
					put_conn(&w, VSOCK_TYPE_STREAM, 1024, 2, 5000);
					put_conn(&w, VSOCK_TYPE_SEQPACKET, 1025, 2, 5001);
				}
				rec_end(&w);
				if (rec_writer_finish(&w, &out, &len) == 0 &&
				    emit(argv[2], out, len, w.fds, w.nfds) == 0)
					made++;
			}
			rec_writer_free(&w);
			vhu_backend_free(b);
		}
		rec_doc_fini(&doc);
	}
	closedir(d);
	/* A drop: the VM has no VMM any more. */
	{
		struct rec_writer w;
		const uint8_t *out;
		size_t len;

		rec_writer_init(&w, REC_KIND_CRASH, VHU_KEEP_VERSION);
		rec_put_u32(&w, VHU_KEEP_T_CID, FZ_CID);
		if (rec_writer_finish(&w, &out, &len) == 0 &&
		    emit(argv[2], out, len, NULL, 0) == 0)
			made++;
		rec_writer_free(&w);
	}
	printf("%d records written (2 inputs each)\n", made);
	return made > 1 ? 0 : 1;
}
