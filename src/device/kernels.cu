/* CUDA kernels of the device path: copy and premulsum scaling (all a
 * one-rank call needs) for all twelve datatypes, and the stream gate that
 * holds a user stream until the communicator's proxy thread has finished a
 * staged operation; collectives between ranks are kern_sched.cu. The
 * arithmetic is reduce_elem.h's (shared with the host tests), so results
 * equal reduce_host.c's bit for bit; this file is built with --fmad=false for
 * that reason. When every pointer is 16-byte aligned each thread moves
 * 16-byte vectors; otherwise (and for the tail) one element. */
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

/* d[i] = pre(a[i]): premulsum scaling (red_pre). */
template <int DT>
__global__ void __launch_bounds__(kThreads) k_pre(unsigned char* d, const unsigned char* a, size_t n, kern_scalar ks,
                                                  int vec) {
  constexpr int ES = Dt<DT>::es;
  constexpr int L = 16 / ES;
  const re_scalar s = get_scalar<DT>(ks);
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nth = (size_t)gridDim.x * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t npack = n / L;
    for (size_t p = tid; p < npack; p += nth) {
      Pack pa, pd;
      pa.v = reinterpret_cast<const uint4*>(a)[p];
#pragma unroll
      for (int j = 0; j < L; j++) pack_put<ES>(pd, j, re_scale(DT, pack_get<ES>(pa, j), s));
      reinterpret_cast<uint4*>(d)[p] = pd.v;
    }
    done = npack * L;
  }
  for (size_t i = done + tid; i < n; i += nth) st_elem<ES>(d + i * ES, re_scale(DT, ld_elem<ES>(a + i * ES), s));
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

typedef void (*pre_fn)(unsigned char*, const unsigned char*, size_t, kern_scalar, int);
const pre_fn kPre[RE_NTYPES] = {k_pre<RE_I8>,  k_pre<RE_U8>,  k_pre<RE_I32>,  k_pre<RE_U32>,
                                k_pre<RE_I64>, k_pre<RE_U64>, k_pre<RE_F16>,  k_pre<RE_F32>,
                                k_pre<RE_F64>, k_pre<RE_BF16>, k_pre<RE_E4M3>, k_pre<RE_E5M2>};

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
  if (dt < 0 || dt >= RE_NTYPES) {
    if (err) *err = "invalid datatype";
    return -1;
  }
  if (count == 0) return 0;
  int vec = (((uintptr_t)dst | (uintptr_t)src) & 15) == 0;
  size_t work = vec ? count / (size_t)(16 / re_size(dt)) + 1 : count;
  kPre[dt]<<<grid_for(work), kThreads, 0, (cudaStream_t)stream>>>((unsigned char*)dst, (const unsigned char*)src,
                                                                   count, s, vec);
  return launched(err);
}

extern "C" int kern_wait_flag(const volatile uint32_t* flag, uint32_t seq, void* stream, const char** err) {
  k_wait<<<1, 1, 0, (cudaStream_t)stream>>>(flag, seq);
  return launched(err);
}

