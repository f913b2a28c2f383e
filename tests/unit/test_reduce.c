/* Unit tests for the host reduction kernels and the fp16 / bf16 / fp8
 * conversions (src/device/reduce_host.c). Every kernel is checked element by
 * element against a straightforward scalar reference written here; the
 * conversions against a decoder / nearest-value search that share no code
 * with the library. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static int is_int_type(int dt) { return dt <= ncclUint64; }
static int is_signed_int(int dt) { return dt == ncclInt8 || dt == ncclInt32 || dt == ncclInt64; }

/* ---- independent reference for the narrow formats ------------------------------ */

enum fmt { F_HALF, F_BF16, F_E4M3, F_E5M2, F_COUNT };
static const struct {
  const char* name;
  int ebits, mbits, bits;
  int ieee;         /* max exponent holds inf / NaN; else only all-ones is NaN (E4M3) */
  uint32_t maxcode; /* largest positive finite code */
} fmts[F_COUNT] = {
    {"half", 5, 10, 16, 1, 0x7bff},
    {"bf16", 8, 7, 16, 1, 0x7f7f},
    {"e4m3", 4, 3, 8, 0, 0x7e},
    {"e5m2", 5, 2, 8, 1, 0x7b},
};

/* Value of a code from its fields; also used for "maxcode + 1" in IEEE formats
 * (the power of two just past the largest finite value) when `raw` is set. */
static double ref_decode_raw(int fm, uint32_t code, int raw) {
  int eb = fmts[fm].ebits, mb = fmts[fm].mbits, bias = (1 << (eb - 1)) - 1;
  uint32_t s = (code >> (eb + mb)) & 1, e = (code >> mb) & ((1u << eb) - 1), m = code & ((1u << mb) - 1);
  double v;
  if (!raw && fmts[fm].ieee && e == (1u << eb) - 1)
    v = m ? NAN : INFINITY;
  else if (!raw && !fmts[fm].ieee && e == (1u << eb) - 1 && m == (1u << mb) - 1)
    v = NAN;
  else if (e == 0)
    v = ldexp((double)m, 1 - bias - mb);
  else
    v = ldexp((double)(m + (1u << mb)), (int)e - bias - mb);
  return s ? -v : v;
}
static double ref_decode(int fm, uint32_t code) { return ref_decode_raw(fm, code, 0); }

static float lib_to_float(int fm, uint32_t c) {
  switch (fm) {
    case F_HALF: return red_half_to_float((uint16_t)c);
    case F_BF16: return red_bf16_to_float((uint16_t)c);
    case F_E4M3: return red_e4m3_to_float((uint8_t)c);
    default: return red_e5m2_to_float((uint8_t)c);
  }
}
static uint32_t lib_from_float(int fm, float f) {
  switch (fm) {
    case F_HALF: return red_float_to_half(f);
    case F_BF16: return red_float_to_bf16(f);
    case F_E4M3: return red_float_to_e4m3(f);
    default: return red_float_to_e5m2(f);
  }
}

/* Nearest code to f, ties to the even code; IEEE formats overflow to inf,
 * fp8 saturates to the largest finite value. Not for NaN. */
