/* collie-run's placement (--bind-to, --report-bindings): before the first
 * fork, plans each rank's CPUs with the library's planner (src/graph/bind.c)
 * over the CPUs the launcher itself may use; supervise.c's run_child applies
 * a rank's set before exec. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

int place_init(struct job* job) {
  const struct options* o = job->o;
  struct bind_topo t;
  cpu_set_t allowed;
  int rc = -1;

  if (o->bind == BIND_NONE) {
    snprintf(job->unbound_why, sizeof(job->unbound_why), "--bind-to none");
    /* The user wants the ranks unbound: the library must not bind them
     * either, unless COLLIE_BIND says otherwise (-x or the environment). */
    if (getenv("COLLIE_BIND") == NULL && setenv("COLLIE_BIND", "none", 1) != 0) {
      fprintf(stderr, "collie-run: cannot set the environment: %s\n", strerror(errno));
      return -1;
    }
    return 0;
  }
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    fprintf(stderr, "collie-run: sched_getaffinity: %s\n", strerror(errno));
    return -1;
  }
  if (bind_topo_load(&allowed, &t) != ncclSuccess) {
    fprintf(stderr, "collie-run: cannot read the CPU topology: %s\n", ncclGetLastError(NULL));
    return -1;
  }
  job->cpus = calloc((size_t)job->n, sizeof(*job->cpus));
  job->cpu_node = calloc((size_t)job->n, sizeof(*job->cpu_node));
  if (job->cpus == NULL || job->cpu_node == NULL) {
    fprintf(stderr, "collie-run: out of memory\n");
    goto out;
  }
  for (int r = 0; r < job->n; r++) {
    char why[128];
    if (bind_plan(&t, o->bind, r, job->n, &job->cpus[r], &job->cpu_node[r], why, sizeof(why)) == 0) continue;
    if (o->bind_given) {
      /* As mpirun: an explicit binding that cannot be done is an error. */
      fprintf(stderr, "collie-run: --bind-to %s: %s; use --bind-to none or fewer ranks\n", bind_mode_name(o->bind),
              why);
      goto out;
    }
    /* The default: more ranks than cores run unbound. */
    snprintf(job->unbound_why, sizeof(job->unbound_why), "%s", why);
    free(job->cpus);
    free(job->cpu_node);
    job->cpus = NULL;
    job->cpu_node = NULL;
    break;
  }
  rc = 0;
out:
  bind_topo_free(&t);
  return rc;
}

void place_report(const struct job* job, int rank, pid_t pid) {
  if (job->cpus == NULL) {
    fprintf(stderr, "collie-run: rank %d (pid %d) not bound: %s\n", rank, (int)pid, job->unbound_why);
    return;
  }
  char list[256];
  bind_cpulist(&job->cpus[rank], list, sizeof(list));
  fprintf(stderr, "collie-run: rank %d (pid %d) bound to CPUs %s (%s %s, %d CPU%s, NUMA node %d)\n", rank, (int)pid,
          list, job->o->bind_given ? "--bind-to" : "default:", bind_mode_name(job->o->bind),
          CPU_COUNT(&job->cpus[rank]), CPU_COUNT(&job->cpus[rank]) == 1 ? "" : "s", job->cpu_node[rank]);
}

void place_free(struct job* job) {
  free(job->cpus);
  free(job->cpu_node);
  job->cpus = NULL;
  job->cpu_node = NULL;
}
