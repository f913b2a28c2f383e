/* collie-run's supervision: forks the ranks (each in a process group of its
 * own), forwards signals, reaps them, escalates SIGTERM to SIGKILL and decides
 * the exit status. Polls output.c's pipes; hands worker exits to
 * elastic_serve.c under --elastic. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run.h"

/* Signals go to each rank's process group, so helpers a rank started (the
 * `sleep` under `sh -c`, a wrapper script's real program) stop with it. A
 * group whose leader was reaped is still signalled: its pgid cannot be handed
 * to a new group while members remain, and once empty the kill fails with
 * ESRCH -- unless the pid wrapped around within these few seconds. */
static void signal_groups(struct job* job, int sig) {
  for (int i = 0; i < job->launched; i++)
    if (job->pgid[i] > 0) kill(-job->pgid[i], sig);
}

static bool groups_alive(const struct job* job) {
  for (int i = 0; i < job->launched; i++)
    if (job->pgid[i] > 0 && (kill(-job->pgid[i], 0) == 0 || errno == EPERM)) return true;
  return false;
}

static void kill_job(struct job* job) {
  signal_groups(job, SIGKILL);
  job->killed = true;
  job->kill_at_ms = now_ms() + REAP_GRACE_MS;
}

void stop_job(struct job* job, int sig, int exit_code) {
  if (job->stopping) return;
  job->stopping = true;
  job->exit_code = exit_code;
  job->kill_at_ms = now_ms() + KILL_GRACE_MS;
  signal_groups(job, sig);
}

static void report_rank(struct job* job, int rank, pid_t pid, int status) {
  const char* tail = job->running_count > 0 ? "; stopping the other ranks" : "";
  if (WIFEXITED(status)) {
    fprintf(stderr, "collie-run: rank %d (pid %d) exited with status %d%s\n", rank, (int)pid, WEXITSTATUS(status),
            tail);
    stop_job(job, SIGTERM, EXIT_FAILED);
  } else {
    int sig = WTERMSIG(status);
    fprintf(stderr, "collie-run: rank %d (pid %d) killed by signal %d (%s)%s%s\n", rank, (int)pid, sig, strsignal(sig),
            WCOREDUMP(status) ? ", core dumped" : "", tail);
    stop_job(job, SIGTERM, 128 + sig);
  }
}

static int rank_of(const struct job* job, pid_t pid) {
  for (int i = 0; i < job->launched; i++)
    if (job->pgid[i] == pid && job->running[i]) return i;
  return -1;
}

static void reap(struct job* job) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return; /* none ready, or ECHILD */
    int r = rank_of(job, pid);
    if (r < 0) continue; /* an orphaned grandchild: we are its subreaper */
    job->running[r] = false;
    job->running_count--;
    /* Its last words first, then ours about it. */
    if (job->streams != NULL) {
      stream_drain(job, &job->streams[2 * r]);
      stream_drain(job, &job->streams[2 * r + 1]);
    }
    if (job->o->elastic) {
      elastic_exited(job, r, pid, status);
      continue;
    }
    if (job->stopping || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
    report_rank(job, r, pid, status);
  }
}

