/* Placement of a host's ranks on its CPUs; see bind.h. The plan is a pure
 * function of the topology, the local rank and the local size, so collie-run
 * (tools/run/supervise.c) and every rank of a communicator (bind_comm, called
 * from init.c) arrive at the same disjoint sets without talking to each other. */
#include "bind.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "../comm.h"
#include "../core.h"
#include "../procstat.h"

#ifdef COLLIE_HAVE_HWLOC
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#endif

static const char* const mode_names[] = {
    [BIND_NONE] = "none",         [BIND_SHARE] = "share", [BIND_CORE] = "core",
    [BIND_HWTHREAD] = "hwthread", [BIND_NUMA] = "numa",
};

int bind_mode_parse(const char* s, enum bind_mode* out) {
  for (size_t i = 0; i < sizeof(mode_names) / sizeof(mode_names[0]); i++) {
    if (s != NULL && strcmp(s, mode_names[i]) == 0) {
      *out = (enum bind_mode)i;
      return 0;
    }
  }
  return -1;
}

const char* bind_mode_name(enum bind_mode m) {
  return (size_t)m < sizeof(mode_names) / sizeof(mode_names[0]) ? mode_names[m] : "?";
}

/* ---- CPU lists ------------------------------------------------------------ */

void bind_cpulist(const cpu_set_t* set, char* out, size_t n) {
  size_t o = 0;
  if (n == 0) return;
  out[0] = '\0';
  for (int c = 0; c < CPU_SETSIZE && o < n; c++) {
    if (!CPU_ISSET(c, set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
    int w = e > c ? snprintf(out + o, n - o, "%s%d-%d", o ? "," : "", c, e)
                  : snprintf(out + o, n - o, "%s%d", o ? "," : "", c);
    if (w < 0) break;
    o += (size_t)w;
    c = e;
  }
  if (o >= n && n > 4) snprintf(out + n - 4, 4, "...");
}

static int parse_cpu(const char** p) {
  if (**p < '0' || **p > '9') return -1;
  long v = 0;
  while (**p >= '0' && **p <= '9') {
    v = v * 10 + (**p - '0');
    if (v >= CPU_SETSIZE) return -1;
    (*p)++;
  }
  return (int)v;
}

int bind_cpulist_parse(const char* s, cpu_set_t* out) {
  CPU_ZERO(out);
  if (s == NULL) return -1;
  const char* p = s;
  while (*p != '\0' && *p != '\n') {
    int a = parse_cpu(&p), b = a;
    if (a < 0) return -1;
    if (*p == '-') {
      p++;
      b = parse_cpu(&p);
      if (b < a) return -1;
    }
    for (int c = a; c <= b; c++) CPU_SET(c, out);
    if (*p == ',') {
      p++;
      if (*p == '\0' || *p == '\n') return -1;
    } else if (*p != '\0' && *p != '\n') {
      return -1;
    }
  }
  return p == s ? -1 : 0;
}

/* ---- topology ------------------------------------------------------------- */

void bind_topo_free(struct bind_topo* t) {
  free(t->cores);
  free(t->pus);
  memset(t, 0, sizeof(*t));
}

/* Stable order node by node: a rank's share of consecutive units then lies in
 * one node whenever the numbers allow. */
static void sort_by_node(struct bind_unit* u, int n) {
  for (int i = 1; i < n; i++) {
    struct bind_unit x = u[i];
    int j = i - 1;
    while (j >= 0 && u[j].node > x.node) {
      u[j + 1] = u[j];
      j--;
    }
    u[j + 1] = x;
  }
}

#ifndef COLLIE_HAVE_HWLOC
/* Without hwloc: every CPU the system has online (else 0..nprocs-1). */
static void online_cpus(cpu_set_t* set) {
  char buf[4096];
  FILE* f = fopen("/sys/devices/system/cpu/online", "r");
  int ok = 0;
  if (f != NULL) {
    ok = fgets(buf, sizeof(buf), f) != NULL && bind_cpulist_parse(buf, set) == 0;
    fclose(f);
  }
  if (!ok) {
    CPU_ZERO(set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < n && c < CPU_SETSIZE; c++) CPU_SET((int)c, set);
  }
}
#endif

#ifdef COLLIE_HAVE_HWLOC
static ncclResult_t topo_from_hwloc(const cpu_set_t* allowed, struct bind_topo* t) {
  hwloc_topology_t topo;
  hwloc_bitmap_t mask = NULL, x = NULL;
  ncclResult_t res = ncclSystemError;
  if (hwloc_topology_init(&topo) != 0) return err_set(ncclSystemError, "hwloc_topology_init failed");
  /* Only what placement needs: keeps the load fast when many ranks start. */
  hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_CORE, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_PU, HWLOC_TYPE_FILTER_KEEP_ALL);
  hwloc_topology_set_type_filter(topo, HWLOC_OBJ_NUMANODE, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return err_set(ncclSystemError, "hwloc_topology_load failed");
  }
  mask = hwloc_bitmap_alloc();
  x = hwloc_bitmap_alloc();
  if (mask == NULL || x == NULL) {
    res = err_set(ncclSystemError, "out of memory loading the topology");
    goto out;
  }
  /* The allowed set is what the cgroup grants (hwloc leaves disallowed CPUs
   * out by default), i.e. the most any process here can be given. */
  hwloc_cpuset_to_glibc_sched_affinity(topo, hwloc_topology_get_allowed_cpuset(topo), &t->machine, sizeof(t->machine));
  hwloc_cpuset_from_glibc_sched_affinity(topo, mask, allowed, sizeof(*allowed));

  int ncore = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  hwloc_obj_type_t core_type = ncore > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  if (ncore <= 0) ncore = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  int npu = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  int nnode = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  t->cores = calloc((size_t)(ncore > 0 ? ncore : 1), sizeof(*t->cores));
  t->pus = calloc((size_t)(npu > 0 ? npu : 1), sizeof(*t->pus));
  if (t->cores == NULL || t->pus == NULL) {
    res = err_set(ncclSystemError, "out of memory loading the topology");
    goto out;
  }
  for (int i = 0; i < ncore; i++) {
    hwloc_obj_t c = hwloc_get_obj_by_type(topo, core_type, (unsigned)i);
    hwloc_bitmap_and(x, c->cpuset, mask);
    if (hwloc_bitmap_iszero(x)) continue;
    int node = 0;
    for (int k = 0; k < nnode; k++) {
      hwloc_obj_t nd = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)k);
      if (hwloc_bitmap_intersects(nd->cpuset, c->cpuset)) {
        node = k;
        break;
      }
    }
    struct bind_unit* u = &t->cores[t->ncores++];
    u->node = node;
    hwloc_cpuset_to_glibc_sched_affinity(topo, x, &u->cpus, sizeof(u->cpus));
    /* Its hardware threads, in order, as the units of hwthread plans. */
    for (int pu = hwloc_bitmap_first(x); pu >= 0; pu = hwloc_bitmap_next(x, pu)) {
      if (t->npus >= npu || pu >= CPU_SETSIZE) break;
      struct bind_unit* p = &t->pus[t->npus++];
      p->node = node;
      CPU_ZERO(&p->cpus);
      CPU_SET(pu, &p->cpus);
    }
  }
  t->nnodes = nnode > 0 ? nnode : 1;
  res = ncclSuccess;
