/* Host reduction kernels (see reduce.h for the semantics). Every loop is
 * written so that GCC -O3 vectorises it with baseline SSE2: branch-free
 * element bodies, restrict-qualified pointers when the destination is
 * distinct, and an ivdep loop when it is exactly one of the sources (same
 * index read before it is written, so there is no loop-carried dependence).
 * Built with -O3 -ffp-contract=off (CMakeLists.txt): no fused multiply-add, so
 * premulsum rounds the product exactly as red_pre does. The conversions and
 * max / min are reduce_elem.h's, shared with the CUDA kernels; their
 * branch-free forms are what lets these loops vectorise. */
#include "device/reduce.h"

#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

#include "device/reduce_elem.h"

/* ---- helpers ------------------------------------------------------------------ */

#if defined(__clang__)
/* clang warns where the request cannot be met (some fp8 loops); that is fine. */
#pragma clang diagnostic ignored "-Wpass-failed"
#define RED_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define RED_IVDEP _Pragma("GCC ivdep")
#else
#define RED_IVDEP
#endif

static float red_quiet(float f) { return f != f ? re_u2f(re_f2u(f) | 0x00400000u) : f; }

float red_half_to_float(uint16_t h) { return red_quiet(re_h2f(h)); }
uint16_t red_float_to_half(float f) { return (uint16_t)re_f2h(f); }
float red_bf16_to_float(uint16_t h) { return re_b2f(h); }
uint16_t red_float_to_bf16(float f) { return (uint16_t)re_f2b(f); }
float red_e4m3_to_float(uint8_t v) { return re_e4m3_2f(v); }
uint8_t red_float_to_e4m3(float f) { return (uint8_t)re_f2e4m3(f); }
float red_e5m2_to_float(uint8_t v) { return red_quiet(re_e5m2_2f(v)); }
uint8_t red_float_to_e5m2(float f) { return (uint8_t)re_f2e5m2(f); }

/* ---- datatypes ------------------------------------------------------------------ */

static const char* const red_dtype_names[ncclNumTypes] = {"int8",    "uint8",    "int32",   "uint32",
                                                          "int64",   "uint64",   "float16", "float32",
                                                          "float64", "bfloat16", "f8e4m3",  "f8e5m2"};

const char* dtype_name(ncclDataType_t dt) { return dtype_valid(dt) ? red_dtype_names[dt] : "invalid"; }

/* ---- kernel generators ------------------------------------------------------------ */

/* Binary kernel NAME: d[i] = EXPR(x = a[i], y = b[i], s = scalar). */
typedef void (*red_bin_fn)(void* d, const void* a, const void* b, size_t n, const struct red_op* r);

#define RED_BIN(NAME, T, ST, SINIT, EXPR)                                                          \
  static void NAME##_nr(T* restrict d, const T* restrict a, const T* restrict b, size_t n, ST s) { \
    (void)s;                                                                                       \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = a[i], y = b[i];                                                                        \
      d[i] = (T)(EXPR);                                                                            \
    }                                                                                              \
  }                                                                                                \
  static void NAME##_al(T* d, const T* a, const T* b, size_t n, ST s) {                            \
    (void)s;                                                                                       \
    RED_IVDEP for (size_t i = 0; i < n; i++) {                                                     \
      T x = a[i], y = b[i];                                                                        \
      d[i] = (T)(EXPR);                                                                            \
    }                                                                                              \
  }                                                                                                \
  static void NAME(void* d, const void* a, const void* b, size_t n, const struct red_op* r) {      \
    (void)r;                                                                                       \
    ST s = (ST)(SINIT);                                                                            \
    if (d == a || d == b)                                                                          \
      NAME##_al((T*)d, (const T*)a, (const T*)b, n, s);                                            \
    else                                                                                           \
      NAME##_nr((T*)d, (const T*)a, (const T*)b, n, s);                                            \
  }

/* Unary kernel NAME: d[i] = EXPR(x = a[i], s = scalar, k = int argument). */
typedef void (*red_un_fn)(void* d, const void* a, size_t n, const struct red_op* r, int k);

