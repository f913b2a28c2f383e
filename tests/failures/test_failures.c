/* Failure tests: a rank killed (SIGKILL) or frozen (SIGSTOP: no FIN, no RST,
 * packets just stop) at a random moment of an allreduce loop, after which
 * every survivor must get an error naming it, shrink with NCCL_SHRINK_ABORT
 * and carry on with correct results; ncclCommAbort from another thread in the
 * middle of a collective; nonblocking init, collectives, groups and split;
 * shrink and revoke semantics. `kill`/`stop` also print the timings that
 * bench/failures.sh collects (no timed assertion here: the ctest TIMEOUT bounds
 * every case). Usage: test_failures <case> [args]. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>

#include "../mp/harness.h"
#include "collie.h"
#include "failures.h" /* health_mute */

static int count_fds(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  for (struct dirent* e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

/* collie's segments are memfds (never named); count anything that looks like
 * ours in /dev/shm all the same (other programs' entries are not our business). */
static int count_dev_shm(void) {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  for (struct dirent* e; (e = readdir(d));) n += strstr(e->d_name, "collie") != NULL || strstr(e->d_name, "nccl") != NULL;
  closedir(d);
  return n;
}

static void sleep_ms(double ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (time_t)(ms / 1000)) * 1e6)};
  nanosleep(&ts, NULL);
}

/* Waits for a nonblocking communicator to settle; returns its state. */
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t a = ncclInProgress;
  while (a == ncclInProgress) {
    if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclInternalError;
    if (a == ncclInProgress) sleep_ms(1);
  }
  return a;
}

/* COLLIE_TEST_HOSTID=1: every rank is its own "host" (socket transport). */
static void maybe_hostid(int rank) {
  if (!getenv("COLLIE_TEST_HOSTID")) return;
  char h[32];
  snprintf(h, sizeof(h), "failhost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
}

static float value_at(int rank, size_t i) { return (float)((rank + 1) * 3 + (int)(i % 7)); }

/* Allreduce of `count` floats with rank-dependent input; checks every element. */
static int allreduce_check(ncclComm_t comm, float* send, float* recv, size_t count, const char* what) {
  int rank, n;
  MP_NCCL(ncclCommUserRank(comm, &rank));
  MP_NCCL(ncclCommCount(comm, &n));
  for (size_t i = 0; i < count; i++) send[i] = value_at(rank, i);
  ncclResult_t r = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL);
  if (r == ncclInProgress) r = settle(comm);
  MP_CHECK(r == ncclSuccess, "%s: allreduce -> %s: %s", what, ncclGetErrorString(r), ncclGetLastError(comm));
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int k = 0; k < n; k++) want += value_at(k, i);
    MP_CHECK(recv[i] == want, "%s: element %zu is %g, want %g (rank %d of %d)", what, i, recv[i], want, rank, n);
  }
  return 0;
}

/* ------------------------------------------------------------ a victim per trial */

#define NR 4
struct shared {
  int pid[NR];
  int looping[NR];
  int victim;
  double t_kill;
  double t_err[NR], t_shrink[NR], t_resume[NR], t_abort[NR];
  int code[NR];
};
static struct shared* sh;
static size_t g_bytes;
static int g_sig;
/* The kill comes this many ms (at random, below it) after every rank began
 * its loop: 1000 by default (anywhere in the first few operations); a few ms
 * aim at the first operation's connection setup. */
static int g_window_ms = 1000;

