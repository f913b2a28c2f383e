/* Recursive doubling over point-to-point connectors, for small allreduces
 * between hosts: in step k every rank swaps its partial result with the rank
 * whose number differs in bit k and combines the two, so after log2(n) steps
 * every rank holds the whole result. Each rank sends log2(n) messages a call
 * where the one-shot (direct_net.c) sends n-1: on a machine whose ranks are
 * hosts of their own and outnumber its CPUs every message is CPU time the
 * other ranks wait for (tuning.c, sock_oversub), and there the fewer
 * messages win although the steps follow one another.
 *
 * A rank count that is not a power of two folds first: of the first 2*rem
 * ranks (rem = n less the largest power of two p below it), each even one
 * hands its data to the odd one above it and waits; the odd ones and the
 * ranks from 2*rem on, p in all, run the doubling, and each odd one hands
 * the result back at the end.
 *
 * Every rank gets the same bits: a pair combines (lower rank's partial) OP
 * (higher rank's partial) on both sides, so both hold the same value after
 * every step. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "../transport/transport.h"

static size_t doubling_max_bytes(void) { return 64 * 1024; }

/* Between hosts only (shared memory has its mailboxes). The estimates
 * decide against the one-shot: it wins where messages are cheap (its single
 * step), this row where the crowding makes them dear, and above the
 * one-shot's 32 ranks. */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  return !coll_shm_only(comm) && comm->nranks > 2 && a->count * dtype_size(a->dt) <= doubling_max_bytes();
}

/* The swaps, plus one for the fold and the unfold together (a message one
 * way each, and only 2*rem ranks take part). */
static int steps(int n) {
  int p = 1, s = 0;
  while (p * 2 <= n) p *= 2, s++;
  return s + (p < n ? 1 : 0);
}

/* A step is a message each way. Where messages are dear (sock_oversub) the
 * one-shot counts each of its n-1 as a step (direct_net.c). 3 / 5 / 6 ranks
 * over loopback TCP on 2 CPUs, 8 B, us, one-shot / doubling / Open MPI:
 * 13.9 / 11.5 / 16.7, 41.0 / 25.1 / 38.2, 52.5 / 29.9 / 47.4. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return steps(a->comm->nranks) * (c->link.alpha_us + bytes / c->link.bw);
}

/* One swap with `peer`: `out` goes, the peer's arrives in `tmp`. `out` is
 * the caller's buffer, which a socket may still read from after the batch
 * (send_commit_ext): it must have left before the caller overwrites it. */
static ncclResult_t swap(struct coll_args* a, int peer, const char* out, char* tmp, size_t bytes, int do_send,
                         int do_recv) {
  struct p2p_op ops[2];
  int k = 0;
  uint64_t tok = coll_token(a, bytes);
  if (do_send) ops[k++] = (struct p2p_op){.peer = peer, .is_send = 1, .buf = (char*)out, .bytes = bytes, .token = tok};
  if (do_recv) ops[k++] = (struct p2p_op){.peer = peer, .is_send = 0, .buf = tmp, .bytes = bytes, .token = tok};
  NCCLCHECK(p2p_run(a->comm, ops, k, 0));
  return do_send ? transport_flush(a->comm) : ncclSuccess;
}

/* The real rank of doubling rank v. */
static int real_rank(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  int pw = 1;
  while (pw * 2 <= n) pw *= 2;
  int rem = n - pw;
  char small[4096];
  char* tmp = bytes <= sizeof(small) ? small : malloc(bytes);
  if (!tmp) return err_set(ncclSystemError, "out of memory in a recursive-doubling allreduce");
  char* out = a->recvbuff;
  /* Partials are already scaled (premulsum): later steps only sum. */
  struct red_op sum = a->op;
  if (sum.kind == RED_PREMULSUM) sum.kind = RED_SUM;
  red_pre(&a->op, out, a->sendbuff, a->count);
  ncclResult_t res = ncclSuccess;
  int v = -1; /* this rank's number in the doubling; -1: folded away */
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      res = swap(a, r + 1, out, tmp, bytes, 1, 0);
    } else {
      res = swap(a, r - 1, out, tmp, bytes, 0, 1);
      if (res == ncclSuccess) red_reduce(&sum, out, tmp, out, a->count);
      v = r / 2;
    }
  } else {
    v = r - rem;
  }
  for (int mask = 1; v >= 0 && mask < pw && res == ncclSuccess; mask <<= 1) {
    int pv = v ^ mask;
    res = swap(a, real_rank(pv, rem), out, tmp, bytes, 1, 1);
    if (res != ncclSuccess) break;
    if (v < pv) red_reduce(&sum, out, out, tmp, a->count);
    else red_reduce(&sum, out, tmp, out, a->count);
  }
  if (res == ncclSuccess && r < 2 * rem) {
    if (r % 2 == 1) res = swap(a, r - 1, out, tmp, bytes, 1, 0);
    else res = swap(a, r + 1, out, out, bytes, 0, 1);
  }
  if (res == ncclSuccess && a->avg) red_div(a->dt, out, out, a->count, n);
  if (tmp != small) free(tmp);
  return res;
}

const struct algo algo_doubling_allreduce = {COLL_ALLREDUCE, ALGO_DOUBLING, PROTO_LL, 0, eligible, estimate, run};
