/* Ring reduce-scatter: the partial sum of rank j's block starts at the ring
 * position after j's and gathers one contribution per hop, arriving complete
 * at rank j after n-1 hops (ring in locality order). A channel reduces the
 * element range [off, off+len) of every block. */
#include "coll.h"

/* The 2-rank schedule: item k of either direction is chunk k. */
struct rs2_arg {
  const char *peer_block, *my_block;
  char* out;
  size_t len, chunk, esz; /* elements */
};

static void rs2_item(const struct prim_pump* p, int is_send, int k, struct pump_item* it) {
  const struct rs2_arg* x = p->arg;
  size_t off = (size_t)k * x->chunk, len = COLLIE_MIN(x->chunk, x->len - off);
  *it = (struct pump_item){.bytes = len * x->esz};
  if (is_send) {
    it->src = x->peer_block + off * x->esz;
    it->pre = 1;
  } else {
    it->local = x->my_block + off * x->esz;
    it->dst = x->out + off * x->esz;
  }
}

ncclResult_t ring_reducescatter_view(struct coll_args* a, const struct ring_view* v, size_t off0, size_t len0) {
  struct ncclComm* comm = a->comm;
  int n = v->n, p = v->pos;
  size_t esz = dtype_size(a->dt), rc_count = a->count;
  const char* in = a->sendbuff;
  char* out = a->recvbuff;
  if (len0 == 0) return ncclSuccess;
  if (n == 1) {
    red_pre(&a->op, out + off0 * esz, in + off0 * esz, len0);
    return ncclSuccess;
  }
  int next = v->ranks[(p + 1) % n], prev = v->ranks[(p + n - 1) % n];
  struct conn *sc, *rc;
  NCCLCHECK(transport_connect_ch(comm, v->ch, &next, 1, &prev, 1, &sc, &rc));
  struct prim_link l[2];
  prim_begin(&l[0], sc, coll_token(a, rc_count * esz));
  prim_begin(&l[1], rc, coll_token(a, rc_count * esz));
  l[1].out_far = a->out_far;
  size_t chunk = coll_chunk(a) / esz;
  ncclResult_t res = ncclSuccess;
  if (n == 2 && sc->ops->send_commit_ext) {
    /* Sockets: each rank sends its contribution to the peer's block and
     * reduces the peer's into its own, both directions at once (prim_pump),
     * as the 2-rank allgather. Beside a CPU hog (2 ranks bound a CPU each
     * over loopback, 5 interleaved rounds) 2-128 MiB took 0.65-0.85x the
     * lock step's time; without one, 1.0x at 2-8 MiB but 1.05-1.17x at
     * 32-128 MiB (still a third of Open MPI's). Sends held to at most 1 or 3
     * chunks ahead of the receives lost most of the gain beside the hog and
     * most of the cost without it (docs/BENCHMARKS.md, "Lock step at 2
     * ranks"): the run-ahead is the point. Over shared memory the
     * lock step stays: it reduces each slot while the peer's copy into it
     * is still in cache (the exchange was 5-25% slower at 512 KiB-32 MiB). */
    struct rs2_arg x = {in + ((size_t)next * rc_count + off0) * esz, in + ((size_t)comm->rank * rc_count + off0) * esz,
                        out + off0 * esz, len0, chunk, esz};
    int k = (int)((len0 + chunk - 1) / chunk);
    struct prim_pump pp = {&l[0], &l[1], k, k, &a->op, a->avg ? n : 0, rs2_item, &x};
    res = prim_pump(&pp);
    if (res != ncclSuccess) return prim_fail(comm, res);
    return ncclSuccess;
  }
#define BLOCK(pos) (in + ((size_t)v->ranks[(pos)] * rc_count + off) * esz)
  for (size_t off = off0; off < off0 + len0 && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, off0 + len0 - off);
    res = prim_send_pre(&l[0], &a->op, BLOCK((p - 1 + n) % n), len);
    for (int st = 1; st < n - 1 && res == ncclSuccess; st++)
      res = prim_recv_reduce_send(&l[1], &l[0], &a->op, BLOCK((p - st - 1 + 2 * n) % n), len);
    if (res == ncclSuccess)
      res = prim_recv_reduce_copy(&l[1], NULL, &a->op, BLOCK(p), out + off * esz, len, a->avg ? n : 0);
  }
#undef BLOCK
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return (n - 1) * c->link.alpha_us + (n - 1) * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  if (p->nch > 1) return channels_run(a, p->nch);
  struct ring_view v = ring_full(a->comm);
  return ring_reducescatter_view(a, &v, 0, a->count);
}

const struct algo algo_ring_reducescatter = {COLL_REDUCESCATTER, ALGO_RING, PROTO_SIMPLE, ALGO_F_CHANNELS,
                                             algo_always,        estimate,  run};
