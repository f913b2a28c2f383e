/* The collective schedules that GPU kernels run (kernels.cu, one block per
 * channel), written once as plain C that both nvcc (__host__ __device__) and
 * gcc compile, so tests/gpu/test_sched.c runs exactly this code on the CPU:
 * N simulated ranks, one thread per (rank, channel), plain memory connectors.
 *
 * A device connector is a FIFO of nslots slots plus two 64-bit counters that
 * only grow, across calls: `tail` (slots the sender has filled, written only
 * by the sender) and `head` (slots the receiver has consumed, written only by
 * the receiver). Slot i of the stream lives at slots[i % nslots]. A sender
 * waits for head + nslots > tail, writes, fences, publishes tail + 1; a
 * receiver waits for tail > head, fences, reads, publishes head + 1. Both
 * sides cut every step into slot-sized pieces the same way, so nothing else
 * travels with the data. Every wait is bounded: it checks an abort word (host
 * memory mapped into the GPU) and an optional deadline. */
#ifndef COLLIE_DEVICE_DEV_SCHED_H
#define COLLIE_DEVICE_DEV_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "reduce_elem.h"

#ifdef __CUDACC__
#define DS_HD __host__ __device__ __forceinline__ static
#else
#define DS_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define DS_SYNC() __syncthreads()
#define DS_FENCE(sys) \
  do {                        \
    if (sys) __threadfence_system(); \
    else __threadfence();     \
  } while (0)
#define DS_PAUSE(it) \
  do {                        \
    if ((it) > 256) __nanosleep(200); \
  } while (0)
#else
#include <sched.h>
#include <time.h>
#define DS_SYNC() ((void)0)
#define DS_FENCE(sys) \
  do {                        \
    (void)(sys);              \
    __atomic_thread_fence(__ATOMIC_SEQ_CST); \
  } while (0)
#define DS_PAUSE(it) \
  do {                        \
    if ((it) > 64) sched_yield(); \
  } while (0)
#endif

#define DS_MAX_CH 4
/* Vector groups a thread loads before it combines and stores any (ds_work.unroll > 1). */
#define DS_UNROLL 4
#define DS_NSLOTS 8
#define DS_SLOT_BYTES ((size_t)128 << 10)
/* A connector region: head and tail on their own 128-byte lines, then the slots. */
#define DS_HEAD_OFF 0
#define DS_TAIL_OFF 128
#define DS_SLOTS_OFF 256
#define DS_REGION_BYTES(nslots, slot_bytes) ((size_t)DS_SLOTS_OFF + (size_t)(nslots) * (slot_bytes))

enum ds_kind { DS_ALLREDUCE_RING, DS_ALLREDUCE_TREE, DS_ALLGATHER, DS_REDUCESCATTER, DS_BROADCAST, DS_REDUCE, DS_NKINDS };
/* Kernel status words (ds_work.status). */
enum { DS_OK = 0, DS_ABORTED = 1, DS_TIMEOUT = 2 };

struct ds_conn {
  unsigned char* slots;
  volatile uint64_t* head;
  volatile uint64_t* tail;
  int sysmem; /* the region is host memory (shm): publish with a system-wide fence */
};

/* The connectors one channel uses (unused ones have slots == NULL). */
struct ds_chan {
  struct ds_conn ring_send, ring_recv;   /* to rank+1, from rank-1 */
  struct ds_conn up_send, up_recv[2];    /* tree: to the parent, from the children */
  struct ds_conn down_recv, down_send[2];/* tree: from the parent, to the children */
};

/* Everything one kernel launch needs (passed by value). Counts are elements. */
struct ds_work {
  int kind, dt, red, avg_n; /* red: RE_SUM..RE_PREMULSUM; avg_n > 1: ncclAvg's divisor */
  int nranks, rank, root, nch, nslots; /* nslots: a power of two */
  size_t slot_bytes, count;
  struct re_scalar scalar;
  const void* scalar_dev; /* premulsum scalar read at run time (ncclScalarDevice), or NULL */
  const void* sendbuff;
  void* recvbuff;
  volatile uint32_t* abort;  /* nonzero: stop (host-mapped; may be NULL) */
  volatile uint32_t* status; /* where a block reports DS_ABORTED / DS_TIMEOUT (may be NULL) */
  uint64_t timeout_ns;       /* 0: none */
  int unroll;                /* > 1: DS_UNROLL vector groups in flight per thread (COLLIE_DEV_UNROLL) */
  struct ds_chan ch[DS_MAX_CH];
};

