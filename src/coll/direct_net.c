/* One-shot algorithms over point-to-point connectors, for small messages
 * between hosts (or with shared memory off): every rank sends what each peer
 * needs straight to it and combines what it receives, in rank order so all
 * ranks get identical results. One network latency instead of the ring's
 * 2(n-1); the price is n-1 messages per rank, so the tuner uses it only for
 * small messages. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

static size_t net_direct_max_bytes(void) { return 64 * 1024; }

/* Not where the shared-memory mailboxes serve (direct_shm.c). */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  return !coll_shm_only(comm) && comm->nranks > 1 && comm->nranks <= 32 &&
         a->count * dtype_size(a->dt) <= net_direct_max_bytes();
}

/* One exchange; every message costs a little sender time.
 *
 * A broadcast's or a reduce's root handles n-1 messages a call, where each
 * rank of the ring's chain handles two. On a machine whose ranks are hosts of
 * their own and outnumber its CPUs (tuning.c, sock_oversub), every message
 * is CPU time the other ranks wait for, and the calls of these one-way
 * collectives overlap (the root of a broadcast runs ahead, the senders of a
 * reduce do), so the busiest rank sets the pace: the root's n-1 messages
 * each cost a whole step. 4 ranks over loopback TCP on 2 CPUs, us a call,
 * one-shot / chain / Open MPI: broadcast 8 B 6.84 / 2.82 / 4.06, 4 KiB 9.15
 * / 4.61 / 7.94; reduce 64 B 4.08 / 2.30 / 1.68; 8 ranks broadcast 8 B
 * 18.3 / 5.11 / 6.99, reduce 512 B 12.2 / 4.85 / 3.10. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  int rooted = a->kind == COLL_BROADCAST || a->kind == COLL_REDUCE;
  if (rooted && a->comm->sock_oversub > 1) return c->link.alpha_us + (n - 1) * (c->link.alpha_us + bytes / c->link.bw);
  /* The same crowding makes each of an allreduce's n-1 messages each way a
   * step of its own (doubling.c: log2(n) of them). 4 ranks over loopback TCP
   * on 2 CPUs, us, one-shot / doubling / Open MPI: 512 B 29.8 / 16.7 / 26.4,
   * 4 KiB 34.3 / 22.0 / 31.9; 8 ranks 8 B 124 / 59.6 / 94.1, 32 KiB 285 /
   * 129 / 209. */
  if (a->comm->sock_oversub > 1) return (n - 1) * (1.1 * c->link.alpha_us + bytes / c->link.bw);
  double per = rooted ? 1.0 : (double)(n - 1);
  return c->link.alpha_us + 0.1 * c->link.alpha_us * per + per * bytes / c->link.bw;
}

/* Sends `out[p]` (bytes each, NULL: nothing) to every peer p and receives
 * from every peer p into tmp + p*bytes where `want[p]` is set. */
static ncclResult_t exchange(struct coll_args* a, const char* const* out, const char* want, char* tmp, size_t bytes) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  struct p2p_op ops[2 * 32]; /* eligible() keeps n <= 32: no allocation per call */
  memset(ops, 0, sizeof(ops[0]) * (size_t)(2 * n));
  int k = 0;
  uint64_t tok = coll_token(a, a->count * dtype_size(a->dt));
  for (int i = 1; i < n; i++) {
    int p = (r + i) % n, q = (r - i + n) % n;
    if (out[p]) ops[k++] = (struct p2p_op){.peer = p, .is_send = 1, .buf = (char*)out[p], .bytes = bytes, .token = tok};
    if (want[q]) ops[k++] = (struct p2p_op){.peer = q, .is_send = 0, .buf = tmp + (size_t)q * bytes, .bytes = bytes, .token = tok};
  }
  return p2p_run(comm, ops, k, 0);
}

