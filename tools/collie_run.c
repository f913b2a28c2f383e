/* collie-run: the local launcher. Forks N ranks of a program on this host with
 * the environment that collie's bootstrap (src/bootstrap) reads -- COLLIE_RANK,
 * COLLIE_SIZE, NCCL_COMM_ID, COLLIE_BOOTSTRAP_SECRET -- and supervises them:
 * one failed rank stops the whole job. With --elastic it instead serves the
 * elastic rendezvous store, restarts failed workers and lets the job go on
 * without them. This file holds main and the job's environment; the rest is
 * in tools/run/ (args.c, output.c, supervise.c, elastic_serve.c; run.h). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pipe2, strsignal, signalfd, getrandom */
#endif

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "run/run.h"

int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Rank 0's bootstrap root port, bound and listening here from before the
 * first fork until rank 0 has it (run_root_fd; COLLIE_BOOTSTRAP_ROOT_FD in
 * rank 0's environment): a port only named in NCCL_COMM_ID could be taken
 * by any other process while rank 0 starts (see bootstrap/root.c). */
int run_root_fd = -1;
static int reserve_loopback_port(unsigned* port) {
  int p = sock_reserve_loopback_port(AF_INET, &run_root_fd);
  if (p < 0) {
    errno = EADDRINUSE;
    return -1;
  }
  *port = (unsigned)p;
  return 0;
}

int make_secret(char hex[2 * SECRET_BYTES + 1]) {
  unsigned char raw[SECRET_BYTES];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t r = getrandom(raw + got, sizeof(raw) - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    got += (size_t)r;
  }
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(raw); i++) {
    hex[2 * i] = digits[raw[i] >> 4];
    hex[2 * i + 1] = digits[raw[i] & 0xf];
  }
  hex[2 * SECRET_BYTES] = '\0';
  return 0;
}

/* Everything the ranks share goes into the launcher's own environment; each
 * child then adds only its rank. -x comes first so that -x NCCL_COMM_ID=...
 * counts as "already set". */
static int set_job_env(const struct options* o) {
  char buf[64];

  for (int i = 0; i < o->n_extra; i++) {
    const char* arg = o->extra_env[i];
    const char* eq = strchr(arg, '=');
    char* name = strndup(arg, (size_t)(eq - arg));
    if (name == NULL || setenv(name, eq + 1, 1) != 0) {
      fprintf(stderr, "collie-run: cannot set %s: %s\n", arg, strerror(errno));
      free(name);
      return -1;
    }
    free(name);
  }

  unsetenv("COLLIE_BOOTSTRAP_ROOT_FD"); /* only ever set for our rank 0 (supervise.c) */
  if (o->elastic) {
    /* Every epoch's rank 0 makes a fresh unique ID; a fixed root address
     * would be shared by consecutive epochs. */
    unsetenv("NCCL_COMM_ID");
    unsetenv("COLLIE_BOOTSTRAP_SECRET");
    return 0;
  }

  const char* comm_id = getenv("NCCL_COMM_ID");
  if (comm_id == NULL || comm_id[0] == '\0') {
    unsigned port;
    if (reserve_loopback_port(&port) != 0) {
      fprintf(stderr, "collie-run: cannot find a free port on 127.0.0.1: %s\n", strerror(errno));
      return -1;
    }
    snprintf(buf, sizeof(buf), "127.0.0.1:%u", port);
    if (setenv("NCCL_COMM_ID", buf, 1) != 0) goto env_fail;
  }

  char secret[2 * SECRET_BYTES + 1];
  if (make_secret(secret) != 0) {
    fprintf(stderr, "collie-run: cannot get random bytes for the job secret: %s\n", strerror(errno));
    return -1;
  }
  snprintf(buf, sizeof(buf), "%d", o->nranks);
  if (setenv("COLLIE_BOOTSTRAP_SECRET", secret, 1) != 0 || setenv("COLLIE_SIZE", buf, 1) != 0 ||
      setenv("COLLIE_LOCAL_SIZE", buf, 1) != 0)
    goto env_fail;
  return 0;

env_fail:
  fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
  return -1;
}