static uint32_t ref_encode(int fm, float f) {
  uint32_t sign = signbit(f) ? 1u << (fmts[fm].bits - 1) : 0;
  double a = fabs((double)f);
  uint32_t maxc = fmts[fm].maxcode;
  if (a > ref_decode(fm, maxc)) {
    if (!fmts[fm].ieee || fm == F_E5M2) return maxc | sign;
    double next = ref_decode_raw(fm, maxc + 1, 1);
    return (a >= (ref_decode(fm, maxc) + next) / 2 ? maxc + 1 : maxc) | sign; /* maxc is odd: a tie goes up */
  }
  uint32_t lo = 0, hi = maxc; /* largest code with value <= a */
  while (lo < hi) {
    uint32_t mid = (lo + hi + 1) / 2;
    if (ref_decode(fm, mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (ref_decode(fm, lo) == a) return lo | sign;
  double dl = a - ref_decode(fm, lo), dh = ref_decode(fm, lo + 1) - a; /* exact: close magnitudes */
  uint32_t c = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1 ? lo + 1 : lo);
  return c | sign;
}

static void check_encode(int fm, float f) {
  uint32_t got = lib_from_float(fm, f);
  if (isnan(f)) {
    if (!isnan(ref_decode(fm, got))) fail_msg("%s(NaN 0x%08x) -> 0x%x, not NaN", fmts[fm].name, f2u(f), got);
    return;
  }
  uint32_t want = ref_encode(fm, f);
  if (got != want) fail_msg("%s(%a = 0x%08x) -> 0x%x, want 0x%x", fmts[fm].name, (double)f, f2u(f), got, want);
}

/* ---- conversion tests ------------------------------------------------------------------ */

static void test_decode_exhaustive(void** state) {
  (void)state;
  for (int fm = 0; fm < F_COUNT; fm++) {
    for (uint32_t c = 0; c < (1u << fmts[fm].bits); c++) {
      float v = lib_to_float(fm, c);
      double r = ref_decode(fm, c);
      if (isnan(r)) {
        if (!isnan(v)) fail_msg("%s 0x%x -> %a, want NaN", fmts[fm].name, c, (double)v);
        if (fm != F_BF16 && !(f2u(v) & 0x00400000u)) fail_msg("%s 0x%x -> signalling NaN", fmts[fm].name, c);
      } else if ((double)v != r || !signbit(v) != !signbit(r)) {
        fail_msg("%s 0x%x -> %a, want %a", fmts[fm].name, c, (double)v, r);
      }
    }
  }
}

static void test_roundtrip_exhaustive(void** state) {
  (void)state;
  for (int fm = 0; fm < F_COUNT; fm++) {
    for (uint32_t c = 0; c < (1u << fmts[fm].bits); c++) {
      float v = lib_to_float(fm, c);
      uint32_t back = lib_from_float(fm, v);
      if (isnan(v)) {
        if (!isnan(lib_to_float(fm, back))) fail_msg("%s NaN 0x%x -> 0x%x", fmts[fm].name, c, back);
        continue;
      }
      uint32_t want = c;
      if (fm == F_E5M2 && isinf(v)) want = (c & 0x80) | 0x7b; /* satfinite */
      if (back != want) fail_msg("%s 0x%x -> %a -> 0x%x", fmts[fm].name, c, (double)v, back);
    }
  }
}

/* Every midpoint between neighbouring values (ties to even), one float ulp
 * either side of it, and the values themselves, both signs. */
static void test_encode_midpoints(void** state) {
  (void)state;
  for (int fm = 0; fm < F_COUNT; fm++) {
    uint32_t last = fmts[fm].maxcode + (fmts[fm].ieee ? 1 : 0);
    for (uint32_t c = 0; c < last; c++) {
      double lo = ref_decode(fm, c), hi = ref_decode_raw(fm, c + 1, 1);
      double mid = (lo + hi) / 2;
      float fm_ = (float)mid;
      assert_true((double)fm_ == mid); /* all these formats have < 23 mantissa bits */
      float xs[] = {fm_, u2f(f2u(fm_) - 1), u2f(f2u(fm_) + 1), (float)lo}; /* fm_ > 0: one ulp down, up */
      for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        if (isinf(xs[i])) continue;
        check_encode(fm, xs[i]);
        check_encode(fm, -xs[i]);
      }
    }
  }
}

static void test_encode_random(void** state) {
  (void)state;
  for (int fm = 0; fm < F_COUNT; fm++) {
    for (int i = 0; i < 300000; i++) {
      uint32_t x = (uint32_t)rng();
      check_encode(fm, u2f(x));
      /* Concentrate on the format's range: exponents 2^-30 .. 2^20, or
         around the bf16 extremes. */
      int e = fm == F_BF16 ? (int)(rng() % 254) + 1 : 97 + (int)(rng() % 51);
      check_encode(fm, u2f((x & 0x807fffffu) | ((uint32_t)e << 23)));
    }
  }
}

static void test_encode_specials(void** state) {
  (void)state;
  /* RNE ties: halfway between 1 and the next value goes to 1 (even), the next
     tie up goes to the even code above. */
  assert_int_equal(red_float_to_half(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(red_float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(red_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(red_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  assert_int_equal(red_float_to_e4m3(1.0f + 0x1p-4f), 0x38);
  assert_int_equal(red_float_to_e4m3(1.0f + 3 * 0x1p-4f), 0x3a);
  assert_int_equal(red_float_to_e5m2(1.0f + 0x1p-3f), 0x3c);
  assert_int_equal(red_float_to_e5m2(1.0f + 3 * 0x1p-3f), 0x3e);
  /* Overflow: binary16 / bfloat16 to inf, fp8 saturates (inf too). */
  assert_int_equal(red_float_to_half(65504.0f), 0x7bff);
  assert_int_equal(red_float_to_half(65519.0f), 0x7bff);
  assert_int_equal(red_float_to_half(65520.0f), 0x7c00);
  assert_int_equal(red_float_to_half(-1e10f), 0xfc00);
  assert_int_equal(red_float_to_half(INFINITY), 0x7c00);
  assert_int_equal(red_float_to_bf16(FLT_MAX), 0x7f80);
  assert_int_equal(red_float_to_bf16(-INFINITY), 0xff80);
  assert_int_equal(red_float_to_e4m3(448.0f), 0x7e);
  assert_int_equal(red_float_to_e4m3(464.0f), 0x7e);
  assert_int_equal(red_float_to_e4m3(1e30f), 0x7e);
  assert_int_equal(red_float_to_e4m3(INFINITY), 0x7e);
  assert_int_equal(red_float_to_e4m3(-INFINITY), 0xfe);
  assert_int_equal(red_float_to_e5m2(57344.0f), 0x7b);
  assert_int_equal(red_float_to_e5m2(61440.0f), 0x7b);
  assert_int_equal(red_float_to_e5m2(INFINITY), 0x7b);
  assert_int_equal(red_float_to_e5m2(-INFINITY), 0xfb);
  assert_true(red_e4m3_to_float(0x7e) == 448.0f);
  assert_true(red_e5m2_to_float(0x7b) == 57344.0f);
  assert_true(isinf(red_e5m2_to_float(0x7c)));
  /* Subnormals, with ties to even at the bottom. */
  assert_int_equal(red_float_to_half(0x1p-24f), 0x0001);
  assert_int_equal(red_float_to_half(0x1p-25f), 0x0000);
  assert_int_equal(red_float_to_half(0x1.0002p-25f), 0x0001);
  assert_int_equal(red_float_to_half(3 * 0x1p-25f), 0x0002);
  assert_int_equal(red_float_to_half(0x1p-14f - 0x1p-25f), 0x0400); /* rounds up into the normals */
  assert_true(red_half_to_float(0x0001) == 0x1p-24f);
  assert_true(red_half_to_float(0x03ff) == 1023 * 0x1p-24f);
  assert_int_equal(red_float_to_bf16(0x1p-133f), 0x0001);
  assert_true(red_bf16_to_float(0x0001) == 0x1p-133f);
  assert_int_equal(red_float_to_e4m3(0x1p-9f), 0x01);
  assert_int_equal(red_float_to_e4m3(0x1p-10f), 0x00);
  assert_int_equal(red_float_to_e4m3(3 * 0x1p-10f), 0x02);
  assert_true(red_e4m3_to_float(0x07) == 7 * 0x1p-9f);
  assert_int_equal(red_float_to_e5m2(0x1p-16f), 0x01);
  assert_int_equal(red_float_to_e5m2(3 * 0x1p-17f), 0x02);
  assert_true(red_e5m2_to_float(0x03) == 3 * 0x1p-16f);
  /* Signed zero, and underflow keeps the sign. */
  assert_int_equal(red_float_to_half(-0.0f), 0x8000);
  assert_int_equal(red_float_to_half(-0x1p-30f), 0x8000);
  assert_int_equal(red_float_to_bf16(-0.0f), 0x8000);
  assert_int_equal(red_float_to_e4m3(-0.0f), 0x80);
  assert_int_equal(red_float_to_e4m3(-0x1p-12f), 0x80);
  assert_int_equal(red_float_to_e5m2(-0.0f), 0x80);
  assert_true(signbit(red_half_to_float(0x8000)) && red_half_to_float(0x8000) == 0.0f);
  assert_true(signbit(red_e4m3_to_float(0x80)) && signbit(red_e5m2_to_float(0x80)));
  /* NaN: quiet, and never turned into inf by dropping payload bits. */
  float snan = u2f(0x7f800001u);
  assert_int_equal(red_float_to_half(snan) & 0x7e00, 0x7e00);
  assert_int_equal(red_float_to_bf16(snan) & 0x7fc0, 0x7fc0);
  assert_int_equal(red_float_to_e4m3(snan), 0x7f);
  assert_int_equal(red_float_to_e4m3(-NAN), 0xff);
  assert_true(isnan(red_e5m2_to_float(red_float_to_e5m2(snan))));
  assert_true(isnan(red_e4m3_to_float(0x7f)) && isnan(red_e4m3_to_float(0xff)));
  assert_true(f2u(red_half_to_float(0x7c01)) & 0x00400000u); /* sNaN comes back quiet */
}

/* ---- element reference -------------------------------------------------------------- */

/* Pointers are element-aligned (offset by whole elements), so typed loads are fine. */
static const unsigned char elem_size[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static uint64_t ld_bits(int dt, const void* p, size_t i) {
  switch (elem_size[dt]) {
    case 1: return ((const uint8_t*)p)[i];
    case 2: return ((const uint16_t*)p)[i];
    case 4: return ((const uint32_t*)p)[i];
    default: return ((const uint64_t*)p)[i];
  }
}
static int64_t ld_signed(int dt, const void* p, size_t i) {
  switch (dt) {
    case ncclInt8: return ((const int8_t*)p)[i];
    case ncclInt32: return ((const int32_t*)p)[i];
    default: return ((const int64_t*)p)[i];
  }
}
static int narrow_fmt(int dt) {
  return dt == ncclFloat16 ? F_HALF : dt == ncclBfloat16 ? F_BF16 : dt == ncclFloat8e4m3 ? F_E4M3 : F_E5M2;
}

/* IEEE 754-2019 maximum / minimum: NaN if either is NaN, -0 < +0. */
static double ref_max(double x, double y) {
  if (isnan(x) || isnan(y)) return NAN;
  if (x == 0 && y == 0) return signbit(x) && signbit(y) ? -0.0 : 0.0;
  return x > y ? x : y;
}
static double ref_min(double x, double y) {
  if (isnan(x) || isnan(y)) return NAN;
  if (x == 0 && y == 0) return signbit(x) || signbit(y) ? -0.0 : 0.0;
  return x < y ? x : y;
}

/* pre(b) for element i, as raw bits. */
static uint64_t ref_pre(const struct red_op* r, const void* b, size_t i) {
  int dt = r->dt;
  uint64_t y = ld_bits(dt, b, i);
  if (r->kind != RED_PREMULSUM) return y;
  if (is_int_type(dt)) return y * r->scalar.u; /* low bytes are what is stored */
  if (dt == ncclFloat32) {
    float p = u2f((uint32_t)y) * (float)r->scalar.f;
    return f2u(p);
  }
  if (dt == ncclFloat64) {
    double v;
    memcpy(&v, &y, sizeof v);
    v = v * r->scalar.f;
    memcpy(&y, &v, sizeof v);
    return y;
  }
  int fm = narrow_fmt(dt);
  return lib_from_float(fm, lib_to_float(fm, (uint32_t)y) * (float)r->scalar.f);
}

/* a OP pre(b) for element i, as raw bits (in the low bytes). */
static uint64_t ref_elem(const struct red_op* r, const void* a, const void* b, size_t i) {
  int dt = r->dt, kind = r->kind;
  uint64_t x = ld_bits(dt, a, i), y = ref_pre(r, b, i);
  if (is_int_type(dt)) {
    switch (kind) {
      case RED_SUM:
      case RED_PREMULSUM: return x + y;
      case RED_PROD: return x * y;
      default: break;
    }
    int take_x;
    if (is_signed_int(dt)) {
      int64_t sx = ld_signed(dt, a, i), sy = ld_signed(dt, b, i);
      take_x = kind == RED_MAX ? sx > sy : sx < sy;
    } else {
      take_x = kind == RED_MAX ? x > y : x < y;
    }
    return take_x ? x : y;
  }
  if (dt == ncclFloat64) {
    double dx, dy, d;
    memcpy(&dx, &x, sizeof dx);
    memcpy(&dy, &y, sizeof dy);
    switch (kind) {
      case RED_PROD: d = dx * dy; break;
      case RED_MAX: d = ref_max(dx, dy); break;
      case RED_MIN: d = ref_min(dx, dy); break;
      default: d = dx + dy; break;
    }
    uint64_t o;
    memcpy(&o, &d, sizeof o);
    return o;
  }
  int fm = dt == ncclFloat32 ? -1 : narrow_fmt(dt);
  float fx = fm < 0 ? u2f((uint32_t)x) : lib_to_float(fm, (uint32_t)x);
  float fy = fm < 0 ? u2f((uint32_t)y) : lib_to_float(fm, (uint32_t)y);
  float f;
  switch (kind) {
    case RED_PROD: f = fx * fy; break;
    case RED_MAX: f = (float)ref_max(fx, fy); break;
    case RED_MIN: f = (float)ref_min(fx, fy); break;
    default: f = fx + fy; break;
  }
  return fm < 0 ? f2u(f) : lib_from_float(fm, f);
}

static int is_nan_bits(int dt, uint64_t v) {
  switch (dt) {
    case ncclFloat32: return isnan(u2f((uint32_t)v));
    case ncclFloat64: {
      double d;
      memcpy(&d, &v, sizeof d);
      return isnan(d);
    }
    case ncclFloat16:
    case ncclBfloat16:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return isnan(ref_decode(narrow_fmt(dt), (uint32_t)v));
    default: return 0;
  }
}

/* Same element: identical bits, or both NaN (payloads may differ). */
static int same_elem(int dt, uint64_t got, uint64_t want) {
  size_t es = elem_size[dt];
  uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
  got &= mask;
  want &= mask;
  return got == want || (is_nan_bits(dt, got) && is_nan_bits(dt, want));
}

/* Random contents: integers any bits; floats mostly moderate normal values
 * (so sums round and cancel) with 1 in 16 arbitrary bit patterns (inf, NaN,
 * subnormals); narrow formats any code. */
static void fill(int dt, void* p, size_t count) {
  for (size_t i = 0; i < count; i++) {
    uint64_t v = rng();
    if (dt == ncclFloat32 && (v >> 60) != 0) {
      uint32_t e = 120 + (uint32_t)((v >> 32) % 16);
      v = ((uint32_t)v & 0x807fffffu) | (e << 23);
    } else if (dt == ncclFloat64 && (v >> 60) != 0) {
      uint64_t e = 1016 + (v >> 32) % 16;
      v = (v & 0x800fffffffffffffull) | (e << 52);
    }
    memcpy((char*)p + i * dtype_size((ncclDataType_t)dt), &v, dtype_size((ncclDataType_t)dt));
  }
}

/* One scalar per type for premulsum: negative / large for integers (wrap),
 * 0.3 (inexact) for floats. */
static void make_op(struct red_op* r, int dt, int kind) {
  if (kind != RED_PREMULSUM) {
    assert_int_equal(red_op_init(r, (ncclRedOp_t)kind, (ncclDataType_t)dt), 0);
    return;
  }
  unsigned char buf[8];
  int64_t si = -3;
  uint64_t ui = 0x9e3779b97f4a7c15ull;
  float f = 0.3f;
  double d = 0.3;
  uint16_t h;
  uint8_t q;
  switch (dt) {
    case ncclInt8:
    case ncclInt32:
    case ncclInt64: memcpy(buf, &si, 8); break; /* little-endian: low bytes are -3 */
    case ncclUint8:
    case ncclUint32:
    case ncclUint64: memcpy(buf, &ui, 8); break;
    case ncclFloat32: memcpy(buf, &f, 4); break;
    case ncclFloat64: memcpy(buf, &d, 8); break;
    case ncclFloat16:
      h = red_float_to_half(0.3f);
      memcpy(buf, &h, 2);
      break;
    case ncclBfloat16:
      h = red_float_to_bf16(0.3f);
      memcpy(buf, &h, 2);
      break;
    case ncclFloat8e4m3:
      q = red_float_to_e4m3(0.3f);
      buf[0] = q;
      break;
    default:
      q = red_float_to_e5m2(0.3f);
      buf[0] = q;
      break;
  }
  assert_int_equal(red_op_init_premulsum(r, buf, (ncclDataType_t)dt), 0);
}

static const char* kind_name(int k) {
  static const char* n[] = {"sum", "prod", "max", "min", "premulsum"};
  return n[k];
}

static void compare_buf(int dt, int kind, const char* what, const void* got, const void* want, size_t count) {
  for (size_t i = 0; i < count; i++) {
    uint64_t g = ld_bits(dt, got, i), w = ld_bits(dt, want, i);
    if (!same_elem(dt, g, w))
      fail_msg("%s %s %s: element %zu of %zu is 0x%llx, want 0x%llx", what, dtype_name((ncclDataType_t)dt),
               kind_name(kind), i, count, (unsigned long long)g, (unsigned long long)w);
  }
}

/* ---- kernel tests ------------------------------------------------------------------------ */

/* Every dtype x op x count, through pointers one element past malloc's
 * alignment, against the element reference; red_pre likewise. */
static void test_reduce_all(void** state) {
  (void)state;
  static const size_t counts[] = {0, 1, 7, 1000, 1000003};
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
      size_t n = counts[ci];
      char* ab = malloc((n + 1) * es);
      char* bb = malloc((n + 1) * es);
      char* db = malloc((n + 1) * es);
      assert_non_null(ab);
      assert_non_null(bb);
      assert_non_null(db);
      char *a = ab + es, *b = bb + es, *d = db + es;
      fill(dt, a, n);
      fill(dt, b, n);
      for (int kind = 0; kind <= RED_PREMULSUM; kind++) {
        struct red_op r;
        make_op(&r, dt, kind);
        memset(db, 0xa5, (n + 1) * es);
        red_reduce(&r, d, a, b, n);
        for (size_t i = 0; i < n; i++) {
          uint64_t g = ld_bits(dt, d, i), w = ref_elem(&r, a, b, i);
          if (!same_elem(dt, g, w))
            fail_msg("%s %s count %zu: element %zu: a 0x%llx b 0x%llx -> 0x%llx, want 0x%llx", dtype_name(r.dt),
                     kind_name(kind), n, i, (unsigned long long)ld_bits(dt, a, i),
                     (unsigned long long)ld_bits(dt, b, i), (unsigned long long)g, (unsigned long long)w);
        }
        for (size_t j = 0; j < es; j++) assert_int_equal((unsigned char)db[j], 0xa5); /* nothing before dst */
        red_pre(&r, d, b, n);
        for (size_t i = 0; i < n; i++) {
          uint64_t g = ld_bits(dt, d, i), w = ref_pre(&r, b, i);
          if (!same_elem(dt, g, w))
            fail_msg("pre %s %s count %zu: element %zu -> 0x%llx, want 0x%llx", dtype_name(r.dt), kind_name(kind), n, i,
                     (unsigned long long)g, (unsigned long long)w);
        }
      }
      free(ab);
      free(bb);
      free(db);
    }
  }
}

/* dst == a, dst == b, dst == a == b give the same result as separate buffers. */
static void test_reduce_alias(void** state) {
  (void)state;
  static const size_t counts[] = {1, 1003, 20011};
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
      size_t n = counts[ci], bytes = n * es;
      char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes), *d = malloc(bytes);
      assert_true(a && b && want && d);
      fill(dt, a, n);
      fill(dt, b, n);
      for (int kind = 0; kind <= RED_PREMULSUM; kind++) {
        struct red_op r;
        make_op(&r, dt, kind);
        red_reduce(&r, want, a, b, n);
        memcpy(d, a, bytes);
        red_reduce(&r, d, d, b, n);
        compare_buf(dt, kind, "dst==a", d, want, n);
        memcpy(d, b, bytes);
        red_reduce(&r, d, a, d, n);
        compare_buf(dt, kind, "dst==b", d, want, n);
        red_reduce(&r, want, a, a, n);
        memcpy(d, a, bytes);
        red_reduce(&r, d, d, d, n);
        compare_buf(dt, kind, "dst==a==b", d, want, n);
        red_pre(&r, want, b, n);
        memcpy(d, b, bytes);
        red_pre(&r, d, d, n);
        compare_buf(dt, kind, "pre dst==src", d, want, n);
      }
      free(a);
      free(b);
      free(want);
      free(d);
    }
  }
}

/* red_reduce_n equals red_pre + a chain of red_reduce, for n = 1..8, over
 * several internal blocks, also when dst is the first or the last source. */
static void test_reduce_n(void** state) {
  (void)state;
  enum { NMAX = 8 };
  const size_t n = 20011;
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt), bytes = n * es;
    char* src[NMAX];
    for (int k = 0; k < NMAX; k++) {
      src[k] = malloc(bytes);
      assert_non_null(src[k]);
      fill(dt, src[k], n);
    }
    char *want = malloc(bytes), *d = malloc(bytes);
    assert_true(want && d);
    for (int kind = 0; kind <= RED_PREMULSUM; kind++) {
      struct red_op r;
      make_op(&r, dt, kind);
      for (int nsrc = 1; nsrc <= NMAX; nsrc++) {
        red_pre(&r, want, src[0], n);
        for (int k = 1; k < nsrc; k++) red_reduce(&r, want, want, src[k], n);
        const void* s[NMAX];
        for (int k = 0; k < NMAX; k++) s[k] = src[k];
        memset(d, 0x5a, bytes);
        red_reduce_n(&r, d, s, nsrc, n);
        compare_buf(dt, kind, "reduce_n", d, want, n);
        for (int j = 0; j<nsrc; j += nsrc - 1> 0 ? nsrc - 1 : 1) { /* dst is src[0], then src[nsrc-1] */
          memcpy(d, src[j], bytes);
          s[j] = d;
          red_reduce_n(&r, d, s, nsrc, n);
          s[j] = src[j];
          compare_buf(dt, kind, "reduce_n aliased", d, want, n);
        }
      }
    }
    for (int k = 0; k < NMAX; k++) free(src[k]);
    free(want);
    free(d);
  }
}

