/* Error strings and the last-error record behind ncclGetLastError: a
 * per-thread message (what this thread's last failing call said) and a
 * process-wide copy (for threads that did not make the failing call). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

#define ERR_MSG_MAX 1024

static __thread char err_thread[ERR_MSG_MAX];
static char err_global[ERR_MSG_MAX];
static pthread_mutex_t err_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() in a threaded process: never let a child inherit this lock held. */
static void err_lock_prepare(void) { pthread_mutex_lock(&err_lock); }
static void err_lock_release(void) { pthread_mutex_unlock(&err_lock); }
__attribute__((constructor)) static void err_lock_atfork(void) {
  pthread_atfork(err_lock_prepare, err_lock_release, err_lock_release);
}

ncclResult_t err_set(ncclResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_thread, sizeof(err_thread), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&err_lock);
  memcpy(err_global, err_thread, sizeof(err_global));
  pthread_mutex_unlock(&err_lock);
  WARN("%s", err_thread);
  return code;
}

const char* err_last_thread(void) { return err_thread; }

const char* err_last_global(void) {
  /* Copy under the lock into thread-local storage so the caller holds a
   * stable string even if another thread records an error meanwhile. */
  static __thread char copy[ERR_MSG_MAX];
  pthread_mutex_lock(&err_lock);
  memcpy(copy, err_global, sizeof(copy));
  pthread_mutex_unlock(&err_lock);
  return copy;
}

NCCL_API(const char*, ncclGetErrorString, ncclResult_t result);
const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "success";
    case ncclUnhandledCudaError: return "a CUDA call failed (ncclGetLastError has the details)";
    case ncclSystemError: return "a system call or resource failed (ncclGetLastError has the details)";
    case ncclInternalError: return "internal error in collie (please report it with ncclGetLastError's text)";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError names it)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError says why)";
    case ncclRemoteError: return "a remote rank failed or the network between ranks did";
    case ncclInProgress: return "operation still in progress";
    default: return "unknown collie/NCCL result code";
  }
}
