/* One element of every reduction, as plain C that both gcc and nvcc compile:
 * the CUDA kernels (kernels.cu) are built from these functions, and the host
 * unit test (tests/gpu/test_elem.c) checks them bit for bit against
 * reduce_host.c, so the device path has the host path's semantics (see
 * reduce.h) without a GPU being needed to test that.
 *
 * Elements travel as their bit pattern in a uint64_t (low bytes). Integer
 * sum / prod / premulsum keep only the low bits of the type, exactly as the
 * host's unsigned arithmetic does. Callers must build the device code with
 * --fmad=false: the host is built with -ffp-contract=off, and a fused
 * multiply-add would round premulsum differently. */
#ifndef COLLIE_DEVICE_REDUCE_ELEM_H
#define COLLIE_DEVICE_REDUCE_ELEM_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RE_HD __host__ __device__ __forceinline__ static
#else
#define RE_HD static inline
#endif

/* Datatype codes are NCCL's (ncclInt8 = 0 ... ncclFloat8e5m2 = 11); red kinds are reduce.h's. */
enum { RE_I8, RE_U8, RE_I32, RE_U32, RE_I64, RE_U64, RE_F16, RE_F32, RE_F64, RE_BF16, RE_E4M3, RE_E5M2, RE_NTYPES };
enum { RE_SUM, RE_PROD, RE_MAX, RE_MIN, RE_PREMULSUM };

/* The premulsum scalar, as reduce.h's red_op stores it: f for float types, u (bits of an int64 or uint64) for integers. */
struct re_scalar {
  double f;
  uint64_t u;
};

RE_HD int re_size(int dt) { return dt == RE_I8 || dt == RE_U8 || dt == RE_E4M3 || dt == RE_E5M2 ? 1
                                   : dt == RE_F16 || dt == RE_BF16                                ? 2
                                   : dt == RE_I32 || dt == RE_U32 || dt == RE_F32                 ? 4
                                                                                                  : 8; }

