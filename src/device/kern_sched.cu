/* The collective kernel of the device path: block c runs channel c of a
 * ring or tree schedule from dev_sched.h (the code gpu.host_sched runs on the
 * CPU) over p2p or host-mapped shm connectors. Kept apart from kernels.cu
 * because its control path spills a few bytes (the steps' connector tables),
 * which ptxas's spill warning, on for the element kernels, would reject. */
#include <cuda_runtime.h>

#include "dev_sched.h"
#include "kernels.h"

namespace {

constexpr int kThreads = 256;

/* A collective over device connectors: block c runs channel c of the
 * schedule (dev_sched.h, the code gpu.host_sched runs on the CPU). Thread 0
 * drives the head/tail counters; the block moves each slot-sized piece. */
template <int DT>
__global__ void __launch_bounds__(kThreads) k_sched(ds_work w) {
  __shared__ ds_shared sh;
  w.dt = DT; /* a constant: the element arithmetic folds to one type */
  ds_run_channel(&w, (int)blockIdx.x, &sh, (int)threadIdx.x, (int)blockDim.x);
}
typedef void (*sched_fn)(ds_work);
const sched_fn kSched[RE_NTYPES] = {k_sched<RE_I8>,  k_sched<RE_U8>,  k_sched<RE_I32>, k_sched<RE_U32>,
                                    k_sched<RE_I64>, k_sched<RE_U64>, k_sched<RE_F16>, k_sched<RE_F32>,
                                    k_sched<RE_F64>, k_sched<RE_BF16>, k_sched<RE_E4M3>, k_sched<RE_E5M2>};

int launched(const char** err) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  if (err) *err = cudaGetErrorString(e);
  return -1;
}

}  // namespace

extern "C" int kern_sched(const struct ds_work* w, void* stream, const char** err) {
  if (w->nch < 1 || w->nch > DS_MAX_CH || w->dt < 0 || w->dt >= RE_NTYPES) {
    if (err) *err = "invalid channel count or datatype";
    return -1;
  }
  kSched[w->dt]<<<w->nch, kThreads, 0, (cudaStream_t)stream>>>(*w);
  return launched(err);
}
