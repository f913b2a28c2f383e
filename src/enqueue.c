/* The API front of collectives and point-to-point: entry points through one
 * argument check, reduction operators (built-in and
 * ncclRedOpCreatePreMulSum) and group semantics. Host buffers with any
 * stream run to completion before the call (or ncclGroupEnd) returns. Inside
 * a group, calls are queued per thread and run at the outermost
 * ncclGroupEnd; when a group spans several communicators (one thread driving
 * several ranks), each communicator's work runs on its own thread so none
 * waits on another. Execution is exec.c's (plan, run, point-to-point
 * batches); nothing below calls back up here. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "comm_err.h"
#include "device/dev_plan.h"
#include "device/device.h"
#include "exec.h"
#include "failures.h"

/* ------------------------------------------------------------ reduction operators */

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  NCCLCHECK(comm_check(comm, "ncclRedOpCreatePreMulSum"));
  if (op == NULL) return err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: op is NULL");
  if (scalar == NULL) return err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: scalar is NULL");
  if (!dtype_valid(datatype))
    return err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return err_set(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);
  int slot = -1;
  for (int i = 0; i < comm->nredops; i++)
    if (!comm->redops[i].used) slot = i;
  if (slot < 0) {
    int cap = comm->nredops ? comm->nredops * 2 : 8;
    if (ncclNumOps + cap > ncclMaxRedOp) return err_set(ncclInvalidUsage, "ncclRedOpCreatePreMulSum: too many operators");
    struct user_redop* n = realloc(comm->redops, sizeof(*n) * (size_t)cap);
    if (!n) return err_set(ncclSystemError, "ncclRedOpCreatePreMulSum: out of memory");
    memset(n + comm->nredops, 0, sizeof(*n) * (size_t)(cap - comm->nredops));
    slot = comm->nredops;
    comm->redops = n;
    comm->nredops = cap;
  }
  struct user_redop* u = &comm->redops[slot];
  memset(u, 0, sizeof(*u));
  u->used = 1;
  u->dt = datatype;
  u->residence = residence;
  u->ptr = scalar;
  if (residence == ncclScalarHostImmediate) memcpy(&u->value, scalar, dtype_size(datatype));
  else u->ptr_on_device = device_mem_class(scalar) == MEM_DEVICE;
  *op = (ncclRedOp_t)(ncclNumOps + slot);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  NCCLCHECK(comm_check(comm, "ncclRedOpDestroy"));
  int slot = (int)op - ncclNumOps;
  if ((int)op >= 0 && (int)op < ncclNumOps)
    return err_set(ncclInvalidArgument, "ncclRedOpDestroy: operator %d is built in and cannot be destroyed", (int)op);
  if (slot < 0 || slot >= comm->nredops || !comm->redops[slot].used)
    return err_set(ncclInvalidArgument, "ncclRedOpDestroy: operator %d was not created on this communicator", (int)op);
  comm->redops[slot].used = 0;
  return ncclSuccess;
}

static ncclResult_t resolve_op(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t dt, struct coll_args* a,
                               const char* fn) {
  a->avg = 0;
  a->redop = (int)op;
  if ((int)op >= 0 && (int)op < ncclNumOps) {
    if (op == ncclAvg) {
      a->avg = 1;
      op = ncclSum;
    }
    if (red_op_init(&a->op, op, dt) != 0) return err_set(ncclInvalidArgument, "%s: invalid operator %d", fn, (int)op);
    return ncclSuccess;
  }
  int slot = (int)op - ncclNumOps;
  if ((int)op < 0 || slot >= comm->nredops || !comm->redops[slot].used)
    return err_set(ncclInvalidArgument, "%s: invalid reduction operator %d (not built in, not created on this comm)", fn,
                   (int)op);
  struct user_redop* u = &comm->redops[slot];
  if (u->dt != dt)
    return err_set(ncclInvalidArgument, "%s: operator %d was created for datatype %s, not %s", fn, (int)op,
                   dtype_name(u->dt), dtype_name(dt));
  /* A scalar in device memory is read when the call runs (by the kernel, the
   * staging copy or exec_coll); until then the operator holds zero. */
  static const uint64_t zero;
  const void* scalar = u->residence == ncclScalarHostImmediate ? (const void*)&u->value
                       : u->ptr_on_device                       ? (const void*)&zero
                                                                : u->ptr;
  if (red_op_init_premulsum(&a->op, scalar, dt) != 0)
    return err_set(ncclInvalidArgument, "%s: cannot use operator %d", fn, (int)op);
  /* A device-resident scalar is read when the operation runs (ncclGroupEnd for grouped calls). */
  a->scalar_ptr = u->residence == ncclScalarDevice ? u->ptr : NULL;
  return ncclSuccess;
}

