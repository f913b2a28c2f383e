/* One rank of the init benchmark, run under collie-run by bench/init_scaling.sh.
 * Modes (argv[1]):
 *   init (default)  times collie_comm_init_from_env and ncclCommDestroy
 *   scalable K      after an init, times ncclCommInitRankScalable with K
 *                   roots (made by the first rank of each block, handed out
 *                   through files in $INIT_BENCH_DIR)
 *   split           after an init, times ncclCommSplit(color rank % 2) and the
 *                   children's destroy
 *   shrink          after an init, times ncclCommShrink without the last rank
 * Prints "<what>_ms <rank> <ms>" lines (and wall-clock stamps); the per-phase breakdown of every init
 * comes from the library's INIT log ("init phases ms: ...", NCCL_DEBUG=INFO
 * NCCL_DEBUG_SUBSYS=INIT), which the script parses. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Wall-clock ms, comparable between the ranks' processes. */
static double wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (t.tv_sec % 100000) * 1e3 + t.tv_nsec / 1e6;
}

static int fail(const char* what, ncclResult_t r) {
  fprintf(stderr, "%s failed: %s (%s)\n", what, ncclGetErrorString(r), ncclGetLastError(NULL));
  return 1;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "init";
  ncclComm_t comm, child = NULL;
  ncclResult_t r;
  double a, b;
  double started = wall_ms();
  a = now_ms();
  r = collie_comm_init_from_env(&comm);
  b = now_ms();
  double ready = wall_ms();
  if (r != ncclSuccess) return fail("init", r);
  int rank, n;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  printf("init_ms %d %.3f\n", rank, b - a);
  /* When main began and when init returned: the script takes the spread of
   * the starts (how long launching the processes took) and the last return
   * after the last start (what init itself costs once every rank is there). */
  printf("start_wall %d %.3f\nready_wall %d %.3f\n", rank, started, rank, ready);
  if (!strcmp(mode, "scalable")) {
    /* The first rank of each block makes its block's ID (a root thread of
     * its own, not NCCL_COMM_ID's address) and leaves it in a file under
     * INIT_BENCH_DIR for the others (a collective over a thousand processes
     * on two cores would cost more than what is measured). */
    int k = argc > 2 ? atoi(argv[2]) : 4;
    const char* dir = getenv("INIT_BENCH_DIR");
    if (k < 1 || k > n || !dir) {
      fprintf(stderr, "scalable: K=%d outside 1..%d or INIT_BENCH_DIR unset\n", k, n);
      return 1;
    }
    ncclUniqueId* ids = calloc((size_t)k, sizeof(*ids));
    if (!ids) return 1;
    unsetenv("NCCL_COMM_ID");
    for (int i = 0; i < k; i++) {
      char path[4096], tmp[4200];
      snprintf(path, sizeof(path), "%s/id%d", dir, i);
      if (rank == (int)((long long)i * n / k)) {
        if ((r = ncclGetUniqueId(&ids[i])) != ncclSuccess) return fail("ncclGetUniqueId", r);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE* f = fopen(tmp, "wb");
        if (!f || fwrite(&ids[i], sizeof(ids[i]), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
          perror("scalable: writing the ID");
          return 1;
        }
      }
    }
    for (int i = 0; i < k; i++) {
      char path[4096];
      snprintf(path, sizeof(path), "%s/id%d", dir, i);
      int got = rank == (int)((long long)i * n / k);
      for (int tries = 0; !got && tries < 3000; tries++) { /* at most a minute */
        FILE* f = fopen(path, "rb");
        if (f) {
          got = fread(&ids[i], sizeof(ids[i]), 1, f) == 1;
          fclose(f);
        }
        if (!got) nanosleep(&(struct timespec){0, 20000000}, NULL); /* 20 ms: a thousand pollers must not crowd out the rest */
      }
      if (!got) {
        fprintf(stderr, "scalable: no ID in %s after a minute\n", path);
        return 1;
      }
    }
    a = now_ms();
    r = ncclCommInitRankScalable(&child, n, rank, k, ids, NULL);
    b = now_ms();
    free(ids);
    if (r != ncclSuccess) return fail("ncclCommInitRankScalable", r);
    printf("scalable_ms %d %.3f\n", rank, b - a);
    ncclCommDestroy(child);
  } else if (!strcmp(mode, "split")) {
    a = now_ms();
    r = ncclCommSplit(comm, rank % 2, rank, &child, NULL);
    b = now_ms();
    if (r != ncclSuccess) return fail("ncclCommSplit", r);
    printf("split_ms %d %.3f\n", rank, b - a);
    ncclCommDestroy(child);
  } else if (!strcmp(mode, "shrink")) {
    if (rank != n - 1) {
      int excluded = n - 1;
      a = now_ms();
      r = ncclCommShrink(comm, &excluded, 1, &child, NULL, NCCL_SHRINK_DEFAULT);
      b = now_ms();
      if (r != ncclSuccess) return fail("ncclCommShrink", r);
      printf("shrink_ms %d %.3f\n", rank, b - a);
      ncclCommDestroy(child);
    }
  } else if (strcmp(mode, "init") != 0) {
    fprintf(stderr, "unknown mode %s (init, scalable K, split, shrink)\n", mode);
    return 1;
  }
  a = now_ms();
  ncclCommDestroy(comm);
  printf("destroy_ms %d %.3f\n", rank, now_ms() - a);
  return 0;
}
