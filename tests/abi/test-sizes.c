/* SPDX-License-Identifier: MIT */
/*
 * Structs that grow (docs/api.md): every entry point taking an option, config or stats struct
 * checks its size field. Unset (0) or too small: EINVAL. Larger than the library's struct: fine
 * while the unknown tail is zero, EINVAL once a byte of it is set. Stats: the caller's extra
 * tail is zeroed and size says how much was filled. Also src/util/abisize.h on its own.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uvsock/device.h>
#include <uvsock/guest.h>
#include <uvsock/uvsock.h>

#include "test.h"
#include "util/abisize.h"

#define ASSERT_ERRNO(call, e)                                                                      \
	do {                                                                                       \
		errno = 0;                                                                         \
		ASSERT_TRUE(!(call));                                                              \
		ASSERT_EQ(errno, e);                                                               \
	} while (0)

/* A caller compiled against a newer header: the struct plus 16 bytes the library lacks. */
#define NEWER(type)                                                                                \
	struct {                                                                                   \
		type s;                                                                            \
		unsigned char more[16];                                                            \
	}

TEST(helpers)
{
	struct { uint32_t size; uint32_t a, b; } lib, in = { 12, 7, 9 };
	struct { uint32_t size; uint32_t a; } old = { 8, 5 };
	unsigned char big[24] = { 0 };

	ASSERT_EQ(ABI_SIZE_0(struct uvsock_loopback_opts, max_sockets), 12);
	ASSERT_EQ(abi_struct_in(&lib, sizeof(lib), &in, 8), 0);
	ASSERT_EQ(lib.b, 9);
	ASSERT_EQ(abi_struct_in(&lib, sizeof(lib), &old, 8), 0);
	ASSERT_EQ(lib.a, 5);
	ASSERT_EQ(lib.b, 0); /* what the old caller did not have reads as zero */
	old.size = 4;
	ASSERT_EQ(abi_struct_in(&lib, sizeof(lib), &old, 8), -EINVAL);
	big[0] = sizeof(big);
	ASSERT_EQ(abi_struct_in(&lib, sizeof(lib), big, 8), 0);
	big[20] = 1;
	ASSERT_EQ(abi_struct_in(&lib, sizeof(lib), big, 8), -EINVAL);
	memset(big, 0xff, sizeof(big));
	big[0] = sizeof(big), big[1] = big[2] = big[3] = 0;
	ASSERT_EQ(abi_struct_out(big, &in, sizeof(in), 8), 0);
	ASSERT_EQ(big[0], 12);
	ASSERT_EQ(big[4], 7);
	ASSERT_EQ(big[23], 0);
	old = (typeof(old)){ 8, 0 };
	ASSERT_EQ(abi_struct_out(&old, &in, sizeof(in), 8), 0);
	ASSERT_EQ(old.size, 8);
	ASSERT_EQ(old.a, 7);
}

TEST(loopback_opts_and_ctx_stats)
{
	struct uvsock_loopback_opts o = { .size = 0 };
	NEWER(struct uvsock_loopback_opts) n = { .s = { .size = sizeof(n), .max_sockets = 8 } };
	NEWER(struct uvsock_ctx_stats) ns;
	struct uvsock_ctx_stats st = { .size = sizeof(st) };
	struct uvsock_ctx *ctx;

	ASSERT_ERRNO(uvsock_ctx_new_loopback(&o), EINVAL);
	o.size = 4;
	ASSERT_ERRNO(uvsock_ctx_new_loopback(&o), EINVAL);
	n.more[3] = 1;
	ASSERT_ERRNO(uvsock_ctx_new_loopback((struct uvsock_loopback_opts *)&n), EINVAL);
	n.more[3] = 0;
	ctx = uvsock_ctx_new_loopback((struct uvsock_loopback_opts *)&n);
	ASSERT_TRUE(ctx != NULL);

	st.size = 0;
	ASSERT_EQ(uvsock_ctx_get_stats(ctx, &st), -1);
	ASSERT_EQ(errno, EINVAL);
	st.size = sizeof(st);
	ASSERT_EQ(uvsock_ctx_get_stats(ctx, &st), 0);
	ASSERT_EQ(st.size, sizeof(st));
	memset(&ns, 0xee, sizeof(ns));
	ns.s.size = sizeof(ns);
	ASSERT_EQ(uvsock_ctx_get_stats(ctx, (struct uvsock_ctx_stats *)&ns), 0);
	ASSERT_EQ(ns.s.size, sizeof(struct uvsock_ctx_stats));
	ASSERT_EQ(ns.s.socks_open, 0);
	for (size_t i = 0; i < sizeof(ns.more); i++)
		ASSERT_EQ(ns.more[i], 0);
	uvsock_ctx_free(ctx);
}

TEST(guest_opts)
{
	struct uvsock_guest_opts o = { .size = 0, .timeout_ms = 100 };
	struct uvsock_guest_stats gs = { .size = sizeof(gs) };

	/* Refused before any connect: the path need not exist. */
	ASSERT_ERRNO(uvsock_ctx_new_guest("/nonexistent/uvsock-abi.sock", &o), EINVAL);
	o.size = sizeof(o) - 4;
	ASSERT_ERRNO(uvsock_ctx_new_guest("/nonexistent/uvsock-abi.sock", &o), EINVAL);
	ASSERT_EQ(uvsock_ctx_guest_get_stats(NULL, &gs), -1);
	ASSERT_EQ(errno, EINVAL);
}

TEST(dev_config_queue_stats)
{
	char dir[] = "/tmp/uvsock-abi-XXXXXX", path[64];
	struct uvsock_dev_config cfg = { .guest_cid = 3 };
	NEWER(struct uvsock_dev_stats) ns;
	struct uvsock_dev_stats st = { .size = 0 };
	struct uvsock_dev_queue q = { .size = 0, .num = 128, .kick_fd = 0, .call_fd = -1 };
	struct uvsock_dev *d;

	ASSERT_TRUE(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/vm.vsock", dir);
	cfg.uds_path = path;
	ASSERT_EQ(uvsock_dev_new(&cfg, &d), -EINVAL); /* size 0 */
	/* The first version ended at flags (dgram_max came later): still served. */
	cfg.size = offsetof(struct uvsock_dev_config, flags) + sizeof(cfg.flags);
	ASSERT_EQ(uvsock_dev_new(&cfg, &d), 0);
	uvsock_dev_free(d);
	cfg.size = sizeof(cfg);
	ASSERT_EQ(uvsock_dev_new(&cfg, &d), 0);
	ASSERT_EQ(uvsock_dev_get_stats(d, &st), -EINVAL);
	ASSERT_EQ(uvsock_dev_queue_start(d, 0, &q), -EINVAL);
	memset(&ns, 0xee, sizeof(ns));
	ns.s.size = sizeof(ns);
	ASSERT_EQ(uvsock_dev_get_stats(d, (struct uvsock_dev_stats *)&ns), 0);
	ASSERT_EQ(ns.s.size, sizeof(struct uvsock_dev_stats));
	ASSERT_EQ(ns.s.running, 0);
	ASSERT_EQ(ns.more[15], 0);
	uvsock_dev_free(d);
	ASSERT_EQ(rmdir(dir), 0);
}

TEST_MAIN()
