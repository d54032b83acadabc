/* SPDX-License-Identifier: MIT */
/*
 * vhost-user wire constants and payload layouts (QEMU docs/interop/vhost-user.rst), limited to
 * what a vsock device needs. The 12-byte header and every payload field are in host byte order
 * (the protocol is only spoken over a local Unix socket). The payload structs below have no
 * implicit padding and are only ever filled with memcpy from a received buffer, so their natural
 * alignment is safe.
 */
#ifndef UVSOCK_VHOST_USER_PROTOCOL_H
#define UVSOCK_VHOST_USER_PROTOCOL_H

#include <stdint.h>

/* Header flags. A reply carries exactly VHU_FLAG_VERSION | VHU_FLAG_REPLY (0x5): QEMU 7.x
 * rejects any other value. */
#define VHU_FLAG_VERSION_MASK 0x3u
#define VHU_FLAG_VERSION 0x1u
#define VHU_FLAG_REPLY 0x4u
#define VHU_FLAG_NEED_REPLY 0x8u
#define VHU_REPLY_FLAGS (VHU_FLAG_VERSION | VHU_FLAG_REPLY)

#define VHU_HDR_SIZE 12u
/* Largest payload we read at all; larger headers are a framing error (cannot resync). */
#define VHU_PAYLOAD_MAX 4096u
/* SCM_RIGHTS fds per message (SET_MEM_TABLE: one per region, at most 8). */
#define VHU_MAX_FDS 8u

/* Virtio feature bits (GET/SET_FEATURES). */
#define VHU_VSOCK_F_STREAM 0
#define VHU_VSOCK_F_SEQPACKET 1
#define VHU_VSOCK_F_DGRAM 3
#define VHU_F_NOTIFY_ON_EMPTY 24
#define VHU_F_INDIRECT_DESC 28
#define VHU_F_EVENT_IDX 29
#define VHU_F_PROTOCOL_FEATURES 30
#define VHU_F_VERSION_1 32
#define VHU_F_RING_PACKED 34
#define VHU_F_IN_ORDER 35
#define VHU_F_LOG_ALL 26

/* Protocol feature bits (GET/SET_PROTOCOL_FEATURES). */
#define VHU_PROTO_F_MQ 0
#define VHU_PROTO_F_LOG_SHMFD 1
#define VHU_PROTO_F_REPLY_ACK 3
#define VHU_PROTO_F_BACKEND_REQ 5
#define VHU_PROTO_F_CONFIG 9
#define VHU_PROTO_F_INFLIGHT_SHMFD 12
#define VHU_PROTO_F_CONFIGURE_MEM_SLOTS 15
#define VHU_PROTO_F_STATUS 16
#define VHU_PROTO_F_DEVICE_STATE 19

#define VHU_BIT(n) (1ull << (n))

/* Request ids, front-end to back-end. The X-macro in backend.c gives each its policy. */
enum vhu_request {
	VHU_REQ_NONE = 0,
	VHU_REQ_GET_FEATURES = 1,
	VHU_REQ_SET_FEATURES = 2,
	VHU_REQ_SET_OWNER = 3,
	VHU_REQ_RESET_OWNER = 4,
	VHU_REQ_SET_MEM_TABLE = 5,
	VHU_REQ_SET_LOG_BASE = 6,
	VHU_REQ_SET_LOG_FD = 7,
	VHU_REQ_SET_VRING_NUM = 8,
	VHU_REQ_SET_VRING_ADDR = 9,
	VHU_REQ_SET_VRING_BASE = 10,
	VHU_REQ_GET_VRING_BASE = 11,
	VHU_REQ_SET_VRING_KICK = 12,
	VHU_REQ_SET_VRING_CALL = 13,
	VHU_REQ_SET_VRING_ERR = 14,
	VHU_REQ_GET_PROTOCOL_FEATURES = 15,
	VHU_REQ_SET_PROTOCOL_FEATURES = 16,
	VHU_REQ_GET_QUEUE_NUM = 17,
	VHU_REQ_SET_VRING_ENABLE = 18,
	VHU_REQ_SEND_RARP = 19,
	VHU_REQ_NET_SET_MTU = 20,
	VHU_REQ_SET_BACKEND_REQ_FD = 21,
	VHU_REQ_IOTLB_MSG = 22,
	VHU_REQ_SET_VRING_ENDIAN = 23,
	VHU_REQ_GET_CONFIG = 24,
	VHU_REQ_SET_CONFIG = 25,
	VHU_REQ_CREATE_CRYPTO_SESSION = 26,
	VHU_REQ_CLOSE_CRYPTO_SESSION = 27,
	VHU_REQ_POSTCOPY_ADVISE = 28,
	VHU_REQ_POSTCOPY_LISTEN = 29,
	VHU_REQ_POSTCOPY_END = 30,
	VHU_REQ_GET_INFLIGHT_FD = 31,
	VHU_REQ_SET_INFLIGHT_FD = 32,
	VHU_REQ_GPU_SET_SOCKET = 33,
	VHU_REQ_RESET_DEVICE = 34,
	VHU_REQ_VRING_KICK = 35,
	VHU_REQ_GET_MAX_MEM_SLOTS = 36,
	VHU_REQ_ADD_MEM_REG = 37,
	VHU_REQ_REM_MEM_REG = 38,
	VHU_REQ_SET_STATUS = 39,
	VHU_REQ_GET_STATUS = 40,
	VHU_REQ_GET_SHARED_OBJECT = 41,
	VHU_REQ_SET_DEVICE_STATE_FD = 42,
	VHU_REQ_CHECK_DEVICE_STATE = 43,
	_VHU_REQ_MAX
};

