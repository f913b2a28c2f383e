/* Runs the communicator lifecycle many times in one process, for valgrind:
 * ncclCommInitAll with several threads, 1-rank ncclCommInitRank, and the
 * error paths (bad arguments, a rank that never arrives) that must release
 * everything they took. Public API only; exits non-zero on any failure.
 * Usage: lifecycle_loop [iterations] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"
#include "nccl.h"

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    ncclResult_t r_ = (call);                                                                          \
    if (r_ != ncclSuccess) {                                                                           \
      fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                                                 \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

#define CHECK_FAILS(call, code)                                                                        \
  do {                                                                                                 \
    ncclResult_t r_ = (call);                                                                          \
    if (r_ != (code)) {                                                                                \
      fprintf(stderr, "FAIL %s:%d: %s -> %d, expected %d\n", __FILE__, __LINE__, #call, (int)r_,     \
              (int)(code));                                                                            \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

static int init_all_round(int ndev) {
  ncclComm_t comms[8];
  CHECK(ncclCommInitAll(comms, ndev, NULL));
  for (int i = 0; i < ndev; i++) {
    int n = 0, r = -1;
    CHECK(ncclCommCount(comms[i], &n));
    CHECK(ncclCommUserRank(comms[i], &r));
    if (n != ndev || r != i) {
      fprintf(stderr, "FAIL: comm %d says rank %d of %d\n", i, r, n);
      return 1;
    }
  }
  for (int i = 0; i < ndev; i++) CHECK(ncclCommDestroy(comms[i]));
  return 0;
}

static int one_rank_round(int i) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&c, 1, id, 0));
  collie_peer_info_t info = {.size = sizeof(info)};
  CHECK(collie_comm_peer_info(c, 0, &info));
  /* Alternate the three ways out of a communicator. */
  if (i % 3 == 0) {
    CHECK(ncclCommFinalize(c));
    CHECK(ncclCommDestroy(c));
  } else if (i % 3 == 1) {
    CHECK(ncclCommDestroy(c));
  } else {
    CHECK(ncclCommAbort(c));
  }
  return 0;
}

static int error_round(void) {
  ncclUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  ncclComm_t c;
  CHECK_FAILS(ncclCommInitRank(&c, 1, zero, 0), ncclInvalidArgument);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 2;
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK_FAILS(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument);
  int devs[2] = {0, -1};
  ncclComm_t comms[2];
  CHECK_FAILS(ncclCommInitAll(comms, 2, devs), ncclInvalidArgument);
  CHECK_FAILS(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, NULL, NULL), ncclInvalidUsage);
  setenv("NCCL_COMM_ID", "::1:5", 1);
  CHECK_FAILS(ncclGetUniqueId(&id), ncclInvalidArgument);
  unsetenv("NCCL_COMM_ID");
  return 0;
}

/* Rank 1 of 2 never comes: the bootstrap of rank 0 times out and must
 * release its sockets, its buffers and the comm it was building. */
static int missing_rank_round(void) {
  ncclUniqueId id;
  ncclComm_t c = (ncclComm_t)1;
  CHECK(ncclGetUniqueId(&id));
  ncclResult_t r = ncclCommInitRank(&c, 2, id, 0);
  if (r == ncclSuccess || c != NULL) {
    fprintf(stderr, "FAIL: a 2-rank init with one rank returned %d, comm %p\n", (int)r, (void*)c);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 30;
  setenv("NCCL_DEBUG", "NONE", 0);
  unsetenv("NCCL_COMM_ID");
  for (int i = 0; i < iters; i++)
    if (init_all_round(3)) return 1;
  for (int i = 0; i < iters; i++)
    if (one_rank_round(i)) return 1;
  for (int i = 0; i < iters; i++)
    if (error_round()) return 1;
  /* Each of these waits for the bootstrap timeout, so only a couple. */
  setenv("COLLIE_BOOTSTRAP_TIMEOUT", "1", 1);
  for (int i = 0; i < 2; i++)
    if (missing_rank_round()) return 1;
  unsetenv("COLLIE_BOOTSTRAP_TIMEOUT");
  printf("lifecycle_loop: %d iterations OK\n", iters);
  return 0;
}
