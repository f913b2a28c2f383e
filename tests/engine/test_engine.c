/* Multi-process tests of the engine (include/collie.h, src/engine): forks
 * N ranks (tests/mp/harness.h), each starts the engine on a communicator and
 * runs one scenario. Usage: test_engine SCENARIO NRANKS [ARG]. Scenarios:
 * basic, orders, dtypes, colls, mismatch, join, sets, fusion, timeline,
 * stall, cycles, shutdown, reinit, autotune, errors, peerdeath, handles, join_a2a, group. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "collie.h"
#include "device/reduce.h"
#include "bootstrap/socket.h"
#include "harness.h"
#include "typed.h"

static const char* g_arg; /* scenario argument (a file path) */

static int is_int(ncclDataType_t dt) { return dt <= ncclUint64; }

/* Relative tolerance of a float type after a few roundings. */
static double tol(ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat16: return 4e-3;
    case ncclBfloat16: return 3e-2;
    case ncclFloat8e4m3: return 0.2;
    case ncclFloat8e5m2: return 0.3;
    case ncclFloat32: return 1e-5;
    default: return 1e-12;
  }
}

static int close_to(ncclDataType_t dt, double got, double want) {
  if (is_int(dt)) return got == want;
  return fabs(got - want) <= tol(dt) * fmax(1.0, fabs(want));
}

static int start(int rank, int n, const ncclUniqueId* ids, ncclComm_t* comm) {
  MP_NCCL(ncclCommInitRank(comm, n, ids[0], rank));
  int rc = collie_init_comm(*comm);
  MP_CHECK(rc == 0, "collie_init_comm -> %d: %s", rc, collie_last_error());
  MP_CHECK(collie_is_initialized() == 1, "not initialised");
  MP_CHECK(collie_rank() == rank && collie_size() == n, "rank %d size %d", collie_rank(), collie_size());
  return 0;
}

