/* CPU test of the device schedules (src/device/dev_sched.h): the code the GPU
 * kernels run, executed here by one thread per (rank, channel) of N simulated
 * ranks over plain memory connectors with small slots, so each step is cut
 * into many pieces and the FIFOs wrap. Checks every collective the kernels
 * implement (ring allreduce, tree allreduce, allgather, reduce-scatter,
 * broadcast, reduce) for 1..5 ranks, 1..3 channels, odd counts, several
 * types and reductions, in place and out of place; the connectors' counters
 * carry over from call to call as they do on the GPU; then ranks that run
 * their calls back to back at their own pace, as kernels of different ranks
 * overlap on a GPU. Also checks that an abort word stops a rank whose peer
 * never comes. Runs without a GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/dev_sched.h"

#define MAXR 5
#define SLOT 64
#define NSL 2

static unsigned char* regions[DS_MAX_CH][MAXR][MAXR]; /* [ch][from][to] */
static int failures, runs;
/* ds_work.unroll for the sweep: DS_UNROLL groups in flight (COLLIE_DEV_UNROLL=4); the one-group path (the default,
 * COLLIE_DEV_UNROLL=1) runs in check_pieces, the free-running check and every sweep of gpu.* on a GPU. */
static int sched_unroll = DS_UNROLL;

static unsigned char* region(int ch, int from, int to) {
  if (!regions[ch][from][to]) {
    regions[ch][from][to] = calloc(1, DS_REGION_BYTES(NSL, SLOT));
    if (!regions[ch][from][to]) abort();
  }
  return regions[ch][from][to];
}

/* The connectors of rank r, as dev_conn.c builds them from the same topology. */
static void wire(struct ds_work* w) {
  int n = w->nranks, r = w->rank;
  memset(w->ch, 0, sizeof(w->ch));
  for (int c = 0; c < w->nch; c++) {
    struct ds_chan* ch = &w->ch[c];
    if (n > 1) {
      ds_conn_at(&ch->ring_send, region(c, r, ds_ring_next(r, n)), 0);
      ds_conn_at(&ch->ring_recv, region(c, ds_ring_prev(r, n), r), 0);
    }
    int p = ds_tree_parent(r);
    if (p >= 0) {
      ds_conn_at(&ch->up_send, region(c, r, p), 0);
      ds_conn_at(&ch->down_recv, region(c, p, r), 0);
    }
    for (int j = 0; j < 2; j++) {
      int k = ds_tree_child(r, n, j);
      if (k < 0) continue;
      ds_conn_at(&ch->up_recv[j], region(c, k, r), 0);
      ds_conn_at(&ch->down_send[j], region(c, r, k), 0);
    }
  }
}

struct job {
  struct ds_work* w;
  int c;
  int rc;
};

static void* run(void* arg) {
  struct job* j = arg;
  struct ds_shared sh;
  j->rc = ds_run_channel(j->w, j->c, &sh, 0, 1);
  return NULL;
}

/* Runs one call on every rank and channel at once. */
static void run_all(struct ds_work* w, int n) {
  pthread_t th[MAXR * DS_MAX_CH];
  struct job jobs[MAXR * DS_MAX_CH];
  int k = 0;
  for (int r = 0; r < n; r++)
    for (int c = 0; c < w[r].nch; c++) {
      jobs[k].w = &w[r];
      jobs[k].c = c;
      jobs[k].rc = -1;
      if (pthread_create(&th[k], NULL, run, &jobs[k]) != 0) abort();
      k++;
    }
  for (int i = 0; i < k; i++) {
    pthread_join(th[i], NULL);
    if (jobs[i].rc != DS_OK) {
      printf("FAIL: rank %d channel %d stopped with %d\n", jobs[i].w->rank, jobs[i].c, jobs[i].rc);
      failures++;
    }
  }
}

static uint64_t input(int dt, int r, size_t i) {
  int v = (int)((r * 7 + (int)i * 3) % 11) - 5;
  if (dt == RE_U8 || dt == RE_U32) v += 5;
  switch (dt) {
    case RE_F32: return re_f2u((float)v);
    case RE_F64: return re_d2u((double)v);
    case RE_F16:
    case RE_BF16: return re_nfrom_f(dt, (float)v);
    default: return re_low(dt, (uint64_t)(int64_t)v);
  }
}