RE_HD uint32_t re_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
RE_HD float re_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
RE_HD uint64_t re_d2u(double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
RE_HD double re_u2d(uint64_t u) {
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}
RE_HD uint32_t re_mask(int c) { return 0u - (uint32_t)c; }
RE_HD uint32_t re_sel(int c, uint32_t a, uint32_t b) {
  uint32_t m = re_mask(c);
  return (a & m) | (b & ~m);
}

/* IEEE 754-2019 maximum / minimum. NaN wins (x's if x is NaN, else y's).
 * Equal inputs are identical bit patterns except +0 / -0, where the AND
 * (max) or OR (min) of the bits picks +0 / -0 respectively. */
RE_HD float re_maxf(float x, float y) {
  float r = x > y ? x : y;
  r = x == y ? re_u2f(re_f2u(x) & re_f2u(y)) : r;
  return x != x ? x : r;
}
RE_HD float re_minf(float x, float y) {
  float r = x < y ? x : y;
  r = x == y ? re_u2f(re_f2u(x) | re_f2u(y)) : r;
  return x != x ? x : r;
}
RE_HD double re_maxd(double x, double y) {
  double r = x > y ? x : y;
  r = x == y ? re_u2d(re_d2u(x) & re_d2u(y)) : r;
  return x != x ? x : r;
}
RE_HD double re_mind(double x, double y) {
  double r = x < y ? x : y;
  r = x == y ? re_u2d(re_d2u(x) | re_d2u(y)) : r;
  return x != x ? x : r;
}

/* ---- conversions ------------------------------------------------------------------
 * Codes travel in the low bits of a uint32_t, so the host kernels
 * (reduce_host.c) stay in 32-bit lanes. All branch-free so the loops vectorise. Narrowing uses two
 * tricks:
 *  - normal results: add (half an ulp - 1 + the lowest kept bit) to the float's
 *    bits after rebiasing the exponent, then shift; carries into the exponent
 *    are the correct round-up.
 *  - subnormal results: add a power of two whose float ulp equals the target's
 *    subnormal spacing; the FPU's round-to-nearest-even does the rounding and
 *    the low mantissa bits are the result.
 * Widening subnormals subtracts two normal floats, so no step ever takes a
 * denormal operand (slow on x86). Signed 32-bit compares on magnitudes
 * (< 2^31) keep SSE2 code simple. Selects are masks, not ?: -- GCC would
 * otherwise sink the (possibly trapping, under the default -ftrapping-math)
 * float add into a branch and give up vectorising. */

/* binary16 -> float. A signalling NaN stays signalling here (every kernel
 * narrows its result again, which quiets it); red_half_to_float quiets. */
RE_HD float re_h2f(uint32_t h) {
  uint32_t e13 = (h & 0x7fffu) << 13; /* exponent and mantissa, float-aligned */
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t u = e13 + (112u << 23);                                /* rebias 15 -> 127 */
  u += re_mask((int32_t)e13 >= (0x7c00 << 13)) & (112u << 23);   /* inf / NaN: exponent 255 */
  uint32_t sub = re_f2u(re_u2f(e13 + (113u << 23)) - 0x1p-14f); /* 2^-14 (1 + m/1024) - 2^-14 */
  u = re_sel((int32_t)e13 < (0x400 << 13), sub, u);
  return re_u2f(u | sign);
}

RE_HD uint32_t re_f2h(float f) {
  uint32_t x = re_f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t ax = (int32_t)(x & 0x7fffffffu);
  uint32_t r = ((uint32_t)ax - (112u << 23) + 0xfffu + (((uint32_t)ax >> 13) & 1u)) >> 13;
  uint32_t sub = re_f2u(re_u2f((uint32_t)ax) + 0.5f) - 0x3f000000u; /* 0.5 has ulp 2^-24 */
  r = re_sel(ax < 0x38800000, sub, r);                               /* below 2^-14: subnormal */
  /* >= 65520 rounds to inf; NaN keeps its top payload bits, made quiet. */
  uint32_t nan = re_mask(ax > 0x7f800000) & (0x200u | (((uint32_t)ax >> 13) & 0x3ffu));
  r = re_sel(ax >= 0x477ff000, 0x7c00u | nan, r);
  return r | sign;
}

RE_HD float re_b2f(uint32_t h) { return re_u2f(h << 16); }

RE_HD uint32_t re_f2b(float f) {
  uint32_t x = re_f2u(f);
  uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* overflow carries into inf */
  int32_t ax = (int32_t)(x & 0x7fffffffu);
  return re_sel(ax > 0x7f800000, (x >> 16) | 0x40u, r);
}

RE_HD float re_e4m3_2f(uint32_t v) {
  uint32_t e20 = (v & 0x7fu) << 20;
  uint32_t sign = (v & 0x80u) << 24;
  uint32_t u = e20 + (120u << 23); /* rebias 7 -> 127 */
  uint32_t sub = re_f2u(re_u2f(e20 + (121u << 23)) - 0x1p-6f);
  u = re_sel((int32_t)e20 < (8 << 20), sub, u);
  u = re_sel((int32_t)e20 == (0x7f << 20), 0x7fc00000u, u); /* S.1111.111 */
  return re_u2f(u | sign);
}

RE_HD uint32_t re_f2e4m3(float f) {
  uint32_t x = re_f2u(f);
  uint32_t sign = (x >> 24) & 0x80u;
  int32_t ax = (int32_t)(x & 0x7fffffffu);
  uint32_t r = ((uint32_t)ax - (120u << 23) + 0x7ffffu + (((uint32_t)ax >> 20) & 1u)) >> 20;
  uint32_t sub = re_f2u(re_u2f((uint32_t)ax) + 0x1p14f) - 0x46800000u; /* 2^14 has ulp 2^-9 */
  r = re_sel(ax < 0x3c800000, sub, r);                                  /* below 2^-6: subnormal */
  r = re_sel(ax > 0x43e00000, 0x7eu, r);                                /* beyond 448 (and inf): saturate */
  r = re_sel(ax > 0x7f800000, 0x7fu, r);
  return r | sign;
}

/* E5M2 is the top byte of binary16, so widening is the half path. */
RE_HD float re_e5m2_2f(uint32_t v) { return re_h2f(v << 8); }

RE_HD uint32_t re_f2e5m2(float f) {
  uint32_t x = re_f2u(f);
  uint32_t sign = (x >> 24) & 0x80u;
  int32_t ax = (int32_t)(x & 0x7fffffffu);
  uint32_t r = ((uint32_t)ax - (112u << 23) + 0xfffffu + (((uint32_t)ax >> 21) & 1u)) >> 21;
  uint32_t sub = re_f2u(re_u2f((uint32_t)ax) + 128.0f) - 0x43000000u; /* 128 has ulp 2^-16 */
  r = re_sel(ax < 0x38800000, sub, r);                                 /* below 2^-14: subnormal */
  r = re_sel(ax > 0x47600000, 0x7bu, r);                               /* beyond 57344 (and inf): saturate */
  r = re_sel(ax > 0x7f800000, 0x7eu, r);
  return r | sign;
}

/* Narrow types: code -> float and back. */
RE_HD float re_nto_f(int dt, uint64_t x) {
  uint32_t c = (uint32_t)x;
  return dt == RE_F16 ? re_h2f(c & 0xffffu) : dt == RE_BF16 ? re_b2f(c & 0xffffu) : dt == RE_E4M3 ? re_e4m3_2f(c & 0xffu) : re_e5m2_2f(c & 0xffu);
}
RE_HD uint64_t re_nfrom_f(int dt, float f) {
  return dt == RE_F16 ? re_f2h(f) : dt == RE_BF16 ? re_f2b(f) : dt == RE_E4M3 ? re_f2e4m3(f) : re_f2e5m2(f);
}
RE_HD int re_is_narrow(int dt) { return dt == RE_F16 || dt == RE_BF16 || dt == RE_E4M3 || dt == RE_E5M2; }
RE_HD int re_is_signed_int(int dt) { return dt == RE_I8 || dt == RE_I32 || dt == RE_I64; }
RE_HD uint64_t re_low(int dt, uint64_t v) {
  int s = re_size(dt);
  return s == 8 ? v : v & ((1ull << (8 * s)) - 1);
}
/* Sign-extends an integer element to int64. */
RE_HD int64_t re_sext(int dt, uint64_t v) {
  return dt == RE_I8 ? (int64_t)(int8_t)(uint8_t)v : dt == RE_I32 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
}

/* The scalar of a premulsum operator from one element of type dt in memory
 * (what red_op_init_premulsum does; the device reads it at run time when the
 * scalar is device-resident). */
RE_HD struct re_scalar re_scalar_load(int dt, const void* p) {
  struct re_scalar s = {0, 0};
  const unsigned char* b = (const unsigned char*)p;
  switch (dt) {
    case RE_I8: s.u = (uint64_t)(int64_t)(int8_t)b[0]; break;
    case RE_U8: s.u = b[0]; break;
    case RE_I32: { int32_t v; memcpy(&v, b, 4); s.u = (uint64_t)(int64_t)v; break; }
    case RE_U32: { uint32_t v; memcpy(&v, b, 4); s.u = v; break; }
    case RE_I64:
    case RE_U64: memcpy(&s.u, b, 8); break;
    case RE_F32: { float v; memcpy(&v, b, 4); s.f = v; break; }
    case RE_F64: memcpy(&s.f, b, 8); break;
    case RE_F16:
    case RE_BF16: { uint16_t v; memcpy(&v, b, 2); s.f = dt == RE_F16 ? re_h2f(v) : re_b2f(v); break; }
    default: s.f = dt == RE_E4M3 ? re_e4m3_2f(b[0]) : re_e5m2_2f(b[0]); break;
  }
  return s;
}

/* pre(y): the identity, or y * scalar for premulsum (red_pre). */
RE_HD uint64_t re_scale(int dt, uint64_t y, struct re_scalar s) {
  if (re_is_narrow(dt)) return re_nfrom_f(dt, re_nto_f(dt, y) * (float)s.f);
  if (dt == RE_F32) return re_f2u(re_u2f((uint32_t)y) * (float)s.f);
  if (dt == RE_F64) return re_d2u(re_u2d(y) * s.f);
  return re_low(dt, y * s.u);
}

/* a OP pre(b) (red_reduce); `a` has been through pre() already. */
RE_HD uint64_t re_reduce(int dt, int kind, uint64_t x, uint64_t y, struct re_scalar s) {
  if (re_is_narrow(dt)) {
    float fx = re_nto_f(dt, x), fy = re_nto_f(dt, y), r;
    switch (kind) {
      case RE_SUM: r = fx + fy; break;
      case RE_PROD: r = fx * fy; break;
      case RE_MAX: r = re_maxf(fx, fy); break;
      case RE_MIN: r = re_minf(fx, fy); break;
      default: r = fx + re_nto_f(dt, re_nfrom_f(dt, fy * (float)s.f)); break;
    }
    return re_nfrom_f(dt, r);
  }
  if (dt == RE_F32) {
    float fx = re_u2f((uint32_t)x), fy = re_u2f((uint32_t)y), r;
    switch (kind) {
      case RE_SUM: r = fx + fy; break;
      case RE_PROD: r = fx * fy; break;
      case RE_MAX: r = re_maxf(fx, fy); break;
      case RE_MIN: r = re_minf(fx, fy); break;
      default: {
        float t = fy * (float)s.f;
        r = fx + t;
        break;
      }
    }
    return re_f2u(r);
  }
  if (dt == RE_F64) {
    double fx = re_u2d(x), fy = re_u2d(y), r;
    switch (kind) {
      case RE_SUM: r = fx + fy; break;
      case RE_PROD: r = fx * fy; break;
      case RE_MAX: r = re_maxd(fx, fy); break;
      case RE_MIN: r = re_mind(fx, fy); break;
      default: {
        double t = fy * s.f;
        r = fx + t;
        break;
      }
    }
    return re_d2u(r);
  }
  switch (kind) {
    case RE_SUM: return re_low(dt, x + y);
    case RE_PROD: return re_low(dt, x * y);
    case RE_MAX:
      if (re_is_signed_int(dt)) return re_sext(dt, x) > re_sext(dt, y) ? x : y;
      return x > y ? x : y;
    case RE_MIN:
      if (re_is_signed_int(dt)) return re_sext(dt, x) < re_sext(dt, y) ? x : y;
      return x < y ? x : y;
    default: return re_low(dt, x + re_low(dt, y * s.u));
  }
}

/* ncclAvg's final division by n (red_div): truncating for integers. */
RE_HD uint64_t re_div(int dt, uint64_t x, int n) {
  if (n < 1) n = 1;
  if (re_is_narrow(dt)) return re_nfrom_f(dt, re_nto_f(dt, x) / (float)n);
  if (dt == RE_F32) return re_f2u(re_u2f((uint32_t)x) / (float)n);
  if (dt == RE_F64) return re_d2u(re_u2d(x) / (double)n);
  if (re_is_signed_int(dt)) return re_low(dt, (uint64_t)(re_sext(dt, x) / (int64_t)n));
  return x / (uint64_t)n;
}

#endif