out:
  hwloc_bitmap_free(mask);
  hwloc_bitmap_free(x);
  hwloc_topology_destroy(topo);
  return res;
}
#endif

ncclResult_t bind_topo_load(const cpu_set_t* allowed, struct bind_topo* t) {
  memset(t, 0, sizeof(*t));
  t->allowed = *allowed;
#ifdef COLLIE_HAVE_HWLOC
  ncclResult_t r = topo_from_hwloc(allowed, t);
  if (r != ncclSuccess) bind_topo_free(t);
  else {
    sort_by_node(t->cores, t->ncores);
    sort_by_node(t->pus, t->npus);
  }
  return r;
#else
  /* No hwloc: each allowed CPU is a core of one node (hyperthreads and NUMA
   * unknown), which still gives disjoint sets. */
  online_cpus(&t->machine);
  int n = CPU_COUNT(allowed);
  t->cores = calloc((size_t)(n > 0 ? n : 1), sizeof(*t->cores));
  t->pus = calloc((size_t)(n > 0 ? n : 1), sizeof(*t->pus));
  if (t->cores == NULL || t->pus == NULL) {
    bind_topo_free(t);
    return err_set(ncclSystemError, "out of memory loading the topology");
  }
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, allowed)) continue;
    struct bind_unit* u = &t->cores[t->ncores++];
    CPU_ZERO(&u->cpus);
    CPU_SET(c, &u->cpus);
    t->pus[t->npus++] = *u;
  }
  t->nnodes = 1;
  return ncclSuccess;
#endif
}

/* ---- the plan ------------------------------------------------------------- */

/* Spreads n ranks over the nodes in proportion to their weights (units),
 * never more than cap[i] on node i (cap NULL: no limit). Each rank goes where
 * the ranks-per-unit ratio stays lowest; ties to the lower node. */
