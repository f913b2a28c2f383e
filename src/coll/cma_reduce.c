/* Reduce at two ranks of one host, the work shared by the two ranks. The
 * non-root sends its chunks through the FIFO from the front, as the chain
 * does (ring_reduce.c); the root reduces them as they come and, when none is
 * waiting for it, reads chunks from the back of the non-root's buffer itself
 * (cross-memory attach) and reduces those. Where the results stay in cache
 * (from SHARE_MIN_BYTES, not out_far) the root also says where its own
 * buffers are, and the non-root then stops sending: it reads the root's
 * inputs for the chunks it takes, reduces them with its own and writes the
 * results into the root's receive buffer. Both ranks reduce, each reading
 * the other's buffer once, with no chunk copied through a slot that the
 * other CPU then reads out of this one's cache (2 ranks, 256 KiB-8 MiB:
 * 1.1-1.8x the chain). The two meet in the middle: a claim word both map
 * (the connector's shared words) says which chunks each has taken. When the
 * non-root shares its CPU with another process, the root, which has a CPU,
 * takes over the rest of the buffer instead of waiting (2 ranks beside one
 * busy process, 8-256 MiB: the chain ran at the non-root's half CPU,
 * 0.68-0.82x Open MPI, whose root reads everything itself).
 *
 * Protocol, per operation (tag: the connector's operation number, 1..65535;
 * the words: W_* below):
 *   W_NR_BUF, W_NR_TOK: the non-root's send buffer address and call token;
 *   W_CLAIM: claim_pack(tag, front, back), published by the non-root after
 *   those: chunks [0, front) are the non-root's, [back, K) the root's; front
 *   only grows (non-root, by compare-and-swap), back only shrinks (root).
 *   W_ROOT_IN/OUT/TOK, then W_STATE = (tag, ROOT_READY): the root's buffers,
 *   stored by a sharing root at its start. The non-root, seeing it (and the
 *   same token), swaps W_STATE to (tag, SWITCHED, s) with s its front, only
 *   while chunks are left: its chunks [0, s) came through the FIFO in order,
 *   the rest it reduced and wrote itself. A root that waits PUB_PATIENCE_NS
 *   for a non-root that has not started swaps ROOT_READY back to 0 and
 *   sleeps in the FIFO, where the non-root, seeing no ready root, sends; the
 *   root, woken by a chunk, says ROOT_READY again. Only one of the two swaps
 *   of a ROOT_READY word succeeds, so a non-root never writes to a root that
 *   sleeps.
 * When front == back every chunk is taken. If the non-root sent them all
 * through the FIFO (front == K, no switch), the root never read its buffer
 * nor was written: both end when the root has reduced chunk K-1, and the
 * non-root may run ahead into its next call, as in the chain (a root still
 * in this call sees that call's tag in W_CLAIM and takes nothing; a stale
 * word of this tag from 65535 operations ago has front == back and makes the
 * root wait for the FIFO, which is right). Otherwise the non-root, done with
 * its chunks, commits an empty closing slot and waits for every slot to be
 * released; the root releases it only when it has reduced everything (so
 * it reads nothing more of the non-root's buffer, and the non-root writes
 * nothing more to its own), after clearing W_CLAIM and W_STATE. */
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
 * the bytes' time: where both ranks have a CPU and results go out to memory
 * this row is the chain (even with it from 128 KiB to 128 MiB, medians
 * within 3%); with a busy process beside the two ranks it was up to 1.5x
 * faster (32 MiB: 8.0 against 11.2 ms; 128 MiB: 33 against 49); shared in
 * cache it is faster than this says (256 KiB-8 MiB: 0.55-0.9x the chain's
 * time), which only widens the margin by which the tuner already picks it
 * there over the ring's chain. docs/BENCHMARKS.md. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return 2.0 * c->link.alpha_us + 0.9 * bytes / c->link.bw;
}