#define RED_UN(NAME, T, ST, SINIT, EXPR)                                              \
  static void NAME##_nr(T* restrict d, const T* restrict a, size_t n, ST s, int k) {  \
    (void)s;                                                                          \
    (void)k;                                                                          \
    for (size_t i = 0; i < n; i++) {                                                  \
      T x = a[i];                                                                     \
      d[i] = (T)(EXPR);                                                               \
    }                                                                                 \
  }                                                                                   \
  static void NAME##_al(T* d, const T* a, size_t n, ST s, int k) {                    \
    (void)s;                                                                          \
    (void)k;                                                                          \
    RED_IVDEP for (size_t i = 0; i < n; i++) {                                        \
      T x = a[i];                                                                     \
      d[i] = (T)(EXPR);                                                               \
    }                                                                                 \
  }                                                                                   \
  static void NAME(void* d, const void* a, size_t n, const struct red_op* r, int k) { \
    (void)r;                                                                          \
    ST s = (ST)(SINIT);                                                               \
    if (d == a)                                                                       \
      NAME##_al((T*)d, (const T*)a, n, s, k);                                         \
    else                                                                              \
      NAME##_nr((T*)d, (const T*)a, n, s, k);                                         \
  }

/* ---- integer kernels ---------------------------------------------------------------
 * Sum, prod and premulsum are the same bits for signed and unsigned types of
 * one width, so they run on the unsigned type (no signed-overflow UB). */
