/* SPDX-License-Identifier: MIT */
/*
 * The input layout the two state-record targets share (fuzz-devrec.c, fuzz-vhurec.c): byte 0's
 * bit 0 asks for the record header's length, fd count and checksum to be set right (so that the
 * input reaches the item walk, not only the header checks), the next nkinds bytes name the kinds
 * of the fds to pass, and the rest is the record. Header-only, after fuzz-input.h.
 */
#ifndef UVSOCK_FUZZ_REC_H
#define UVSOCK_FUZZ_REC_H

#include "util/rec.h"

/*
 * The record part of data (size >= 1 + nkinds) as a malloc'd copy, fixed as byte 0 asks; its
 * length in *ret_len and how many fds go with it in *ret_nfds (the header's fd count, modulo
 * nkinds + 1; 0 for a record shorter than its header).
 */
static inline uint8_t *fz_record_input(const uint8_t *data, size_t size, size_t nkinds,
				       size_t *ret_len, size_t *ret_nfds)
{
	size_t len = size - 1 - nkinds, nfds;
	uint8_t *copy = malloc(len ? len : 1);

	FZ_CHECK(copy != NULL);
	memcpy(copy, data + 1 + nkinds, len);
	nfds = len >= REC_HDR_SIZE ? copy[24] % (nkinds + 1) : 0;
	if ((data[0] & 1) && len >= REC_HDR_SIZE) {
		for (int i = 0; i < 8; i++)
			copy[16 + i] = (uint8_t)((uint64_t)len >> (8 * i));
		for (int i = 0; i < 4; i++)
			copy[24 + i] = i == 0 ? (uint8_t)nfds : 0;
		rec_reseal(copy, len);
	}
	*ret_len = len;
	*ret_nfds = nfds;
	return copy;
}

#endif