static int victim_rank(int rank, int nranks, const ncclUniqueId* ids) {
  maybe_hostid(rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t count = g_bytes / sizeof(float);
  float* send = malloc(count * sizeof(float));
  float* recv = malloc(count * sizeof(float));
  MP_CHECK(send && recv, "out of memory");
  for (size_t i = 0; i < count; i++) send[i] = value_at(rank, i);
  sh->pid[rank] = getpid();
  __atomic_store_n(&sh->looping[rank], 1, __ATOMIC_RELEASE);
  ncclResult_t r = ncclSuccess;
  for (int it = 0; r == ncclSuccess; it++) {
    MP_CHECK(it < 100000, "no failure after %d allreduces", it);
    r = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL);
  }
  double t_err = mp_now();
  int victim = __atomic_load_n(&sh->victim, __ATOMIC_ACQUIRE);
  MP_CHECK(rank != victim, "the victim saw an error before it was stopped: %s", ncclGetLastError(comm));
  sh->t_err[rank] = t_err;
  sh->code[rank] = r;
  const char* msg = ncclGetLastError(comm);
  char want[32];
  snprintf(want, sizeof(want), "rank %d ", victim);
  if (getenv("FAIL_VERBOSE"))
    printf("  rank %d: error after %.1f ms: %s\n", rank, 1e3 * (t_err - sh->t_kill), msg);
  MP_CHECK(r == ncclRemoteError || r == ncclSystemError, "allreduce failed with %s: %s", ncclGetErrorString(r), msg);
  MP_CHECK(strstr(msg, want) != NULL, "the error does not name rank %d: %s", victim, msg);
  ncclResult_t async;
  MP_NCCL(ncclCommGetAsyncError(comm, &async));
  MP_CHECK(async == ncclRemoteError || async == ncclSystemError, "async error %d after the failure", (int)async);
  /* Later calls fail too, at once. */
  r = ncclAllReduce(send, recv, 1, ncclFloat, ncclSum, comm, NULL);
  MP_CHECK(r == ncclRemoteError || r == ncclSystemError, "a later call returned %s", ncclGetErrorString(r));
  /* Shrink the survivors and carry on. */
  ncclComm_t nc;
  double t0 = mp_now();
  MP_NCCL(ncclCommShrink(comm, &victim, 1, &nc, NULL, NCCL_SHRINK_ABORT));
  sh->t_shrink[rank] = mp_now() - t0;
  int nr = -1, nn = -1;
  MP_NCCL(ncclCommUserRank(nc, &nr));
  MP_NCCL(ncclCommCount(nc, &nn));
  MP_CHECK(nn == nranks - 1 && nr == rank - (rank > victim), "new comm: rank %d of %d", nr, nn);
  if (allreduce_check(nc, send, recv, count, "after shrink")) return 1;
  sh->t_resume[rank] = mp_now() - t0;
  t0 = mp_now();
  MP_NCCL(ncclCommAbort(comm));
  sh->t_abort[rank] = mp_now() - t0;
  if (allreduce_check(nc, send, recv, 1000, "after the parent's abort")) return 1;
  MP_NCCL(ncclCommDestroy(nc));
  free(send);
  free(recv);
  return 0;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void stats(const char* what, double* v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  printf("%-28s median %8.1f ms  max %8.1f ms  min %8.1f ms  (%d samples)\n", what, 1e3 * v[n / 2], 1e3 * v[n - 1],
         1e3 * v[0], n);
}

/* Forks NR ranks, stops one at a random moment of its loop with g_sig, and
 * checks that the others recover. Returns 0 on success; fills *lat with the
 * latest survivor's kill-to-error time. */
static int victim_trial(int trial, double* lat, double* shrink, double* resume, double* abort_t) {
  memset(sh, 0, sizeof(*sh));
  sh->victim = rand() % NR;
  int fds[NR][2];
  pid_t pids[NR];
  char logdir[256];
  mp_log_open(logdir, sizeof(logdir));
  root_reap();
  fflush(NULL);
  for (int r = 0; r < NR; r++) {
    if (pipe(fds[r]) != 0) {
      mp_log_close(logdir, NR, 1);
      return 1;
    }
    pids[r] = fork();
    if (pids[r] == 0) {
      ncclUniqueId id;
      mp_log_child(logdir, r);
      close(fds[r][1]);
      if (read(fds[r][0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
      int rc = victim_rank(r, NR, &id);
      fflush(NULL);
      _exit(rc);
    }
    close(fds[r][0]);
  }
  ncclUniqueId id;
  int failed = ncclGetUniqueId(&id) != ncclSuccess;
  for (int r = 0; r < NR; r++) {
    if (!failed && write(fds[r][1], &id, sizeof(id)) != (ssize_t)sizeof(id)) failed = 1;
    close(fds[r][1]);
  }
  double deadline = mp_now() + 60;
  int killed = 0, alive = NR;
  int v = sh->victim;
  double delay = 0;
  while (alive > 0 && !failed) {
    if (!killed) {
      int all = 1;
      for (int r = 0; r < NR; r++) all &= __atomic_load_n(&sh->looping[r], __ATOMIC_ACQUIRE);
      if (all) {
        /* A random moment of the loop (g_window_ms). */
        delay = (double)(rand() % g_window_ms);
        sleep_ms(delay);
        sh->t_kill = mp_now();
        kill(pids[v], g_sig);
        killed = 1;
      }
    }
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < NR; r++) {
        if (pids[r] != p) continue;
        pids[r] = 0;
        alive--;
        int ok = r == v ? (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                        : (WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!ok) {
          fprintf(stderr, "FAIL trial %d: rank %d (victim %d) ended with status 0x%x\n", trial, r, v, status);
          failed = 1;
        }
      }
      continue;
    }
    /* A frozen victim is killed once the survivors are done with it. */
    if (killed && g_sig != SIGKILL && alive == 1 && pids[v] > 0) kill(pids[v], SIGKILL);
    if (mp_now() > deadline) {
      fprintf(stderr, "FAIL trial %d: ranks still running after 60 s (a hang)\n", trial);
      for (int r = 0; r < NR; r++)
        if (pids[r] > 0 && r != v) mp_dump_stacks(pids[r], r);
      failed = 1;
    }
    sleep_ms(1);
  }
  for (int r = 0; r < NR; r++)
    if (pids[r] > 0) kill(pids[r], SIGKILL);
  while (waitpid(-1, NULL, 0) > 0) {}
  mp_log_close(logdir, NR, failed);
  if (failed) return 1;
  double worst = 0;
  for (int r = 0; r < NR; r++) {
    if (r == v) continue;
    double d = sh->t_err[r] - sh->t_kill;
    if (d > worst) worst = d;
  }
  *lat = worst;
  *shrink = *resume = *abort_t = 0;
  for (int r = 0; r < NR; r++) {
    if (r == v) continue;
    if (sh->t_shrink[r] > *shrink) *shrink = sh->t_shrink[r];
    if (sh->t_resume[r] > *resume) *resume = sh->t_resume[r];
    if (sh->t_abort[r] > *abort_t) *abort_t = sh->t_abort[r];
  }
  printf("trial %2d: victim rank %d after %4.0f ms; survivors' error after %7.1f ms (latest), shrink %6.1f ms, "
         "shrink+first allreduce %7.1f ms, abort of the parent %5.1f ms\n",
         trial, v, delay, 1e3 * worst, 1e3 * *shrink, 1e3 * *resume, 1e3 * *abort_t);
  fflush(stdout);
  return 0;
}

static int case_victim(int sig, int trials, size_t bytes) {
  g_sig = sig;
  g_bytes = bytes;
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  unsigned seed = (unsigned)time(NULL);
  srand(seed);
  printf("%d trials, %d ranks, %zu-byte allreduce loop, %s at a random moment (seed %u)\n", trials, NR, bytes,
         sig == SIGKILL ? "SIGKILL" : "SIGSTOP", seed);
  double* lat = calloc((size_t)trials, sizeof(double) * 4);
  int shm0 = count_dev_shm();
  for (int t = 0; t < trials; t++)
    if (victim_trial(t, &lat[t], &lat[trials + t], &lat[2 * trials + t], &lat[3 * trials + t])) return 1;
  stats("fault -> error (survivors)", lat, trials);
  stats("ncclCommShrink", lat + trials, trials);
  stats("shrink + first allreduce", lat + 2 * trials, trials);
  stats("ncclCommAbort (parent)", lat + 3 * trials, trials);
  int shm1 = count_dev_shm();
  if (shm1 > shm0) {
    fprintf(stderr, "FAIL: %d new entries in /dev/shm\n", shm1 - shm0);
    return 1;
  }
  free(lat);
  return 0;
}

/* ------------------------------------------------------------ abort mid-collective */

/* The main thread holds `mu` except while inside a call, so the abort lands
 * either in the middle of a call (which then fails) or while the main thread
 * waits for `mu` between calls: either way no call starts after it. */
struct abort_arg {
  ncclComm_t comm;
  double delay_ms, took;
  ncclResult_t res;
  pthread_mutex_t mu;
  int aborted;
};

static void* abort_thread(void* p) {
  struct abort_arg* a = p;
  sleep_ms(a->delay_ms);
  pthread_mutex_lock(&a->mu);
  double t0 = mp_now();
  a->res = ncclCommAbort(a->comm);
  a->took = mp_now() - t0;
  a->aborted = 1;
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

static int rank_abort(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  int aborter = *(int*)arg;
  maybe_hostid(rank);
  int fd0 = count_fds();
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t count = (8u << 20) / sizeof(float);
  float* send = calloc(count, sizeof(float));
  float* recv = calloc(count, sizeof(float));
  MP_CHECK(send && recv, "out of memory");
  if (allreduce_check(comm, send, recv, 1000, "before the abort")) return 1;
  pthread_t th;
  struct abort_arg a = {comm, 20 + (rank * 37) % 200, 0, ncclInternalError, PTHREAD_MUTEX_INITIALIZER, 0};
  pthread_mutex_lock(&a.mu);
  if (rank == aborter) pthread_create(&th, NULL, abort_thread, &a);
  ncclResult_t r = ncclSuccess;
  for (int it = 0; r == ncclSuccess && !a.aborted; it++) {
    MP_CHECK(it < 100000, "no error after %d allreduces", it);
    pthread_mutex_unlock(&a.mu);
    r = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL);
    pthread_mutex_lock(&a.mu);
  }
  pthread_mutex_unlock(&a.mu);
  /* The aborting rank's call may also have finished just before the abort. */
  MP_CHECK(r == ncclRemoteError || r == ncclSystemError || (rank == aborter && r == ncclSuccess),
           "allreduce ended with %s", ncclGetErrorString(r));
  if (rank == aborter) {
    /* The handle is gone (or going): only the abort thread touches it. */
    pthread_join(th, NULL);
    MP_CHECK(a.res == ncclSuccess, "ncclCommAbort -> %d", (int)a.res);
    printf("rank %d: ncclCommAbort in another thread, mid-collective: %.1f ms\n", rank, 1e3 * a.took);
  } else {
    char want[32];
    snprintf(want, sizeof(want), "rank %d", aborter);
    const char* msg = ncclGetLastError(comm);
    fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), msg);
    MP_CHECK(strstr(msg, want) != NULL, "the error does not name the aborting rank %d: %s", aborter, msg);
    double t0 = mp_now();
    MP_NCCL(ncclCommDestroy(comm));
    printf("rank %d: ncclCommDestroy after the error: %.1f ms\n", rank, 1e3 * (mp_now() - t0));
  }
  free(send);
  free(recv);
  int fd1 = count_fds();
  MP_CHECK(fd1 == fd0, "%d fds open before init, %d after teardown", fd0, fd1);
  return 0;
}

static int case_abort(int nranks) {
  int aborter = nranks / 2;
  int shm0 = count_dev_shm();
  int rc = mp_run(nranks, rank_abort, &aborter, 120);
  if (count_dev_shm() > shm0) {
    fprintf(stderr, "FAIL: new entries in /dev/shm\n");
    return 1;
  }
  return rc;
}

/* ------------------------------------------------------------ nonblocking */

static int rank_nonblocking(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  maybe_hostid(rank);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, ids[0], rank, &cfg);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess, "nonblocking init -> %s", ncclGetErrorString(r));
  MP_CHECK(comm != NULL, "no handle from a nonblocking init");
  MP_CHECK(settle(comm) == ncclSuccess, "init: %s", ncclGetLastError(comm));
  size_t count = 1 << 18;
  float* send = calloc(count * nranks, sizeof(float));
  float* recv = calloc(count * nranks, sizeof(float));
  float* bc = calloc(count, sizeof(float));
  /* A collective returns at once and completes in the background. */
  if (allreduce_check(comm, send, recv, count, "nonblocking allreduce")) return 1;
  /* A group: ncclGroupEnd returns ncclInProgress. */
  for (size_t i = 0; i < count; i++) {
    send[i] = value_at(rank, i);
    bc[i] = rank == 1 ? (float)i : -1.f;
  }
  MP_NCCL(ncclGroupStart());
  MP_NCCL(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));
  MP_NCCL(ncclBroadcast(bc, bc, count, ncclFloat, 1, comm, NULL));
  r = ncclGroupEnd();
  MP_CHECK(r == ncclInProgress || r == ncclSuccess, "ncclGroupEnd -> %s", ncclGetErrorString(r));
  MP_CHECK(settle(comm) == ncclSuccess, "group: %s", ncclGetLastError(comm));
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int k = 0; k < nranks; k++) want += value_at(k, i);
    MP_CHECK(recv[i] == want && bc[i] == (float)i, "group result wrong at %zu", i);
  }
  /* An argument error is reported by the call and leaves the comm usable. */
  r = ncclAllReduce(NULL, recv, count, ncclFloat, ncclSum, comm, NULL);
  MP_CHECK(r == ncclInvalidArgument, "NULL sendbuff -> %s", ncclGetErrorString(r));
  MP_CHECK(settle(comm) == ncclSuccess, "the comm is not usable after an argument error");
  if (allreduce_check(comm, send, recv, 1000, "after an argument error")) return 1;
  /* Split inherits nonblocking. */
  ncclComm_t sub = NULL;
  r = ncclCommSplit(comm, rank % 2, -rank, &sub, NULL);
  MP_CHECK(r == ncclInProgress || r == ncclSuccess, "nonblocking split -> %s: %s", ncclGetErrorString(r),
           ncclGetLastError(comm));
  MP_CHECK(settle(sub) == ncclSuccess, "split: %s", ncclGetLastError(sub));
  int sn, sr;
  MP_NCCL(ncclCommCount(sub, &sn));
  MP_NCCL(ncclCommUserRank(sub, &sr));
  int want_n = (nranks + 1 - rank % 2) / 2, above = 0;
  for (int k = rank + 2; k < nranks; k += 2) above++;
  MP_CHECK(sn == want_n && sr == above, "split: rank %d of %d, want %d of %d", sr, sn, above, want_n);
  if (allreduce_check(sub, send, recv, 4096, "nonblocking split")) return 1;
  MP_NCCL(ncclCommDestroy(sub));
  /* NCCL_COMM_BLOCKING=0 makes even ncclCommInitRank nonblocking. */
  setenv("NCCL_COMM_BLOCKING", "0", 1);
  ncclComm_t c2 = NULL;
  r = ncclCommInitRank(&c2, nranks, ids[1], rank);
  unsetenv("NCCL_COMM_BLOCKING");
  MP_CHECK(r == ncclInProgress || r == ncclSuccess, "NCCL_COMM_BLOCKING=0 init -> %s", ncclGetErrorString(r));
  MP_CHECK(settle(c2) == ncclSuccess, "env init: %s", ncclGetLastError(c2));
  if (allreduce_check(c2, send, recv, 1000, "NCCL_COMM_BLOCKING=0")) return 1;
  MP_NCCL(ncclCommDestroy(c2));
  /* A peer that vanishes: queued work ends in ncclRemoteError naming it. It
   * leaves once the others are past the last collective it took part in
   * (bounded), so none of them meets the departure inside that one. */
  int gone = nranks - 1;
  if (rank == gone) {
    free(send);
    free(recv);
    free(bc);
    mp_await(0, nranks - 1, 100);
    _exit(0); /* no destroy, no goodbye */
  }
  mp_arrive(0);
  r = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL);
  MP_CHECK(r == ncclInProgress || r == ncclRemoteError, "allreduce with a peer gone -> %s", ncclGetErrorString(r));
  r = settle(comm);
  MP_CHECK(r == ncclRemoteError || r == ncclSystemError, "with rank %d gone the comm settles on %s", gone,
           ncclGetErrorString(r));
  char want[32];
  snprintf(want, sizeof(want), "rank %d ", gone);
  MP_CHECK(strstr(ncclGetLastError(comm), want), "the error does not name rank %d: %s", gone, ncclGetLastError(comm));
  MP_NCCL(ncclCommAbort(comm));
  free(send);
  free(recv);
  free(bc);
  return 0;
}