/* dst = OP over ranks of src(rank), rank order; src(me) is `mine`. */
static void combine(struct coll_args* a, char* dst, const char* tmp, const char* mine, size_t bytes) {
  int n = a->comm->nranks;
  const void* srcs[32];
  for (int i = 0; i < n; i++) srcs[i] = i == a->comm->rank ? mine : tmp + (size_t)i * bytes;
  red_reduce_n(&a->op, dst, srcs, n, a->count);
  if (a->avg) red_div(a->dt, dst, dst, a->count, n);
}

static ncclResult_t net_direct_run(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t esz = dtype_size(a->dt), bytes = a->count * esz;
  const char* in = a->sendbuff;
  char* outb = a->recvbuff;
  const char* out[32];
  char want[32];
  /* Small messages (the common case here) stage on the stack. */
  char small[4096];
  char* tmp = bytes * (size_t)n <= sizeof(small) ? small : malloc(bytes * (size_t)n + 1);
  if (!tmp) return err_set(ncclSystemError, "out of memory in a one-shot %s", coll_name(a->kind));
  ncclResult_t res = ncclSuccess;
  for (int p = 0; p < n; p++) {
    out[p] = p == r ? NULL : in;
    want[p] = p != r;
  }
  switch (a->kind) {
    case COLL_ALLREDUCE:
      res = exchange(a, out, want, tmp, bytes);
      /* In place, the result overwrites what was sent: over sockets the
       * send may still read it from the caller's buffer (send_commit_ext),
       * so it must have left first. */
      if (res == ncclSuccess && outb == in) res = transport_flush(a->comm);
      if (res == ncclSuccess) combine(a, outb, tmp, in, bytes);
      break;
    case COLL_ALLGATHER:
      res = exchange(a, out, want, outb, bytes);
      if (res == ncclSuccess && outb + (size_t)r * bytes != in) memcpy(outb + (size_t)r * bytes, in, bytes);
      break;
    case COLL_REDUCE:
      for (int p = 0; p < n; p++) {
        out[p] = p == a->root && r != a->root ? in : NULL;
        want[p] = r == a->root && p != r;
      }
      res = exchange(a, out, want, tmp, bytes);
      if (res == ncclSuccess && r == a->root) combine(a, outb, tmp, in, bytes);
      break;
    case COLL_BROADCAST:
      for (int p = 0; p < n; p++) {
        out[p] = r == a->root && p != r ? in : NULL;
        want[p] = p == a->root && r != a->root;
      }
      res = exchange(a, out, want, tmp, bytes);
      if (res == ncclSuccess) {
        if (r != a->root) memcpy(outb, tmp + (size_t)a->root * bytes, bytes);
        else if (outb != in) memcpy(outb, in, bytes);
      }
      break;
    case COLL_REDUCESCATTER:
      /* Block p goes to rank p; this rank combines block r from everyone. */
      for (int p = 0; p < n; p++) out[p] = p == r ? NULL : in + (size_t)p * bytes;
      res = exchange(a, out, want, tmp, bytes);
      if (res == ncclSuccess) combine(a, outb, tmp, in + (size_t)r * bytes, bytes);
      break;
    default:
      res = err_set(ncclInternalError, "one-shot %s is not an algorithm", coll_name(a->kind));
  }
  if (tmp != small) free(tmp);
  return res;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  return net_direct_run(a);
}

#define DIRECT_NET_ROW(coll) {coll, ALGO_DIRECT, PROTO_LL, 0, eligible, estimate, run}
const struct algo algo_direct_net_allreduce = DIRECT_NET_ROW(COLL_ALLREDUCE);
const struct algo algo_direct_net_broadcast = DIRECT_NET_ROW(COLL_BROADCAST);
const struct algo algo_direct_net_reduce = DIRECT_NET_ROW(COLL_REDUCE);
const struct algo algo_direct_net_allgather = DIRECT_NET_ROW(COLL_ALLGATHER);
const struct algo algo_direct_net_reducescatter = DIRECT_NET_ROW(COLL_REDUCESCATTER);
