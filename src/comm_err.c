/* The communicator's error record (comm_err.h): the first fatal error and its
 * message, and the stop checks every wait loop makes. Below the API front,
 * the executor, the algorithms, the transports and health.c, which all call
 * it; it calls nothing above it. */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm_err.h"

int comm_set_error(struct ncclComm* comm, ncclResult_t code, const char* msg) {
  if (code == ncclSuccess || code == ncclInProgress) return 0;
  int set = 0;
  pthread_mutex_lock(&comm->err_lock);
  ncclResult_t cur = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  if ((cur == ncclSuccess || cur == ncclInProgress) && !__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
    snprintf(comm->err_msg, sizeof(comm->err_msg), "%s", msg && msg[0] ? msg : ncclGetErrorString(code));
    __atomic_store_n(&comm->async_error, code, __ATOMIC_RELEASE);
    set = 1;
  }
  pthread_mutex_unlock(&comm->err_lock);
  return set;
}

const char* comm_error_msg(struct ncclComm* comm) { return comm->err_msg; }

ncclResult_t comm_stop_check(struct ncclComm* comm) {
  if (!comm_stopping(comm)) return ncclSuccess;
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_RELAXED))
    return err_set(ncclSystemError, "rank %d: operation aborted (ncclCommAbort)", comm->rank);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_RELAXED))
    return err_set(ncclInvalidUsage, "rank %d: the communicator was revoked; the operation was stopped", comm->rank);
  ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  if (e == ncclSuccess || e == ncclInProgress) return ncclSuccess;
  char msg[sizeof(comm->err_msg)];
  pthread_mutex_lock(&comm->err_lock);
  memcpy(msg, comm->err_msg, sizeof(msg));
  pthread_mutex_unlock(&comm->err_lock);
  return err_set(e, "rank %d: %s", comm->rank, msg);
}

ncclResult_t comm_stop_check_cb(void* comm) { return comm_stop_check(comm); }

ncclResult_t comm_await_cause(struct ncclComm* comm, int ms) {
  /* Only a keep-alive ring (health.c) reports causes; without one there is nothing to wait for. */
  if (!__atomic_load_n(&comm->health, __ATOMIC_ACQUIRE)) return ncclSuccess;
  int64_t end = time_ms() + ms;
  for (;;) {
    if (comm_stopping(comm)) return comm_stop_check(comm);
    int64_t left = end - time_ms();
    if (left <= 0) return ncclSuccess;
    /* Readable once anything is recorded (or on abort, revoke): no polling period. */
    struct pollfd p = {.fd = comm->stop_fd, .events = POLLIN};
    if (poll(&p, 1, (int)left) < 0) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
}

ncclResult_t comm_left_error(struct ncclComm* comm, int peer) {
  return err_set(ncclRemoteError,
                 "rank %d: rank %d (%s) left the communicator (destroyed or aborted it) while this rank waited for "
                 "it in an operation it never joined",
                 comm->rank, peer, comm->peers[peer].hostname);
}