/* ---- topology: the ring in rank order, the tree a binary heap over ranks ---- */
DS_HD int ds_ring_next(int rank, int n) { return (rank + 1) % n; }
DS_HD int ds_ring_prev(int rank, int n) { return (rank + n - 1) % n; }
DS_HD int ds_tree_parent(int rank) { return rank == 0 ? -1 : (rank - 1) / 2; }
DS_HD int ds_tree_child(int rank, int n, int j) {
  int c = 2 * rank + 1 + j;
  return c < n ? c : -1;
}

/* a / b. On the GPU a 64-bit division is a call into a runtime routine, and a
 * call makes ptxas spill registers; this loop stays inline (steps only). */
DS_HD size_t ds_div(size_t a, size_t b) {
#if defined(__CUDA_ARCH__)
  if (a <= 0xffffffffu && b <= 0xffffffffu) return (uint32_t)a / (uint32_t)b;
  size_t q = 0, r = 0;
  for (int i = 63; i >= 0; i--) {
    r = (r << 1) | ((a >> i) & 1);
    if (r >= b) {
      r -= b;
      q |= (size_t)1 << i;
    }
  }
  return q;
#else
  return a / b;
#endif
}

/* Part i of `parts` of `total` elements: parts are `align`-element multiples
 * (16 bytes where the type allows), the last ones may be short or empty. */
DS_HD void ds_split(size_t total, int parts, int i, size_t align, size_t* off, size_t* len) {
  size_t per = ds_div(total + (size_t)parts - 1, (size_t)parts);
  per = ds_div(per + align - 1, align) * align;
  size_t o = per * (size_t)i;
  if (o > total) o = total;
  size_t l = total - o;
  if (l > per) l = per;
  *off = o;
  *len = l;
}

DS_HD size_t ds_align_elems(int dt) {
  size_t es = (size_t)re_size(dt);
  return es >= 16 ? 1 : 16 / es;
}

/* Channels a call uses: one per 4 slots of data, within [lo, hi] (all ranks agree). */
DS_HD int ds_channels(size_t bytes, size_t slot_bytes, int lo, int hi) {
  size_t want = bytes / (4 * slot_bytes) + 1;
  if (want > (size_t)hi) want = (size_t)hi;
  if (want < (size_t)lo) want = (size_t)lo;
  if (want > DS_MAX_CH) want = DS_MAX_CH;
  return want < 1 ? 1 : (int)want;
}

/* ---- steps: what a block does, in order; each step streams `len` elements ---- */
struct ds_step {
  int nrecv, nsend;
  const struct ds_conn* recv[2];
  const struct ds_conn* send[2];
  const unsigned char* src; /* user input combined with what arrives (or NULL) */
  unsigned char* dst;       /* where the value is written in user memory (or NULL) */
  size_t len;
  int scale; /* src is a reduction input: premulsum scales it */
  int final; /* the value is complete: ncclAvg divides it */
};

DS_HD int ds_mod(int a, int n) { return ((a % n) + n) % n; }

/* Ring schedules go in rounds: a rank's chunk in one round is at most half
 * the FIFO (nslots / 2 slots). A ring is a cycle of FIFOs, and this bound is
 * what keeps it from filling up with every rank waiting for room at its
 * successor (a rank is never more than one chunk ahead of it in a round).
 * ds_round_elems is that chunk; a round of allreduce covers nranks chunks. */
DS_HD size_t ds_round_elems(const struct ds_work* w) {
  size_t k = (size_t)(w->nslots / 2 < 1 ? 1 : w->nslots / 2);
  return k * ds_div(w->slot_bytes, (size_t)re_size(w->dt));
}

DS_HD int ds_is_ring(int kind) { return kind == DS_ALLREDUCE_RING || kind == DS_ALLGATHER || kind == DS_REDUCESCATTER; }

