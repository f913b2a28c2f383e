/* An engine program: two threads per rank submit named allreduces in an
 * order that differs from rank to rank, then every other engine operation
 * (allgather with unequal counts, broadcast, alltoall, reducescatter, a
 * process set, join, barrier, the timeline) runs once, and the whole engine
 * is started and stopped twice. Every result is checked; exit 0 means all
 * were right. Run it under a launcher:
 *   collie-run -n 4 build/collie-engine-demo [timeline.json]
 * The test suite also runs it under valgrind (leaks, memory errors). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"

#define NT 12    /* tensors per thread */
#define LEN 1000 /* elements per tensor */

static int rank, size, failures;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "rank %d: FAIL %s: ", rank, #cond);     \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, "\n");                                  \
      __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);     \
    }                                                         \
  } while (0)

struct worker {
  int id;
  float data[NT][LEN];
};

/* Thread `id` submits its tensors in a rank-dependent rotation, then waits. */
static void* submit_all(void* p) {
  struct worker* w = p;
  int h[NT];
  for (int k = 0; k < NT; k++) {
    int i = (k + rank * 5) % NT;
    for (int e = 0; e < LEN; e++) w->data[i][e] = (float)(rank + 1) * (float)(i + e % 7);
    char name[64];
    snprintf(name, sizeof(name), "thread%d.grad%d", w->id, i);
    h[i] = collie_allreduce_async(name, w->data[i], w->data[i], LEN, ncclFloat32, COLLIE_SUM, 1.0, 1.0, COLLIE_WORLD);
    CHECK(h[i] >= 0, "submit %s: %s", name, collie_last_error());
  }
  float ranksum = (float)size * (float)(size + 1) / 2.0f;
  for (int i = 0; i < NT; i++) {
    if (h[i] < 0) continue;
    int rc = collie_wait(h[i]);
    CHECK(rc == 0, "wait: %s", collie_handle_error(h[i]));
    for (int e = 0; e < LEN && rc == 0; e++)
      if (w->data[i][e] != ranksum * (float)(i + e % 7)) {
        CHECK(0, "thread %d tensor %d element %d: %g, expected %g", w->id, i, e, w->data[i][e],
              ranksum * (float)(i + e % 7));
        break;
      }
    collie_release(h[i]);
  }
  return NULL;
}

