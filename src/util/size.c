/* SPDX-License-Identifier: MIT */
/* Byte counts with K/M/G/T suffixes (see size.h). */
#include "util/size.h"

#include <errno.h>
#include <string.h>

int size_parse(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	static const char suffixes[] = "KMGT";
	uint64_t v = 0;
	unsigned shift = 0;
	const char *p = s;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - d) / 10)
			return -ERANGE;
		v = v * 10 + d;
	}
	if (*p) {
		char c = *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
		const char *q = strchr(suffixes, c);

		if (!q || !c || p[1])
			return -EINVAL;
		shift = 10u * (unsigned)(q - suffixes + 1);
		if (v > (UINT64_MAX >> shift))
			return -ERANGE;
		v <<= shift;
	}
	if (v < min || v > max)
		return -ERANGE;
	*ret = v;
	return 0;
}