static uint64_t reduced(int dt, int red, int avg_n, struct re_scalar s, int n, size_t i) {
  int red2 = red == RE_PREMULSUM ? RE_SUM : red;
  uint64_t v = 0;
  for (int r = 0; r < n; r++) {
    uint64_t x = input(dt, r, i);
    if (red == RE_PREMULSUM) x = re_scale(dt, x, s);
    v = r == 0 ? x : re_reduce(dt, red2, v, x, s);
  }
  return avg_n > 1 ? re_div(dt, v, avg_n) : v;
}

static const char* kname[] = {"allreduce_ring", "allreduce_tree", "allgather", "reducescatter", "broadcast", "reduce"};

static void check(int kind, int dt, int red, int avg, int n, int nch, size_t count, int inplace, int root) {
  size_t es = (size_t)re_size(dt);
  int gather = kind == DS_ALLGATHER, scatter = kind == DS_REDUCESCATTER;
  size_t sn = scatter ? count * (size_t)n : count, rn = gather ? count * (size_t)n : count;
  size_t big = (sn > rn ? sn : rn) + 1;
  unsigned char* sb[MAXR];
  unsigned char* rb[MAXR];
  struct ds_work w[MAXR];
  struct re_scalar s = {2.0, 2};
  for (int r = 0; r < n; r++) {
    sb[r] = calloc(big, es);
    rb[r] = inplace ? sb[r] : calloc(big, es);
    if (!sb[r] || !rb[r]) abort();
    memset(rb[r], 0x5a, big * es);
    /* In place: the input sits where the API puts it inside recvbuff. */
    unsigned char* in = sb[r];
    if (inplace && gather) in = rb[r] + (size_t)r * count * es;
    for (size_t b = 0; b < (scatter ? (size_t)n : 1); b++)
      for (size_t i = 0; i < count; i++) ds_st(in + (b * count + i) * es, es, input(dt, r, b * 1000 + i));
    memset(&w[r], 0, sizeof(w[r]));
    w[r].kind = kind;
    w[r].dt = dt;
    w[r].red = red;
    w[r].avg_n = avg ? n : 0;
    w[r].nranks = n;
    w[r].rank = r;
    w[r].root = root;
    w[r].nch = nch;
    w[r].nslots = NSL;
    w[r].slot_bytes = SLOT;
    w[r].count = count;
    w[r].scalar = s;
    w[r].timeout_ns = 60ull * 1000000000ull; /* a schedule that deadlocks fails instead of hanging */
    w[r].unroll = sched_unroll;
    w[r].sendbuff = in;
    w[r].recvbuff = rb[r];
    wire(&w[r]);
  }
  run_all(w, n);
  runs++;
  int bad = 0;
  for (int r = 0; r < n && !bad; r++) {
    if (kind == DS_REDUCE && r != root) continue;
    for (size_t i = 0; i < rn && !bad; i++) {
      uint64_t want;
      if (kind == DS_ALLGATHER) want = input(dt, (int)(i / count), i % count);
      else if (kind == DS_BROADCAST) want = input(dt, root, i);
      else if (scatter) want = reduced(dt, red, avg ? n : 0, s, n, (size_t)r * 1000 + i);
      else want = reduced(dt, red, avg ? n : 0, s, n, i);
      uint64_t got = ds_ld(rb[r] + i * es, es);
      if (got != want) {
        printf("FAIL: %s dt %d red %d avg %d n %d nch %d count %zu inplace %d root %d: rank %d elem %zu got %llx want %llx\n",
               kname[kind], dt, red, avg, n, nch, count, inplace, root, r, i, (unsigned long long)got,
               (unsigned long long)want);
        bad = 1;
      }
    }
    /* Nothing past the result may be written. */
    if (!inplace && !bad && rb[r][rn * es] != 0x5a) {
      printf("FAIL: %s n %d count %zu: rank %d wrote past its result\n", kname[kind], n, count, r);
      bad = 1;
    }
  }
  failures += bad;
  for (int r = 0; r < n; r++) {
    if (!inplace) free(rb[r]);
    free(sb[r]);
  }
}