/* ------------------------------------------------------------ shrink */

static int rank_shrink(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t count = 100000;
  float* send = calloc(count, sizeof(float));
  float* recv = calloc(count, sizeof(float));
  if (allreduce_check(comm, send, recv, count, "before shrink")) return 1;
  /* Argument errors come back at once (no rank waits on another). */
  ncclComm_t nc = (ncclComm_t)(uintptr_t)0x1;
  int bad[2] = {1, 1}, out_of_range = nranks, self = rank, all[16];
  for (int i = 0; i < nranks; i++) all[i] = i;
  MP_CHECK(ncclCommShrink(comm, bad, 1, &nc, NULL, 7) == ncclInvalidArgument, "flags 7 accepted");
  MP_CHECK(nc == NULL, "newcomm not cleared");
  MP_CHECK(ncclCommShrink(comm, bad, 2, &nc, NULL, 0) == ncclInvalidArgument, "duplicate rank accepted");
  MP_CHECK(ncclCommShrink(comm, &out_of_range, 1, &nc, NULL, 0) == ncclInvalidArgument, "rank %d accepted", nranks);
  MP_CHECK(ncclCommShrink(comm, all, nranks, &nc, NULL, 0) == ncclInvalidUsage, "excluding all accepted");
  MP_CHECK(ncclCommShrink(comm, NULL, 1, &nc, NULL, 0) == ncclInvalidArgument, "NULL list accepted");
  MP_CHECK(ncclCommShrink(comm, &self, 1, &nc, NULL, 0) == ncclInvalidUsage, "an excluded rank may not call it");
  MP_CHECK(ncclCommShrink(comm, NULL, 0, NULL, NULL, 0) == ncclInvalidArgument, "NULL newcomm accepted");
  /* Exclude ranks 1 and 3: they leave (once every rank is out of the
   * allreduce above, so no one meets the departure inside it); the others
   * renumber in order. */
  int excl[2] = {3, 1};
  mp_arrive(0);
  if (rank == 1 || rank == 3) {
    mp_await(0, nranks, 100);
    MP_NCCL(ncclCommDestroy(comm));
    free(send);
    free(recv);
    return 0;
  }
  MP_NCCL(ncclCommShrink(comm, excl, 2, &nc, NULL, NCCL_SHRINK_DEFAULT));
  int nr, nn;
  MP_NCCL(ncclCommUserRank(nc, &nr));
  MP_NCCL(ncclCommCount(nc, &nn));
  int want_r = rank - (rank > 1) - (rank > 3);
  MP_CHECK(nn == nranks - 2 && nr == want_r, "shrunk: rank %d of %d, want %d of %d", nr, nn, want_r, nranks - 2);
  if (allreduce_check(nc, send, recv, count, "after shrink")) return 1;
  /* Broadcast from the last new rank: the old rank 4. */
  for (size_t i = 0; i < count; i++) recv[i] = nr == nn - 1 ? (float)(i * 2) : 0.f;
  MP_NCCL(ncclBroadcast(recv, recv, count, ncclFloat, nn - 1, nc, NULL));
  for (size_t i = 0; i < count; i++) MP_CHECK(recv[i] == (float)(i * 2), "broadcast wrong at %zu", i);
  /* Revoke: calls are refused, the state settles on success, shrink still works. */
  MP_CHECK(ncclCommRevoke(nc, 1) == ncclInvalidArgument, "revokeFlags 1 accepted");
  ncclResult_t r = ncclCommRevoke(nc, NCCL_REVOKE_DEFAULT);
  MP_CHECK(r == ncclSuccess || r == ncclInProgress, "revoke -> %s", ncclGetErrorString(r));
  MP_CHECK(settle(nc) == ncclSuccess, "revoked comm settles on an error");
  MP_CHECK(ncclCommRevoke(nc, 0) == ncclInvalidUsage, "second revoke accepted");
  r = ncclAllReduce(send, recv, 1, ncclFloat, ncclSum, nc, NULL);
  MP_CHECK(r == ncclInvalidUsage, "allreduce on a revoked comm -> %s", ncclGetErrorString(r));
  MP_CHECK(strstr(ncclGetLastError(NULL), "revoked"), "message: %s", ncclGetLastError(NULL));
  ncclComm_t nc2;
  MP_NCCL(ncclCommShrink(nc, NULL, 0, &nc2, NULL, NCCL_SHRINK_DEFAULT));
  if (allreduce_check(nc2, send, recv, count, "shrink of a revoked comm")) return 1;
  MP_NCCL(ncclCommDestroy(nc));
  MP_NCCL(ncclCommDestroy(nc2));
  MP_NCCL(ncclCommDestroy(comm));
  free(send);
  free(recv);
  return 0;
}

