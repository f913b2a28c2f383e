/* Multi-process test harness: forks N ranks on this machine, hands each the
 * same unique ID (created by the parent, whose process then hosts the root),
 * and waits with a hard limit so a hang fails the test instead of blocking CI.
 * Each rank reports failures with MP_CHECK; the test passes only if every
 * rank exits 0. */
#ifndef COLLIE_MP_HARNESS_H
#define COLLIE_MP_HARNESS_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

typedef int (*mp_rank_fn)(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg);

#define MP_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                \
      fprintf(stderr, __VA_ARGS__);                                                  \
      fprintf(stderr, "\n");                                                         \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

#define MP_NCCL(call)                                                                \
  do {                                                                               \
    ncclResult_t r_ = (call);                                                        \
    if (r_ != ncclSuccess) {                                                         \
      fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,       \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                       \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

static double mp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Forks `nranks` children; ranks listed in `skip` (may be NULL) are not started.
 * Returns 0 when every started rank exits 0 before `limit_s`. */
static int mp_run_ids(int nranks, int nids, mp_rank_fn fn, void* arg, const int* skip, int nskip, double limit_s) {
  ncclUniqueId ids[16];
  if (nids > 16) return 1;
  for (int i = 0; i < nids; i++) {
    ncclResult_t r = ncclGetUniqueId(&ids[i]);
    if (r != ncclSuccess) {
      fprintf(stderr, "FAIL: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
      return 1;
    }
  }
  fflush(NULL);
  pid_t* pids = calloc((size_t)nranks, sizeof(pid_t));
  for (int r = 0; r < nranks; r++) {
    int skipped = 0;
    for (int k = 0; k < nskip; k++) skipped |= skip[k] == r;
    if (skipped) continue;
    pid_t p = fork();
    if (p == 0) {
      int rc = fn(r, nranks, ids, nids, arg);
      fflush(NULL);
      _exit(rc);
    }
    pids[r] = p;
  }
  int failed = 0, alive = 0;
  for (int r = 0; r < nranks; r++) alive += pids[r] > 0;
  double deadline = mp_now() + limit_s;
  while (alive > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < nranks; r++) {
        if (pids[r] != p) continue;
        pids[r] = 0;
        alive--;
        if (WIFSIGNALED(status)) {
          fprintf(stderr, "FAIL: rank %d killed by signal %d\n", r, WTERMSIG(status));
          failed = 1;
        } else if (WEXITSTATUS(status) != 0) {
          fprintf(stderr, "FAIL: rank %d exited with %d\n", r, WEXITSTATUS(status));
          failed = 1;
        }
      }
      continue;
    }
    if (mp_now() > deadline) {
      fprintf(stderr, "FAIL: %d rank(s) still running after %.0f s: killing them (a hang)\n", alive, limit_s);
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      while (waitpid(-1, NULL, 0) > 0) {}
      failed = 1;
      break;
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  free(pids);
  return failed;
}

static int mp_run(int nranks, mp_rank_fn fn, void* arg, double limit_s) {
  return mp_run_ids(nranks, 1, fn, arg, NULL, 0, limit_s);
}

#endif