/* Steps of one round, and rounds of channel c. */
DS_HD int ds_round_steps(const struct ds_work* w) {
  int n = w->nranks;
  switch (w->kind) {
    case DS_ALLREDUCE_RING: return n == 1 ? 1 : 2 * n - 1;
    case DS_ALLREDUCE_TREE: return 2;
    case DS_ALLGATHER:
    case DS_REDUCESCATTER: return n;
    default: return 1;
  }
}
DS_HD size_t ds_rounds(const struct ds_work* w, int c) {
  if (!ds_is_ring(w->kind)) return 1;
  size_t lo, len;
  ds_split(w->count, w->nch, c, ds_align_elems(w->dt), &lo, &len);
  size_t per = ds_round_elems(w) * (w->kind == DS_ALLREDUCE_RING ? (size_t)w->nranks : 1);
  return ds_div(len + per - 1, per);
}

/* Step s of round `round` of channel c. Returns 0 when the step does nothing at this rank. */
DS_HD int ds_make_step(const struct ds_work* w, int c, size_t round, int s, struct ds_step* st) {
  const int n = w->nranks, r = w->rank;
  const size_t es = (size_t)re_size(w->dt), al = ds_align_elems(w->dt);
  const struct ds_chan* ch = &w->ch[c];
  const unsigned char* sb = (const unsigned char*)w->sendbuff;
  unsigned char* rb = (unsigned char*)w->recvbuff;
  size_t lo, len, off, clen;
  st->nrecv = st->nsend = 0;
  st->src = 0;
  st->dst = 0;
  st->scale = st->final = 0;
  int recv = 0, send = 0;
  switch (w->kind) {
    case DS_ALLREDUCE_RING: {
      /* Reduce-scatter then allgather around the ring; step s works on chunk r - s. */
      ds_split(w->count, w->nch, c, al, &lo, &len);
      size_t per = ds_round_elems(w) * (size_t)n, rlo = round * per;
      size_t rlen = len - rlo < per ? len - rlo : per;
      ds_split(rlen, n, ds_mod(r - s, n), al, &off, &clen);
      off += lo + rlo;
      recv = s > 0;
      send = s < 2 * n - 2;
      if (s <= n - 1) {
        st->src = sb + off * es;
        st->scale = 1;
      }
      if (s >= n - 1) st->dst = rb + off * es;
      st->final = s == n - 1;
      st->len = clen;
      break;
    }
    case DS_REDUCESCATTER:
    case DS_ALLGATHER: {
      /* Block b of `count` elements per rank; channel c moves part c of each block. */
      ds_split(w->count, w->nch, c, al, &lo, &len);
      size_t per = ds_round_elems(w);
      lo += round * per;
      len -= round * per;
      if (len > per) len = per;
      recv = s > 0;
      send = s < n - 1;
      st->len = len;
      if (w->kind == DS_REDUCESCATTER) {
        int b = ds_mod(r - 1 - s, n);
        st->src = sb + ((size_t)b * w->count + lo) * es;
        st->scale = 1;
        if (s == n - 1) {
          st->dst = rb + lo * es;
          st->final = 1;
        }
      } else {
        int b = ds_mod(r - s, n);
        if (s == 0) st->src = sb + lo * es;
        st->dst = rb + ((size_t)b * w->count + lo) * es;
      }
      break;
    }
    case DS_BROADCAST: {
      int pos = ds_mod(r - w->root, n);
      ds_split(w->count, w->nch, c, al, &lo, &len);
      recv = pos > 0;
      send = pos < n - 1;
      if (pos == 0) st->src = sb + lo * es;
      st->dst = rb + lo * es;
      st->len = len;
      break;
    }
    case DS_REDUCE: {
      int pos = ds_mod(r - w->root - 1, n); /* the root is last in the chain */
      ds_split(w->count, w->nch, c, al, &lo, &len);
      recv = pos > 0;
      send = pos < n - 1;
      st->src = sb + lo * es;
      st->scale = 1;
      if (pos == n - 1) {
        st->dst = rb + lo * es;
        st->final = 1;
      }
      st->len = len;
      break;
    }
    case DS_ALLREDUCE_TREE: {
      ds_split(w->count, w->nch, c, al, &lo, &len);
      st->len = len;
      if (s == 0) { /* up: children's partial sums plus ours, to the parent */
        for (int j = 0; j < 2; j++)
          if (ds_tree_child(r, n, j) >= 0) st->recv[st->nrecv++] = &ch->up_recv[j];
        if (ds_tree_parent(r) >= 0) st->send[st->nsend++] = &ch->up_send;
        st->src = sb + lo * es;
        st->scale = 1;
        if (r == 0) {
          st->dst = rb + lo * es;
          st->final = 1;
        }
      } else { /* down: the result from the parent (the root's own) to the children */
        if (ds_tree_parent(r) >= 0) {
          st->recv[st->nrecv++] = &ch->down_recv;
          st->dst = rb + lo * es;
        } else {
          st->src = rb + lo * es;
        }
        for (int j = 0; j < 2; j++)
          if (ds_tree_child(r, n, j) >= 0) st->send[st->nsend++] = &ch->down_send[j];
        if (st->nsend == 0 && st->nrecv == 0) return 0;
      }
      return st->len > 0;
    }
    default: return 0;
  }
  if (recv) st->recv[st->nrecv++] = &ch->ring_recv;
  if (send) st->send[st->nsend++] = &ch->ring_send;
  return st->len > 0;
}

