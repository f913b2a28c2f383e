/* Host test of the device kernels' arithmetic (src/device/reduce_elem.h):
 * every datatype x reduction (and premulsum scaling, the ncclAvg division,
 * the premulsum scalar load) must give the same bits as the host reductions
 * of reduce_host.c, on random bit patterns (NaN, infinities and subnormals
 * included) and on small integers. Runs without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "device/reduce_elem.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

enum { COUNT = 4096 };

static uint64_t get(const unsigned char* p, size_t es, size_t i) {
  uint64_t v = 0;
  memcpy(&v, p + i * es, es); /* little-endian hosts */
  return v;
}

static void fill(unsigned char* p, size_t es, int dt, int small, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rng();
    if (small) {
      int k = (int)(v % 9) - 4;
      unsigned char tmp[8];
      switch (dt) {
        case ncclFloat16: { uint16_t h = red_float_to_half((float)k); memcpy(tmp, &h, 2); break; }
        case ncclBfloat16: { uint16_t h = red_float_to_bf16((float)k); memcpy(tmp, &h, 2); break; }
        case ncclFloat8e4m3: tmp[0] = red_float_to_e4m3((float)k); break;
        case ncclFloat8e5m2: tmp[0] = red_float_to_e5m2((float)k); break;
        case ncclFloat32: { float f = (float)k; memcpy(tmp, &f, 4); break; }
        case ncclFloat64: { double f = k; memcpy(tmp, &f, 8); break; }
        default: { int64_t x = k; memcpy(tmp, &x, 8); break; }
      }
      memcpy(p + i * es, tmp, es);
    } else {
      memcpy(p + i * es, &v, es);
    }
  }
}

/* Which NaN an operation on NaNs returns is not specified (reduce.h; GPUs
 * return a canonical NaN): any NaN matches any NaN. */
static int is_nan(int dt, uint64_t v) {
  switch (dt) {
    case ncclFloat16: return (v & 0x7c00) == 0x7c00 && (v & 0x3ff);
    case ncclBfloat16: return (v & 0x7f80) == 0x7f80 && (v & 0x7f);
    case ncclFloat32: return (v & 0x7f800000u) == 0x7f800000u && (v & 0x7fffffu);
    case ncclFloat64: return (v & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (v & 0xfffffffffffffull);
    case ncclFloat8e4m3: return (v & 0x7f) == 0x7f;
    case ncclFloat8e5m2: return (v & 0x7c) == 0x7c && (v & 3);
    default: return 0;
  }
}

static int fails;
static void expect(const char* what, int dt, size_t i, uint64_t got, uint64_t want) {
  if (got != want && !(is_nan(dt, got) && is_nan(dt, want)) && fails++ < 20)
    fprintf(stderr, "FAIL %s %s [%zu]: device 0x%llx host 0x%llx\n", what, dtype_name((ncclDataType_t)dt), i,
            (unsigned long long)got, (unsigned long long)want);
}

int main(void) {
  static unsigned char a[COUNT * 8], b[COUNT * 8], d[COUNT * 8];
  const char* kinds[] = {"sum", "prod", "max", "min", "premulsum"};
  long checked = 0;
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt);
    for (int small = 0; small < 2; small++) {
      fill(a, es, dt, small, COUNT);
      fill(b, es, dt, small, COUNT);
      unsigned char sc[8];
      fill(sc, es, dt, 1, 1);
      struct red_op pm;
      red_op_init_premulsum(&pm, sc, (ncclDataType_t)dt);
      struct re_scalar s = re_scalar_load(dt, sc);
      /* Floats carry the scalar in f, integers in u (the other field is unused). */
      if (dt >= ncclFloat16 ? memcmp(&s.f, &pm.scalar.f, 8) != 0 : s.u != pm.scalar.u)
        expect("scalar load", dt, 0, dt >= ncclFloat16 ? re_d2u(s.f) : s.u, pm.scalar.u);
      for (int kind = RED_SUM; kind <= RED_PREMULSUM; kind++) {
        struct red_op op = pm;
        if (kind != RED_PREMULSUM) red_op_init(&op, (ncclRedOp_t)kind, (ncclDataType_t)dt);
        red_reduce(&op, d, a, b, COUNT);
        for (size_t i = 0; i < COUNT; i++, checked++)
          expect(kinds[kind], dt, i, re_reduce(dt, kind, get(a, es, i), get(b, es, i), s), get(d, es, i));
      }
      red_pre(&pm, d, a, COUNT);
      for (size_t i = 0; i < COUNT; i++, checked++) expect("pre", dt, i, re_scale(dt, get(a, es, i), s), get(d, es, i));
      for (int n = 1; n <= 7; n += 3) {
        red_div((ncclDataType_t)dt, d, a, COUNT, n);
        for (size_t i = 0; i < COUNT; i++, checked++) expect("div", dt, i, re_div(dt, get(a, es, i), n), get(d, es, i));
      }
    }
  }
  printf("%s: device element arithmetic vs host reductions, %ld elements\n", fails ? "FAILED" : "passed", checked);
  return fails != 0;
}