/* SET_VRING_KICK/CALL/ERR u64 payload: queue index in bits 0-7, bit 8 = no fd attached. */
#define VHU_VRING_IDX_MASK 0xffull
#define VHU_VRING_NOFD_MASK 0x100ull

/* SET_VRING_ADDR flags bit 0 (VHOST_VRING_F_LOG): used-ring writes are logged at
 * log_guest_addr (dirty logging, with VHU_F_LOG_ALL). */
#define VHU_VRING_F_LOG 0x1u

/* Largest split ring size (VIRTIO 1.x 2.7: Queue Size is a power of 2, at most 32768). */
#define VHU_QUEUE_SIZE_MAX 32768u

/*
 * SET_DEVICE_STATE_FD (vhost-user.rst "Migrating back-end state"): payload u32 direction, u32
 * phase, one fd (a pipe end) in the ancillary data. The u64 reply: bits 0-7 an error code (0:
 * success), bit 8 set when the back-end returns no fd of its own (it uses the front-end's).
 */
#define VHU_STATE_DIR_SAVE 0u
#define VHU_STATE_DIR_LOAD 1u
#define VHU_STATE_PHASE_STOPPED 0u
#define VHU_STATE_REPLY_ERR_MASK 0xffull
#define VHU_STATE_REPLY_NOFD 0x100ull

struct vhu_device_state {
	uint32_t direction;
	uint32_t phase;
};

/* GET/SET_CONFIG payload limit. */
#define VHU_CONFIG_MAX 256u

struct vhu_vring_state {
	uint32_t index;
	uint32_t num;
};

/* Note the order on the wire: desc, used, avail. */
struct vhu_vring_addr {
	uint32_t index;
	uint32_t flags;
	uint64_t desc_user_addr;
	uint64_t used_user_addr;
	uint64_t avail_user_addr;
	uint64_t log_guest_addr;
};

/* SET_LOG_BASE with LOG_SHMFD: the bitmap is [mmap_offset, +mmap_size) of the attached fd. */
struct vhu_log {
	uint64_t mmap_size;
	uint64_t mmap_offset;
};

struct vhu_mem_region {
	uint64_t guest_phys_addr;
	uint64_t memory_size;
	uint64_t userspace_addr;
	uint64_t mmap_offset;
};

/* SET_MEM_TABLE: 8 + 32 * nregions bytes. */
struct vhu_mem_table {
	uint32_t nregions;
	uint32_t padding;
	struct vhu_mem_region regions[VHU_MAX_FDS];
};

#define VHU_CONFIG_HDR_SIZE 12u
struct vhu_config {
	uint32_t offset;
	uint32_t size;
	uint32_t flags;
	uint8_t region[VHU_CONFIG_MAX];
};

_Static_assert(sizeof(struct vhu_vring_state) == 8, "vring state layout");
_Static_assert(sizeof(struct vhu_vring_addr) == 40, "vring addr layout");
_Static_assert(sizeof(struct vhu_mem_region) == 32, "mem region layout");
_Static_assert(sizeof(struct vhu_log) == 16, "log layout");
_Static_assert(sizeof(struct vhu_mem_table) == 8 + 32 * VHU_MAX_FDS, "mem table layout");
_Static_assert(sizeof(struct vhu_device_state) == 8, "device state layout");
_Static_assert(sizeof(struct vhu_config) == VHU_CONFIG_HDR_SIZE + VHU_CONFIG_MAX, "config layout");

/* Size of the vsock device config space: le64 guest_cid. */
#define VHU_VSOCK_CONFIG_SIZE 8u

#endif
