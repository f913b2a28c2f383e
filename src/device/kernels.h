/* C interface to the CUDA kernels of kernels.cu (only built with the
 * toolkit). Every launcher enqueues on `stream` (a cudaStream_t) and returns
 * 0, or -1 after a launch error (the CUDA error string goes to *err).
 * Datatypes are NCCL's codes, reduction kinds reduce.h's red_kind. */
#ifndef COLLIE_DEVICE_KERNELS_H
#define COLLIE_DEVICE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ds_work;

/* The premulsum scalar: either its value (as red_op stores it) or, when
 * dev_ptr is not NULL, one element of the datatype in device memory that the
 * kernel reads when it runs (ncclScalarDevice). */
struct kern_scalar {
  double f;
  uint64_t u;
  const void* dev_ptr;
};

/* dst = src (bytes). */
int kern_copy(void* dst, const void* src, size_t bytes, void* stream, const char** err);
/* dst[i] = pre(src[i]) (red_pre). */
int kern_pre(int dt, struct kern_scalar s, void* dst, const void* src, size_t count, void* stream, const char** err);
/* The stream waits until (int32_t)(*flag - seq) >= 0; `flag` is a device
 * pointer to host-mapped memory that a host thread advances. */
int kern_wait_flag(const volatile uint32_t* flag, uint32_t seq, void* stream, const char** err);
/* One collective over device connectors (dev_sched.h): w->nch blocks, one per channel. */
int kern_sched(const struct ds_work* w, void* stream, const char** err);

#ifdef __cplusplus
}
#endif

#endif