/* ------------------------------------------------------------ argument checks */

/* One call on its way through the front: its arguments, and the first buffer
 * of each memory class (device/dev_plan.h) for the message when a call mixes
 * them. On the caller's stack: the front keeps no per-call state in
 * thread-locals (each access costs a TLS descriptor call on every call). */
struct call {
  struct coll_args a;
  const char *dev_buf, *host_buf;
};

static ncclResult_t check_buf(struct call* c, const void* p, size_t bytes, const char* what, const char* fn) {
  if (!bytes) return ncclSuccess;
  if (p == NULL) return err_set(ncclInvalidArgument, "%s: %s is NULL with a non-zero count", fn, what);
  int cls = device_mem_class(p);
  const char** first = cls == MEM_DEVICE ? &c->dev_buf : &c->host_buf;
  if (!*first) *first = what;
  c->a.mem |= cls;
  return ncclSuccess;
}

/* Checks what every call has and fills c->a with it (the rest zero). */
static ncclResult_t check_common(struct call* c, ncclComm_t comm, size_t count, ncclDataType_t dt, void* stream,
                                 const char* fn) {
  NCCLCHECK(comm_check(comm, fn));
  if (comm->finalized) return err_set(ncclInvalidUsage, "%s: the communicator was finalized", fn);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "%s: the communicator was revoked (only destroy, abort, split or shrink remain)",
                   fn);
  ncclResult_t ae = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  if (ae == ncclInProgress)
    return err_set(ncclInvalidUsage,
                   "%s: the communicator is still initializing (poll ncclCommGetAsyncError until it is not "
                   "ncclInProgress)", fn);
  /* The error that broke it, with its message (a failed peer names its rank and host). */
  if (ae != ncclSuccess)
    return err_set(ae, "%s: the communicator is in error (%s): %s; destroy or abort it", fn, ncclGetErrorString(ae),
                   comm_error_msg(comm));
  if (!dtype_valid(dt)) return err_set(ncclInvalidArgument, "%s: invalid datatype %d", fn, (int)dt);
  size_t esz = dtype_size(dt), largest;
  /* The largest buffer any collective touches is count * nranks elements
   * (checked by overflow, not by two divisions on every call). */
  if (__builtin_mul_overflow(count, esz, &largest) ||
      __builtin_mul_overflow(largest, (size_t)comm->nranks, &largest))
    return err_set(ncclInvalidArgument, "%s: count %zu of %s overflows the address space", fn, count, dtype_name(dt));
  memset(c, 0, sizeof(*c));
  c->a.comm = comm;
  c->a.count = count;
  c->a.dt = dt;
  c->a.op.dt = dt;
  c->a.stream = stream;
  return ncclSuccess;
}

static ncclResult_t check_root(ncclComm_t comm, int root, const char* what, const char* fn) {
  if (root < 0 || root >= comm->nranks)
    return err_set(ncclInvalidArgument, "%s: %s %d outside [0, %d)", fn, what, root, comm->nranks);
  return ncclSuccess;
}

/* ------------------------------------------------------------ groups */

static __thread int group_depth; /* not initial-exec: see log_rank in debug.c */
static __thread struct task *group_head, *group_tail;
static __thread ncclResult_t group_error;
/* The message of the group's first failing call, quoted by ncclGroupEnd:
 * the last-error record may hold a later, unrelated error by then. */
static __thread char group_cause[1024];

static ncclResult_t arg_error(ncclResult_t res);

