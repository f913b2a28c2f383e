/* Placement: which CPUs each rank of a host gets. bind_topo_load lists the
 * usable cores node by node (hwloc), bind_plan divides them among the local
 * ranks, bind_apply sets a mask on the process; bind_comm is the library's
 * COLLIE_BIND policy, called once from init.c. collie-run (tools/run/) uses
 * the same plan for --bind-to. */
#ifndef COLLIE_BIND_H
#define COLLIE_BIND_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"
#include "../core.h"

enum bind_mode {
  BIND_NONE,     /* leave the mask alone */
  BIND_SHARE,    /* an equal, disjoint share of the cores, inside one NUMA node when possible */
  BIND_CORE,     /* one core: all of its hardware threads */
  BIND_HWTHREAD, /* one hardware thread */
  BIND_NUMA,     /* every allowed CPU of the rank's NUMA node */
};

/* One core (or, for BIND_HWTHREAD plans, one hardware thread). */
struct bind_unit {
  int node;       /* index of its NUMA node in struct bind_topo's order */
  cpu_set_t cpus; /* its hardware threads that are in the allowed set */
};

/* The allowed part of the machine, in hwloc's logical order, node by node. */
struct bind_topo {
  struct bind_unit* cores;
  int ncores;
  struct bind_unit* pus; /* one unit per hardware thread */
  int npus;
  int nnodes;
  cpu_set_t machine; /* every CPU this process could be given (online, cgroup) */
  cpu_set_t allowed; /* what the topology was restricted to */
};

/* "none", "share", "core", "hwthread" or "numa". Returns 0, or -1 for any
 * other string. */
int bind_mode_parse(const char* s, enum bind_mode* out);
const char* bind_mode_name(enum bind_mode m);

/* Loads the topology restricted to `allowed` (hwloc when built with it; else
 * every allowed CPU counts as a core of node 0). */
ncclResult_t bind_topo_load(const cpu_set_t* allowed, struct bind_topo* t);
void bind_topo_free(struct bind_topo* t);

/* The CPUs of local rank `local_rank` of `local_size` under `mode`. Returns 0
 * with *out set (and *node its NUMA node), or 1 with a reason in why when the
 * mode cannot give every rank its own CPUs (more ranks than cores). Pure: it
 * looks at t only, so every rank that plans from the same topology agrees. */
int bind_plan(const struct bind_topo* t, enum bind_mode mode, int local_rank, int local_size, cpu_set_t* out, int* node,
              char* why, size_t why_len);

/* Sets `set` on every thread of the calling process whose mask is `from`
 * (threads someone pinned elsewhere keep their pin); new threads inherit it
 * from their creator. Returns the number of threads bound, or -1 (errno). */
int bind_apply(const cpu_set_t* from, const cpu_set_t* set);

/* Moves the calling thread off CPU `cpu` (where it runs now) without
 * changing its affinity: the mask without that CPU makes the kernel migrate
 * it at once, then the mask it had is put back (a mask that includes the new
 * CPU moves nothing). Returns 1 when it now runs elsewhere, 0 when it could
 * not move (its mask has no other CPU, or does not hold `cpu`), -1 when the
 * old mask could not be put back (errno). */
int bind_move_off_cpu(int cpu);
/* Moves the calling thread to CPU `cpu` the same way (a mask of that CPU
 * alone, then the mask it had). Returns 1 when it now runs there, 0 when it
 * could not move (the CPU is not in its mask), -1 as bind_move_off_cpu. */
int bind_move_to_cpu(int cpu);
/* Where rank `me` of n ranks that share the CPUs of `mask` should move so
 * that no CPU of the mask has two ranks more than another (COLLIE_SPREAD):
 * cpu_of[i] is the CPU rank i last ran on. Of the ranks on a CPU that has
 * two more than the least crowded CPU of the mask, only the highest moves
 * (to the lowest such CPU), so ranks that decide at once from the same
 * table do not all move. With exactly two ranks a CPU (n == 2 x the
 * mask's CPUs) and me_pos >= 0 (this rank's place in the ring) the place
 * decides instead: the (me_pos mod CPUs)-th CPU of the mask, so that
 * neighbours in the ring never share a CPU and every CPU has two ranks.
 * Returns that CPU, or -1: stay (balanced, already there, not the one to
 * move, or a rank's CPU unknown).
 * Pure: it looks at its arguments only. */
