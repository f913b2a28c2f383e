/* ncclCommRevoke and ncclCommShrink: stopping a communicator's work without
 * destroying it, and building a communicator of the survivors. The survivors
 * agree on a new bootstrap without the excluded ranks: the first survivor (the
 * coordinator) collects a "joined" note from every other within
 * COLLIE_SHRINK_TIMEOUT, then hands them a fresh unique ID, or the list of
 * ranks that never came, over the parent's bootstrap connections (pairwise,
 * so a dead rank does not disturb them); then all run the ordinary init.
 * Talks to init.c (comm_init) and async.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "failures.h"

/* Tags of one shrink (its sequence number in the low 24 bits). */
#define TAG_SHRINK_HERE 0x7b000000u  /* coordinator -> members: it is in the shrink */
#define TAG_SHRINK_JOIN 0x7a000000u  /* member -> coordinator: so is this rank */
#define TAG_SHRINK_REPLY 0x79000000u /* coordinator -> members: the ID or who is missing */
#define SHRINK_MISSING_MAX 16

struct shrink_reply {
  int32_t ok;
  int32_t nmissing; /* parent ranks that did not join in time (the first SHRINK_MISSING_MAX listed) */
  int32_t missing[SHRINK_MISSING_MAX];
  ncclUniqueId id;
};

static void missing_str(struct ncclComm* comm, const struct shrink_reply* r, char* buf, size_t n) {
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < r->nmissing && i < SHRINK_MISSING_MAX && off + 1 < n; i++) {
    int x = r->missing[i];
    const char* host = x >= 0 && x < comm->nranks ? comm->peers[x].hostname : "?";
    off += (size_t)snprintf(buf + off, n - off, "%s%d (%s)", i ? ", " : "", x, host);
  }
  if (r->nmissing > SHRINK_MISSING_MAX && off + 1 < n) snprintf(buf + off, n - off, " and %d more", r->nmissing - SHRINK_MISSING_MAX);
}

/* The survivors' rendezvous on the parent: fills *id (the new bootstrap's) or
 * fails naming the ranks that did not call ncclCommShrink within `wait_ms`.
 * Every rank's wait is bounded: the coordinator waits wait_ms for the joins;
 * a member waits wait_ms for the coordinator to show up, then as long again
 * (plus slack) for its answer. */