/* Revoke from another thread ends a blocked collective. */
struct revoke_arg {
  ncclComm_t comm;
  ncclResult_t res;
};
static void* revoke_thread(void* p) {
  struct revoke_arg* a = p;
  sleep_ms(200);
  a->res = ncclCommRevoke(a->comm, 0);
  return NULL;
}

static int rank_revoke(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t a, b;
  MP_NCCL(ncclCommInitRank(&a, nranks, ids[0], rank));
  MP_NCCL(ncclCommInitRank(&b, nranks, ids[1], rank));
  float x = 1, y = 0;
  /* Connectors are set up on first use through the bootstrap: do that now,
   * so the blocked call below waits in the data path (which a revoke ends). */
  MP_NCCL(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, a, NULL));
  if (rank == 0) {
    /* Nobody else joins this allreduce: it blocks until the revoke. */
    struct revoke_arg ra = {a, ncclInternalError};
    pthread_t th;
    pthread_create(&th, NULL, revoke_thread, &ra);
    ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, a, NULL);
    pthread_join(th, NULL);
    MP_CHECK(r == ncclInvalidUsage, "the blocked allreduce ended with %s", ncclGetErrorString(r));
    MP_CHECK(ra.res == ncclSuccess || ra.res == ncclInProgress, "revoke -> %d", (int)ra.res);
    MP_CHECK(settle(a) == ncclSuccess, "revoked comm's state is an error");
    for (int p = 1; p < nranks; p++) MP_NCCL(ncclSend(&x, 1, ncclFloat, p, b, NULL));
  } else {
    MP_NCCL(ncclRecv(&y, 1, ncclFloat, 0, b, NULL));
  }
  MP_NCCL(ncclCommDestroy(a));
  float s[64], rv[64];
  if (allreduce_check(b, s, rv, 64, "other comm after a revoke")) return 1;
  MP_NCCL(ncclCommDestroy(b));
  return 0;
}

