/* The verbs layer of the IB transport: libibverbs loaded with dlopen (so
 * libcollie never links it), device/port discovery under NCCL_IB_HCA, RC queue
 * pairs brought up from an exchanged info blob, and a registration cache.
 * Implemented in net_ib_verbs.c; used by the IB transport (net_ib.c) and by
 * tests/ibemu/test_net_ib_verbs.c against the emulator. */
#ifndef COLLIE_NET_IB_VERBS_H
#define COLLIE_NET_IB_VERBS_H

#include <infiniband/verbs.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* The libibverbs entry points collie calls (the inline post/poll wrappers go
 * through struct ibv_context's function pointers, so need no symbol). */
struct ib_verbs {
  struct ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(struct ibv_device** list);
  const char* (*get_device_name)(struct ibv_device* dev);
  struct ibv_context* (*open_device)(struct ibv_device* dev);
  int (*close_device)(struct ibv_context* ctx);
  int (*query_device)(struct ibv_context* ctx, struct ibv_device_attr* attr);
  /* The exported symbol: it fills the older, shorter struct; callers memset. */
  int (*query_port)(struct ibv_context* ctx, uint8_t port, struct _compat_ibv_port_attr* attr);
  int (*query_gid)(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid);
  /* Optional (rdma-core >= 32): GID type without sysfs. NULL when absent. */
  int (*query_gid_ex)(struct ibv_context* ctx, uint32_t port, uint32_t index, struct ibv_gid_entry* e,
                      uint32_t flags, size_t entry_size);
  struct ibv_pd* (*alloc_pd)(struct ibv_context* ctx);
  int (*dealloc_pd)(struct ibv_pd* pd);
  struct ibv_mr* (*reg_mr)(struct ibv_pd* pd, void* addr, size_t len, int access);
  /* Optional: dma-buf registration (GPUDirect RDMA). NULL when absent. */
  struct ibv_mr* (*reg_dmabuf_mr)(struct ibv_pd* pd, uint64_t off, size_t len, uint64_t iova, int fd,
                                  int access);
  int (*dereg_mr)(struct ibv_mr* mr);
  struct ibv_cq* (*create_cq)(struct ibv_context* ctx, int cqe, void* cq_ctx, struct ibv_comp_channel* ch,
                              int vec);
  int (*destroy_cq)(struct ibv_cq* cq);
  struct ibv_qp* (*create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  int (*modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask);
  int (*query_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask, struct ibv_qp_init_attr* init);
  int (*destroy_qp)(struct ibv_qp* qp);
  const char* (*wc_status_str)(enum ibv_wc_status status);
};

/* The loaded library, or NULL when libibverbs (libibverbs.so.1, or
 * COLLIE_IBVERBS_LIBRARY) cannot be loaded or lacks a required symbol; that
 * is said once in an INFO line (NET), not an error. Thread-safe, loads once. */
const struct ib_verbs* ib_verbs_get(void);

/* One usable (active) port of an HCA, as discovery found it. */
enum { IB_NAME_MAX = 64, IB_MAX_PORTS = 32, IB_MAX_QPS = 16 };
struct ib_port {
  char dev_name[IB_NAME_MAX];
  int dev_index;        /* in ibv_get_device_list's order */
  int port;             /* 1-based */
  int link_layer;       /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
  uint16_t lid;
  int gid_index;        /* RoCE: the GID used (NCCL_IB_GID_INDEX or RoCE v2 auto); IB: 0 */
  union ibv_gid gid;
  enum ibv_mtu mtu;     /* active MTU */
  int has_cpus;         /* the device's sysfs local_cpulist was read */
  cpu_set_t cpus;       /* CPUs local to the device (its NUMA node / PCI root) */
  char pci_path[256];   /* the device's place in the PCI tree (sysfs, resolved), or "" */
};

/* Picks this process's port among n discovered ones: those local to the CPUs
 * it may run on (`mine`: its affinity) first, and among several candidates
 * (or none local: all of them) the local_rank-th modulo their number, so ranks
 * of one host spread over the NICs near them. Exposed for tests. */
int ib_port_pick(const struct ib_port* ports, int n, const cpu_set_t* mine, int local_rank, int* local);

/* PCI hops between two devices given as resolved sysfs paths
 * (/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0): the path components
 * below their deepest common bridge, both sides counted; -1 if either is
 * empty. Two functions of one card: 0; behind one switch: 2 or more; under
 * different root complexes (often different CPU sockets): the most. */
int ib_pci_distance(const char* a, const char* b);
/* The resolved sysfs path of PCI device `bus_id` ("0000:3B:00.0", as CUDA
 * writes it; any case) under sysfs root `root` ("/sys"), into out; 0, or -1
 * when there is no such device. Exposed for tests. */
int ib_pci_path(const char* root, const char* bus_id, char* out, size_t len);
/* With the rank's GPU known (its resolved PCI path): the ports nearest to
 * it in the PCI tree, dealt over local ranks as ib_port_pick does; -1 when
 * the GPU's or every port's place is unknown (the caller falls back to
 * ib_port_pick). *hops: the chosen port's distance. Exposed for tests. */
int ib_port_pick_gpu(const struct ib_port* ports, int n, const char* gpu_path, int local_rank, int* hops);

/* Does the device/port pass an NCCL_IB_HCA filter? Syntax (NCCL's): a comma
 * list of name[:port]; names match as prefixes unless the list starts with
 * '=' (after an optional '^'); a leading '^' excludes the listed ones. NULL or
 * empty spec: everything passes. Exposed for tests. */
int ib_hca_match(const char* spec, const char* dev_name, int port);

/* Fills ports[] (up to max) with the active ports NCCL_IB_HCA allows, in
 * device then port order; *n = 0 when verbs is unavailable or NCCL_IB_DISABLE=1.
 * Opens and closes the devices it probes. */
ncclResult_t ib_discover(struct ib_port* ports, int max, int* n);

/* The per-connection verbs objects on one port. */
struct ib_qps {
  const struct ib_verbs* v;
  struct ib_port port;
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  int nqps;             /* NCCL_IB_QPS_PER_CONNECTION */
  struct ibv_qp* qp[IB_MAX_QPS];
};

/* What a side sends its peer through bootstrap (fixed layout, host order:
 * both ends run the same build). */
struct ib_conn_info {
  uint32_t nqps;
  uint32_t qpn[IB_MAX_QPS];
  uint32_t link_layer;
  uint32_t mtu;
  uint16_t lid;
  uint16_t pad;
  uint8_t gid[16];
};

/* Opens the port's device, allocates a PD and a CQ of cq_depth entries and
 * nqps RC QPs (max_send_wr/max_recv_wr each) moved to INIT with remote-write
 * access. nqps <= 0 takes NCCL_IB_QPS_PER_CONNECTION. Cleans up on failure. */
ncclResult_t ib_qps_open(struct ib_qps* q, const struct ib_port* port, int nqps, int cq_depth,
                         int max_send_wr, int max_recv_wr);
void ib_qps_info(const struct ib_qps* q, struct ib_conn_info* info);
/* INIT -> RTR -> RTS against the peer's info (QP i talks to the peer's QP i),
 * with NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT, NCCL_IB_SL, NCCL_IB_TC. */
ncclResult_t ib_qps_connect(struct ib_qps* q, const struct ib_conn_info* peer);
/* Destroys QPs, CQ, PD and closes the device, in that order; safe on a
 * partially opened set and twice. */
void ib_qps_close(struct ib_qps* q);

/* Registration cache: page-aligned MRs looked up by address range, least
 * recently used evicted past `capacity` entries (only when not in use). Not
 * thread-safe: one per PD, used by whoever drives that connection. Memory
 * freed or unmapped behind its back is not noticed: whoever frees registered
 * memory calls ib_reg_invalidate first (a real HCA keeps the old pages). */
struct ib_reg;
struct ib_regcache {
  const struct ib_verbs* v;
  struct ibv_pd* pd;
  int access;
  int capacity;
  int n;
  struct ib_reg* head; /* most recently used first */
  uint64_t hits, misses, evictions;
};
void ib_regcache_init(struct ib_regcache* c, const struct ib_verbs* v, struct ibv_pd* pd, int capacity);
/* An MR covering [addr, addr+len), registered or reused; hold it until
 * ib_reg_put. */
ncclResult_t ib_reg_get(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr);
/* The same without recording an error: 0, or -1 (errno says why) when the
 * range cannot be registered (a caller with a fallback, e.g. a copy). */
int ib_reg_try(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr);
/* ib_reg_try for memory its owner keeps mapped until it says otherwise
 * (ncclCommRegister): the entry survives ib_reg_invalidate_unkept. */
int ib_reg_try_kept(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr);
/* Registers the device allocation holding [addr, addr+len) from its dma-buf
 * (device.h's exporter; GPUDirect RDMA): the whole allocation, with its
 * device addresses as the MR's addresses (iova), so work requests name
 * device pointers as they are. Fills [*start, *end); NULL with errno set and
 * the reason in why on failure. */
struct ibv_mr* ib_dmabuf_mr(const struct ib_verbs* v, struct ibv_pd* pd, int access, void* addr, size_t len,
                            uintptr_t* start, uintptr_t* end, char* why, size_t why_len);
/* Device memory (GPUDirect RDMA): an MR covering [addr, addr+len) of a
 * device allocation, registered from its dma-buf (device.h's exporter; the
 * whole allocation, addressed by its device addresses); `keep` as in
 * ib_reg_try_kept. An error (with the reason) when libibverbs, the driver,
 * the memory or the HCA cannot do it. */
ncclResult_t ib_reg_get_dmabuf(struct ib_regcache* c, void* addr, size_t len, int keep, struct ibv_mr** mr);
void ib_reg_put(struct ib_regcache* c, struct ibv_mr* mr);
/* The memory [addr, addr+len) is going away (free, munmap, deregister): MRs
 * overlapping it are deregistered now, or at their last put if in use. */
void ib_reg_invalidate(struct ib_regcache* c, void* addr, size_t len);
/* Every entry not taken with ib_reg_try_kept is going away. */
void ib_reg_invalidate_unkept(struct ib_regcache* c);
/* Deregisters everything (entries still held are released regardless). */
void ib_regcache_destroy(struct ib_regcache* c);

#endif
