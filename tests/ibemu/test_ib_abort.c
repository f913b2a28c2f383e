/* Abort mid-transfer over the IB transport releases every verbs object:
 * two ranks (each its own host, NCCL_NET=IB through the emulator). Rank 0
 * starts a large allreduce on a nonblocking communicator that rank 1 never
 * joins, so its slots are written and it waits for credits, then aborts it;
 * rank 1 aborts its communicator after that. Each rank then reads the
 * emulator's live object counts (ibemu_get_counts, the same library instance
 * the transport dlopens) and requires them all zero. Uses tests/mp/harness.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mp/harness.h"
#include "ibemu.h"

#define BIG (8u << 20) /* floats: 32 MiB, far more than the connector's slots */

static int counts_zero(const char* when) {
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  MP_CHECK(!k.contexts && !k.pds && !k.mrs && !k.cqs && !k.qps && !k.channels,
           "%s: live verbs objects: %d contexts, %d PDs, %d MRs, %d CQs, %d QPs, %d channels", when, k.contexts, k.pds,
           k.mrs, k.cqs, k.qps, k.channels);
  return 0;
}

static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t a = ncclInProgress;
  double until = mp_now() + 120;
  while (a == ncclInProgress && mp_now() < until) {
    if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclInternalError;
    if (a == ncclInProgress) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return a;
}

static int rank_main(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids, (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "abrthost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, ids[0], rank, &cfg);
  if (r == ncclInProgress) r = settle(comm);
  MP_CHECK(r == ncclSuccess, "init: %s", ncclGetErrorString(r));
  float* a = calloc(BIG, sizeof(float));
  float* b = calloc(BIG, sizeof(float));
  MP_CHECK(a && b, "out of memory");
  /* Connectors (QPs, MRs) exist once a first allreduce has run. */
  r = ncclAllReduce(a, b, 1024, ncclFloat, ncclSum, comm, NULL);
  if (r == ncclInProgress) r = settle(comm);
  MP_CHECK(r == ncclSuccess, "first allreduce: %s", ncclGetErrorString(r));
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  MP_CHECK(k.qps > 0 && k.mrs > 0 && k.pds > 0 && k.cqs > 0, "no verbs objects after an allreduce over IB (%d QPs)",
           k.qps);
  if (rank == 0) {
    r = ncclAllReduce(a, b, BIG, ncclFloat, ncclSum, comm, NULL);
    MP_CHECK(r == ncclInProgress || r == ncclSuccess, "big allreduce: %s", ncclGetErrorString(r));
    struct timespec ts = {0, 300 * 1000 * 1000}; /* let it fill the peer's slots */
    nanosleep(&ts, NULL);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    MP_CHECK(async == ncclInProgress, "the allreduce rank 1 never joined is not in progress (%d)", (int)async);
    MP_NCCL(ncclCommAbort(comm));
    if (counts_zero("rank 0 after abort mid-transfer")) return 1;
    mp_arrive(0);
  } else {
    MP_CHECK(mp_await(0, 1, 300) == 0, "rank 0 did not abort in time");
    MP_NCCL(ncclCommAbort(comm));
    if (counts_zero("rank 1 after abort")) return 1;
  }
  free(a);
  free(b);
  return 0;
}

int main(void) {
  if (mp_counters_reset() != 0) return 1;
  int rc = mp_run(2, rank_main, NULL, 600);
  fprintf(stderr, "%s ib abort\n", rc ? "FAILED" : "passed");
  return rc;
}