static void handle_signals(struct job* job) {
  struct signalfd_siginfo si;
  bool child = false;

  while (read(job->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
    int sig = (int)si.ssi_signo;
    if (sig == SIGCHLD) {
      child = true;
    } else if (!job->stopping) {
      fprintf(stderr, "collie-run: got signal %d (%s); passing it on to the ranks\n", sig, strsignal(sig));
      stop_job(job, sig, 128 + sig);
    }
    /* A repeat does not cut the grace period short: the same signal
     * often arrives twice (timeout(1) sends it to us and to our process
     * group), and the grace period is short anyway. */
  }
  if (child) reap(job);
}

static void check_timers(struct job* job) {
  const struct options* o = job->o;
  int64_t now = now_ms();
  if (o->elastic && !job->stopping) elastic_check(job, now);
  if (!job->stopping && job->timeout_at_ms != 0 && now >= job->timeout_at_ms) {
    fprintf(stderr, "collie-run: timeout: the job ran longer than %ld s; stopping the ranks\n", o->timeout_s);
    stop_job(job, SIGTERM, EXIT_TIMEOUT);
  }
  if (job->stopping && !job->killed && now >= job->kill_at_ms) kill_job(job);
}

/* Milliseconds until the next timer, or -1. */
static int next_timeout(const struct job* job) {
  int64_t at = 0;
  if (!job->stopping && job->timeout_at_ms != 0) at = job->timeout_at_ms;
  else if (job->stopping && (!job->killed || job->running_count == 0)) at = job->kill_at_ms;
  /* else: SIGKILL is out and ranks remain; they cannot refuse it, so wait
   * for their SIGCHLD however long the kernel takes. */
  if (at == 0) return -1;
  int64_t d = at - now_ms();
  return d < 0 ? 0 : d > INT32_MAX ? INT32_MAX : (int)d;
}

static bool job_done(const struct job* job) {
  if (job->running_count > 0) return false;
  if (!job->stopping) return true;
  /* Every rank is gone; what is left of their groups gets the same grace
   * period, then SIGKILL (check_timers), then REAP_GRACE_MS to die.
   * Orphans are our children (subreaper), so their exits wake us up. */
  if (!groups_alive(job)) return true;
  return job->killed && now_ms() >= job->kill_at_ms;
}

void supervise(struct job* job) {
  const struct options* o = job->o;
  while (!job_done(job)) {
    int n = 0;
    job->pfd[n++] = (struct pollfd){.fd = job->sfd, .events = POLLIN};
    for (int i = 0; i < job->nstreams; i++) {
      if (job->streams[i].fd >= 0) {
        job->pfd_stream[n] = i;
        job->pfd[n++] = (struct pollfd){.fd = job->streams[i].fd, .events = POLLIN};
      }
    }

    int tmo = next_timeout(job);
    /* --elastic: look at the store's verdict now and then. */
    if (o->elastic && (tmo < 0 || tmo > 100)) tmo = 100;
    int r = poll(job->pfd, (nfds_t)n, tmo);
    if (r < 0 && errno != EINTR) {
      /* Cannot happen with valid arguments; stop rather than spin. */
      fprintf(stderr, "collie-run: poll: %s; stopping the ranks\n", strerror(errno));
      stop_job(job, SIGTERM, EXIT_FAILED);
      kill_job(job);
      while (job->running_count > 0 && wait(NULL) > 0) job->running_count--;
      return;
    }
    if (r > 0) {
      /* Output before signals, so a rank's last lines precede the
       * message about its exit. stream_read skips a stream that
       * dest_broken closed since the poll. */
      for (int k = 1; k < n; k++)
        if (job->pfd[k].revents != 0) stream_read(job, &job->streams[job->pfd_stream[k]]);
      if (job->pfd[0].revents != 0) handle_signals(job);
    }
    check_timers(job);
  }
}

static void run_child(const struct options* o, const struct saved_state* saved, const cpu_set_t* cpus, int rank,
                      int restarts, int out_fd, int err_fd) {
  char buf[16];

  /* See signal_groups for why each rank leads its own group. Both parent
   * and child call setpgid, so it holds before either side goes on. A side
   * effect: a rank is not in the terminal's foreground group, so Ctrl-C
   * reaches only the launcher, which forwards it once. */
  setpgid(0, 0);
  /* If the launcher dies without cleaning up (SIGKILL, OOM), take the rank
   * down too instead of leaving it blocked in the bootstrap forever. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != saved->launcher) _exit(EXIT_FAILED);

  /* A background process group that reads the terminal is stopped by
   * SIGTTIN, so only rank 0 gets stdin, and only if it is not a terminal;
   * several ranks sharing a pipe would each get random pieces of it. */
  if (rank != 0 || isatty(0)) {
    int nfd = open("/dev/null", O_RDONLY);
    if (nfd >= 0) {
      dup2(nfd, 0);
      if (nfd != 0) close(nfd);
    }
  }
  if (out_fd >= 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    /* The originals are O_CLOEXEC; the copies on 1 and 2 are not. */
  }

  snprintf(buf, sizeof(buf), "%d", rank);
  char rbuf[16];
  snprintf(rbuf, sizeof(rbuf), "%d", restarts);
  if (o->elastic ? setenv("COLLIE_ELASTIC_SLOT", buf, 1) != 0 || setenv("COLLIE_ELASTIC_RESTARTS", rbuf, 1) != 0
                 : setenv("COLLIE_RANK", buf, 1) != 0 || setenv("COLLIE_LOCAL_RANK", buf, 1) != 0) {
    dprintf(2, "collie-run: rank %d: cannot set the environment: %s\n", rank, strerror(errno));
    _exit(EXIT_FAILED);
  }
  /* Rank 0 serves the bootstrap root on the port held for it; every other
   * rank's copy closes at exec (O_CLOEXEC). */
  if (rank == 0 && run_root_fd >= 0) { /* never set with --elastic (collie_run.c) */
    char fbuf[16];
    snprintf(fbuf, sizeof(fbuf), "%d", run_root_fd);
    if (fcntl(run_root_fd, F_SETFD, 0) != 0 || setenv("COLLIE_BOOTSTRAP_ROOT_FD", fbuf, 1) != 0) {
      dprintf(2, "collie-run: rank 0: cannot hand on the bootstrap root port: %s\n", strerror(errno));
      _exit(EXIT_FAILED);
    }
  }

  /* Set here, before exec, the mask covers the whole program: it is still
   * the only thread, and every thread it starts inherits the mask. */
  if (cpus != NULL && sched_setaffinity(0, sizeof(*cpus), cpus) != 0) {
    char list[128];
    bind_cpulist(cpus, list, sizeof(list));
    dprintf(2, "collie-run: rank %d: cannot bind to CPUs %s: %s\n", rank, list, strerror(errno));
    _exit(EXIT_FAILED);
  }
  sigaction(SIGPIPE, &saved->pipe_action, NULL);
  if (saved->nofile_changed) setrlimit(RLIMIT_NOFILE, &saved->nofile);
  sigprocmask(SIG_SETMASK, &saved->mask, NULL);

  execvp(o->prog_argv[0], o->prog_argv);
  dprintf(2, "collie-run: cannot execute '%s': %s\n", o->prog_argv[0], strerror(errno));
  _exit(EXIT_EXEC);
}

/* --tag-output needs two descriptors per rank, more than the usual soft limit
 * of 1024 allows at the top of the range; raise it as far as needed (the
 * ranks get the original back). */
int reserve_fds(int nranks, struct saved_state* saved) {
  struct rlimit rl = saved->nofile;
  rlim_t need = (rlim_t)nranks * 2 + 32;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
      fprintf(stderr,
              "collie-run: --tag-output with %d ranks needs %llu file descriptors, "
              "but the limit is %llu (see ulimit -n)\n",
              nranks, (unsigned long long)need, (unsigned long long)rl.rlim_max);
      return -1;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      fprintf(stderr, "collie-run: cannot raise the file descriptor limit: %s\n", strerror(errno));
      return -1;
    }
    saved->nofile_changed = true;
  }
  return 0;
}

