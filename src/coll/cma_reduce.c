/* Reduce at two ranks of one host, the work shared by whichever rank has a
 * CPU. The non-root sends its chunks through the FIFO from the front, as the
 * chain does (ring_reduce.c); the root reduces them as they come and, when
 * none is waiting for it, reads a chunk from the back of the non-root's
 * buffer itself (cross-memory attach) and reduces that. The two meet in the
 * middle: a claim word both map (the connector's shared words) says which
 * chunks each has taken. When both ranks run, the root is the slower side of
 * the chain (it reads two inputs per output) and rarely finds the FIFO
 * empty, so this is the chain; when the non-root shares its CPU with another
 * process, the root, which has a CPU, takes over the rest of the buffer
 * instead of waiting (2 ranks beside one busy process, 8-256 MiB: the chain
 * ran at the non-root's half CPU, 0.68-0.82x Open MPI, whose root reads
 * everything itself).
 *
 * Protocol, per operation (tag: the connector's operation number, 1..65535):
 *   words[1], words[2]: the non-root's send buffer address and call token;
 *   words[0]: tag << 48 | front << 24 | back, published by the non-root after
 *   words[1-2]: chunks [0, front) are the non-root's (they come through the
 *   FIFO in order), [back, K) the root's; front only grows (non-root, by
 *   compare-and-swap, after it holds a free slot), back only shrinks (root).
 * When front == back every chunk is taken. If the non-root took them all
 * (front == K), the root never read its buffer: both end when the root has
 * reduced chunk K-1, and the non-root may run ahead into its next call, as
 * in the chain (a root still in this call sees that call's tag in words[0]
 * and takes nothing; a stale word of this tag from 65535 operations ago has
 * front == back and makes the root wait for the FIFO, which is right).
 * Otherwise the non-root commits an empty closing slot and waits for every
 * slot to be released; the root releases it only when it has reduced
 * everything (so it reads nothing more of the non-root's buffer), after
 * clearing words[0]. */
#include <stdlib.h>

#include "coll.h"

/* How long the non-root's front must stand still before the root reads a
 * chunk itself: a few chunk copies (128 KiB at 5-10 GB/s: 13-26 us). Reading
 * as soon as the FIFO was empty lost to the chain at 512 KiB (44.7 against
 * 28.2 us, both ranks running: the root's reads, slower than taking copied
 * chunks, made it the bottleneck); 50 us was even with it. */
#define STEAL_PATIENCE_NS 50000

static int eligible(const struct coll_args* a) { return a->comm->nranks == 2 && coll_cma_eligible(a); }

/* What the chain costs (ring_reduce.c) plus a handshake, less a tenth of
 * the bytes' time: the model assumes both ranks have a CPU, where this row
 * is the chain (even with it from 128 KiB to 128 MiB, medians within 3%);
 * with a busy process beside the two ranks it was up to 1.5x faster (32 MiB:
 * 8.0 against 11.2 ms; 128 MiB: 33 against 49). docs/BENCHMARKS.md. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return 2.0 * c->link.alpha_us + 0.9 * bytes / c->link.bw;
}

static ncclResult_t run_nonroot(struct coll_args* a, struct conn* sc, uint64_t tok, size_t chunk, uint64_t nchunks) {
  size_t esz = dtype_size(a->dt);
  struct prim_link l;
  prim_begin(&l, sc, tok);
  uint64_t tag = l.opseq % 0xffff + 1;
  uint64_t* w = sc->ops->shared_words(sc);
  __atomic_store_n(&w[1], (uint64_t)(uintptr_t)a->sendbuff, __ATOMIC_RELAXED);
  __atomic_store_n(&w[2], tok, __ATOMIC_RELAXED);
  __atomic_store_n(&w[0], claim_pack(tag, 0, nchunks), __ATOMIC_RELEASE);
  const char* in = a->sendbuff;
  uint64_t f;
  for (;;) {
    void* slot;
    NCCLCHECK(prim_send_slot(&l, chunk * esz, &slot)); /* the last chunk may be shorter */
    uint64_t cur = __atomic_load_n(&w[0], __ATOMIC_ACQUIRE);
    do {
      f = claim_front(cur);
      if (f >= claim_back(cur)) goto claimed;
    } while (!__atomic_compare_exchange_n(&w[0], &cur, claim_pack(tag, f + 1, claim_back(cur)), 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    size_t off = (size_t)f * chunk, len = COLLIE_MIN(chunk, a->count - off);
    red_pre(&a->op, slot, in + off * esz, len); /* a copy unless premultiplied */
    NCCLCHECK(prim_send_commit(&l, len * esz));
  }
claimed:
  /* Every chunk came through the FIFO: the root reads nothing here. */
  if (f == nchunks) return ncclSuccess;
  /* The closing slot: the root releases it once it reads nothing more here. */
  NCCLCHECK(prim_send_commit(&l, 0));
  return prim_send_drain(&l);
}

