/* GPUDirect RDMA sends over the IB transport, on a machine without a GPU:
 * memory that stands for device memory is a memfd that rank 0 maps twice,
 * once readable and writable (to fill it) and once PROT_NONE. The PROT_NONE
 * view's addresses play the device pointers: the test's exporter (device.h's
 * device_dmabuf_set_exporter, in place of the CUDA driver's) hands out the
 * memfd as the dma-buf of that "allocation", and the emulator's
 * ibv_reg_dmabuf_mr reads through its own mapping of it. Any read of a device
 * pointer by collie's CPU code would fault, so a pass also shows that the
 * host path never touches the bytes of a send it hands to the NIC.
 *
 * Two ranks, each its own host, NCCL_NET=IB. Rank 0 sends from device
 * memory the way the device executor does for a send it does not stage
 * (coll_args.mem with MEM_GDR, run by enqueue_run_host); rank 1 receives
 * into host memory with ncclRecv and checks every byte, also within a group
 * with a staged receive as the executor runs one. Checked: the probe
 * (transport_dev_send_ok: device memory to an IB peer yes; host memory, self,
 * a peer over sockets no, with the reason), sizes from 1 byte to many slots
 * at unaligned offsets, one dma-buf registration per operation, one for all
 * operations while the range is registered with ncclCommRegister and afresh
 * after ncclCommDeregister, an HCA whose driver refuses dma-buf (GPUDirect
 * then off for the communicator, one INFO line), a send marked MEM_GDR over
 * a socket connector (an error, no crash), and no verbs object left after
 * destroy. The device executor's own decision (dev_exec.c's gdr_send) needs
 * CUDA and a GPU and is not run here. Uses tests/mp/harness.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../mp/harness.h"
#include "comm.h"
#include "coll/coll.h"
#include "device/dev_plan.h"
#include "device/device.h"
#include "ibemu.h"
#include "transport/transport.h"

#define DEVLEN (8u << 20) /* bytes of "device memory" */

static int g_fd = -1;
static unsigned char* g_dev; /* PROT_NONE view: the "device pointers" */
static long g_exports;       /* dma-bufs handed out (checks not counted) */

static int fake_export(const void* p, size_t bytes, struct device_dmabuf* out, char* why, size_t why_len) {
  uintptr_t a = (uintptr_t)p, lo = (uintptr_t)g_dev;
  if (!g_dev || a < lo || bytes > DEVLEN || a - lo > DEVLEN - bytes) {
    snprintf(why, why_len, "%p is not device memory (test exporter)", p);
    errno = ENODEV;
    return -1;
  }
  g_exports += out != NULL;
  if (!out) return 0; /* a check only */
  out->fd = dup(g_fd);
  out->base = lo;
  out->size = DEVLEN;
  return out->fd >= 0 ? 0 : -1;
}

static unsigned char pat(int round, size_t i) { return (unsigned char)(round * 29 + i * 7 + (i >> 11)); }

static long dmabuf_regs(void) {
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  return k.dmabuf_regs;
}

/* Rank 0: a send of `bytes` from device offset `off`, not staged (MEM_GDR). */
static ncclResult_t dev_send(ncclComm_t comm, size_t off, size_t bytes) {
  struct coll_args a;
  memset(&a, 0, sizeof(a));
  a.comm = comm;
  a.kind = COLL_SEND;
  a.sendbuff = g_dev + off;
  a.count = bytes;
  a.dt = ncclUint8;
  a.peer = 1;
  a.root = -1;
  a.mem = MEM_DEVICE | MEM_GDR;
  return enqueue_run_host(&a, 1);
}

/* One round: rank 0 fills [off, off+bytes) through its writable view and
 * sends it from the device view; rank 1 receives and checks. */
static int round_check(ncclComm_t comm, int rank, unsigned char* rw, unsigned char* rb, size_t off, size_t bytes,
                       int round, const char* what) {
  if (rank == 0) {
    for (size_t i = 0; i < bytes; i++) rw[off + i] = pat(round, i);
    MP_NCCL(dev_send(comm, off, bytes));
  } else {
    memset(rb, 0xee, bytes + 1);
    MP_NCCL(ncclRecv(rb, bytes, ncclUint8, 0, comm, NULL));
    for (size_t i = 0; i < bytes; i++)
      MP_CHECK(rb[i] == pat(round, i), "%s (%zu bytes at device offset %zu): byte %zu is %u, want %u", what, bytes, off,
               i, rb[i], pat(round, i));
    MP_CHECK(rb[bytes] == 0xee, "%s: a byte past the message was written", what);
  }
  return 0;
}

