/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target for the crash-survival record's readers (docs/upgrade.md, "Crash survival";
 * src/device/vhu_keep.h): a record of kind REC_KIND_CRASH and its fds come back from a keeper
 * that another, possibly buggy, process filled, so every reader of it must refuse what is
 * malformed without crashing, leaking, or mapping guest memory wrongly.
 *
 * Input: byte 0 bit 0: set the header's length, fd count and checksum right (as fuzz-rec.h);
 * bit 1: the fd store's mode (below); bytes 1..25: the kind of each fd (mod 5, as fuzz-vhurec:
 * an eventfd, a 1 MiB memfd, a connected Unix stream socket, a pipe, a listening socket); then
 * the record. Up to 25 fds come, one more than a record may name (VHU_KEEP_MAX_FDS).
 *
 * Record mode: dev_vhu_keep_peek(), then dev_vhu_adopt_offer() of the record as a sealed memfd
 * with duplicates of the fds, then what adopt_restore() reads of an offer (vhu.c: the list of
 * connections, vsock_engine_read_conns; the back-end, vhu_backend_restore then
 * vhu_backend_resume_adopted, with a device that touches the first and last byte of each ring it
 * is handed, so a ring outside the memory the record maps is an ASan report).
 * Fd store mode: the rest is the content of a stored index memfd (daemon/fdstore.c: header,
 * the ids of the fds, the record), stored as uvsock-crash-3-r1 next to the fds named
 * uvsock-crash-3-f<i>; daemon_fdstore_take() each, daemon_fdstore_start() for a configuration
 * with VM 3, then dev_vhu_adopt_clear() and daemon_fdstore_stop(). With bit 0 the index's magic
 * and sizes are set right and the record inside is sealed as above; bit 2 adds a newer
 * generation r2 one byte short (refused: r1 is the fallback); bit 3 adds an fd of VM 4 (not
 * configured) and one named uvsock-crash-3-x1 (not a name the store writes).
 *
 * Invariants: peek and offer agree (an offer is taken exactly when peek accepts a record that
 * has a connection) and refuse only with the errors vhu_keep.h names; the connection peek
 * returns is one of the fds; nothing closes an fd of ours; when everything is cleared, no fd is
 * left open; nothing crashes, hangs or leaks.
 */
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
#include <unistd.h>

#include "fuzz-input.h"
#include "fuzz-rec.h"
#include "device/vhu_keep.h"
#include "fdstore.h"
#include "options.h"
#include "util/log.h"
#include "util/macros.h"
#include "util/rec.h"
#include "vhost_user/backend.h"
#include "vsock/engine.h"

#define FZ_FDS (VHU_KEEP_MAX_FDS + 1)
#define FZ_MEMFD_SIZE (1u << 20)
#define FZ_CID 3u

#include "fuzz-vhu.h"

