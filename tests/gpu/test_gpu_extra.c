/* Device-path cases beyond the sweep of test_gpu_coll.c, one per run:
 *   graph_1, graph_2       collectives captured into a CUDA graph on a
 *                          non-blocking stream (after one eager pass), the
 *                          graph replayed 3 times with new inputs each time
 *   graph_cold_1/2         the same with the very first device call of the
 *                          communicator inside the capture
 *   streams_2              two user streams (one with a priority) in turn,
 *                          the legacy default stream, and a call on one
 *                          stream consuming another's output through an event
 *   memalloc_1             ncclMemAlloc / ncclMemFree sizes and edge cases
 *   register_2             ncclCommRegister / Deregister around collectives,
 *                          sub-ranges, double registration, a bogus handle
 *   mixed_2                host-buffer and device-buffer calls in turn on one
 *                          communicator
 *   abort_2                ncclCommAbort while a kernel waits for a peer that
 *                          does not come: abort and the stream return within
 *                          1 s, the GPU stays usable
 *   killed_2               the peer is killed (SIGKILL) while a kernel waits
 *                          for it: an error instead of a hang, then abort and
 *                          a usable GPU
 *   timeout_2              COLLIE_TIMEOUT ends a kernel whose peer does not
 *                          come; the next call reports it
 *   a2a_uneven_1/2         PyTorch's all_to_all_single with split sizes: a
 *                          group of sends and receives (to itself at one
 *                          rank, zero counts at two) between the caller's
 *                          legacy stream and non-blocking ones (receives on a
 *                          stream of their own in odd rounds)
 * Every rank is a forked process (tests/mp/harness.h) that picks device
 * rank % ndev itself; the parent never touches CUDA. Inputs are small,
 * non-zero, rank-dependent integers (exact float sums), outputs are poisoned
 * (all bits set: NaN) before every run and every element is compared.
 * Usage: test_gpu_extra CASE. Without a GPU: "SKIPPED: ..." and exit 77. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>

#include "../mp/harness.h"
#include "gpu_common.h"

static int g_ndev = 1;
static int g_rank;

/* Input element i of rank r for a run tagged `salt`: 1..1009. */
static float val(int r, size_t i, int salt) {
  return (float)(1 + (i * 37u + (size_t)salt * 101u + (size_t)r * 211u) % 1009u);
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ buffers */

static int h2d(void* d, const void* h, size_t bytes, cudaStream_t s) {
  CUDACHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
  CUDACHECK(cudaStreamSynchronize(s));
  return 0;
}

static int d2h(void* h, const void* d, size_t bytes, cudaStream_t s) {
  CUDACHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  return 0;
}

/* All bits set: a float NaN that no result equals. */
static int poison(void* d, size_t bytes, cudaStream_t s) {
  CUDACHECK(cudaMemsetAsync(d, 0xff, bytes, s));
  CUDACHECK(cudaStreamSynchronize(s));
  return 0;
}

/* Fills device buffer d (n floats) with val(r, i, salt). */
static int fill(float* d, size_t n, int r, int salt, cudaStream_t s) {
  float* h = malloc(n * sizeof(float));
  MP_CHECK(h != NULL, "out of memory");
  for (size_t i = 0; i < n; i++) h[i] = val(r, i, salt);
  int rc = h2d(d, h, n * sizeof(float), s);
  free(h);
  return rc;
}

static int cmp_f(const char* what, const float* got, const float* want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (!(got[i] == want[i])) {
      if (!bad) first = i;
      bad++;
    }
  if (!bad) return 0;
  fprintf(stderr, "FAIL rank %d: %s: %zu of %zu elements wrong; first [%zu] = %g, want %g\n", g_rank, what, bad, n,
          first, (double)got[first], (double)want[first]);
  return 1;
}

/* Checks that n floats of device buffer d still hold the poison. */
static int untouched(const char* what, const float* d, size_t n, cudaStream_t s) {
  uint32_t* h = malloc(n * sizeof(uint32_t));
  MP_CHECK(h != NULL, "out of memory");
  if (d2h(h, d, n * sizeof(uint32_t), s)) {
    free(h);
    return 1;
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i] != 0xffffffffu) {
      if (!bad) first = i;
      bad++;
    }
  uint32_t v = bad ? h[first] : 0;
  free(h);
  MP_CHECK(bad == 0, "rank %d: %s: %zu of %zu elements written (first [%zu] = 0x%08x), want them untouched", g_rank,
           what, bad, n, first, v);
  return 0;
}

/* Compares n floats of device buffer d against want[]. */
static int check_dev(const char* what, const float* d, const float* want, size_t n, cudaStream_t s) {
  float* h = malloc(n * sizeof(float));
  MP_CHECK(h != NULL, "out of memory");
  int rc = d2h(h, d, n * sizeof(float), s);
  if (!rc) rc = cmp_f(what, h, want, n);
  free(h);
  return rc;
}

/* want[i] = sum over ranks of val(r, off + i, salt), times `times`. */
static void want_sum(float* want, size_t n, int nranks, size_t off, int salt, float times) {
  for (size_t i = 0; i < n; i++) {
    float acc = 0;
    for (int r = 0; r < nranks; r++) acc += val(r, off + i, salt);
    want[i] = acc * times;
  }
}

/* want[r * n + i] = val(r, i, salt): an allgather of every rank's val. */
static void want_gather(float* want, size_t n, int nranks, int salt) {
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = val(r, i, salt);
}

/* ------------------------------------------------------------ the five kernel-path collectives */

/* One allreduce (sum), allgather, broadcast (root nranks-1), reduce-scatter
 * and reduce (root 0), float, out of place, each on its own buffers. Run
 * `salt` uses salts salt..salt+4. */
struct cset {
  int rank, n;
  size_t count;
  float *ar_s, *ar_r, *ag_s, *ag_r, *bc_s, *bc_r, *rs_s, *rs_r, *rd_s, *rd_r;
  float* want; /* count * n */
};

static int cset_alloc(struct cset* c, int rank, int n, size_t count) {
  memset(c, 0, sizeof(*c));
  c->rank = rank;
  c->n = n;
  c->count = count;
  size_t b = count * sizeof(float), all = b * (size_t)n;
  MP_NCCL(ncclMemAlloc((void**)&c->ar_s, b));
  MP_NCCL(ncclMemAlloc((void**)&c->ar_r, b));
  MP_NCCL(ncclMemAlloc((void**)&c->ag_s, b));
  MP_NCCL(ncclMemAlloc((void**)&c->ag_r, all));
  MP_NCCL(ncclMemAlloc((void**)&c->bc_s, b));
  MP_NCCL(ncclMemAlloc((void**)&c->bc_r, b));
  MP_NCCL(ncclMemAlloc((void**)&c->rs_s, all));
  MP_NCCL(ncclMemAlloc((void**)&c->rs_r, b));
  MP_NCCL(ncclMemAlloc((void**)&c->rd_s, b));
  MP_NCCL(ncclMemAlloc((void**)&c->rd_r, b));
  c->want = malloc(all);
  MP_CHECK(c->want != NULL, "out of memory");
  return 0;
}