static int make_pipe(int* rd, int* wr) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  /* Only our end is non-blocking: a rank must not see EAGAIN on stdout. */
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  *rd = p[0];
  *wr = p[1];
  return 0;
}

/* Starts the worker of one rank (or, --elastic, one slot). 0 or -1 (the job is stopping). */
int launch_one(struct job* job, int rank) {
  int out_w = -1, err_w = -1;
  if (job->streams != NULL) {
    struct stream *so = &job->streams[2 * rank], *se = &job->streams[2 * rank + 1];
    /* A restarted slot: whatever its predecessor left unread goes first. */
    stream_finish(job, so);
    stream_finish(job, se);
    so->line_start = se->line_start = true;
    if (make_pipe(&so->fd, &out_w) != 0) {
      fprintf(stderr, "collie-run: cannot create a pipe for rank %d: %s\n", rank, strerror(errno));
      stop_job(job, SIGTERM, EXIT_FAILED);
      return -1;
    }
    if (make_pipe(&se->fd, &err_w) != 0) {
      fprintf(stderr, "collie-run: cannot create a pipe for rank %d: %s\n", rank, strerror(errno));
      close(out_w);
      stop_job(job, SIGTERM, EXIT_FAILED);
      return -1;
    }
  }

  pid_t pid = fork();
  if (pid == 0)
    run_child(job->o, job->saved, job->cpus ? &job->cpus[rank] : NULL, rank, job->restarts ? job->restarts[rank] : 0,
              out_w, err_w);
  int fork_errno = errno;
  if (rank == 0 && run_root_fd >= 0) {
    /* Rank 0 has its own copy now (or never will): the port must not stay
     * held here once rank 0's root closes it. */
    close(run_root_fd);
    run_root_fd = -1;
  }
  if (out_w >= 0) {
    close(out_w);
    close(err_w);
  }
  if (pid < 0) {
    fprintf(stderr, "collie-run: cannot start rank %d: %s\n", rank, strerror(fork_errno));
    stop_job(job, SIGTERM, EXIT_FAILED);
    return -1;
  }
  setpgid(pid, pid); /* EACCES once the child has exec'd: it did it itself */
  job->pgid[rank] = pid;
  job->running[rank] = true;
  job->running_count++;
  if (job->launched < rank + 1) job->launched = rank + 1;
  if (job->o->report_bindings) place_report(job, rank, pid);
  return 0;
}

void launch(struct job* job) {
  for (int rank = 0; rank < job->n; rank++)
    if (launch_one(job, rank) != 0) return;
}
