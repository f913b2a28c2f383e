/* Ring allgather: each rank's block travels n-1 hops around the ring (in
 * locality order), chunk by chunk; every rank copies what passes into its
 * output (at the block's rank index) and forwards it. A channel moves the
 * byte range [off, off+len) of every block. */
#include <string.h>

#include "coll.h"

ncclResult_t ring_allgather_view(struct coll_args* a, const struct ring_view* v, size_t off0, size_t len0) {
  struct ncclComm* comm = a->comm;
  int n = v->n, p = v->pos;
  size_t bytes = a->count * dtype_size(a->dt); /* block stride */
  char* out = a->recvbuff;
  if (len0 == 0) return ncclSuccess;
  char* mine = out + (size_t)comm->rank * bytes;
  const char* in = a->sendbuff;
  /* Out of place, this rank's block is sent from the send buffer, and each
   * chunk copied to the output right after it is sent, while it is still in
   * this core's cache: a copy of the whole block first, then the sends from
   * the output, read the block twice from further away and held the peer's
   * first slot back by the whole copy (2 ranks, 2 MiB: 57.6 against 76.2 us,
   * 4 MiB 126 against 153; docs/BENCHMARKS.md, "Sent, then copied"). */
  int tee = in != mine;
  if (n == 1) {
    if (tee) memcpy(mine + off0, in + off0, len0);
    return ncclSuccess;
  }
  int next = v->ranks[(p + 1) % n], prev = v->ranks[(p + n - 1) % n];
  struct conn *sc, *rc;
  NCCLCHECK(transport_connect_ch(comm, v->ch, &next, 1, &prev, 1, &sc, &rc));
  struct prim_link l[2];
  prim_begin(&l[0], sc, coll_token(a, bytes));
  prim_begin(&l[1], rc, coll_token(a, bytes));
  ncclResult_t res = ncclSuccess;
  size_t chunk = coll_chunk(a);
  if (n == 2) {
    /* Each rank sends only its own block and receives only its peer's: both
     * directions run at once (prim_exchange), with no slot waiting for one
     * received. In lock step a rank that lost its CPU to another process held
     * its peer up on every chunk (docs/BENCHMARKS.md, "Lock step at 2 ranks"). */
    res = prim_exchange(&l[0], in + off0, len0, &l[1], out + (size_t)next * bytes + off0, len0, chunk,
                        tee ? mine + off0 : NULL);
    if (res != ncclSuccess) return prim_fail(comm, res);
    return ncclSuccess;
  }
  for (size_t off = off0; off < off0 + len0 && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, off0 + len0 - off);
    res = prim_send_tee(&l[0], in + off, len, tee ? mine + off : NULL);
    for (int st = 1; st < n - 1 && res == ncclSuccess; st++) {
      int j = v->ranks[(p - st + n) % n];
      res = prim_recv_copy_send(&l[1], &l[0], out + (size_t)j * bytes + off, len);
    }
    if (res == ncclSuccess) res = prim_recv(&l[1], out + (size_t)v->ranks[(p + 1) % n] * bytes + off, len);
  }
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

/* Over shared memory every block a rank passes on is copied twice on its
 * CPU: into the slot it sends and out of the slot it receives. (Counted once
 * before, the single-copy row never won the model at 2 ranks, where it was
 * 1.6-2.0x faster at 512 KiB-32 MiB.) */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double copies = coll_shm_only(a->comm) ? 2.0 : 1.0;
  /* On one host, plus the rank's own block copied into its place (counted
   * in place too, as the one-shot's model counts it: the estimate must not
   * differ between ranks that call in place and ranks that do not). Without
   * it the ring was chosen at 2 ranks for 8 KiB a rank, predicted 1.4 us,
   * where it takes 2.1 and the one-shot 1.8. Between hosts the one-shot's
   * model leaves that copy out too. */
  double own = coll_shm_only(a->comm) ? 1.0 : 0.0;
  return (n - 1) * c->link.alpha_us + (copies * (n - 1) + own) * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  if (p->nch > 1) return channels_run(a, p->nch);
  struct ring_view v = ring_full(a->comm);
  return ring_allgather_view(a, &v, 0, a->count * dtype_size(a->dt));
}

const struct algo algo_ring_allgather = {COLL_ALLGATHER, ALGO_RING, PROTO_SIMPLE, ALGO_F_CHANNELS,
                                         algo_always, estimate, run};
