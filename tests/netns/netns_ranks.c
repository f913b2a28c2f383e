/* One rank of the network-namespace test (netns_multihost.sh): joins the job
 * through collie_comm_init_from_env (COLLIE_RANK/SIZE, NCCL_COMM_ID,
 * COLLIE_BOOTSTRAP_SECRET), checks collectives across the "hosts", then
 * (mode "cut") runs allreduces until one fails, which the script provokes by
 * cutting one host's link, and reports how long that took and the error.
 * Exit: 0 all checks passed (mode "coll"), 3 got the expected error (mode
 * "cut"), 4 no error within the loop's time limit, 1 wrong result, 2 init
 * failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"
#include "nccl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int rank, nranks;

#define FAIL(...)                                      \
  do {                                                 \
    fprintf(stderr, "rank %d: FAIL: ", rank);          \
    fprintf(stderr, __VA_ARGS__);                      \
    fprintf(stderr, "\n");                             \
    return 1;                                          \
  } while (0)
#define CHECK_NCCL(call)                                                                         \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) FAIL("%s: %s: %s", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
  } while (0)

static int collectives(ncclComm_t comm) {
  size_t counts[] = {1, 1000, 1 << 20};
  for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
    size_t n = counts[k];
    float* a = malloc(n * sizeof(float));
    float* g = malloc(n * nranks * sizeof(float));
    if (!a || !g) FAIL("out of memory");
    /* Allreduce: small integers, exact in float whatever the order. */
    for (size_t i = 0; i < n; i++) a[i] = (float)((rank + 1) * (int)(i % 7 + 1));
    CHECK_NCCL(ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < n; i++)
      if (a[i] != (float)(nranks * (nranks + 1) / 2 * (int)(i % 7 + 1))) FAIL("allreduce[%zu] of %zu = %g", i, n, a[i]);
    /* Allgather. */
    for (size_t i = 0; i < n; i++) a[i] = (float)(rank * 1000 + (int)(i % 1000));
    CHECK_NCCL(ncclAllGather(a, g, n, ncclFloat, comm, NULL));
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < n; i++)
        if (g[(size_t)r * n + i] != (float)(r * 1000 + (int)(i % 1000))) FAIL("allgather block %d [%zu]", r, i);
    /* Broadcast from the last rank (on another host than rank 0). */
    for (size_t i = 0; i < n; i++) a[i] = rank == nranks - 1 ? (float)(i % 4096) : -1.0f;
    CHECK_NCCL(ncclBroadcast(a, a, n, ncclFloat, nranks - 1, comm, NULL));
    for (size_t i = 0; i < n; i++)
      if (a[i] != (float)(i % 4096)) FAIL("broadcast[%zu] = %g", i, a[i]);
    /* Reduce-scatter: block r of the sum is nranks * (r + 1). */
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < n; i++) g[(size_t)r * n + i] = (float)(r + 1);
    CHECK_NCCL(ncclReduceScatter(g, a, n, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < n; i++)
      if (a[i] != (float)(nranks * (rank + 1))) FAIL("reducescatter[%zu] = %g", i, a[i]);
    free(a);
    free(g);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "coll";
  double limit = argc > 2 ? atof(argv[2]) : 120;
  setvbuf(stdout, NULL, _IOLBF, 0);
  rank = atoi(getenv("COLLIE_RANK") ? getenv("COLLIE_RANK") : "-1");
  ncclComm_t comm;
  ncclResult_t r = collie_comm_init_from_env(&comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed: %s: %s\n", rank, ncclGetErrorString(r), ncclGetLastError(NULL));
    return 2;
  }
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &nranks);
  printf("rank %d: init ok\n", rank);
  if (collectives(comm) != 0) return 1;
  printf("rank %d: collectives ok\n", rank);
  if (strcmp(mode, "cut") != 0) {
    CHECK_NCCL(ncclCommDestroy(comm));
    return 0;
  }
  /* Allreduces until one fails (the script cuts a link once every rank says "looping"). */
  size_t n = 1 << 16;
  float* a = calloc(n, sizeof(float));
  if (!a) return 1;
  double t0 = now_s();
  long iters = 0;
  for (;;) {
    r = ncclAllReduce(a, a, n, ncclFloat, ncclSum, comm, NULL);
    if (r == ncclSuccess) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) r = async;
    }
    if (r != ncclSuccess) break;
    if (++iters == 1) printf("rank %d: looping\n", rank);
    if (now_s() - t0 > limit) {
      printf("rank %d: NO ERROR after %.1f s of allreduces (%ld iterations)\n", rank, now_s() - t0, iters);
      ncclCommAbort(comm);
      free(a);
      return 4;
    }
  }
  double t_err = now_s();
  printf("rank %d: ERROR %s after %.2f s of allreduces (%ld iterations): %s\n", rank, ncclGetErrorString(r),
         t_err - t0, iters, ncclGetLastError(comm));
  ncclCommAbort(comm);
  printf("rank %d: abort took %.3f s\n", rank, now_s() - t_err);
  free(a);
  return 3;
}
