/* Device connectors: the FIFOs (dev_sched.h layout) that k_sched's blocks use
 * between ranks of one host. The receiving rank owns each region:
 *   p2p  device memory (cudaMalloc), exported with cudaIpcGetMemHandle; the
 *        sender opens it with cudaIpcOpenMemHandle. Works between processes
 *        on the same GPU too (collie allows it; NCCL refuses). Ranks that are
 *        threads of one process use the pointer itself.
 *   shm  a memfd both processes map (transport/shmseg.c), registered
 *        with cudaHostRegister(Mapped|Portable) on each side so kernels reach
 *        it over the bus: for GPUs without peer access or NCCL_P2P_DISABLE.
 * Set up lazily per channel through tagged bootstrap messages, in the order
 * transport/connect.c uses: receivers describe, senders attach and ack. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../comm.h"
#include "../transport/shmseg.h"
#include "device/dev_conn.h"

#define TAG_DEV_INFO 0x7d000001u
#define TAG_DEV_ACK 0x7d000002u
#define TAG_DCH(tag, ch) ((tag) + 0x100u * (uint32_t)(ch))

enum { DCONN_P2P = 1, DCONN_SHM = 2 };

struct dconn_info {
  int32_t type, pid, fd, pad;
  uint64_t bytes;
  uint64_t ptr; /* same process: the pointer itself */
  cudaIpcMemHandle_t h;
};

struct dconn_ent {
  int type;
  int owner;  /* receiver: allocated it */
  int opened; /* sender: cudaIpcOpenMemHandle / its own mapping */
  void* dptr; /* what kernels use */
  void* host; /* shm mapping */
  size_t bytes;
  int memfd;
};

struct dconn_tab {
  int nranks;
  struct dconn_ent* ent[2]; /* [0] recv, [1] send; index ch * nranks + peer */
};

static ncclResult_t cerr(cudaError_t e, const char* what) {
  cudaGetLastError();
  return err_set(ncclUnhandledCudaError, "device connectors: %s failed: %s", what, cudaGetErrorString(e));
}

static int p2p_ok(struct ncclComm* comm, int peer) {
  const char* mine = comm->peers[comm->rank].pci_bus_id;
  const char* theirs = comm->peers[peer].pci_bus_id;
  if (mine[0] && strcmp(mine, theirs) == 0) return 1; /* the same GPU */
  int pd = -1, ok = 0;
  if (!theirs[0] || cudaDeviceGetByPCIBusId(&pd, theirs) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (cudaDeviceCanAccessPeer(&ok, comm->cuda_dev, pd) != cudaSuccess) cudaGetLastError();
  return ok;
}

static void ent_free(struct dconn_ent* e, int is_send) {
  if (!e->type) return;
  if (e->type == DCONN_P2P) {
    if (!is_send && e->owner) cudaFree(e->dptr);
    if (is_send && e->opened) cudaIpcCloseMemHandle(e->dptr);
  } else if (e->host && (e->owner || e->opened)) {
    cudaHostUnregister(e->host);
    munmap(e->host, e->bytes);
  }
  if (e->memfd >= 0) close(e->memfd);
  cudaGetLastError();
  memset(e, 0, sizeof(*e));
}

void dconn_free(struct dconn_tab* t) {
  if (!t) return;
  for (int k = 0; k < 2; k++) {
    for (int i = 0; t->ent[k] && i < t->nranks * DS_MAX_CH; i++) ent_free(&t->ent[k][i], k);
    free(t->ent[k]);
  }
  free(t);
}

static ncclResult_t recv_create(struct ncclComm* comm, struct dconn_ent* e, int type, cudaStream_t s,
                                struct dconn_info* info) {
  size_t bytes = DS_REGION_BYTES(DS_NSLOTS, DS_SLOT_BYTES);
  e->type = type;
  e->bytes = bytes;
  e->memfd = -1;
  e->owner = 1;
  info->type = type;
  info->pid = (int32_t)getpid();
  info->bytes = bytes;
  cudaError_t ce;
  if (type == DCONN_P2P) {
    if ((ce = cudaMalloc(&e->dptr, bytes)) != cudaSuccess) {
      e->owner = 0;
      return cerr(ce, "cudaMalloc (p2p slots)");
    }
    if ((ce = cudaMemsetAsync(e->dptr, 0, DS_SLOTS_OFF, s)) != cudaSuccess) return cerr(ce, "cudaMemsetAsync");
    if ((ce = cudaStreamSynchronize(s)) != cudaSuccess) return cerr(ce, "cudaStreamSynchronize");
    if ((ce = cudaIpcGetMemHandle(&info->h, e->dptr)) != cudaSuccess) return cerr(ce, "cudaIpcGetMemHandle");
    info->ptr = (uint64_t)(uintptr_t)e->dptr;
    return ncclSuccess;
  }
  e->owner = 0;
  struct shm_seg seg;
  NCCLCHECK(shmseg_create(bytes, "device shm", &seg));
  e->memfd = seg.fd; /* ent_free closes it */
  void* p = seg.base;
  if ((ce = cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable)) != cudaSuccess) {
    munmap(p, bytes);
    return cerr(ce, "cudaHostRegister (shm slots)");
  }
  e->host = p;
  e->owner = 1;
  if ((ce = cudaHostGetDevicePointer(&e->dptr, p, 0)) != cudaSuccess) return cerr(ce, "cudaHostGetDevicePointer");
  info->fd = e->memfd;
  info->ptr = (uint64_t)(uintptr_t)p;
  (void)comm;
  return ncclSuccess;
}

