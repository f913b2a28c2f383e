/* Tensor-fusion benchmark (bench/fusion.sh runs it under collie-run): the
 * gradients of ResNet-50 (161 float32 tensors, 25.6 M parameters, shapes
 * from the architecture) allreduced once per step, either through the
 * engine (fusion on or off, as COLLIE_FUSION_THRESHOLD says) or as one
 * ncclAllReduce of the same total bytes. Prints one line on rank 0:
 *   mode ranks tensors params median_ms min_ms negotiate_us_per_cached_tensor negotiate_us_per_cycle
 * Usage: collie-fusion-bench engine|nccl [steps] [avg|sum] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collie.h"

#define MAXT 200

static size_t sizes[MAXT];
static int ntensors;

static void add(size_t n) { sizes[ntensors++] = n; }
static void conv_bn(int in, int out, int k) {
  add((size_t)in * out * k * k); /* conv weight, no bias (batchnorm follows) */
  add((size_t)out);              /* batchnorm gamma */
  add((size_t)out);              /* batchnorm beta */
}

/* ResNet-50: stem, 4 stages of bottleneck blocks (3, 4, 6, 3), fc. */
static void resnet50(void) {
  conv_bn(3, 64, 7);
  int in = 64;
  const int blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; s++) {
    for (int b = 0; b < blocks[s]; b++) {
      int w = width[s];
      conv_bn(in, w, 1);
      conv_bn(w, w, 3);
      conv_bn(w, 4 * w, 1);
      if (b == 0) conv_bn(in, 4 * w, 1); /* projection shortcut */
      in = 4 * w;
    }
  }
  add((size_t)in * 1000); /* fc weight */
  add(1000);              /* fc bias */
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "engine";
  int steps = argc > 2 ? atoi(argv[2]) : 10;
  int warmup = 3;
  /* argv[3] "sum" or "avg" (default): the op for both paths. */
  int avg = !(argc > 3 && strcmp(argv[3], "sum") == 0);
  if (steps < 1 || steps > 10000) steps = 10;
  resnet50();
  size_t total = 0;
  for (int i = 0; i < ntensors; i++) total += sizes[i];
  float** bufs = calloc((size_t)ntensors, sizeof(float*));
  for (int i = 0; i < ntensors; i++) {
    bufs[i] = malloc(sizes[i] * sizeof(float));
    for (size_t k = 0; k < sizes[i]; k++) bufs[i][k] = 1.0f;
  }
  double* times = calloc((size_t)steps, sizeof(double));
  int rank = 0, size = 0;
  double neg_tensor_us = 0, neg_cycle_us = 0;
  if (strcmp(mode, "nccl") == 0) {
    ncclComm_t comm;
    if (collie_comm_init_from_env(&comm) != ncclSuccess) {
      fprintf(stderr, "init: %s\n", ncclGetLastError(NULL));
      return 1;
    }
    ncclCommUserRank(comm, &rank);
    ncclCommCount(comm, &size);
    float* big = malloc(total * sizeof(float));
    for (size_t k = 0; k < total; k++) big[k] = 1.0f;
    for (int s = -warmup; s < steps; s++) {
      double t0 = now_s();
      if (ncclAllReduce(big, big, total, ncclFloat32, avg ? ncclAvg : ncclSum, comm, NULL) != ncclSuccess) {
        fprintf(stderr, "allreduce: %s\n", ncclGetLastError(NULL));
        return 1;
      }
      if (s >= 0) times[s] = now_s() - t0;
    }
    free(big);
    ncclCommDestroy(comm);
  } else {
    if (collie_init() != 0) {
      fprintf(stderr, "collie_init: %s\n", collie_last_error());
      return 1;
    }
    rank = collie_rank();
    size = collie_size();
    int* h = calloc((size_t)ntensors, sizeof(int));
    char name[32];
    collie_engine_stats_t st0, st1;
    for (int s = -warmup; s < steps; s++) {
      if (s == 0) {
        memset(&st0, 0, sizeof(st0));
        st0.size = sizeof(st0);
        collie_engine_stats(&st0);
      }
      double t0 = now_s();
      /* Backpropagation produces the last layer's gradients first. */
      for (int i = ntensors - 1; i >= 0; i--) {
        snprintf(name, sizeof(name), "grad.%d", i);
        h[i] = collie_allreduce_async(name, bufs[i], bufs[i], sizes[i], ncclFloat32, avg ? COLLIE_AVERAGE : COLLIE_SUM, 1.0, 1.0,
                                      COLLIE_WORLD);
      }
      for (int i = 0; i < ntensors; i++) {
        if (collie_wait(h[i]) != 0) {
          fprintf(stderr, "wait: %s\n", collie_handle_error(h[i]));
          return 1;
        }
        collie_release(h[i]);
      }
      if (s >= 0) times[s] = now_s() - t0;
    }
    memset(&st1, 0, sizeof(st1));
    st1.size = sizeof(st1);
    collie_engine_stats(&st1);
    uint64_t hits = st1.cache_hits - st0.cache_hits, cycles = st1.cycles - st0.cycles;
    double neg = (double)(st1.negotiate_ns - st0.negotiate_ns) / 1e3;
    neg_tensor_us = hits ? neg / (double)hits : 0;
    neg_cycle_us = cycles ? neg / (double)cycles : 0;
    free(h);
    collie_shutdown();
  }
  qsort(times, (size_t)steps, sizeof(double), cmp_d);
  if (rank == 0)
    printf("%s %d %d %zu %.2f %.2f %.2f %.2f\n", mode, size, ntensors, total, times[steps / 2] * 1e3, times[0] * 1e3,
           neg_tensor_us, neg_cycle_us);
  for (int i = 0; i < ntensors; i++) free(bufs[i]);
  free(bufs);
  free(times);
  return 0;
}
