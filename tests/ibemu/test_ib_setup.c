/* Connection setup order over the IB transport (through the emulator): a
 * sender must not RDMA-write into a receiver whose QP is not in RTR yet (a
 * real responder drops such packets and the sender's retries run out:
 * "transport retry counter exceeded"). Three ranks, each its own host, with a
 * tiny retry budget (NCCL_IB_TIMEOUT=8: about 8 ms). Rank 0 receives from
 * rank 1 and sends to rank 2 in one group, so its receiving end stays in INIT
 * until rank 2, which starts late, has sent its connector info; rank 1 is
 * attached long before that and would write at once. The data must arrive
 * intact on every rank. Uses tests/mp/harness.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../mp/harness.h"

#define N (1u << 20) /* floats: 4 MiB, many slots */

static float val(int from, size_t i) { return (float)(from * 1000 + (int)(i % 997)); }

static int rank_main(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids, (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "setuphost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float* a = malloc(N * sizeof(float));
  float* b = malloc(N * sizeof(float));
  MP_CHECK(a && b, "out of memory");
  for (size_t i = 0; i < N; i++) { a[i] = val(rank, i); b[i] = -1; }
  for (int round = 0; round < 2; round++) {
    if (rank == 0) {
      MP_NCCL(ncclGroupStart());
      MP_NCCL(ncclRecv(b, N, ncclFloat, 1, comm, NULL));
      MP_NCCL(ncclSend(a, N, ncclFloat, 2, comm, NULL));
      MP_NCCL(ncclGroupEnd());
    } else if (rank == 1) {
      MP_NCCL(ncclSend(a, N, ncclFloat, 0, comm, NULL));
    } else {
      if (round == 0) { /* far longer than the senders' retry budget */
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
      }
      MP_NCCL(ncclRecv(b, N, ncclFloat, 0, comm, NULL));
    }
    if (rank != 1) {
      int from = rank == 0 ? 1 : 0;
      for (size_t i = 0; i < N; i++)
        MP_CHECK(b[i] == val(from, i), "round %d: element %zu from rank %d is %g, want %g", round, i, from,
                 (double)b[i], (double)val(from, i));
      for (size_t i = 0; i < N; i++) b[i] = -1;
    }
  }
  MP_NCCL(ncclCommDestroy(comm));
  free(a);
  free(b);
  return 0;
}

int main(void) {
  int rc = mp_run(3, rank_main, NULL, 300);
  fprintf(stderr, "%s ib setup order\n", rc ? "FAILED" : "passed");
  return rc;
}
