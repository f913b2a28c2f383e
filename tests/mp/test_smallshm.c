/* Small messages on one host (src/coll/direct_shm.c, p2p.c, enqueue.c):
 *   zero N   collectives of count 0 return after their argument checks and
 *            synchronise with nobody: some ranks make hundreds of them (alone,
 *            and inside groups beside real calls) that the others never make,
 *            then every rank runs checked collectives that must still match.
 *   a2a N    alltoall at every size from 1 element to past the Direct row's
 *            limit, interleaved with broadcasts (whose root runs ahead through
 *            the mailbox slots) and allgathers; every result checked.
 * Run with NCCL_ALGO=Direct too, so the Direct alltoall row takes every size
 * it can. Uses the fork harness (harness.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static float val(int it, int from, int to, size_t i) { return (float)((it * 131 + from * 17 + to * 7 + (int)i) % 1000); }

static int rank_zero(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float* buf = malloc(64 * sizeof(float) * (size_t)nranks);
  float* out = malloc(64 * sizeof(float) * (size_t)nranks);
  MP_CHECK(buf && out, "out of memory");
  for (int round = 0; round < 20; round++) {
    /* Odd ranks (and rank 0 on even rounds) make count-0 calls the others never make. */
    if (rank % 2 == 1 || (rank == 0 && round % 2 == 0)) {
      for (int k = 0; k < 10; k++) {
        MP_NCCL(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
        MP_NCCL(ncclBroadcast(NULL, NULL, 0, ncclFloat, k % nranks, comm, NULL));
        MP_NCCL(ncclReduce(NULL, NULL, 0, ncclFloat, ncclMax, k % nranks, comm, NULL));
        MP_NCCL(ncclAllGather(NULL, NULL, 0, ncclFloat, comm, NULL));
        MP_NCCL(ncclReduceScatter(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
        MP_NCCL(ncclAlltoAll(NULL, NULL, 0, ncclFloat, comm, NULL));
        MP_NCCL(ncclGather(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
        MP_NCCL(ncclScatter(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
      }
    }
    /* Argument checks still run for count 0: a bad root or datatype fails. */
    MP_CHECK(ncclBroadcast(NULL, NULL, 0, ncclFloat, nranks, comm, NULL) == ncclInvalidArgument,
             "count-0 broadcast with root %d outside the communicator did not fail", nranks);
    MP_CHECK(ncclAllReduce(NULL, NULL, 0, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument,
             "count-0 allreduce with datatype 99 did not fail");
    /* A group with count-0 calls beside a real allreduce (the count-0 calls only on some ranks). */
    for (int i = 0; i < 16; i++) buf[i] = val(round, rank, 0, (size_t)i);
    MP_NCCL(ncclGroupStart());
    if (rank % 2 == 0) MP_NCCL(ncclAllGather(NULL, NULL, 0, ncclFloat, comm, NULL));
    MP_NCCL(ncclAllReduce(buf, out, 16, ncclFloat, ncclSum, comm, NULL));
    if (rank % 2 == 1) MP_NCCL(ncclBroadcast(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
    MP_NCCL(ncclGroupEnd());
    for (int i = 0; i < 16; i++) {
      float want = 0;
      for (int r = 0; r < nranks; r++) want += val(round, r, 0, (size_t)i);
      MP_CHECK(out[i] == want, "round %d allreduce element %d is %g, want %g", round, i, out[i], want);
    }
    /* A broadcast from a rotating root (its root runs ahead) and an alltoall. */
    int root = round % nranks;
    for (int i = 0; i < 8; i++) buf[i] = val(round, rank, 1, (size_t)i);
    MP_NCCL(ncclBroadcast(buf, out, 8, ncclFloat, root, comm, NULL));
    for (int i = 0; i < 8; i++)
      MP_CHECK(out[i] == val(round, root, 1, (size_t)i), "round %d broadcast element %d is %g", round, i, out[i]);
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < 2; i++) buf[p * 2 + i] = val(round, rank, p, (size_t)i);
    MP_NCCL(ncclAlltoAll(buf, out, 2, ncclFloat, comm, NULL));
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < 2; i++)
        MP_CHECK(out[p * 2 + i] == val(round, p, rank, (size_t)i), "round %d alltoall block %d element %d is %g",
                 round, p, i, out[p * 2 + i]);
  }
  free(buf);
  free(out);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int rank_a2a(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  /* Per-peer block sizes (elements) up to past the Direct row's 256 KiB per rank. */
  size_t maxc = (size_t)(320 * 1024) / sizeof(float) / (size_t)nranks + 3;
  float* send = malloc(maxc * sizeof(float) * (size_t)nranks);
  float* recv = malloc(maxc * sizeof(float) * (size_t)nranks);
  MP_CHECK(send && recv, "out of memory");
  int it = 0;
  for (size_t count = 1; count <= maxc; count = count < 16 ? count + 1 : count * 3 + 1, it++) {
    for (int rep = 0; rep < 3; rep++, it++) {
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < count; i++) send[(size_t)p * count + i] = val(it, rank, p, i);
      memset(recv, 0xff, count * sizeof(float) * (size_t)nranks);
      MP_NCCL(ncclAlltoAll(send, recv, count, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < count; i++)
          MP_CHECK(recv[(size_t)p * count + i] == val(it, p, rank, i),
                   "call %d alltoall count %zu: block %d element %zu is %g, want %g", it, count, p, i,
                   recv[(size_t)p * count + i], val(it, p, rank, i));
      /* The send buffer is the caller's again. */
      for (size_t i = 0; i < count * (size_t)nranks; i++) send[i] = -3.f;
      /* Small broadcasts whose root runs ahead of the next alltoall's readers. */
      size_t bc = count < 64 ? count : 64;
      int root = (it + rep) % nranks;
      for (int k = 0; k < 5; k++) {
        for (size_t i = 0; i < bc; i++) send[i] = val(it + k, rank, 99, i);
        MP_NCCL(ncclBroadcast(send, recv, bc, ncclFloat, root, comm, NULL));
        for (size_t i = 0; i < bc; i++)
          MP_CHECK(recv[i] == val(it + k, root, 99, i), "call %d broadcast %d count %zu: element %zu is %g", it, k, bc,
                   i, recv[i]);
      }
      for (size_t i = 0; i < bc; i++) send[i] = val(it, rank, 98, i);
      MP_NCCL(ncclAllGather(send, recv, bc, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < bc; i++)
          MP_CHECK(recv[(size_t)p * bc + i] == val(it, p, 98, i), "call %d allgather count %zu: block %d element %zu",
                   it, bc, p, i);
    }
  }
  free(send);
  free(recv);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s zero|a2a NRANKS\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  double t0 = mp_now();
  int zero = strcmp(argv[1], "zero") == 0;
  int rc = mp_run(n, zero ? rank_zero : rank_a2a, NULL, 600);
  fprintf(stderr, "%s %s, %d ranks, in %.1f s\n", rc ? "FAILED" : "passed", argv[1], n, mp_now() - t0);
  return rc;
}
