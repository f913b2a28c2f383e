/* Test program for placement (tests/launcher/test_bind.sh): starts a helper
 * thread, joins the world communicator (collie_comm_init_from_env, where
 * COLLIE_BIND acts: src/graph/bind.c), then prints one line per rank:
 *   bind RANK LOCAL_RANK LOCAL_SIZE MAIN_CPUS HELPER_CPUS
 * with the CPU lists the kernel reports for the main and the helper thread,
 * so the test sees that a thread started before init was bound too. With
 * BIND_PROBE_SLEEP_MS set, every rank calls a one-element allreduce (then,
 * with BIND_PROBE_GO set, waits for that file to exist), rank 0 sleeps that
 * long, every rank calls another (the others wait for rank 0 in it) and
 * prints the same with "after"; after ncclCommDestroy it prints "destroyed"
 * (a held placement, src/graph/bind.c, ends in either). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "collie.h"

static int stop_pipe[2];
static pid_t helper_tid;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready = PTHREAD_COND_INITIALIZER;

static void* helper(void* arg) {
  (void)arg;
  char c;
  pthread_mutex_lock(&lock);
  helper_tid = (pid_t)syscall(SYS_gettid);
  pthread_cond_signal(&ready);
  pthread_mutex_unlock(&lock);
  /* Parked until main is done (a compute-pool thread stand-in). */
  while (read(stop_pipe[0], &c, 1) < 0) {}
  return NULL;
}

/* Cpus_allowed_list of one thread, from /proc. */
static int thread_cpus(pid_t tid, char* out, size_t n) {
  char path[64], line[512];
  snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  int found = -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
      const char* v = line + 18;
      while (*v == ' ' || *v == '\t') v++;
      snprintf(out, n, "%.*s", (int)strcspn(v, "\n"), v);
      found = 0;
      break;
    }
  }
  fclose(f);
  return found;
}

/* Prints "WHAT RANK LOCAL_RANK LOCAL_SIZE MAIN_CPUS HELPER_CPUS"; 0 when the
 * lists cannot be read. */
static int show(const char* what, int rank, const collie_peer_info_t* info, char* m, char* h, size_t n) {
  if (thread_cpus((pid_t)syscall(SYS_gettid), m, n) != 0 || thread_cpus(helper_tid, h, n) != 0) return 0;
  printf("%s %d %d %d %s %s\n", what, rank, info->local_rank, info->local_size, m, h);
  fflush(stdout);
  return 1;
}

int main(void) {
  pthread_t th;
  if (pipe(stop_pipe) != 0 || pthread_create(&th, NULL, helper, NULL) != 0) {
    perror("bind_probe: setup");
    return 1;
  }
  pthread_mutex_lock(&lock);
  while (helper_tid == 0) pthread_cond_wait(&ready, &lock);
  pthread_mutex_unlock(&lock);

  ncclComm_t comm;
  ncclResult_t res = collie_comm_init_from_env(&comm);
  if (res != ncclSuccess) {
    fprintf(stderr, "bind_probe: init failed: %s: %s\n", ncclGetErrorString(res), ncclGetLastError(NULL));
    return 1;
  }
  int rank;
  collie_peer_info_t info = {.size = sizeof(info)};
  char main_cpus[256], helper_cpus[256];
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || collie_comm_peer_info(comm, rank, &info) != ncclSuccess ||
      thread_cpus((pid_t)syscall(SYS_gettid), main_cpus, sizeof(main_cpus)) != 0 ||
      thread_cpus(helper_tid, helper_cpus, sizeof(helper_cpus)) != 0) {
    fprintf(stderr, "bind_probe: cannot read the placement\n");
    return 1;
  }
  printf("bind %d %d %d %s %s\n", rank, info.local_rank, info.local_size, main_cpus, helper_cpus);
  fflush(stdout);
  const char* s = getenv("BIND_PROBE_SLEEP_MS");
  if (s != NULL) {
    /* The first call sets up the connections (a bootstrap exchange, whose
     * waits are not the collectives'); rank 0 sleeps before the second. */
    float one = 1.0f, sum = 0.0f;
    ncclResult_t r = ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, comm, NULL);
    /* BIND_PROBE_GO: every rank first waits (sleeping, outside the
     * library) until that file exists, so the test can start something
     * beside the ranks before the waits that end a held placement begin. */
    const char* go = getenv("BIND_PROBE_GO");
    for (int i = 0; go != NULL && access(go, F_OK) != 0; i++) {
      if (i == 12000) {
        fprintf(stderr, "bind_probe: %s did not appear within 60 s\n", go);
        return 1;
      }
      usleep(5000);
    }
    if (rank == 0) usleep((useconds_t)atoi(s) * 1000);
    if (r == ncclSuccess) r = ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, comm, NULL);
    if (r != ncclSuccess || sum != (float)info.local_size ||
        !show("after", rank, &info, main_cpus, helper_cpus, sizeof(main_cpus))) {
      fprintf(stderr, "bind_probe: allreduce or placement after it failed (sum %g)\n", sum);
      return 1;
    }
  }
  ncclCommDestroy(comm);
  if (!show("destroyed", rank, &info, main_cpus, helper_cpus, sizeof(main_cpus))) return 1;
  if (write(stop_pipe[1], "x", 1) != 1) return 1;
  pthread_join(th, NULL);
  return 0;
}