/* Revoke ends a call blocked in lazy connector setup: on a fresh
 * communicator whose peers never join, rank 0's allreduce waits in the
 * bootstrap for their connection info (not yet in the data path proper). */
static int rank_revoke_setup(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t a, b;
  MP_NCCL(ncclCommInitRank(&a, nranks, ids[0], rank));
  MP_NCCL(ncclCommInitRank(&b, nranks, ids[1], rank));
  float x = 1, y = 0;
  if (rank == 0) {
    struct revoke_arg ra = {b, ncclInternalError};
    pthread_t th;
    pthread_create(&th, NULL, revoke_thread, &ra);
    ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, b, NULL);
    pthread_join(th, NULL);
    MP_CHECK(r == ncclInvalidUsage, "the allreduce blocked in connector setup ended with %s: %s",
             ncclGetErrorString(r), ncclGetLastError(b));
    MP_CHECK(strstr(ncclGetLastError(NULL), "revoked") != NULL, "message: %s", ncclGetLastError(NULL));
    MP_CHECK(ra.res == ncclSuccess || ra.res == ncclInProgress, "revoke -> %d", (int)ra.res);
    MP_CHECK(settle(b) == ncclSuccess, "revoked comm's state is an error");
    for (int p = 1; p < nranks; p++) MP_NCCL(ncclSend(&x, 1, ncclFloat, p, a, NULL));
  } else {
    MP_NCCL(ncclRecv(&y, 1, ncclFloat, 0, a, NULL));
  }
  MP_NCCL(ncclCommDestroy(b));
  float s[64], rv[64];
  if (allreduce_check(a, s, rv, 64, "other comm after a revoke in setup")) return 1;
  MP_NCCL(ncclCommDestroy(a));
  return 0;
}

