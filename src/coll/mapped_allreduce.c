/* Mapped allreduce: for ranks of one host whose send and receive buffers all
 * come from ncclMemAlloc's host memory (hostmem.h), every rank maps its
 * peers' buffers (their memfds, through /proc/<pid>/fd) and reduces its
 * share of the elements (element range `rank` of n) straight from all n
 * send buffers into all n receive buffers: every byte is read once and
 * written once, with no copy into or out of a FIFO slot. Between the two
 * ranks of a 2-CPU machine the ring moves each byte through a slot that the
 * other CPU then reads out of this one's cache, which bounds it near 5 GB/s
 * of busbw at 32-256 MiB; one pass over mapped memory runs at the machine's
 * memory rate (docs/BENCHMARKS.md).
 *
 * Whether the buffers qualify is known only to each rank, so the ranks agree
 * in every call: each posts a descriptor of its two buffers through the
 * direct mailboxes. A rank whose buffers do not qualify posts its "no" and
 * goes on at once (direct_shm_post); the others wait for every descriptor
 * (direct_shm_share) and so see that "no" too. So all run this algorithm or
 * all run what the tuner would have picked without it (the ring, at 2
 * ranks), and with malloc'd buffers nobody waits for anybody here. Then each maps what it lacks and
 * posts whether that worked (all run it only if all could), reduces, and
 * posts once more: nobody returns (and lets its caller reuse the buffers)
 * while a peer may still read or write them. Each rank writes only its own
 * element range of every receive buffer, so an in-place call (sendbuff ==
 * recvbuff) is safe; buffers that overlap otherwise take the other rows. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "../hostmem.h"
#include "../transport/shmseg.h"

/* Per rank and call: where its two buffers lie (ok 0: not both in host memory from ncclMemAlloc). */
struct map_desc {
  int32_t ok;
  int32_t pid;
  int32_t sfd, rfd;
  uint64_t sino, rino;
  uint64_t slen, rlen; /* the allocations' lengths */
  uint64_t soff, roff; /* the buffers' offsets in them */
};
_Static_assert(sizeof(struct map_desc) == 64, "one cache line a rank");

/* Peers' allocations this rank has mapped, by (peer, inode); least recently
 * used ones are unmapped beyond MAP_CACHE. */
#define MAP_CACHE 64
struct map_entry {
  int peer;
  uint64_t ino;
  struct shm_seg seg;
  uint64_t used; /* the call that last used it */
};
struct mapped_state {
  struct map_entry e[MAP_CACHE];
  int n;
  uint64_t calls;
  int fallback_logged;
  int map_warned; /* a peer's buffer could not be mapped (warned once) */
  struct map_desc* all; /* nranks descriptors */
  char* scratch;        /* one block of results, reduced here then copied out */
  int fused;            /* COLLIE_MAPPED_FUSED: the one-pass float sum (0: the block path, for comparison) */
  /* The plan the tuner makes without this row, for the last call shape that
   * needed it (a program with malloc'd buffers needs it in every call). */
  struct {
    int valid;
    ncclDataType_t dt;
    size_t count;
    struct plan p;
  } other;
};

/* What runs where the buffers do not qualify: the row the tuner would have
 * picked without this one. */
static ncclResult_t run_instead(struct coll_args* a, struct mapped_state* m) {
  if (!m->other.valid || m->other.count != a->count || m->other.dt != a->dt) {
    NCCLCHECK(tuning_plan_but(a, ALGO_MAPPED, &m->other.p));
    m->other.valid = 1;
    m->other.count = a->count;
    m->other.dt = a->dt;
  }
  const struct plan* p = &m->other.p;
  a->chunk = p->chunk;
  a->out_far = coll_in_place(a) ? 0 : p->out_far;
  a->comm->read_ahead = p->read_ahead;
  return p->algo->run(a, p);
}

/* Results reduced per block: they stay in the first-level cache between the
 * reduction and the n copies out of it; the non-temporal copies are fenced
 * once, after the last block. 2 ranks, out of place, 256 MiB (collie-perf
 * -R 1, 2 runs, busbw GB/s): 1 KiB 8.71-8.72, 2 KiB 8.16-8.23, 4 KiB
 * 8.58-8.64, 16 KiB 8.42-8.54; with a fence after every block 16 KiB gave
 * 8.0-8.4 and 1 KiB 5.6-6.1. Prefetching the next block's inputs before the
 * copies out (4 or 16 KiB ahead) made it 1.2-2x slower. */
#define BLOCK_BYTES 4096

/* COLLIE_MAPPED=auto: from this many bytes per rank. */
#define MAPPED_AUTO_MIN ((size_t)1 << 20)

