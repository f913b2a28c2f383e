/* Device-buffer allreduce timing against the NCCL API only (nccl.h + CUDA
 * runtime), so the same source is linked twice: against libcollie
 * (gpu-perf-collie) and against NVIDIA's libnccl (gpu-perf-nccl), and the two
 * are compared in one run of bench/gpu_perf.sh. It forks NRANKS processes that
 * share device 0 (NVIDIA's NCCL refuses that: run it with 1 rank), times
 * ITERS allreduces per size with CUDA events after WARMUP, checks the result
 * once per size, and prints size, time and busbw (nccl-tests' definition,
 * 2(n-1)/n * bytes / time). "copy" mode measures the device-to-device copy
 * bandwidth floor instead (bytes read + written per second, cudaMemcpyAsync).
 * Usage: gpu_perf allreduce NRANKS MINBYTES MAXBYTES | gpu_perf copy MAXBYTES */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
#define NK(x)                                                                                      \
  do {                                                                                             \
    ncclResult_t r_ = (x);                                                                         \
    if (r_ != ncclSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s: %s %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static int iters_for(size_t bytes) { return bytes >= (64u << 20) ? 10 : bytes >= (1u << 20) ? 50 : 200; }

static int copy_floor(size_t maxbytes) {
  char *a, *b;
  CK(cudaMalloc((void**)&a, maxbytes));
  CK(cudaMalloc((void**)&b, maxbytes));
  CK(cudaMemset(a, 1, maxbytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("# device-to-device copy floor (read + write bytes)\n%12s %12s %10s\n", "bytes", "time_us", "GB/s");
  for (size_t bytes = 1u << 20; bytes <= maxbytes; bytes *= 4) {
    int it = iters_for(bytes);
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < it; i++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = 1000.0 * ms / it;
    printf("%12zu %12.2f %10.2f\n", bytes, us, 2.0 * (double)bytes / us / 1e3);
  }
  return 0;
}

static int rank_main(int rank, int nranks, ncclUniqueId id, size_t minb, size_t maxb) {
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, nranks, id, rank));
  float *x, *y;
  size_t cap = maxb < 4 ? 4 : maxb;
  CK(cudaMalloc((void**)&x, cap));
  CK(cudaMalloc((void**)&y, cap));
  size_t n = cap / sizeof(float);
  float* h = malloc(cap);
  for (size_t i = 0; i < n; i++) h[i] = (float)(i % 7 + 1);
  CK(cudaMemcpy(x, h, cap, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  if (rank == 0) printf("# allreduce float sum, %d rank(s) on one GPU, device buffers\n%12s %12s %10s %6s\n", nranks,
                        "bytes", "time_us", "busbw", "check");
  for (size_t bytes = minb < 4 ? 4 : minb; bytes <= maxb; bytes *= 2) {
    size_t count = bytes / sizeof(float);
    int it = iters_for(bytes);
    for (int i = 0; i < 5; i++) NK(ncclAllReduce(x, y, count, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h, y, count * sizeof(float), cudaMemcpyDeviceToHost));
    int ok = 1;
    for (size_t i = 0; i < count; i++)
      if (h[i] != (float)((i % 7 + 1) * nranks)) ok = 0;
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < it; i++) NK(ncclAllReduce(x, y, count, ncclFloat, ncclSum, comm, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    double us = 1000.0 * ms / it;
    double bus = nranks > 1 ? 2.0 * (nranks - 1) / nranks * (double)bytes / us / 1e3 : (double)bytes / us / 1e3;
    if (rank == 0) printf("%12zu %12.2f %10.2f %6s\n", bytes, us, bus, ok ? "ok" : "WRONG");
    fflush(stdout);
    if (!ok) return 1;
  }
  NK(ncclCommDestroy(comm));
  free(h);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "copy") == 0) return copy_floor(strtoull(argv[2], NULL, 0));
  if (argc < 5 || strcmp(argv[1], "allreduce") != 0) {
    fprintf(stderr, "usage: %s allreduce NRANKS MINBYTES MAXBYTES | %s copy MAXBYTES\n", argv[0], argv[0]);
    return 2;
  }
  int nranks = atoi(argv[2]);
  size_t minb = strtoull(argv[3], NULL, 0), maxb = strtoull(argv[4], NULL, 0);
  ncclUniqueId id;
  NK(ncclGetUniqueId(&id)); /* no CUDA call before fork: contexts do not survive it */
  pid_t* pids = calloc((size_t)nranks, sizeof(*pids));
  for (int r = 0; r < nranks; r++)
    if ((pids[r] = fork()) == 0) _exit(rank_main(r, nranks, id, minb, maxb));
  int rc = 0;
  for (int r = 0; r < nranks; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
  }
  free(pids);
  return rc;
}