static int spread(const int* weight, const int* cap, int nnodes, int n, int* count) {
  memset(count, 0, sizeof(int) * (size_t)nnodes);
  for (int k = 0; k < n; k++) {
    int best = -1;
    for (int i = 0; i < nnodes; i++) {
      if (weight[i] == 0 || (cap != NULL && count[i] >= cap[i])) continue;
      if (best < 0 || (long)(count[i] + 1) * weight[best] < (long)(count[best] + 1) * weight[i]) best = i;
    }
    if (best < 0) return -1;
    count[best]++;
  }
  return 0;
}

int bind_plan(const struct bind_topo* t, enum bind_mode mode, int local_rank, int local_size, cpu_set_t* out, int* node,
              char* why, size_t why_len) {
  const struct bind_unit* u = mode == BIND_HWTHREAD ? t->pus : t->cores;
  int n = mode == BIND_HWTHREAD ? t->npus : t->ncores;
  int nn = t->nnodes > 0 ? t->nnodes : 1;
  int rc = 1;
  CPU_ZERO(out);
  *node = -1;
  if (mode == BIND_NONE) {
    snprintf(why, why_len, "--bind-to none");
    return 1;
  }
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size || n == 0) {
    snprintf(why, why_len, "no CPU to place local rank %d of %d on", local_rank, local_size);
    return 1;
  }
  if (mode != BIND_NUMA && n < local_size) {
    snprintf(why, why_len, "%d local ranks but %d %s", local_size, n,
             mode == BIND_HWTHREAD ? "hardware threads" : "cores");
    return 1;
  }
  int* first = calloc((size_t)nn, sizeof(int));
  int* cnt = calloc((size_t)nn, sizeof(int));
  int* cap = calloc((size_t)nn, sizeof(int));
  int* count = calloc((size_t)nn, sizeof(int));
  if (!first || !cnt || !cap || !count) {
    snprintf(why, why_len, "out of memory");
    goto out;
  }
  for (int i = n - 1; i >= 0; i--) {
    int k = u[i].node >= 0 && u[i].node < nn ? u[i].node : 0;
    cnt[k]++;
    first[k] = i; /* units are sorted by node: the lowest index is its first */
  }
  /* The share: as many units as an equal split allows, shrunk until whole
   * shares fit inside the nodes (3 ranks on 2 nodes of 8 cores get 4 cores
   * each, one node apiece, rather than 5 with one share across both). */
  int s = mode == BIND_NUMA ? 1 : n / local_size;
  for (;; s--) {
    int fit = 0;
    for (int i = 0; i < nn; i++) fit += cnt[i] / s;
    if (fit >= local_size || s == 1) break;
  }
  for (int i = 0; i < nn; i++) cap[i] = cnt[i] / s;
  if (spread(cnt, mode == BIND_NUMA ? NULL : cap, nn, local_size, count) != 0) {
    snprintf(why, why_len, "cannot spread %d local ranks over %d units", local_size, n);
    goto out;
  }
  /* Ranks fill the nodes in order, so neighbouring ranks share a node. */
  int nd = 0, k = local_rank;
  while (k >= count[nd]) k -= count[nd++];
  *node = nd;
  if (mode == BIND_NUMA) {
    for (int i = 0; i < cnt[nd]; i++) CPU_OR(out, out, &u[first[nd] + i].cpus);
  } else {
    int take = mode == BIND_SHARE ? s : 1;
    for (int i = 0; i < take; i++) CPU_OR(out, out, &u[first[nd] + k * s + i].cpus);
  }
  rc = 0;
out:
  free(first);
  free(cnt);
  free(cap);
  free(count);
  return rc;
}

/* ---- applying ------------------------------------------------------------- */

/* sched_setaffinity(pid) changes one thread (the one whose id is pid), so a
 * whole process means every entry of /proc/PID/task. A thread started while
 * we walk inherits its creator's old mask; another pass catches it. */
static int apply_to(pid_t pid, const cpu_set_t* from, const cpu_set_t* set) {
  char path[64];
  int bound = 0;
  if (pid == 0) snprintf(path, sizeof(path), "/proc/self/task");
  else snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  for (int pass = 0; pass < 8; pass++) {
    DIR* d = opendir(path);
    if (d == NULL) return -1;
    int changed = 0;
    bound = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      pid_t tid = (pid_t)atoi(e->d_name);
      cpu_set_t cur;
      if (sched_getaffinity(tid, sizeof(cur), &cur) != 0) continue; /* it exited */
      if (CPU_EQUAL(&cur, set)) {
        bound++;
        continue;
      }
      if (!CPU_EQUAL(&cur, from)) continue; /* pinned by someone on purpose */
      if (sched_setaffinity(tid, sizeof(*set), set) != 0) {
        if (errno == ESRCH) continue;
        int err = errno;
        closedir(d);
        errno = err;
        return -1;
      }
      changed++;
      bound++;
    }
    closedir(d);
    if (changed == 0) break;
  }
  return bound;
}

