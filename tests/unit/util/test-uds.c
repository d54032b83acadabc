/* SPDX-License-Identifier: MIT */
/*
 * util/uds: the listen policy for a path that exists (nothing there, a stale socket file, a live
 * listener, a socket bound by another type, not a socket) and the inode-checked removal; the
 * owner's PID of a live listener, the fd check, the default permissions and adopted sockets.
 */
#include <fcntl.h>
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

TEST(probe_names_the_owner)
{
	struct dir d;
	pid_t owner = -1;
	int l;

	dir_init(&d);
	ASSERT_EQ(uds_probe_owner(d.path, SOCK_STREAM, &owner), 0);
	ASSERT_EQ(owner, 0);
	l = bound_at(d.path, SOCK_STREAM, true);
	ASSERT_EQ(uds_probe_owner(d.path, SOCK_STREAM, &owner), -EADDRINUSE);
	ASSERT_EQ(owner, getpid());
	close(l);
	ASSERT_EQ(uds_probe_owner(d.path, SOCK_STREAM, &owner), 0);
	ASSERT_EQ(owner, 0);
	dir_fini(&d);
}

TEST(check_fd_tells_listening_connected_and_wrong)
{
	struct dir d;
	bool listening = false;
	int l, sp[2], pfd[2];

	dir_init(&d);
	l = bound_at(d.path, SOCK_STREAM, true);
	ASSERT_OK(uds_check_fd(l, SOCK_STREAM, &listening));
	ASSERT_TRUE(listening);
	ASSERT_ERR(uds_check_fd(l, SOCK_SEQPACKET, &listening), EPROTOTYPE);
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp));
	ASSERT_OK(uds_check_fd(sp[0], SOCK_STREAM, &listening));
	ASSERT_FALSE(listening);
	ASSERT_OK(pipe(pfd));
	ASSERT_ERR(uds_check_fd(pfd[0], SOCK_STREAM, &listening), ENOTSOCK);
	close(pfd[0]);
	ASSERT_ERR(uds_check_fd(pfd[0], SOCK_STREAM, &listening), EBADF);
	/* Neither listening nor connected. */
	close(pfd[1]);
	pfd[1] = socket(AF_UNIX, SOCK_STREAM, 0);
	ASSERT_ERR(uds_check_fd(pfd[1], SOCK_STREAM, &listening), ENOTCONN);
	close(pfd[1]);
	close(sp[0]);
	close(sp[1]);
	close(l);
	dir_fini(&d);
}

TEST(default_perms_apply_to_mode_0_only)
{
	struct uds_listener l, l2;
	struct stat st;
	struct dir d;
	char p2[128];

	dir_init(&d);
	snprintf(p2, sizeof(p2), "%s/t", d.dir);
	uds_set_default_perms(0640, getegid());
	ASSERT_OK(uds_listen(d.path, SOCK_STREAM, 4, 0, &l));
	ASSERT_OK(lstat(d.path, &st));
	ASSERT_EQ(st.st_mode & 07777, 0640);
	ASSERT_EQ(st.st_gid, getegid());
	/* An explicit mode (the control socket's 0600) is kept. */
	ASSERT_OK(uds_listen(p2, SOCK_STREAM, 4, 0600, &l2));
	ASSERT_OK(lstat(p2, &st));
	ASSERT_EQ(st.st_mode & 07777, 0600);
	uds_set_default_perms(0, (gid_t)-1);
	ASSERT_TRUE(uds_unlink_owned(p2, &l2));
	close(l2.fd);
	close(l.fd);
	dir_fini(&d);
}

TEST(adopted_socket_stands_for_its_path)
{
	struct uds_listener l;
	struct dir d;
	ino_t ino;
	int fd, sp[2];

	dir_init(&d);
	fd = bound_at(d.path, SOCK_STREAM, true);
	ino = inode_of(d.path);
	/* The live listener is ours to use, not an -EADDRINUSE, once adopted for its path. */
	ASSERT_OK(uds_adopt(d.path, fd));
	ASSERT_ERR(uds_adopt(d.path, fd), EEXIST);
	ASSERT_TRUE(uds_is_adopted(d.path));
	ASSERT_OK(uds_listen(d.path, SOCK_STREAM, 4, 0, &l));
	ASSERT_EQ(l.fd, fd);
	ASSERT_EQ(l.flags, UDS_INHERITED);
	ASSERT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
	ASSERT_FALSE(uds_is_adopted(d.path));
	/* Its file is not ours to remove. */
	ASSERT_FALSE(uds_unlink_owned(d.path, &l));
	ASSERT_EQ(inode_of(d.path), ino);
	close(l.fd);
	/* A connected socket cannot be a listener: refused and closed. */
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp));
	ASSERT_OK(uds_adopt("/dev/fd/x", sp[0]));
	ASSERT_ERR(uds_listen("/dev/fd/x", SOCK_STREAM, 4, 0, &l), EINVAL);
	ASSERT_EQ(fcntl(sp[0], F_GETFD), -1);
	ASSERT_ERR(uds_take_adopted("/dev/fd/x"), ENOENT);
	close(sp[1]);
	dir_fini(&d);
}

TEST(drop_adopted_closes_what_nobody_took)
{
	int a[2], b[2];

	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, a));
	ASSERT_OK(socketpair(AF_UNIX, SOCK_STREAM, 0, b));
	ASSERT_OK(uds_adopt("/dev/fd/a", a[0]));
	ASSERT_OK(uds_adopt("/dev/fd/b", b[0]));
	ASSERT_EQ(uds_take_adopted("/dev/fd/a"), a[0]);
	uds_drop_adopted();
	ASSERT_FALSE(uds_is_adopted("/dev/fd/b"));
	ASSERT_EQ(fcntl(b[0], F_GETFD), -1);
	/* The peer of the dropped one sees the end; the taken one is still open. */
	ASSERT_EQ(read(b[1], &(char){ 0 }, 1), 0);
	ASSERT_GE(fcntl(a[0], F_GETFD), 0);
	close(a[0]);
	close(a[1]);
	close(b[1]);
}

TEST_MAIN()