/* A rank whose peer never runs must stop when the abort word is set, and say why. */
struct abort_arg {
  struct ds_work* w;
  int rc;
};
static void* abort_run(void* arg) {
  struct abort_arg* a = arg;
  struct ds_shared sh;
  a->rc = ds_run_channel(a->w, 0, &sh, 0, 1);
  return NULL;
}

static void check_abort(void) {
  static unsigned char r01[DS_REGION_BYTES(NSL, SLOT)], r10[DS_REGION_BYTES(NSL, SLOT)];
  float sbuf[64] = {0}, rbuf[64];
  volatile uint32_t abort_word = 0, status = 0;
  struct ds_work w;
  memset(&w, 0, sizeof(w));
  w.kind = DS_ALLREDUCE_RING;
  w.dt = RE_F32;
  w.red = RE_SUM;
  w.nranks = 2;
  w.rank = 0;
  w.nch = 1;
  w.nslots = NSL;
  w.slot_bytes = SLOT;
  w.count = 64;
  w.sendbuff = sbuf;
  w.recvbuff = rbuf;
  w.abort = &abort_word;
  w.status = &status;
  ds_conn_at(&w.ch[0].ring_send, r01, 0);
  ds_conn_at(&w.ch[0].ring_recv, r10, 0);
  struct abort_arg a = {&w, -1};
  pthread_t t;
  if (pthread_create(&t, NULL, abort_run, &a) != 0) abort();
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  abort_word = 1;
  pthread_join(t, NULL);
  if (a.rc != DS_ABORTED || status != DS_ABORTED) {
    printf("FAIL: abort: rc %d status %u\n", a.rc, (unsigned)status);
    failures++;
  }
  /* A deadline stops it too. */
  memset(r01, 0, sizeof(r01));
  memset(r10, 0, sizeof(r10));
  abort_word = 0;
  status = 0;
  w.timeout_ns = 10 * 1000 * 1000;
  a.rc = -1;
  if (pthread_create(&t, NULL, abort_run, &a) != 0) abort();
  pthread_join(t, NULL);
  if (a.rc != DS_TIMEOUT || status != DS_TIMEOUT) {
    printf("FAIL: timeout: rc %d status %u\n", a.rc, (unsigned)status);
    failures++;
  }
}

/* Ranks that run their calls back to back, each at its own pace: on the GPU
 * a rank's next kernel can start while its peers are still in the last call
 * (kernels are ordered per communicator, not across ranks). The counters
 * carry the order, so every result must still be right and nothing may stall. */
struct free_arg {
  int r, n, kind, nch, fails;
};
static void* free_run(void* p) {
  struct free_arg* a = p;
  const size_t counts[] = {1, 37, 301, 1000};
  const int n = a->n, r = a->r, dt = RE_F32;
  struct re_scalar s = {2.0, 2};
  for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
    for (int inplace = 0; inplace < 2; inplace++)
      for (int it = 0; it < 3; it++) {
        size_t count = counts[ci];
        int gather = a->kind == DS_ALLGATHER, scatter = a->kind == DS_REDUCESCATTER;
        size_t sn = scatter ? count * (size_t)n : count, rn = gather ? count * (size_t)n : count;
        int root = (int)(ci + (size_t)it) % n;
        unsigned char* sb = calloc(sn + rn + 1, 4);
        unsigned char* rb = inplace ? sb : calloc(rn + 1, 4);
        if (!sb || !rb) abort();
        unsigned char* in = inplace && gather ? rb + (size_t)r * count * 4 : sb;
        for (size_t i = 0; i < sn; i++) ds_st(in + i * 4, 4, input(dt, r, (scatter ? (i / count) * 1000 + i % count : i)));
        struct ds_work w;
        memset(&w, 0, sizeof(w));
        w.kind = a->kind;
        w.dt = dt;
        w.red = RE_SUM;
        w.nranks = n;
        w.rank = r;
        w.root = root;
        w.nch = a->nch;
        w.nslots = NSL;
        w.slot_bytes = SLOT;
        w.count = count;
        w.scalar = s;
        w.timeout_ns = 60ull * 1000000000ull;
        w.unroll = it == 1 ? 1 : DS_UNROLL; /* the second call of each shape takes the one-group path */
        w.sendbuff = in;
        w.recvbuff = rb;
        wire(&w);
        pthread_t th[DS_MAX_CH];
        struct job jobs[DS_MAX_CH];
        for (int c = 0; c < w.nch; c++) {
          jobs[c] = (struct job){&w, c, -1};
          if (pthread_create(&th[c], NULL, run, &jobs[c]) != 0) abort();
        }
        int bad = 0;
        for (int c = 0; c < w.nch; c++) {
          pthread_join(th[c], NULL);
          if (jobs[c].rc != DS_OK) bad = 1;
        }
        for (size_t i = 0; i < rn && !bad && (a->kind != DS_REDUCE || r == root); i++) {
          uint64_t want;
          if (gather) want = input(dt, (int)(i / count), i % count);
          else if (a->kind == DS_BROADCAST) want = input(dt, root, i);
          else if (scatter) want = reduced(dt, RE_SUM, 0, s, n, (size_t)r * 1000 + i);
          else want = reduced(dt, RE_SUM, 0, s, n, i);
          if (ds_ld(rb + i * 4, 4) != want) bad = 1;
        }
        if (bad) {
          printf("FAIL: free-running %s n %d nch %d count %zu inplace %d call %d: rank %d\n", kname[a->kind], n,
                 a->nch, count, inplace, it, r);
          a->fails++;
        }
        if (!inplace) free(rb);
        free(sb);
        if (bad) return NULL;
      }
  return NULL;
}

