/* reduce_bench: throughput of the host reduction kernels (src/device/
 * reduce_host.c) against memcpy of the same buffer size, out of memory
 * (64 MiB) and in cache (256 KiB). Not a test; prints a table.
 *   usage: reduce_bench [seconds per cell, default 0.3] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/reduce.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Moderate normal values (no subnormals, no NaN), so every element takes the
 * common path. */
static void fill(ncclDataType_t dt, void* p, size_t count, uint64_t seed) {
  for (size_t i = 0; i < count; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    float f = (float)((int)(seed >> 40) % 20000 - 10000) / 128.0f;
    switch (dt) {
      case ncclFloat32: ((float*)p)[i] = f; break;
      case ncclFloat16: ((uint16_t*)p)[i] = red_float_to_half(f); break;
      case ncclBfloat16: ((uint16_t*)p)[i] = red_float_to_bf16(f); break;
      case ncclInt32: ((int32_t*)p)[i] = (int32_t)(seed >> 33); break;
      default: memset((char*)p + i * dtype_size(dt), 0, dtype_size(dt)); break;
    }
  }
}

enum mode { M_MEMCPY, M_REDUCE, M_INPLACE };

/* Best time per call over batches that each run about secs / 5. */
static double time_cell(enum mode m, const struct red_op* r, void* d, void* a, const void* b, size_t bytes,
                        double secs) {
  size_t count = bytes / dtype_size(r->dt);
  int iters = 1;
  double best = 1e30;
  for (int batch = 0; batch < 6; batch++) {
    double t0 = now();
    for (int i = 0; i < iters; i++) {
      if (m == M_MEMCPY)
        memcpy(d, b, bytes);
      else if (m == M_REDUCE)
        red_reduce(r, d, a, b, count);
      else
        red_reduce(r, a, a, b, count);
    }
    double t = (now() - t0) / iters;
    if (batch > 0 && t < best) best = t; /* batch 0 warms up and sizes the rest */
    if (batch == 0) {
      double n = secs / 5 / (t > 1e-9 ? t : 1e-9);
      iters = n < 1 ? 1 : n > 1e7 ? 10000000 : (int)n;
    }
  }
  return best;
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 0.3;
  if (secs <= 0) secs = 0.3;
  static const size_t sizes[] = {64u << 20, 256u << 10};
  static const struct {
    const char* name;
    enum mode m;
    ncclDataType_t dt;
  } rows[] = {
      {"memcpy", M_MEMCPY, ncclFloat32},
      {"float32 sum", M_REDUCE, ncclFloat32},
      {"float32 sum in place", M_INPLACE, ncclFloat32},
      {"bfloat16 sum", M_REDUCE, ncclBfloat16},
      {"float16 sum", M_REDUCE, ncclFloat16},
      {"int32 sum", M_REDUCE, ncclInt32},
  };
  size_t maxb = sizes[0];
  char *a = aligned_alloc(64, maxb), *b = aligned_alloc(64, maxb), *d = aligned_alloc(64, maxb);
  char* a0 = aligned_alloc(64, maxb);
  if (!a || !b || !d || !a0) {
    fprintf(stderr, "reduce_bench: out of memory\n");
    return 1;
  }
  printf("GB/s = buffer bytes / time per call; traffic counts every byte read or written\n");
  printf("(memcpy 2x the buffer, out-of-place reduce 3x). Best of 5 batches of ~%.2fs/5.\n\n", secs);
  printf("%-22s %10s %12s %10s %14s %10s\n", "kernel", "buffer", "us/call", "GB/s", "traffic GB/s", "vs memcpy");
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    size_t bytes = sizes[si];
    double memcpy_gbs = 0;
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
      struct red_op r;
      red_op_init(&r, ncclSum, rows[ri].dt);
      size_t count = bytes / dtype_size(r.dt);
      fill(r.dt, a0, count, 1);
      fill(r.dt, b, count, 2);
      memcpy(a, a0, bytes);
      /* In place, a grows by b each call; float32 stays finite and normal. */
      double t = time_cell(rows[ri].m, &r, d, a, b, bytes, secs);
      double gbs = (double)bytes / t / 1e9;
      double traffic = gbs * (rows[ri].m == M_MEMCPY ? 2 : 3);
      if (rows[ri].m == M_MEMCPY) memcpy_gbs = gbs;
      char buf[32];
      snprintf(buf, sizeof buf, bytes >= (1u << 20) ? "%zu MiB" : "%zu KiB",
               bytes >= (1u << 20) ? bytes >> 20 : bytes >> 10);
      printf("%-22s %10s %12.1f %10.2f %14.2f %9.2fx\n", rows[ri].name, buf, t * 1e6, gbs, traffic, gbs / memcpy_gbs);
    }
  }
  free(a);
  free(b);
  free(d);
  free(a0);
  return 0;
}
