/* Double binary tree allreduce: two binary trees over the ranks, the second
 * the mirror of the first, so that a rank that is a leaf in one is inner in
 * the other; each tree reduces half of the data up to its root and
 * broadcasts it back down, chunk by chunk. 2*log2(n) steps instead of the
 * ring's 2(n-1): the latency algorithm for mid-size messages. Every rank
 * walks chunks in the same order (chunk k of tree A, then of tree B; up then
 * down), so a connector shared by both trees carries slots in one agreed order. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

struct tree_pos {
  int parent, child[2];
};

static int heap_to_rank(int n, int i, int mirror) { return mirror ? n - 1 - i : i; }

static struct tree_pos tree_of(int n, int rank, int mirror) {
  int i = mirror ? n - 1 - rank : rank;
  struct tree_pos t;
  t.parent = i == 0 ? -1 : heap_to_rank(n, (i - 1) / 2, mirror);
  for (int c = 0; c < 2; c++) t.child[c] = 2 * i + 1 + c < n ? heap_to_rank(n, 2 * i + 1 + c, mirror) : -1;
  return t;
}

/* One chunk of one tree: reduce up, then broadcast down. */
static ncclResult_t tree_chunk(struct coll_args* a, const struct tree_pos* t, struct prim_link* sl,
                               struct prim_link* rl, const struct red_op* partial, size_t off, size_t len) {
  int n = a->comm->nranks;
  size_t esz = dtype_size(a->dt), bytes = len * esz;
  const char* in = (const char*)a->sendbuff + off * esz;
  char* out = (char*)a->recvbuff + off * esz;
  /* Up: out = pre(in) (+) children's partials. */
  if (t->child[0] < 0) {
    if (t->parent >= 0) NCCLCHECK(prim_send_pre(&sl[t->parent], &a->op, in, len));
  } else {
    NCCLCHECK(prim_recv_reduce_copy(&rl[t->child[0]], NULL, &a->op, in, out, len, 0));
    if (t->child[1] >= 0) NCCLCHECK(prim_recv_reduce_copy(&rl[t->child[1]], NULL, partial, out, out, len, 0));
    if (t->parent >= 0) NCCLCHECK(prim_send(&sl[t->parent], out, bytes));
  }
  if (t->parent < 0) {
    if (t->child[0] < 0) red_pre(&a->op, out, in, len);
    if (a->avg) red_div(a->dt, out, out, len, n);
  }
  /* Down: the final values come from the parent and go to the children. */
  if (t->parent >= 0) {
    if (t->child[0] >= 0) NCCLCHECK(prim_recv_copy_send(&rl[t->parent], &sl[t->child[0]], out, bytes));
    else NCCLCHECK(prim_recv(&rl[t->parent], out, bytes));
    if (t->child[1] >= 0) NCCLCHECK(prim_send(&sl[t->child[1]], out, bytes));
  } else {
    for (int c = 0; c < 2; c++)
      if (t->child[c] >= 0) NCCLCHECK(prim_send(&sl[t->child[c]], out, bytes));
  }
  return ncclSuccess;
}

static void add_peer(int* list, int* n, int p) {
  if (p < 0) return;
  for (int i = 0; i < *n; i++)
    if (list[i] == p) return;
  list[(*n)++] = p;
}

static ncclResult_t tree_allreduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t esz = dtype_size(a->dt);
  if (a->count == 0) return ncclSuccess;
  if (n == 1) {
    red_pre(&a->op, a->recvbuff, a->sendbuff, a->count);
    return ncclSuccess;
  }
  struct tree_pos t[2] = {tree_of(n, r, 0), tree_of(n, r, 1)};
  int peers[6], np = 0;
  for (int k = 0; k < 2; k++) {
    add_peer(peers, &np, t[k].parent);
    add_peer(peers, &np, t[k].child[0]);
    add_peer(peers, &np, t[k].child[1]);
  }
  /* Every tree neighbour is both sent to and received from. */
  struct conn *sc[6], *rc[6];
  NCCLCHECK(transport_connect(comm, peers, np, peers, np, sc, rc));
  struct prim_link* sl = calloc((size_t)n, sizeof(*sl));
  struct prim_link* rl = calloc((size_t)n, sizeof(*rl));
  if (!sl || !rl) {
    free(sl);
    free(rl);
    return err_set(ncclSystemError, "out of memory in tree allreduce");
  }
  for (int i = 0; i < np; i++) {
    prim_begin(&sl[peers[i]], sc[i], coll_token(a, a->count * esz));
    prim_begin(&rl[peers[i]], rc[i], coll_token(a, a->count * esz));
  }
  /* Partial sums are already scaled: combine them with a plain sum. */
  struct red_op partial = a->op;
  if (partial.kind == RED_PREMULSUM) partial.kind = RED_SUM;
  size_t half = a->count / 2;
  size_t range_off[2] = {0, half}, range_len[2] = {half, a->count - half};
  size_t chunk = coll_chunk(a) / esz;
  size_t nchunks = (range_len[1] + chunk - 1) / chunk; /* the second half is the longer */
  ncclResult_t res = ncclSuccess;
  for (size_t k = 0; k < nchunks && res == ncclSuccess; k++) {
    for (int tr = 0; tr < 2 && res == ncclSuccess; tr++) {
      size_t off = k * chunk;
      if (off >= range_len[tr]) continue;
      size_t len = COLLIE_MIN(chunk, range_len[tr] - off);
      res = tree_chunk(a, &t[tr], sl, rl, &partial, range_off[tr] + off, len);
    }
  }
  if (res != ncclSuccess) transport_poison(comm);
  free(sl);
  free(rl);
  return res;
}

/* With more ranks than CPUs, the trees moved their bytes at about half the
 * ring's rate: 8 ranks on 2 CPUs (medians of 7 rounds, us, tree / ring /
 * one-shot / Open MPI) 512 KiB 845 / 525 / 614 / 756, 2 MiB 3854 / 1912 /
 * 1871 / 2911; only their fewer steps still pay at 32-128 KiB (32 KiB 55 /
 * 70 / 45 / 118, 128 KiB 131 / 196 / 197 / 173). Counted at the rate of the
 * ring, the model chose them at 32-512 KiB. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double per_byte = a->comm->oversub > 1 ? 4.0 : 2.0;
  return 2.0 * coll_ceil_log2(a->comm->nranks) * c->link.alpha_us + per_byte * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  return tree_allreduce(a);
}

const struct algo algo_tree_allreduce = {COLL_ALLREDUCE, ALGO_TREE, PROTO_SIMPLE, 0, algo_always, estimate, run};