/* Every byte of [base, base + total) outside [dst, dst + len) still holds
 * the 0x5a it was filled with. */
static void assert_only_dst(const char* base, size_t total, const char* dst, size_t len) {
  for (const char* p = base; p < dst; p++) assert_int_equal((unsigned char)*p, 0x5a);
  for (const char* p = dst + len; p < base + total; p++) assert_int_equal((unsigned char)*p, 0x5a);
}

/* red_reduce_out equals red_reduce (then red_div for avg_n > 1), into dst
 * and into copy, for every type and operator, over several internal blocks,
 * with dst at every offset from a 16-byte boundary (the non-temporal body
 * and the copied ends), counts that end inside a block and inside a line,
 * and without touching a byte outside dst. */
static void test_reduce_out(void** state) {
  (void)state;
  const size_t counts[] = {1, 3, 17, 1000, 4097, 20011};
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt), nmax = 20011, bytes = nmax * es;
    char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes), *copy = malloc(bytes);
    char* base = malloc(bytes + 64 + 64);
    assert_true(a && b && want && copy && base);
    fill(dt, a, nmax);
    fill(dt, b, nmax);
    for (int kind = 0; kind <= RED_PREMULSUM; kind++) {
      struct red_op r;
      make_op(&r, dt, kind);
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t n = counts[ci];
        for (int avg = 0; avg <= 3; avg += 3) {
          red_reduce(&r, want, a, b, n);
          if (avg) red_div((ncclDataType_t)dt, want, want, n, avg);
          for (size_t mis = 0; mis < 32; mis += es) {
            int far = mis >= 16; /* the same offsets again, `a` prefetched ahead */
            /* dst 64 bytes into base (a line boundary) plus the offset. */
            char* dst = (char*)(((uintptr_t)base + 63) & ~(uintptr_t)63) + mis % 16;
            memset(base, 0x5a, bytes + 128);
            red_reduce_out(&r, dst, mis % 16 ? NULL : copy, a, b, n, avg, far);
            compare_buf(dt, kind, "reduce_out", dst, want, n);
            if (!(mis % 16)) compare_buf(dt, kind, "reduce_out copy", copy, want, n);
            assert_only_dst(base, bytes + 128, dst, n * es);
          }
        }
      }
    }
    free(a);
    free(b);
    free(want);
    free(copy);
    free(base);
  }
}

