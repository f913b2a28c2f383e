/* Host reduction kernels: the element-wise copy / reduce / average loops that
 * every host collective (src/coll) runs over the bytes it moves, for all twelve
 * NCCL datatypes, and the fp16 / bf16 / fp8 conversions they need. Pure
 * computation, no allocation or logging; implemented in reduce_host.c. The
 * CUDA kernels under src/device follow the same semantics.
 *
 * Semantics, shared by every entry point:
 *  - Integers: sum / prod / premulsum wrap around (two's complement);
 *    max / min are exact.
 *  - float16, bfloat16, fp8: each element is widened to float, the op runs in
 *    float, the result is rounded back to nearest-even. Because float has more
 *    than twice the precision of these formats, this equals the correctly
 *    rounded op in the narrow format.
 *  - max / min on floating types follow IEEE 754-2019 maximum / minimum: the
 *    result is NaN when either input is NaN, and -0 < +0. The result does not
 *    depend on operand order (except for which NaN comes out), so algorithms
 *    that reduce in different orders agree bit for bit.
 *  - fp8 results saturate: E4M3 and E5M2 finite values beyond the largest
 *    finite value, and infinities, become the largest finite value of that
 *    sign (CUDA's __NV_SATFINITE); NaN stays NaN.
 *  - The rounding-mode-based conversions assume the default FP environment
 *    (round-to-nearest-even), which collie never changes.
 *
 * Pointers need only the alignment of their element type; a destination may
 * be exactly one of the sources, never a partial overlap. All functions are
 * thread-safe (no state). Callers validate dtype / op first (red_op_init). */
#ifndef COLLIE_DEVICE_REDUCE_H
#define COLLIE_DEVICE_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* ---- datatypes -------------------------------------------------------------- */

/* 1 for 0..11 (ncclInt8..ncclFloat8e5m2), else 0. Inline with dtype_size:
 * every call's argument check asks both. */
static inline int dtype_valid(ncclDataType_t dt) { return (unsigned)dt < (unsigned)ncclNumTypes; }
/* Size in bytes of one element; 0 for an invalid type. The sizes in order of
 * ncclDataType_t, one hexadecimal digit each from the lowest: int8 uint8
 * int32 uint32 int64 uint64 float16 float32 float64 bfloat16 f8e4m3 f8e5m2. */
#define DTYPE_SIZES 0x112842884411ull
static inline size_t dtype_size(ncclDataType_t dt) {
  return dtype_valid(dt) ? (size_t)((DTYPE_SIZES >> (4 * (unsigned)dt)) & 0xf) : 0;
}
/* "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
 * "float64", "bfloat16", "f8e4m3", "f8e5m2"; "invalid" otherwise. */
const char* dtype_name(ncclDataType_t dt);

/* ---- reduction operators ---------------------------------------------------- */

enum red_kind { RED_SUM, RED_PROD, RED_MAX, RED_MIN, RED_PREMULSUM };

struct red_op {
  ncclDataType_t dt;
  int kind; /* enum red_kind */
  /* RED_PREMULSUM: every input is multiplied by this scalar before summing.
     Stored as double for float types, int64_t/uint64_t for integer types. */
  union {
    double f;
    int64_t i;
    uint64_t u;
  } scalar;
};

/* Builds a red_op for a built-in op: ncclSum, ncclProd, ncclMax, ncclMin, and
 * ncclAvg, which becomes RED_SUM here (the caller finishes with red_div).
 * [out] r; [in] op, dt. Returns 0, or -1 for an invalid op (including
 * run-time premulsum handles) or dtype; *r is untouched on failure. */
int red_op_init(struct red_op* r, ncclRedOp_t op, ncclDataType_t dt);
/* Premul-sum op. [in] scalar: one element of type dt in host memory.
 * Returns 0, or -1 for an invalid dtype or NULL scalar. */
int red_op_init_premulsum(struct red_op* r, const void* scalar, ncclDataType_t dt);

/* ---- kernels ------------------------------------------------------------------ */

/* dst[i] = a[i] OP pre(b[i]), where pre() is the identity except for
 * RED_PREMULSUM (multiply by the scalar, rounded to the type). `a` is a
 * partial result that already went through pre(). dst may equal a or b. */
