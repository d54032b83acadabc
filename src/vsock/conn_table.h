/* SPDX-License-Identifier: MIT */
/*
 * The connection table: two hash tables of intrusive nodes, one for connected sockets keyed by
 * (peer cid, peer port, local port) and one for bound sockets keyed by (local cid or CID_ANY,
 * port), plus the port allocator of Linux net/vmw_vsock/af_vsock.c, __vsock_bind_connectible()
 * (docs/vsock-protocol.md §2.4).
 *
 * Each bucket has its own mutex, so lookups on the data path never take a table-wide lock.
 * The table does not own what it links: the owner embeds a struct vsock_ct_node per table,
 * manages the lifetime, and supplies a `ref` callback that lookups call, under the bucket lock,
 * on the node they return; so a node found by a lookup stays valid even if another thread
 * removes it right after. The owner must remove a node before freeing it.
 *
 * Lock order: a bucket lock is a leaf lock (nothing else is taken while holding it except the
 * `ref` callback, which must not block). Callers may hold their own object locks while calling
 * any function here.
 */
#ifndef UVSOCK_VSOCK_CONN_TABLE_H
#define UVSOCK_VSOCK_CONN_TABLE_H

#include <stdbool.h>
#include <stdint.h>

/* Embedded in the owner's object, one per table it may be linked in. */
struct vsock_ct_node {
	struct vsock_ct_node *next; /* Protected by the bucket lock */
	uint32_t cid;               /* connected: peer cid; bound: local cid or VMADDR_CID_ANY */
	uint32_t port;              /* connected: peer port; bound: local port */
	uint32_t lport;             /* connected: local port; bound: unused */
	bool linked;                /* Protected by the bucket lock */
};

struct vsock_conn_table;

/*
 * Creates a table sized for about `capacity` entries per kind. `ref` is called on a node found
 * by a lookup, with its bucket lock held, to take a reference for the caller; `connected` says
 * which table the node is linked in.
 * Returns 0, -ENOMEM.
 */
int vsock_conn_table_new(uint32_t capacity, void (*ref)(struct vsock_ct_node *n, bool connected),
			 struct vsock_conn_table **ret);
/* Frees the table (not the nodes still linked). Safe on NULL. */
void vsock_conn_table_free(struct vsock_conn_table *t);

/*
 * Links n as connected (peer_cid, peer_port, local_port).
 * Returns 0, -EEXIST (that tuple is already connected), -EINVAL (n already linked).
 */
int vsock_ct_insert_connected(struct vsock_conn_table *t, struct vsock_ct_node *n,
			      uint32_t peer_cid, uint32_t peer_port, uint32_t local_port);
/* Unlinks n from the connected table. Returns true if it was linked. */
bool vsock_ct_remove_connected(struct vsock_conn_table *t, struct vsock_ct_node *n);
/* Changes with every insert and remove of the connected table (any thread; relaxed). */
uint64_t vsock_ct_conn_changes(struct vsock_conn_table *t);
/* Finds the connected node for the tuple and refs it, or returns NULL. */
struct vsock_ct_node *vsock_ct_lookup_connected(struct vsock_conn_table *t, uint32_t peer_cid,
						uint32_t peer_port, uint32_t local_port);

/*
 * Links n as bound to (cid, port); cid may be VMADDR_CID_ANY. A port conflicts with an existing
 * entry of the same port if either cid is CID_ANY or both are equal (Linux
 * __vsock_find_bound_socket).
 * Returns 0, -EADDRINUSE, -EINVAL (n already linked or port is VMADDR_PORT_ANY).
 */
int vsock_ct_insert_bound(struct vsock_conn_table *t, struct vsock_ct_node *n, uint32_t cid,
			  uint32_t port);
/*
 * Binds n to (cid, an automatically chosen port) as Linux does: a cursor seeded at random in
 * [lo, hi] is post-incremented per attempt, wrapping to lo past hi; never VMADDR_PORT_ANY;
 * at most 24 attempts. lo/hi = 0/0 means [1024, 0xfffffffe].
 * Returns 0 and the port in *ret_port, -EADDRNOTAVAIL (24 ports in use), -EINVAL (lo > hi).
 */
int vsock_ct_bind_auto(struct vsock_conn_table *t, struct vsock_ct_node *n, uint32_t cid,
		       uint32_t lo, uint32_t hi, uint32_t *ret_port);
/* Unlinks n from the bound table. Returns true if it was linked. */
bool vsock_ct_remove_bound(struct vsock_conn_table *t, struct vsock_ct_node *n);
/*
 * Finds the bound node that receives packets for (cid, port): an exact cid match first, else one
 * bound to CID_ANY. Refs and returns it, or NULL.
 */
struct vsock_ct_node *vsock_ct_lookup_bound(struct vsock_conn_table *t, uint32_t cid,
					    uint32_t port);

/*
 * The auto-bind cursor: the next port tried (0 = not seeded yet: seeded at random on next use).
 * Set by tests and by a state restore (docs/upgrade.md), read by a state save.
 */
void vsock_ct_set_port_cursor(struct vsock_conn_table *t, uint32_t cursor);
uint32_t vsock_ct_port_cursor(struct vsock_conn_table *t);

#define VSOCK_CT_MAX_PORT_RETRIES 24

#endif
