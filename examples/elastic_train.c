/* An elastic training loop (collie_elastic_*), used by tests/elastic. The
 * state -- a step counter and a vector -- evolves so that its final value
 * depends only on the number of steps, never on the world size or on where
 * failures struck: step s adds the engine allreduce-AVERAGE of values that
 * every rank computes alike from s (small integers, so the average is exact).
 *
 * Environment (all optional):
 *   ELASTIC_STEPS=N          steps to train (default 40)
 *   ELASTIC_STEP_MS=M        sleep per step, so joins happen mid-run (default 20)
 *   ELASTIC_KILL_SLOT=K      the worker in slot K (COLLIE_ELASTIC_SLOT) ...
 *   ELASTIC_KILL_STEP=S      ... kills itself with SIGKILL in the middle of step S
 *   ELASTIC_KILL_ALWAYS=1    ... in every incarnation, not only the first
 *                            (COLLIE_ELASTIC_RESTARTS=0), at its first step >= S
 *   ELASTIC_WAIT_SIZE=W      before the last step, wait until the world has W
 *                            ranks again (a replacement or new worker joined)
 * Prints "final step=N sum=... hash=..." and "OK" when the state equals the
 * closed form; exits 1 on any error. */
#define _DEFAULT_SOURCE /* usleep */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collie.h"

#define DIM 1000

/* Elastic errors reach collie_last_error() once the engine offers the hook
 * (see src/elastic/elastic.c); ncclGetLastError has them anyway. */
static const char* last_err(void) {
  const char* e = collie_last_error();
  return e && *e ? e : ncclGetLastError(NULL);
}

static long env_long(const char* name, long def) {
  const char* v = getenv(name);
  return v && *v ? strtol(v, NULL, 10) : def;
}

/* What every rank contributes at step s: identical on all ranks. */
static double contribution(long s, int i) { return (double)((s * 31 + i * 7) % 17); }

static int train_step(long s, double* x, double* tmp) {
  for (int i = 0; i < DIM; i++) tmp[i] = contribution(s, i);
  int h = collie_allreduce_async("grad", tmp, tmp, DIM, ncclFloat64, COLLIE_AVERAGE, 1.0, 1.0, COLLIE_WORLD);
  if (h < 0) return h;
  int rc = collie_wait(h);
  collie_release(h);
  if (rc != 0) return rc;
  for (int i = 0; i < DIM; i++) x[i] += tmp[i];
  return 0;
}

static uint64_t hash_state(const double* x, long step) {
  uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)step;
  const unsigned char* p = (const unsigned char*)x;
  for (size_t i = 0; i < DIM * sizeof(double); i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

int main(void) {
  long steps = env_long("ELASTIC_STEPS", 40);
  long step_ms = env_long("ELASTIC_STEP_MS", 20);
  const char* kill_slot = getenv("ELASTIC_KILL_SLOT");
  const char* slot = getenv("COLLIE_ELASTIC_SLOT");
  long kill_step = env_long("ELASTIC_KILL_STEP", -1);
  long kill_always = env_long("ELASTIC_KILL_ALWAYS", 0);
  long wait_size = env_long("ELASTIC_WAIT_SIZE", 0);
  long restarts = env_long("COLLIE_ELASTIC_RESTARTS", 0);
  int doomed = kill_slot && slot && strcmp(kill_slot, slot) == 0 && (restarts == 0 || kill_always);

  static double x[DIM], tmp[DIM];
  long step = 0;
  if (collie_elastic_init() != 0) {
    fprintf(stderr, "elastic_train: init failed: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  int me = collie_elastic_worker_id();
  if (collie_elastic_state_add("step", &step, sizeof(step)) != 0 || collie_elastic_state_add("x", x, sizeof(x)) != 0) {
    fprintf(stderr, "elastic_train: %s\n", last_err());
    return 1;
  }
  int rc = collie_elastic_state_sync();
  int resets = 0;
  while (step < steps || rc != 0) {
    if (rc == COLLIE_ERR_COMMUNICATION || rc == COLLIE_ERR_MEMBERSHIP || rc == COLLIE_ERR_SHUTDOWN) {
      printf("worker %d: %s at step %ld; resetting\n", me,
             rc == COLLIE_ERR_MEMBERSHIP ? "membership changed" : "lost a peer", step);
      fflush(stdout);
      if (collie_elastic_reset() != 0) {
        fprintf(stderr, "elastic_train: worker %d: reset failed: %s\n", me, ncclGetLastError(NULL));
        return 1;
      }
      resets++;
      printf("worker %d: epoch %d, rank %d of %d, resuming at step %ld\n", me, collie_elastic_epoch(),
             collie_rank(), collie_size(), step);
      fflush(stdout);
      rc = 0;
      continue;
    }
    if (rc != 0) {
      fprintf(stderr, "elastic_train: worker %d: error %d: %s\n", me, rc, last_err());
      return 1;
    }
    if (wait_size > 0 && step == steps - 1 && collie_size() < wait_size) {
      /* Hold the last step until the world has grown back; check() is
       * collective, so every rank waits here together. */
      usleep(50 * 1000);
      rc = collie_elastic_check();
      continue;
    }
    /* Once: at that step. Always: at the first step this incarnation runs
     * from there on (a replacement resumes from the synced step). */
    if (doomed && (kill_always ? step >= kill_step : step == kill_step)) {
      /* Die with an operation in flight, as a crash would; its input is
       * right, since the survivors may well complete it. */
      for (int i = 0; i < DIM; i++) tmp[i] = contribution(step, i);
      int h = collie_allreduce_async("grad", tmp, tmp, DIM, ncclFloat64, COLLIE_AVERAGE, 1.0, 1.0, COLLIE_WORLD);
      (void)h;
      usleep(1000);
      raise(SIGKILL);
    }
    rc = train_step(step, x, tmp);
    if (rc != 0) continue;
    step++;
    collie_elastic_state_commit();
    if (step_ms > 0) usleep((useconds_t)step_ms * 1000);
    rc = collie_elastic_check();
  }

  double sum = 0, want_sum = 0;
  int ok = 1;
  for (int i = 0; i < DIM; i++) {
    double want = 0;
    for (long s = 0; s < steps; s++) want += contribution(s, i);
    if (x[i] != want) ok = 0;
    sum += x[i];
    want_sum += want;
  }
  printf("worker %d: final step=%ld sum=%.1f hash=%016llx size=%d epoch=%d resets=%d%s\n", me, step, sum,
         (unsigned long long)hash_state(x, step), collie_size(), collie_elastic_epoch(), collie_elastic_resets(),
         ok ? " OK" : " WRONG");
  if (!ok) fprintf(stderr, "elastic_train: worker %d: state differs from the closed form (sum %.1f, want %.1f)\n", me, sum, want_sum);
  fflush(stdout);
  collie_elastic_shutdown();
  return ok ? 0 : 1;
}