int bind_apply(const cpu_set_t* from, const cpu_set_t* set) { return apply_to(0, from, set); }

/* ---- held placement of ranks that outnumber the cores -------------------- */

/* With more local ranks than cores, COLLIE_BIND=hold puts local rank i on
 * core i mod cores (two ranks a CPU at 4 ranks on 2 CPUs) and holds it there
 * only while nothing else wants those CPUs: long waits (bind_hold_count,
 * below) give every local rank its whole mask back (the ranks belong to one
 * user, so one rank may set another's mask), for the rest of the processes'
 * lives. Unbound, such ranks drift: a futex wake puts
 * the woken rank beside its waker, and for the first few hundred ms of a run
 * three ranks often take turns on one CPU while the fourth has the other to
 * itself (4-rank alltoall of 128 KiB 45-47 us in 4 of 8 runs, 27 in the
 * others; held: 24.5-29 in 8 of 8). Held beside a CPU hog, the two ranks on
 * the hog's CPU wait for its time slices (every call 2-4 ms): their peers'
 * sleeps, a slice long, end the hold. A rank that waits for a peer's compute
 * ends it too; it only ever falls back to the unbound placement. A process
 * that keeps a CPU busy at init means no hold at all (hold_plan), and one
 * that turns up later is stepped around when the hold ends (bind_hold_end
 * moves every rank off its CPU first). Opt-in (COLLIE_BIND=hold): it is not
 * ahead of the unbound placement on every machine (docs/ARCHITECTURE.md,
 * Placement). */
#define BIND_HOLD_RANKS 64
static struct {
  const void* comm; /* the communicator that set it */
  int n;
  pid_t pid[BIND_HOLD_RANKS];
  cpu_set_t set[BIND_HOLD_RANKS]; /* what local rank k of pid[k] was given */
  cpu_set_t whole;                /* the mask every one of them had */
} hold;
int bind_hold_state; /* BIND_HOLD_NONE, _HELD, _OVER */

static int held_pid(pid_t pid) {
  for (int k = 0; k < hold.n; k++)
    if (hold.pid[k] == pid) return 1;
  return 0;
}

/* Another process that keeps a CPU busy: a thread of a process that is not
 * one of the held ranks (nor this one) that ran at least a quarter of a
 * BUSY_WINDOW_NS window (the first field of /proc/PID/task/TID/schedstat is
 * the nanoseconds it has run). A look at who is runnable at one instant
 * also catches short-lived processes (a shell loop's grep and sleep). */
#define BUSY_WINDOW_NS 20000000LL
#define BUSY_TASKS_MAX 4096
struct busy_task {
  pid_t pid, tid;
  unsigned long long ran_ns;
};

/* A small file under /proc, read into buf (n > 1) and terminated: its
 * length, or -1 when it cannot be read or is empty. */
static ssize_t read_text(const char* path, char* buf, size_t n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t got = read(fd, buf, n - 1);
  close(fd);
  if (got <= 0) return -1;
  buf[got] = '\0';
  return got;
}

static int read_u64(const char* path, unsigned long long* v) {
  char buf[64];
  return read_text(path, buf, sizeof(buf)) > 0 && sscanf(buf, "%llu", v) == 1 ? 0 : -1;
}

/* The CPU a task last ran on: field 39 of its stat; -1 when unknown. */
static int task_cpu(pid_t pid, pid_t tid) {
  char buf[1024];
  const char* p = procstat_fields((int)pid, (int)tid, buf, sizeof(buf));
  const char* cpu = p ? procstat_field(p, 39) : NULL;
  return cpu ? atoi(cpu) : -1;
}

/* Every thread of every other process, with the time it has run. */
static int foreign_tasks(struct busy_task* t, int max) {
  int n = 0;
  DIR* d = opendir("/proc");
  if (d == NULL) return 0;
  pid_t self = getpid();
  struct dirent* e;
  while (n < max && (e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid == self || held_pid(pid)) continue;
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR* td = opendir(dir);
    if (td == NULL) continue;
    struct dirent* te;
    while (n < max && (te = readdir(td)) != NULL) {
      if (te->d_name[0] < '0' || te->d_name[0] > '9') continue;
      char path[96];
      pid_t tid = (pid_t)atoi(te->d_name);
      snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)pid, (int)tid);
      if (read_u64(path, &t[n].ran_ns) != 0) continue;
      t[n].pid = pid;
      t[n].tid = tid;
      n++;
    }
    closedir(td);
  }
  closedir(d);
  return n;
}