/* Communicators whose blocking init was called inside the group (init.c). */
static __thread struct ncclComm** group_inits;
static __thread int group_ninits, group_cap_inits;

int group_active(void) { return group_depth > 0; }

ncclResult_t group_defer_init(struct ncclComm* comm) {
  if (group_ninits == group_cap_inits) {
    int cap = group_cap_inits ? 2 * group_cap_inits : 8;
    struct ncclComm** n = realloc(group_inits, sizeof(*n) * (size_t)cap);
    if (!n) return arg_error(err_set(ncclSystemError, "ncclCommInitRank in a group: out of memory"));
    group_inits = n;
    group_cap_inits = cap;
  }
  group_inits[group_ninits++] = comm;
  return ncclSuccess;
}

/* Waits for the inits deferred to the end of the group (they run side by
 * side, one worker each) and makes their communicators blocking again. */
static ncclResult_t group_finish_inits(void) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < group_ninits; i++) {
    struct ncclComm* comm = group_inits[i];
    async_drain(comm);
    ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    if (e == ncclSuccess) e = async_make_blocking(comm);
    if (e != ncclSuccess && res == ncclSuccess)
      res = err_set(e, "ncclGroupEnd: the init of rank %d (of %d) in this group failed: %s", comm->rank,
                    comm->nranks, comm_error_msg(comm));
  }
  free(group_inits);
  group_inits = NULL;
  group_ninits = group_cap_inits = 0;
  return res;
}

struct comm_job {
  struct task* tasks;
  ncclResult_t res;
  char err[1024];
  pthread_t thread;
};

static void* comm_job_main(void* p) {
  struct comm_job* j = p;
  j->res = exec_run_tasks(j->tasks);
  if (j->res != ncclSuccess) snprintf(j->err, sizeof(j->err), "%s", err_last_thread());
  return NULL;
}

/* Splits a task list by communicator (keeping each one's order) and runs it. */
static ncclResult_t run_tasks(struct task* list) {
  /* The usual group (every call on one blocking communicator) runs as it
   * is: no split, nothing allocated. */
  struct task* t0 = list;
  while (t0 && t0->a.comm == list->a.comm) t0 = t0->next;
  if (!t0 && !list->a.comm->nonblocking) {
    ncclResult_t r = exec_run_tasks(list);
    exec_free_tasks(list);
    return r;
  }
  int njobs = 0;
  struct comm_job* jobs = NULL;
  struct task** tails = NULL;
  ncclResult_t res = ncclSuccess;
  int any_async = 0;
  for (struct task* t = list; t;) {
    struct task* next = t->next;
    t->next = NULL;
    int j = 0;
    while (j < njobs && jobs[j].tasks->a.comm != t->a.comm) j++;
    if (j == njobs) {
      struct comm_job* nj = realloc(jobs, sizeof(*jobs) * (size_t)(njobs + 1));
      struct task** nt = realloc(tails, sizeof(*tails) * (size_t)(njobs + 1));
      if (nj) jobs = nj;
      if (nt) tails = nt;
      if (!nj || !nt) {
        res = err_set(ncclSystemError, "out of memory in ncclGroupEnd");
        exec_free_tasks(t);
        exec_free_tasks(next);
        goto out;
      }
      memset(&jobs[njobs], 0, sizeof(jobs[njobs]));
      jobs[njobs].tasks = t;
      tails[njobs++] = t;
    } else {
      tails[j]->next = t;
      tails[j] = t;
    }
    t = next;
  }
  /* Nonblocking communicators: their worker runs their part; this call returns ncclInProgress. */
  int k = 0;
  for (int j = 0; j < njobs; j++) {
    if (jobs[j].tasks->a.comm->nonblocking) {
      async_push(jobs[j].tasks->a.comm, jobs[j].tasks);
      any_async = 1;
    } else {
      jobs[k++] = jobs[j];
    }
  }
  njobs = k;
  if (njobs == 1) {
    res = exec_run_tasks(jobs[0].tasks);
  } else if (njobs > 1) {
    int started = 0;
    for (int j = 1; j < njobs; j++) {
      if (pthread_create(&jobs[j].thread, NULL, comm_job_main, &jobs[j]) != 0) {
        res = err_set(ncclSystemError, "ncclGroupEnd: cannot start a thread for communicator %d", j);
        break;
      }
      started = j;
    }
    if (res == ncclSuccess) res = exec_run_tasks(jobs[0].tasks);
    for (int j = 1; j <= started; j++) {
      pthread_join(jobs[j].thread, NULL);
      if (res == ncclSuccess && jobs[j].res != ncclSuccess) res = err_set(jobs[j].res, "%s", jobs[j].err);
    }
  }
out:
  for (int j = 0; j < njobs; j++) exec_free_tasks(jobs[j].tasks);
  free(jobs);
  free(tails);
  return res == ncclSuccess && any_async ? ncclInProgress : res;
}