/* A rank that is alive but never calls ncclCommShrink: the others fail
 * within COLLIE_SHRINK_TIMEOUT (2 x COLLIE_PEER_TIMEOUT here) with an error
 * naming it, rather than after COLLIE_BOOTSTRAP_TIMEOUT. `absent` is the
 * coordinator (rank 0) or another rank. */
static int rank_shrink_absent(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  int absent = *(int*)arg;
  ncclComm_t a, b;
  MP_NCCL(ncclCommInitRank(&a, nranks, ids[0], rank));
  MP_NCCL(ncclCommInitRank(&b, nranks, ids[1], rank));
  float x = 1, y = 0;
  if (rank == absent) {
    /* Busy elsewhere until the others have given up on the shrink. */
    for (int p = 0; p < nranks; p++)
      if (p != rank) MP_NCCL(ncclRecv(&y, 1, ncclFloat, p, b, NULL));
  } else {
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommShrink(a, NULL, 0, &nc, NULL, NCCL_SHRINK_DEFAULT);
    const char* msg = ncclGetLastError(NULL);
    char want[32];
    snprintf(want, sizeof(want), "%d (", absent);
    fprintf(stderr, "rank %d: shrink without rank %d: %s: %s\n", rank, absent, ncclGetErrorString(r), msg);
    MP_CHECK(r == ncclRemoteError, "shrink with rank %d absent -> %s", absent, ncclGetErrorString(r));
    MP_CHECK(nc == NULL, "a communicator came out of a failed shrink");
    MP_CHECK(strstr(msg, "did not call ncclCommShrink") && strstr(msg, want), "the error does not name rank %d: %s",
             absent, msg);
    MP_NCCL(ncclSend(&x, 1, ncclFloat, absent, b, NULL));
  }
  /* Both communicators still work (nobody was declared failed). */
  float s[64], rv[64];
  if (allreduce_check(a, s, rv, 64, "parent after a failed shrink")) return 1;
  MP_NCCL(ncclCommDestroy(a));
  MP_NCCL(ncclCommDestroy(b));
  return 0;
}

