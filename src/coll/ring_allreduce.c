/* Ring allreduce: a reduce-scatter around the ring followed by an allgather,
 * run chunk by chunk so that each connector slot is reused while it is still
 * in cache. The ring is any ordered set of ranks (a ring_view): the whole
 * communicator in locality order, or the leaders of each host for the
 * hierarchical algorithm. Position p ends the reduce-scatter owning segment p. */
#include <string.h>

#include "coll.h"

ncclResult_t ring_allreduce_view(struct coll_args* a, const struct ring_view* v, const void* sendbuff, void* recvbuff,
                                 const struct red_op* op, int avg_n) {
  struct ncclComm* comm = a->comm;
  int n = v->n, r = v->pos;
  size_t esz = dtype_size(a->dt);
  const char* in = sendbuff;
  char* out = recvbuff;
  if (a->count == 0) return ncclSuccess;
  if (n == 1) {
    red_pre(op, out, in, a->count);
    if (avg_n > 1) red_div(a->dt, out, out, a->count, avg_n);
    return ncclSuccess;
  }
  int next = v->ranks[(r + 1) % n], prev = v->ranks[(r + n - 1) % n];
  struct conn *sc, *rc;
  NCCLCHECK(transport_connect_ch(comm, v->ch, &next, 1, &prev, 1, &sc, &rc));
  struct prim_link l[2];
  prim_begin(&l[0], sc, coll_token(a, a->count * esz));
  prim_begin(&l[1], rc, coll_token(a, a->count * esz));
  /* The hierarchical algorithm's leaders run this in place on the receive
   * buffer of an out-of-place call: ordinary stores there (exec.c). */
  l[1].out_far = sendbuff != recvbuff ? a->out_far : 0;
  struct prim_link *s = &l[0], *rv = &l[1];

  size_t seg = (a->count + (size_t)n - 1) / (size_t)n;
  size_t chunk = coll_chunk(a) / esz;
  if (chunk > seg) chunk = seg;
  ncclResult_t res = ncclSuccess;
#define SEG_LEN(j) (COLLIE_MIN(seg, a->count - COLLIE_MIN(a->count, (size_t)(j) * seg)))
#define PIECE(j, off) (SEG_LEN(j) > (off) ? COLLIE_MIN(chunk, SEG_LEN(j) - (off)) : 0)
#define AT(buf, j, off) ((buf) + ((size_t)(j) * seg + (off)) * esz)
  for (size_t off = 0; off < seg && res == ncclSuccess; off += chunk) {
    int j = (r - 1 + n) % n;
    res = prim_send_pre(s, op, AT(in, j, off), PIECE(j, off));
    for (int st = 1; st < n - 1 && res == ncclSuccess; st++) {
      j = (r - st - 1 + 2 * n) % n;
      res = prim_recv_reduce_send(rv, s, op, AT(in, j, off), PIECE(j, off));
    }
    if (res != ncclSuccess) break;
    res = prim_recv_reduce_copy(rv, s, op, AT(in, r, off), AT(out, r, off), PIECE(r, off), avg_n);
    for (int st = 1; st < n - 1 && res == ncclSuccess; st++) {
      j = (r - st + n) % n;
      res = prim_recv_copy_send(rv, s, AT(out, j, off), PIECE(j, off) * esz);
    }
    if (res != ncclSuccess) break;
    j = (r + 1) % n;
    res = prim_recv(rv, AT(out, j, off), PIECE(j, off) * esz);
  }
#undef SEG_LEN
#undef PIECE
#undef AT
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return 2.0 * (n - 1) * c->link.alpha_us + 2.0 * (n - 1) / n * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  if (p->nch > 1) return channels_run(a, p->nch);
  struct ring_view v = ring_full(a->comm);
  return ring_allreduce_view(a, &v, a->sendbuff, a->recvbuff, &a->op, a->avg ? a->comm->nranks : 0);
}

const struct algo algo_ring_allreduce = {COLL_ALLREDUCE, ALGO_RING, PROTO_SIMPLE, ALGO_F_CHANNELS,
                                         algo_always, estimate, run};