/* The CPUs of `among` that another process kept busy over the last
 * BUSY_WINDOW_NS (this call sleeps that long): a hog's CPU. `who` (whon
 * bytes) names the busy threads for the log: "pid 123 (sh) on CPU 0". */
static void foreign_busy_cpus(const cpu_set_t* among, cpu_set_t* busy, char* who, size_t whon) {
  CPU_ZERO(busy);
  who[0] = '\0';
  struct busy_task* t = malloc(sizeof(*t) * BUSY_TASKS_MAX);
  if (t == NULL) return;
  int n = foreign_tasks(t, BUSY_TASKS_MAX);
  struct timespec w = {0, BUSY_WINDOW_NS};
  nanosleep(&w, NULL);
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    char path[96], name[32] = "?";
    unsigned long long now;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)t[i].pid, (int)t[i].tid);
    if (read_u64(path, &now) != 0 || now - t[i].ran_ns < BUSY_WINDOW_NS / 4) continue;
    int cpu = task_cpu(t[i].pid, t[i].tid);
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, among)) continue;
    CPU_SET(cpu, busy);
    snprintf(path, sizeof(path), "/proc/%d/task/%d/comm", (int)t[i].pid, (int)t[i].tid);
    if (read_text(path, name, sizeof(name)) > 0) name[strcspn(name, "\n")] = '\0';
    if (used < whon) {
      int k = snprintf(who + used, whon - used, "%spid %d (%s) on CPU %d", used ? ", " : "", (int)t[i].pid, name, cpu);
      used += k > 0 ? (size_t)k : 0;
    }
  }
  free(t);
}