static int cset_free(struct cset* c) {
  float* bufs[] = {c->ar_s, c->ar_r, c->ag_s, c->ag_r, c->bc_s, c->bc_r, c->rs_s, c->rs_r, c->rd_s, c->rd_r};
  for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) MP_NCCL(ncclMemFree(bufs[i]));
  free(c->want);
  return 0;
}

/* New inputs for run `salt`, outputs poisoned (stream-ordered, then synchronized). */
static int cset_fill(struct cset* c, int salt, cudaStream_t s) {
  size_t b = c->count * sizeof(float), all = b * (size_t)c->n;
  if (fill(c->ar_s, c->count, c->rank, salt, s) || fill(c->ag_s, c->count, c->rank, salt + 1, s) ||
      fill(c->bc_s, c->count, c->rank, salt + 2, s) || fill(c->rs_s, c->count * (size_t)c->n, c->rank, salt + 3, s) ||
      fill(c->rd_s, c->count, c->rank, salt + 4, s))
    return 1;
  if (poison(c->ar_r, b, s) || poison(c->ag_r, all, s) || poison(c->bc_r, b, s) || poison(c->rs_r, b, s) ||
      poison(c->rd_r, b, s))
    return 1;
  return 0;
}

/* Issues the five calls on stream s; on failure *which names the call. */
static ncclResult_t cset_issue(struct cset* c, ncclComm_t comm, cudaStream_t s, const char** which) {
  ncclResult_t r;
  size_t n = c->count;
  *which = "ncclAllReduce";
  if ((r = ncclAllReduce(c->ar_s, c->ar_r, n, ncclFloat, ncclSum, comm, s)) != ncclSuccess) return r;
  *which = "ncclAllGather";
  if ((r = ncclAllGather(c->ag_s, c->ag_r, n, ncclFloat, comm, s)) != ncclSuccess) return r;
  *which = "ncclBroadcast";
  if ((r = ncclBroadcast(c->bc_s, c->bc_r, n, ncclFloat, c->n - 1, comm, s)) != ncclSuccess) return r;
  *which = "ncclReduceScatter";
  if ((r = ncclReduceScatter(c->rs_s, c->rs_r, n, ncclFloat, ncclSum, comm, s)) != ncclSuccess) return r;
  *which = "ncclReduce";
  if ((r = ncclReduce(c->rd_s, c->rd_r, n, ncclFloat, ncclSum, 0, comm, s)) != ncclSuccess) return r;
  *which = "";
  return ncclSuccess;
}

/* Checks every output of run `salt` (after the stream has drained). */
static int cset_check(struct cset* c, int salt, const char* run, cudaStream_t s) {
  char what[128];
  size_t n = c->count;
  want_sum(c->want, n, c->n, 0, salt, 1.0f);
  snprintf(what, sizeof(what), "%s: allreduce", run);
  if (check_dev(what, c->ar_r, c->want, n, s)) return 1;
  want_gather(c->want, n, c->n, salt + 1);
  snprintf(what, sizeof(what), "%s: allgather", run);
  if (check_dev(what, c->ag_r, c->want, n * (size_t)c->n, s)) return 1;
  for (size_t i = 0; i < n; i++) c->want[i] = val(c->n - 1, i, salt + 2);
  snprintf(what, sizeof(what), "%s: broadcast (root %d)", run, c->n - 1);
  if (check_dev(what, c->bc_r, c->want, n, s)) return 1;
  want_sum(c->want, n, c->n, (size_t)c->rank * n, salt + 3, 1.0f);
  snprintf(what, sizeof(what), "%s: reduce-scatter", run);
  if (check_dev(what, c->rs_r, c->want, n, s)) return 1;
  snprintf(what, sizeof(what), "%s: reduce (root 0)", run);
  if (c->rank == 0) {
    want_sum(c->want, n, c->n, 0, salt + 4, 1.0f);
    if (check_dev(what, c->rd_r, c->want, n, s)) return 1;
  } else if (untouched(what, c->rd_r, n, s)) {
    return 1; /* recvbuff is only used at the root */
  }
  return 0;
}

/* One eager (uncaptured) run: fill, issue, drain, check. */
static int cset_eager(struct cset* c, ncclComm_t comm, int salt, const char* run, cudaStream_t s) {
  if (cset_fill(c, salt, s)) return 1;
  const char* which = "";
  ncclResult_t r = cset_issue(c, comm, s, &which);
  MP_CHECK(r == ncclSuccess, "%s: %s -> %s: %s", run, which, ncclGetErrorString(r), ncclGetLastError(comm));
  CUDACHECK(cudaStreamSynchronize(s));
  return cset_check(c, salt, run, s);
}

/* ------------------------------------------------------------ graph_N, graph_cold_N */

#define GRAPH_COUNT ((size_t)100003)
#define GRAPH_REPLAYS 3

static int rank_graph(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  int cold = *(const int*)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  struct cset c;
  if (cset_alloc(&c, rank, nranks, GRAPH_COUNT)) return 1;
  /* The usual pattern (warm up, then capture); the cold variant captures the
   * communicator's first device calls. */
  if (!cold && cset_eager(&c, comm, 500, "eager run before the capture", s)) return 1;
  if (cset_fill(&c, 0, s)) return 1;
  CUDACHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const char* which = "";
  ncclResult_t r = cset_issue(&c, comm, s, &which);
  cudaGraph_t graph = NULL;
  cudaError_t ce = cudaStreamEndCapture(s, &graph);
  MP_CHECK(r == ncclSuccess, "%s on a stream being captured (%d ranks%s) -> %s: %s", which, nranks,
           cold ? ", first device call" : "", ncclGetErrorString(r), ncclGetLastError(comm));
  MP_CHECK(ce == cudaSuccess && graph != NULL, "cudaStreamEndCapture -> %s (the capture was invalidated)",
           cudaGetErrorString(ce));
  size_t nodes = 0;
  CUDACHECK(cudaGraphGetNodes(graph, NULL, &nodes));
  MP_CHECK(nodes >= 1, "the captured graph is empty: the collectives were not captured");
  cudaGraphExec_t exec;
  CUDACHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < GRAPH_REPLAYS; rep++) {
    int salt = 10 * (rep + 1);
    char run[64];
    snprintf(run, sizeof(run), "graph replay %d of %d", rep + 1, GRAPH_REPLAYS);
    if (cset_fill(&c, salt, s)) return 1; /* the graph reads the same buffers, new contents */
    CUDACHECK(cudaGraphLaunch(exec, s));
    CUDACHECK(cudaStreamSynchronize(s));
    if (cset_check(&c, salt, run, s)) return 1;
  }
  /* Eager calls after the replays: the connectors' counters stayed in step. */
  if (cset_eager(&c, comm, 900, "eager run after the replays", s)) return 1;
  CUDACHECK(cudaGraphExecDestroy(exec));
  CUDACHECK(cudaGraphDestroy(graph));
  if (cset_free(&c)) return 1;
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaStreamDestroy(s));
  return 0;
}

/* ------------------------------------------------------------ streams_2 */

#define STREAMS_COUNT ((size_t)50001)
#define STREAMS_ROUNDS 6
#define STREAMS_DEP_COUNT ((size_t)1 << 20) /* 4 MiB: a call long enough for a missing dependency to show */