void red_reduce(const struct red_op* r, void* dst, const void* a, const void* b, size_t count);
/* red_reduce where `far` was written just now by another CPU (a shared-memory
 * slot its peer filled): read in blocks, with software prefetches of the lines
 * a few KiB ahead (reduce_host.c says why). Same result as red_reduce. */
void red_reduce_far(const struct red_op* r, void* dst, const void* far, const void* b, size_t count);
/* dst[i] = pre(src[i]): a copy, or scaled for RED_PREMULSUM. dst may equal src. */
void red_pre(const struct red_op* r, void* dst, const void* src, size_t count);
/* dst[i] = OP over k of pre(src[k][i]), k = 0..n-1 (n >= 1; nothing happens
 * for n < 1), reading each source and writing dst once. The result is bit for
 * bit that of red_pre(src[0]) followed by red_reduce with src[1], src[2], ...
 * in order. dst may equal any src[k]. */
void red_reduce_n(const struct red_op* r, void* dst, const void* const* src, int n, size_t count);
/* red_reduce (and, avg_n > 1, red_div by avg_n) for a result that goes out
 * to memory and is not read again soon: dst is written with non-temporal
 * stores where the CPU has them (x86-64), so its lines are neither read
 * first (no read-for-ownership) nor kept in cache. If `copy` is not NULL it
 * receives the same result with ordinary stores (a slot that is sent on at
 * once). The work runs in blocks that stay in the first-level cache; with
 * a_far, `a` is read as red_reduce_far reads its far source. dst must not
 * overlap a, b or copy; copy may equal a or b. The stores are globally
 * visible on return (a store fence). */
void red_reduce_out(const struct red_op* r, void* dst, void* copy, const void* a, const void* b, size_t count,
                    int avg_n, int a_far);
/* memcpy for a destination that goes out to memory and is not read again
 * soon: non-temporal stores where the CPU has them (see red_reduce_out);
 * visible on return. dst and src must not overlap. */
void red_copy_far(void* dst, const void* src, size_t n);
/* red_copy_far of src to each of ndst destinations, without the fence: a
 * caller that copies out many blocks calls red_far_fence once after the
 * last (a fence after every 4 KiB block made a 2-rank mapped allreduce of
 * 256 MiB 8.3 GB/s busbw where one at the end gives 10). */
void red_copy_far_n(void* const* dst, int ndst, const void* src, size_t n);
/* Makes every earlier red_copy_far_n store visible before anything stored after. */
void red_far_fence(void);
/* Float32 sum of nin inputs (in input order, as red_reduce_n adds them)
 * streamed to each of nout outputs in one pass, 64-byte non-temporal stores,
 * no fence (red_far_fence after). Does whole 16-element lines from the start
 * when the CPU has AVX-512 and every output is 64-byte aligned, and returns
 * how many elements it did (0 when it cannot; the caller does the rest).
 * Outputs must not overlap the inputs. */
size_t red_sum_f32_stream_n(void* const* out, int nout, const void* const* in, int nin, size_t count);
/* ncclAvg finalisation: dst[i] = src[i] / n (n >= 1; n < 1 is taken as 1).
 * Integers: truncating division (signed types toward zero). Floats: divided
 * in float (double for float64) and rounded back to the type. dst may equal src. */
void red_div(ncclDataType_t dt, void* dst, const void* src, size_t count, int n);

/* ---- conversions (exposed for tests) ------------------------------------------ */
/* To float: exact. binary16 signalling NaNs come back quiet; bfloat16 is a
 * plain widening (bit pattern << 16). From float: round to nearest even;
 * NaN gives a quiet NaN of the same sign. binary16 / bfloat16 overflow to
 * infinity; fp8 saturates (see above). Subnormals are handled throughout. */
float red_half_to_float(uint16_t h);
uint16_t red_float_to_half(float f);
float red_bf16_to_float(uint16_t h);
uint16_t red_float_to_bf16(float f);
float red_e4m3_to_float(uint8_t v); /* OCP E4M3: bias 7, no inf, S.1111.111 is NaN, max 448 */
uint8_t red_float_to_e4m3(float f);
float red_e5m2_to_float(uint8_t v); /* OCP E5M2: bias 15, IEEE-like inf / NaN, max 57344 */
uint8_t red_float_to_e5m2(float f);

#endif
