/* SPDX-License-Identifier: MIT */
/*
 * util/uds: the listen policy for a path that exists (nothing there, a stale socket file, a live
 * listener, a socket bound by another type, not a socket) and the inode-checked removal.
 */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "test.h"
#include "util/uds.h"

struct dir {
	char dir[64];
	char path[96];
};

static void dir_init(struct dir *d)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/uvsock-uds-XXXXXX");
	ASSERT_TRUE(mkdtemp(d->dir) != NULL);
	snprintf(d->path, sizeof(d->path), "%s/s", d->dir);
}

static void dir_fini(struct dir *d)
{
	unlink(d->path);
	rmdir(d->dir);
}

/* A socket of `type` bound at path, listening if `listening`; returns its fd. */
static int bound_at(const char *path, int type, bool listening)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, type, 0);

	ASSERT_GE(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	ASSERT_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	if (listening)
		ASSERT_OK(listen(fd, 4));
	return fd;
}

static ino_t inode_of(const char *path)
{
	struct stat st;

	ASSERT_OK(lstat(path, &st));
	return st.st_ino;
}

TEST(fresh_path_listens)
{
	struct uds_listener l;
	struct dir d;

	dir_init(&d);
	ASSERT_EQ(uds_probe(d.path, SOCK_STREAM), 0);
	ASSERT_OK(uds_listen(d.path, SOCK_STREAM, 4, 0600, &l));
	ASSERT_EQ(l.flags, 0);
	ASSERT_EQ(uds_probe(d.path, SOCK_STREAM), -EADDRINUSE);
	close(l.fd);
	ASSERT_TRUE(uds_unlink_owned(d.path, &l));
	dir_fini(&d);
}

TEST(stale_socket_is_replaced)
{
	struct uds_listener l;
	struct dir d;

	dir_init(&d);
	close(bound_at(d.path, SOCK_STREAM, true));
	ASSERT_EQ(uds_probe(d.path, SOCK_STREAM), 0);
	ASSERT_OK(uds_listen(d.path, SOCK_STREAM, 4, 0, &l));
	ASSERT_EQ(l.flags, UDS_REPLACED_STALE);
	close(l.fd);
	dir_fini(&d);
}

/*
 * A socket of bound_type (listening if asked) at a fresh path: uds_listen of listen_type must
 * refuse it with -EADDRINUSE and leave the very file in place.
 */
static void refused_untouched(int bound_type, bool listening, int listen_type)
{
	struct uds_listener l;
	struct dir d;
	int fd;
	ino_t ino;

	dir_init(&d);
	fd = bound_at(d.path, bound_type, listening);
	ino = inode_of(d.path);
	ASSERT_ERR(uds_probe(d.path, listen_type), EADDRINUSE);
	ASSERT_ERR(uds_listen(d.path, listen_type, 4, 0, &l), EADDRINUSE);
	ASSERT_EQ(inode_of(d.path), ino);
	close(fd);
	dir_fini(&d);
}

TEST(live_listener_is_left_alone)
{
	refused_untouched(SOCK_STREAM, true, SOCK_STREAM);
}

/* A live socket of the other type is somebody's too: never unlinked as if it were stale. */
TEST(live_socket_of_other_type_is_left_alone)
{
	refused_untouched(SOCK_STREAM, true, SOCK_SEQPACKET);
	refused_untouched(SOCK_DGRAM, false, SOCK_STREAM);
}

TEST(not_a_socket_is_eexist)
{
	struct uds_listener l;
	struct dir d;
	FILE *f;

	dir_init(&d);
	f = fopen(d.path, "w");
	ASSERT_TRUE(f != NULL);
	fclose(f);
	ASSERT_ERR(uds_listen(d.path, SOCK_STREAM, 4, 0, &l), EEXIST);
	dir_fini(&d);
}

/*
 * Our file removed and another socket bound at the path meanwhile: not ours, kept. Checked while
 * our socket is still open, as uds.h asks (closed, its inode number may go to the newcomer).
 */
TEST(unlink_owned_spares_a_newer_socket)
{
	struct uds_listener l;
	struct dir d;
	int fd;

	dir_init(&d);
	ASSERT_OK(uds_listen(d.path, SOCK_STREAM, 4, 0, &l));
	ASSERT_OK(unlink(d.path));
	fd = bound_at(d.path, SOCK_STREAM, true);
	ASSERT_FALSE(uds_unlink_owned(d.path, &l));
	ASSERT_OK(access(d.path, F_OK));
	close(l.fd);
	close(fd);
	dir_fini(&d);
}

TEST_MAIN()