/* ---- the counters protocol ---- */

#if defined(__CUDA_ARCH__)
DS_HD uint64_t ds_now_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#else
DS_HD uint64_t ds_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#endif

/* Waits until *ctr >= target; DS_OK, or why it gave up (also written to status). */
DS_HD int ds_wait_ge(const struct ds_work* w, volatile uint64_t* ctr, uint64_t target) {
  uint64_t t0 = 0;
  for (int it = 0;; it++) {
    if (*ctr >= target) return DS_OK;
    if ((it & 63) == 63) {
      int why = DS_OK;
      if (w->abort && *w->abort) why = DS_ABORTED;
      if (w->timeout_ns) {
        uint64_t now = ds_now_ns();
        if (t0 == 0) t0 = now;
        else if (now - t0 > w->timeout_ns) why = DS_TIMEOUT;
      }
      if (why != DS_OK) {
        if (w->status) *w->status = (uint32_t)why;
        DS_FENCE(1);
        return why;
      }
    }
    DS_PAUSE(it);
  }
}

/* State thread 0 hands the block for one piece (__shared__ on the GPU). */
struct ds_shared {
  int bad;
  unsigned char* in[2];
  unsigned char* out[2];
};

DS_HD uint64_t ds_ld(const unsigned char* p, size_t es) {
  switch (es) {
    case 1: return *p;
    case 2: return *(const uint16_t*)p;
    case 4: return *(const uint32_t*)p;
    default: return *(const uint64_t*)p;
  }
}
DS_HD void ds_st(unsigned char* p, size_t es, uint64_t v) {
  switch (es) {
    case 1: *p = (uint8_t)v; break;
    case 2: *(uint16_t*)p = (uint16_t)v; break;
    case 4: *(uint32_t*)p = (uint32_t)v; break;
    default: *(uint64_t*)p = v; break;
  }
}

/* 16 bytes in one load or store: a 128-bit access on the GPU; the CPU test
 * runs the same path with memcpy. p must be 16-byte aligned. */
DS_HD void ds_ld16(const unsigned char* p, unsigned char* out) {
#if defined(__CUDA_ARCH__)
  *(uint4*)out = *(const uint4*)p;
#else
  __builtin_memcpy(out, p, 16);
#endif
}
DS_HD void ds_st16(unsigned char* p, const unsigned char* in) {
#if defined(__CUDA_ARCH__)
  *(uint4*)p = *(const uint4*)in;
#else
  __builtin_memcpy(p, in, 16);
#endif
}
DS_HD int ds_al16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

/* Folds incoming element x into the accumulator v (x itself when there is none yet). */
DS_HD uint64_t ds_combine(const struct ds_work* w, struct re_scalar sc, int red2, int have, uint64_t v, uint64_t x) {
  return have ? re_reduce(w->dt, red2, x, v, sc) : x;
}

/* Elements [0, ne) of one piece, thread tid of nth: combine, write out.
 * When every buffer of the step is 16-byte aligned at this piece, each thread
 * moves 16-byte groups (one vector load per source, one store per output);
 * the remainder, and unaligned steps, go element by element. */
