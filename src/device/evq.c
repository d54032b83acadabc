/* SPDX-License-Identifier: MIT */
/*
 * The event queue of a device: its ring (a struct dev_queue of its own, never touched by the
 * data path of rx and tx) and the posting of VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (evq.h). The
 * guest is untrusted here as everywhere: a ring error stops only the event queue (the VM's data
 * path goes on; the next start repairs it), an event buffer shorter than an event is returned
 * empty, and at most the buffers the guest made available are looked at per call.
 * Device thread only.
 */
#include "device/evq.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#include "device/device_internal.h"
#include "ops/vmlog.h"
#include "util/fdcheck.h"
#include "util/iov.h"
#include "util/log.h"

static void evq_signal(struct vsock_dev *d)
{
	struct dev_queue *eq = &d->evq;
	int r;

	vring_dev_flush(&eq->q);
	if (!vring_dev_should_notify(&eq->q) || eq->call_fd < 0)
		return;
	r = eventfd_signal_nb(eq->call_fd);
	if (r < 0 && r != -EAGAIN)
		log_vm_dev(LOG_LVL_WARN, d->cid, "event queue call eventfd write failed: %s",
			   strerror(-r));
	DEV_STAT_ADD(d, interrupts, 1);
}

/* A ring error on the event queue: stop using it (logged once per start). */
static void evq_broken(struct vsock_dev *d, const char *what)
{
	struct dev_queue *eq = &d->evq;
	const char *why = vring_dev_error(&eq->q) != VRING_ERR_NONE ? vring_dev_error_msg(&eq->q)
								    : what;

	DEV_STAT_ADD(d, ring_errors, 1);
	log_vm_dev(LOG_LVL_WARN, d->cid, "event queue error: %s; events stop until it restarts",
		   why);
	loop_watch_del(eq->kick_w);
	eq->kick_w = NULL;
	eq->running = false;
}

void dev_evq_flush(struct vsock_dev *d)
{
	struct dev_queue *eq = &d->evq;
	uint8_t ev[VSOCK_EVENT_SIZE];
	uint32_t id = htole32(VSOCK_EVENT_TRANSPORT_RESET);
	struct iovec in[DEV_RX_IOV_MAX], out_none[1];
	bool pushed = false;

	memcpy(ev, &id, sizeof(ev));
	/* Only within a session: whether the guest needs it is decided when TX starts. */
	while (d->evq_reset_pending && eq->running && d->txq.running) {
		struct vring_chain ch;
		uint16_t head;
		int r = vring_dev_pop(&eq->q, out_none, 0, in, DEV_RX_IOV_MAX, &ch);

		if (r == -EAGAIN)
			break; /* no buffer: posted at the next kick */
		if (r == -ENOBUFS) {
			/* Readable descriptors or too many segments: not an event buffer. */
			if (vring_dev_skip(&eq->q, &head) == 0)
				(void)vring_dev_fill(&eq->q, head, 0);
			pushed = true;
			continue;
		}
		if (r < 0) {
			evq_broken(d, "pop failed");
			return;
		}
		pushed = true;
		if (ch.in_len < VSOCK_EVENT_SIZE) {
			(void)vring_dev_fill(&eq->q, ch.head, 0);
			continue;
		}
		iov_write_at(in, ch.in_num, 0, ev, sizeof(ev));
		vring_dev_log_written(&eq->q, in, ch.in_num, VSOCK_EVENT_SIZE);
		(void)vring_dev_fill(&eq->q, ch.head, VSOCK_EVENT_SIZE);
		d->evq_reset_pending = false;
		DEV_STAT_ADD(d, transport_resets, 1);
		log_vm_dev(LOG_LVL_INFO, d->cid, "%s: transport reset posted to the guest", d->name);
	}
	if (pushed)
		evq_signal(d);
}

static void evq_kick_cb(struct loop *l, int fd, uint32_t events, void *opaque)
{
	struct vsock_dev *d = opaque;

	(void)l;
	if (events & (EPOLLHUP | EPOLLERR)) {
		evq_broken(d, "kick fd hung up or failed");
		return;
	}
	(void)eventfd_consume_nb(fd, NULL);
	dev_evq_flush(d);
}

int dev_evq_start(struct vsock_dev *d, const struct vring_dev_config *cfg, int kick_fd,
		  int call_fd)
{
	struct dev_queue *eq = &d->evq;
	int r;

	if (eq->running)
		return -EBUSY;
	r = vring_dev_init(&eq->q, cfg);
	if (r == 0)
		r = loop_watch_add(d->loop, kick_fd, EPOLLIN, evq_kick_cb, d, &eq->kick_w);
	if (r < 0)
		return r;
	eq->running = true;
	eq->num = cfg->num;
	eq->call_fd = call_fd;
	eq->kick_fd = kick_fd;
	log_debug("%s: event queue started (size %u)", d->name, cfg->num);
	dev_evq_flush(d);
	return 0;
}

uint16_t dev_evq_stop(struct vsock_dev *d)
{
	struct dev_queue *eq = &d->evq;

	if (eq->kick_w) {
		loop_watch_del(eq->kick_w);
		eq->kick_w = NULL;
	}
	if (eq->running)
		log_debug("%s: event queue stopped", d->name);
	eq->running = false;
	eq->kick_fd = eq->call_fd = -1;
	return vring_dev_last_avail_idx(&eq->q);
}

void dev_evq_set_call_fd(struct vsock_dev *d, int call_fd)
{
	d->evq.call_fd = call_fd;
}

void dev_evq_session_start(struct vsock_dev *d, uint16_t tx_base)
{
	/* A ring nobody used yet: split index 0; packed slot 0 with the wrap counter at 1, which
	 * the vhost-user base carries in bit 15 (docs/vring.md "Packed rings"). */
	uint16_t fresh = d->features & (1ull << VRING_FEAT_RING_PACKED) ? 0x8000u : 0;

	if (tx_base == fresh)
		d->evq_reset_pending = false;
	dev_evq_flush(d);
}

void dev_evq_reset_needed(struct vsock_dev *d)
{
	d->evq_reset_pending = true;
	dev_evq_flush(d);
}