/* Malloc'd duplicates of fds (what a keeper hands over: dev_vhu_adopt_offer takes them). */
static int *fz_dup_fds(const int *fds, size_t nfds)
{
	int *d = malloc((nfds ? nfds : 1) * sizeof(*d));

	FZ_CHECK(d != NULL);
	for (size_t i = 0; i < nfds; i++) {
		d[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
		FZ_CHECK(d[i] >= 0);
	}
	return d;
}

/* The fields of the record's top level (vhu_keep.h; vhu.c's keep_fields). */
static const struct rec_field fz_fields[] = {
	{ VHU_KEEP_T_CID, REC_U32, true, "guest CID" },
	{ VHU_KEEP_T_BACKEND, REC_LIST, false, "vhost-user back-end" },
	{ VHU_KEEP_T_CONN, REC_U32, false, "connection" },
	{ VHU_KEEP_T_CONNS, REC_LIST, false, "connections" },
};

/*
 * What adopt_restore reads of a record peek accepted with a connection: the connections, then
 * the back-end, resumed as adopted. Every error is a refusal (the VM's device fails alone).
 */
static void fz_adopt(const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
	struct rec_val v[ARRAY_SIZE(fz_fields)] = { 0 };
	struct vsock_conn_addr *conns = NULL;
	struct vhu_backend_config cfg;
	struct vhu_backend *b = NULL;
	struct rec_reader root, sub;
	struct rec_doc doc;
	size_t nconns = 0;
	int e;

	FZ_CHECK(rec_open(&doc, buf, len, REC_KIND_CRASH, VHU_KEEP_VERSION, VHU_KEEP_VERSION, fds,
			  nfds) == 0);
	rec_root(&doc, &root, "crash record");
	FZ_CHECK(rec_scan(&root, fz_fields, ARRAY_SIZE(fz_fields), v) == 0);
	FZ_CHECK(v[1].present && v[2].present && v[2].u < nfds);
	vhu_backend_config_init(&cfg);
	cfg.features = VHU_BACKEND_OPTIONAL_FEATURES;
	cfg.offer_mq = true;
	cfg.guest_cid = (uint32_t)v[0].u;
	rec_root(&doc, &root, "crash record");
	e = 0;
	if (v[3].present) {
		e = rec_enter(&root, &v[3].it, "connections", &sub);
		if (e == 0)
			e = vsock_engine_read_conns(&sub, VHU_KEEP_MAX_CONNS, &conns, &nconns);
		rec_root(&doc, &root, "crash record");
	}
	if (e == 0) {
		FZ_CHECK(nconns == 0 || conns != NULL);
		for (size_t i = 0; i < nconns; i++) /* each one checked, as vsock/engine.h says */
			FZ_CHECK(conns[i].type == VSOCK_TYPE_STREAM ||
				 conns[i].type == VSOCK_TYPE_SEQPACKET);
		e = rec_enter(&root, &v[1].it, "vhost-user", &sub);
		if (e == 0)
			e = vhu_backend_restore(&sub, &cfg, &fz_ops, NULL, &b);
	}
	if (e == 0 && (e = rec_check_fds_claimed(&doc)) < 0) {
		vhu_backend_free(b);
		b = NULL;
	}
	if (e == 0) {
		/* The restore checked every ring that starts now (the device accepts all): only a
		 * running packed ring is refused (its next avail slot is unknown). */
		e = vhu_backend_resume_adopted(b);
		FZ_CHECK(e == 0 || e == -EOPNOTSUPP);
		vhu_backend_free(b);
	} else {
		FZ_CHECK(e == -EBADMSG || e == -EPROTONOSUPPORT || e == -E2BIG || e == -ENOMEM ||
			 e == -EINVAL || e == -ENOSPC || e == -EMFILE);
	}
	free(conns);
	rec_doc_fini(&doc);
}

static void fz_record(const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
	uint32_t cid = 0;
	int conn = -2, memfd, r, o;
	size_t nconns = 0;

	r = dev_vhu_keep_peek(buf, len, fds, nfds, &cid, &conn, &nconns);
	if (nfds > VHU_KEEP_MAX_FDS)
		FZ_CHECK(r == -E2BIG);
	if (r == 0) {
		bool found = conn == -1;

		for (size_t i = 0; i < nfds; i++)
			found |= conn == fds[i];
		FZ_CHECK(found);
	} else {
		FZ_CHECK(r == -EBADMSG || r == -EPROTONOSUPPORT || r == -E2BIG);
	}
	if (len == 0)
		return; /* rec_memfd makes no empty memfd; rec_map_fd refuses one anyway */
	FZ_CHECK(rec_memfd(buf, len, "fuzz-crashrec", &memfd) == 0);
	o = dev_vhu_adopt_offer(memfd, fz_dup_fds(fds, nfds), nfds);
	if (r == 0 && conn >= 0)
		FZ_CHECK(o == 0);
	else
		FZ_CHECK(o == (r == 0 ? -ENOENT : r));
	dev_vhu_adopt_clear();
	if (r == 0 && conn >= 0)
		fz_adopt(buf, len, fds, nfds);
}

/* The index header daemon/fdstore.c writes before the ids and the record. */
#define FZ_IDX_HDR 16u

static void fz_fdstore(uint8_t *blob, size_t len, const int *fds, size_t nfds, bool fix,
		       bool newer, bool strays)
{
	struct uvsockd_vm_config vm = { .guest_cid = FZ_CID };
	struct uvsockd_config cfg = { .n_vms = 1, .vms = &vm };
	char name[64];
	int memfd;

	if (fix && len >= FZ_IDX_HDR) {
		size_t n = blob[8] % (nfds + 1), rl;

		if (len >= FZ_IDX_HDR + 8 * n) {
			rl = len - FZ_IDX_HDR - 8 * n;
			memcpy(blob, "UVSKFDX1", 8);
			for (int i = 0; i < 4; i++) {
				blob[8 + i] = (uint8_t)(n >> (8 * i));
				blob[12 + i] = (uint8_t)(rl >> (8 * i));
			}
			if (rl >= REC_HDR_SIZE) {
				uint8_t *rec = blob + len - rl;

				for (int i = 0; i < 8; i++)
					rec[16 + i] = (uint8_t)((uint64_t)rl >> (8 * i));
				for (int i = 0; i < 4; i++)
					rec[24 + i] = i == 0 ? (uint8_t)n : 0;
				rec_reseal(rec, rl);
			}
		}
	}
	if (len) {
		FZ_CHECK(rec_memfd(blob, len, "uvsockd-fdstore", &memfd) == 0);
		daemon_fdstore_take(memfd, FDSTORE_PREFIX "3-r1");
	}
	if (newer && len > 1) {
		/* A newer generation that does not add up: refused, r1 is offered instead. */
		FZ_CHECK(rec_memfd(blob, len - 1, "uvsockd-fdstore", &memfd) == 0);
		daemon_fdstore_take(memfd, FDSTORE_PREFIX "3-r2");
	}
	if (strays) {
		/* An fd of a VM not configured and one of a name this module never writes. */
		memfd = eventfd(0, EFD_CLOEXEC);
		FZ_CHECK(memfd >= 0);
		daemon_fdstore_take(memfd, FDSTORE_PREFIX "4-f0");
		memfd = eventfd(0, EFD_CLOEXEC);
		FZ_CHECK(memfd >= 0);
		daemon_fdstore_take(memfd, FDSTORE_PREFIX "3-x1");
	}
	for (size_t i = 0; i < nfds; i++) {
		int d = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);

		FZ_CHECK(d >= 0);
		snprintf(name, sizeof(name), FDSTORE_PREFIX "%u-f%zu", FZ_CID, i);
		daemon_fdstore_take(d, name);
	}
	daemon_fdstore_start(&cfg);
	dev_vhu_adopt_clear();
	daemon_fdstore_settled();
	daemon_fdstore_stop();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fds[FZ_FDS], peers[FZ_FDS], before;
	size_t len, nfds;
	uint8_t *copy;

	log_set_level(LOG_LVL_ERROR);
	if (size < 1 + FZ_FDS)
		return 0;
	before = fz_count_fds();
	if (data[0] & 2) {
		/* The index: its fds as many as its header's count says, mod FZ_FDS + 1. */
		len = size - 1 - FZ_FDS;
		copy = malloc(len ? len : 1);
		FZ_CHECK(copy != NULL);
		memcpy(copy, data + 1 + FZ_FDS, len);
		nfds = len > 8 ? copy[8] % (FZ_FDS + 1) : 0;
	} else {
		copy = fz_record_input(data, size, FZ_FDS, &len, &nfds);
	}
	for (size_t i = 0; i < nfds; i++)
		fds[i] = fz_fd(data[1 + i], &peers[i]);
	if (data[0] & 2)
		fz_fdstore(copy, len, fds, nfds, data[0] & 1, data[0] & 4, data[0] & 8);
	else
		fz_record(copy, len, fds, nfds);
	for (size_t i = 0; i < nfds; i++) {
		FZ_CHECK(fcntl(fds[i], F_GETFD) >= 0);
		close(fds[i]);
		if (peers[i] >= 0)
			close(peers[i]);
	}
	free(copy);
	FZ_CHECK(fz_count_fds() == before);
	return 0;
}
