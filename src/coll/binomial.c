/* Reduce up a binomial tree over point-to-point connectors, for small
 * messages between hosts. Ranks are numbered from the root (v = rank - root
 * mod n); rank v receives from v + 1, v + 2, v + 4, ... (each below n and
 * below v's lowest set bit), combines, and sends to v less its lowest set
 * bit. ceil(log2 n) steps from the furthest leaf to the root where the
 * ring's chain (ring_reduce.c) takes n-1, and the root gets log2(n) messages
 * where the one-shot (direct_net.c) gives it n-1; every rank still sends one
 * message, half of them (the leaves) nothing else, and those run ahead into
 * their next call.
 *
 * A rank combines its children's partials in a fixed order (its own, then
 * v + 1's, v + 2's, ...: the nearest, a leaf, comes first), so the result
 * does not depend on timing; chunk by chunk, like the chain. */
#include <stdlib.h>

#include "coll.h"
#include "../transport/transport.h"

#define BINOMIAL_MAX_BYTES (64 * 1024)

/* Between hosts of one rank each (shared memory has its mailboxes; where
 * hosts hold several ranks the ring's chain, in locality order, crosses
 * between them once per host, and the tree has not been measured there),
 * from 3 ranks on (at 2 the tree is the chain). */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  return !coll_shm_only(comm) && comm->max_local == 1 && comm->nranks > 2 &&
         a->count * dtype_size(a->dt) <= BINOMIAL_MAX_BYTES;
}

/* A step a level. Measured against the chain, each rank a host of its own
 * over loopback TCP on 2 CPUs, unbound, medians of 5 interleaved rounds, us a
 * call, tree / chain / Open MPI (bench/ab_env.sh reduce, NCCL_ALGO=Tree and
 * Ring): 8 ranks 8 B 7.84 / 12.4 / 10.9, 512 B 10.1 / 17.6 / 13.3, 2 KiB 14.6
 * / 19.9 / 28.3, 32 KiB 39.3 / 46.2 / 321; 4 ranks 512 B 4.78 / 6.79 / 8.32,
 * 2 KiB 7.33 / 8.99 / 18.1, 32 KiB 20.8 / 21.7 / 251; beside a busy loop 8
 * ranks 8 B 10.9 / 16.8 / 10.7, 512 B 11.2 / 25.6 / 16.7, 4 ranks 512 B 6.76
 * / 12.5 / 10.5. Even or ahead at every size of 8 B-32 KiB. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return coll_ceil_log2(a->comm->nranks) * (c->link.alpha_us + bytes / c->link.bw);
}

static ncclResult_t binomial_reduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t esz = dtype_size(a->dt);
  int v = (r - a->root + n) % n;
  /* Children: v + m for every power of two m below v's lowest set bit (the
   * root: below n) with v + m < n. */
  int low = v ? (v & -v) : 1 << coll_ceil_log2(n);
  int kids[32], nkids = 0;
  for (int m = 1; m < low && v + m < n; m <<= 1) kids[nkids++] = (r + m) % n;
  int parent = v ? (v - low + a->root) % n : -1;
  struct conn *sc = NULL, *rc[32];
  NCCLCHECK(transport_connect(comm, &parent, parent >= 0, kids, nkids, &sc, rc));
  struct prim_link sl = {0}, rl[32];
  uint64_t tok = coll_token(a, a->count * esz);
  if (parent >= 0) prim_begin(&sl, sc, tok);
  for (int i = 0; i < nkids; i++) prim_begin(&rl[i], rc[i], tok);
  /* Where an inner rank builds its partial, a chunk at a time: the root's
   * output, else a buffer of its own (the caller's send buffer stays as it was). */
  size_t chunk = coll_chunk(a) / esz;
  if (chunk > a->count) chunk = a->count;
  char small[4096];
  char* acc = a->recvbuff;
  if (parent >= 0 && nkids) acc = chunk * esz <= sizeof(small) ? small : malloc(chunk * esz);
  if (!acc) return prim_fail(comm, err_set(ncclSystemError, "out of memory in a binomial-tree reduce"));
  /* Partials are already scaled (premulsum): they combine by a plain sum. */
  struct red_op sum = a->op;
  if (sum.kind == RED_PREMULSUM) sum.kind = RED_SUM;
  ncclResult_t res = ncclSuccess;
  for (size_t off = 0; off < a->count && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, a->count - off);
    const char* in = (const char*)a->sendbuff + off * esz;
    char* out = parent < 0 ? (char*)a->recvbuff + off * esz : acc;
    if (!nkids) { /* a leaf: its own data, scaled, up */
      res = prim_send_pre(&sl, &a->op, in, len);
      continue;
    }
    /* out = pre(in) OP the first child's partial, then OP each next one. */
    res = prim_recv_reduce_copy(&rl[0], NULL, &a->op, in, out, len, 0);
    for (int i = 1; i < nkids && res == ncclSuccess; i++)
      res = prim_recv_reduce_copy(&rl[i], NULL, &sum, out, out, len, 0);
    if (res == ncclSuccess && parent >= 0) res = prim_send(&sl, out, len * esz);
    else if (res == ncclSuccess && a->avg) red_div(a->dt, out, out, len, n);
  }
  if (acc != a->recvbuff && acc != small) free(acc);
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  if (a->count == 0) return ncclSuccess;
  return binomial_reduce(a);
}

const struct algo algo_binomial_reduce = {COLL_REDUCE, ALGO_TREE, PROTO_SIMPLE, 0, eligible, estimate, run};
