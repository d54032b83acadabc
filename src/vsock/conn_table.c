/* SPDX-License-Identifier: MIT */
/*
 * Connection table: per-bucket locked chained hash tables for connected and bound sockets, and
 * the Linux-compatible port allocator. See conn_table.h for the contract and lock rules.
 */
#include "vsock/conn_table.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/random.h>

#include "util/time.h"
#include "vsock/hdr.h"

struct ct_bucket {
	pthread_mutex_t lock;
	struct vsock_ct_node *head; /* Protected by lock */
};

struct vsock_conn_table {
	void (*ref)(struct vsock_ct_node *n, bool connected);
	uint32_t mask; /* buckets - 1, power of two */
	struct ct_bucket *conn;
	struct ct_bucket *bound;
	pthread_mutex_t port_lock;
	uint32_t port_cursor; /* Protected by port_lock; 0 = not seeded yet */
	_Atomic uint64_t conn_changes; /* connected inserts and removes (vsock_ct_conn_changes) */
};

static uint32_t mix32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static struct ct_bucket *conn_bucket(struct vsock_conn_table *t, uint32_t cid, uint32_t port,
				     uint32_t lport)
{
	uint32_t h = mix32(cid * 0x9e3779b1u ^ mix32(port ^ mix32(lport)));

	return &t->conn[h & t->mask];
}

static struct ct_bucket *bound_bucket(struct vsock_conn_table *t, uint32_t port)
{
	return &t->bound[mix32(port) & t->mask];
}

static struct ct_bucket *buckets_new(uint32_t n)
{
	struct ct_bucket *b = calloc(n, sizeof(*b));

	if (!b)
		return NULL;
	for (uint32_t i = 0; i < n; i++)
		pthread_mutex_init(&b[i].lock, NULL);
	return b;
}

static void buckets_free(struct ct_bucket *b, uint32_t n)
{
	if (!b)
		return;
	for (uint32_t i = 0; i < n; i++)
		pthread_mutex_destroy(&b[i].lock);
	free(b);
}

int vsock_conn_table_new(uint32_t capacity, void (*ref)(struct vsock_ct_node *n, bool connected),
			 struct vsock_conn_table **ret)
{
	struct vsock_conn_table *t;
	uint32_t n = 64;

	while (n < capacity && n < (1u << 16))
		n <<= 1;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ref = ref;
	t->mask = n - 1;
	t->conn = buckets_new(n);
	t->bound = buckets_new(n);
	if (!t->conn || !t->bound) {
		buckets_free(t->conn, n);
		buckets_free(t->bound, n);
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->port_lock, NULL);
	*ret = t;
	return 0;
}

void vsock_conn_table_free(struct vsock_conn_table *t)
{
	if (!t)
		return;
	buckets_free(t->conn, t->mask + 1);
	buckets_free(t->bound, t->mask + 1);
	pthread_mutex_destroy(&t->port_lock);
	free(t);
}

/* Keys n and puts it at the head of bucket b (under b's lock). */
static void link_node(struct ct_bucket *b, struct vsock_ct_node *n, uint32_t cid, uint32_t port,
		      uint32_t lport)
{
	n->cid = cid;
	n->port = port;
	n->lport = lport;
	n->next = b->head;
	n->linked = true;
	b->head = n;
}

static void unlink_node(struct ct_bucket *b, struct vsock_ct_node *n)
{
	for (struct vsock_ct_node **pp = &b->head; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			break;
		}
	}
	n->next = NULL;
	n->linked = false;
}

/* Unlinks n from bucket b if it is linked there (under b's lock). Returns whether it was. */
static bool bucket_remove(struct ct_bucket *b, struct vsock_ct_node *n)
{
	bool was;

	pthread_mutex_lock(&b->lock);
	was = n->linked;
	if (was)
		unlink_node(b, n);
	pthread_mutex_unlock(&b->lock);
	return was;
}

int vsock_ct_insert_connected(struct vsock_conn_table *t, struct vsock_ct_node *n,
			      uint32_t peer_cid, uint32_t peer_port, uint32_t local_port)
{
	struct ct_bucket *b = conn_bucket(t, peer_cid, peer_port, local_port);
	int r = 0;

	pthread_mutex_lock(&b->lock);
	if (n->linked) {
		r = -EINVAL;
		goto out;
	}
	for (struct vsock_ct_node *it = b->head; it; it = it->next) {
		if (it->cid == peer_cid && it->port == peer_port && it->lport == local_port) {
			r = -EEXIST;
			goto out;
		}
	}
	link_node(b, n, peer_cid, peer_port, local_port);
	atomic_fetch_add_explicit(&t->conn_changes, 1, memory_order_relaxed);
out:
	pthread_mutex_unlock(&b->lock);
	return r;
}

bool vsock_ct_remove_connected(struct vsock_conn_table *t, struct vsock_ct_node *n)
{
	/* The owner serialises insert/remove of its node, so the key read here is stable. */
	bool removed = bucket_remove(conn_bucket(t, n->cid, n->port, n->lport), n);

	if (removed)
		atomic_fetch_add_explicit(&t->conn_changes, 1, memory_order_relaxed);
	return removed;
}