DS_HD void ds_piece_elems(const struct ds_work* w, const struct ds_step* st, struct re_scalar sc, size_t base,
                          const struct ds_shared* sh, size_t ne, int tid, int nth) {
  const int dt = w->dt;
  const size_t es = (size_t)re_size(dt);
  const int red2 = w->red == RE_PREMULSUM ? RE_SUM : w->red;
  const int scale = st->scale && w->red == RE_PREMULSUM;
  const int divide = st->final && w->avg_n > 1;
  int aligned = (!st->src || ds_al16(st->src + base * es)) && (!st->dst || ds_al16(st->dst + base * es));
  for (int j = 0; j < st->nrecv; j++) aligned &= ds_al16(sh->in[j]);
  for (int j = 0; j < st->nsend; j++) aligned &= ds_al16(sh->out[j]);
  const size_t per = 16 / es;
  const size_t ngroups = aligned ? ne / per : 0;
  if (w->unroll > 1) {
    /* DS_UNROLL groups per thread and pass, nth apart (neighbouring threads
     * still touch neighbouring 16 bytes): every load of a source is issued
     * before the first combine, so DS_UNROLL loads per thread are in flight
     * instead of one. */
    const size_t stride = (size_t)nth;
    for (size_t g0 = (size_t)tid; g0 < ngroups; g0 += stride * DS_UNROLL) {
      unsigned char acc[DS_UNROLL][16], x[DS_UNROLL][16];
      int live = 0; /* groups of this pass that exist */
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k < DS_UNROLL; k++)
        if (g0 + (size_t)k * stride < ngroups) live = k + 1;
      int have = 0;
      if (st->src) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int k = 0; k < DS_UNROLL; k++)
          if (k < live) ds_ld16(st->src + base * es + (g0 + (size_t)k * stride) * 16, acc[k]);
        if (scale)
          for (int k = 0; k < live; k++)
            for (size_t e = 0; e < per; e++)
              ds_st(acc[k] + e * es, es, re_scale(dt, ds_ld(acc[k] + e * es, es), sc));
        have = 1;
      }
      for (int j = 0; j < st->nrecv; j++) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int k = 0; k < DS_UNROLL; k++)
          if (k < live) ds_ld16(sh->in[j] + (g0 + (size_t)k * stride) * 16, x[k]);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int k = 0; k < DS_UNROLL; k++)
          if (k < live)
            for (size_t e = 0; e < per; e++)
              ds_st(acc[k] + e * es, es,
                    ds_combine(w, sc, red2, have, have ? ds_ld(acc[k] + e * es, es) : 0, ds_ld(x[k] + e * es, es)));
        have = 1;
      }
      if (divide)
        for (int k = 0; k < live; k++)
          for (size_t e = 0; e < per; e++) ds_st(acc[k] + e * es, es, re_div(dt, ds_ld(acc[k] + e * es, es), w->avg_n));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k < DS_UNROLL; k++) {
        if (k >= live) continue;
        const size_t off = (g0 + (size_t)k * stride) * 16;
        for (int j = 0; j < st->nsend; j++) ds_st16(sh->out[j] + off, acc[k]);
        if (st->dst) ds_st16(st->dst + base * es + off, acc[k]);
      }
    }
  }
  for (size_t g = (size_t)tid; w->unroll <= 1 && g < ngroups; g += (size_t)nth) {
    unsigned char acc[16] = {0}, x[16];
    const size_t off = g * 16;
    int have = 0;
    if (st->src) {
      ds_ld16(st->src + base * es + off, acc);
      if (scale)
        for (size_t k = 0; k < per; k++) ds_st(acc + k * es, es, re_scale(dt, ds_ld(acc + k * es, es), sc));
      have = 1;
    }
    for (int j = 0; j < st->nrecv; j++) {
      ds_ld16(sh->in[j] + off, x);
      for (size_t k = 0; k < per; k++)
        ds_st(acc + k * es, es, ds_combine(w, sc, red2, have, ds_ld(acc + k * es, es), ds_ld(x + k * es, es)));
      have = 1;
    }
    if (divide)
      for (size_t k = 0; k < per; k++) ds_st(acc + k * es, es, re_div(dt, ds_ld(acc + k * es, es), w->avg_n));
    for (int j = 0; j < st->nsend; j++) ds_st16(sh->out[j] + off, acc);
    if (st->dst) ds_st16(st->dst + base * es + off, acc);
  }
  for (size_t i = ngroups * per + (size_t)tid; i < ne; i += (size_t)nth) {
    uint64_t v = 0;
    int have = 0;
    if (st->src) {
      v = ds_ld(st->src + (base + i) * es, es);
      if (scale) v = re_scale(dt, v, sc);
      have = 1;
    }
    for (int j = 0; j < st->nrecv; j++) {
      v = ds_combine(w, sc, red2, have, v, ds_ld(sh->in[j] + i * es, es));
      have = 1;
    }
    if (divide) v = re_div(dt, v, w->avg_n);
    for (int j = 0; j < st->nsend; j++) ds_st(sh->out[j] + i * es, es, v);
    if (st->dst) ds_st(st->dst + (base + i) * es, es, v);
  }
}