/* The shared words (the connector's, CONN_SHARED_WORDS): */
enum {
  W_CLAIM,    /* claim_pack(tag, front, back) */
  W_NR_BUF,   /* the non-root's send buffer */
  W_NR_TOK,   /* and its call token */
  W_ROOT_IN,  /* the root's send buffer, */
  W_ROOT_OUT, /* receive buffer, */
  W_ROOT_TOK, /* and call token */
  W_STATE,    /* claim_pack(tag, ROOT_READY, 0) or claim_pack(tag, SWITCHED, s); 0: neither */
};
enum { ROOT_READY = 1, SWITCHED = 2 };

/* Sharing: the root takes ROOT_SHARE percent of the chunks left (at most
 * ROOT_TAKE_MAX, read in one system call), the non-root NONROOT_SHARE
 * percent (at most NONROOT_TAKE_MAX): the root's chunks cost it a read and a
 * reduction, the non-root's a read, a reduction and a write (2.3 against
 * 3.2-3.8 us a 32 KiB chunk on a Xeon guest), and each needs the other at the
 * end. 2 ranks, bound, 5 interleaved rounds, medians (us): with 50/50 and
 * at most 4 / 8 chunks 256 KiB 13.7, 512 KiB 21.3; 35/60 12.0 and 21.6;
 * the non-root at most 2 chunks 12.2 and 22.3 (more system calls); 30/70 at
 * most 8 / 8 12.3 and 23.9. */
#define ROOT_SHARE 60
#define NONROOT_SHARE 35
#define ROOT_TAKE_MAX 8
#define NONROOT_TAKE_MAX 4
/* How long a ready root waits awake for the non-root to start, before it
 * says it is no longer ready and sleeps in the FIFO. */
#define PUB_PATIENCE_NS 50000
/* Sharing from this size on, where results stay in cache (not out_far):
 * 2 ranks, unbound, 7 rounds, shared / chain / Open MPI: 64 KiB 5.08 / 4.02
 * / 4.78 us, 128 KiB 7.91 / 7.76 / 8.04, 256 KiB 11.3 / 15.8 / 15.2; beside
 * a busy process 128 KiB 16.6 / 15.9 / 16.3, 256 KiB 22.6 / 32.4 / 28.7.
 * Where results go out to memory the chain with streamed stores was as fast
 * or faster (128 MiB 21.2 against 23.7 ms shared). */
#define SHARE_MIN_BYTES ((size_t)256 << 10)
/* The largest read the root makes into its block buffer (in place, or where
 * results are streamed). */
#define ROOT_TMP_MAX ((size_t)256 << 10)


static int shared_mode(const struct coll_args* a) {
  return !a->out_far && a->count * dtype_size(a->dt) >= SHARE_MIN_BYTES;
}

static ncclResult_t block_buffer(struct ncclComm* comm, size_t bytes, char** out) {
  if (comm->reduce_tmp_bytes < bytes) {
    void* p = realloc(comm->reduce_tmp, bytes);
    if (!p) return err_set(ncclSystemError, "out of memory in a single-copy reduce (%zu bytes)", bytes);
    comm->reduce_tmp = p;
    comm->reduce_tmp_bytes = bytes;
  }
  *out = comm->reduce_tmp;
  return ncclSuccess;
}

/* Non-root, chunks [f, f + k): the root's inputs read, reduced with this
 * rank's, and written into the root's receive buffer. */
static ncclResult_t nonroot_direct(struct coll_args* a, struct conn* sc, const uint64_t* w, size_t chunk, uint64_t f,
                                   uint64_t k) {
  size_t esz = dtype_size(a->dt);
  size_t off = (size_t)f * chunk, len = COLLIE_MIN(k * chunk, a->count - off);
  char* tmp = NULL;
  NCCLCHECK(block_buffer(a->comm, len * esz, &tmp));
  uint64_t rin = __atomic_load_n(&w[W_ROOT_IN], __ATOMIC_RELAXED);
  uint64_t rout = __atomic_load_n(&w[W_ROOT_OUT], __ATOMIC_RELAXED);
  NCCLCHECK(sc->ops->read_peer(sc, tmp, rin + off * esz, len * esz));
  red_pre(&a->op, tmp, tmp, len); /* nothing unless premultiplied */
  red_reduce(&a->op, tmp, tmp, (const char*)a->sendbuff + off * esz, len);
  if (a->avg) red_div(a->dt, tmp, tmp, len, 2);
  NCCLCHECK(sc->ops->write_peer(sc, rout + off * esz, tmp, len * esz));
  a->comm->reduce_shared += k;
  return ncclSuccess;
}

