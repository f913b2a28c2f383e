/* CUDA kernels of the device path: copy, premulsum scaling, reduce and the
 * ncclAvg division for all twelve datatypes, and the stream gate that holds a
 * user stream until the communicator's proxy thread has finished a staged
 * operation. The arithmetic is reduce_elem.h's (shared with the host tests),
 * so results equal reduce_host.c's bit for bit; this file is built with
 * --fmad=false for that reason. When every pointer is 16-byte aligned each
 * thread moves 16-byte vectors; otherwise (and for the tail) one element. */
#include <cuda_runtime.h>

#include "kernels.h"
#include "reduce_elem.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

template <int DT>
struct Dt {
  static constexpr int es = DT == RE_I8 || DT == RE_U8 || DT == RE_E4M3 || DT == RE_E5M2 ? 1
                            : DT == RE_F16 || DT == RE_BF16                              ? 2
                            : DT == RE_I32 || DT == RE_U32 || DT == RE_F32               ? 4
                                                                                         : 8;
};

union Pack {
  uint4 v;
  uint8_t b[16];
  uint16_t h[8];
  uint32_t w[4];
  unsigned long long d[2];
};

template <int ES>
__device__ __forceinline__ uint64_t pack_get(const Pack& p, int j) {
  if (ES == 1) return p.b[j];
  if (ES == 2) return p.h[j];
  if (ES == 4) return p.w[j];
  return p.d[j];
}
template <int ES>
__device__ __forceinline__ void pack_put(Pack& p, int j, uint64_t v) {
  if (ES == 1) p.b[j] = (uint8_t)v;
  else if (ES == 2) p.h[j] = (uint16_t)v;
  else if (ES == 4) p.w[j] = (uint32_t)v;
  else p.d[j] = v;
}
/* Elements need only their own alignment (reduce.h's contract). */
template <int ES>
__device__ __forceinline__ uint64_t ld_elem(const unsigned char* p) {
  if (ES == 1) return *p;
  if (ES == 2) return *reinterpret_cast<const uint16_t*>(p);
  if (ES == 4) return *reinterpret_cast<const uint32_t*>(p);
  return *reinterpret_cast<const unsigned long long*>(p);
}
template <int ES>
__device__ __forceinline__ void st_elem(unsigned char* p, uint64_t v) {
  if (ES == 1) *p = (uint8_t)v;
  else if (ES == 2) *reinterpret_cast<uint16_t*>(p) = (uint16_t)v;
  else if (ES == 4) *reinterpret_cast<uint32_t*>(p) = (uint32_t)v;
  else *reinterpret_cast<unsigned long long*>(p) = v;
}

template <int DT>
__device__ __forceinline__ re_scalar get_scalar(const kern_scalar& ks) {
  if (ks.dev_ptr) return re_scalar_load(DT, ks.dev_ptr);
  re_scalar s;
  s.f = ks.f;
  s.u = ks.u;
  return s;
}

/* OP: 0..4 reduce kinds, 5 pre (scale or copy), 6 divide by n. */
enum { OP_PRE = 5, OP_DIV = 6 };

template <int DT, int OP>
__device__ __forceinline__ uint64_t apply(uint64_t x, uint64_t y, re_scalar s, int n) {
  if (OP == OP_PRE) return re_scale(DT, x, s);
  if (OP == OP_DIV) return re_div(DT, x, n);
  return re_reduce(DT, OP, x, y, s);
}

/* d[i] = apply(a[i], b[i]); b is only read by the binary ops. */
template <int DT, int OP>
__global__ void __launch_bounds__(kThreads) k_elementwise(unsigned char* d, const unsigned char* a,
                                                          const unsigned char* b, size_t n, kern_scalar ks, int nn,
                                                          int vec) {
  constexpr int ES = Dt<DT>::es;
  constexpr int L = 16 / ES;
  constexpr bool binary = OP < OP_PRE;
  const re_scalar s = get_scalar<DT>(ks);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t npack = n / L;
    for (size_t p = tid; p < npack; p += nth) {
      Pack pa, pb, pd;
      pa.v = reinterpret_cast<const uint4*>(a)[p];
      if (binary) pb.v = reinterpret_cast<const uint4*>(b)[p];
      else pb.v = pa.v;
#pragma unroll
      for (int j = 0; j < L; j++) pack_put<ES>(pd, j, apply<DT, OP>(pack_get<ES>(pa, j), pack_get<ES>(pb, j), s, nn));
      reinterpret_cast<uint4*>(d)[p] = pd.v;
    }
    done = npack * L;
  }
  for (size_t i = done + tid; i < n; i += nth) {
    uint64_t x = ld_elem<ES>(a + i * ES);
    uint64_t y = binary ? ld_elem<ES>(b + i * ES) : x;
    st_elem<ES>(d + i * ES, apply<DT, OP>(x, y, s, nn));
  }
}