/* red_reduce_far equals red_reduce bit for bit, for every type and operator,
 * at counts that end before, at and after its blocks and prefetch distance,
 * with the far source at every offset from a line, the destination distinct
 * or the local source or the far one, and writes nothing outside dst. */
static void test_reduce_far(void** state) {
  (void)state;
  const size_t counts[] = {1, 17, 1024, 1025, 2048, 4097, 9000, 20011};
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt), nmax = 20011, bytes = nmax * es;
    char *fbase = malloc(bytes + 64), *b = malloc(bytes), *want = malloc(bytes), *base = malloc(bytes + 128);
    assert_true(fbase && b && want && base);
    fill(dt, fbase, nmax + 64 / es);
    fill(dt, b, nmax);
    for (int kind = 0; kind <= RED_PREMULSUM; kind++) {
      struct red_op r;
      make_op(&r, dt, kind);
      for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t n = counts[ci];
        for (size_t mis = 0; mis < 64; mis += 16 > es ? 16 : es) {
          char* far = fbase + mis;
          red_reduce(&r, want, far, b, n);
          char* dst = (char*)(((uintptr_t)base + 63) & ~(uintptr_t)63);
          memset(base, 0x5a, bytes + 128);
          red_reduce_far(&r, dst, far, b, n);
          compare_buf(dt, kind, "reduce_far", dst, want, n);
          assert_only_dst(base, bytes + 128, dst, n * es);
          /* In place, into the local source, then into the far one. */
          memcpy(dst, b, n * es);
          red_reduce_far(&r, dst, far, dst, n);
          compare_buf(dt, kind, "reduce_far into b", dst, want, n);
          char* keep = malloc(n * es);
          assert_non_null(keep);
          memcpy(keep, far, n * es);
          red_reduce_far(&r, far, far, b, n);
          compare_buf(dt, kind, "reduce_far into far", far, want, n);
          memcpy(far, keep, n * es);
          free(keep);
        }
      }
    }
    free(fbase);
    free(b);
    free(want);
    free(base);
  }
}