static int rank_main(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids, (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "gdrhost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
  unsigned char* rw = NULL;
  if (rank == 0) {
    g_fd = memfd_create("collie-test-gdr", MFD_CLOEXEC);
    MP_CHECK(g_fd >= 0 && ftruncate(g_fd, DEVLEN) == 0, "memfd");
    rw = mmap(NULL, DEVLEN, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, 0);
    g_dev = mmap(NULL, DEVLEN, PROT_NONE, MAP_SHARED, g_fd, 0);
    MP_CHECK(rw != MAP_FAILED && g_dev != MAP_FAILED, "mmap");
    device_dmabuf_set_exporter(fake_export);
  }
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  unsigned char* rb = malloc(DEVLEN + 1);
  unsigned char* hb = malloc(4096);
  unsigned char* hb2 = malloc(DEVLEN);
  MP_CHECK(rb && hb && hb2, "out of memory");
  /* Connectors exist after a first exchange (the probe also works before). */
  MP_NCCL(ncclAllReduce(hb, hb, 16, ncclFloat, ncclSum, comm, NULL));

  if (rank == 0) {
    char why[256];
    MP_CHECK(comm->gdr_state == 0, "GPUDirect state %d before any probe", comm->gdr_state);
    MP_CHECK(!transport_dev_send_ok(comm, 1, hb, 64, why, sizeof(why)) && strstr(why, "not device memory"),
             "host memory accepted for GPUDirect (%s)", why);
    MP_CHECK(comm->gdr_state == 0, "a buffer that cannot be exported decided the HCA's support");
    MP_CHECK(!transport_dev_send_ok(comm, 0, g_dev, 64, why, sizeof(why)), "a send to self accepted");
    MP_CHECK(transport_dev_send_ok(comm, 1, g_dev + 5, 100, why, sizeof(why)), "device memory to an IB peer refused: %s",
             why);
    MP_CHECK(comm->gdr_state == 1, "GPUDirect state %d after a good probe", comm->gdr_state);
    /* Once it works, a probe only checks the buffer: no dma-buf is made. */
    long e0 = g_exports;
    MP_CHECK(transport_dev_send_ok(comm, 1, g_dev + 64, 4096, why, sizeof(why)), "second probe refused: %s", why);
    MP_CHECK(g_exports == e0, "a probe after GPUDirect was found on exported %ld dma-buf(s)", g_exports - e0);
  }

  /* Sizes from one byte to many slots, unaligned; one registration of the
   * whole allocation per operation (all its slots reuse it). */
  static const size_t sizes[] = {1, 100, 4096 + 7, (1u << 20) + 3, DEVLEN - 64};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    long r0 = rank == 0 ? dmabuf_regs() : 0, e0 = g_exports;
    size_t off = sizes[k] == DEVLEN - 64 ? 13 : 4096 * k + 13;
    if (round_check(comm, rank, rw, rb, off, sizes[k], (int)k, "device send")) return 1;
    if (rank == 0) {
      MP_CHECK(dmabuf_regs() - r0 == 1, "%zu-byte device send: %ld dma-buf registrations (want 1)", sizes[k],
               dmabuf_regs() - r0);
      MP_CHECK(g_exports - e0 == 1, "%zu-byte device send: %ld dma-bufs exported (want 1)", sizes[k], g_exports - e0);
    }
  }

  /* A group as the device executor runs one: rank 0's device send (not
   * staged) and its receive from rank 1 (staged: host memory here) go in one
   * enqueue_run_host call; rank 1 sends and receives in one NCCL group. */
  for (int round = 30; round < 32; round++) {
    size_t bytes = (3u << 20) + 11, off = 4096 + (size_t)round;
    if (rank == 0) {
      for (size_t i = 0; i < bytes; i++) rw[off + i] = pat(round, i);
      memset(rb, 0xee, bytes);
      struct coll_args g[2];
      memset(g, 0, sizeof(g));
      g[0] = (struct coll_args){.comm = comm, .kind = COLL_SEND, .sendbuff = g_dev + off, .count = bytes,
                                .dt = ncclUint8, .peer = 1, .root = -1, .mem = MEM_DEVICE | MEM_GDR};
      g[1] = (struct coll_args){.comm = comm, .kind = COLL_RECV, .recvbuff = rb, .count = bytes, .dt = ncclUint8,
                                .peer = 1, .root = -1, .mem = MEM_HOST};
      MP_NCCL(enqueue_run_host(g, 2));
      for (size_t i = 0; i < bytes; i++)
        MP_CHECK(rb[i] == pat(round + 100, i), "group: byte %zu from rank 1 is %u, want %u", i, rb[i],
                 pat(round + 100, i));
    } else {
      for (size_t i = 0; i < bytes; i++) hb2[i] = pat(round + 100, i);
      memset(rb, 0xee, bytes);
      MP_NCCL(ncclGroupStart());
      MP_NCCL(ncclSend(hb2, bytes, ncclUint8, 0, comm, NULL));
      MP_NCCL(ncclRecv(rb, bytes, ncclUint8, 0, comm, NULL));
      MP_NCCL(ncclGroupEnd());
      for (size_t i = 0; i < bytes; i++)
        MP_CHECK(rb[i] == pat(round, i), "group: byte %zu from rank 0's device memory is %u, want %u", i, rb[i],
                 pat(round, i));
    }
  }

  /* Registered with the communicator: one registration for all operations
   * until ncclCommDeregister, then one per operation again. */
  void* handle = NULL;
  if (rank == 0) MP_NCCL(ncclCommRegister(comm, g_dev, DEVLEN, &handle));
  long r0 = rank == 0 ? dmabuf_regs() : 0;
  for (int round = 10; round < 14; round++)
    if (round_check(comm, rank, rw, rb, 64 + (size_t)round, (2u << 20) + (size_t)round, round, "registered device send"))
      return 1;
  if (rank == 0) {
    MP_CHECK(dmabuf_regs() - r0 == 1, "registered: %ld dma-buf registrations in 4 sends (want 1)", dmabuf_regs() - r0);
    MP_NCCL(ncclCommDeregister(comm, handle));
  }
  r0 = rank == 0 ? dmabuf_regs() : 0;
  for (int round = 20; round < 22; round++)
    if (round_check(comm, rank, rw, rb, 7, 300000, round, "deregistered device send")) return 1;
  if (rank == 0) MP_CHECK(dmabuf_regs() - r0 == 2, "deregistered: %ld registrations in 2 sends (want 2)", dmabuf_regs() - r0);

  /* An HCA driver without dma-buf support: GPUDirect off for a new
   * communicator (one INFO line), decided once. */
  ncclComm_t c2;
  MP_NCCL(ncclCommSplit(comm, 0, rank, &c2, NULL));
  MP_NCCL(ncclAllReduce(hb, hb, 16, ncclFloat, ncclSum, c2, NULL));
  if (rank == 0) {
    char why[256];
    setenv("COLLIE_IBEMU_DMABUF", "0", 1);
    MP_CHECK(!transport_dev_send_ok(c2, 1, g_dev, 100, why, sizeof(why)) && strstr(why, "ibv_reg_dmabuf_mr"),
             "a refused dma-buf registration was not reported (%s)", why);
    unsetenv("COLLIE_IBEMU_DMABUF");
    MP_CHECK(c2->gdr_state == -1, "GPUDirect state %d after the HCA refused", c2->gdr_state);
    MP_CHECK(!transport_dev_send_ok(c2, 1, g_dev, 100, why, sizeof(why)) && strstr(why, "off"),
             "GPUDirect asked again after it was found off (%s)", why);
  }
  MP_NCCL(ncclCommDestroy(c2));

  /* A peer reached over sockets: the probe says no, and a send marked
   * MEM_GDR anyway is an error, not a crash (the connector cannot read
   * device memory; the CPU must not either). */
  setenv("NCCL_NET", "Socket", 1);
  ncclComm_t c3;
  MP_NCCL(ncclCommSplit(comm, 0, rank, &c3, NULL));
  MP_NCCL(ncclAllReduce(hb, hb, 16, ncclFloat, ncclSum, c3, NULL));
  if (rank == 0) {
    char why[256];
    MP_CHECK(!transport_dev_send_ok(c3, 1, g_dev, 100, why, sizeof(why)) && strstr(why, "Socket"),
             "device memory to a socket peer accepted (%s)", why);
    ncclResult_t r = dev_send(c3, 0, 100);
    MP_CHECK(r == ncclInternalError && strstr(ncclGetLastError(NULL), "cannot read device memory"),
             "MEM_GDR send over sockets: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    MP_NCCL(ncclCommAbort(c3)); /* rank 1 waits on a receive that will not come */
  } else {
    ncclResult_t r = ncclRecv(rb, 100, ncclUint8, 0, c3, NULL);
    MP_CHECK(r != ncclSuccess, "a receive matched by a send that failed before sending succeeded");
    MP_NCCL(ncclCommAbort(c3));
  }
  unsetenv("NCCL_NET");

  MP_NCCL(ncclCommDestroy(comm));
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  MP_CHECK(!k.mrs && !k.qps && !k.pds, "after destroy: %d MRs, %d QPs, %d PDs alive", k.mrs, k.qps, k.pds);
  if (rank == 0) {
    device_dmabuf_set_exporter(NULL);
    munmap(rw, DEVLEN);
    munmap(g_dev, DEVLEN);
    close(g_fd);
  }
  free(rb);
  free(hb);
  free(hb2);
  return 0;
}

int main(void) {
  int rc = mp_run(2, rank_main, NULL, 300);
  fprintf(stderr, "%s ib gdr sends\n", rc ? "FAILED" : "passed");
  return rc;
}
