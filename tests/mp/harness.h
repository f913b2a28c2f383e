/* Multi-process test harness: forks N ranks on this machine, hands each the
 * same unique ID (created by the parent, whose process then hosts the root),
 * and waits with a hard limit so a hang fails the test instead of blocking CI.
 * Each rank reports failures with MP_CHECK; the test passes only if every
 * rank exits 0. Each rank's stderr (MP_CHECK messages, library warnings) goes
 * to its own file in a private temporary folder: on failure the harness
 * prints the last lines of every rank, prefixed with the rank; on success the
 * files are removed and nothing extra is printed. Shared counters
 * (mp_arrive / mp_await) let a test order an event after other ranks'
 * progress, e.g. a rank leaves only once the others are past the last
 * collective it took part in, instead of guessing with sleeps. Used by
 * tests/mp, engine, failures, security and gpu. */
#ifndef COLLIE_MP_HARNESS_H
#define COLLIE_MP_HARNESS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* ------------------------------------------------------------ shared counters */

#define MP_COUNTERS 16

/* Mapped shared before the ranks are forked, zeroed for every run. */
static int* mp_counters;

static int mp_counters_reset(void) {
  if (!mp_counters) {
    void* p = mmap(NULL, sizeof(int) * MP_COUNTERS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    mp_counters = p;
  }
  for (int i = 0; i < MP_COUNTERS; i++) __atomic_store_n(&mp_counters[i], 0, __ATOMIC_RELAXED);
  return 0;
}

/* In a rank: adds one to counter k. */
static inline void mp_arrive(int k) { __atomic_add_fetch(&mp_counters[k], 1, __ATOMIC_RELEASE); }

/* In a rank: waits until counter k reaches n; 0, or 1 after limit_s seconds. */
static inline int mp_await(int k, int n, double limit_s) {
  double until = mp_now() + limit_s;
  while (__atomic_load_n(&mp_counters[k], __ATOMIC_ACQUIRE) < n) {
    if (mp_now() > until) return 1;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

/* ------------------------------------------------------------ per-rank logs */

#define MP_LOG_TAIL 30

/* Creates the private folder for the ranks' stderr (dir gets "" when it
 * cannot: the ranks then keep the inherited stderr). */
static void mp_log_open(char* dir, size_t cap) {
  const char* tmp = getenv("TMPDIR");
  snprintf(dir, cap, "%s/collie-mp.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(dir)) dir[0] = '\0';
}

/* In a freshly forked rank: sends its stderr to dir/rank.N. */
static void mp_log_child(const char* dir, int rank) {
  if (!dir[0]) return;
  char path[512];
  snprintf(path, sizeof(path), "%s/rank.%d", dir, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  dup2(fd, 2); /* dup2 clears O_CLOEXEC on the copy */
  close(fd);
}

/* Prints the last MP_LOG_TAIL lines of one rank's file, each prefixed with the rank. */
static void mp_log_tail(const char* path, int rank) {
  FILE* f = fopen(path, "r");
  if (!f) return;
  static char buf[64 * 1024];
  long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  long from = size > (long)sizeof(buf) - 1 ? size - (long)sizeof(buf) + 1 : 0;
  size_t len = 0;
  if (size > 0 && fseek(f, from, SEEK_SET) == 0) len = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[len] = '\0';
  if (len == 0) {
    fprintf(stderr, "[rank %d] (no output)\n", rank);
    return;
  }
  size_t start = len;
  int lines = 0;
  if (buf[len - 1] == '\n') start--; /* the final newline ends the last line */
  while (start > 0 && lines < MP_LOG_TAIL) {
    if (buf[start - 1] == '\n' && ++lines == MP_LOG_TAIL) break;
    start--;
  }
  if (start > 0 || from > 0) fprintf(stderr, "[rank %d] ... (last %d lines)\n", rank, MP_LOG_TAIL);
  for (char* line = buf + start; *line;) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    fprintf(stderr, "[rank %d] %s\n", rank, line);
    if (!nl) break;
    line = nl + 1;
  }
}

/* After the ranks have exited: on failure prints each rank's last lines;
 * always removes the folder. */
static void mp_log_close(char* dir, int nranks, int failed) {
  if (!dir[0]) return;
  char path[512];
  if (failed) {
    fflush(stdout);
    for (int r = 0; r < nranks; r++) {
      snprintf(path, sizeof(path), "%s/rank.%d", dir, r);
      if (access(path, F_OK) == 0) mp_log_tail(path, r);
    }
  }
  DIR* d = opendir(dir);
  if (d) {
    for (struct dirent* de; (de = readdir(d));) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
  dir[0] = '\0';
}

/* Parent-side hooks: after the IDs exist (before ranks get them), and after
 * every rank has exited. */
struct mp_hooks {
  int (*after_ids)(const ncclUniqueId* ids, int nids);
  int (*after_run)(void);
};

void root_reap(void); /* collie internal: joins finished root threads */

/* A hang's evidence: every thread's stack of a rank still running (gdb, where
 * it is installed and may attach: CI runs as root), on stderr, before the
 * harness kills it. A hang that happens once in hundreds of runs then says
 * where it waited. */
static void mp_dump_stacks(pid_t pid, int rank) {
  if (system("command -v gdb >/dev/null 2>&1") != 0) {
    fprintf(stderr, "  (no gdb: no stacks of rank %d)\n", rank);
    return;
  }
  char cmd[320];
  snprintf(cmd, sizeof(cmd),
           "timeout 10 gdb -p %d -batch -nx -ex 'thread apply all bt' 2>/dev/null | "
           "grep -E '^(#|Thread)' | sed 's/^/  [rank %d] /' >&2",
           (int)pid, rank);
  fprintf(stderr, "stacks of rank %d (pid %d), still running (no lines below: gdb could not attach):\n", rank,
          (int)pid);
  fflush(stderr);
  int rc = system(cmd); /* the pipeline's status is sed's: says nothing about gdb */
  (void)rc;
}

/* Forks `nranks` children; ranks listed in `skip` (may be NULL) are not started.
 * Children are forked before the parent creates the IDs (and so before it has
 * any root thread): forking a process with running threads can leave a lock
 * held in the child (ASan's allocator does not survive it). The IDs reach the
 * children through a pipe. Returns 0 when every started rank exits 0 before
 * `limit_s`. */
static int mp_run_hooks(int nranks, int nids, mp_rank_fn fn, void* arg, const int* skip, int nskip, double limit_s,
                        const struct mp_hooks* hooks) {
  ncclUniqueId ids[16];
  if (nids > 16) return 1;
  if (mp_counters_reset() != 0) return 1;
  int fds[2];
  if (pipe(fds) != 0) return 1;
  char logdir[256];
  mp_log_open(logdir, sizeof(logdir));
  root_reap();
  fflush(NULL);
  pid_t* pids = calloc((size_t)nranks, sizeof(pid_t));
  for (int r = 0; r < nranks; r++) {
    int skipped = 0;
    for (int k = 0; k < nskip; k++) skipped |= skip[k] == r;
    if (skipped) continue;
    pid_t p = fork();
    if (p == 0) {
      close(fds[1]);
      free(pids); /* the parent's: a child that ends with _exit must not leak it under valgrind */
      mp_log_child(logdir, r);
      /* Each write below is one atomic chunk (<= PIPE_BUF): one read each. */
      size_t want = sizeof(ncclUniqueId) * (size_t)nids;
      ssize_t got = read(fds[0], ids, want);
      if (got != (ssize_t)want) _exit(3);
      close(fds[0]);
      int rc = fn(r, nranks, ids, nids, arg);
      fflush(NULL);
      _exit(rc);
    }
    pids[r] = p;
  }
  close(fds[0]);
  int failed = 0, alive = 0;
  for (int i = 0; i < nids && !failed; i++) {
    ncclResult_t r = ncclGetUniqueId(&ids[i]);
    if (r != ncclSuccess) {
      fprintf(stderr, "FAIL: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
      failed = 1;
    }
  }
  if (!failed && hooks && hooks->after_ids) failed = hooks->after_ids(ids, nids);
  for (int r = 0; r < nranks; r++) {
    if (pids[r] <= 0) continue;
    alive++;
    if (!failed && write(fds[1], ids, sizeof(ncclUniqueId) * (size_t)nids) < 0) failed = 1;
  }
  close(fds[1]); /* on failure, children read EOF and exit */
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
        if (pids[r] > 0) mp_dump_stacks(pids[r], r);
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
  if (hooks && hooks->after_run && hooks->after_run()) failed = 1;
  mp_log_close(logdir, nranks, failed);
  return failed;
}

static int mp_run_ids(int nranks, int nids, mp_rank_fn fn, void* arg, const int* skip, int nskip, double limit_s) {
  return mp_run_hooks(nranks, nids, fn, arg, skip, nskip, limit_s, NULL);
}

static int mp_run(int nranks, mp_rank_fn fn, void* arg, double limit_s) {
  return mp_run_ids(nranks, 1, fn, arg, NULL, 0, limit_s);
}


#endif