void bind_hold_end(const char* why, int all) {
  int held = BIND_HOLD_HELD;
  if (!__atomic_compare_exchange_n(&bind_hold_state, &held, BIND_HOLD_OVER, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  pid_t self = getpid();
  /* Beside another busy task, first move every rank off its CPU: left
   * where the hold put them, the ranks on that CPU wait for its time slices
   * in every call, and the scheduler does not move a rank that sleeps and
   * wakes there (4-rank reduce of 8 B: 45-50 us a call against 0.5 unbound). */
  cpu_set_t busy, away;
  char who[160] = "";
  CPU_ZERO(&busy);
  if (all) foreign_busy_cpus(&hold.whole, &busy, who, sizeof(who));
  CPU_XOR(&away, &hold.whole, &busy);
  int move = CPU_COUNT(&busy) > 0 && CPU_COUNT(&away) > 0;
  int n = 0;
  for (int k = 0; k < hold.n; k++) {
    if (!all && hold.pid[k] != self) continue;
    pid_t pid = hold.pid[k] == self ? 0 : hold.pid[k];
    const cpu_set_t* from = &hold.set[k];
    if (move && apply_to(pid, from, &away) > 0) from = &away;
    if (apply_to(pid, from, &hold.whole) > 0) n++;
  }
  char list[128], off[352] = "";
  bind_cpulist(&hold.whole, list, sizeof(list));
  if (move) {
    char b[96];
    bind_cpulist(&busy, b, sizeof(b));
    snprintf(off, sizeof(off), " (moved off CPUs %s first: another process runs there: %s)", b, who);
  }
  INFO(LOG_INIT | LOG_ENV, "COLLIE_BIND=hold: %s; %d process(es) may run on CPUs %s again%s", why, n, list, off);
}
/* The hold ends when waits of at least BIND_HOLD_LONG_NS (a yield that came
 * back only after another task's time slice, or a wait's sleep) add up to
 * BIND_HOLD_SUM_NS within one BIND_HOLD_WINDOW_NS window. Without a hog a
 * 4-rank run sees a few such waits at start-up (1.3-4.8 ms each, while the
 * others finish init) and almost none after; beside one, the ranks that
 * share its CPU wait a slice (1.5-2 ms) in every call. */
#define BIND_HOLD_SUM_NS 20000000LL
#define BIND_HOLD_WINDOW_NS 100000000LL

void bind_hold_count(int64_t waited_ns, const char* how) {
  static int64_t window_start, window_sum; /* this process's waits (racy sums are fine: a heuristic) */
  cpu_set_t cur;
  if (sched_getaffinity(0, sizeof(cur), &cur) == 0 && CPU_EQUAL(&cur, &hold.whole)) {
    /* Another local rank ended the hold for every process. */
    int held = BIND_HOLD_HELD;
    __atomic_compare_exchange_n(&bind_hold_state, &held, BIND_HOLD_OVER, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return;
  }
  int64_t now = time_ns();
  if (now - __atomic_load_n(&window_start, __ATOMIC_RELAXED) > BIND_HOLD_WINDOW_NS) {
    __atomic_store_n(&window_start, now, __ATOMIC_RELAXED);
    __atomic_store_n(&window_sum, 0, __ATOMIC_RELAXED);
  }
  int64_t sum = __atomic_add_fetch(&window_sum, waited_ns, __ATOMIC_RELAXED);
  if (sum < BIND_HOLD_SUM_NS) return;
  char why[128];
  snprintf(why, sizeof(why), "waits of 1 ms or more (%s: %.1f ms) took %.1f ms of the last %.0f ms", how,
           waited_ns / 1e6, sum / 1e6, BIND_HOLD_WINDOW_NS / 1e6);
  bind_hold_end(why, 1);
}

void bind_comm_release(ncclComm_t comm) {
  if (bind_held() && hold.comm == comm) bind_hold_end("its communicator is released", 0);
}

/* Plans the held placement of every local rank (local rank k on unit k mod
 * cores) and applies this rank's. Returns NULL, or why not. */
static const char* hold_plan(ncclComm_t comm, const struct bind_topo* t, const cpu_set_t* cur, cpu_set_t* mine,
                             int* node, char* why, size_t n) {
  const collie_peer_info_t* me = &comm->peers[comm->rank];
  if (comm->local_size > BIND_HOLD_RANKS) {
    snprintf(why, n, "%d local ranks (held placement up to %d)", comm->local_size, BIND_HOLD_RANKS);
    return why;
  }
  if (__atomic_load_n(&bind_hold_state, __ATOMIC_ACQUIRE) != BIND_HOLD_NONE) return "a held placement was ended";
  int units = t->ncores;
  if (units < 2) return "one core: nowhere to spread the ranks";
  hold.n = 0;
  hold.whole = *cur;
  for (int i = 0; i < comm->nranks; i++) {
    const collie_peer_info_t* p = &comm->peers[i];
    if (p->host_hash != me->host_hash) continue;
    int k = hold.n++, nd;
    hold.pid[k] = (pid_t)p->pid;
    if (bind_plan(t, BIND_SHARE, p->local_rank % units, units, &hold.set[k], &nd, why, n) != 0) return why;
    if (i == comm->rank) {
      *mine = hold.set[k];
      *node = nd;
    }
  }
  /* Another process that keeps a CPU busy (20 ms at init) would share it
   * with the ranks held there; unbound, the scheduler places them around
   * it from the start. */
  cpu_set_t busy;
  char who[160];
  foreign_busy_cpus(cur, &busy, who, sizeof(who));
  if (CPU_COUNT(&busy) > 0) {
    char list[96];
    bind_cpulist(&busy, list, sizeof(list));
    snprintf(why, n, "more local ranks than CPUs and another process runs on CPUs %s (%s)", list, who);
    return why;
  }
  return NULL;
}

/* ---- the library's policy ------------------------------------------------- */

int bind_host_cpus(ncclComm_t comm, uint64_t host_hash) {
  cpu_set_t all, one;
  CPU_ZERO(&all);
  for (int i = 0; i < comm->nranks; i++) {
    if (comm->peers[i].host_hash != host_hash) continue;
    if (bind_cpulist_parse(comm->peers[i].cpuset, &one) != 0) return 0; /* "?" or cut short */
    CPU_OR(&all, &all, &one);
  }
  return CPU_COUNT(&all);
}

int bind_machine_cpus(ncclComm_t comm, uint64_t machine) {
  cpu_set_t all, one;
  CPU_ZERO(&all);
  for (int i = 0; i < comm->nranks; i++) {
    if (comm->machine[i] != machine) continue;
    if (bind_cpulist_parse(comm->peers[i].cpuset, &one) != 0) return 0;
    CPU_OR(&all, &all, &one);
  }
  return CPU_COUNT(&all);
}

/* The most threads the compute libraries were told to use; 0 when none was. */
static int wanted_threads(void) {
  static const char* const vars[] = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
  int most = 0;
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    const char* v = getenv(vars[i]);
    if (v == NULL || v[0] == '\0') continue;
    int n = atoi(v); /* OMP_NUM_THREADS may be a list ("4,2"): its first level */
    if (n > most) most = n;
  }
  return most;
}

/* A library that starts a pool of compute threads (OpenMP, torch, BLAS) is
 * mapped into the process: binding could squeeze that pool onto a share. */
static int threaded_runtime(char* name, size_t n) {
  static const char* const libs[] = {"libgomp", "libiomp", "libomp.so", "libtorch_cpu", "openblas", "libmkl_"};
  char line[1024];
  int found = 0;
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == NULL) return 0;
  while (!found && fgets(line, sizeof(line), f) != NULL) {
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
      if (strstr(line, libs[i]) != NULL) {
        snprintf(name, n, "%s", libs[i]);
        found = 1;
        break;
      }
    }
  }
  fclose(f);
  return found;
}