/* red_copy_far copies exactly n bytes at every destination offset from a
 * 16-byte boundary and every length around a line. */
static void test_copy_far(void** state) {
  (void)state;
  enum { MAX = 3000 };
  /* Sources start up to 7 bytes in. */
  unsigned char src[MAX + 8], buf[MAX + 128];
  for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(rng() | 1);
  const size_t lens[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 2999};
  for (size_t mis = 0; mis < 64; mis++) {
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
      size_t n = lens[li];
      unsigned char* dst = (unsigned char*)(((uintptr_t)buf + 63) & ~(uintptr_t)63) + mis;
      memset(buf, 0, sizeof buf);
      red_copy_far(dst, src + (mis & 7), n);
      assert_memory_equal(dst, src + (mis & 7), n);
      for (unsigned char* p = buf; p < dst; p++) assert_int_equal(*p, 0);
      for (unsigned char* p = dst + n; p < buf + sizeof buf; p++) assert_int_equal(*p, 0);
    }
  }
}

static void test_premulsum_scalars(void** state) {
  (void)state;
  struct red_op r;
  /* float: 1 + 4*0.5, 2 + 8*0.5 */
  float fs = 0.5f, fa[2] = {1, 2}, fb[2] = {4, 8}, fd[2];
  assert_int_equal(red_op_init_premulsum(&r, &fs, ncclFloat32), 0);
  assert_int_equal(r.kind, RED_PREMULSUM);
  red_reduce(&r, fd, fa, fb, 2);
  assert_true(fd[0] == 3.0f && fd[1] == 6.0f);
  red_pre(&r, fd, fb, 2);
  assert_true(fd[0] == 2.0f && fd[1] == 4.0f);
  /* double */
  double ds = -0.25, da[1] = {1}, db[1] = {8}, dd[1];
  assert_int_equal(red_op_init_premulsum(&r, &ds, ncclFloat64), 0);
  red_reduce(&r, dd, da, db, 1);
  assert_true(dd[0] == -1.0);
  /* int32: 10 + 7*(-2) */
  int32_t is = -2, ia[2] = {10, INT32_MAX}, ib[2] = {7, -1}, id[2];
  assert_int_equal(red_op_init_premulsum(&r, &is, ncclInt32), 0);
  assert_true(r.scalar.i == -2);
  red_reduce(&r, id, ia, ib, 2);
  assert_int_equal(id[0], -4);
  assert_int_equal(id[1], INT32_MIN + 1); /* INT32_MAX + 2 wraps */
  /* uint8: 1 + 3*200 = 601 = 89 mod 256 */
  uint8_t us = 200, ua[1] = {1}, ub[1] = {3}, ud[1];
  assert_int_equal(red_op_init_premulsum(&r, &us, ncclUint8), 0);
  red_reduce(&r, ud, ua, ub, 1);
  assert_int_equal(ud[0], 89);
  /* int64 */
  int64_t ls = -1, la[1] = {5}, lb[1] = {INT64_MIN}, ld[1];
  assert_int_equal(red_op_init_premulsum(&r, &ls, ncclInt64), 0);
  red_reduce(&r, ld, la, lb, 1);
  assert_true(ld[0] == INT64_MIN + 5); /* -INT64_MIN wraps to INT64_MIN */
  /* half: 1 + 3*0.25 = 1.75, and the scaled input rounds to half first */
  uint16_t hs = red_float_to_half(0.25f);
  uint16_t ha[2] = {red_float_to_half(1.0f), red_float_to_half(2048.0f)};
  uint16_t hb[2] = {red_float_to_half(3.0f), red_float_to_half(4.0f)};
  uint16_t hd[2];
  assert_int_equal(red_op_init_premulsum(&r, &hs, ncclFloat16), 0);
  assert_true(r.scalar.f == 0.25);
  red_reduce(&r, hd, ha, hb, 2);
  assert_int_equal(hd[0], red_float_to_half(1.75f));
  assert_int_equal(hd[1], red_float_to_half(2048.0f)); /* 2048 + 1: tie, even */
  /* bf16 and fp8 scalars are read as their own type */
  uint16_t bs = red_float_to_bf16(-2.0f);
  assert_int_equal(red_op_init_premulsum(&r, &bs, ncclBfloat16), 0);
  assert_true(r.scalar.f == -2.0);
  uint8_t es8 = red_float_to_e4m3(0.5f);
  assert_int_equal(red_op_init_premulsum(&r, &es8, ncclFloat8e4m3), 0);
  assert_true(r.scalar.f == 0.5);
  es8 = red_float_to_e5m2(-4.0f);
  assert_int_equal(red_op_init_premulsum(&r, &es8, ncclFloat8e5m2), 0);
  assert_true(r.scalar.f == -4.0);
  assert_int_equal(red_op_init_premulsum(&r, NULL, ncclFloat32), -1);
  assert_int_equal(red_op_init_premulsum(&r, &fs, (ncclDataType_t)12), -1);
}