/* The pipes below must never land on 0, 1 or 2, and a rank must not inherit a
 * closed standard descriptor; /dev/null stands in for any that are missing. */
static void ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (nfd >= 0 && nfd != fd) {
      dup2(nfd, fd);
      close(nfd);
    }
  }
}

int main(int argc, char** argv) {
  struct options o;
  struct saved_state saved;
  struct job job;
  sigset_t handled;

  parse_args(argc, argv, &o);
  ensure_std_fds();

  memset(&saved, 0, sizeof(saved));
  saved.launcher = getpid();
  getrlimit(RLIMIT_NOFILE, &saved.nofile);
  if (o.tag_output && reserve_fds(o.nranks, &saved) != 0) return EXIT_FAILED;

  if (set_job_env(&o) != 0) return EXIT_FAILED;

  /* A parent that ignores SIGCHLD would make the kernel reap our ranks
   * before we can see how they ended. */
  signal(SIGCHLD, SIG_DFL);
  /* A closed stdout/stderr must show up as EPIPE in stream_emit, not kill
   * the launcher and orphan the job. */
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &saved.pipe_action);

  /* All signals we react to arrive through a signalfd in the poll loop: no
   * handlers, no races between a signal and going to sleep. Blocked before
   * the first fork, so no rank can exit unnoticed. */
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++) {
    /* One we were started with ignored (nohup, `cmd &` in a script)
     * stays ignored, for the ranks too: a blocked signal would reach
     * the signalfd even while its disposition is SIG_IGN. */
    struct sigaction cur;
    if (sigaction(forwarded[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) continue;
    sigaddset(&handled, forwarded[i]);
  }
  sigprocmask(SIG_BLOCK, &handled, &saved.mask);

  memset(&job, 0, sizeof(job));
  job.n = o.nranks;
  job.sfd = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
  if (job.sfd < 0) {
    fprintf(stderr, "collie-run: signalfd: %s\n", strerror(errno));
    return EXIT_FAILED;
  }
  /* Helpers that outlive their rank are re-parented to us rather than to
   * init, so their exits wake the poll loop while the job is stopping. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  job.pgid = calloc((size_t)job.n, sizeof(pid_t));
  job.running = calloc((size_t)job.n, sizeof(bool));
  if (o.tag_output) {
    job.nstreams = 2 * job.n;
    job.streams = calloc((size_t)job.nstreams, sizeof(struct stream));
  }
  job.pfd = calloc((size_t)job.nstreams + 1, sizeof(struct pollfd));
  job.pfd_stream = calloc((size_t)job.nstreams + 1, sizeof(int));
  if (job.pgid == NULL || job.running == NULL || job.pfd == NULL || job.pfd_stream == NULL ||
      (o.tag_output && job.streams == NULL)) {
    fprintf(stderr, "collie-run: out of memory\n");
    job.exit_code = EXIT_FAILED;
    goto out;
  }
  for (int i = 0; i < job.nstreams; i++)
    job.streams[i] = (struct stream){.fd = -1, .dest = 1 + i % 2, .rank = i / 2, .line_start = true};

  job.o = &o;
  job.saved = &saved;
  if (place_init(&job) != 0 || (o.elastic && elastic_start(&job) != 0)) {
    job.exit_code = EXIT_FAILED;
    goto out;
  }

  if (o.timeout_s > 0) job.timeout_at_ms = now_ms() + o.timeout_s * 1000;
  launch(&job);
  supervise(&job);
  if (o.elastic) elastic_finish(&job);

  /* The ranks are gone; what they wrote is already in the pipes. */
  for (int i = 0; i < job.nstreams; i++) {
    stream_drain(&job, &job.streams[i]);
    stream_finish(&job, &job.streams[i]);
  }

out:
  free(job.streams);
  free(job.pfd);
  free(job.pfd_stream);
  free(job.running);
  free(job.pgid);
  free(o.extra_env);
  place_free(&job);
  close(job.sfd);
  return job.exit_code;
}
