/* collie-run --elastic: serves the elastic rendezvous store
 * (src/elastic/store.c) on a thread of the launcher -- or, with --store URL,
 * points the workers at an etcd cluster and watches the job there
 * (src/elastic/etcd.c) -- restarts failed workers in their slots and decides
 * how an elastic job ends. supervise.c calls in when a worker exits and on
 * each poll. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "elastic/backend.h"
#include "elastic/store.h"
#include "run.h"

/* --store: the job's state lives in etcd; the launcher reads its verdict
 * there, at most once a second (the embedded store answers from memory). */
#define EXT_PEEK_MS 1000
static struct etcd_store* ext;
static int64_t ext_peek_ms;
static bool ext_failed;
static char ext_msg[512];
static uint32_t ext_epoch, ext_resets;

static void ext_peek(void) {
  int failed = 0;
  if (etcd_peek(ext, &failed, ext_msg, sizeof(ext_msg), &ext_epoch, &ext_resets) == ncclSuccess)
    ext_failed = failed != 0;
  ext_peek_ms = now_ms();
}

/* The store's verdict: 1 when it failed the job (msg says why). */
static bool job_failed(struct job* job, char* msg, size_t n) {
  if (!ext) return store_failed(job->store, msg, n);
  if (now_ms() - ext_peek_ms >= EXT_PEEK_MS) ext_peek();
  if (ext_failed && msg) snprintf(msg, n, "%s", ext_msg);
  return ext_failed;
}

/* --elastic: a worker's exit is not the end of the job. Its slot is
 * restarted (the new worker joins the running job through the store) until
 * the slot has failed --slot-failures times, the store has failed the job,
 * or some worker has finished (exit 0), which means training is over. */
void elastic_exited(struct job* job, int slot, pid_t pid, int status) {
  const struct options* o = job->o;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    job->clean_exits++;
    job->finishing = true;
    return;
  }
  if (job->stopping) return;
  char how[96];
  if (WIFEXITED(status)) snprintf(how, sizeof(how), "exited with status %d", WEXITSTATUS(status));
  else snprintf(how, sizeof(how), "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  job->failures[slot]++;
  if (!job->store_failed && job_failed(job, NULL, 0)) job->store_failed = true;
  const char* verdict;
  bool restart = false;
  if (job->store_failed) verdict = "the job has failed; not restarted";
  else if (job->finishing) verdict = "the job is finishing; not restarted";
  else if (o->slot_failures > 0 && job->failures[slot] >= o->slot_failures)
    verdict = "the slot is excluded (--slot-failures)";
  else {
    verdict = "restarting the slot";
    restart = true;
  }
  fprintf(stderr, "collie-run: worker in slot %d (pid %d) %s (failure %d of the slot); %s\n", slot, (int)pid, how,
          job->failures[slot], verdict);
  if (restart) {
    job->restarts[slot]++;
    launch_one(job, slot);
  }
}
/* --store URL: no store here; the workers get the URL and the job's
 * settings (etcd.c reads them from the environment; the first worker writes
 * them to etcd) and the secret, which names the job's keys unless the URL
 * does. */
static int external_start(const struct options* o, const char* secret) {
  char v[7][32];
  snprintf(v[0], sizeof(v[0]), "%d", o->min);
  snprintf(v[1], sizeof(v[1]), "%d", o->max);
  snprintf(v[2], sizeof(v[2]), "%d", o->nranks);
  snprintf(v[3], sizeof(v[3]), "%d", 500);
  snprintf(v[4], sizeof(v[4]), "%ld", o->rdzv_timeout_s);
  snprintf(v[5], sizeof(v[5]), "%d", o->slot_failures);
  snprintf(v[6], sizeof(v[6]), "%ld", o->hb_timeout_s);
  if (setenv("COLLIE_RENDEZVOUS", o->store_url, 1) != 0 || setenv("COLLIE_RENDEZVOUS_SECRET", secret, 1) != 0 ||
      setenv("COLLIE_ELASTIC_MIN", v[0], 1) != 0 || setenv("COLLIE_ELASTIC_MAX", v[1], 1) != 0 ||
      setenv("COLLIE_ELASTIC_EXPECT", v[2], 1) != 0 || setenv("COLLIE_ELASTIC_SETTLE_MS", v[3], 1) != 0 ||
      setenv("COLLIE_ELASTIC_RDZV_TIMEOUT", v[4], 1) != 0 || setenv("COLLIE_ELASTIC_SLOT_FAILURES", v[5], 1) != 0 ||
      setenv("COLLIE_ETCD_TTL", v[6], 1) != 0) {
    fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
    return -1;
  }
  char rl[32];
  snprintf(rl, sizeof(rl), "%d", o->reset_limit);
  if (o->reset_limit >= 0 ? setenv("COLLIE_ELASTIC_RESET_LIMIT", rl, 1) : unsetenv("COLLIE_ELASTIC_RESET_LIMIT")) {
    fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
    return -1;
  }
  if (etcd_open(&ext, o->store_url, secret) != ncclSuccess) {
    fprintf(stderr, "collie-run: --store %s: %s\n", o->store_url, ncclGetLastError(NULL));
    etcd_close(ext);
    ext = NULL;
    return -1;
  }
  return 0;
}