static void check_free_running(void) {
  for (int n = 2; n <= 4; n += 2)
    for (int nch = 1; nch <= 2; nch++)
      for (int kind = 0; kind < DS_NKINDS; kind++) {
        pthread_t th[MAXR];
        struct free_arg a[MAXR];
        /* Every region exists before the ranks start (region() is not thread-safe). */
        for (int c = 0; c < nch; c++)
          for (int x = 0; x < n; x++)
            for (int y = 0; y < n; y++)
              if (x != y) region(c, x, y);
        for (int r = 0; r < n; r++) {
          a[r] = (struct free_arg){r, n, kind, nch, 0};
          if (pthread_create(&th[r], NULL, free_run, &a[r]) != 0) abort();
        }
        for (int r = 0; r < n; r++) {
          pthread_join(th[r], NULL);
          failures += a[r].fails;
        }
        runs++;
        for (int c = 0; c < DS_MAX_CH; c++)
          for (int x = 0; x < MAXR; x++)
            for (int y = 0; y < MAXR; y++) {
              free(regions[c][x][y]);
              regions[c][x][y] = NULL;
            }
      }
}

/* One piece as a block of nth threads runs it (the threads share nothing
 * inside ds_piece_elems, so running them one after the other is the same),
 * with DS_UNROLL groups per thread and with one: both must give the
 * reference bytes in every output, for thread counts that do and do not
 * divide the groups, with and without a local input, one or two incoming
 * slots, in place. */
