/* Reduce along the ring as a pipelined chain ending at the root:
 * root+1 -> root+2 -> ... -> root, each hop adding its contribution. */
#include "coll.h"

ncclResult_t ring_reduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t esz = dtype_size(a->dt);
  if (a->count == 0) return ncclSuccess;
  const char* in = a->sendbuff;
  char* out = a->recvbuff;
  if (n == 1) {
    red_pre(&a->op, out, in, a->count);
    return ncclSuccess;
  }
  int pos = (r - a->root - 1 + 2 * n) % n; /* root is last */
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  int nsend = pos < n - 1, nrecv = pos > 0;
  struct conn *sc = NULL, *rc = NULL;
  NCCLCHECK(transport_connect(comm, &next, nsend, &prev, nrecv, &sc, &rc));
  struct prim_link l[2] = {{0}, {0}};
  if (nsend) prim_begin(&l[0], sc, coll_token(a, a->count * esz));
  if (nrecv) prim_begin(&l[1], rc, coll_token(a, a->count * esz));
  size_t chunk = comm->slot_bytes / esz;
  ncclResult_t res = ncclSuccess;
  for (size_t off = 0; off < a->count && res == ncclSuccess; off += chunk) {
    size_t len = COLLIE_MIN(chunk, a->count - off);
    if (pos == 0) res = prim_send_pre(&l[0], &a->op, in + off * esz, len);
    else if (pos < n - 1) res = prim_recv_reduce_send(&l[1], &l[0], &a->op, in + off * esz, len);
    else res = prim_recv_reduce_copy(&l[1], NULL, &a->op, in + off * esz, out + off * esz, len, a->avg ? n : 0);
  }
  if (res != ncclSuccess) return prim_fail(comm, l, 2, res);
  return ncclSuccess;
}