static void other_ops(int round) {
  /* Allgather: rank r contributes r + 1 elements of value r. */
  int mine[8];
  for (int i = 0; i <= rank; i++) mine[i] = rank;
  int h = collie_allgather_async("gather", mine, (size_t)rank + 1, ncclInt32, COLLIE_WORLD);
  CHECK(h >= 0 && collie_wait(h) == 0, "allgather: %s", h >= 0 ? collie_handle_error(h) : collie_last_error());
  void* out = NULL;
  size_t n = 0;
  if (h >= 0 && collie_result(h, &out, &n) == 0) {
    CHECK(n == (size_t)size * (size + 1) / 2, "allgather count %zu", n);
    size_t k = 0;
    for (int r = 0; r < size; r++)
      for (int i = 0; i <= r; i++, k++) CHECK(((int*)out)[k] == r, "allgather element %zu", k);
  }
  if (h >= 0) collie_release(h);

  /* Broadcast from the last rank. */
  double b[16];
  for (int i = 0; i < 16; i++) b[i] = rank == size - 1 ? i * 0.5 + round : -1;
  h = collie_broadcast_async("bcast", b, 16, ncclFloat64, size - 1, COLLIE_WORLD);
  CHECK(h >= 0 && collie_wait(h) == 0, "broadcast");
  for (int i = 0; i < 16; i++) CHECK(b[i] == i * 0.5 + round, "broadcast element %d: %g", i, b[i]);
  if (h >= 0) collie_release(h);

  /* Alltoall: one element per destination, value 100 * src + dst. */
  size_t counts[64];
  int64_t a2a[64];
  for (int j = 0; j < size; j++) {
    counts[j] = 1;
    a2a[j] = 100 * rank + j;
  }
  h = collie_alltoall_async("a2a", a2a, counts, ncclInt64, COLLIE_WORLD);
  CHECK(h >= 0 && collie_wait(h) == 0, "alltoall");
  if (h >= 0 && collie_result(h, &out, &n) == 0) {
    CHECK(n == (size_t)size, "alltoall count %zu", n);
    for (int j = 0; j < size && n == (size_t)size; j++)
      CHECK(((int64_t*)out)[j] == 100 * j + rank, "alltoall from %d: %lld", j, (long long)((int64_t*)out)[j]);
  }
  if (h >= 0) collie_release(h);

  /* Reducescatter of size * 3 + 1 elements: rank 0 gets one extra. */
  size_t total = (size_t)size * 3 + 1;
  int32_t* rs = malloc(total * sizeof(int32_t));
  for (size_t i = 0; i < total; i++) rs[i] = (int32_t)i;
  h = collie_reducescatter_async("rs", rs, total, ncclInt32, COLLIE_SUM, COLLIE_WORLD);
  CHECK(h >= 0 && collie_wait(h) == 0, "reducescatter");
  if (h >= 0 && collie_result(h, &out, &n) == 0) {
    size_t first = rank == 0 ? 0 : (size_t)rank * 3 + 1;
    CHECK(n == (rank == 0 ? 4u : 3u), "reducescatter count %zu", n);
    for (size_t i = 0; i < n; i++)
      CHECK(((int32_t*)out)[i] == (int32_t)(first + i) * size, "reducescatter element %zu", i);
  }
  if (h >= 0) collie_release(h);
  free(rs);

  /* A process set of the even ranks: the average of rank numbers there. */
  int evens[32], ne = 0;
  for (int r = 0; r < size; r += 2) evens[ne++] = r;
  int ps = collie_add_process_set(evens, ne);
  CHECK(ps > 0, "add_process_set: %s", collie_last_error());
  if (ps > 0 && collie_process_set_included(ps) == 1) {
    double v = rank, expect = 0;
    for (int i = 0; i < ne; i++) expect += evens[i];
    expect /= ne;
    h = collie_allreduce_async("evens", &v, &v, 1, ncclFloat64, COLLIE_AVERAGE, 1.0, 1.0, ps);
    CHECK(h >= 0 && collie_wait(h) == 0, "set allreduce");
    CHECK(v == expect, "set average %g, expected %g", v, expect);
    if (h >= 0) collie_release(h);
  }
  if (ps > 0) CHECK(collie_remove_process_set(ps) == 0, "remove_process_set: %s", collie_last_error());

  CHECK(collie_barrier(COLLIE_WORLD) == 0, "barrier: %s", collie_last_error());
  int last = collie_join();
  CHECK(last >= 0 && last < size, "join returned %d", last);
}

int main(int argc, char** argv) {
  for (int round = 0; round < 2; round++) {
    if (collie_init() != 0) {
      fprintf(stderr, "collie_init: %s\n", collie_last_error());
      return 1;
    }
    rank = collie_rank();
    size = collie_size();
    if (round == 0 && argc > 1) CHECK(collie_start_timeline(argv[1], 1) == 0, "timeline: %s", collie_last_error());
    struct worker* w = calloc(2, sizeof(*w));
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
      w[t].id = t;
      pthread_create(&th[t], NULL, submit_all, &w[t]);
    }
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    free(w);
    other_ops(round);
    if (round == 0 && argc > 1) CHECK(collie_stop_timeline() == 0, "stop timeline");
    CHECK(collie_shutdown() == 0, "shutdown: %s", collie_last_error());
  }
  if (rank == 0 && failures == 0) printf("engine demo: %d ranks, all results correct\n", size);
  return failures ? 1 : 0;
}