int bind_spread_target(const int32_t* cpu_of, int n, int me, int me_pos, const cpu_set_t* mask);
/* Tasks that can run on the whole machine at this instant (running or
 * waiting for a CPU; the caller counts as one): the fourth field of
 * /proc/loadavg. -1 when it cannot be read. */
int bind_runnable_tasks(void);
/* Whether thread `tid` of process `pid` can run at this instant (state R in
 * /proc/PID/task/TID/stat): 1, 0 (sleeping or anything else), -1 when it
 * cannot be read. */
int bind_thread_runnable(int pid, int tid);

/* The calling thread's time on a CPU and its time runnable but waiting
 * for one, ns since it started (the first two fields of
 * /proc/thread-self/schedstat; kernels with schedstats). 0, or -1 when they
 * cannot be read. */
int bind_thread_schedstat(int64_t* run_ns, int64_t* wait_ns);

/* "0-3,8" for a set; "..." at the end when it does not fit. */
void bind_cpulist(const cpu_set_t* set, char* out, size_t n);
/* Parses such a list. Returns 0, or -1 when it is not one. */
int bind_cpulist_parse(const char* s, cpu_set_t* out);

/* How many CPUs the ranks on host `host_hash` may use between them: the union
 * of their CPU lists from the peer info. Bound ranks each list a few CPUs, so
 * one rank's list says nothing about crowding; the union does. 0 if unknown. */
int bind_host_cpus(ncclComm_t comm, uint64_t host_hash);
/* The same for the ranks on machine `machine` (comm->machine[]: whatever
 * NCCL_HOSTID says). */
int bind_machine_cpus(ncclComm_t comm, uint64_t machine);

/* COLLIE_BIND at init: when this process's ranks run unbound, give each local
 * rank its share of the cores (see docs/ARCHITECTURE.md, Placement). Never
 * fails init; logs one INFO line saying what it did and why. */
void bind_comm(ncclComm_t comm);
/* The held placement of ranks that outnumber the cores (COLLIE_BIND=hold,
 * bind.c): bind_comm sets BIND_HOLD_HELD; bind_hold_end gives this process
 * (all: every local rank of the communicator that set it) its whole mask
 * back, once, with an INFO line saying why. Waiters report their waits of
 * BIND_HOLD_LONG_NS or more to bind_hold_count (bind_yield, prim_sleep_checks),
 * which ends the hold when they add up. */
enum { BIND_HOLD_NONE, BIND_HOLD_HELD, BIND_HOLD_OVER };
extern int bind_hold_state;
void bind_hold_end(const char* why, int all);
/* Counts waited_ns of a long wait (the caller checked it is one). */
void bind_hold_count(int64_t waited_ns, const char* how);
#define BIND_HOLD_LONG_NS 1000000LL
/* At a communicator's release: the hold it set ends for this process (its
 * affinity must not outlive the library's waits). */
void bind_comm_release(ncclComm_t comm);
static inline int bind_held(void) { return __atomic_load_n(&bind_hold_state, __ATOMIC_RELAXED) == BIND_HOLD_HELD; }
/* sched_yield, timed while a placement is held: a yield that returns only
 * after a whole time slice means something else on this CPU wants it. */
static inline void bind_yield(void) {
  if (!bind_held()) {
    sched_yield();
    return;
  }
  int64_t t = time_ns();
  sched_yield();
  t = time_ns() - t;
  if (t >= BIND_HOLD_LONG_NS) bind_hold_count(t, "a yield");
}

#endif