static ncclResult_t run_root(struct coll_args* a, struct conn* rc, uint64_t tok, size_t chunk, uint64_t nchunks) {
  struct ncclComm* comm = a->comm;
  size_t esz = dtype_size(a->dt);
  int avg_n = a->avg ? 2 : 0;
  const char* in = a->sendbuff;
  char* out = a->recvbuff;
  struct prim_link l;
  prim_begin(&l, rc, tok);
  l.out_far = a->out_far;
  uint64_t tag = l.opseq % 0xffff + 1;
  uint64_t* w = rc->ops->shared_words(rc);
  char* tmp = NULL;
  uint64_t next = 0;       /* the next chunk the FIFO brings */
  uint64_t seen_f = 0;     /* the non-root's front when last seen moving, */
  int64_t seen_ns = 0;     /* and when */
  ncclResult_t res = ncclSuccess;
  while (next < nchunks) {
    uint64_t cur = __atomic_load_n(&w[0], __ATOMIC_ACQUIRE);
    int pub = claim_tag(cur) == tag; /* the non-root has started this operation */
    uint64_t f = pub ? claim_front(cur) : 0, b = pub ? claim_back(cur) : nchunks;
    if (pub && f < b && !prim_conn_ready(rc)) {
      /* Nothing waits in the FIFO. A non-root that is running brings its
       * next chunk within a chunk's copy: wait that long (a read of our own
       * costs more than taking a copied chunk: page pinning, and the data
       * is in no cache of ours); one that has not moved for longer has lost
       * its CPU: take the last unclaimed chunk. */
      int64_t now = time_ns();
      if (f != seen_f || seen_ns == 0) {
        seen_f = f;
        seen_ns = now;
      }
      if (now - seen_ns < STEAL_PATIENCE_NS) {
        cpu_relax();
        continue;
      }
      if (!__atomic_compare_exchange_n(&w[0], &cur, claim_pack(tag, f, b - 1), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
      if (__atomic_load_n(&w[2], __ATOMIC_RELAXED) != tok) {
        res = err_set(ncclInvalidUsage, "rank %d: rank %d's reduce does not match this one (count, datatype or "
                      "operator differ)", comm->rank, rc->peer);
        break;
      }
      if (!tmp && !(tmp = malloc(chunk * esz))) {
        res = err_set(ncclSystemError, "out of memory in a single-copy reduce");
        break;
      }
      size_t off = (size_t)(b - 1) * chunk, len = COLLIE_MIN(chunk, a->count - off);
      res = rc->ops->read_peer(rc, tmp, __atomic_load_n(&w[1], __ATOMIC_RELAXED) + off * esz, len * esz);
      if (res != ncclSuccess) break;
      red_pre(&a->op, tmp, tmp, len); /* nothing unless premultiplied */
      if (a->out_far) { /* never in place (exec.c) */
        red_reduce_out(&a->op, out + off * esz, NULL, tmp, in + off * esz, len, avg_n, 0);
      } else {
        red_reduce(&a->op, out + off * esz, tmp, in + off * esz, len);
        if (avg_n) red_div(a->dt, out + off * esz, out + off * esz, len, avg_n);
      }
      comm->reduce_steals++;
      continue;
    }
    if (pub && f == b && next == f) {
      /* Every chunk is reduced: the closing slot ends the operation. */
      const void* slot;
      res = prim_recv_slot(&l, 0, &slot);
      if (res != ncclSuccess) break;
      __atomic_store_n(&w[0], 0, __ATOMIC_RELAXED);
      res = prim_recv_release(&l);
      break;
    }
    /* Chunk `next` is the non-root's (or it has not started; then its first
     * slot is chunk 0): wait for it in the FIFO. */
    size_t off = (size_t)next * chunk, len = COLLIE_MIN(chunk, a->count - off);
    res = prim_recv_reduce_copy(&l, NULL, &a->op, in + off * esz, out + off * esz, len, avg_n);
    if (res != ncclSuccess) break;
    next++;
  }
  free(tmp);
  return res;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  size_t esz = dtype_size(a->dt);
  if (a->count == 0) return ncclSuccess;
  int peer = 1 - comm->rank, is_root = comm->rank == a->root;
  struct conn *sc = NULL, *rc = NULL;
  NCCLCHECK(transport_connect(comm, &a->root, !is_root, &peer, is_root, &sc, &rc));
  struct conn* c = is_root ? rc : sc;
  size_t chunk = coll_chunk(a) / esz;
  uint64_t nchunks = (a->count + chunk - 1) / chunk;
  /* Both ends see the same connector, so both take the same branch. */
  if (!(conn_caps(c) & TRANSPORT_CAP_READ_PEER_MEM) || !c->ops->shared_words || nchunks > CLAIM_MAX) {
    struct ring_view v = ring_full(comm);
    return ring_reduce_view(a, &v, comm->ring_pos[a->root], a->sendbuff, a->recvbuff, a->avg ? 2 : 0);
  }
  uint64_t tok = coll_token(a, a->count * esz);
  ncclResult_t res = is_root ? run_root(a, rc, tok, chunk, nchunks) : run_nonroot(a, sc, tok, chunk, nchunks);
  if (res != ncclSuccess) return prim_fail(comm, res);
  return ncclSuccess;
}

const struct algo algo_cma_reduce = {COLL_REDUCE, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