/* A rank that exits normally (exit(), destructors run) without destroying its
 * communicator says goodbye: the peer waiting for it is told it left, not that
 * it failed. */
static int rank_exit(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float x = 1, y = 0;
  MP_NCCL(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, NULL));
  /* Rank 1 leaves once the others are out of the allreduce it took part in
   * (bounded), so the departure meets them in the next one, whatever the
   * interleaving. */
  if (rank == 1) {
    mp_await(0, nranks - 1, 100);
    exit(0);
  }
  mp_arrive(0);
  ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, NULL);
  const char* msg = ncclGetLastError(comm);
  MP_CHECK(r != ncclSuccess, "allreduce with a rank that exited succeeded");
  MP_CHECK(strstr(msg, "left the communicator") != NULL && strstr(msg, "failed") == NULL,
           "the peer that exited normally is not reported as having left: %s", msg);
  ncclCommAbort(comm);
  return 0;
}

/* A rank that sends and then destroys its communicator has said goodbye, not
 * failed: what it sent is still delivered. Over sockets with several
 * connections per connector, the peer sees the close on a connection that has
 * nothing more for it while others still hold slots (coll.socket_nsocks4_ra1_2
 * once failed so in CI: the receiver stopped reading at the first close). */
#define GOODBYE_MSGS 7
static int rank_goodbye(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  maybe_hostid(rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  static int buf[GOODBYE_MSGS][256];
  /* Connect first (lazy setup needs both ranks). */
  if (rank == 0) MP_NCCL(ncclSend(buf[0], 1, ncclInt32, 1, comm, NULL));
  else MP_NCCL(ncclRecv(buf[0], 1, ncclInt32, 0, comm, NULL));
  if (rank == 0) {
    for (int m = 0; m < GOODBYE_MSGS; m++) {
      for (int i = 0; i < 256; i++) buf[m][i] = m * 1000 + i;
      MP_NCCL(ncclSend(buf[m], 256, ncclInt32, 1, comm, NULL));
    }
    MP_NCCL(ncclCommDestroy(comm));
    mp_arrive(0);
    return 0;
  }
  MP_CHECK(mp_await(0, 1, 100) == 0, "rank 0 did not finish sending");
  for (int m = 0; m < GOODBYE_MSGS; m++) {
    memset(buf[m], 0xff, sizeof(buf[m]));
    ncclResult_t r = ncclRecv(buf[m], 256, ncclInt32, 0, comm, NULL);
    MP_CHECK(r == ncclSuccess, "receive %d of %d after the sender destroyed its communicator: %s", m + 1, GOODBYE_MSGS,
             ncclGetLastError(comm));
    for (int i = 0; i < 256; i++) MP_CHECK(buf[m][i] == m * 1000 + i, "message %d int %d: %d", m, i, buf[m][i]);
  }
  /* Nothing more will come: the next receive is an error, not a hang. */
  ncclResult_t r = ncclRecv(buf[0], 256, ncclInt32, 0, comm, NULL);
  MP_CHECK(r != ncclSuccess, "a receive from a rank that left succeeded");
  ncclCommAbort(comm);
  return 0;
}

/* A rank whose keep-alive thread gets no CPU for several peer timeouts (here
 * its pings are held back: health_mute) while its process still runs on this
 * machine is waited for, not declared failed: the communicator stays healthy
 * on every rank and the next collective succeeds. With COLLIE_PEER_TIMEOUT=1
 * the silence lasts four timeouts. */
static int rank_silent(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  maybe_hostid(rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float s[64], rv[64];
  if (allreduce_check(comm, s, rv, 64, "before the silence")) return 1;
  mp_arrive(0);
  MP_CHECK(mp_await(0, nranks, 100) == 0, "not every rank reached the silence");
  if (rank == 1) health_mute(comm, 4000);
  usleep(4500 * 1000);
  ncclResult_t async = ncclInProgress;
  MP_NCCL(ncclCommGetAsyncError(comm, &async));
  MP_CHECK(async == ncclSuccess, "rank %d: the communicator failed while rank 1 was silent but running: %s (%s)", rank,
           ncclGetErrorString(async), ncclGetLastError(comm));
  if (allreduce_check(comm, s, rv, 64, "after the silence")) return 1;
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* c = argc > 1 ? argv[1] : "";
  if (!strcmp(c, "kill") || !strcmp(c, "stop")) {
    int trials = argc > 2 ? atoi(argv[2]) : 20;
    size_t bytes = argc > 3 ? strtoull(argv[3], NULL, 0) : 64u << 20;
    if (argc > 4 && atoi(argv[4]) > 0) g_window_ms = atoi(argv[4]);
    return case_victim(!strcmp(c, "kill") ? SIGKILL : SIGSTOP, trials, bytes);
  }
  if (!strcmp(c, "abort")) return case_abort(argc > 2 ? atoi(argv[2]) : 4);
  if (!strcmp(c, "nonblocking")) return mp_run_ids(argc > 2 ? atoi(argv[2]) : 3, 2, rank_nonblocking, NULL, NULL, 0, 120);
  if (!strcmp(c, "shrink")) return mp_run(5, rank_shrink, NULL, 120);
  if (!strcmp(c, "revoke")) return mp_run_ids(3, 2, rank_revoke, NULL, NULL, 0, 120);
  if (!strcmp(c, "exit")) return mp_run(2, rank_exit, NULL, 120);
  if (!strcmp(c, "goodbye")) return mp_run(2, rank_goodbye, NULL, 120);
  if (!strcmp(c, "silent")) return mp_run(3, rank_silent, NULL, 120);
  if (!strcmp(c, "revoke_setup")) return mp_run_ids(3, 2, rank_revoke_setup, NULL, NULL, 0, 120);
  if (!strcmp(c, "shrink_absent")) {
    int absent = argc > 2 ? atoi(argv[2]) : 2;
    return mp_run_ids(3, 2, rank_shrink_absent, &absent, NULL, 0, 120);
  }
  fprintf(stderr, "usage: test_failures kill|stop [trials [bytes [window_ms]]] | abort [n] | nonblocking [n] | shrink | revoke | exit | goodbye | silent | revoke_setup | shrink_absent [rank]\n");
  return 2;
}