/* NaN propagation and signed zeros in max / min, for each floating type. */
static void test_maxmin_special(void** state) {
  (void)state;
  struct red_op r;
  float fa[4] = {NAN, 1.0f, 0.0f, -0.0f}, fb[4] = {1.0f, NAN, -0.0f, 0.0f}, fd[4];
  assert_int_equal(red_op_init(&r, ncclMax, ncclFloat32), 0);
  red_reduce(&r, fd, fa, fb, 4);
  assert_true(isnan(fd[0]) && isnan(fd[1]));
  assert_true(f2u(fd[2]) == 0 && f2u(fd[3]) == 0);
  assert_int_equal(red_op_init(&r, ncclMin, ncclFloat32), 0);
  red_reduce(&r, fd, fa, fb, 4);
  assert_true(isnan(fd[0]) && isnan(fd[1]));
  assert_true(f2u(fd[2]) == 0x80000000u && f2u(fd[3]) == 0x80000000u);
  double da[2] = {NAN, 0.0}, db[2] = {-INFINITY, -0.0}, dd[2];
  assert_int_equal(red_op_init(&r, ncclMin, ncclFloat64), 0);
  red_reduce(&r, dd, da, db, 2);
  assert_true(isnan(dd[0]) && dd[1] == 0 && signbit(dd[1]));
  uint16_t ha[3] = {0x7e00, 0x0000, 0x3c00}, hb[3] = {0x3c00, 0x8000, 0xfc00}, hd[3];
  assert_int_equal(red_op_init(&r, ncclMax, ncclFloat16), 0);
  red_reduce(&r, hd, ha, hb, 3);
  assert_true(isnan(red_half_to_float(hd[0])));
  assert_int_equal(hd[1], 0x0000);
  assert_int_equal(hd[2], 0x3c00);
  uint16_t ba[2] = {0x3f80, 0x8000}, bb[2] = {0x7fc1, 0x0000}, bd[2];
  assert_int_equal(red_op_init(&r, ncclMin, ncclBfloat16), 0);
  red_reduce(&r, bd, ba, bb, 2);
  assert_true(isnan(red_bf16_to_float(bd[0])));
  assert_int_equal(bd[1], 0x8000);
  uint8_t qa[2] = {0x7f, 0x00}, qb[2] = {0x38, 0x80}, qd[2];
  assert_int_equal(red_op_init(&r, ncclMax, ncclFloat8e4m3), 0);
  red_reduce(&r, qd, qa, qb, 2);
  assert_int_equal(qd[0] & 0x7f, 0x7f);
  assert_int_equal(qd[1], 0x00);
  /* fp8 sums saturate instead of overflowing */
  uint8_t sa[2] = {0x7e, 0x7b}, sb[2] = {0x7e, 0x7b};
  assert_int_equal(red_op_init(&r, ncclSum, ncclFloat8e4m3), 0);
  red_reduce(&r, qd, sa, sb, 1);
  assert_int_equal(qd[0], 0x7e);
  assert_int_equal(red_op_init(&r, ncclSum, ncclFloat8e5m2), 0);
  red_reduce(&r, qd, sa + 1, sb + 1, 1);
  assert_int_equal(qd[0], 0x7b);
}