__global__ void __launch_bounds__(kThreads) k_copy(unsigned char* d, const unsigned char* a, size_t bytes, int vec) {
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t npack = bytes / 16;
    for (size_t p = tid; p < npack; p += nth) reinterpret_cast<uint4*>(d)[p] = reinterpret_cast<const uint4*>(a)[p];
    done = npack * 16;
  }
  for (size_t i = done + tid; i < bytes; i += nth) d[i] = a[i];
}

/* One thread polls the host-mapped counter; the sleep keeps it off the bus. */
__global__ void k_wait(const volatile uint32_t* flag, uint32_t seq) {
  while ((int32_t)(*flag - seq) < 0) __nanosleep(1000);
}

typedef void (*elem_fn)(unsigned char*, const unsigned char*, const unsigned char*, size_t, kern_scalar, int, int);

#define ROW(DT)                                                                                               \
  {                                                                                                           \
    k_elementwise<DT, 0>, k_elementwise<DT, 1>, k_elementwise<DT, 2>, k_elementwise<DT, 3>,                   \
        k_elementwise<DT, 4>, k_elementwise<DT, OP_PRE>, k_elementwise<DT, OP_DIV>                            \
  }
const elem_fn kTable[RE_NTYPES][7] = {ROW(RE_I8),  ROW(RE_U8),  ROW(RE_I32), ROW(RE_U32),
                                      ROW(RE_I64), ROW(RE_U64), ROW(RE_F16), ROW(RE_F32),
                                      ROW(RE_F64), ROW(RE_BF16), ROW(RE_E4M3), ROW(RE_E5M2)};
#undef ROW

unsigned grid_for(size_t work) {
  size_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return (unsigned)b;
}

int launched(const char** err) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  if (err) *err = cudaGetErrorString(e);
  return -1;
}

int run_elementwise(int dt, int op, kern_scalar s, void* dst, const void* a, const void* b, size_t count, int n,
                    void* stream, const char** err) {
  if (dt < 0 || dt >= RE_NTYPES || op < 0 || op > OP_DIV) {
    if (err) *err = "invalid datatype or operation";
    return -1;
  }
  if (count == 0) return 0;
  uintptr_t al = (uintptr_t)dst | (uintptr_t)a | (op < OP_PRE ? (uintptr_t)b : 0);
  int vec = (al & 15) == 0;
  size_t work = vec ? count / (size_t)(16 / re_size(dt)) + 1 : count;
  kTable[dt][op]<<<grid_for(work), kThreads, 0, (cudaStream_t)stream>>>(
      (unsigned char*)dst, (const unsigned char*)a, (const unsigned char*)b, count, s, n, vec);
  return launched(err);
}

}  // namespace

extern "C" int kern_copy(void* dst, const void* src, size_t bytes, void* stream, const char** err) {
  if (bytes == 0 || dst == src) return 0;
  int vec = (((uintptr_t)dst | (uintptr_t)src) & 15) == 0;
  k_copy<<<grid_for(vec ? bytes / 16 + 1 : bytes), kThreads, 0, (cudaStream_t)stream>>>(
      (unsigned char*)dst, (const unsigned char*)src, bytes, vec);
  return launched(err);
}

extern "C" int kern_pre(int dt, struct kern_scalar s, void* dst, const void* src, size_t count, void* stream,
                        const char** err) {
  return run_elementwise(dt, OP_PRE, s, dst, src, nullptr, count, 0, stream, err);
}

extern "C" int kern_reduce(int dt, int kind, struct kern_scalar s, void* dst, const void* a, const void* b,
                           size_t count, void* stream, const char** err) {
  if (kind < RE_SUM || kind > RE_PREMULSUM) {
    if (err) *err = "invalid reduction";
    return -1;
  }
  return run_elementwise(dt, kind, s, dst, a, b, count, 0, stream, err);
}

extern "C" int kern_div(int dt, void* dst, const void* src, size_t count, int n, void* stream, const char** err) {
  kern_scalar s = {0, 0, nullptr};
  return run_elementwise(dt, OP_DIV, s, dst, src, nullptr, count, n < 1 ? 1 : n, stream, err);
}

extern "C" int kern_wait_flag(const volatile uint32_t* flag, uint32_t seq, void* stream, const char** err) {
  k_wait<<<1, 1, 0, (cudaStream_t)stream>>>(flag, seq);
  return launched(err);
}