static size_t min_bytes(void) {
  static size_t v; /* 0: not read yet */
  size_t m = __atomic_load_n(&v, __ATOMIC_RELAXED);
  if (m) return m;
  const char* s = param_str(P_COLLIE_MAPPED);
  m = !s || strcmp(s, "auto") == 0 ? MAPPED_AUTO_MIN : strcmp(s, "1") == 0 ? 1 : SIZE_MAX;
  __atomic_store_n(&v, m, __ATOMIC_RELAXED);
  return m;
}

void mapped_free(struct ncclComm* comm) {
  struct mapped_state* m = comm->mapped;
  if (!m) return;
  for (int i = 0; i < m->n; i++) shmseg_free(&m->e[i].seg);
  free(m->all);
  free(m->scratch);
  free(m);
  comm->mapped = NULL;
}

int mapped_peer_maps(const struct ncclComm* comm) { return comm->mapped ? comm->mapped->n : 0; }

static ncclResult_t state(struct ncclComm* comm, struct mapped_state** out) {
  if (!comm->mapped) {
    struct mapped_state* m = calloc(1, sizeof(*m));
    if (m) {
      m->all = calloc((size_t)comm->nranks, sizeof(*m->all));
      if (posix_memalign((void**)&m->scratch, 64, BLOCK_BYTES) != 0) m->scratch = NULL;
      m->fused = (int)param_int(P_COLLIE_MAPPED_FUSED, 0, 1);
    }
    if (!m || !m->all || !m->scratch) {
      if (m) {
        free(m->all);
        free(m->scratch);
        free(m);
      }
      return err_set(ncclSystemError, "out of memory for the mapped allreduce");
    }
    comm->mapped = m;
  }
  *out = comm->mapped;
  return ncclSuccess;
}

/* Peer `peer`'s allocation (its fd and inode as it posted them), mapped. */
static ncclResult_t map_peer(struct ncclComm* comm, struct mapped_state* m, int peer, int32_t pid, int32_t fd,
                             uint64_t ino, uint64_t len, char** base) {
  for (int i = 0; i < m->n; i++) {
    struct map_entry* e = &m->e[i];
    if (e->peer == peer && e->ino == ino && e->seg.len == len) {
      e->used = m->calls;
      *base = e->seg.base;
      return ncclSuccess;
    }
  }
  struct shm_seg seg;
  NCCLCHECK(shmseg_open(pid, fd, len, peer, "mapped allreduce", &seg));
  if (m->n == MAP_CACHE) {
    /* Unmap the least recently used mapping no part of this call uses. */
    int victim = -1;
    for (int i = 0; i < m->n; i++)
      if (m->e[i].used != m->calls && (victim < 0 || m->e[i].used < m->e[victim].used)) victim = i;
    if (victim < 0) {
      shmseg_free(&seg);
      return err_set(ncclInternalError, "mapped allreduce: more than %d peer buffers in one call", MAP_CACHE);
    }
    shmseg_free(&m->e[victim].seg);
    m->e[victim] = m->e[--m->n];
  }
  m->e[m->n++] = (struct map_entry){peer, ino, seg, m->calls};
  *base = seg.base;
  return ncclSuccess;
}

/* This rank's descriptor: both buffers in ncclMemAlloc's host memory, and in
 * place exactly or not overlapping at all. */
static void describe(const struct coll_args* a, size_t bytes, struct map_desc* d) {
  memset(d, 0, sizeof(*d));
  d->pid = (int32_t)getpid();
  struct hostmem_ref s, r;
  if (!hostmem_find(a->sendbuff, bytes, &s) || !hostmem_find(a->recvbuff, bytes, &r)) return;
  if (a->sendbuff != a->recvbuff && coll_in_place(a)) return;
  *d = (struct map_desc){1, d->pid, s.fd, r.fd, s.ino, r.ino, s.len, r.len, s.off, r.off};
}