static ncclResult_t submit(struct call* c) {
  struct coll_args* a0 = &c->a;
  if (dev_mem_mixed(a0->mem))
    return arg_error(err_set(ncclInvalidArgument,
                             "%s: %s is device memory but %s is host memory; the buffers of one call must all be "
                             "device memory or all host memory",
                             coll_name(a0->kind), c->dev_buf, c->host_buf));
  /* A collective of count 0 moves nothing: after the argument checks it
   * returns at once, as in NCCL (no call board entry, no synchronisation,
   * nothing queued in a group). Sends and receives of 0 bytes still pair up:
   * the receiver checks that the sizes agree. */
  if (a0->count == 0 && a0->kind != COLL_SEND && a0->kind != COLL_RECV) return ncclSuccess;
  if (group_depth == 0 && !a0->comm->nonblocking) {
    /* The common case runs straight away, without allocating or copying. */
    return exec_run_one(a0);
  }
  struct task* t = malloc(sizeof(*t));
  if (!t) return err_set(ncclSystemError, "%s: out of memory", coll_name(a0->kind));
  t->next = NULL;
  t->a = *a0;
  if (group_depth == 0) {
    async_push(t->a.comm, t);
    return ncclInProgress;
  }
  if (group_tail) group_tail->next = t;
  else group_head = t;
  group_tail = t;
  return ncclSuccess;
}

/* An argument error inside a group also fails the group's ncclGroupEnd. */
static ncclResult_t arg_error(ncclResult_t res) {
  if (group_depth > 0 && group_error == ncclSuccess) {
    group_error = res;
    snprintf(group_cause, sizeof(group_cause), "%s", err_last_thread());
  }
  return res;
}
#define ARGCHECK(call)                    \
  do {                                    \
    ncclResult_t r_ = (call);             \
    if (r_ != ncclSuccess) return arg_error(r_); \
  } while (0)

NCCL_API(ncclResult_t, ncclGroupStart, void);
ncclResult_t ncclGroupStart(void) {
  if (group_depth == 0) group_error = ncclSuccess;
  group_depth++;
  return ncclSuccess;
}

static struct task* group_take(void) {
  struct task* t = group_head;
  group_head = group_tail = NULL;
  return t;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void);
ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return err_set(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart on this thread");
  if (--group_depth > 0) return ncclSuccess;
  struct task* list = group_take();
  ncclResult_t inits = group_finish_inits();
  if (group_error != ncclSuccess) {
    exec_free_tasks(list);
    ncclResult_t e = group_error;
    group_error = ncclSuccess;
    return err_set(e, "ncclGroupEnd: the group was not run because a call in it failed: %s", group_cause);
  }
  if (inits != ncclSuccess) {
    exec_free_tasks(list);
    return inits;
  }
  return list ? run_tasks(list) : ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (group_depth == 0)
    return err_set(ncclInvalidUsage, "ncclGroupSimulateEnd: no matching ncclGroupStart on this thread");
  if (simInfo && (simInfo->magic != 0x74685283u || simInfo->size < sizeof(ncclSimInfo_t)))
    return err_set(ncclInvalidArgument, "ncclGroupSimulateEnd: simInfo not made with NCCL_SIM_INFO_INITIALIZER");
  if (--group_depth > 0) return ncclSuccess;
  struct task* list = group_take();
  ncclResult_t inits = group_finish_inits();
  if (inits != ncclSuccess) {
    exec_free_tasks(list);
    group_error = ncclSuccess;
    return inits;
  }
  double us = 0;
  for (struct task* t = list; t; t = t->next) us += coll_estimate_us(&t->a);
  exec_free_tasks(list);
  ncclResult_t e = group_error;
  group_error = ncclSuccess;
  /* As ncclGroupEnd: a group with a failed call has no meaningful estimate. */
  if (e != ncclSuccess)
    return err_set(e, "ncclGroupSimulateEnd: the group has a call that failed: %s", group_cause);
  if (simInfo) simInfo->estimatedTime = (float)us;
  return ncclSuccess;
}