static int stop(ncclComm_t comm) {
  int rc = collie_shutdown();
  MP_CHECK(rc == 0, "collie_shutdown -> %d: %s", rc, collie_last_error());
  MP_CHECK(collie_shutdown() == 0, "second collie_shutdown");
  MP_CHECK(collie_is_initialized() == 0, "still initialised");
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

#define WAIT_OK(h)                                                                          \
  do {                                                                                      \
    int h_ = (h);                                                                           \
    MP_CHECK(h_ >= 0, "submit -> %d: %s", h_, collie_last_error());                         \
    int w_ = collie_wait(h_);                                                               \
    MP_CHECK(w_ == 0, "wait -> %d: %s", w_, collie_handle_error(h_));                       \
  } while (0)

static collie_engine_stats_t stats(void) {
  collie_engine_stats_t st;
  memset(&st, 0, sizeof(st));
  st.size = sizeof(st);
  collie_engine_stats(&st);
  return st;
}

/* ------------------------------------------------------------ basic */

static int t_basic(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  float x[100], y[100];
  for (int i = 0; i < 100; i++) x[i] = (float)(rank + i);
  WAIT_OK(collie_allreduce_async("x", x, y, 100, ncclFloat32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD));
  for (int i = 0; i < 100; i++)
    MP_CHECK(y[i] == (float)(n * (n - 1) / 2 + n * i), "y[%d] = %g", i, (double)y[i]);
  int h = collie_allreduce_async("x", x, x, 100, ncclFloat32, COLLIE_AVERAGE, 1.0, 1.0, COLLIE_WORLD);
  WAIT_OK(h);
  MP_CHECK(collie_poll(h) == 1, "poll after wait");
  MP_CHECK(collie_release(h) == 0, "release");
  MP_CHECK(collie_poll(h) < 0, "poll of a released handle");
  for (int i = 0; i < 100; i++)
    MP_CHECK(fabs(x[i] - ((n - 1) / 2.0 + i)) < 1e-4, "avg x[%d] = %g", i, (double)x[i]);
  MP_CHECK(collie_barrier(COLLIE_WORLD) == 0, "barrier: %s", collie_last_error());
  return stop(comm);
}

/* ------------------------------------------------------------ orders */

#define NT 48
#define NTHREADS 3

struct order_ctx {
  int rank, step, tid;
  int32_t (*in)[64];
  int32_t (*out)[64];
  int* handles;
};

static void* order_thread(void* p) {
  struct order_ctx* c = p;
  int idx[NT];
  for (int i = 0; i < NT; i++) idx[i] = i;
  unsigned seed = (unsigned)(c->rank * 7919 + c->step * 31 + c->tid);
  for (int i = NT - 1; i > 0; i--) {
    int j = (int)(rand_r(&seed) % (unsigned)(i + 1));
    int t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
  for (int k = 0; k < NT; k++) {
    int i = idx[k];
    if (i % NTHREADS != c->tid) continue;
    char name[32];
    snprintf(name, sizeof(name), "grad.%d", i);
    c->handles[i] = collie_allreduce_async(name, c->in[i], c->out[i], (size_t)(1 + i), ncclInt32, COLLIE_SUM, 1.0, 1.0,
                                           COLLIE_WORLD);
    if (rand_r(&seed) % 4 == 0) usleep(200);
  }
  return NULL;
}

static int t_orders(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  static int32_t in[NT][64], out[NT][64];
  int handles[NT];
  for (int step = 0; step < 5; step++) {
    for (int i = 0; i < NT; i++)
      for (int k = 0; k < 64; k++) in[i][k] = rank * 1000 + i * 10 + k + step;
    pthread_t th[NTHREADS];
    struct order_ctx ctx[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
      ctx[t] = (struct order_ctx){rank, step, t, in, out, handles};
      pthread_create(&th[t], NULL, order_thread, &ctx[t]);
    }
    for (int t = 0; t < NTHREADS; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < NT; i++) {
      WAIT_OK(handles[i]);
      collie_release(handles[i]);
      for (int k = 0; k < 1 + i; k++) {
        int32_t want = 1000 * n * (n - 1) / 2 + n * (i * 10 + k + step);
        MP_CHECK(out[i][k] == want, "step %d grad.%d[%d] = %d, want %d", step, i, k, out[i][k], want);
      }
    }
    if (step == 0) {
      collie_engine_stats_t st = stats();
      MP_CHECK(st.cache_misses == NT && st.cache_hits == 0, "step 0: hits %llu misses %llu",
               (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses);
    }
  }
  collie_engine_stats_t st = stats();
  MP_CHECK(st.cache_hits == 4 * NT && st.cache_misses == NT, "after 5 steps: hits %llu misses %llu",
           (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses);
  return stop(comm);
}

/* ------------------------------------------------------------ dtypes x ops */

static const int ops[5] = {COLLIE_SUM, COLLIE_AVERAGE, COLLIE_MIN, COLLIE_MAX, COLLIE_PRODUCT};

static double in_val(int r, size_t i) { return (double)(1 + (r + i) % 3); }

static double expect(int op, int n, size_t i, ncclDataType_t dt) {
  double s = 0, p = 1, mn = 1e300, mx = -1e300;
  for (int r = 0; r < n; r++) {
    double v = in_val(r, i);
    s += v;
    p *= v;
    mn = fmin(mn, v);
    mx = fmax(mx, v);
  }
  switch (op) {
    case COLLIE_SUM: return s;
    case COLLIE_AVERAGE: return is_int(dt) ? trunc(s / n) : s / n;
    case COLLIE_MIN: return mn;
    case COLLIE_MAX: return mx;
    default: return p;
  }
}

static int t_dtypes(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  const size_t count = 37;
  void* in[ncclNumTypes][5];
  void* out[ncclNumTypes][5];
  int h[ncclNumTypes][5];
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    for (int o = 0; o < 5; o++) {
      in[dt][o] = malloc(count * 8);
      out[dt][o] = malloc(count * 8);
      for (size_t i = 0; i < count; i++) store((ncclDataType_t)dt, in[dt][o], i, in_val(rank, i));
      char name[32];
      snprintf(name, sizeof(name), "dt%d.op%d", dt, ops[o]);
      h[dt][o] = collie_allreduce_async(name, in[dt][o], out[dt][o], count, (ncclDataType_t)dt, ops[o], 1.0, 1.0,
                                        COLLIE_WORLD);
    }
  }
  int bad = 0;
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    for (int o = 0; o < 5; o++) {
      WAIT_OK(h[dt][o]);
      collie_release(h[dt][o]);
      for (size_t i = 0; i < count && !bad; i++) {
        double got = load((ncclDataType_t)dt, out[dt][o], i), want = expect(ops[o], n, i, (ncclDataType_t)dt);
        if (!close_to((ncclDataType_t)dt, got, want)) {
          fprintf(stderr, "FAIL rank %d dtype %d op %d [%zu]: %g want %g\n", rank, dt, ops[o], i, got, want);
          bad = 1;
        }
      }
      free(in[dt][o]);
      free(out[dt][o]);
    }
  }
  MP_CHECK(!bad, "wrong allreduce result");
  /* Scaling: post * sum(pre * x) for the float types. */
  ncclDataType_t fts[4] = {ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  for (int k = 0; k < 4; k++) {
    char b[8 * 10], o[8 * 10];
    for (size_t i = 0; i < 10; i++) store(fts[k], b, i, (double)(rank + 1));
    char name[32];
    snprintf(name, sizeof(name), "scaled.%d", k);
    WAIT_OK(collie_allreduce_async(name, b, o, 10, fts[k], COLLIE_SUM, 0.5, 4.0, COLLIE_WORLD));
    for (size_t i = 0; i < 10; i++) {
      double want = 4.0 * 0.5 * n * (n + 1) / 2.0;
      MP_CHECK(close_to(fts[k], load(fts[k], o, i), want), "scaled %d: %g want %g", k, load(fts[k], o, i), want);
    }
  }
  int32_t iv[4] = {1, 2, 3, 4};
  MP_CHECK(collie_allreduce_async("int.scaled", iv, iv, 4, ncclInt32, COLLIE_SUM, 2.0, 1.0, COLLIE_WORLD) ==
               COLLIE_ERR_INVALID_ARGUMENT,
           "scale on an integer dtype must be refused");
  return stop(comm);
}

/* ------------------------------------------------------------ other collectives */

static int t_colls(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  for (int rep = 0; rep < 2; rep++) {
    /* allgather, rank r contributes r+1 elements of value 100r+k */
    int32_t ag[16];
    for (int k = 0; k <= rank; k++) ag[k] = 100 * rank + k;
    int hg = collie_allgather_async("ag", ag, (size_t)rank + 1, ncclInt32, COLLIE_WORLD);
    /* allgather_nd [r+1, 3] float64 */
    double agnd[16 * 3];
    for (int k = 0; k < (rank + 1) * 3; k++) agnd[k] = rank + k * 0.5;
    int64_t shape[2] = {rank + 1, 3};
    int hgn = collie_allgather_nd_async("agnd", agnd, 2, shape, ncclFloat64, COLLIE_WORLD);
    /* broadcast from the last rank */
    double bc[33];
    for (int k = 0; k < 33; k++) bc[k] = rank == n - 1 ? k * 1.5 : -1;
    int hb = collie_broadcast_async("bc", bc, 33, ncclFloat64, n - 1, COLLIE_WORLD);
    /* alltoall: rank r sends r+j+1 elements to j, value 1000r+100j+k */
    size_t sc[16];
    int64_t a2a[256];
    size_t off = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = (size_t)(rank + j + 1);
      for (size_t k = 0; k < sc[j]; k++) a2a[off++] = 1000 * rank + 100 * j + (int64_t)k;
    }
    int ha = collie_alltoall_async("a2a", a2a, sc, ncclInt64, COLLIE_WORLD);
    /* reducescatter of 2n+1 elements (uneven split) */
    size_t rc_n = 2 * (size_t)n + 1;
    int64_t rs[64];
    for (size_t k = 0; k < rc_n; k++) rs[k] = rank * 10 + (int64_t)k;
    int hr = collie_reducescatter_async("rs", rs, rc_n, ncclInt64, COLLIE_SUM, COLLIE_WORLD);
    float rsf[64];
    for (size_t k = 0; k < rc_n; k++) rsf[k] = (float)(rank + k);
    int hrf = collie_reducescatter_async("rsf", rsf, rc_n, ncclFloat32, COLLIE_AVERAGE, COLLIE_WORLD);
    /* grouped allreduce */
    int32_t g0[3] = {rank, rank, rank}, g1[5] = {1, 1, 1, 1, 1}, o0[3], o1[5];
    const char* gn[2] = {"g0", "g1"};
    const void* gs[2] = {g0, g1};
    void* go[2] = {o0, o1};
    size_t gc[2] = {3, 5};
    int hgr = collie_grouped_allreduce_async(2, gn, gs, go, gc, ncclInt32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD);

    WAIT_OK(hg);
    void* res;
    size_t cnt, counts[16];
    MP_CHECK(collie_result(hg, &res, &cnt) == 0, "result: %s", collie_last_error());
    MP_CHECK(cnt == (size_t)(n * (n + 1) / 2), "allgather count %zu", cnt);
    MP_CHECK(collie_result_counts(hg, counts) == 0, "counts");
    off = 0;
    for (int r = 0; r < n; r++) {
      MP_CHECK(counts[r] == (size_t)r + 1, "counts[%d] = %zu", r, counts[r]);
      for (int k = 0; k <= r; k++, off++)
        MP_CHECK(((int32_t*)res)[off] == 100 * r + k, "allgather [%zu] = %d", off, ((int32_t*)res)[off]);
    }
    collie_release(hg);

    WAIT_OK(hgn);
    MP_CHECK(collie_result(hgn, &res, &cnt) == 0 && cnt == (size_t)(3 * n * (n + 1) / 2), "allgather_nd count %zu", cnt);
    off = 0;
    for (int r = 0; r < n; r++)
      for (int k = 0; k < (r + 1) * 3; k++, off++)
        MP_CHECK(((double*)res)[off] == r + k * 0.5, "allgather_nd [%zu] = %g", off, ((double*)res)[off]);
    collie_release(hgn);

    WAIT_OK(hb);
    for (int k = 0; k < 33; k++) MP_CHECK(bc[k] == k * 1.5, "broadcast [%d] = %g", k, bc[k]);
    collie_release(hb);

    WAIT_OK(ha);
    MP_CHECK(collie_result(ha, &res, &cnt) == 0, "a2a result");
    MP_CHECK(collie_result_counts(ha, counts) == 0, "a2a counts");
    off = 0;
    for (int r = 0; r < n; r++) {
      MP_CHECK(counts[r] == (size_t)(r + rank + 1), "a2a counts[%d] = %zu", r, counts[r]);
      for (size_t k = 0; k < counts[r]; k++, off++)
        MP_CHECK(((int64_t*)res)[off] == 1000 * r + 100 * rank + (int64_t)k, "a2a [%zu] = %lld", off,
                 (long long)((int64_t*)res)[off]);
    }
    MP_CHECK(cnt == off, "a2a count %zu", cnt);
    collie_release(ha);

    WAIT_OK(hr);
    MP_CHECK(collie_result(hr, &res, &cnt) == 0, "rs result");
    size_t base = rc_n / (size_t)n, rem = rc_n % (size_t)n;
    size_t mine = base + ((size_t)rank < rem), first = (size_t)rank * base + ((size_t)rank < rem ? (size_t)rank : rem);
    MP_CHECK(cnt == mine, "reducescatter count %zu want %zu", cnt, mine);
    for (size_t k = 0; k < mine; k++) {
      int64_t want = 10 * n * (n - 1) / 2 + n * (int64_t)(first + k);
      MP_CHECK(((int64_t*)res)[k] == want, "reducescatter [%zu] = %lld want %lld", k, (long long)((int64_t*)res)[k],
               (long long)want);
    }
    collie_release(hr);
    WAIT_OK(hrf);
    MP_CHECK(collie_result(hrf, &res, &cnt) == 0 && cnt == mine, "rsf");
    for (size_t k = 0; k < mine; k++)
      MP_CHECK(fabs(((float*)res)[k] - ((n - 1) / 2.0 + first + k)) < 1e-4, "rs avg [%zu] = %g", k,
               (double)((float*)res)[k]);
    collie_release(hrf);

    WAIT_OK(hgr);
    for (int k = 0; k < 3; k++) MP_CHECK(o0[k] == n * (n - 1) / 2, "grouped o0");
    for (int k = 0; k < 5; k++) MP_CHECK(o1[k] == n, "grouped o1");
    collie_release(hgr);
    MP_CHECK(collie_barrier(COLLIE_WORLD) == 0, "barrier");
  }
  return stop(comm);
}

/* ------------------------------------------------------------ mismatch */

static int t_mismatch(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  float x[16] = {0};
  /* Rank 1 disagrees on the count. */
  int h = collie_allreduce_async("bad.count", x, x, rank == 1 ? 12 : 10, ncclFloat32, COLLIE_SUM, 1.0, 1.0,
                                 COLLIE_WORLD);
  MP_CHECK(h >= 0, "submit");
  int rc = collie_wait(h);
  const char* msg = collie_handle_error(h);
  MP_CHECK(rc == COLLIE_ERR_MISMATCH, "rank %d: wait -> %d (%s)", rank, rc, msg);
  MP_CHECK(strstr(msg, "bad.count") && strstr(msg, "rank 1: 12") && strstr(msg, "rank 0: 10") &&
               strstr(msg, "element count"),
           "message: %s", msg);
  MP_CHECK(strstr(collie_last_error(), "bad.count"), "last error: %s", collie_last_error());
  collie_release(h);
  /* The last rank disagrees on the dtype; then on the op; then a cached tensor changes its count. */
  h = collie_allreduce_async("bad.dtype", x, x, 4, rank == n - 1 ? ncclInt32 : ncclFloat32, COLLIE_SUM, 1.0, 1.0,
                             COLLIE_WORLD);
  MP_CHECK(collie_wait(h) == COLLIE_ERR_MISMATCH, "dtype mismatch");
  msg = collie_handle_error(h);
  MP_CHECK(strstr(msg, "bad.dtype") && strstr(msg, "int32") && strstr(msg, "float32"), "message: %s", msg);
  collie_release(h);
  h = collie_allreduce_async("bad.op", x, x, 4, ncclFloat32, rank == 0 ? COLLIE_MAX : COLLIE_SUM, 1.0, 1.0,
                             COLLIE_WORLD);
  MP_CHECK(collie_wait(h) == COLLIE_ERR_MISMATCH, "op mismatch");
  MP_CHECK(strstr(collie_handle_error(h), "max"), "message: %s", collie_handle_error(h));
  collie_release(h);
  int64_t shape[2] = {rank + 1, rank == 0 ? 2 : 3};
  h = collie_allgather_nd_async("bad.shape", x, 2, shape, ncclFloat32, COLLIE_WORLD);
  MP_CHECK(collie_wait(h) == COLLIE_ERR_MISMATCH, "shape mismatch");
  MP_CHECK(strstr(collie_handle_error(h), "shape"), "message: %s", collie_handle_error(h));
  collie_release(h);
  h = collie_broadcast_async("bad.root", x, 4, ncclFloat32, rank == 0 ? 1 : 0, COLLIE_WORLD);
  MP_CHECK(collie_wait(h) == COLLIE_ERR_MISMATCH, "root mismatch");
  collie_release(h);
  h = collie_allreduce_async("bad.scale", x, x, 4, ncclFloat32, COLLIE_SUM, rank == 0 ? 2.0 : 1.0, 1.0, COLLIE_WORLD);
  MP_CHECK(collie_wait(h) == COLLIE_ERR_MISMATCH, "scale mismatch");
  collie_release(h);
  for (int step = 0; step < 3; step++) {
    size_t c = step == 2 && rank == 0 ? 5 : 4;
    h = collie_allreduce_async("cached", x, x, c, ncclFloat32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD);
    rc = collie_wait(h);
    if (step < 2) MP_CHECK(rc == 0, "cached step %d: %s", step, collie_handle_error(h));
    else MP_CHECK(rc == COLLIE_ERR_MISMATCH && strstr(collie_handle_error(h), "rank 0: 5"), "cached mismatch: %s",
                  collie_handle_error(h));
    collie_release(h);
  }
  /* Still usable afterwards. */
  float y[4] = {1, 1, 1, 1};
  WAIT_OK(collie_allreduce_async("after", y, y, 4, ncclFloat32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD));
  MP_CHECK(y[0] == (float)n, "after: %g", (double)y[0]);
  return stop(comm);
}

/* ------------------------------------------------------------ join */

static int t_join(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  for (int epoch = 0; epoch < 2; epoch++) {
    int steps = 2 * (rank + 1) + epoch;
    for (int s = 0; s < steps; s++) {
      int32_t one[7] = {1, 1, 1, 1, 1, 1, 1}, out[7];
      float f[3] = {(float)n, (float)n, (float)n}, fo[3];
      int32_t mx[2] = {-5 - rank, -5 - rank}, mo[2];
      int h1 = collie_allreduce_async("j.sum", one, out, 7, ncclInt32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD);
      int h2 = collie_allreduce_async("j.avg", f, fo, 3, ncclFloat32, COLLIE_AVERAGE, 1.0, 1.0, COLLIE_WORLD);
      int h3 = collie_allreduce_async("j.max", mx, mo, 2, ncclInt32, COLLIE_MAX, 1.0, 1.0, COLLIE_WORLD);
      WAIT_OK(h1);
      WAIT_OK(h2);
      WAIT_OK(h3);
      /* Ranks still stepping at step s: those with 2(r+1)+epoch > s. */
      int active = 0, best = INT32_MIN;
      for (int r = 0; r < n; r++)
        if (2 * (r + 1) + epoch > s) {
          active++;
          if (-5 - r > best) best = -5 - r;
        }
      MP_CHECK(out[0] == active && out[6] == active, "epoch %d step %d: sum %d want %d", epoch, s, out[0], active);
      MP_CHECK(fabs(fo[0] - active) < 1e-5, "step %d: avg %g want %d (divides by the full size)", s, (double)fo[0],
               active);
      MP_CHECK(mo[0] == best, "step %d: max %d want %d (joined ranks add the identity)", s, mo[0], best);
      collie_release(h1);
      collie_release(h2);
      collie_release(h3);
    }
    int last = collie_join();
    MP_CHECK(last == n - 1, "join returned %d, want %d: %s", last, n - 1, collie_last_error());
  }
  return stop(comm);
}

/* Alltoall with unequal step counts: a joined rank sends nothing to anyone
 * and what the others address to it is dropped; the others receive zero
 * elements from it. */
static int t_join_a2a(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  for (int epoch = 0; epoch < 2; epoch++) {
    int steps = 2 * (rank + 1) + epoch;
    for (int s = 0; s < steps; s++) {
      size_t sc[16];
      int64_t a2a[512];
      size_t off = 0;
      for (int j = 0; j < n; j++) {
        sc[j] = (size_t)(j + 1 + s % 2);
        for (size_t k = 0; k < sc[j]; k++) a2a[off++] = 1000 * rank + 100 * j + 10 * s + (int64_t)k;
      }
      int h = collie_alltoall_async("j.a2a", a2a, sc, ncclInt64, COLLIE_WORLD);
      WAIT_OK(h);
      void* res;
      size_t cnt, counts[16];
      MP_CHECK(collie_result(h, &res, &cnt) == 0 && collie_result_counts(h, counts) == 0, "result: %s",
               collie_last_error());
      off = 0;
      for (int q = 0; q < n; q++) {
        int active = 2 * (q + 1) + epoch > s;
        size_t want = active ? (size_t)(rank + 1 + s % 2) : 0;
        MP_CHECK(counts[q] == want, "epoch %d step %d: %zu elements from rank %d, want %zu", epoch, s, counts[q], q,
                 want);
        for (size_t k = 0; k < counts[q]; k++, off++)
          MP_CHECK(((int64_t*)res)[off] == 1000 * q + 100 * rank + 10 * s + (int64_t)k, "step %d [%zu] = %lld", s,
                   off, (long long)((int64_t*)res)[off]);
      }
      MP_CHECK(cnt == off, "count %zu want %zu", cnt, off);
      collie_release(h);
    }
    int last = collie_join();
    MP_CHECK(last == n - 1, "join returned %d, want %d: %s", last, n - 1, collie_last_error());
  }
  return stop(comm);
}

/* ------------------------------------------------------------ grouped allreduce */

static int group2(const char* n0, const char* n1, const int32_t* s0, const int32_t* s1, int32_t* o0, int32_t* o1,
                  size_t c0, size_t c1) {
  const char* names[2] = {n0, n1};
  const void* sb[2] = {s0, s1};
  void* rb[2] = {o0, o1};
  size_t counts[2] = {c0, c1};
  return collie_grouped_allreduce_async(2, names, sb, rb, counts, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
}

/* A group is negotiated and run as a whole: no member runs before every
 * rank has submitted every member, members run in one batch, and one
 * member's mismatch fails all of them, uncached and cached. */
static int t_group(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  int last = n - 1;
  for (int step = 0; step < 2; step++) {
    /* The last rank submits the members separately, the second much later:
     * the first must wait for it (the other ranks grouped them). */
    int32_t a[4], b[6], oa[4], ob[6];
    for (int k = 0; k < 4; k++) a[k] = rank + 1, oa[k] = -7;
    for (int k = 0; k < 6; k++) b[k] = 10 * (rank + 1), ob[k] = -7;
    collie_engine_stats_t st0 = stats();
    if (rank != last) {
      WAIT_OK(group2("mix.a", "mix.b", a, b, oa, ob, 4, 6));
    } else {
      int ha = collie_allreduce_async("mix.a", a, oa, 4, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
      MP_CHECK(ha >= 0, "submit: %s", collie_last_error());
      usleep(30000);
      MP_CHECK(collie_poll(ha) == 0 && oa[0] == -7, "step %d: mix.a ran before its group member mix.b was submitted",
               step);
      int hb = collie_allreduce_async("mix.b", b, ob, 6, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
      WAIT_OK(ha);
      WAIT_OK(hb);
      collie_release(ha);
      collie_release(hb);
    }
    for (int k = 0; k < 4; k++) MP_CHECK(oa[k] == n * (n + 1) / 2, "mix.a[%d] = %d", k, oa[k]);
    for (int k = 0; k < 6; k++) MP_CHECK(ob[k] == 10 * n * (n + 1) / 2, "mix.b[%d] = %d", k, ob[k]);
    collie_engine_stats_t st1 = stats();
    MP_CHECK(st1.fused_tensors - st0.fused_tensors == 2, "step %d: the members ran in %llu fused batches' tensors",
             step, (unsigned long long)(st1.fused_tensors - st0.fused_tensors));
  }
  /* Agreed groups go through the cache after the first step, still fused. */
  for (int step = 0; step < 3; step++) {
    int32_t in[3][5], out[3][5];
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < 5; k++) in[t][k] = rank + t, out[t][k] = -7;
    const char* names[3] = {"c.0", "c.1", "c.2"};
    const void* sb[3] = {in[0], in[1], in[2]};
    void* rb[3] = {out[0], out[1], out[2]};
    size_t counts[3] = {5, 5, 5};
    if (rank == step % n) usleep(5000);
    collie_engine_stats_t st0 = stats();
    WAIT_OK(collie_grouped_allreduce_async(3, names, sb, rb, counts, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD));
    collie_engine_stats_t st1 = stats();
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < 5; k++) MP_CHECK(out[t][k] == n * (n - 1) / 2 + n * t, "c.%d[%d] = %d", t, k, out[t][k]);
    MP_CHECK(st1.fused_tensors - st0.fused_tensors == 3, "step %d: fused %llu", step,
             (unsigned long long)(st1.fused_tensors - st0.fused_tensors));
    if (step > 0)
      MP_CHECK(st1.cache_hits - st0.cache_hits == 3, "step %d: cache hits %llu", step,
               (unsigned long long)(st1.cache_hits - st0.cache_hits));
  }
  /* The last rank disagrees on one member's count: the whole group fails on
   * every rank and the other member is not reduced; first uncached, then
   * after both members are in the cache. */
  for (int step = 0; step < 3; step++) {
    const char* n0 = step == 0 ? "m.0" : "k.0";
    const char* n1 = step == 0 ? "m.1" : "k.1";
    int bad = step != 1;
    int32_t x[8] = {1, 1, 1, 1, 1, 1, 1, 1}, y[8] = {2, 2, 2, 2, 2, 2, 2, 2}, ox[8], oy[8];
    for (int k = 0; k < 8; k++) ox[k] = oy[k] = -7;
    int h = group2(n0, n1, x, y, ox, oy, 4, bad && rank == last ? 5 : 4);
    MP_CHECK(h >= 0, "submit: %s", collie_last_error());
    int rc = collie_wait(h);
    const char* msg = collie_handle_error(h);
    if (!bad) {
      MP_CHECK(rc == 0 && ox[0] == n && oy[3] == 2 * n, "step %d: %d (%s)", step, rc, msg);
    } else {
      MP_CHECK(rc == COLLIE_ERR_MISMATCH, "step %d: wait -> %d (%s)", step, rc, msg);
      MP_CHECK(strstr(msg, n1) && strstr(msg, "element count") && strstr(msg, "grouped"), "message: %s", msg);
      for (int k = 0; k < 8; k++)
        MP_CHECK(ox[k] == -7 && oy[k] == -7, "step %d: member %s was reduced although its group failed", step, n0);
    }
    collie_release(h);
  }
  /* Still usable afterwards. */
  int32_t x[2] = {1, 1}, y[2] = {3, 3}, ox[2], oy[2];
  WAIT_OK(group2("after.0", "after.1", x, y, ox, oy, 2, 2));
  MP_CHECK(ox[1] == n && oy[1] == 3 * n, "after: %d %d", ox[1], oy[1]);
  return stop(comm);
}

/* ------------------------------------------------------------ process sets */

struct set_ctx {
  int set, rank, want;
  int rc;
};

static void* set_thread(void* p) {
  struct set_ctx* c = p;
  int srank = collie_process_set_rank(c->set), ssize = collie_process_set_size(c->set);
  for (int step = 0; step < 6; step++) {
    int32_t v[5], o[5];
    for (int k = 0; k < 5; k++) v[k] = c->rank + 1;
    char name[32];
    snprintf(name, sizeof(name), "s%d.t%d", c->set, step % 3);
    int h = collie_allreduce_async(name, v, o, 5, ncclInt32, COLLIE_SUM, 1.0, 1.0, c->set);
    if (h < 0 || collie_wait(h) != 0) {
      fprintf(stderr, "FAIL set %d step %d: %s\n", c->set, step, h < 0 ? collie_last_error() : collie_handle_error(h));
      c->rc = 1;
      return NULL;
    }
    collie_release(h);
    for (int k = 0; k < 5; k++)
      if (o[k] != c->want) {
        fprintf(stderr, "FAIL set %d step %d: %d, want %d\n", c->set, step, o[k], c->want);
        c->rc = 1;
      }
    if (srank < 0 || ssize < 1) c->rc = 1;
    if (step % 2) usleep(300 * (unsigned)(c->rank + 1));
  }
  return NULL;
}

static int t_sets(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  /* Overlapping sets: {0,1,2}, {1,2,3} (given unsorted), {0,n-1}. */
  int a[3] = {0, 1, 2}, b[3] = {3, 1, 2}, c[2] = {n - 1, 0};
  int ids_[3];
  ids_[0] = collie_add_process_set(a, 3);
  ids_[1] = collie_add_process_set(b, n >= 4 ? 3 : 2);
  ids_[2] = collie_add_process_set(c, 2);
  for (int i = 0; i < 3; i++) MP_CHECK(ids_[i] > 0, "add set %d -> %d: %s", i, ids_[i], collie_last_error());
  MP_CHECK(ids_[0] != ids_[1] && ids_[1] != ids_[2], "distinct ids");
  int members[3][4] = {{1, 1, 1, 0}, {0, 1, 1, 1}, {1, 0, 0, 1}};
  int sums[3] = {6, 9, 1 + n};
  MP_CHECK(collie_process_set_size(ids_[0]) == 3, "size");
  MP_CHECK(collie_process_set_included(ids_[0]) == members[0][rank], "included");
  if (rank == 2) MP_CHECK(collie_process_set_rank(ids_[1]) == 1, "rank 2 in {1,2,3} is 1: %d", collie_process_set_rank(ids_[1]));
  pthread_t th[4];
  struct set_ctx ctx[4];
  int nth = 0;
  for (int i = 0; i < 3; i++) {
    if (!members[i][rank]) {
      int32_t v = 0;
      MP_CHECK(collie_allreduce_async("x", &v, &v, 1, ncclInt32, COLLIE_SUM, 1, 1, ids_[i]) ==
                   COLLIE_ERR_INVALID_ARGUMENT,
               "non-member submission must fail");
      continue;
    }
    ctx[nth] = (struct set_ctx){ids_[i], rank, sums[i], 0};
    pthread_create(&th[nth], NULL, set_thread, &ctx[nth]);
    nth++;
  }
  /* The world keeps working alongside. */
  ctx[nth] = (struct set_ctx){COLLIE_WORLD, rank, n * (n + 1) / 2, 0};
  pthread_create(&th[nth], NULL, set_thread, &ctx[nth]);
  nth++;
  for (int t = 0; t < nth; t++) pthread_join(th[t], NULL);
  for (int t = 0; t < nth; t++) MP_CHECK(ctx[t].rc == 0, "set thread %d (set %d) failed", t, ctx[t].set);
  if (members[0][rank]) MP_CHECK(collie_barrier(ids_[0]) == 0, "barrier on a set: %s", collie_last_error());
  MP_CHECK(collie_remove_process_set(ids_[2]) == 0, "remove: %s", collie_last_error());
  MP_CHECK(collie_process_set_size(ids_[2]) < 0, "removed set still there");
  MP_CHECK(collie_barrier(COLLIE_WORLD) == 0, "barrier: %s", collie_last_error());
  int d[2] = {0, 1};
  int id4 = collie_add_process_set(d, 2);
  MP_CHECK(id4 > ids_[2], "new id %d", id4);
  if (rank <= 1) {
    int32_t v = 5;
    WAIT_OK(collie_allreduce_async("after", &v, &v, 1, ncclInt32, COLLIE_SUM, 1, 1, id4));
    MP_CHECK(v == 10, "set {0,1}: %d", v);
  }
  /* One rank's collie_shutdown stops every rank's engine: meet first. */
  MP_CHECK(collie_barrier(COLLIE_WORLD) == 0, "final barrier: %s", collie_last_error());
  return stop(comm);
}

/* ------------------------------------------------------------ fusion on/off */

#define FT 40

static int fusion_run(int rank, ncclComm_t comm, const char* threshold, int32_t (*out)[300], collie_engine_stats_t* st) {
  setenv("COLLIE_FUSION_THRESHOLD", threshold, 1);
  int rc = collie_init_comm(comm);
  MP_CHECK(rc == 0, "init: %s", collie_last_error());
  static int32_t in[FT][300];
  int h[FT];
  for (int step = 0; step < 3; step++) {
    for (int i = 0; i < FT; i++) {
      /* Each rank submits the tensors in its own order, every one complete
       * when submitted: the engine may read it at once (filling in[i] while
       * submitting in[j] let a rank descheduled mid-loop have some tensors
       * reduced before their input was written, in one run and not the
       * other: "fusion on and off differ", once in CI). */
      int j = (i * 7 + rank * step) % FT;
      for (int k = 0; k < 300; k++) in[j][k] = (rank * 7 + j * 13 + k * 3 + step) % 1000 - 500;
      char name[32];
      snprintf(name, sizeof(name), "f.%d", j);
      h[j] = collie_allreduce_async(name, in[j], out[j], 300, ncclInt32, j % 2 ? COLLIE_SUM : COLLIE_MAX, 1, 1,
                                    COLLIE_WORLD);
    }
    for (int i = 0; i < FT; i++) {
      WAIT_OK(h[i]);
      collie_release(h[i]);
    }
  }
  *st = stats();
  MP_CHECK(collie_shutdown() == 0, "shutdown");
  return 0;
}

static int t_fusion(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, n, ids[0], rank));
  static int32_t a[FT][300], b[FT][300];
  collie_engine_stats_t sa, sb;
  if (fusion_run(rank, comm, "0", a, &sa)) return 1;
  if (fusion_run(rank, comm, "65536", b, &sb)) return 1;
  MP_CHECK(memcmp(a, b, sizeof(a)) == 0, "fusion on and off differ");
  MP_CHECK(sa.fused_tensors == 0, "fusion off fused %llu", (unsigned long long)sa.fused_tensors);
  MP_CHECK(sb.fused_tensors > 0 && sb.collectives < sa.collectives, "fusion on: fused %llu, collectives %llu vs %llu",
           (unsigned long long)sb.fused_tensors, (unsigned long long)sb.collectives,
           (unsigned long long)sa.collectives);
  MP_CHECK(sb.fusion_threshold == 65536, "threshold %lld", (long long)sb.fusion_threshold);
  /* Every tensor as the last step left it: sum (odd) or max (even) over ranks. */
  for (int j = 0; j < FT; j++) {
    for (int k = 0; k < 300; k++) {
      int32_t s = 0, m = INT32_MIN;
      for (int r = 0; r < n; r++) {
        int32_t v = (r * 7 + j * 13 + k * 3 + 2) % 1000 - 500;
        s += v;
        m = v > m ? v : m;
      }
      MP_CHECK(a[j][k] == (j % 2 ? s : m), "f.%d[%d] = %d want %d", j, k, a[j][k], j % 2 ? s : m);
    }
  }
  unsetenv("COLLIE_FUSION_THRESHOLD");
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* ------------------------------------------------------------ timeline */

static int t_timeline(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  char path[512];
  snprintf(path, sizeof(path), "%s", g_arg);
  MP_CHECK(collie_start_timeline(path, 1) == 0, "start timeline: %s", collie_last_error());
  float x[64][32], y[64][32];
  int h[64];
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < 64; i++) {
      char name[32];
      snprintf(name, sizeof(name), "layer\"%d\\w", i); /* characters JSON must escape */
      for (int k = 0; k < 32; k++) x[i][k] = 1;
      h[i] = collie_allreduce_async(name, x[i], y[i], 32, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    }
    for (int i = 0; i < 64; i++) {
      WAIT_OK(h[i]);
      collie_release(h[i]);
    }
  }
  int hb = collie_broadcast_async("bc", x[0], 32, ncclFloat32, 0, COLLIE_WORLD);
  WAIT_OK(hb);
  collie_release(hb);
  /* An error on the way must not break the file. */
  int he = collie_allreduce_async("mismatched", x[0], x[0], rank == 0 ? 3 : 4, ncclFloat32, COLLIE_SUM, 1, 1,
                                  COLLIE_WORLD);
  MP_CHECK(collie_wait(he) == COLLIE_ERR_MISMATCH, "mismatch");
  collie_release(he);
  return stop(comm);
}

/* ------------------------------------------------------------ stall */

/* Meets the other ranks: a rank that arrives early stalls too, and retries under the same name. */
static int stall_sync(const char* name) {
  for (;;) {
    int32_t v = 1;
    int h = collie_allreduce_async(name, &v, &v, 1, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    MP_CHECK(h >= 0, "sync: %s", collie_last_error());
    int rc = collie_wait(h);
    collie_release(h);
    if (rc == 0) return 0;
    MP_CHECK(rc == COLLIE_ERR_STALLED, "sync -> %d", rc);
  }
}

static int t_stall(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  int missing = n - 1;
  float x[4] = {1, 2, 3, 4};
  /* Never submitted by the last rank: fails on the others, naming it. */
  if (rank != missing) {
    int h = collie_allreduce_async("lonely", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    int rc = collie_wait(h);
    const char* msg = collie_handle_error(h);
    char want[64];
    snprintf(want, sizeof(want), "ranks [%d] did not submit", missing);
    MP_CHECK(rc == COLLIE_ERR_STALLED, "rank %d: wait -> %d (%s)", rank, rc, msg);
    MP_CHECK(strstr(msg, "lonely") && strstr(msg, want), "message: %s", msg);
    collie_release(h);
  }
  if (stall_sync("sync.1")) return 1;
  /* A cached tensor that the last rank skips: it goes back to the coordinator and fails alike. */
  for (int step = 0; step < 2; step++) {
    if (step == 1 && rank == missing) break;
    int h = collie_allreduce_async("cached", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    int rc = collie_wait(h);
    const char* msg = collie_handle_error(h);
    if (step == 0 && rc == COLLIE_ERR_STALLED) {
      /* A rank held off the CPU for longer than the stall time (a loaded
       * machine) fails step 0 on every rank alike: submit it again. */
      collie_release(h);
      step--;
      continue;
    }
    if (step == 0) MP_CHECK(rc == 0, "cached step 0: %s", msg);
    else MP_CHECK(rc == COLLIE_ERR_STALLED && strstr(msg, "cached"), "cached stall -> %d: %s", rc, msg);
    collie_release(h);
  }
  if (stall_sync("sync.2")) return 1;
  return stop(comm);
}

/* ------------------------------------------------------------ init/shutdown cycles */

static int t_cycles(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, n, ids[0], rank));
  for (int c = 0; c < 6; c++) {
    MP_CHECK(collie_init_comm(comm) == 0, "cycle %d init: %s", c, collie_last_error());
    MP_CHECK(collie_init_comm(comm) == COLLIE_ERR_INVALID_ARGUMENT, "double init accepted");
    int ids_[1] = {0};
    int s = collie_add_process_set(ids_, 1);
    MP_CHECK(s > 0, "set: %s", collie_last_error());
    int64_t v[3] = {c, rank, 1};
    WAIT_OK(collie_allreduce_async("v", v, v, 3, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD));
    MP_CHECK(v[0] == (int64_t)c * n && v[2] == n, "cycle %d: %lld", c, (long long)v[0]);
    /* A handle left pending at shutdown fails with COLLIE_ERR_SHUTDOWN. */
    int h = -1;
    if (rank == 0) h = collie_allreduce_async("never", v, v, 3, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    MP_CHECK(collie_shutdown() == 0, "shutdown");
    MP_CHECK(collie_allreduce_async("v", v, v, 3, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD) ==
                 COLLIE_ERR_NOT_INITIALIZED,
             "submission after shutdown");
    (void)h;
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int t_shutdown(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  float v[2] = {1, 1};
  int h = collie_allreduce_async(rank == 0 ? "only0" : "others", v, v, 2, ncclFloat32, COLLIE_SUM, 1, 1,
                                 COLLIE_WORLD);
  MP_CHECK(h >= 0, "submit");
  if (rank == 0) {
    usleep(20000);
    MP_CHECK(collie_shutdown() == 0, "shutdown");
  } else {
    /* Rank 0's shutdown reaches this rank's engine: the pending handle fails. */
    int rc = collie_wait(h);
    MP_CHECK(rc == COLLIE_ERR_SHUTDOWN, "wait -> %d: %s", rc, collie_handle_error(h));
    MP_CHECK(collie_allreduce_async("late", v, v, 2, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD) ==
                 COLLIE_ERR_SHUTDOWN,
             "submission after a remote shutdown");
    MP_CHECK(collie_shutdown() == 0, "shutdown");
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* ------------------------------------------------------------ re-init from the environment */

/* The path of Horovod-style scripts: collie_init builds the world from the
 * launcher's variables (the same NCCL_COMM_ID each time), x3, with an
 * allreduce after each init. Each cycle one rank shuts down first; the others
 * wait (bounded) until that has stopped their engine, then check that the
 * stopped engine is still theirs: collie_init refuses (a local decision, the
 * same on every rank whatever the timing), submissions fail with
 * COLLIE_ERR_SHUTDOWN, collie_shutdown frees it. */
static int reinit_port;

static int t_reinit(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  (void)ids, (void)nids, (void)arg;
  char buf[64];
  snprintf(buf, sizeof(buf), "127.0.0.1:%d", reinit_port);
  setenv("NCCL_COMM_ID", buf, 1);
  snprintf(buf, sizeof(buf), "%d", rank);
  setenv("COLLIE_RANK", buf, 1);
  snprintf(buf, sizeof(buf), "%d", n);
  setenv("COLLIE_SIZE", buf, 1);
  for (int c = 0; c < 3; c++) {
    int rc = collie_init();
    MP_CHECK(rc == 0, "cycle %d: collie_init -> %d: %s", c, rc, collie_last_error());
    MP_CHECK(collie_is_initialized() == 1 && collie_rank() == rank && collie_size() == n, "cycle %d: topology", c);
    int64_t v[2] = {c, 1};
    WAIT_OK(collie_allreduce_async(NULL, v, v, 2, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD));
    MP_CHECK(v[0] == (int64_t)c * n && v[1] == n, "cycle %d: %lld %lld", c, (long long)v[0], (long long)v[1]);
    if (rank == c % n) {
      MP_CHECK(collie_shutdown() == 0, "shutdown");
    } else {
      double until = mp_now() + 120;
      while (collie_is_initialized()) {
        MP_CHECK(mp_now() < until, "cycle %d: rank %d's shutdown did not stop this engine in 120 s", c, c % n);
        usleep(2000);
      }
      MP_CHECK(collie_rank() == rank, "cycle %d: a stopped engine is still held until collie_shutdown", c);
      rc = collie_init();
      MP_CHECK(rc == COLLIE_ERR_INVALID_ARGUMENT, "cycle %d: init over a stopped engine -> %d", c, rc);
      rc = collie_allreduce_async(NULL, v, v, 2, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD);
      MP_CHECK(rc == COLLIE_ERR_SHUTDOWN && strstr(collie_last_error(), "shut down"),
               "cycle %d: submission to a stopped engine -> %d: %s", c, rc, collie_last_error());
      MP_CHECK(collie_shutdown() == 0, "shutdown");
    }
    MP_CHECK(collie_is_initialized() == 0 && collie_rank() == COLLIE_ERR_NOT_INITIALIZED, "cycle %d: still held", c);
    rc = collie_allreduce_async(NULL, v, v, 2, ncclInt64, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    MP_CHECK(rc == COLLIE_ERR_NOT_INITIALIZED, "cycle %d: submission after shutdown -> %d", c, rc);
  }
  return 0;
}

/* ------------------------------------------------------------ a peer dies */

static int t_peerdeath(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  float v[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  WAIT_OK(collie_allreduce_async("before", v, v, 8, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD));
  MP_CHECK(collie_barrier(COLLIE_WORLD) == 0, "barrier");
  if (rank == n - 1) {
    /* Gone without a word, but only once every other rank is past the
     * barrier: the barrier completes on each rank when that rank's part of
     * the round is done, so leaving at once let a slower rank see the death
     * inside the barrier instead of in "after". Bounded: a rank that failed
     * before the barrier reports itself. */
    mp_await(0, n - 1, 100);
    _exit(0);
  }
  mp_arrive(0);
  /* The engine may already have seen the death (keep-alive) and refuse the submission. */
  int h = collie_allreduce_async("after", v, v, 8, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
  int rc = h >= 0 ? collie_wait(h) : h;
  const char* msg = h >= 0 ? collie_handle_error(h) : collie_last_error();
  MP_CHECK(rc == COLLIE_ERR_COMMUNICATION, "wait -> %d: %s", rc, msg);
  MP_CHECK(strstr(msg, "communication failure"), "message: %s", msg);
  MP_CHECK(collie_allreduce_async("later", v, v, 8, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD) ==
               COLLIE_ERR_COMMUNICATION,
           "submission after the failure");
  MP_CHECK(collie_shutdown() == 0, "shutdown");
  ncclCommAbort(comm);
  return 0;
}

/* ------------------------------------------------------------ autotune */

static int t_autotune(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  static float g[20][4096];
  double t0 = mp_now();
  for (;;) {
    /* Ranks decide together when to stop (a rank looping once more would stall). */
    int32_t late = mp_now() - t0 > 3.0;
    WAIT_OK(collie_allreduce_async("stop", &late, &late, 1, ncclInt32, COLLIE_MAX, 1, 1, COLLIE_WORLD));
    if (late) break;
    int h[20];
    for (int i = 0; i < 20; i++) {
      char name[16];
      snprintf(name, sizeof(name), "g%d", i);
      h[i] = collie_allreduce_async(name, g[i], g[i], 4096, ncclFloat32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    }
    for (int i = 0; i < 20; i++) {
      WAIT_OK(h[i]);
      collie_release(h[i]);
    }
  }
  /* Everyone must use the same tuned values: compare through the engine itself. */
  collie_engine_stats_t st = stats();
  int64_t mine[2] = {st.fusion_threshold, (int64_t)(st.cycle_time_ms * 1000)}, mn[2], mx[2];
  WAIT_OK(collie_allreduce_async("cfg.min", mine, mn, 2, ncclInt64, COLLIE_MIN, 1, 1, COLLIE_WORLD));
  WAIT_OK(collie_allreduce_async("cfg.max", mine, mx, 2, ncclInt64, COLLIE_MAX, 1, 1, COLLIE_WORLD));
  MP_CHECK(mn[0] == mx[0] && mn[1] == mx[1], "ranks disagree on tuned values: %lld..%lld, %lld..%lld",
           (long long)mn[0], (long long)mx[0], (long long)mn[1], (long long)mx[1]);
  if (getenv("COLLIE_CYCLE_TIME")) MP_CHECK(st.cycle_time_ms == atof(getenv("COLLIE_CYCLE_TIME")), "fixed cycle time changed");
  return stop(comm);
}

/* ------------------------------------------------------------ handle ids */

/* Every invalid-handle entry point refuses the id. */
static int refused(int id) {
  void* b;
  size_t c, counts[16];
  MP_CHECK(collie_poll(id) == COLLIE_ERR_INVALID_ARGUMENT, "poll(%d) accepted", id);
  MP_CHECK(collie_wait(id) == COLLIE_ERR_INVALID_ARGUMENT, "wait(%d) accepted", id);
  MP_CHECK(collie_result(id, &b, &c) == COLLIE_ERR_INVALID_ARGUMENT, "result(%d) accepted", id);
  MP_CHECK(collie_result_counts(id, counts) == COLLIE_ERR_INVALID_ARGUMENT, "result_counts(%d) accepted", id);
  MP_CHECK(collie_release(id) == COLLIE_ERR_INVALID_ARGUMENT, "release(%d) accepted", id);
  MP_CHECK(collie_handle_error(id)[0] == '\0', "error text of %d", id);
  return 0;
}

/* Ids only grow: a released (stale) id never names a later operation, also
 * after many operations, out-of-order releases and a new init. */
static int t_handles(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  int32_t v = 1;
  int h0 = collie_allreduce_async("h0", &v, &v, 1, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
  WAIT_OK(h0);
  MP_CHECK(collie_release(h0) == 0, "release h0");
  if (refused(h0) || refused(-1) || refused(INT32_MAX)) return 1;
  int prev = h0;
  for (int i = 0; i < 300; i++) {
    int32_t x = 1;
    int h = collie_allreduce_async("seq", &x, &x, 1, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    MP_CHECK(h > prev, "handle %d after %d: ids must grow", h, prev);
    if (refused(h0) || refused(prev)) return 1;
    WAIT_OK(h);
    MP_CHECK(x == n, "seq %d: %d", i, x);
    MP_CHECK(collie_release(h) == 0, "release");
    prev = h;
  }
  /* Many live handles (the id table grows), released in a scrambled order:
   * the others stay valid, the released ones are refused. */
  enum { NH = 200 };
  static int32_t buf[NH];
  int hs[NH], order[NH];
  for (int i = 0; i < NH; i++) {
    char name[32];
    snprintf(name, sizeof(name), "many.%d", i);
    buf[i] = i;
    hs[i] = collie_allreduce_async(name, &buf[i], &buf[i], 1, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
    MP_CHECK(hs[i] > prev, "many.%d: handle %d after %d", i, hs[i], prev);
    prev = hs[i];
    order[i] = i;
  }
  for (int i = 0; i < NH; i++) WAIT_OK(hs[i]);
  unsigned seed = 12345;
  for (int i = NH - 1; i > 0; i--) {
    int j = (int)(rand_r(&seed) % (unsigned)(i + 1)), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int k = 0; k < NH; k++) {
    int i = order[k];
    MP_CHECK(buf[i] == i * n, "many.%d = %d", i, buf[i]);
    MP_CHECK(collie_release(hs[i]) == 0, "release many.%d (handle %d): %s", i, hs[i], collie_last_error());
    if (refused(hs[i])) return 1;
    for (int q = k + 1; q < NH; q++)
      MP_CHECK(collie_poll(hs[order[q]]) == 1, "handle %d lost after releasing %d", hs[order[q]], hs[i]);
  }
  /* A new engine on the same communicator keeps counting. */
  MP_CHECK(collie_shutdown() == 0, "shutdown");
  MP_CHECK(collie_init_comm(comm) == 0, "re-init: %s", collie_last_error());
  int h = collie_allreduce_async("again", &v, &v, 1, ncclInt32, COLLIE_SUM, 1, 1, COLLIE_WORLD);
  MP_CHECK(h > prev, "after re-init: handle %d, last before %d", h, prev);
  if (refused(prev) || refused(h0)) return 1;
  WAIT_OK(h);
  MP_CHECK(collie_release(h) == 0, "release");
  return stop(comm);
}

/* ------------------------------------------------------------ argument errors */

static int t_errors(int rank, int n, const ncclUniqueId* ids, int nids, void* arg) {
  float x[4] = {0};
  MP_CHECK(collie_allreduce_async("x", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 0) == COLLIE_ERR_NOT_INITIALIZED,
           "before init");
  MP_CHECK(collie_rank() == COLLIE_ERR_NOT_INITIALIZED, "rank before init");
  MP_CHECK(collie_shutdown() == 0, "shutdown before init");
  ncclComm_t comm;
  if (start(rank, n, ids, &comm)) return 1;
  MP_CHECK(collie_allreduce_async("x", x, x, 4, (ncclDataType_t)99, COLLIE_SUM, 1, 1, 0) == COLLIE_ERR_INVALID_ARGUMENT,
           "dtype");
  MP_CHECK(strstr(collie_last_error(), "dtype"), "msg %s", collie_last_error());
  MP_CHECK(collie_allreduce_async("x", x, x, 4, ncclFloat32, 2, 1, 1, 0) == COLLIE_ERR_INVALID_ARGUMENT, "op 2");
  MP_CHECK(collie_allreduce_async("x", NULL, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 0) == COLLIE_ERR_INVALID_ARGUMENT,
           "NULL");
  MP_CHECK(collie_allreduce_async("x", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 42) == COLLIE_ERR_INVALID_ARGUMENT,
           "set 42");
  MP_CHECK(collie_broadcast_async("b", x, 4, ncclFloat32, n, 0) == COLLIE_ERR_INVALID_ARGUMENT, "root");
  MP_CHECK(collie_wait(12345) == COLLIE_ERR_INVALID_ARGUMENT, "bad handle");
  int h = collie_allreduce_async("dup", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 0);
  MP_CHECK(h >= 0, "first");
  MP_CHECK(collie_allreduce_async("dup", x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 0) == COLLIE_ERR_INVALID_ARGUMENT,
           "duplicate name");
  MP_CHECK(strstr(collie_last_error(), "already pending"), "msg %s", collie_last_error());
  WAIT_OK(h);
  MP_CHECK(collie_result(h, NULL, NULL) == 0, "result of an allreduce");
  MP_CHECK(collie_release(h) == 0, "release");
  int bad[2] = {0, 0};
  MP_CHECK(collie_add_process_set(bad, 2) == COLLIE_ERR_INVALID_ARGUMENT, "repeated rank");
  MP_CHECK(collie_remove_process_set(0) == COLLIE_ERR_INVALID_ARGUMENT, "remove world");
  /* Unnamed tensors get names from a per-set counter (same order on every rank). */
  WAIT_OK(collie_allreduce_async(NULL, x, x, 4, ncclFloat32, COLLIE_SUM, 1, 1, 0));
  collie_engine_stats_t st;
  st.size = 4;
  MP_CHECK(collie_engine_stats(&st) == COLLIE_ERR_INVALID_ARGUMENT, "stats size");
  return stop(comm);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SCENARIO NRANKS [ARG]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  g_arg = argc > 3 ? argv[3] : "";
  struct {
    const char* name;
    mp_rank_fn fn;
  } tests[] = {{"basic", t_basic},       {"orders", t_orders},   {"dtypes", t_dtypes}, {"colls", t_colls},
               {"mismatch", t_mismatch}, {"join", t_join},       {"sets", t_sets},     {"fusion", t_fusion},
               {"timeline", t_timeline}, {"stall", t_stall},     {"cycles", t_cycles}, {"shutdown", t_shutdown},
               {"autotune", t_autotune}, {"errors", t_errors},
               {"peerdeath", t_peerdeath}, {"handles", t_handles},
               {"join_a2a", t_join_a2a}, {"group", t_group}, {"reinit", t_reinit}};
  for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
    if (strcmp(argv[1], tests[i].name) != 0) continue;
    if (tests[i].fn == t_reinit && (reinit_port = sock_free_loopback_port(AF_INET)) < 0) {
      fprintf(stderr, "reinit: no free port\n");
      return 1;
    }
    int rc = mp_run(n, tests[i].fn, NULL, 120);
    printf("%s %s with %d ranks\n", rc ? "FAIL" : "PASS", argv[1], n);
    return rc;
  }
  fprintf(stderr, "unknown scenario %s\n", argv[1]);
  return 2;
}