static void test_div(void** state) {
  (void)state;
  static const int ns[] = {1, 2, 3, 7, 8};
  const size_t count = 4099;
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    size_t es = dtype_size((ncclDataType_t)dt);
    char *s = malloc((count + 1) * es), *d = malloc((count + 1) * es), *d2 = malloc(count * es);
    assert_true(s && d && d2);
    fill(dt, s + es, count);
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      int n = ns[ni];
      red_div((ncclDataType_t)dt, d + es, s + es, count, n);
      for (size_t i = 0; i < count; i++) {
        uint64_t x = ld_bits(dt, s + es, i), w;
        switch (dt) {
          case ncclInt8:
          case ncclInt32:
          case ncclInt64: w = (uint64_t)(ld_signed(dt, s + es, i) / n); break;
          case ncclUint8:
          case ncclUint32:
          case ncclUint64: w = x / (uint64_t)n; break;
          case ncclFloat32: w = f2u(u2f((uint32_t)x) / (float)n); break;
          case ncclFloat64: {
            double v;
            memcpy(&v, &x, sizeof v);
            v /= n;
            memcpy(&w, &v, sizeof w);
            break;
          }
          default: {
            int fm = narrow_fmt(dt);
            w = lib_from_float(fm, lib_to_float(fm, (uint32_t)x) / (float)n);
            break;
          }
        }
        uint64_t g = ld_bits(dt, d + es, i);
        if (!same_elem(dt, g, w))
          fail_msg("div %s by %d: element %zu: 0x%llx -> 0x%llx, want 0x%llx", dtype_name((ncclDataType_t)dt), n, i,
                   (unsigned long long)x, (unsigned long long)g, (unsigned long long)w);
      }
      memcpy(d2, s + es, count * es); /* in place */
      red_div((ncclDataType_t)dt, d2, d2, count, n);
      compare_buf(dt, RED_SUM, "div in place", d2, d + es, count);
    }
    free(s);
    free(d);
    free(d2);
  }
  /* Truncation toward zero, explicitly. */
  int8_t c[4] = {-7, 7, -128, 127};
  red_div(ncclInt8, c, c, 4, 2);
  assert_int_equal(c[0], -3);
  assert_int_equal(c[1], 3);
  assert_int_equal(c[2], -64);
  assert_int_equal(c[3], 63);
  int32_t i32[2] = {INT32_MIN, -5};
  red_div(ncclInt32, i32, i32, 2, 3);
  assert_int_equal(i32[0], INT32_MIN / 3);
  assert_int_equal(i32[1], -1);
  uint64_t u64[1] = {UINT64_MAX};
  red_div(ncclUint64, u64, u64, 1, 7);
  assert_true(u64[0] == UINT64_MAX / 7);
  uint16_t h[1] = {red_float_to_half(1.0f)};
  red_div(ncclFloat16, h, h, 1, 3);
  assert_int_equal(h[0], red_float_to_half(1.0f / 3.0f));
}

