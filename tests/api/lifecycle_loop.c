/* Runs the communicator lifecycle many times in one process, for valgrind:
 * ncclCommInitAll with several threads, 1-rank ncclCommInitRank, a few
 * collectives on each, and the error paths (bad arguments, a failed group,
 * a rank that never arrives) that must release everything they took.
 * Public API only; exits non-zero on any failure.
 * Usage: lifecycle_loop [iterations] */
#define _GNU_SOURCE
#include <stdint.h>
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

#define CHECK_FLOATS(got, want, n)                                                                    \
  do {                                                                                                \
    for (int k_ = 0; k_ < (n); k_++)                                                                  \
      if ((got)[k_] != (want)[k_]) {                                                                  \
        fprintf(stderr, "FAIL %s:%d: %s[%d] = %g, expected %g\n", __FILE__, __LINE__, #got, k_,       \
                (double)(got)[k_], (double)(want)[k_]);                                               \
        return 1;                                                                                     \
      }                                                                                               \
  } while (0)

#define NEL 1000 /* elements per rank: a few slots of traffic, cheap under valgrind */

/* One thread drives every rank of an ncclCommInitAll clique: each call goes
 * into one group, which runs each comm on its own thread. */
static int init_all_collectives(ncclComm_t* comms, int ndev) {
  static float in[8][NEL], out[8][NEL], gathered[8][8 * NEL];
  float want[NEL];
  for (int i = 0; i < NEL; i++) want[i] = 0;
  for (int r = 0; r < ndev; r++)
    for (int i = 0; i < NEL; i++) {
      in[r][i] = (float)(i % 97) + (float)r;
      want[i] += in[r][i];
      out[r][i] = -1;
    }
  CHECK(ncclGroupStart());
  for (int r = 0; r < ndev; r++) CHECK(ncclAllReduce(in[r], out[r], NEL, ncclFloat, ncclSum, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < ndev; r++) CHECK_FLOATS(out[r], want, NEL);

  /* Broadcast from the last rank, then an allgather, in one group. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < ndev; r++) CHECK(ncclBroadcast(in[r], out[r], NEL, ncclFloat, ndev - 1, comms[r], NULL));
  for (int r = 0; r < ndev; r++) CHECK(ncclAllGather(in[r], gathered[r], NEL, ncclFloat, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < ndev; r++) {
    CHECK_FLOATS(out[r], in[ndev - 1], NEL);
    for (int q = 0; q < ndev; q++) CHECK_FLOATS(gathered[r] + (size_t)q * NEL, in[q], NEL);
  }

  /* A ring of sends and receives: rank r gets rank r-1's data. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < ndev; r++) {
    CHECK(ncclSend(in[r], NEL, ncclFloat, (r + 1) % ndev, comms[r], NULL));
    CHECK(ncclRecv(out[r], NEL, ncclFloat, (r + ndev - 1) % ndev, comms[r], NULL));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < ndev; r++) CHECK_FLOATS(out[r], in[(r + ndev - 1) % ndev], NEL);
  return 0;
}

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
  if (init_all_collectives(comms, ndev)) return 1;
  for (int i = 0; i < ndev; i++) CHECK(ncclCommDestroy(comms[i]));
  return 0;
}

/* Collectives on a 1-rank comm: results equal the input (times the
 * premul-sum scalar), and a failed group frees what it queued. */
static int one_rank_collectives(ncclComm_t c) {
  float in[NEL], out[NEL], want[NEL];
  for (int i = 0; i < NEL; i++) {
    in[i] = (float)(i % 31);
    want[i] = 3 * in[i];
    out[i] = -1;
  }
  CHECK(ncclAllReduce(in, out, NEL, ncclFloat, ncclSum, c, NULL));
  CHECK_FLOATS(out, in, NEL);
  float scalar = 3;
  ncclRedOp_t op;
  CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c));
  CHECK(ncclAllReduce(in, out, NEL, ncclFloat, op, c, NULL));
  CHECK_FLOATS(out, want, NEL);
  CHECK(ncclRedOpDestroy(op, c));
  /* A premul-sum op left alive: the comm's teardown frees it. */
  CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarDevice, c));
  CHECK(ncclGroupStart());
  CHECK(ncclSend(in, NEL, ncclFloat, 0, c, NULL));
  CHECK(ncclRecv(out, NEL, ncclFloat, 0, c, NULL));
  CHECK(ncclGroupEnd());
  CHECK_FLOATS(out, in, NEL);
  CHECK(ncclAlltoAll(want, out, NEL, ncclFloat, c, NULL));
  CHECK_FLOATS(out, want, NEL);
  /* A group with a bad call: queued work is dropped, never run. */
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(in, out, NEL, ncclFloat, ncclSum, c, NULL));
  CHECK_FAILS(ncclBroadcast(in, out, NEL, ncclFloat, 1, c, NULL), ncclInvalidArgument);
  CHECK_FAILS(ncclGroupEnd(), ncclInvalidArgument);
  CHECK_FLOATS(out, want, NEL);
  /* A simulated group is dropped the same way. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(in, out, NEL, ncclFloat, ncclSum, c, NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  CHECK_FLOATS(out, want, NEL);
  return 0;
}

static int one_rank_round(int i) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&c, 1, id, 0));
  collie_peer_info_t info = {.size = sizeof(info)};
  CHECK(collie_comm_peer_info(c, 0, &info));
  if (one_rank_collectives(c)) return 1;
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
  CHECK_FAILS(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument);
  CHECK_FAILS(ncclGroupEnd(), ncclInvalidUsage);
  /* Device memory without a CUDA device fails cleanly; host memory (the
   * default without one) comes back and goes again. */
  void* p = (void*)(uintptr_t)1;
  setenv("COLLIE_MEMALLOC", "device", 1);
  CHECK_FAILS(ncclMemAlloc(&p, 64), ncclInvalidUsage);
  setenv("COLLIE_MEMALLOC", "host", 1);
  CHECK(ncclMemAlloc(&p, 64));
  ((char*)p)[63] = 1;
  CHECK(ncclMemFree(p));
  CHECK_FAILS(ncclMemFree(&c), ncclInvalidArgument);
  setenv("COLLIE_MEMALLOC", "bogus", 1);
  CHECK_FAILS(ncclMemAlloc(&p, 64), ncclInvalidArgument);
  unsetenv("COLLIE_MEMALLOC");
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