/* --elastic: the store runs on a thread of this process (started after the
 * signal mask is set, so it inherits it) on a loopback port; the workers
 * find it through COLLIE_RENDEZVOUS. */
int elastic_start(struct job* job) {
  const struct options* o = job->o;
  struct store_opts so;
  char secret[2 * SECRET_BYTES + 1], buf[64];

  memset(&so, 0, sizeof(so));
  so.min = o->min;
  so.max = o->max;
  so.expect = o->nranks;
  so.reset_limit = o->reset_limit;
  so.slot_fail_limit = o->slot_failures;
  so.settle_ms = 500;
  so.rdzv_timeout_ms = o->rdzv_timeout_s * 1000;
  so.hb_timeout_ms = o->hb_timeout_s * 1000;
  so.handshake_ms = 5000;
  so.log_prefix = "collie-run";
  so.bind.sin.sin_family = AF_INET;
  so.bind.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (make_secret(secret) != 0 || eproto_parse_secret(secret, so.secret) != 0) {
    fprintf(stderr, "collie-run: cannot get random bytes for the job secret: %s\n", strerror(errno));
    return -1;
  }
  job->restarts = calloc((size_t)job->n, sizeof(int));
  job->failures = calloc((size_t)job->n, sizeof(int));
  if (job->restarts == NULL || job->failures == NULL) {
    fprintf(stderr, "collie-run: out of memory\n");
    return -1;
  }
  if (o->store_url) return external_start(o, secret);
  if (store_start(&so, &job->store) != ncclSuccess) {
    fprintf(stderr, "collie-run: cannot start the rendezvous store: %s\n", ncclGetLastError(NULL));
    return -1;
  }
  union sock_addr a;
  store_address(job->store, &a);
  snprintf(buf, sizeof(buf), "127.0.0.1:%u", (unsigned)ntohs(a.sin.sin_port));
  if (setenv("COLLIE_RENDEZVOUS", buf, 1) != 0 || setenv("COLLIE_RENDEZVOUS_SECRET", secret, 1) != 0) {
    fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
    return -1;
  }
  return 0;
}

/* Called on each turn of the poll loop while the job is not stopping: the
 * store's verdict, and the deadline for workers that outlive a failed job. */
void elastic_check(struct job* job, int64_t now) {
  char msg[512];
  if (job->fail_stop_at_ms == 0 && job_failed(job, msg, sizeof(msg))) {
    fprintf(stderr, "collie-run: elastic job failed: %s\n", msg);
    job->store_failed = true;
    /* The workers learn it from the store and exit with their own
     * message; whoever is still there after a while is stopped. */
    job->fail_stop_at_ms = now + KILL_GRACE_MS * 5;
  }
  if (job->fail_stop_at_ms != 0 && now >= job->fail_stop_at_ms) stop_job(job, SIGTERM, EXIT_FAILED);
}

/* Every worker is gone: the job's status, a summary line, and the store
 * stops. */
void elastic_finish(struct job* job) {
  if (ext) ext_peek_ms = 0; /* the last word */
  if (!job->store_failed && job_failed(job, NULL, 0)) job->store_failed = true;
  if (job->exit_code == 0 && (job->clean_exits == 0 || job->store_failed)) {
    if (!job->stopping && job->fail_stop_at_ms == 0)
      fprintf(stderr, "collie-run: elastic job failed: %s\n",
              job->store_failed ? "the store failed it (see above)" : "no worker finished (every slot failed)");
    job->exit_code = EXIT_FAILED;
  }
  uint32_t epoch = ext_epoch, resets = ext_resets;
  if (!ext) store_progress(job->store, &epoch, &resets);
  fprintf(stderr, "collie-run: elastic job ended after %u epoch(s), %u reset(s)\n", epoch, resets);
  store_stop(job->store);
  etcd_close(ext);
  ext = NULL;
  free(job->restarts);
  free(job->failures);
}