/* Why not to bind, or NULL to go on: the cheap checks before the topology. */
static const char* bind_refusal(ncclComm_t comm, int is_auto, int may_hold, const cpu_set_t* cur, int* held, char* buf,
                                size_t n) {
  const collie_peer_info_t* me = &comm->peers[comm->rank];
  if (comm->local_size < 2) return "one rank on this host";
  for (int i = 0; i < comm->nranks; i++) {
    const collie_peer_info_t* p = &comm->peers[i];
    if (i == comm->rank || p->host_hash != me->host_hash) continue;
    if (p->pid == me->pid) return "local ranks share a process";
    /* Every local rank must decide alike: all unbound, or none is touched. */
    if (strcmp(p->cpuset, me->cpuset) != 0) {
      snprintf(buf, n, "already placed (local rank %d runs on CPUs %s, this one on %s)", p->local_rank, p->cpuset,
               me->cpuset);
      return buf;
    }
  }
  int ncpu = CPU_COUNT(cur);
  *held = ncpu < comm->local_size;
  if (*held && !may_hold) {
    snprintf(buf, n, "%d local ranks but %d CPUs", comm->local_size, ncpu);
    return buf;
  }
  if (!is_auto) return NULL;
  /* Held (more ranks than CPUs): a rank gets at most one CPU, shared. */
  int share = *held ? 1 : ncpu / comm->local_size, want = wanted_threads();
  char lib[32];
  if (want > share) {
    snprintf(buf, n, "compute threads wanted (%d, *_NUM_THREADS) exceed a rank's share of %d CPUs", want, share);
    return buf;
  }
  if (want == 0 && threaded_runtime(lib, sizeof(lib))) {
    snprintf(buf, n, "%s is loaded and no OMP_NUM_THREADS says how many threads it may use", lib);
    return buf;
  }
  return NULL;
}

void bind_comm(ncclComm_t comm) {
  static int placed; /* by an earlier communicator of this process */
  const char* v = param_str(P_COLLIE_BIND);
  /* hold: auto, and ranks that outnumber the cores are held by core. */
  int may_hold = v != NULL && strcmp(v, "hold") == 0;
  int is_auto = v == NULL || strcmp(v, "auto") == 0 || may_hold;
  enum bind_mode mode = BIND_SHARE;
  char why[384], list[128];
  const char* no = NULL;
  struct bind_topo t;
  cpu_set_t cur, set;
  memset(&t, 0, sizeof(t));

  if (!is_auto && strcmp(v, "core") == 0) mode = BIND_CORE;
  else if (!is_auto && strcmp(v, "none") == 0) no = "COLLIE_BIND=none";
  else if (!is_auto) {
    WARN("COLLIE_BIND=\"%s\" is not auto, hold, core or none; not binding", v);
    return;
  }
  if (no == NULL && __atomic_load_n(&placed, __ATOMIC_ACQUIRE)) no = "placed by an earlier communicator";
  if (no == NULL && sched_getaffinity(0, sizeof(cur), &cur) != 0) {
    snprintf(why, sizeof(why), "sched_getaffinity: %s", strerror(errno));
    no = why;
  }
  int held = 0;
  if (no == NULL) no = bind_refusal(comm, is_auto, may_hold, &cur, &held, why, sizeof(why));
  if (no == NULL && bind_topo_load(&cur, &t) != ncclSuccess) {
    snprintf(why, sizeof(why), "no topology: %s", ncclGetLastError(NULL));
    no = why;
  }
  if (no == NULL && !CPU_EQUAL(&cur, &t.machine)) {
    /* mpirun, taskset, numactl or the user placed this process already. */
    bind_cpulist(&cur, list, sizeof(list));
    snprintf(why, sizeof(why), "affinity already restricted to CPUs %s", list);
    no = why;
  }
  int node = -1, nthreads = 0;
  if (no == NULL && held) no = hold_plan(comm, &t, &cur, &set, &node, why, sizeof(why));
  else if (no == NULL && bind_plan(&t, mode, comm->local_rank, comm->local_size, &set, &node, why, sizeof(why)) != 0)
    no = why;
  if (no == NULL && (nthreads = bind_apply(&cur, &set)) < 0) {
    snprintf(why, sizeof(why), "sched_setaffinity: %s", strerror(errno));
    no = why;
  }
  bind_topo_free(&t);
  if (no != NULL) {
    INFO(LOG_INIT, "COLLIE_BIND=%s: local rank %d/%d left unbound: %s", v ? v : "auto", comm->local_rank,
         comm->local_size, no);
    return;
  }
  __atomic_store_n(&placed, 1, __ATOMIC_RELEASE);
  if (held) {
    hold.comm = comm;
    __atomic_store_n(&bind_hold_state, BIND_HOLD_HELD, __ATOMIC_RELEASE);
  }
  bind_cpulist(&set, list, sizeof(list));
  INFO(LOG_INIT, "COLLIE_BIND=%s: local rank %d/%d bound to CPUs %s (NUMA node %d, %d thread(s))%s",
       v ? v : "auto", comm->local_rank, comm->local_size, list, node, nthreads,
       held ? "; held while no rank waits long for its CPU (more local ranks than CPUs)" : "");
}

