/* Reduce along a ring as a pipelined chain ending at the root:
 * root+1 -> root+2 -> ... -> root, each hop adding its contribution. Works
 * on any ring_view (the host-local ring for the hierarchical algorithm). */
#include "coll.h"

ncclResult_t ring_reduce_view(struct coll_args* a, const struct ring_view* v, int root_pos, const void* sendbuff,
                              void* recvbuff, int avg_n) {
  struct ncclComm* comm = a->comm;
  int n = v->n, r = v->pos;
  size_t esz = dtype_size(a->dt);
  if (a->count == 0) return ncclSuccess;
  const char* in = sendbuff;
  char* out = recvbuff;
  if (n == 1) {
    red_pre(&a->op, out, in, a->count);
    if (avg_n > 1) red_div(a->dt, out, out, a->count, avg_n);
    return ncclSuccess;
  }
  int pos = (r - root_pos - 1 + 2 * n) % n; /* the root is last */
  int next = v->ranks[(r + 1) % n], prev = v->ranks[(r + n - 1) % n];
  int nsend = pos < n - 1, nrecv = pos > 0;
  struct conn *sc = NULL, *rc = NULL;
  NCCLCHECK(transport_connect_ch(comm, v->ch, &next, nsend, &prev, nrecv, &sc, &rc));
  struct prim_link l[2] = {{0}, {0}};
  if (nsend) prim_begin(&l[0], sc, coll_token(a, a->count * esz));
  if (nrecv) prim_begin(&l[1], rc, coll_token(a, a->count * esz));
  l[1].out_far = a->out_far;
  size_t chunk = coll_chunk(a) / esz;
  ncclResult_t res = ncclSuccess;
  for (size_t off = 0; off < a->count && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, a->count - off);
    if (pos == 0) res = prim_send_pre(&l[0], &a->op, in + off * esz, len);
    else if (pos < n - 1) res = prim_recv_reduce_send(&l[1], &l[0], &a->op, in + off * esz, len);
    else res = prim_recv_reduce_copy(&l[1], NULL, &a->op, in + off * esz, out + off * esz, len, avg_n);
  }
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return (n - 1) * c->link.alpha_us + bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  if (p->nch > 1) return channels_run(a, p->nch);
  struct ring_view v = ring_full(a->comm);
  return ring_reduce_view(a, &v, a->comm->ring_pos[a->root], a->sendbuff, a->recvbuff,
                          a->avg ? a->comm->nranks : 0);
}

const struct algo algo_ring_reduce = {COLL_REDUCE, ALGO_RING, PROTO_SIMPLE, ALGO_F_CHANNELS,
                                      algo_always, estimate, run};