static ncclResult_t send_attach(struct dconn_ent* e, const struct dconn_info* info, int peer, int peer_pid) {
  size_t want = DS_REGION_BYTES(DS_NSLOTS, DS_SLOT_BYTES);
  if (info->bytes != want || (info->type != DCONN_P2P && info->type != DCONN_SHM))
    return err_set(ncclInternalError, "device connectors: the peer offered a region this build cannot use");
  e->type = info->type;
  e->bytes = want;
  e->memfd = -1;
  cudaError_t ce;
  int same = info->pid == (int32_t)getpid() && peer_pid == info->pid;
  if (info->type == DCONN_P2P) {
    if (same) {
      e->dptr = (void*)(uintptr_t)info->ptr; /* ranks are threads of this process */
      return ncclSuccess;
    }
    if ((ce = cudaIpcOpenMemHandle(&e->dptr, info->h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess)
      return cerr(ce, "cudaIpcOpenMemHandle (p2p slots)");
    e->opened = 1;
    return ncclSuccess;
  }
  if (same) {
    e->host = (void*)(uintptr_t)info->ptr; /* registered Portable by its owner */
  } else {
    struct shm_seg seg;
    NCCLCHECK(shmseg_open(info->pid, info->fd, want, peer, "device shm", &seg));
    void* p = seg.base;
    if ((ce = cudaHostRegister(p, want, cudaHostRegisterMapped | cudaHostRegisterPortable)) != cudaSuccess) {
      munmap(p, want);
      return cerr(ce, "cudaHostRegister (shm slots)");
    }
    e->host = p;
    e->opened = 1;
  }
  if ((ce = cudaHostGetDevicePointer(&e->dptr, e->host, 0)) != cudaSuccess) return cerr(ce, "cudaHostGetDevicePointer");
  return ncclSuccess;
}

/* The peers channel connectors link: the ring and the tree of dev_sched.h. */
static int uniq_add(int* v, int n, int x) {
  if (x < 0) return n;
  for (int i = 0; i < n; i++)
    if (v[i] == x) return n;
  v[n] = x;
  return n + 1;
}

ncclResult_t dconn_setup(struct ncclComm* comm, struct dconn_tab** tp, int ch, int p2p_disable, void* stream) {
  int n = comm->nranks, r = comm->rank;
  struct dconn_tab* t = *tp;
  if (!t) {
    t = calloc(1, sizeof(*t));
    if (!t) return err_set(ncclSystemError, "device connectors: out of memory");
    t->nranks = n;
    t->ent[0] = calloc((size_t)n * DS_MAX_CH, sizeof(struct dconn_ent));
    t->ent[1] = calloc((size_t)n * DS_MAX_CH, sizeof(struct dconn_ent));
    *tp = t;
    if (!t->ent[0] || !t->ent[1]) return err_set(ncclSystemError, "device connectors: out of memory");
  }
  int sends[4], recvs[4], ns = 0, nr = 0;
  ns = uniq_add(sends, ns, ds_ring_next(r, n));
  nr = uniq_add(recvs, nr, ds_ring_prev(r, n));
  ns = uniq_add(sends, ns, ds_tree_parent(r));
  nr = uniq_add(recvs, nr, ds_tree_parent(r));
  for (int j = 0; j < 2; j++) {
    ns = uniq_add(sends, ns, ds_tree_child(r, n, j));
    nr = uniq_add(recvs, nr, ds_tree_child(r, n, j));
  }
  struct dconn_ent* rt = t->ent[0] + (size_t)ch * n;
  struct dconn_ent* st = t->ent[1] + (size_t)ch * n;
  for (int i = 0; i < nr; i++) {
    struct dconn_info info;
    memset(&info, 0, sizeof(info));
    int type = !p2p_disable && p2p_ok(comm, recvs[i]) ? DCONN_P2P : DCONN_SHM;
    NCCLCHECK(recv_create(comm, &rt[recvs[i]], type, (cudaStream_t)stream, &info));
    NCCLCHECK(bootstrap_send(comm->bs, recvs[i], TAG_DCH(TAG_DEV_INFO, ch), &info, sizeof(info)));
  }
  for (int i = 0; i < ns; i++) {
    struct dconn_info info;
    int p = sends[i];
    NCCLCHECK(bootstrap_recv(comm->bs, p, TAG_DCH(TAG_DEV_INFO, ch), &info, sizeof(info)));
    ncclResult_t res = send_attach(&st[p], &info, p, comm->peers[p].pid);
    int32_t ok = res == ncclSuccess;
    ncclResult_t r2 = bootstrap_send(comm->bs, p, TAG_DCH(TAG_DEV_ACK, ch), &ok, sizeof(ok));
    if (res != ncclSuccess) return res;
    NCCLCHECK(r2);
    INFO(LOG_INIT | LOG_P2P, "rank %d -> rank %d device channel %d via %s", r, p, ch,
         st[p].type == DCONN_P2P ? "p2p (CUDA IPC)" : "shm (cudaHostRegister)");
  }
  for (int i = 0; i < nr; i++) {
    int32_t ok = 0;
    NCCLCHECK(bootstrap_recv(comm->bs, recvs[i], TAG_DCH(TAG_DEV_ACK, ch), &ok, sizeof(ok)));
    if (!ok) return err_set(ncclRemoteError, "rank %d could not attach to rank %d's device connector", recvs[i], r);
    if (rt[recvs[i]].memfd >= 0) {
      close(rt[recvs[i]].memfd);
      rt[recvs[i]].memfd = -1;
    }
  }
  return ncclSuccess;
}

static void conn_of(const struct dconn_ent* e, struct ds_conn* c) {
  if (!e->type) {
    memset(c, 0, sizeof(*c));
    return;
  }
  ds_conn_at(c, e->dptr, e->type == DCONN_SHM);
}

void dconn_wire(const struct dconn_tab* t, int rank, int ch, struct ds_chan* out) {
  int n = t->nranks;
  const struct dconn_ent* rt = t->ent[0] + (size_t)ch * n;
  const struct dconn_ent* st = t->ent[1] + (size_t)ch * n;
  memset(out, 0, sizeof(*out));
  if (n > 1) {
    conn_of(&st[ds_ring_next(rank, n)], &out->ring_send);
    conn_of(&rt[ds_ring_prev(rank, n)], &out->ring_recv);
  }
  int p = ds_tree_parent(rank);
  if (p >= 0) {
    conn_of(&st[p], &out->up_send);
    conn_of(&rt[p], &out->down_recv);
  }
  for (int j = 0; j < 2; j++) {
    int k = ds_tree_child(rank, n, j);
    if (k < 0) continue;
    conn_of(&rt[k], &out->up_recv[j]);
    conn_of(&st[k], &out->down_send[j]);
  }
}
