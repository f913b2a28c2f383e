/* Internal core: error recording and propagation macros, the API definition
 * macro (nccl* weak + pnccl* alias, exported), monotonic time helpers.
 * Every module includes this; errors.c implements err_*. */
#ifndef COLLIE_CORE_H
#define COLLIE_CORE_H

#include <stdint.h>
#include <time.h>

#include "collie.h"
#include "debug.h"
#include "nccl.h"
#include "param.h"

#define COLLIE_EXPORT __attribute__((visibility("default")))

/* Defines an NCCL entry point the way profilers expect: `name` is a weak,
 * exported definition (a tool may interpose its own) and `p##name` is a strong
 * exported alias that always reaches collie's implementation. The body follows
 * the macro as an ordinary definition of `name`. */
#define NCCL_API(ret, name, ...)                                                 \
  COLLIE_EXPORT ret p##name(__VA_ARGS__) __attribute__((alias(#name)));          \
  COLLIE_EXPORT __attribute__((weak)) ret name(__VA_ARGS__)

/* Records `code` with a formatted message for ncclGetLastError, logs it as a
 * WARN, and returns `code` so callers can write `return err_set(...)`. */
ncclResult_t err_set(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last message ("" if none); the process-wide last one. */
const char* err_last_thread(void);
const char* err_last_global(void);

/* Propagation: on failure log file:line at TRACE and return / jump. */
#define NCCLCHECK(call)                                                            \
  do {                                                                             \
    ncclResult_t res_ = (call);                                                    \
    if (res_ != ncclSuccess && res_ != ncclInProgress) {                           \
      TRACE(LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)res_);               \
      return res_;                                                                 \
    }                                                                              \
  } while (0)

#define NCCLCHECKGOTO(call, res, label)                                            \
  do {                                                                             \
    (res) = (call);                                                                \
    if ((res) != ncclSuccess && (res) != ncclInProgress) {                         \
      TRACE(LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res));              \
      goto label;                                                                  \
    }                                                                              \
  } while (0)

/* Monotonic clock in nanoseconds / milliseconds. */
static inline int64_t time_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static inline int64_t time_ms(void) { return time_ns() / 1000000; }

/* One polling step of a busy wait: tells the CPU (and a hyperthread sibling). */
static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

#define COLLIE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define COLLIE_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