static ncclResult_t shrink_rendezvous(struct ncclComm* comm, const int* members, int m, int newrank, uint32_t seq,
                                      int64_t wait_ms, ncclUniqueId* id) {
  struct bootstrap* bs = comm->bs;
  int c = members[0], to = 0;
  double secs = wait_ms / 1000.0;
  struct shrink_reply* rep = calloc(1, sizeof(*rep));
  if (!rep) return err_set(ncclSystemError, "ncclCommShrink: out of memory");
  ncclResult_t res = ncclSuccess;
  int32_t one = 1;
  if (newrank == 0) {
    for (int i = 1; i < m; i++)
      NCCLCHECKGOTO(bootstrap_send_ctl(bs, members[i], TAG_SHRINK_HERE | seq, &one, sizeof(one), 0, NULL), res, out);
    int64_t end = time_ms() + wait_ms;
    for (int i = 1; i < m; i++) {
      int32_t v;
      int64_t left = end - time_ms();
      /* Past the deadline, still take joins that have arrived. */
      res = bootstrap_recv_ctl(bs, members[i], TAG_SHRINK_JOIN | seq, &v, sizeof(v), left > 1 ? left : 1, &to);
      if (res == ncclSuccess) continue;
      if (!to) goto out; /* it failed (or abort): that error stands */
      res = ncclSuccess;
      if (rep->nmissing < SHRINK_MISSING_MAX) rep->missing[rep->nmissing] = members[i];
      rep->nmissing++;
    }
    rep->ok = rep->nmissing == 0;
    if (rep->ok) NCCLCHECKGOTO(bootstrap_create_fresh_id(&rep->id), res, out);
    /* Members that never joined get the answer too: if one calls later, it
     * learns at once that it came too late. */
    for (int i = 1; i < m; i++) {
      ncclResult_t r2 = bootstrap_send_ctl(bs, members[i], TAG_SHRINK_REPLY | seq, rep, sizeof(*rep), 0, NULL);
      if (r2 != ncclSuccess && rep->ok) {
        res = r2;
        goto out;
      }
    }
  } else {
    NCCLCHECKGOTO(bootstrap_send_ctl(bs, c, TAG_SHRINK_JOIN | seq, &one, sizeof(one), 0, NULL), res, out);
    int32_t v;
    res = bootstrap_recv_ctl(bs, c, TAG_SHRINK_HERE | seq, &v, sizeof(v), wait_ms, &to);
    if (res != ncclSuccess) {
      if (to)
        res = err_set(ncclRemoteError,
                      "ncclCommShrink: rank %d: rank %d (%s) did not call ncclCommShrink within %.1f s "
                      "(COLLIE_SHRINK_TIMEOUT); it is alive (no failure seen) but never joined",
                      comm->rank, c, comm->peers[c].hostname, secs);
      goto out;
    }
    res = bootstrap_recv_ctl(bs, c, TAG_SHRINK_REPLY | seq, rep, sizeof(*rep), wait_ms + 5000, &to);
    if (res != ncclSuccess) {
      if (to)
        res = err_set(ncclRemoteError, "ncclCommShrink: rank %d: the coordinator, rank %d (%s), never answered",
                      comm->rank, c, comm->peers[c].hostname);
      goto out;
    }
  }
  if (!rep->ok) {
    char names[512];
    missing_str(comm, rep, names, sizeof(names));
    res = err_set(ncclRemoteError,
                  "ncclCommShrink: rank %d: rank(s) %s did not call ncclCommShrink within %.1f s "
                  "(COLLIE_SHRINK_TIMEOUT); alive (no failure seen) but never joined",
                  comm->rank, names, secs);
    goto out;
  }
  *id = rep->id;
out:
  free(rep);
  return res;
}

/* Running work ends at its next wait (every wait checks the flag before it
 * sleeps); queued nonblocking work is dropped; new calls are refused.
 * 1 once nothing runs on comm, within `ms`. */
static int revoke_wait(struct ncclComm* comm, int ms) {
  __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
  comm_wake_waiters(comm);
  return comm_wait_idle(comm, ms);
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  NCCLCHECK(comm_check(comm, "ncclCommRevoke"));
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return err_set(ncclInvalidArgument, "ncclCommRevoke: revokeFlags 0x%x unknown (pass NCCL_REVOKE_DEFAULT)",
                   revokeFlags);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "ncclCommRevoke: comm %p is already revoked", (void*)comm);
  if (comm->finalized) return err_set(ncclInvalidUsage, "ncclCommRevoke: comm %p was finalized", (void*)comm);
  INFO(LOG_INIT, "comm %p rank %d: revoked", (void*)comm, comm->rank);
  return revoke_wait(comm, 1000) ? ncclSuccess : ncclInProgress;
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
    revoke_wait(comm, 60000);
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
  uint32_t seq = comm->nsplits++ & 0xffffff;
  /* How long survivors wait for each other: read here, on the caller's thread. */
  int64_t wait_s = param_int(P_COLLIE_SHRINK_TIMEOUT, 0, 86400);
  if (wait_s == 0) wait_s = 2 * param_int(P_COLLIE_PEER_TIMEOUT, 0, 86400);
  if (wait_s == 0) wait_s = param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400);
  ncclUniqueId id;
  int64_t t0 = time_ns();
  NCCLCHECKGOTO(shrink_rendezvous(comm, members, m, newrank, seq, wait_s * 1000, &id), res, done);
  INFO(LOG_INIT, "ncclCommShrink: rank %d -> rank %d of %d (%d excluded%s), rendezvous %.3f ms", comm->rank, newrank, m,
       excludeRanksCount, shrinkFlags == NCCL_SHRINK_ABORT ? ", parent aborted" : "", (time_ns() - t0) / 1e6);
  res = comm_init(newcomm, m, 1, &id, newrank, config ? config : &comm->config, "ncclCommShrink");
done:
  free(out);
  free(members);
  return res;
}
