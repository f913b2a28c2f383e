/* The host correctness sweep (tests/mp/test_coll.c) with device buffers:
 * that file is compiled here with its buffers mirrored in device memory.
 * Each collective call copies the ranges it uses to the device, runs on the
 * device copies with a CUDA stream, synchronizes the stream and copies the
 * results back, so the sweep's own reference checks judge the device path.
 * Calls inside a group are copied back at ncclGroupEnd. Extra checks here:
 * PreMulSum with a device-resident scalar, and a host/device mix refused.
 * Usage: test_gpu_coll NRANKS [quick]; all ranks share device rank % ndev. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>

#include "comm.h"
#include "device/reduce.h"
#include "../mp/harness.h"
#include "gpu_common.h"

static int g_ndev = 1;
static cudaStream_t g_stream;
static int g_group;

/* Host arenas and their device mirrors. */
struct mirror {
  char* h;
  char* d;
  size_t bytes;
};
static struct mirror g_mirror[4];
static int g_nmirror;

/* Ranges to copy back at ncclGroupEnd. */
struct pending {
  void* h;
  size_t bytes;
};
static struct pending g_pending[64];
static int g_npending;

static void* gdev_malloc(size_t n) {
  char* h = malloc(n);
  char* d = NULL;
  if (!h || g_nmirror == 4 || cudaMalloc((void**)&d, n) != cudaSuccess) {
    fprintf(stderr, "FAIL: cannot mirror %zu bytes on the device\n", n);
    exit(1);
  }
  g_mirror[g_nmirror++] = (struct mirror){h, d, n};
  return h;
}
static void gdev_free(void* p) {
  for (int i = 0; i < g_nmirror; i++)
    if (g_mirror[i].h == p) {
      cudaFree(g_mirror[i].d);
      g_mirror[i] = g_mirror[--g_nmirror];
      break;
    }
  free(p);
}
static void* dptr(const void* h) {
  if (!h) return NULL;
  for (int i = 0; i < g_nmirror; i++)
    if ((const char*)h >= g_mirror[i].h && (const char*)h <= g_mirror[i].h + g_mirror[i].bytes)
      return g_mirror[i].d + ((const char*)h - g_mirror[i].h);
  fprintf(stderr, "FAIL: %p is not in a mirrored arena\n", h);
  exit(1);
}
static void to_dev(const void* h, size_t bytes) {
  if (h && bytes && cudaMemcpy(dptr(h), h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) exit(1);
}
static void from_dev(void* h, size_t bytes) {
  if (!h || !bytes) return;
  if (g_group) {
    if (g_npending == 64) exit(1);
    g_pending[g_npending++] = (struct pending){h, bytes};
    return;
  }
  if (cudaStreamSynchronize(g_stream) != cudaSuccess) exit(1);
  if (cudaMemcpy(h, dptr(h), bytes, cudaMemcpyDeviceToHost) != cudaSuccess) exit(1);
}

static int g_rank, g_n;
#define ROLE(sendb, recvb)                  \
  size_t esz = dtype_size(dt), sb = (sendb), rb = (recvb); \
  (void)esz;                                \
  to_dev(s, sb);                            \
  to_dev(r, rb)

static ncclResult_t g_allreduce(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c) {
  ROLE(n * esz, n * esz);
  ncclResult_t res = ncclAllReduce(dptr(s), dptr(r), n, dt, op, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_reduce(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t op, int root,
                             ncclComm_t c) {
  ROLE(n * esz, g_rank == root ? n * esz : 0);
  ncclResult_t res = ncclReduce(dptr(s), rb ? dptr(r) : NULL, n, dt, op, root, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_reducescatter(const void* s, void* r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                                    ncclComm_t c) {
  ROLE(n * esz * (size_t)g_n, n * esz);
  ncclResult_t res = ncclReduceScatter(dptr(s), dptr(r), n, dt, op, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_broadcast(const void* s, void* r, size_t n, ncclDataType_t dt, int root, ncclComm_t c) {
  ROLE(g_rank == root ? n * esz : 0, n * esz);
  ncclResult_t res = ncclBroadcast(sb ? dptr(s) : NULL, dptr(r), n, dt, root, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_allgather(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c) {
  ROLE(n * esz, n * esz * (size_t)g_n);
  ncclResult_t res = ncclAllGather(dptr(s), dptr(r), n, dt, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_alltoall(const void* s, void* r, size_t n, ncclDataType_t dt, ncclComm_t c) {
  ROLE(n * esz * (size_t)g_n, n * esz * (size_t)g_n);
  ncclResult_t res = ncclAlltoAll(dptr(s), dptr(r), n, dt, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_gather(const void* s, void* r, size_t n, ncclDataType_t dt, int root, ncclComm_t c) {
  ROLE(n * esz, g_rank == root ? n * esz * (size_t)g_n : 0);
  ncclResult_t res = ncclGather(dptr(s), rb ? dptr(r) : NULL, n, dt, root, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_scatter(const void* s, void* r, size_t n, ncclDataType_t dt, int root, ncclComm_t c) {
  ROLE(g_rank == root ? n * esz * (size_t)g_n : 0, n * esz);
  ncclResult_t res = ncclScatter(sb ? dptr(s) : NULL, dptr(r), n, dt, root, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_send(const void* s, size_t n, ncclDataType_t dt, int peer, ncclComm_t c) {
  const void* r = NULL;
  ROLE(n * esz, 0);
  return ncclSend(dptr(s), n, dt, peer, c, g_stream);
}
static ncclResult_t g_recv(void* r, size_t n, ncclDataType_t dt, int peer, ncclComm_t c) {
  const void* s = NULL;
  ROLE(0, n * esz);
  ncclResult_t res = ncclRecv(dptr(r), n, dt, peer, c, g_stream);
  from_dev(r, rb);
  return res;
}
static ncclResult_t g_group_start(void) {
  g_group++;
  return ncclGroupStart();
}
static ncclResult_t g_group_end(void) {
  ncclResult_t res = ncclGroupEnd();
  if (--g_group == 0) {
    for (int i = 0; i < g_npending; i++) from_dev(g_pending[i].h, g_pending[i].bytes);
    g_npending = 0;
  }
  return res;
}

/* Device-only checks, run once per rank before the sweep. */
static int extra_checks(ncclComm_t comm, int rank, int n) {
  int dev = -2;
  MP_NCCL(ncclCommCuDevice(comm, &dev));
  MP_CHECK(dev == rank % g_ndev, "ncclCommCuDevice: %d, want %d", dev, rank % g_ndev);
  /* PreMulSum with the scalar in device memory, read when the call runs. */
  float* x = NULL;
  float* scalar = NULL;
  MP_NCCL(ncclMemAlloc((void**)&x, 1024 * sizeof(float)));
  MP_NCCL(ncclMemAlloc((void**)&scalar, sizeof(float)));
  float h[1024], three = 3.0f;
  for (int i = 0; i < 1024; i++) h[i] = (float)(i % 17 + rank);
  CUDACHECK(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice));
  CUDACHECK(cudaMemcpy(scalar, &three, sizeof(float), cudaMemcpyHostToDevice));
  ncclRedOp_t op;
  MP_NCCL(ncclRedOpCreatePreMulSum(&op, scalar, ncclFloat32, ncclScalarDevice, comm));
  MP_NCCL(ncclAllReduce(x, x, 1024, ncclFloat32, op, comm, g_stream));
  CUDACHECK(cudaStreamSynchronize(g_stream));
  CUDACHECK(cudaMemcpy(h, x, sizeof(h), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 1024; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += 3.0f * (float)(i % 17 + r);
    MP_CHECK(h[i] == want, "premulsum (device scalar) [%d] = %g, want %g", i, h[i], want);
  }
  MP_NCCL(ncclRedOpDestroy(op, comm));
  /* Host and device buffers in one call: refused, nothing enqueued. */
  ncclResult_t bad = ncclAllReduce(x, h, 16, ncclFloat32, ncclSum, comm, g_stream);
  MP_CHECK(bad == ncclInvalidArgument, "mixed host/device allreduce returned %d", (int)bad);
  /* Registration round trip. */
  void* handle = NULL;
  MP_NCCL(ncclCommRegister(comm, x, 1024 * sizeof(float), &handle));
  MP_NCCL(ncclCommDeregister(comm, handle));
  MP_NCCL(ncclMemFree(scalar));
  MP_NCCL(ncclMemFree(x));
  return 0;
}

static ncclResult_t g_init(ncclComm_t* comm, int n, ncclUniqueId id, int rank) {
  g_rank = rank;
  g_n = n;
  if (cudaSetDevice(rank % g_ndev) != cudaSuccess || cudaStreamCreate(&g_stream) != cudaSuccess) {
    fprintf(stderr, "FAIL: rank %d cannot use device %d\n", rank, rank % g_ndev);
    exit(1);
  }
  ncclResult_t res = ncclCommInitRank(comm, n, id, rank);
  if (res == ncclSuccess && extra_checks(*comm, rank, n)) exit(1);
  return res;
}

/* Route the sweep's calls through the mirrors. */
#define ncclCommInitRank(c, n, id, r) g_init(c, n, id, r)
#define ncclAllReduce(s, r, n, d, o, c, st) g_allreduce(s, r, n, d, o, c)
#define ncclReduce(s, r, n, d, o, root, c, st) g_reduce(s, r, n, d, o, root, c)
#define ncclReduceScatter(s, r, n, d, o, c, st) g_reducescatter(s, r, n, d, o, c)
#define ncclBroadcast(s, r, n, d, root, c, st) g_broadcast(s, r, n, d, root, c)
#define ncclAllGather(s, r, n, d, c, st) g_allgather(s, r, n, d, c)
#define ncclAlltoAll(s, r, n, d, c, st) g_alltoall(s, r, n, d, c)
#define ncclGather(s, r, n, d, root, c, st) g_gather(s, r, n, d, root, c)
#define ncclScatter(s, r, n, d, root, c, st) g_scatter(s, r, n, d, root, c)
#define ncclSend(s, n, d, p, c, st) g_send(s, n, d, p, c)
#define ncclRecv(r, n, d, p, c, st) g_recv(r, n, d, p, c)
#define ncclGroupStart() g_group_start()
#define ncclGroupEnd() g_group_end()
#define malloc(n) gdev_malloc(n)
#define free(p) gdev_free(p)
#define main test_coll_main
#include "../mp/test_coll.c"
#undef main
#undef malloc
#undef free

int main(int argc, char** argv) {
  g_ndev = gpu_require("gpu sweep");
  if (argc > 1 && strcmp(argv[1], "mismatch") == 0) return 2; /* host-only case */
  return test_coll_main(argc, argv);
}
