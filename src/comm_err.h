/* The communicator's error record and stop checks: the one place every layer
 * (API front, executor, algorithms, transports, the keep-alive ring of
 * health.c) asks "must this operation stop, and why". It sits below all of
 * them and calls none of them (comm_err.c). */
#ifndef COLLIE_COMM_ERR_H
#define COLLIE_COMM_ERR_H

#include "comm.h"

/* Records the communicator's first fatal error with its message (later ones
 * are ignored; nothing is recorded on a revoked communicator). Safe from any
 * thread. */
int comm_set_error(struct ncclComm* comm, ncclResult_t code, const char* msg); /* 1: recorded */
/* The recorded message ("" if none). */
const char* comm_error_msg(struct ncclComm* comm);
/* Abort, revoke or a recorded error: operations must stop (three loads, no
 * message; comm_stop_check says why). */
static inline int comm_stopping(struct ncclComm* comm) {
  ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  return __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) || __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) ||
         (e != ncclSuccess && e != ncclInProgress);
}
/* ncclSuccess while operations may continue; else the reason they must stop
 * (abort, revoke, a recorded error), with err_set called for this thread. */
ncclResult_t comm_stop_check(struct ncclComm* comm);
/* The same as a bootstrap watch (bootstrap_set_watch). */
ncclResult_t comm_stop_check_cb(void* comm);

/* A peer broke off an operation (poisoned its connectors, reported an error
 * in a slot): the cause may be a failure the keep-alive ring reports a moment
 * later. Waits up to `ms` for it and returns it (err_set done), so the message
 * names the rank that failed rather than the neighbour that passed the error
 * on; ncclSuccess if nothing came. */
ncclResult_t comm_await_cause(struct ncclComm* comm, int ms);
/* How long a broken connection or a poisoned connector waits for that cause:
 * once, where the breakage is seen (wait loops, socket transport). */
#define CAUSE_WAIT_MS 250

/* The error of a waiter whose peer left the communicator on purpose. */
ncclResult_t comm_left_error(struct ncclComm* comm, int peer);

#endif