static int rank_streams(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  int least = 0, greatest = 0;
  CUDACHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t sa, sb, s0 = (cudaStream_t)0;
  CUDACHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CUDACHECK(cudaStreamCreateWithPriority(&sb, cudaStreamNonBlocking, greatest));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t n = STREAMS_COUNT, b = n * sizeof(float);
  float *ar_s[STREAMS_ROUNDS], *ar_r[STREAMS_ROUNDS], *ag_s[STREAMS_ROUNDS], *ag_r[STREAMS_ROUNDS];
  float *d0_s, *d0_r, *b0;
  for (int k = 0; k < STREAMS_ROUNDS; k++) {
    MP_NCCL(ncclMemAlloc((void**)&ar_s[k], b));
    MP_NCCL(ncclMemAlloc((void**)&ar_r[k], b));
    MP_NCCL(ncclMemAlloc((void**)&ag_s[k], b));
    MP_NCCL(ncclMemAlloc((void**)&ag_r[k], b * (size_t)nranks));
    if (fill(ar_s[k], n, rank, 10 * k, sa) || fill(ag_s[k], n, rank, 10 * k + 1, sa)) return 1;
    if (poison(ar_r[k], b, sa) || poison(ag_r[k], b * (size_t)nranks, sa)) return 1;
  }
  MP_NCCL(ncclMemAlloc((void**)&d0_s, b));
  MP_NCCL(ncclMemAlloc((void**)&d0_r, b));
  MP_NCCL(ncclMemAlloc((void**)&b0, b));
  if (fill(d0_s, n, rank, 77, sa) || poison(d0_r, b, sa)) return 1;
  if (rank == 0 ? fill(b0, n, rank, 78, sa) : poison(b0, b, sa)) return 1;
  /* Rounds alternate the streams: an allreduce on one, an allgather on the other. */
  for (int k = 0; k < STREAMS_ROUNDS; k++) {
    cudaStream_t x = k % 2 ? sb : sa, y = k % 2 ? sa : sb;
    MP_NCCL(ncclAllReduce(ar_s[k], ar_r[k], n, ncclFloat, ncclSum, comm, x));
    MP_NCCL(ncclAllGather(ag_s[k], ag_r[k], n, ncclFloat, comm, y));
  }
  /* The legacy default stream. */
  MP_NCCL(ncclAllReduce(d0_s, d0_r, n, ncclFloat, ncclSum, comm, s0));
  MP_NCCL(ncclBroadcast(b0, b0, n, ncclFloat, 0, comm, s0));
  CUDACHECK(cudaStreamSynchronize(sa));
  CUDACHECK(cudaStreamSynchronize(sb));
  CUDACHECK(cudaStreamSynchronize(s0));
  float* want = malloc(b * (size_t)nranks);
  MP_CHECK(want != NULL, "out of memory");
  char what[96];
  for (int k = 0; k < STREAMS_ROUNDS; k++) {
    want_sum(want, n, nranks, 0, 10 * k, 1.0f);
    snprintf(what, sizeof(what), "round %d: allreduce on stream %s", k, k % 2 ? "B (priority)" : "A");
    if (check_dev(what, ar_r[k], want, n, sa)) return 1;
    want_gather(want, n, nranks, 10 * k + 1);
    snprintf(what, sizeof(what), "round %d: allgather on stream %s", k, k % 2 ? "A" : "B (priority)");
    if (check_dev(what, ag_r[k], want, n * (size_t)nranks, sa)) return 1;
  }
  want_sum(want, n, nranks, 0, 77, 1.0f);
  if (check_dev("allreduce on the legacy default stream", d0_r, want, n, sa)) return 1;
  for (size_t i = 0; i < n; i++) want[i] = val(0, i, 78);
  if (check_dev("in-place broadcast on the legacy default stream", b0, want, n, sa)) return 1;
  free(want);
  /* A call on B consumes A's output: the dependency is an event the test records. */
  size_t m = STREAMS_DEP_COUNT, mb = m * sizeof(float);
  float *x, *y, *z;
  MP_NCCL(ncclMemAlloc((void**)&x, mb));
  MP_NCCL(ncclMemAlloc((void**)&y, mb));
  MP_NCCL(ncclMemAlloc((void**)&z, mb));
  if (fill(x, m, rank, 5, sa) || poison(y, mb, sa) || poison(z, mb, sa)) return 1;
  cudaEvent_t ev;
  CUDACHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  MP_NCCL(ncclAllReduce(x, y, m, ncclFloat, ncclSum, comm, sa));
  CUDACHECK(cudaEventRecord(ev, sa));
  CUDACHECK(cudaStreamWaitEvent(sb, ev, 0));
  MP_NCCL(ncclAllReduce(y, z, m, ncclFloat, ncclSum, comm, sb));
  CUDACHECK(cudaStreamSynchronize(sb));
  want = malloc(mb);
  MP_CHECK(want != NULL, "out of memory");
  want_sum(want, m, nranks, 0, 5, (float)nranks); /* every rank's y is the same sum */
  if (check_dev("allreduce on stream B of stream A's result (event dependency)", z, want, m, sb)) return 1;
  CUDACHECK(cudaStreamSynchronize(sa));
  want_sum(want, m, nranks, 0, 5, 1.0f);
  if (check_dev("the first allreduce of the event pair (stream A)", y, want, m, sa)) return 1;
  free(want);
  CUDACHECK(cudaEventDestroy(ev));
  for (int k = 0; k < STREAMS_ROUNDS; k++) {
    MP_NCCL(ncclMemFree(ar_s[k]));
    MP_NCCL(ncclMemFree(ar_r[k]));
    MP_NCCL(ncclMemFree(ag_s[k]));
    MP_NCCL(ncclMemFree(ag_r[k]));
  }
  float* rest[] = {d0_s, d0_r, b0, x, y, z};
  for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++) MP_NCCL(ncclMemFree(rest[i]));
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaStreamDestroy(sa));
  CUDACHECK(cudaStreamDestroy(sb));
  return 0;
}

/* ------------------------------------------------------------ memalloc_1 */

/* One ncclMemAlloc of `bytes`: device memory of the current device, whole,
 * usable by cudaMemcpy and cudaMemset, freed by ncclMemFree. */