static void test_dtype_and_init(void** state) {
  (void)state;
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  for (int dt = 0; dt < ncclNumTypes; dt++) {
    assert_true(dtype_valid((ncclDataType_t)dt));
    assert_int_equal(dtype_size((ncclDataType_t)dt), sizes[dt]);
  }
  assert_string_equal(dtype_name(ncclFloat32), "float32");
  assert_string_equal(dtype_name(ncclBfloat16), "bfloat16");
  assert_string_equal(dtype_name(ncclFloat8e4m3), "f8e4m3");
  assert_string_equal(dtype_name(ncclFloat8e5m2), "f8e5m2");
  assert_string_equal(dtype_name(ncclInt8), "int8");
  assert_false(dtype_valid((ncclDataType_t)12));
  assert_false(dtype_valid((ncclDataType_t)-1));
  assert_int_equal(dtype_size((ncclDataType_t)12), 0);
  assert_string_equal(dtype_name((ncclDataType_t)99), "invalid");

  struct red_op r;
  assert_int_equal(red_op_init(&r, ncclAvg, ncclFloat16), 0);
  assert_int_equal(r.kind, RED_SUM);
  assert_int_equal(r.dt, ncclFloat16);
  assert_int_equal(red_op_init(&r, ncclMin, ncclUint64), 0);
  assert_int_equal(r.kind, RED_MIN);
  r.kind = 42;
  assert_int_equal(red_op_init(&r, ncclNumOps, ncclFloat32), -1);
  assert_int_equal(red_op_init(&r, (ncclRedOp_t)-1, ncclFloat32), -1);
  assert_int_equal(red_op_init(&r, ncclSum, (ncclDataType_t)12), -1);
  assert_int_equal(r.kind, 42); /* untouched on failure */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtype_and_init),
      cmocka_unit_test(test_decode_exhaustive),
      cmocka_unit_test(test_roundtrip_exhaustive),
      cmocka_unit_test(test_encode_midpoints),
      cmocka_unit_test(test_encode_random),
      cmocka_unit_test(test_encode_specials),
      cmocka_unit_test(test_reduce_all),
      cmocka_unit_test(test_reduce_alias),
      cmocka_unit_test(test_reduce_n),
      cmocka_unit_test(test_reduce_out),
      cmocka_unit_test(test_reduce_far),
      cmocka_unit_test(test_copy_far),
      cmocka_unit_test(test_premulsum_scalars),
      cmocka_unit_test(test_maxmin_special),
      cmocka_unit_test(test_div),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