uint64_t vsock_ct_conn_changes(struct vsock_conn_table *t)
{
	return atomic_load_explicit(&t->conn_changes, memory_order_relaxed);
}

struct vsock_ct_node *vsock_ct_lookup_connected(struct vsock_conn_table *t, uint32_t peer_cid,
						uint32_t peer_port, uint32_t local_port)
{
	struct ct_bucket *b = conn_bucket(t, peer_cid, peer_port, local_port);
	struct vsock_ct_node *found = NULL;

	pthread_mutex_lock(&b->lock);
	for (struct vsock_ct_node *it = b->head; it; it = it->next) {
		if (it->cid == peer_cid && it->port == peer_port && it->lport == local_port) {
			found = it;
			t->ref(it, true);
			break;
		}
	}
	pthread_mutex_unlock(&b->lock);
	return found;
}

static bool bound_conflict(struct ct_bucket *b, uint32_t cid, uint32_t port)
{
	for (struct vsock_ct_node *it = b->head; it; it = it->next) {
		if (it->port != port)
			continue;
		if (it->cid == cid || it->cid == VMADDR_CID_ANY || cid == VMADDR_CID_ANY)
			return true;
	}
	return false;
}

int vsock_ct_insert_bound(struct vsock_conn_table *t, struct vsock_ct_node *n, uint32_t cid,
			  uint32_t port)
{
	struct ct_bucket *b;
	int r = 0;

	if (port == VMADDR_PORT_ANY)
		return -EINVAL;
	b = bound_bucket(t, port);
	pthread_mutex_lock(&b->lock);
	if (n->linked) {
		r = -EINVAL;
		goto out;
	}
	if (bound_conflict(b, cid, port)) {
		r = -EADDRINUSE;
		goto out;
	}
	link_node(b, n, cid, port, 0);
out:
	pthread_mutex_unlock(&b->lock);
	return r;
}

static uint32_t random_u32(void)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v))
		return v;
	uint64_t t = mono_ns();

	return mix32((uint32_t)(t % NS_PER_SEC) ^ (uint32_t)(t / NS_PER_SEC));
}

int vsock_ct_bind_auto(struct vsock_conn_table *t, struct vsock_ct_node *n, uint32_t cid,
		       uint32_t lo, uint32_t hi, uint32_t *ret_port)
{
	int r = -EADDRNOTAVAIL;

	if (lo == 0 && hi == 0) {
		lo = VSOCK_LAST_RESERVED_PORT + 1;
		hi = VMADDR_PORT_ANY - 1;
	}
	if (hi == VMADDR_PORT_ANY)
		hi--;
	if (lo > hi)
		return -EINVAL;

	pthread_mutex_lock(&t->port_lock);
	if (t->port_cursor == 0) {
		uint64_t span = (uint64_t)hi - lo + 1;
		t->port_cursor = lo + (uint32_t)(random_u32() % span);
	}
	for (int i = 0; i < VSOCK_CT_MAX_PORT_RETRIES; i++) {
		uint32_t port;

		if (t->port_cursor < lo || t->port_cursor > hi)
			t->port_cursor = lo;
		port = t->port_cursor++;
		r = vsock_ct_insert_bound(t, n, cid, port);
		if (r == 0) {
			*ret_port = port;
			break;
		}
		if (r != -EADDRINUSE)
			break;
		r = -EADDRNOTAVAIL;
	}
	pthread_mutex_unlock(&t->port_lock);
	return r;
}

bool vsock_ct_remove_bound(struct vsock_conn_table *t, struct vsock_ct_node *n)
{
	return bucket_remove(bound_bucket(t, n->port), n);
}

struct vsock_ct_node *vsock_ct_lookup_bound(struct vsock_conn_table *t, uint32_t cid,
					    uint32_t port)
{
	struct ct_bucket *b = bound_bucket(t, port);
	struct vsock_ct_node *exact = NULL, *any = NULL;

	pthread_mutex_lock(&b->lock);
	for (struct vsock_ct_node *it = b->head; it; it = it->next) {
		if (it->port != port)
			continue;
		if (it->cid == cid) {
			exact = it;
			break;
		}
		if (it->cid == VMADDR_CID_ANY && !any)
			any = it;
	}
	if (!exact)
		exact = any;
	if (exact)
		t->ref(exact, false);
	pthread_mutex_unlock(&b->lock);
	return exact;
}

void vsock_ct_set_port_cursor(struct vsock_conn_table *t, uint32_t cursor)
{
	pthread_mutex_lock(&t->port_lock);
	t->port_cursor = cursor;
	pthread_mutex_unlock(&t->port_lock);
}

uint32_t vsock_ct_port_cursor(struct vsock_conn_table *t)
{
	uint32_t c;

	pthread_mutex_lock(&t->port_lock);
	c = t->port_cursor;
	pthread_mutex_unlock(&t->port_lock);
	return c;
}
