/* ncclCommRevoke and ncclCommShrink: stopping a communicator's work without
 * destroying it, and building a communicator of the survivors. The survivors
 * agree on a new bootstrap without the excluded ranks: the first survivor
 * makes a fresh unique ID and hands it to the others over the parent's
 * bootstrap connections (pairwise, so a dead rank does not disturb them),
 * then all run the ordinary init. Talks to init.c (comm_init) and async.c. */
#include <stdlib.h>
#include <string.h>

#include "failures.h"

#define TAG_SHRINK_ID 0x7d000000u

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  NCCLCHECK(comm_check(comm, "ncclCommRevoke"));
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return err_set(ncclInvalidArgument, "ncclCommRevoke: revokeFlags 0x%x unknown (pass NCCL_REVOKE_DEFAULT)",
                   revokeFlags);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "ncclCommRevoke: comm %p is already revoked", (void*)comm);
  if (comm->finalized) return err_set(ncclInvalidUsage, "ncclCommRevoke: comm %p was finalized", (void*)comm);
  /* Running work ends at its next wait (every wait checks the flag before it
   * sleeps); queued nonblocking work is dropped; new calls are refused. */
  __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
  comm_wake_waiters(comm);
  INFO(LOG_INIT, "comm %p rank %d: revoked", (void*)comm, comm->rank);
  return comm_wait_idle(comm, 1000) ? ncclSuccess : ncclInProgress;
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
         ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                            ncclConfig_t* config, int shrinkFlags) {
  NCCLCHECK(comm_check(comm, "ncclCommShrink"));
  if (newcomm == NULL) return err_set(ncclInvalidArgument, "ncclCommShrink: newcomm is NULL");
  *newcomm = NULL;
  if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT)
    return err_set(ncclInvalidArgument,
                   "ncclCommShrink: shrinkFlags 0x%x unknown (NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT)", shrinkFlags);
  if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == NULL))
    return err_set(ncclInvalidArgument, "ncclCommShrink: excludeRanksList is NULL or excludeRanksCount %d < 0",
                   excludeRanksCount);
  int n = comm->nranks;
  uint8_t* out = calloc((size_t)n, 1);
  int* members = calloc((size_t)n, sizeof(int));
  ncclResult_t res = ncclSuccess;
  if (!out || !members) {
    res = err_set(ncclSystemError, "ncclCommShrink: out of memory");
    goto done;
  }
  for (int i = 0; i < excludeRanksCount; i++) {
    int x = excludeRanksList[i];
    if (x < 0 || x >= n) {
      res = err_set(ncclInvalidArgument, "ncclCommShrink: excludeRanksList[%d] = %d outside [0, %d)", i, x, n);
      goto done;
    }
    if (out[x]) {
      res = err_set(ncclInvalidArgument, "ncclCommShrink: rank %d appears twice in excludeRanksList", x);
      goto done;
    }
    out[x] = 1;
  }
  /* (A list that excludes every rank excludes the caller too.) */
  if (out[comm->rank]) {
    res = err_set(ncclInvalidUsage,
                  "ncclCommShrink: rank %d is in excludeRanksList; excluded ranks must not call ncclCommShrink",
                  comm->rank);
    goto done;
  }
  if (comm->finalized) {
    res = err_set(ncclInvalidUsage, "ncclCommShrink: the parent communicator was finalized");
    goto done;
  }
  if (shrinkFlags == NCCL_SHRINK_ABORT) {
    /* Whatever still runs on the parent (blocked on a dead rank, perhaps)
     * stops first; the bootstrap between survivors keeps working. */
    __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
    comm_wake_waiters(comm);
    comm_wait_idle(comm, 60000);
    for (int r = 0; r < n; r++)
      if (out[r]) bootstrap_peer_failed(comm->bs, r);
  } else {
    async_drain(comm);
  }
  int m = 0, newrank = -1;
  for (int r = 0; r < n; r++) {
    if (out[r]) continue;
    if (r == comm->rank) newrank = m;
    members[m++] = r;
  }
  uint32_t tag = TAG_SHRINK_ID + (uint32_t)(comm->nsplits++ & 0xffffff);
  ncclUniqueId id;
  if (newrank == 0) {
    NCCLCHECKGOTO(bootstrap_create_id(&id), res, done);
    for (int i = 1; i < m; i++) NCCLCHECKGOTO(bootstrap_send(comm->bs, members[i], tag, &id, sizeof(id)), res, done);
  } else {
    NCCLCHECKGOTO(bootstrap_recv(comm->bs, members[0], tag, &id, sizeof(id)), res, done);
  }
  INFO(LOG_INIT, "ncclCommShrink: rank %d -> rank %d of %d (%d excluded%s)", comm->rank, newrank, m,
       excludeRanksCount, shrinkFlags == NCCL_SHRINK_ABORT ? ", parent aborted" : "");
  res = comm_init(newcomm, m, 1, &id, newrank, config ? config : &comm->config, "ncclCommShrink");
done:
  free(out);
  free(members);
  return res;
}