/* Runs one step with `nth` threads (tid 0 drives the counters); DS_OK or why it stopped. */
DS_HD int ds_run_step(const struct ds_work* w, const struct ds_step* st, struct re_scalar sc, struct ds_shared* sh,
                      int tid, int nth) {
  const size_t es = (size_t)re_size(w->dt);
  const size_t pe = ds_div(w->slot_bytes, es);
  const uint64_t ns = (uint64_t)w->nslots;
  for (size_t base = 0; base < st->len; base += pe) {
    size_t ne = st->len - base < pe ? st->len - base : pe;
    if (tid == 0) {
      int bad = DS_OK;
      for (int j = 0; j < st->nrecv && bad == DS_OK; j++) {
        uint64_t h = *st->recv[j]->head;
        bad = ds_wait_ge(w, st->recv[j]->tail, h + 1);
        sh->in[j] = st->recv[j]->slots + (size_t)(h & (ns - 1)) * w->slot_bytes;
      }
      for (int j = 0; j < st->nsend && bad == DS_OK; j++) {
        uint64_t t = *st->send[j]->tail;
        if (t + 1 > ns) bad = ds_wait_ge(w, st->send[j]->head, t + 1 - ns);
        sh->out[j] = st->send[j]->slots + (size_t)(t & (ns - 1)) * w->slot_bytes;
      }
      DS_FENCE(0); /* acquire: the slots' bytes are read after their tails */
      sh->bad = bad;
    }
    DS_SYNC();
    if (sh->bad != DS_OK) return sh->bad;
    ds_piece_elems(w, st, sc, base, sh, ne, tid, nth);
    DS_SYNC();
    if (tid == 0) {
      int sys = 0;
      for (int j = 0; j < st->nsend; j++) sys |= st->send[j]->sysmem;
      for (int j = 0; j < st->nrecv; j++) sys |= st->recv[j]->sysmem;
      DS_FENCE(sys); /* release: our writes before the counters that publish them */
      for (int j = 0; j < st->nrecv; j++) *st->recv[j]->head = *st->recv[j]->head + 1;
      for (int j = 0; j < st->nsend; j++) *st->send[j]->tail = *st->send[j]->tail + 1;
    }
    /* The next piece's thread 0 runs after this one's; the others wait at DS_SYNC. */
  }
  return DS_OK;
}

/* One channel's whole schedule (one block). */
DS_HD int ds_run_channel(const struct ds_work* w, int c, struct ds_shared* sh, int tid, int nth) {
  struct re_scalar sc = w->scalar;
  if (w->red == RE_PREMULSUM && w->scalar_dev) sc = re_scalar_load(w->dt, w->scalar_dev);
  const int nsteps = ds_round_steps(w);
  const size_t nrounds = ds_rounds(w, c);
  for (size_t round = 0; round < nrounds; round++)
    for (int s = 0; s < nsteps; s++) {
      struct ds_step st;
      if (!ds_make_step(w, c, round, s, &st)) continue;
      int rc = ds_run_step(w, &st, sc, sh, tid, nth);
      if (rc != DS_OK) return rc;
      DS_SYNC(); /* a later step may read what this one wrote to user memory */
    }
  return DS_OK;
}

/* Points a connector at a region laid out as DS_*_OFF say. */
DS_HD void ds_conn_at(struct ds_conn* c, void* region, int sysmem) {
  unsigned char* b = (unsigned char*)region;
  c->head = (volatile uint64_t*)(b + DS_HEAD_OFF);
  c->tail = (volatile uint64_t*)(b + DS_TAIL_OFF);
  c->slots = b + DS_SLOTS_OFF;
  c->sysmem = sysmem;
}

#endif