static int memalloc_one(size_t bytes) {
  void* p = NULL;
  MP_NCCL(ncclMemAlloc(&p, bytes));
  MP_CHECK(p != NULL, "ncclMemAlloc(%zu) succeeded with a NULL pointer", bytes);
  MP_CHECK(((uintptr_t)p & 255) == 0, "ncclMemAlloc(%zu) = %p: not 256-byte aligned as cudaMalloc memory is", bytes, p);
  int dev = -1;
  CUDACHECK(cudaGetDevice(&dev));
  for (int end = 0; end < 2; end++) {
    const char* q = (const char*)p + (end ? bytes - 1 : 0);
    struct cudaPointerAttributes attr;
    memset(&attr, 0, sizeof(attr));
    CUDACHECK(cudaPointerGetAttributes(&attr, q));
    MP_CHECK(attr.type == cudaMemoryTypeDevice, "ncclMemAlloc(%zu): %s byte %p has memory type %d, want device (%d)",
             bytes, end ? "last" : "first", (const void*)q, (int)attr.type, (int)cudaMemoryTypeDevice);
    MP_CHECK(attr.device == dev, "ncclMemAlloc(%zu): memory on device %d, want the current device %d", bytes,
             attr.device, dev);
  }
  unsigned char* h = malloc(bytes);
  unsigned char* back = malloc(bytes);
  MP_CHECK(h && back, "out of memory");
  for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)((i * 131u + 7u) | 1u);
  memset(back, 0, bytes);
  CUDACHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
  CUDACHECK(cudaMemcpy(back, p, bytes, cudaMemcpyDeviceToHost));
  MP_CHECK(memcmp(h, back, bytes) == 0, "ncclMemAlloc(%zu): the bytes copied in do not come back", bytes);
  /* cudaMemset of the first half; the rest keeps the copied bytes. */
  size_t half = (bytes + 1) / 2;
  CUDACHECK(cudaMemset(p, 0x5a, half));
  CUDACHECK(cudaDeviceSynchronize());
  CUDACHECK(cudaMemcpy(back, p, bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < bytes; i++) {
    unsigned char want = i < half ? 0x5a : h[i];
    MP_CHECK(back[i] == want, "ncclMemAlloc(%zu) after cudaMemset of %zu bytes: byte %zu = 0x%02x, want 0x%02x", bytes,
             half, i, back[i], want);
  }
  free(h);
  free(back);
  MP_NCCL(ncclMemFree(p));
  return 0;
}

static int rank_memalloc(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  size_t sizes[] = {1, 4096 + 3, (size_t)64 << 20};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
    if (memalloc_one(sizes[k])) return 1;
  /* Edge cases, as src/device/dev_api.c defines them (and NCCL does). */
  ncclResult_t r = ncclMemFree(NULL);
  MP_CHECK(r == ncclSuccess, "ncclMemFree(NULL) -> %s, want ncclSuccess (a no-op)", ncclGetErrorString(r));
  void* p = NULL;
  r = ncclMemAlloc(&p, 0);
  MP_CHECK(r == ncclInvalidArgument, "ncclMemAlloc(&p, 0) -> %s, want ncclInvalidArgument", ncclGetErrorString(r));
  r = ncclMemAlloc(NULL, 16);
  MP_CHECK(r == ncclInvalidArgument, "ncclMemAlloc(NULL, 16) -> %s, want ncclInvalidArgument", ncclGetErrorString(r));
  /* The memory works with a collective (one rank: a copy kernel). */
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t n = 4096 + 3;
  unsigned char *x = NULL, *y = NULL;
  MP_NCCL(ncclMemAlloc((void**)&x, n));
  MP_NCCL(ncclMemAlloc((void**)&y, n));
  unsigned char* h = malloc(n);
  unsigned char* back = malloc(n);
  MP_CHECK(h && back, "out of memory");
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)((i * 7u + 3u) | 1u);
  if (h2d(x, h, n, s) || poison(y, n, s)) return 1;
  MP_NCCL(ncclAllReduce(x, y, n, ncclUint8, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  if (d2h(back, y, n, s)) return 1;
  MP_CHECK(memcmp(h, back, n) == 0, "one-rank allreduce of %zu bytes between ncclMemAlloc buffers: wrong result", n);
  free(h);
  free(back);
  MP_NCCL(ncclMemFree(x));
  MP_NCCL(ncclMemFree(y));
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaStreamDestroy(s));
  return 0;
}

/* ------------------------------------------------------------ register_2 */

#define REG_COUNT ((size_t)50000)

