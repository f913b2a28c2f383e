/* collie-run's shared declarations: the options, the job being supervised and
 * what each part of the launcher offers the others. collie_run.c (main, job
 * environment), args.c, output.c (--tag-output), supervise.c (children,
 * signals, exit codes), elastic_serve.c (--elastic) and place.c (--bind-to). */
#ifndef COLLIE_RUN_H
#define COLLIE_RUN_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "graph/bind.h"

#ifndef COLLIE_VERSION
#define COLLIE_VERSION "0.1.0"
#endif

/* Enough for any single host; mostly a guard against a typo such as -n 40000
 * turning into a fork bomb. */
#define MAX_RANKS 4096
/* How long ranks get between SIGTERM and SIGKILL. */
#define KILL_GRACE_MS 3000
/* After SIGKILL, how long to wait for helpers a rank left behind to die, so
 * that we reap them instead of leaving zombies to an init that may not. */
#define REAP_GRACE_MS 1000
#define SECRET_BYTES 16

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124
#define EXIT_EXEC 127

struct options {
  int nranks;
  bool tag_output;
  long timeout_s;   /* 0: no timeout */
  char** extra_env; /* "VAR=VALUE" strings from -x, pointing into argv */
  int n_extra;
  char** prog_argv; /* the program and its arguments, NULL-terminated */
  /* --elastic */
  bool elastic;
  int min, max;
  int reset_limit;   /* -1: none */
  int slot_failures; /* a slot failing this often is not restarted (0: never excluded) */
  long rdzv_timeout_s;
  long hb_timeout_s;
  const char* store_url; /* --store: etcd:// URL of the store; NULL: serve one */
  /* placement */
  enum bind_mode bind; /* BIND_SHARE unless --bind-to says otherwise */
  bool bind_given;     /* --bind-to was on the command line */
  bool report_bindings;
};

/* One rank's stdout or stderr under --tag-output. */
struct stream {
  int fd;   /* read end of the pipe; -1 once closed */
  int dest; /* 1 or 2: where the tagged lines go */
  int rank;
  bool line_start; /* the next byte starts a new line and needs a prefix */
  size_t len;
  size_t cap;
  char* buf; /* allocated on first use */
};

/* What the launcher changed in its own process, so each child can undo it
 * before exec and the program starts with what the user gave us. */
struct saved_state {
  sigset_t mask;
  struct sigaction pipe_action;
  struct rlimit nofile;
  bool nofile_changed;
  pid_t launcher;
};

struct job {
  int n;
  int launched;  /* ranks forked so far */
  pid_t* pgid;   /* rank pid == its process-group id; kept after reaping */
  bool* running; /* not yet reaped */
  int running_count;
  struct stream* streams; /* 2 per rank under --tag-output, else NULL */
  int nstreams;
  struct pollfd* pfd;
  int* pfd_stream;       /* pfd[k] (k >= 1) polls streams[pfd_stream[k]] */
  int sfd;               /* signalfd for SIGCHLD and the forwarded signals */
  bool stopping;         /* SIGTERM has gone out; no more failures reported */
  bool killed;           /* SIGKILL has gone out */
  int64_t kill_at_ms;    /* SIGKILL then; once killed, stop waiting for helpers then */
  int64_t timeout_at_ms; /* 0: none */
  int exit_code;
  bool dest_broken[3];
  /* --elastic */
  struct store* store;
  int* restarts;  /* per slot: workers started in it after the first */
  int* failures;  /* per slot */
  bool finishing; /* a worker exited with 0: no more restarts */
  bool store_failed;
  int clean_exits;
  int64_t fail_stop_at_ms; /* the store failed the job: stop what is left then */
  /* placement (place.c) */
  cpu_set_t* cpus;       /* per rank; NULL: nobody is bound */
  int* cpu_node;         /* per rank: NUMA node of its CPUs */
  char unbound_why[160]; /* why cpus is NULL, for --report-bindings */
  const struct options* o;
  const struct saved_state* saved;
};

/* args.c: fills o from the command line; exits with EXIT_USAGE (after a
 * message) on a usage error, with 0 after --help or --version. */
void parse_args(int argc, char** argv, struct options* o);

/* collie_run.c */
int64_t now_ms(void);
int make_secret(char hex[2 * SECRET_BYTES + 1]);
/* The listener on rank 0's bootstrap root port (NCCL_COMM_ID chosen here),
 * -1 when none: handed to rank 0 (COLLIE_BOOTSTRAP_ROOT_FD), closed here once
 * rank 0 is forked (supervise.c). */
extern int run_root_fd;

/* output.c (--tag-output) */
void stream_finish(struct job* job, struct stream* s);
bool stream_read(struct job* job, struct stream* s);
void stream_drain(struct job* job, struct stream* s);

/* supervise.c */
int reserve_fds(int nranks, struct saved_state* saved);
int launch_one(struct job* job, int rank);
void launch(struct job* job);
void supervise(struct job* job);
void stop_job(struct job* job, int sig, int exit_code);

/* place.c: plans every rank's CPUs before the first fork; 0, or -1 after a
 * message when an explicit --bind-to cannot be honoured. */
int place_init(struct job* job);
void place_report(const struct job* job, int rank, pid_t pid);
void place_free(struct job* job);

/* elastic_serve.c (--elastic) */
int elastic_start(struct job* job);
void elastic_exited(struct job* job, int slot, pid_t pid, int status);
void elastic_check(struct job* job, int64_t now);
void elastic_finish(struct job* job);

#endif
