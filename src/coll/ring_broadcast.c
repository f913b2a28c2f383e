/* Broadcast along the ring as a pipelined chain: root -> root+1 -> ... ->
 * root-1, chunk by chunk, so every link is busy at once for large messages. */
#include <string.h>

#include "coll.h"

ncclResult_t ring_broadcast(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  int pos = (r - a->root + n) % n;
  if (pos == 0 && a->sendbuff != a->recvbuff) memcpy(a->recvbuff, a->sendbuff, bytes);
  if (n == 1) return ncclSuccess;
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  int nsend = pos < n - 1, nrecv = pos > 0;
  struct conn *sc = NULL, *rc = NULL;
  NCCLCHECK(transport_connect(comm, &next, nsend, &prev, nrecv, &sc, &rc));
  struct prim_link l[2] = {{0}, {0}};
  if (nsend) prim_begin(&l[0], sc, coll_token(a, bytes));
  if (nrecv) prim_begin(&l[1], rc, coll_token(a, bytes));
  char* buf = a->recvbuff;
  ncclResult_t res = ncclSuccess;
  for (size_t off = 0; off < bytes && res == ncclSuccess; off += comm->slot_bytes) {
    size_t len = COLLIE_MIN(comm->slot_bytes, bytes - off);
    if (pos == 0) res = prim_send(&l[0], buf + off, len);
    else if (pos < n - 1) res = prim_recv_copy_send(&l[1], &l[0], buf + off, len);
    else res = prim_recv(&l[1], buf + off, len);
  }
  if (res != ncclSuccess) return prim_fail(comm, l, 2, res);
  return ncclSuccess;
}