/* ------------------------------------------------------------ API entry points */

NCCL_API(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  size_t bytes = count * dtype_size(datatype);
  ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff", fn));
  ARGCHECK(resolve_op(comm, op, datatype, &c.a, fn));
  c.a.kind = COLL_ALLREDUCE;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduce";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, root, "root", fn));
  size_t bytes = count * dtype_size(datatype);
  ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff", fn));
  if (comm->rank == root) ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff (at the root)", fn));
  ARGCHECK(resolve_op(comm, op, datatype, &c.a, fn));
  c.a.kind = COLL_REDUCE;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  c.a.root = root;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, root, "root", fn));
  size_t bytes = count * dtype_size(datatype);
  if (comm->rank == root) ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff (at the root)", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff", fn));
  c.a.kind = COLL_BROADCAST;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  c.a.root = root;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  struct call c;
  ARGCHECK(check_common(&c, comm, sendcount, datatype, stream, fn));
  size_t bytes = sendcount * dtype_size(datatype);
  ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes * (size_t)comm->nranks, "recvbuff", fn));
  c.a.kind = COLL_ALLGATHER;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  struct call c;
  ARGCHECK(check_common(&c, comm, recvcount, datatype, stream, fn));
  size_t bytes = recvcount * dtype_size(datatype);
  ARGCHECK(check_buf(&c, sendbuff, bytes * (size_t)comm->nranks, "sendbuff", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff", fn));
  ARGCHECK(resolve_op(comm, op, datatype, &c.a, fn));
  c.a.kind = COLL_REDUCESCATTER;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream) {
  const char* fn = "ncclAlltoAll";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  size_t bytes = count * dtype_size(datatype) * (size_t)comm->nranks;
  ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff", fn));
  c.a.kind = COLL_ALLTOALL;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclGather";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, root, "root", fn));
  size_t bytes = count * dtype_size(datatype);
  ARGCHECK(check_buf(&c, sendbuff, bytes, "sendbuff", fn));
  if (comm->rank == root) ARGCHECK(check_buf(&c, recvbuff, bytes * (size_t)comm->nranks, "recvbuff (at the root)", fn));
  c.a.kind = COLL_GATHER;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  c.a.root = root;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclScatter";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, root, "root", fn));
  size_t bytes = count * dtype_size(datatype);
  if (comm->rank == root) ARGCHECK(check_buf(&c, sendbuff, bytes * (size_t)comm->nranks, "sendbuff (at the root)", fn));
  ARGCHECK(check_buf(&c, recvbuff, bytes, "recvbuff", fn));
  c.a.kind = COLL_SCATTER;
  c.a.sendbuff = sendbuff;
  c.a.recvbuff = recvbuff;
  c.a.root = root;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const char* fn = "ncclSend";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, peer, "peer", fn));
  ARGCHECK(check_buf(&c, sendbuff, count * dtype_size(datatype), "sendbuff", fn));
  c.a.kind = COLL_SEND;
  c.a.sendbuff = sendbuff;
  c.a.peer = peer;
  return submit(&c);
}

NCCL_API(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  const char* fn = "ncclRecv";
  struct call c;
  ARGCHECK(check_common(&c, comm, count, datatype, stream, fn));
  ARGCHECK(check_root(comm, peer, "peer", fn));
  ARGCHECK(check_buf(&c, recvbuff, count * dtype_size(datatype), "recvbuff", fn));
  c.a.kind = COLL_RECV;
  c.a.recvbuff = recvbuff;
  c.a.peer = peer;
  return submit(&c);
}