static float f32_of(uint64_t bits) {
  uint32_t u = (uint32_t)bits;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
#define WFLOATS 4224 /* a multiple of 16: aligned_alloc wants whole 64-byte units */
#define WBYTES (WFLOATS * 4)
static void check_pieces(void) {
  const int nths[] = {1, 3, 32, 256};
  const size_t nes[] = {1, 4, 7, 64, 1000, 4099};
  for (size_t ti = 0; ti < sizeof(nths) / sizeof(nths[0]); ti++)
    for (size_t ni = 0; ni < sizeof(nes) / sizeof(nes[0]); ni++)
      for (int shape = 0; shape < 4; shape++) {
        const int nth = nths[ti], dt = RE_F32;
        const size_t ne = nes[ni], es = 4;
        const int nrecv = shape == 3 ? 2 : 1, with_src = shape != 1, inplace = shape == 2;
        unsigned char *src = aligned_alloc(64, WBYTES), *dst = inplace ? src : aligned_alloc(64, WBYTES);
        unsigned char *in0 = aligned_alloc(64, WBYTES), *in1 = aligned_alloc(64, WBYTES);
        unsigned char *out[2] = {aligned_alloc(64, WBYTES), aligned_alloc(64, WBYTES)};
        unsigned char* want = malloc(WBYTES);
        for (int mode = 0; mode < 2; mode++) {
          for (size_t i = 0; i < WFLOATS; i++) {
            ds_st(src + i * es, es, input(dt, 0, i));
            ds_st(in0 + i * es, es, input(dt, 1, i));
            ds_st(in1 + i * es, es, input(dt, 2, i));
          }
          if (!inplace) memset(dst, 0x5a, WBYTES);
          memset(out[0], 0x5a, WBYTES);
          memset(out[1], 0x5a, WBYTES);
          struct ds_work w;
          memset(&w, 0, sizeof(w));
          w.dt = dt;
          w.red = RE_SUM;
          w.unroll = mode ? DS_UNROLL : 1;
          struct ds_step st;
          memset(&st, 0, sizeof(st));
          st.nrecv = nrecv;
          st.nsend = 2;
          st.src = with_src ? src : NULL;
          st.dst = dst;
          st.len = ne;
          struct ds_shared sh = {0, {in0, in1}, {out[0], out[1]}};
          for (int tid = 0; tid < nth; tid++) ds_piece_elems(&w, &st, w.scalar, 0, &sh, ne, tid, nth);
          for (size_t i = 0; i < ne; i++) {
            float v = with_src ? f32_of(input(dt, 0, i)) + f32_of(input(dt, 1, i)) : f32_of(input(dt, 1, i));
            if (nrecv == 2) v += f32_of(input(dt, 2, i));
            memcpy(want + i * 4, &v, 4);
          }
          int bad = memcmp(dst, want, ne * 4) || memcmp(out[0], want, ne * 4) || memcmp(out[1], want, ne * 4);
          if (!inplace) bad |= dst[ne * 4] != 0x5a;
          bad |= out[0][ne * 4] != 0x5a || out[1][ne * 4] != 0x5a;
          if (bad) {
            printf("FAIL: piece nth %d ne %zu shape %d unroll %d\n", nth, ne, shape, w.unroll);
            failures++;
          }
          runs++;
        }
        free(src);
        if (!inplace) free(dst);
        free(in0);
        free(in1);
        free(out[0]);
        free(out[1]);
        free(want);
      }
}

int main(void) {
  const size_t counts[] = {0, 1, 5, 37, 301};
  const int dts[] = {RE_F32, RE_I32, RE_F16, RE_U8, RE_F64};
  for (int n = 1; n <= MAXR; n++) {
    for (int nch = 1; nch <= 3; nch++)
      for (int kind = 0; kind < DS_NKINDS; kind++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
          for (int di = 0; di < 5; di++) {
            int dt = dts[di];
            int reduces = kind != DS_ALLGATHER && kind != DS_BROADCAST;
            /* Every reduction; the fifth sum is ncclAvg. */
            static const int reds[] = {RE_SUM, RE_MAX, RE_MIN, RE_PREMULSUM, RE_SUM, RE_PROD};
            int nred = reduces ? (int)(sizeof(reds) / sizeof(reds[0])) : 1;
            for (int ri = 0; ri < nred; ri++) {
              int red = reds[ri];
              int avg = ri == 4;
              int root = (int)(ci + (size_t)kind) % n;
              check(kind, dt, red, avg, n, nch, counts[ci], 0, root);
              if (ri == 0 && kind != DS_REDUCE) check(kind, dt, red, avg, n, nch, counts[ci], 1, root);
            }
          }
    /* The connectors are kept from call to call: nothing may be left in flight. */
    for (int c = 0; c < DS_MAX_CH; c++)
      for (int a = 0; a < MAXR; a++)
        for (int b = 0; b < MAXR; b++) {
          unsigned char* g = regions[c][a][b];
          if (!g) continue;
          uint64_t h = *(uint64_t*)(g + DS_HEAD_OFF), t = *(uint64_t*)(g + DS_TAIL_OFF);
          if (h != t) {
            printf("FAIL: n %d: connector ch %d %d->%d has head %llu tail %llu\n", n, c, a, b,
                   (unsigned long long)h, (unsigned long long)t);
            failures++;
          }
          free(g);
          regions[c][a][b] = NULL;
        }
  }
  check_pieces();
  check_free_running();
  check_abort();
  printf("%d calls simulated, %d failures\n", runs, failures);
  return failures ? 1 : 0;
}