static ncclResult_t run_nonroot(struct coll_args* a, struct conn* sc, uint64_t tok, size_t chunk, uint64_t nchunks) {
  size_t esz = dtype_size(a->dt);
  struct prim_link l;
  prim_begin(&l, sc, tok);
  uint64_t tag = l.opseq % 0xffff + 1;
  uint64_t* w = sc->ops->shared_words(sc);
  __atomic_store_n(&w[W_NR_BUF], (uint64_t)(uintptr_t)a->sendbuff, __ATOMIC_RELAXED);
  __atomic_store_n(&w[W_NR_TOK], tok, __ATOMIC_RELAXED);
  __atomic_store_n(&w[W_CLAIM], claim_pack(tag, 0, nchunks), __ATOMIC_RELEASE);
  const char* in = a->sendbuff;
  int shared = shared_mode(a) && sc->ops->write_peer, switched = 0;
  uint64_t f;
  for (;;) {
    /* A root that is ready (awake, its buffers said) shares the work: from
     * here on this rank reduces what it takes and writes it to the root. */
    if (shared && !switched) {
      uint64_t st = claim_pack(tag, ROOT_READY, 0);
      if (__atomic_load_n(&w[W_STATE], __ATOMIC_ACQUIRE) == st &&
          __atomic_load_n(&w[W_ROOT_TOK], __ATOMIC_RELAXED) == tok) {
        /* Only with chunks left: a root that finds every chunk sent
         * through the FIFO ends without a closing slot. (Only this rank
         * moves the front; the root may take the rest after this look, and
         * then waits for the closing slot anyway.) */
        uint64_t cur = __atomic_load_n(&w[W_CLAIM], __ATOMIC_ACQUIRE);
        f = claim_front(cur);
        if (f < claim_back(cur) && __atomic_compare_exchange_n(&w[W_STATE], &st, claim_pack(tag, SWITCHED, f), 0,
                                                               __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
          switched = 1;
      }
    }
    if (switched) {
      uint64_t cur = __atomic_load_n(&w[W_CLAIM], __ATOMIC_ACQUIRE), k;
      do {
        f = claim_front(cur);
        if (f >= claim_back(cur)) goto taken;
        k = COLLIE_MAX(1, COLLIE_MIN((uint64_t)NONROOT_TAKE_MAX, ((claim_back(cur) - f) * NONROOT_SHARE + 99) / 100));
      } while (!__atomic_compare_exchange_n(&w[W_CLAIM], &cur, claim_pack(tag, f + k, claim_back(cur)), 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
      NCCLCHECK(nonroot_direct(a, sc, w, chunk, f, k));
      continue;
    }
    void* slot;
    NCCLCHECK(prim_send_slot(&l, chunk * esz, &slot)); /* the last chunk may be shorter */
    uint64_t cur = __atomic_load_n(&w[W_CLAIM], __ATOMIC_ACQUIRE);
    do {
      f = claim_front(cur);
      if (f >= claim_back(cur)) goto closing;
    } while (!__atomic_compare_exchange_n(&w[W_CLAIM], &cur, claim_pack(tag, f + 1, claim_back(cur)), 0,
                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    size_t off = (size_t)f * chunk, len = COLLIE_MIN(chunk, a->count - off);
    red_pre(&a->op, slot, in + off * esz, len); /* a copy unless premultiplied */
    NCCLCHECK(prim_send_commit(&l, len * esz));
  }
taken: {
  /* Switched: the closing slot is due in any case. */
  void* slot;
  NCCLCHECK(prim_send_slot(&l, 0, &slot));
}
closing:
  /* Every chunk came through the FIFO: the root reads nothing here. */
  if (!switched && f == nchunks) return ncclSuccess;
  /* The closing slot: the root releases it once it reads nothing more here. */
  NCCLCHECK(prim_send_commit(&l, 0));
  return prim_send_drain(&l);
}

/* Root: chunks [b - k, b) of the non-root's buffer read here and reduced. */
static ncclResult_t root_take(struct coll_args* a, struct conn* rc, const uint64_t* w, size_t chunk, uint64_t b,
                              uint64_t k) {
  size_t esz = dtype_size(a->dt);
  int avg_n = a->avg ? 2 : 0;
  const char* in = a->sendbuff;
  char* out = a->recvbuff;
  uint64_t src = __atomic_load_n(&w[W_NR_BUF], __ATOMIC_RELAXED);
  size_t off = (size_t)(b - k) * chunk, end = COLLIE_MIN(b * chunk, a->count);
  if (!a->out_far && out != in) {
    /* Read straight into the receive buffer, reduced there while in cache. */
    size_t len = end - off;
    NCCLCHECK(rc->ops->read_peer(rc, out + off * esz, src + off * esz, len * esz));
    red_pre(&a->op, out + off * esz, out + off * esz, len); /* nothing unless premultiplied */
    red_reduce(&a->op, out + off * esz, out + off * esz, in + off * esz, len);
    if (avg_n) red_div(a->dt, out + off * esz, out + off * esz, len, avg_n);
  } else {
    size_t step = COLLIE_MAX(chunk, ROOT_TMP_MAX / esz / chunk * chunk);
    char* tmp = NULL;
    NCCLCHECK(block_buffer(a->comm, COLLIE_MIN(step, end - off) * esz, &tmp));
    for (size_t o = off; o < end; o += step) {
      size_t len = COLLIE_MIN(step, end - o);
      NCCLCHECK(rc->ops->read_peer(rc, tmp, src + o * esz, len * esz));
      red_pre(&a->op, tmp, tmp, len);
      if (a->out_far) { /* never in place (exec.c) */
        red_reduce_out(&a->op, out + o * esz, NULL, tmp, in + o * esz, len, avg_n, 0);
      } else {
        red_reduce(&a->op, out + o * esz, tmp, in + o * esz, len);
        if (avg_n) red_div(a->dt, out + o * esz, out + o * esz, len, avg_n);
      }
    }
  }
  a->comm->reduce_steals += k;
  return ncclSuccess;
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
  int shared = shared_mode(a), ready = 0;
  if (shared) {
    __atomic_store_n(&w[W_ROOT_IN], (uint64_t)(uintptr_t)a->sendbuff, __ATOMIC_RELAXED);
    __atomic_store_n(&w[W_ROOT_OUT], (uint64_t)(uintptr_t)a->recvbuff, __ATOMIC_RELAXED);
    __atomic_store_n(&w[W_ROOT_TOK], tok, __ATOMIC_RELAXED);
    __atomic_store_n(&w[W_STATE], claim_pack(tag, ROOT_READY, 0), __ATOMIC_RELEASE);
    ready = 1;
  }
  uint64_t next = 0;       /* the next chunk the FIFO brings */
  uint64_t seen_f = 0;     /* the non-root's front when last seen moving, */
  int64_t seen_ns = 0;     /* and when */
  int64_t wait_ns = 0;     /* since when this rank waits for the non-root to start */
  ncclResult_t res = ncclSuccess;
  for (;;) {
    uint64_t cur = __atomic_load_n(&w[W_CLAIM], __ATOMIC_ACQUIRE);
    int pub = claim_tag(cur) == tag; /* the non-root has started this operation */
    uint64_t f = pub ? claim_front(cur) : 0, b = pub ? claim_back(cur) : nchunks;
    /* Read after the claim word: a front that counts a chunk the non-root
     * reduced itself comes with its switch (only ever to a sharing root). */
    uint64_t st = shared ? __atomic_load_n(&w[W_STATE], __ATOMIC_ACQUIRE) : 0;
    int switched = claim_tag(st) == tag && claim_front(st) == SWITCHED;
    uint64_t fifo_end = switched ? claim_back(st) : f; /* the non-root's chunks [0, fifo_end) come through the FIFO */
    if (!pub && next == nchunks) break; /* all came through the FIFO; the non-root went on */
    if (!pub && ready) {
      if (prim_conn_ready(rc)) {
        /* A slot came after that look at the claim word: look again. It
         * may be a closing slot, from a non-root that started, switched at
         * once and did everything itself since; or chunk `next`, from one
         * that sent every chunk and went on to its next call. */
        if (claim_tag(__atomic_load_n(&w[W_CLAIM], __ATOMIC_ACQUIRE)) == tag) continue;
      } else {
        /* The non-root has not started. Wait for it awake a while; then
         * sleep in the FIFO, no longer ready: the non-root sends there. */
        int64_t now = time_ns();
        if (!wait_ns) wait_ns = now;
        if (now - wait_ns < PUB_PATIENCE_NS) {
          cpu_relax();
          continue;
        }
        uint64_t rd = claim_pack(tag, ROOT_READY, 0);
        if (__atomic_compare_exchange_n(&w[W_STATE], &rd, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) ready = 0;
        continue; /* (or it switched: then it has started) */
      }
    }
    if (pub && f == b && next == fifo_end) {
      if (!switched && b == nchunks) break; /* all came through the FIFO */
      /* The closing slot: the non-root has written all it took. */
      const void* slot;
      res = prim_recv_slot(&l, 0, &slot);
      if (res != ncclSuccess) break;
      __atomic_store_n(&w[W_CLAIM], 0, __ATOMIC_RELAXED);
      __atomic_store_n(&w[W_STATE], 0, __ATOMIC_RELAXED);
      res = prim_recv_release(&l);
      break;
    }
    if (pub && f < b && !(next < fifo_end && prim_conn_ready(rc))) {
      /* Nothing waits in the FIFO and chunks are left. Sharing, take some
       * now (the non-root reduces its own share). Otherwise a non-root that
       * is running brings its next chunk within a chunk's copy: wait that
       * long (a read of our own costs more than taking a copied chunk: page
       * pinning, and the data is in no cache of ours); one that has not
       * moved for longer has lost its CPU: take the last unclaimed chunk. */
      if (!shared) {
        int64_t now = time_ns();
        if (f != seen_f || seen_ns == 0) {
          seen_f = f;
          seen_ns = now;
        }
        if (now - seen_ns < STEAL_PATIENCE_NS) {
          cpu_relax();
          continue;
        }
      }
      uint64_t k = 1;
      if (shared) k = COLLIE_MAX(1, COLLIE_MIN((uint64_t)ROOT_TAKE_MAX, ((b - f) * ROOT_SHARE + 99) / 100));
      if (!__atomic_compare_exchange_n(&w[W_CLAIM], &cur, claim_pack(tag, f, b - k), 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE))
        continue;
      if (__atomic_load_n(&w[W_NR_TOK], __ATOMIC_RELAXED) != tok) {
        res = err_set(ncclInvalidUsage, "rank %d: rank %d's reduce does not match this one (count, datatype or "
                      "operator differ)", comm->rank, rc->peer);
        break;
      }
      res = root_take(a, rc, w, chunk, b, k);
      if (res != ncclSuccess) break;
      continue;
    }
    /* Chunk `next` comes through the FIFO: the non-root has not started
     * (and this rank is no longer ready, so it sends there), or sent it. */
    size_t off = (size_t)next * chunk, len = COLLIE_MIN(chunk, a->count - off);
    res = prim_recv_reduce_copy(&l, NULL, &a->op, in + off * esz, out + off * esz, len, avg_n);
    if (res != ncclSuccess) break;
    next++;
    if (shared && !ready) {
      /* Awake again, and the non-root has not switched (it could not). */
      __atomic_store_n(&w[W_STATE], claim_pack(tag, ROOT_READY, 0), __ATOMIC_RELEASE);
      ready = 1;
    }
  }
  if (shared) __atomic_store_n(&w[W_STATE], 0, __ATOMIC_RELAXED);
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