/* Sets `via` on the calling thread, which the kernel obeys by migrating it
 * at once, then puts `had` back. Returns the CPU it ran on in between, or
 * -2 when `via` was refused, -3 when `had` could not be put back. */
static int move_through(const cpu_set_t* had, const cpu_set_t* via, const char* what) {
  if (sched_setaffinity(0, sizeof(*via), via) != 0) return -2;
  int now = sched_getcpu();
  if (sched_setaffinity(0, sizeof(*had), had) != 0) {
    WARN("could not put back this thread's CPU affinity after moving it %s: %s", what, strerror(errno));
    return -3;
  }
  return now;
}

int bind_move_to_cpu(int cpu) {
  cpu_set_t had, there;
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(had), &had) != 0) return 0;
  if (!CPU_ISSET(cpu, &had)) return 0;
  CPU_ZERO(&there);
  CPU_SET(cpu, &there);
  int now = move_through(&had, &there, "to another CPU");
  return now == -3 ? -1 : now == cpu;
}

int bind_spread_target(const int32_t* cpu_of, int n, int me, int me_pos, const cpu_set_t* mask) {
  if (n < 2 || me < 0 || me >= n) return -1;
  int here = cpu_of[me];
  if (here < 0 || here >= CPU_SETSIZE || !CPU_ISSET(here, mask)) return -1;
  int on_here = 0, highest = -1;
  for (int i = 0; i < n; i++) {
    if (cpu_of[i] < 0) return -1; /* a rank that has not run a call yet */
    if (cpu_of[i] == here) {
      on_here++;
      highest = i;
    }
  }
  int cpus = CPU_COUNT(mask);
  if (me_pos >= 0 && cpus >= 1 && n == 2 * cpus) {
    /* Ring neighbours on other CPUs: each rank has its own CPU to go to,
     * so no two ever swap back and forth. */
    int k = me_pos % cpus, c = 0;
    for (; c < CPU_SETSIZE; c++)
      if (CPU_ISSET(c, mask) && k-- == 0) break;
    return c < CPU_SETSIZE && c != here ? c : -1;
  }
  if (highest != me) return -1;
  int least = -1, on_least = n + 1;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, mask)) continue;
    int k = 0;
    for (int i = 0; i < n; i++) k += cpu_of[i] == c;
    if (k < on_least) {
      on_least = k;
      least = c;
    }
  }
  return least >= 0 && on_here >= on_least + 2 ? least : -1;
}

int bind_runnable_tasks(void) {
  char buf[128];
  if (read_text("/proc/loadavg", buf, sizeof(buf)) < 0) return -1;
  double l1, l5, l15;
  int running, total;
  if (sscanf(buf, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5) return -1;
  return running;
}

int bind_thread_schedstat(int64_t* run_ns, int64_t* wait_ns) {
  char buf[128];
  if (read_text("/proc/thread-self/schedstat", buf, sizeof(buf)) < 0) return -1;
  long long run, wait;
  if (sscanf(buf, "%lld %lld", &run, &wait) != 2) return -1;
  *run_ns = run;
  *wait_ns = wait;
  return 0;
}

int bind_thread_runnable(int pid, int tid) {
  char buf[512];
  const char* p = procstat_fields(pid, tid, buf, sizeof(buf));
  return p == NULL ? -1 : *p == 'R';
}

int bind_move_off_cpu(int cpu) {
  cpu_set_t had, away;
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(had), &had) != 0) return 0;
  if (!CPU_ISSET(cpu, &had) || CPU_COUNT(&had) < 2) return 0;
  away = had;
  CPU_CLR(cpu, &away);
  int now = move_through(&had, &away, "off its CPU");
  return now == -3 ? -1 : now >= 0 && now != cpu;
}
