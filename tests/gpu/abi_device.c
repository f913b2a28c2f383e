/* ABI with device buffers: built only against NVIDIA's nccl.h and the CUDA
 * runtime, linked against libcollie. Two forked ranks on one GPU run
 * allreduce, allgather and a grouped send/recv on device buffers enqueued on
 * a stream; then one process runs a one-rank communicator from
 * ncclCommInitAll (kernels straight on the stream). */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_common.h"

#define NCCLOK(call)                                                                                     \
  do {                                                                                                   \
    ncclResult_t r_ = (call);                                                                            \
    if (r_ != ncclSuccess) {                                                                             \
      fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                                   \
      return 1;                                                                                          \
    }                                                                                                    \
  } while (0)

enum { N = 4099 };

static int rank_main(int rank, int nranks, ncclUniqueId id) {
  CUDACHECK(cudaSetDevice(0));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreate(&s));
  ncclComm_t comm;
  NCCLOK(ncclCommInitRank(&comm, nranks, id, rank));
  float *x, *y;
  CUDACHECK(cudaMalloc((void**)&x, N * sizeof(float)));
  CUDACHECK(cudaMalloc((void**)&y, (size_t)nranks * N * sizeof(float)));
  static float h[N], g[2 * N];
  for (int i = 0; i < N; i++) h[i] = (float)(i % 100 + rank);
  CUDACHECK(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice));
  NCCLOK(ncclAllReduce(x, y, N, ncclFloat, ncclSum, comm, s));
  NCCLOK(ncclAllGather(x, y + N, N / 2, ncclFloat, comm, s)); /* same stream: runs after the allreduce */
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(g, y, sizeof(float) * (size_t)N * 2, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += (float)(i % 100 + r);
    if (g[i] != want) {
      fprintf(stderr, "FAIL rank %d: allreduce[%d] = %g, want %g\n", rank, i, g[i], want);
      return 1;
    }
  }
  for (int r = 0; r < nranks; r++)
    for (int i = 0; i < N / 2; i++)
      if (g[N + r * (N / 2) + i] != (float)(i % 100 + r)) {
        fprintf(stderr, "FAIL rank %d: allgather block %d [%d]\n", rank, r, i);
        return 1;
      }
  int peer = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
  NCCLOK(ncclGroupStart());
  NCCLOK(ncclSend(x, N, ncclFloat, peer, comm, s));
  NCCLOK(ncclRecv(y, N, ncclFloat, from, comm, s));
  NCCLOK(ncclGroupEnd());
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(g, y, sizeof(h), cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++)
    if (g[i] != (float)(i % 100 + from)) {
      fprintf(stderr, "FAIL rank %d: recv[%d] = %g\n", rank, i, g[i]);
      return 1;
    }
  NCCLOK(ncclCommDestroy(comm));
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(s);
  return 0;
}

static int one_rank(void) {
  CUDACHECK(cudaSetDevice(0));
  int dev0 = 0;
  ncclComm_t comm;
  NCCLOK(ncclCommInitAll(&comm, 1, &dev0));
  int cu = -1;
  NCCLOK(ncclCommCuDevice(comm, &cu));
  if (cu != 0) {
    fprintf(stderr, "FAIL: ncclCommCuDevice %d\n", cu);
    return 1;
  }
  cudaStream_t s;
  CUDACHECK(cudaStreamCreate(&s));
  double* x;
  NCCLOK(ncclMemAlloc((void**)&x, 1000 * sizeof(double)));
  static double h[1000];
  for (int i = 0; i < 1000; i++) h[i] = i;
  CUDACHECK(cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice));
  double half = 0.5;
  ncclRedOp_t op;
  NCCLOK(ncclRedOpCreatePreMulSum(&op, &half, ncclDouble, ncclScalarHostImmediate, comm));
  NCCLOK(ncclAllReduce(x, x, 1000, ncclDouble, op, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  CUDACHECK(cudaMemcpy(h, x, sizeof(h), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 1000; i++)
    if (h[i] != 0.5 * i) {
      fprintf(stderr, "FAIL: one-rank premulsum [%d] = %g\n", i, h[i]);
      return 1;
    }
  NCCLOK(ncclRedOpDestroy(op, comm));
  NCCLOK(ncclMemFree(x));
  NCCLOK(ncclCommDestroy(comm));
  return 0;
}

int main(void) {
  gpu_require("abi device test");
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  int nranks = 2;
  pid_t pids[2];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(rank_main(r, nranks, id));
  }
  int rc = 0;
  for (int r = 0; r < nranks; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  if (rc == 0) {
    pid_t p = fork();
    if (p == 0) _exit(one_rank());
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  printf("%s: ABI with device buffers (2 ranks on one GPU, then 1 rank)\n", rc ? "FAILED" : "passed");
  return rc;
}