static int rank_register(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t n = REG_COUNT, all = n * (size_t)nranks, bytes = all * sizeof(float);
  float *a, *b;
  MP_NCCL(ncclMemAlloc((void**)&a, bytes));
  MP_NCCL(ncclMemAlloc((void**)&b, bytes));
  float* want = malloc(bytes);
  MP_CHECK(want != NULL, "out of memory");
  void *ha = NULL, *hb = NULL;
  MP_NCCL(ncclCommRegister(comm, a, bytes, &ha));
  MP_NCCL(ncclCommRegister(comm, b, bytes, &hb));
  MP_CHECK(ha != NULL && hb != NULL, "ncclCommRegister succeeded with a NULL handle (%p, %p)", ha, hb);
  if (fill(a, all, rank, 1, s)) return 1;
  /* Whole registered buffers. */
  if (poison(b, bytes, s)) return 1;
  MP_NCCL(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  want_sum(want, n, nranks, 0, 1, 1.0f);
  if (check_dev("allreduce on registered buffers", b, want, n, s)) return 1;
  if (untouched("allreduce on registered buffers: recvbuff past count", b + n, all - n, s)) return 1;
  if (poison(b, bytes, s)) return 1;
  MP_NCCL(ncclAllGather(a, b, n, ncclFloat, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  want_gather(want, n, nranks, 1);
  if (check_dev("allgather on registered buffers", b, want, all, s)) return 1;
  /* Sub-ranges inside the registrations, at odd (unaligned) offsets. */
  size_t so = 1001, ro = 2003, m = 777;
  if (poison(b, bytes, s)) return 1;
  MP_NCCL(ncclAllReduce(a + so, b + ro, m, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  want_sum(want, m, nranks, so, 1, 1.0f);
  if (check_dev("allreduce on a sub-range of registered buffers", b + ro, want, m, s)) return 1;
  if (untouched("allreduce on a sub-range: recvbuff before the range", b, ro, s)) return 1;
  if (untouched("allreduce on a sub-range: recvbuff after the range", b + ro + m, all - ro - m, s)) return 1;
  size_t gso = 5, gro = 7, gm = 333;
  if (poison(b, bytes, s)) return 1;
  MP_NCCL(ncclAllGather(a + gso, b + gro, gm, ncclFloat, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < gm; i++) want[(size_t)r * gm + i] = val(r, gso + i, 1);
  if (check_dev("allgather on a sub-range of registered buffers", b + gro, want, gm * (size_t)nranks, s)) return 1;
  if (untouched("allgather on a sub-range: recvbuff before the range", b, gro, s)) return 1;
  if (untouched("allgather on a sub-range: recvbuff after the range", b + gro + gm * (size_t)nranks,
                all - gro - gm * (size_t)nranks, s))
    return 1;
  MP_NCCL(ncclCommDeregister(comm, ha));
  MP_NCCL(ncclCommDeregister(comm, hb));
  /* The same buffer registered twice: two deregistrations, then none left. */
  void *h1 = NULL, *h2 = NULL;
  MP_NCCL(ncclCommRegister(comm, a, bytes, &h1));
  MP_NCCL(ncclCommRegister(comm, a, bytes, &h2));
  MP_CHECK(h1 != NULL && h2 != NULL, "ncclCommRegister succeeded with a NULL handle (%p, %p)", h1, h2);
  MP_NCCL(ncclCommDeregister(comm, h1));
  MP_NCCL(ncclCommDeregister(comm, h2));
  ncclResult_t r = ncclCommDeregister(comm, h1);
  MP_CHECK(r == ncclInvalidArgument,
           "a third ncclCommDeregister of a buffer registered twice -> %s, want ncclInvalidArgument",
           ncclGetErrorString(r));
  r = ncclCommDeregister(comm, ha);
  MP_CHECK(r == ncclInvalidArgument,
           "ncclCommDeregister of a handle already deregistered -> %s, want ncclInvalidArgument",
           ncclGetErrorString(r));
  r = ncclCommDeregister(comm, (void*)(uintptr_t)0x5eedbeefu);
  MP_CHECK(r == ncclInvalidArgument, "ncclCommDeregister of a bogus handle -> %s, want ncclInvalidArgument",
           ncclGetErrorString(r));
  /* The refused calls left the communicator working. */
  if (fill(a, n, rank, 40, s) || poison(b, bytes, s)) return 1;
  MP_NCCL(ncclAllReduce(a, b, n, ncclFloat, ncclSum, comm, s));
  CUDACHECK(cudaStreamSynchronize(s));
  want_sum(want, n, nranks, 0, 40, 1.0f);
  if (check_dev("allreduce after the refused deregistrations", b, want, n, s)) return 1;
  free(want);
  MP_NCCL(ncclMemFree(a));
  MP_NCCL(ncclMemFree(b));
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaStreamDestroy(s));
  return 0;
}

/* ------------------------------------------------------------ mixed_2 */

#define MIXED_COUNT ((size_t)30011)
#define MIXED_ROUNDS 4

/* Host results are complete when the call returns. */
static int check_host(const char* what, const float* got, const float* want, size_t n) {
  return cmp_f(what, got, want, n);
}

static int rank_mixed(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t n = MIXED_COUNT, b = n * sizeof(float), all = b * (size_t)nranks;
  /* [0] allreduce, [1] broadcast, [2] allgather; device and plain malloc host memory. */
  float *ds[3], *dr[3], *hs[3], *hr[3];
  for (int k = 0; k < 3; k++) {
    MP_NCCL(ncclMemAlloc((void**)&ds[k], b));
    MP_NCCL(ncclMemAlloc((void**)&dr[k], all));
    hs[k] = malloc(b);
    hr[k] = malloc(all);
    MP_CHECK(hs[k] && hr[k], "out of memory");
  }
  float* want = malloc(all);
  MP_CHECK(want != NULL, "out of memory");
  const char* kname[3] = {"allreduce", "broadcast", "allgather"};
  char what[96];
  for (int round = 0; round < MIXED_ROUNDS; round++) {
    int salt = 20 * round, root = round % nranks, host_first = round % 2;
    for (int k = 0; k < 3; k++) {
      if (fill(ds[k], n, rank, salt + k, s) || poison(dr[k], all, s)) return 1;
      for (size_t i = 0; i < n; i++) hs[k][i] = val(rank, i, salt + 10 + k);
      memset(hr[k], 0xff, all);
    }
    for (int k = 0; k < 3; k++) {
      for (int half = 0; half < 2; half++) {
        int host = half != host_first;
        float* sb = host ? hs[k] : ds[k];
        float* rb = host ? hr[k] : dr[k];
        if (k == 0) MP_NCCL(ncclAllReduce(sb, rb, n, ncclFloat, ncclSum, comm, s));
        if (k == 1) MP_NCCL(ncclBroadcast(sb, rb, n, ncclFloat, root, comm, s));
        if (k == 2) MP_NCCL(ncclAllGather(sb, rb, n, ncclFloat, comm, s));
        if (!host) continue;
        /* Checked at once: the device call before it may still be queued. */
        int hsalt = salt + 10 + k;
        if (k == 0) want_sum(want, n, nranks, 0, hsalt, 1.0f);
        if (k == 1)
          for (size_t i = 0; i < n; i++) want[i] = val(root, i, hsalt);
        if (k == 2) want_gather(want, n, nranks, hsalt);
        snprintf(what, sizeof(what), "round %d: host-buffer %s", round, kname[k]);
        if (check_host(what, hr[k], want, k == 2 ? n * (size_t)nranks : n)) return 1;
      }
    }
    CUDACHECK(cudaStreamSynchronize(s));
    want_sum(want, n, nranks, 0, salt, 1.0f);
    snprintf(what, sizeof(what), "round %d: device-buffer allreduce", round);
    if (check_dev(what, dr[0], want, n, s)) return 1;
    for (size_t i = 0; i < n; i++) want[i] = val(root, i, salt + 1);
    snprintf(what, sizeof(what), "round %d: device-buffer broadcast (root %d)", round, root);
    if (check_dev(what, dr[1], want, n, s)) return 1;
    want_gather(want, n, nranks, salt + 2);
    snprintf(what, sizeof(what), "round %d: device-buffer allgather", round);
    if (check_dev(what, dr[2], want, n * (size_t)nranks, s)) return 1;
  }
  free(want);
  for (int k = 0; k < 3; k++) {
    MP_NCCL(ncclMemFree(ds[k]));
    MP_NCCL(ncclMemFree(dr[k]));
    free(hs[k]);
    free(hr[k]);
  }
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaStreamDestroy(s));
  return 0;
}

/* ------------------------------------------------------------ abort_2, killed_2, timeout_2 */

/* Rank 0's watchdog: a call that does not return in time fails the rank with
 * its name (instead of the harness's anonymous hang), after releasing the
 * peer waiting on counter `release`. */
static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static const char* wd_what;
static double wd_until, wd_limit;
static int wd_release = -1;

static void* wd_main(void* arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&wd_mu);
    const char* what = wd_what;
    double until = wd_until, limit = wd_limit;
    pthread_mutex_unlock(&wd_mu);
    if (what && mp_now() > until) {
      fprintf(stderr, "FAIL rank %d: %s did not return within %.0f s (a hang)\n", g_rank, what, limit);
      if (wd_release >= 0) mp_arrive(wd_release);
      fflush(NULL);
      _exit(1);
    }
    sleep_ms(10);
  }
  return NULL;
}

static int wd_start(int release) {
  wd_release = release;
  pthread_t t;
  int rc = pthread_create(&t, NULL, wd_main, NULL);
  MP_CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_detach(t);
  return 0;
}

static void wd_arm(const char* what, double limit_s) {
  pthread_mutex_lock(&wd_mu);
  wd_what = what;
  wd_limit = limit_s;
  wd_until = mp_now() + limit_s;
  pthread_mutex_unlock(&wd_mu);
}

static void wd_disarm(void) { wd_arm(NULL, 0); }

/* After an abort: the process's CUDA context still works (a sticky error
 * would fail every call): a fresh allocation round trip, then a kernel (a
 * one-rank communicator's allreduce is a copy kernel). */
static int gpu_usable(int rank, const char* after) {
  cudaError_t last = cudaGetLastError();
  if (last != cudaSuccess) printf("rank %d: cudaGetLastError after %s: %s\n", rank, after, cudaGetErrorString(last));
  size_t bytes = (size_t)1 << 20;
  unsigned char* d = NULL;
  cudaError_t e = cudaMalloc((void**)&d, bytes);
  MP_CHECK(e == cudaSuccess, "after %s the GPU is not usable: cudaMalloc -> %s", after, cudaGetErrorString(e));
  e = cudaMemset(d, 0x5a, bytes);
  MP_CHECK(e == cudaSuccess, "after %s the GPU is not usable: cudaMemset -> %s", after, cudaGetErrorString(e));
  unsigned char* h = malloc(bytes);
  MP_CHECK(h != NULL, "out of memory");
  memset(h, 0, bytes);
  e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
  MP_CHECK(e == cudaSuccess, "after %s the GPU is not usable: cudaMemcpy -> %s", after, cudaGetErrorString(e));
  for (size_t i = 0; i < bytes; i++)
    MP_CHECK(h[i] == 0x5a, "after %s: cudaMemset then cudaMemcpy: byte %zu = 0x%02x, want 0x5a", after, i, h[i]);
  free(h);
  e = cudaFree(d);
  MP_CHECK(e == cudaSuccess, "after %s the GPU is not usable: cudaFree -> %s", after, cudaGetErrorString(e));
  int dev = rank % g_ndev;
  ncclComm_t one;
  MP_NCCL(ncclCommInitAll(&one, 1, &dev));
  cudaStream_t s;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t n = 4096;
  float *x, *y;
  MP_NCCL(ncclMemAlloc((void**)&x, n * sizeof(float)));
  MP_NCCL(ncclMemAlloc((void**)&y, n * sizeof(float)));
  if (fill(x, n, rank, 9, s) || poison(y, n * sizeof(float), s)) return 1;
  MP_NCCL(ncclAllReduce(x, y, n, ncclFloat, ncclSum, one, s));
  CUDACHECK(cudaStreamSynchronize(s));
  float* want = malloc(n * sizeof(float));
  MP_CHECK(want != NULL, "out of memory");
  for (size_t i = 0; i < n; i++) want[i] = val(rank, i, 9);
  char what[96];
  snprintf(what, sizeof(what), "a one-rank allreduce after %s", after);
  if (check_dev(what, y, want, n, s)) return 1;
  free(want);
  MP_NCCL(ncclMemFree(x));
  MP_NCCL(ncclMemFree(y));
  MP_NCCL(ncclCommDestroy(one));
  CUDACHECK(cudaStreamDestroy(s));
  return 0;
}

#define STUCK_COUNT ((size_t)262144) /* 1 MiB of floats: 3 channels */
#define TIMEOUT_S 3

struct stuck {
  cudaStream_t s;
  ncclComm_t comm;
  float *in, *out, *want;
};

/* Device, stream, communicator, buffers, and one allreduce both ranks take
 * part in: it sets up the device connectors (lazily, through the bootstrap),
 * so that a later allreduce of the same size by one rank alone is launched
 * and waits for the peer on the GPU. */
static int stuck_begin(struct stuck* st, int rank, int nranks, const ncclUniqueId* id) {
  memset(st, 0, sizeof(*st));
  size_t n = STUCK_COUNT, b = n * sizeof(float);
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  CUDACHECK(cudaStreamCreateWithFlags(&st->s, cudaStreamNonBlocking));
  MP_NCCL(ncclCommInitRank(&st->comm, nranks, *id, rank));
  MP_NCCL(ncclMemAlloc((void**)&st->in, b));
  MP_NCCL(ncclMemAlloc((void**)&st->out, b));
  st->want = malloc(b);
  MP_CHECK(st->want != NULL, "out of memory");
  if (fill(st->in, n, rank, 3, st->s) || poison(st->out, b, st->s)) return 1;
  MP_NCCL(ncclAllReduce(st->in, st->out, n, ncclFloat, ncclSum, st->comm, st->s));
  CUDACHECK(cudaStreamSynchronize(st->s));
  want_sum(st->want, n, nranks, 0, 3, 1.0f);
  if (check_dev("the allreduce both ranks join", st->out, st->want, n, st->s)) return 1;
  return poison(st->out, b, st->s);
}

/* After the communicator is gone. */
static int stuck_end(struct stuck* st) {
  MP_NCCL(ncclMemFree(st->in));
  MP_NCCL(ncclMemFree(st->out));
  free(st->want);
  CUDACHECK(cudaStreamDestroy(st->s));
  return 0;
}

/* Launches the allreduce rank 1 never joins (must return: the kernel path only launches). */
static int stuck_launch(struct stuck* st, double* t) {
  wd_arm("the allreduce rank 1 does not join (its launch)", 10);
  *t = mp_now();
  ncclResult_t r = ncclAllReduce(st->in, st->out, STUCK_COUNT, ncclFloat, ncclSum, st->comm, st->s);
  wd_disarm();
  MP_CHECK(r == ncclSuccess, "the allreduce rank 1 does not join -> %s: %s", ncclGetErrorString(r),
           ncclGetLastError(st->comm));
  return 0;
}

/* ncclCommAbort with the stream still busy (or just failed), then the
 * stream drains; both timed. Limits: abort and the drain within limit_s each. */
static int stuck_abort(struct stuck* st, const char* tcase, double limit_s) {
  wd_arm("ncclCommAbort", 10);
  double t0 = mp_now();
  ncclResult_t ar = ncclCommAbort(st->comm);
  double t1 = mp_now();
  wd_arm("cudaStreamSynchronize after ncclCommAbort", 10);
  cudaError_t se = cudaStreamSynchronize(st->s);
  double t2 = mp_now();
  wd_disarm();
  printf("%s: ncclCommAbort -> %s in %.1f ms; then cudaStreamSynchronize -> %s in %.1f ms\n", tcase,
         ncclGetErrorString(ar), 1e3 * (t1 - t0), cudaGetErrorString(se), 1e3 * (t2 - t1));
  fflush(stdout);
  MP_CHECK(ar == ncclSuccess, "ncclCommAbort -> %s", ncclGetErrorString(ar));
  MP_CHECK(t1 - t0 <= limit_s, "ncclCommAbort took %.3f s with a kernel waiting for a peer (limit %.1f s)", t1 - t0,
           limit_s);
  MP_CHECK(t2 - t1 <= limit_s, "the stream drained %.3f s after ncclCommAbort returned (limit %.1f s)", t2 - t1,
           limit_s);
  if (se != cudaSuccess) cudaGetLastError(); /* recorded above; whether it stuck is gpu_usable's question */
  return 0;
}

/* abort_2: rank 0 aborts while its kernel waits for rank 1, which is alive but never calls. */
static int abort_rank0(struct stuck* st) {
  MP_CHECK(mp_await(0, 1, 60) == 0, "rank 1 did not get ready");
  double t = 0;
  if (stuck_launch(st, &t)) return 1;
  sleep_ms(200);
  cudaError_t q = cudaStreamQuery(st->s);
  MP_CHECK(q == cudaErrorNotReady,
           "200 ms into an allreduce rank 1 does not join, the stream is %s; it should still wait for rank 1",
           q == cudaSuccess ? "done" : cudaGetErrorString(q));
  if (stuck_abort(st, "abort_2", 1.0)) return 1;
  if (gpu_usable(0, "ncclCommAbort of a communicator with a waiting kernel")) return 1;
  return stuck_end(st);
}

static int rank_abort(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  struct stuck st;
  if (rank == 0) {
    int rc = wd_start(1) || stuck_begin(&st, rank, nranks, &ids[0]) || abort_rank0(&st);
    mp_arrive(1); /* rank 1 may go */
    return rc;
  }
  if (stuck_begin(&st, rank, nranks, &ids[0])) return 1;
  mp_arrive(0);
  /* Stay (and keep the connectors rank 0's kernel uses) until rank 0 is done. */
  MP_CHECK(mp_await(1, 1, 80) == 0, "rank 0 did not finish");
  MP_NCCL(ncclCommAbort(st.comm));
  return stuck_end(&st);
}

/* timeout_2: as abort_2, but with COLLIE_TIMEOUT the kernel gives up by itself. */
static int timeout_rank0(struct stuck* st) {
  MP_CHECK(mp_await(0, 1, 60) == 0, "rank 1 did not get ready");
  double t0 = 0;
  if (stuck_launch(st, &t0)) return 1;
  cudaError_t q;
  while ((q = cudaStreamQuery(st->s)) == cudaErrorNotReady && mp_now() - t0 < TIMEOUT_S + 27) sleep_ms(5);
  double t1 = mp_now();
  printf("timeout_2: with COLLIE_TIMEOUT=%d the kernel waiting for rank 1 ended after %.2f s: %s\n", TIMEOUT_S, t1 - t0,
         q == cudaErrorNotReady ? "(still running)" : cudaGetErrorString(q));
  fflush(stdout);
  MP_CHECK(q != cudaErrorNotReady, "the kernel still waits for rank 1 %.0f s after the call, with COLLIE_TIMEOUT=%d",
           t1 - t0, TIMEOUT_S);
  MP_CHECK(q == cudaSuccess,
           "the kernel that gave up ended its stream with %s (want a clean end, the error reported by the library)",
           cudaGetErrorString(q));
  MP_CHECK(t1 - t0 >= 0.5 * TIMEOUT_S, "the kernel gave up after %.2f s, well before COLLIE_TIMEOUT=%d", t1 - t0,
           TIMEOUT_S);
  /* The communicator's next device call reports it. */
  ncclResult_t r = ncclAllReduce(st->in, st->out, STUCK_COUNT, ncclFloat, ncclSum, st->comm, st->s);
  printf("timeout_2: the next allreduce -> %s: %s\n", ncclGetErrorString(r), ncclGetLastError(st->comm));
  MP_CHECK(r == ncclSystemError || r == ncclRemoteError,
           "the call after a kernel timed out -> %s, want ncclSystemError or ncclRemoteError", ncclGetErrorString(r));
  ncclResult_t ae = ncclSuccess;
  MP_NCCL(ncclCommGetAsyncError(st->comm, &ae));
  MP_CHECK(ae != ncclSuccess && ae != ncclInProgress, "ncclCommGetAsyncError after a timed-out kernel -> %s",
           ncclGetErrorString(ae));
  if (stuck_abort(st, "timeout_2", 1.0)) return 1;
  if (gpu_usable(0, "a kernel timed out (COLLIE_TIMEOUT)")) return 1;
  return stuck_end(st);
}

static int rank_timeout(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  char v[16];
  snprintf(v, sizeof(v), "%d", TIMEOUT_S);
  setenv("COLLIE_TIMEOUT", v, 1); /* read at init */
  struct stuck st;
  if (rank == 0) {
    int rc = wd_start(1) || stuck_begin(&st, rank, nranks, &ids[0]) || timeout_rank0(&st);
    mp_arrive(1);
    return rc;
  }
  if (stuck_begin(&st, rank, nranks, &ids[0])) return 1;
  mp_arrive(0);
  MP_CHECK(mp_await(1, 1, 80) == 0, "rank 0 did not finish");
  MP_NCCL(ncclCommAbort(st.comm));
  return stuck_end(&st);
}

/* killed_2: rank 1 (a child of the rank-1 process, so that the harness sees
 * that process exit 0 when the death went as planned) joins the first
 * allreduce, says it is ready, waits until rank 0 has launched the next one
 * and kills itself before making that call. */
static int killed_victim(int nranks, const ncclUniqueId* id) {
  g_rank = 1;
  struct stuck st;
  if (stuck_begin(&st, 1, nranks, id)) return 1;
  mp_arrive(0);
  MP_CHECK(mp_await(1, 1, 60) == 0, "rank 0 did not launch its allreduce");
  fflush(NULL);
  raise(SIGKILL); /* no destroy, no goodbye */
  return 5;
}

static int killed_rank1(int nranks, const ncclUniqueId* id) {
  fflush(NULL);
  pid_t pid = fork(); /* this process has not touched CUDA: the child may */
  MP_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int rc = killed_victim(nranks, id);
    fflush(NULL);
    _exit(rc);
  }
  int status = 0;
  pid_t p;
  double until = mp_now() + 90;
  while ((p = waitpid(pid, &status, WNOHANG)) == 0 && mp_now() < until) sleep_ms(5);
  if (p == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    MP_CHECK(0, "rank 1 (the victim) still ran after 90 s");
  }
  MP_CHECK(p == pid, "waitpid: %s", strerror(errno));
  MP_CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
           "rank 1 (the victim) ended with status 0x%x (exit code %d), not by its own SIGKILL", status,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

static int killed_rank0(struct stuck* st) {
  MP_CHECK(mp_await(0, 1, 60) == 0, "rank 1 did not get ready");
  double t = 0;
  if (stuck_launch(st, &t)) return 1;
  mp_arrive(1); /* rank 1 dies now */
  double t0 = mp_now();
  const char* how = NULL;
  ncclResult_t ae = ncclSuccess, r2 = ncclSuccess;
  cudaError_t q = cudaErrorNotReady;
  while (mp_now() - t0 < 30) {
    MP_NCCL(ncclCommGetAsyncError(st->comm, &ae));
    if (ae != ncclSuccess && ae != ncclInProgress) {
      how = "ncclCommGetAsyncError";
      break;
    }
    q = cudaStreamQuery(st->s);
    if (q != cudaErrorNotReady) break;
    sleep_ms(5);
  }
  double t1 = mp_now();
  if (!how && q != cudaErrorNotReady) {
    /* The kernel ended by itself: the communicator's next device call must report why. */
    r2 = ncclAllReduce(st->in, st->out, STUCK_COUNT, ncclFloat, ncclSum, st->comm, st->s);
    if (r2 != ncclSuccess) how = "the next allreduce";
  }
  printf("killed_2: %.1f ms after rank 1 was let die: %s (async error %s; stream %s): %s\n", 1e3 * (t1 - t0),
         how ? how : "no error", ncclGetErrorString(ae), q == cudaErrorNotReady ? "still busy" : cudaGetErrorString(q),
         ncclGetLastError(st->comm));
  fflush(stdout);
  MP_CHECK(how != NULL, "no error %.0f s after rank 1 was killed (stream %s, async error %s, next call %s)", t1 - t0,
           q == cudaErrorNotReady ? "still busy: a hang" : cudaGetErrorString(q), ncclGetErrorString(ae),
           ncclGetErrorString(r2));
  if (q != cudaErrorNotReady && q != cudaSuccess) cudaGetLastError();
  if (stuck_abort(st, "killed_2", 1.0)) return 1;
  if (gpu_usable(0, "ncclCommAbort of a communicator whose peer was killed")) return 1;
  return stuck_end(st);
}

static int rank_killed(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  if (rank == 1) return killed_rank1(nranks, &ids[0]);
  struct stuck st;
  int rc = wd_start(1) || stuck_begin(&st, rank, nranks, &ids[0]) || killed_rank0(&st);
  mp_arrive(1); /* a victim still waiting (rank 0 failed early) stops waiting */
  return rc;
}

/* ------------------------------------------------------------ a2a_uneven_1, a2a_uneven_2 */

/* PyTorch's all_to_all_single with split sizes, as its nccl backend issues
 * it (a group of ncclSend/ncclRecv per peer, zero counts included, on the
 * backend's own non-blocking stream, ordered after the caller's legacy
 * stream by an event and back again), after a few calls that take the
 * one-rank/kernel path. One rank (a send and a receive to itself) is what
 * stopped under PyTorch on an H200 (2026-11-27); two ranks add a pair that
 * moves nothing. Odd rounds post the receives on a second stream (NCCL
 * allows a stream per call in a group): at one rank each pair is then a copy
 * joined across the two streams. The result is read on the legacy stream,
 * which waits for both: a stall fails after 10 s instead of hanging. */
static int wait_legacy(const char* what) {
  double t0 = mp_now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(0);
    if (e == cudaSuccess) return 0;
    MP_CHECK(e == cudaErrorNotReady, "%s: %s", what, cudaGetErrorString(e));
    MP_CHECK(mp_now() - t0 < 10.0, "%s: the legacy stream did not drain in 10 s (the call never completed)", what);
    sleep_ms(1);
  }
}

/* Elements rank src sends rank dst in round `base`; rank 0 sends nothing to rank 1. */
static size_t a2a_count(int src, int dst, int nranks, size_t base) {
  return nranks > 1 && src == 0 && dst == 1 ? 0 : base + (size_t)(src + 2 * dst) % 3;
}

static int rank_a2a(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  g_rank = rank;
  CUDACHECK(cudaSetDevice(rank % g_ndev));
  cudaStream_t s, s2;
  CUDACHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDACHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t before, after, after2;
  CUDACHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  CUDACHECK(cudaEventCreateWithFlags(&after2, cudaEventDisableTiming));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  enum { CAP = 4096 };
  float *x = NULL, *y = NULL, *z = NULL;
  CUDACHECK(cudaMalloc((void**)&x, CAP * sizeof(float)));
  CUDACHECK(cudaMalloc((void**)&y, CAP * sizeof(float)));
  CUDACHECK(cudaMalloc((void**)&z, 64 * sizeof(float)));
  float* h = malloc(CAP * sizeof(float));
  float* want = malloc(CAP * sizeof(float));
  MP_CHECK(h && want, "out of memory");
  for (int round = 0; round < 6; round++) {
    size_t base = round < 3 ? (size_t)1 << (2 * round) : (size_t)(round * 100 + 1); /* 1, 4, 16, 301, 401, 501 */
    size_t sc[4], rc[4], sd[4], rd[4], st = 0, rt = 0;
    for (int p = 0; p < nranks; p++) {
      sc[p] = a2a_count(rank, p, nranks, base);
      rc[p] = a2a_count(p, rank, nranks, base);
      sd[p] = st;
      rd[p] = rt;
      st += sc[p];
      rt += rc[p];
    }
    MP_CHECK(st <= CAP && rt <= CAP, "sizes");
    for (size_t i = 0; i < st; i++) h[i] = val(rank, i, round);
    /* The caller's stream writes the inputs and clears the output, as tensors are made. */
    CUDACHECK(cudaMemcpyAsync(x, h, st * sizeof(float), cudaMemcpyHostToDevice, 0));
    CUDACHECK(cudaMemsetAsync(y, 0xff, CAP * sizeof(float), 0));
    cudaStream_t rs = round % 2 ? s2 : s;
    CUDACHECK(cudaEventRecord(before, 0));
    CUDACHECK(cudaStreamWaitEvent(s, before, 0));
    CUDACHECK(cudaStreamWaitEvent(s2, before, 0));
    /* Calls that take the one-rank or kernel path first. */
    MP_NCCL(ncclAllReduce(z, z, 64, ncclFloat32, ncclSum, comm, s));
    MP_NCCL(ncclAlltoAll(z, z + 32, 32 / (size_t)nranks, ncclFloat32, comm, s));
    MP_NCCL(ncclGroupStart());
    for (int p = 0; p < nranks; p++) {
      MP_NCCL(ncclSend(x + sd[p], sc[p], ncclFloat32, p, comm, s));
      MP_NCCL(ncclRecv(y + rd[p], rc[p], ncclFloat32, p, comm, rs));
    }
    MP_NCCL(ncclGroupEnd());
    CUDACHECK(cudaEventRecord(after, s));
    CUDACHECK(cudaEventRecord(after2, s2));
    CUDACHECK(cudaStreamWaitEvent(0, after, 0));
    CUDACHECK(cudaStreamWaitEvent(0, after2, 0));
    CUDACHECK(cudaMemcpyAsync(h, y, rt * sizeof(float), cudaMemcpyDeviceToHost, 0));
    char what[96];
    snprintf(what, sizeof(what), "uneven alltoall round %d (%zu elements in)", round, rt);
    if (wait_legacy(what)) return 1;
    for (int p = 0; p < nranks; p++) {
      /* What rank p sent this rank: its elements from its displacement for us. */
      size_t off = 0;
      for (int q = 0; q < rank; q++) off += a2a_count(p, q, nranks, base);
      for (size_t i = 0; i < rc[p]; i++) want[rd[p] + i] = val(p, off + i, round);
    }
    if (cmp_f(what, h, want, rt)) return 1;
  }
  free(h);
  free(want);
  CUDACHECK(cudaFree(x));
  CUDACHECK(cudaFree(y));
  CUDACHECK(cudaFree(z));
  MP_NCCL(ncclCommDestroy(comm));
  CUDACHECK(cudaEventDestroy(before));
  CUDACHECK(cudaEventDestroy(after));
  CUDACHECK(cudaEventDestroy(after2));
  CUDACHECK(cudaStreamDestroy(s));
  CUDACHECK(cudaStreamDestroy(s2));
  return 0;
}

/* ------------------------------------------------------------ main */

struct tcase {
  const char* name;
  int nranks;
  mp_rank_fn fn;
  int arg;
};

static const struct tcase cases[] = {
    {"graph_1", 1, rank_graph, 0},       {"graph_2", 2, rank_graph, 0},     {"graph_cold_1", 1, rank_graph, 1},
    {"graph_cold_2", 2, rank_graph, 1},  {"streams_2", 2, rank_streams, 0}, {"memalloc_1", 1, rank_memalloc, 0},
    {"register_2", 2, rank_register, 0}, {"mixed_2", 2, rank_mixed, 0},     {"abort_2", 2, rank_abort, 0},
    {"killed_2", 2, rank_killed, 0},     {"timeout_2", 2, rank_timeout, 0}, {"a2a_uneven_1", 1, rank_a2a, 0},
    {"a2a_uneven_2", 2, rank_a2a, 0},
};

int main(int argc, char** argv) {
  const struct tcase* t = NULL;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    if (argc > 1 && strcmp(argv[1], cases[i].name) == 0) t = &cases[i];
  if (!t) {
    fprintf(stderr, "usage: %s CASE; cases:", argv[0]);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
    return 2;
  }
  char what[64];
  snprintf(what, sizeof(what), "gpu_test_extra %s", t->name);
  g_ndev = gpu_require(what);
  int arg = t->arg;
  int rc = mp_run(t->nranks, t->fn, &arg, 100);
  printf("%s: %s\n", t->name, rc ? "FAIL" : "ok");
  return rc;
}
