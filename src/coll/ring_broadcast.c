/* Broadcast along a ring as a pipelined chain: root -> next -> ... -> the
 * root's predecessor, chunk by chunk, so every link is busy at once for large
 * messages. Works on any ring_view (the host-local ring for the hierarchical
 * algorithm). */
#include <string.h>

#include "coll.h"

ncclResult_t ring_broadcast_view(struct coll_args* a, const struct ring_view* v, int root_pos, const void* sendbuff,
                                 void* recvbuff) {
  struct ncclComm* comm = a->comm;
  int n = v->n, r = v->pos;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  int pos = (r - root_pos + n) % n;
  if (n == 1) {
    if (sendbuff != recvbuff) memcpy(recvbuff, sendbuff, bytes);
    return ncclSuccess;
  }
  int next = v->ranks[(r + 1) % n], prev = v->ranks[(r + n - 1) % n];
  int nsend = pos < n - 1, nrecv = pos > 0;
  struct conn *sc = NULL, *rc = NULL;
  NCCLCHECK(transport_connect_ch(comm, v->ch, &next, nsend, &prev, nrecv, &sc, &rc));
  /* Out of place, the root sends from its send buffer and copies each chunk
   * to its receive buffer after sending it: the copy overlaps the receiver
   * draining the socket instead of delaying the first byte by a
   * whole-message copy, and over shared memory the chunk is read while still
   * in this core's cache (2 ranks, 8 MiB: 419 against 595 us). Where the
   * output is to bypass the cache (out_far), the whole copy goes first, with
   * streaming stores. */
  int copy_after = pos == 0 && sendbuff != recvbuff && ((conn_caps(sc) & TRANSPORT_CAP_SYSCALL_DATA) || !a->out_far);
  if (pos == 0 && sendbuff != recvbuff && !copy_after) prim_copy_out(recvbuff, sendbuff, bytes, a->out_far);
  struct prim_link l[2] = {{0}, {0}};
  if (nsend) prim_begin(&l[0], sc, coll_token(a, bytes));
  if (nrecv) prim_begin(&l[1], rc, coll_token(a, bytes));
  l[1].out_far = a->out_far;
  char* buf = recvbuff;
  ncclResult_t res = ncclSuccess;
  size_t chunk = coll_chunk(a);
  for (size_t off = 0; off < bytes && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, bytes - off);
    if (copy_after) res = prim_send_tee(&l[0], (const char*)sendbuff + off, len, buf + off);
    else if (pos == 0) res = prim_send(&l[0], buf + off, len);
    else if (pos < n - 1) res = prim_recv_copy_send(&l[1], &l[0], buf + off, len);
    else res = prim_recv(&l[1], buf + off, len);
  }
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

/* The chain moves at the pace of one link. A rank inside the chain copies
 * each byte twice (out of its slot, into the next rank's and its own
 * buffer); while the data stay in the host's cache the slot is read from
 * there at little cost, but once they stream from memory and ranks
 * outnumber CPUs those two copies take turns with everyone else's: the
 * chain moves at half a link's rate (8 ranks on 2 CPUs, 32 MiB: 22.6 ms
 * where one copy per byte predicts 10.3; 4 ranks: 11.4 against 5.2). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double copies = n > 2 && comm->oversub > 1 && !c->resident ? 2.0 : 1.0;
  return (n - 1) * c->link.alpha_us + copies * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  if (p->nch > 1) return channels_run(a, p->nch);
  struct ring_view v = ring_full(a->comm);
  return ring_broadcast_view(a, &v, a->comm->ring_pos[a->root], a->sendbuff, a->recvbuff);
}

const struct algo algo_ring_broadcast = {COLL_BROADCAST, ALGO_RING, PROTO_SIMPLE, ALGO_F_CHANNELS,
                                         algo_always, estimate, run};