#define RED_INT_ARITH(SUF, UT)                                 \
  RED_BIN(red_sum_##SUF, UT, UT, 0, x + y)                     \
  RED_BIN(red_prod_##SUF, UT, UT, 0, x* y)                     \
  RED_BIN(red_pms_##SUF, UT, UT, r->scalar.u, x + (UT)(y * s)) \
  RED_UN(red_scale_##SUF, UT, UT, r->scalar.u, x* s)
#define RED_INT_ORDER(SUF, T)                    \
  RED_BIN(red_max_##SUF, T, T, 0, x > y ? x : y) \
  RED_BIN(red_min_##SUF, T, T, 0, x < y ? x : y)

RED_INT_ARITH(u8, uint8_t)
RED_INT_ARITH(u32, uint32_t)
RED_INT_ARITH(u64, uint64_t)
RED_INT_ORDER(i8, int8_t)
RED_INT_ORDER(u8, uint8_t)
RED_INT_ORDER(i32, int32_t)
RED_INT_ORDER(u32, uint32_t)
RED_INT_ORDER(i64, int64_t)
RED_INT_ORDER(u64, uint64_t)

/* Integer division truncates toward zero in C for signed types. */
RED_UN(red_div_i8, int8_t, int32_t, 0, x / k)
RED_UN(red_div_u8, uint8_t, uint32_t, 0, x / (uint32_t)k)
RED_UN(red_div_i32, int32_t, int32_t, 0, x / k)
RED_UN(red_div_u32, uint32_t, uint32_t, 0, x / (uint32_t)k)
RED_UN(red_div_i64, int64_t, int64_t, 0, x / (int64_t)k)
RED_UN(red_div_u64, uint64_t, uint64_t, 0, x / (uint64_t)k)

/* ---- float32 / float64 kernels ------------------------------------------------------- */
#define RED_FLOAT(SUF, T, MAX, MIN)                         \
  RED_BIN(red_sum_##SUF, T, T, 0, x + y)                    \
  RED_BIN(red_prod_##SUF, T, T, 0, x* y)                    \
  RED_BIN(red_max_##SUF, T, T, 0, MAX(x, y))                \
  RED_BIN(red_min_##SUF, T, T, 0, MIN(x, y))                \
  RED_BIN(red_pms_##SUF, T, T, r->scalar.f, x + (T)(y * s)) \
  RED_UN(red_scale_##SUF, T, T, r->scalar.f, x* s)          \
  RED_UN(red_div_##SUF, T, T, 0, x / (T)k)

RED_FLOAT(f32, float, re_maxf, re_minf)
RED_FLOAT(f64, double, re_maxd, re_mind)

/* ---- narrow float kernels -------------------------------------------------------------
 * Widen to float, operate, narrow with round-to-nearest-even. The loops run
 * over 32-bit words holding 2 (16-bit types) or 4 (fp8) elements, each lane
 * handled the same way, so the vectorised code never packs or unpacks
 * between 8/16- and 32-bit lanes (expensive on SSE2; 2x for bf16). Lanes are
 * treated alike, so the byte order does not matter. A tail of fewer than one
 * word runs element by element. Premulsum rounds the scaled input to the
 * type first, as red_pre does, so reduce_n equals the pairwise chain. */
static inline uint32_t red_ld32(const unsigned char* p) {
  uint32_t w;
  memcpy(&w, p, sizeof w);
  return w;
}
static inline void red_st32(unsigned char* p, uint32_t w) { memcpy(p, &w, sizeof w); }
static inline uint32_t red_ldn(const unsigned char* p, size_t es) {
  if (es == 1) return p[0];
  uint16_t v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void red_stn(unsigned char* p, size_t es, uint32_t c) {
  if (es == 1) {
    p[0] = (unsigned char)c;
  } else {
    uint16_t v = (uint16_t)c;
    memcpy(p, &v, sizeof v);
  }
}

/* Binary narrow kernel: EXPR maps codes x, y (uint32_t) and scalar s to a code. */
#define RED_NBIN_LOOP(PRAGMA, elem, ES)                                                                  \
  size_t nw = n / L;                                                                                     \
  PRAGMA for (size_t i = 0; i < nw; i++) {                                                               \
    uint32_t wa = red_ld32(a + 4 * i), wb = red_ld32(b + 4 * i), wd = 0;                                 \
    for (unsigned j = 0; j < L; j++) wd |= elem((wa >> (B * j)) & M, (wb >> (B * j)) & M, s) << (B * j); \
    red_st32(d + 4 * i, wd);                                                                             \
  }                                                                                                      \
  for (size_t i = nw * L; i < n; i++)                                                                    \
    red_stn(d + i * ES, ES, elem(red_ldn(a + i * ES, ES), red_ldn(b + i * ES, ES), s));

#define RED_NBIN(NAME, ES, EXPR)                                                                                     \
  static inline uint32_t NAME##_elem(uint32_t x, uint32_t y, float s) {                                              \
    (void)s;                                                                                                         \
    return (EXPR);                                                                                                   \
  }                                                                                                                  \
  static void NAME##_nr(unsigned char* restrict d, const unsigned char* restrict a, const unsigned char* restrict b, \
                        size_t n, float s) {                                                                         \
    enum { L = 4 / ES, B = 8 * ES, M = (1u << B) - 1 };                                                              \
    RED_NBIN_LOOP(, NAME##_elem, ES)                                                                                 \
  }                                                                                                                  \
  static void NAME##_al(unsigned char* d, const unsigned char* a, const unsigned char* b, size_t n, float s) {       \
    enum { L = 4 / ES, B = 8 * ES, M = (1u << B) - 1 };                                                              \
    RED_NBIN_LOOP(RED_IVDEP, NAME##_elem, ES)                                                                        \
  }                                                                                                                  \
  static void NAME(void* d, const void* a, const void* b, size_t n, const struct red_op* r) {                        \
    float s = (float)r->scalar.f;                                                                                    \
    if (d == a || d == b)                                                                                            \
      NAME##_al(d, a, b, n, s);                                                                                      \
    else                                                                                                             \
      NAME##_nr(d, a, b, n, s);                                                                                      \
  }

/* Unary narrow kernel: EXPR maps code x, scalar s and integer k to a code. */
#define RED_NUN_LOOP(PRAGMA, elem, ES)                                                 \
  size_t nw = n / L;                                                                   \
  PRAGMA for (size_t i = 0; i < nw; i++) {                                             \
    uint32_t wa = red_ld32(a + 4 * i), wd = 0;                                         \
    for (unsigned j = 0; j < L; j++) wd |= elem((wa >> (B * j)) & M, s, k) << (B * j); \
    red_st32(d + 4 * i, wd);                                                           \
  }                                                                                    \
  for (size_t i = nw * L; i < n; i++) red_stn(d + i * ES, ES, elem(red_ldn(a + i * ES, ES), s, k));

#define RED_NUN(NAME, ES, SINIT, EXPR)                                                                          \
  static inline uint32_t NAME##_elem(uint32_t x, float s, int k) {                                              \
    (void)s;                                                                                                    \
    (void)k;                                                                                                    \
    return (EXPR);                                                                                              \
  }                                                                                                             \
  static void NAME##_nr(unsigned char* restrict d, const unsigned char* restrict a, size_t n, float s, int k) { \
    enum { L = 4 / ES, B = 8 * ES, M = (1u << B) - 1 };                                                         \
    RED_NUN_LOOP(, NAME##_elem, ES)                                                                             \
  }                                                                                                             \
  static void NAME##_al(unsigned char* d, const unsigned char* a, size_t n, float s, int k) {                   \
    enum { L = 4 / ES, B = 8 * ES, M = (1u << B) - 1 };                                                         \
    RED_NUN_LOOP(RED_IVDEP, NAME##_elem, ES)                                                                    \
  }                                                                                                             \
  static void NAME(void* d, const void* a, size_t n, const struct red_op* r, int k) {                           \
    (void)r;                                                                                                    \
    float s = (float)(SINIT);                                                                                   \
    if (d == a)                                                                                                 \
      NAME##_al(d, a, n, s, k);                                                                                 \
    else                                                                                                        \
      NAME##_nr(d, a, n, s, k);                                                                                 \
  }

#define RED_NARROW(SUF, ES, TOF, FROMF)                               \
  RED_NBIN(red_sum_##SUF, ES, FROMF(TOF(x) + TOF(y)))                 \
  RED_NBIN(red_prod_##SUF, ES, FROMF(TOF(x) * TOF(y)))                \
  RED_NBIN(red_max_##SUF, ES, FROMF(re_maxf(TOF(x), TOF(y))))        \
  RED_NBIN(red_min_##SUF, ES, FROMF(re_minf(TOF(x), TOF(y))))        \
  RED_NBIN(red_pms_##SUF, ES, FROMF(TOF(x) + TOF(FROMF(TOF(y) * s)))) \
  RED_NUN(red_scale_##SUF, ES, r->scalar.f, FROMF(TOF(x) * s))        \
  RED_NUN(red_div_##SUF, ES, 0, FROMF(TOF(x) / (float)k))

RED_NARROW(f16, 2, re_h2f, re_f2h)
RED_NARROW(bf16, 2, re_b2f, re_f2b)
RED_NARROW(e4m3, 1, re_e4m3_2f, re_f2e4m3)
RED_NARROW(e5m2, 1, re_e5m2_2f, re_f2e5m2)

/* ---- dispatch --------------------------------------------------------------------------- */

#define RED_ROW(SA, SO) \
  { red_sum_##SA, red_prod_##SA, red_max_##SO, red_min_##SO, red_pms_##SA }
static const red_bin_fn red_bin_table[ncclNumTypes][5] = {
    [ncclInt8] = RED_ROW(u8, i8),           [ncclUint8] = RED_ROW(u8, u8),
    [ncclInt32] = RED_ROW(u32, i32),        [ncclUint32] = RED_ROW(u32, u32),
    [ncclInt64] = RED_ROW(u64, i64),        [ncclUint64] = RED_ROW(u64, u64),
    [ncclFloat16] = RED_ROW(f16, f16),      [ncclFloat32] = RED_ROW(f32, f32),
    [ncclFloat64] = RED_ROW(f64, f64),      [ncclBfloat16] = RED_ROW(bf16, bf16),
    [ncclFloat8e4m3] = RED_ROW(e4m3, e4m3), [ncclFloat8e5m2] = RED_ROW(e5m2, e5m2),
};
static const red_un_fn red_scale_table[ncclNumTypes] = {red_scale_u8,  red_scale_u8,   red_scale_u32,  red_scale_u32,
                                                        red_scale_u64, red_scale_u64,  red_scale_f16,  red_scale_f32,
                                                        red_scale_f64, red_scale_bf16, red_scale_e4m3, red_scale_e5m2};
static const red_un_fn red_div_table[ncclNumTypes] = {red_div_i8,  red_div_u8,   red_div_i32,  red_div_u32,
                                                      red_div_i64, red_div_u64,  red_div_f16,  red_div_f32,
                                                      red_div_f64, red_div_bf16, red_div_e4m3, red_div_e5m2};

static int red_kind_valid(int kind) { return kind >= RED_SUM && kind <= RED_PREMULSUM; }

int red_op_init(struct red_op* r, ncclRedOp_t op, ncclDataType_t dt) {
  if (r == NULL || !dtype_valid(dt) || (int)op < (int)ncclSum || (int)op > (int)ncclAvg) return -1;
  static const int kinds[] = {
      [ncclSum] = RED_SUM, [ncclProd] = RED_PROD, [ncclMax] = RED_MAX, [ncclMin] = RED_MIN, [ncclAvg] = RED_SUM};
  memset(r, 0, sizeof *r);
  r->dt = dt;
  r->kind = kinds[op];
  return 0;
}

int red_op_init_premulsum(struct red_op* r, const void* scalar, ncclDataType_t dt) {
  if (r == NULL || scalar == NULL || !dtype_valid(dt)) return -1;
  struct re_scalar s = re_scalar_load((int)dt, scalar);
  memset(r, 0, sizeof *r);
  r->dt = dt;
  r->kind = RED_PREMULSUM;
  /* Floats keep the scalar in f; integers in u (sign-extended: the bits of scalar.i). */
  if (dt >= ncclFloat16)
    r->scalar.f = s.f;
  else
    r->scalar.u = s.u;
  return 0;
}

void red_reduce(const struct red_op* r, void* dst, const void* a, const void* b, size_t count) {
  if (count == 0 || !dtype_valid(r->dt) || !red_kind_valid(r->kind)) return;
  red_bin_table[r->dt][r->kind](dst, a, b, count, r);
}

/* ---- a source another CPU wrote ------------------------------------------------ */

/* Blocks of red_reduce_far, and how far ahead of the block being reduced its
 * far source is prefetched. The lines of a slot the peer has just filled sit
 * in the peer's cache: each is a transfer from that CPU, and the hardware
 * prefetchers, which stop at a page's end, keep few of them in flight. 2 ranks
 * on 2 CPUs (an EPYC guest), ring reduce, bound, medians of 5 interleaved
 * rounds (TRANSPORT=shm bench/ab_env.sh reduce), us without / with: 32 KiB
 * 2.76 / 2.06, 128 KiB 10.5 / 7.8, 256 KiB 20.6 / 15.0, 512 KiB 36.3 / 31.7,
 * from 1 MiB even. Prefetching the local source as well, or 16 and 64 KiB
 * ahead, was slower; 2 KiB ahead alike. */
#define RED_FAR_BLOCK 4096
#define RED_FAR_AHEAD 4096

static inline void red_prefetch(const unsigned char* p, size_t from, size_t to) {
  for (size_t o = from; o < to; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* Before the block [bo, bo + len) of a source of `bytes`: prefetches the
 * lines RED_FAR_AHEAD beyond it (before the first block, the first ones too). */
static inline void red_prefetch_ahead(const void* src, size_t bo, size_t len, size_t bytes) {
  size_t from = bo == 0 ? 0 : bo + RED_FAR_AHEAD, to = bo + RED_FAR_AHEAD + len;
  red_prefetch(src, from, to < bytes ? to : bytes);
}

void red_reduce_far(const struct red_op* r, void* dst, const void* far, const void* b, size_t count) {
  if (count == 0 || !dtype_valid(r->dt) || !red_kind_valid(r->kind)) return;
  red_bin_fn f = red_bin_table[r->dt][r->kind];
  size_t es = dtype_size(r->dt), bytes = count * es, blk = RED_FAR_BLOCK / es;
  if (bytes <= RED_FAR_AHEAD) {
    f(dst, far, b, count, r);
    return;
  }
  for (size_t off = 0; off < count; off += blk) {
    size_t m = count - off < blk ? count - off : blk, bo = off * es;
    red_prefetch_ahead(far, bo, m * es, bytes);
    f((char*)dst + bo, (const char*)far + bo, (const char*)b + bo, m, r);
  }
}

void red_pre(const struct red_op* r, void* dst, const void* src, size_t count) {
  if (count == 0 || !dtype_valid(r->dt)) return;
  if (r->kind == RED_PREMULSUM)
    red_scale_table[r->dt](dst, src, count, r, 0);
  else if (dst != src)
    memcpy(dst, src, count * dtype_size(r->dt));
}

/* Blocks of this many bytes keep the accumulator in L1 while every source
 * streams through once. */
#define RED_BLOCK_BYTES 8192

void red_reduce_n(const struct red_op* r, void* dst, const void* const* src, int n, size_t count) {
  if (n < 1 || count == 0 || !dtype_valid(r->dt) || !red_kind_valid(r->kind)) return;
  if (n == 1) {
    red_pre(r, dst, src[0], count);
    return;
  }
  red_bin_fn f = red_bin_table[r->dt][r->kind];
  int premul = r->kind == RED_PREMULSUM;
  if (n == 2 && !premul) {
    f(dst, src[0], src[1], count, r);
    return;
  }
  size_t es = dtype_size(r->dt), blk = RED_BLOCK_BYTES / es;
  _Alignas(64) unsigned char acc[RED_BLOCK_BYTES];
  for (size_t off = 0; off < count; off += blk) {
    size_t m = count - off < blk ? count - off : blk, bo = off * es;
    int k;
    if (premul) {
      red_scale_table[r->dt](acc, (const char*)src[0] + bo, m, r, 0);
      k = 1;
    } else {
      f(acc, (const char*)src[0] + bo, (const char*)src[1] + bo, m, r);
      k = 2;
    }
    for (; k < n - 1; k++) f(acc, acc, (const char*)src[k] + bo, m, r);
    /* Earlier sources of this block are consumed, so dst may be any of them;
       if it is the last one, f takes its aliasing path. */
    f((char*)dst + bo, acc, (const char*)src[n - 1] + bo, m, r);
  }
}

#if defined(__x86_64__)
/* With AVX-512 a whole line goes out in one non-temporal store. Four 16-byte
 * ones per line (or two of 32) measured far slower here (a KVM guest on a
 * Sapphire Rapids host): 2 processes each reducing 128 MiB pairs through a
 * 4 KiB block and streaming the result to two buffers, 10.4-10.5 GB/s of
 * results with 64-byte stores against 8.6-8.9 with 16- or 32-byte ones. */
__attribute__((target("avx512f"))) static void red_copy_out_512(unsigned char* dst, const unsigned char* src,
                                                                 size_t n) {
  size_t head = (size_t)(-(uintptr_t)dst & 63);
  if (head > n) head = n;
  memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) _mm512_stream_si512((void*)(dst + i), _mm512_loadu_si512(src + i));
  memcpy(dst + body, src + body, n - body);
}

static int red_have_avx512(void) {
  static int v = -1;
  int h = __atomic_load_n(&v, __ATOMIC_RELAXED);
  if (h < 0) {
    __builtin_cpu_init();
    h = __builtin_cpu_supports("avx512f") ? 1 : 0;
    __atomic_store_n(&v, h, __ATOMIC_RELAXED);
  }
  return h;
}
#endif

/* Copies n bytes to a destination that goes out to memory: non-temporal
 * stores of 64 bytes (one line) at a time from the first 16-byte boundary
 * of dst (64 with AVX-512); the ends go through memcpy. No fence: the
 * caller fences once. */
static void red_copy_out(unsigned char* dst, const unsigned char* src, size_t n) {
#if defined(__x86_64__)
  if (red_have_avx512()) {
    red_copy_out_512(dst, src, n);
    return;
  }
  size_t head = (size_t)(-(uintptr_t)dst & 15);
  if (head > n) head = n;
  memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i v0 = _mm_loadu_si128((const __m128i*)(src + i)), v1 = _mm_loadu_si128((const __m128i*)(src + i + 16));
    __m128i v2 = _mm_loadu_si128((const __m128i*)(src + i + 32)), v3 = _mm_loadu_si128((const __m128i*)(src + i + 48));
    _mm_stream_si128((__m128i*)(dst + i), v0);
    _mm_stream_si128((__m128i*)(dst + i + 16), v1);
    _mm_stream_si128((__m128i*)(dst + i + 32), v2);
    _mm_stream_si128((__m128i*)(dst + i + 48), v3);
  }
  memcpy(dst + body, src + body, n - body);
#else
  memcpy(dst, src, n);
#endif
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static size_t red_sum_f32_stream_512(float* const* out, int nout,
                                                                       const float* const* in, int nin,
                                                                       size_t lines) {
  for (size_t l = 0; l < lines; l++) {
    size_t o = l * 16;
    __m512 acc = _mm512_loadu_ps(in[0] + o);
    for (int k = 1; k < nin; k++) acc = _mm512_add_ps(acc, _mm512_loadu_ps(in[k] + o));
    for (int j = 0; j < nout; j++) _mm512_stream_ps(out[j] + o, acc);
  }
  return lines * 16;
}
#endif

size_t red_sum_f32_stream_n(void* const* out, int nout, const void* const* in, int nin, size_t count) {
#if defined(__x86_64__)
  if (nin < 2 || nin > 64 || nout < 1 || nout > 64 || count < 16 || !red_have_avx512()) return 0;
  for (int j = 0; j < nout; j++)
    if ((uintptr_t)out[j] & 63) return 0;
  return red_sum_f32_stream_512((float* const*)out, nout, (const float* const*)in, nin, count / 16);
#else
  (void)out, (void)nout, (void)in, (void)nin, (void)count;
  return 0;
#endif
}

/* Makes red_copy_out's stores visible before anything stored after. */
static void red_copy_out_fence(void) {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void red_copy_far(void* dst, const void* src, size_t n) {
  red_copy_out(dst, src, n);
  red_copy_out_fence();
}

void red_copy_far_n(void* const* dst, int ndst, const void* src, size_t n) {
  for (int i = 0; i < ndst; i++) red_copy_out(dst[i], src, n);
}

void red_far_fence(void) { red_copy_out_fence(); }

/* A block of red_reduce_out: small enough that the result is still in the
 * first-level cache when it is copied out (1-16 KiB measured alike). */
#define RED_OUT_BLOCK 4096

void red_reduce_out(const struct red_op* r, void* dst, void* copy, const void* a, const void* b, size_t count,
                    int avg_n, int a_far) {
  if (count == 0 || !dtype_valid(r->dt) || !red_kind_valid(r->kind)) return;
  red_bin_fn f = red_bin_table[r->dt][r->kind];
  size_t es = dtype_size(r->dt), blk = RED_OUT_BLOCK / es;
  _Alignas(64) unsigned char acc[RED_OUT_BLOCK];
  for (size_t off = 0; off < count; off += blk) {
    size_t m = count - off < blk ? count - off : blk, bo = off * es;
    unsigned char* t = copy ? (unsigned char*)copy + bo : acc;
    if (a_far) red_prefetch_ahead(a, bo, m * es, count * es);
    f(t, (const char*)a + bo, (const char*)b + bo, m, r);
    if (avg_n > 1) red_div(r->dt, t, t, m, avg_n);
    red_copy_out((unsigned char*)dst + bo, t, m * es);
  }
  red_copy_out_fence();
}

void red_div(ncclDataType_t dt, void* dst, const void* src, size_t count, int n) {
  if (count == 0 || !dtype_valid(dt)) return;
  /* n == 1 still goes through the arithmetic: fp8 infinities saturate like
     any other result. */
  red_div_table[dt](dst, src, count, NULL, n < 1 ? 1 : n);
}