static ncclResult_t mapped_run(struct coll_args* a, struct mapped_state* m) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, me = comm->rank;
  size_t esz = dtype_size(a->dt);
  const char* src[64];
  char* dst[64];
  int32_t ok = 1;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < n; i++) {
    if (i == me) {
      src[i] = a->sendbuff;
      dst[i] = a->recvbuff;
      continue;
    }
    const struct map_desc* d = &m->all[i];
    char *sb = NULL, *rb = NULL;
    res = map_peer(comm, m, i, d->pid, d->sfd, d->sino, d->slen, &sb);
    if (res == ncclSuccess) res = map_peer(comm, m, i, d->pid, d->rfd, d->rino, d->rlen, &rb);
    if (res != ncclSuccess) {
      if (!m->map_warned) {
        m->map_warned = 1;
        WARN("rank %d: mapped allreduce: %s; every rank runs another algorithm instead (warned once)", me,
             ncclGetLastError(comm));
      }
      ok = 0;
      res = ncclSuccess;
      break;
    }
    src[i] = sb + d->soff;
    dst[i] = rb + d->roff;
  }
  /* All ranks run it only if every one of them mapped every buffer. */
  int32_t oks[64];
  NCCLCHECK(direct_shm_share(comm, &ok, sizeof(ok), oks));
  for (int i = 0; i < n; i++)
    if (!oks[i]) return run_instead(a, m);
  size_t seg = (a->count + (size_t)n - 1) / (size_t)n;
  size_t lo = COLLIE_MIN(a->count, (size_t)me * seg), hi = COLLIE_MIN(a->count, lo + seg);
  size_t blk = BLOCK_BYTES / esz;
  const void* in[64];
  void* out[64];
  if (a->dt == ncclFloat32 && a->op.kind == RED_SUM && !a->avg && a->out_far && m->fused) {
    /* The common case in one pass: each line loaded from every send buffer,
     * summed and streamed to every receive buffer, no block in between. */
    for (int i = 0; i < n; i++) {
      in[i] = src[i] + lo * esz;
      out[i] = dst[i] + lo * esz;
    }
    lo += red_sum_f32_stream_n(out, n, in, n, hi - lo);
  }
  for (size_t off = lo; off < hi; off += blk) {
    size_t c = COLLIE_MIN(blk, hi - off);
    for (int i = 0; i < n; i++) in[i] = src[i] + off * esz;
    red_reduce_n(&a->op, m->scratch, in, n, c);
    if (a->avg) red_div(a->dt, m->scratch, m->scratch, c, n);
    if (a->out_far) {
      for (int i = 0; i < n; i++) out[i] = dst[i] + off * esz;
      red_copy_far_n(out, n, m->scratch, c * esz);
    } else {
      for (int i = 0; i < n; i++) memcpy(dst[i] + off * esz, m->scratch, c * esz);
    }
  }
  if (a->out_far) red_far_fence();
  /* Nobody returns while a peer may still read its send buffer or write its receive buffer. */
  return direct_shm_share(comm, &ok, sizeof(ok), NULL);
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  struct mapped_state* m = NULL;
  NCCLCHECK(state(comm, &m));
  m->calls++;
  struct map_desc mine;
  describe(a, bytes, &mine);
  /* A rank whose own buffers do not qualify knows the answer: it posts its
   * "no" and goes on without waiting for anybody (the common case, malloc'd
   * buffers, costs one line written); the others read it and follow. */
  int all_ok = mine.ok;
  if (!all_ok) {
    NCCLCHECK(direct_shm_post(comm, &mine, sizeof(mine)));
  } else {
    NCCLCHECK(direct_shm_share(comm, &mine, sizeof(mine), m->all));
    for (int i = 0; i < comm->nranks && all_ok; i++) all_ok = m->all[i].ok;
  }
  if (all_ok) return mapped_run(a, m);
  if (!m->fallback_logged) {
    m->fallback_logged = 1;
    int i = 0;
    if (!mine.ok) i = comm->rank;
    else
      while (i < comm->nranks && m->all[i].ok) i++;
    INFO(LOG_TUNING,
         "rank %d: mapped allreduce of %zu bytes: rank %d's buffers are not host memory from ncclMemAlloc; another "
         "algorithm runs instead (logged once)",
         comm->rank, bytes, i);
  }
  return run_instead(a, m);
}

/* One host whose ranks share memory, at most 64 of them, from
 * COLLIE_MAPPED's size on: arguments and settings only, the same on every
 * rank. Whether the buffers qualify is settled in run(). */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  return coll_shm_only(comm) && comm->nranks > 1 && comm->nranks <= 64 && bytes >= min_bytes();
}

/* Three exchanges, then each rank reads and writes its share of every
 * buffer once: 2 x bytes of traffic a rank, at the copy rate (one copy is a
 * read and a write). Below the ring's 2(n-1)/n x bytes of copies plus what
 * its slots add, so from COLLIE_MAPPED's size on the tuner takes this row;
 * where the buffers do not qualify it costs the other rows a posted line (and,
 * on ranks whose buffers do qualify, the wait for every rank's line). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  return 3.0 * 0.7 * c->link.alpha_us + 0.5 * bytes / c->link.bw;
}

const struct algo algo_mapped_allreduce = {COLL_ALLREDUCE, ALGO_MAPPED, PROTO_SIMPLE, 0, eligible, estimate, run};
