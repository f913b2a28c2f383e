/* The executor: runs a communicator's list of calls in order. For each
 * collective it publishes the call on the call board, asks the tuner for a
 * plan (graph/tuning.c: a row of the algorithm table, channels, chunk), logs
 * the call the way NCCL does (NCCL_DEBUG_SUBSYS=COLL) and runs the plan's
 * row; consecutive sends/receives run as one point-to-point batch (coll/p2p.c).
 * Device buffers go to the device executor (device/dev_exec.c) instead. Called
 * by the API front (enqueue.c) and the nonblocking worker (async.c). */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device/dev_plan.h"
#include "device/device.h"
#include "exec.h"
#include "failures.h"

/* NCCL's names in its COLL log lines. */
static const char* log_name(int kind) {
  static const char* names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                "AlltoAll",  "Gather",    "Scatter", "Send",     "Recv"};
  return kind >= 0 && kind <= COLL_RECV ? names[kind] : "?";
}

/* One line per call, as NCCL users know it, plus what collie chose. */
static void log_call(const struct coll_args* a, uint64_t opcount, const struct plan* p) {
  if (!log_enabled(LOG_INFO, LOG_COLL)) return;
  if (a->op_id) {
    /* A device call, logged when it was submitted; the proxy now runs it staged on the host. */
    if (p)
      INFO(LOG_COLL, "%s: opCount %llx staged through host memory: algorithm %s protocol %s channels %d chunk %zu",
           log_name(a->kind), (unsigned long long)(a->op_id - 1), algo_name(p->algo->name),
           proto_names[p->algo->proto], p->nch, p->chunk);
    return;
  }
  const struct ncclComm* comm = a->comm;
  int root = a->kind == COLL_SEND || a->kind == COLL_RECV ? a->peer : a->root;
  if (p)
    INFO(LOG_COLL,
         "%s: opCount %llx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d] stream %p "
         "algorithm %s protocol %s channels %d chunk %zu",
         log_name(a->kind), (unsigned long long)opcount, a->sendbuff, a->recvbuff, a->count, (int)a->dt, a->redop,
         root, (const void*)comm, comm->nranks, a->stream, algo_name(p->algo->name), proto_names[p->algo->proto],
         p->nch, p->chunk);
  else
    INFO(LOG_COLL, "%s: opCount %llx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm %p [nranks=%d] "
         "stream %p", log_name(a->kind), (unsigned long long)opcount, a->sendbuff, a->recvbuff, a->count, (int)a->dt,
         a->redop, root, (const void*)comm, comm->nranks, a->stream);
}

static ncclResult_t exec_coll(struct coll_args* a) {
  if (a->scalar_ptr) {
    /* ncclScalarDevice: the value at the time the call runs. */
    uint64_t v = 0;
    const void* s = a->scalar_ptr;
    if (device_mem_class(s) == MEM_DEVICE) {
      if (device_read(&v, s, dtype_size(a->dt)) != 0) return ncclUnhandledCudaError;
      s = &v;
    }
    red_op_init_premulsum(&a->op, s, a->dt);
  }
  a->comm->op_bytes = a->count * dtype_size(a->dt);
  NCCLCHECK(board_publish(a->comm, coll_token(a, a->comm->op_bytes), a->root));
  struct plan p;
  NCCLCHECK(tuning_plan(a, &p));
  /* An alltoall whose buffers overlap (in place: NCCL takes sendbuff ==
   * recvbuff, and nccl-tests checks it): block j must leave before block j
   * from rank j lands on it, which no pipelined exchange promises, so the
   * input is copied aside first. */
  const void* user = a->sendbuff;
  void* aside = NULL;
  if (a->kind == COLL_ALLTOALL && coll_in_place(a)) {
    size_t all = a->count * dtype_size(a->dt) * (size_t)a->comm->nranks;
    aside = malloc(all);
    if (!aside) return err_set(ncclSystemError, "ncclAlltoAll: out of memory for an in-place copy of %zu bytes", all);
    memcpy(aside, a->sendbuff, all);
  }
  struct adapt_ticket ticket;
  ncclResult_t res = adapt_plan(a, &p, &ticket);
  if (res == ncclSuccess) {
    a->chunk = p.chunk;
    /* In place, the result overwrites lines this rank has just read: they
     * are in cache, and ordinary stores there cost no extra read (2 ranks,
     * 32 MiB: non-temporal stores made it 1.3x slower). */
    a->out_far = coll_in_place(a) ? 0 : p.out_far;
    a->comm->read_ahead = p.read_ahead;
    log_call(a, a->op_id ? 0 : a->comm->opcount++, &p);
    if (aside) a->sendbuff = aside;
    res = p.algo->run(a, &p);
    a->sendbuff = user;
    /* A socket sender may still hold blocks of the copy that have not gone
     * to the kernel (send_commit_ext sends from it): they leave before it is
     * freed, not at the end of the call (call_done); sent from freed memory
     * they were garbage or EFAULT (a rank of coll.socket_4 "lost its
     * connection: Bad address" once the kernel's socket buffers were no
     * longer 4 MiB). A run that failed has poisoned the connectors
     * (prim_fail, p2p_run): nothing is sent from the copy after. */
    if (aside && res == ncclSuccess) res = transport_flush(a->comm);
    adapt_done(&ticket, res);
  }
  free(aside);
  return res;
}


/* Device buffers in a communicator's task list: the device executor takes the
 * whole list (a group launches once; with host buffers in it too, the call
 * waits for it). Host-only lists first wait for device work already queued,
 * so every rank drives its connectors in call order. */
static ncclResult_t dev_route(struct task* t, int* routed) {
  int n = 0, dev = 0, host = 0;
  for (struct task* u = t; u; u = u->next, n++) {
    if (u->a.mem & MEM_DEVICE) dev = 1;
    else host = 1;
  }
  *routed = dev;
  if (!dev) return dev_quiesce(t->a.comm);
  struct coll_args* arr = malloc(sizeof(*arr) * (size_t)n);
  if (!arr) return err_set(ncclSystemError, "%s: out of memory", coll_name(t->a.kind));
  struct ncclComm* comm = t->a.comm;
  for (int i = 0; i < n; i++, t = t->next) {
    arr[i] = t->a;
    /* Logged now, in call order, whether a kernel or the proxy runs it. */
    if (log_enabled(LOG_INFO, LOG_COLL)) {
      uint64_t id = comm->opcount++;
      log_call(&arr[i], id, NULL);
      arr[i].op_id = id + 1;
    }
  }
  ncclResult_t res = dev_submit(arr[0].comm, arr, n, host);
  free(arr);
  return res;
}

ncclResult_t enqueue_run_host(struct coll_args* a, int n) {
  if (n <= 0) return ncclSuccess;
  struct task* ts = calloc((size_t)n, sizeof(*ts));
  if (!ts) return err_set(ncclSystemError, "%s: out of memory", coll_name(a[0].kind));
  for (int i = 0; i < n; i++) {
    ts[i].a = a[i];
    ts[i].a.mem = MEM_HOST | (a[i].mem & MEM_GDR); /* staged: host memory now, but for sends the NIC reads itself */
    ts[i].next = i + 1 < n ? &ts[i + 1] : NULL;
  }
  ncclResult_t res = exec_run_tasks(ts);
  free(ts);
  return res;
}

/* After each call: a failure breaks the communicator, except errors found
 * before any data moved (e.g. an unmatched send to self), which leave it
 * usable. */
static ncclResult_t call_done(struct ncclComm* comm, ncclResult_t res) {
  if (res == ncclSuccess) res = transport_flush(comm);
  if (res != ncclSuccess && (res != ncclInvalidUsage || comm->broken) && res != ncclInvalidArgument)
    comm_set_error(comm, res, err_last_thread());
  return res;
}

/* What running calls on comm holds: ncclCommAbort from another thread frees
 * nothing until scope_close (the busy count), and log lines name comm's rank. */
struct call_scope {
  struct ncclComm* comm;
  int fast, saved_rank;
};

static void scope_open(struct call_scope* s, struct ncclComm* comm) {
  s->comm = comm;
  s->fast = comm_busy_enter(comm);
  s->saved_rank = log_get_rank();
  if (s->saved_rank != comm->rank) log_set_rank(comm->rank);
}

/* The caller's last touch of comm. */
static void scope_close(const struct call_scope* s) {
  if (s->saved_rank != s->comm->rank) log_set_rank(s->saved_rank);
  comm_busy_leave(s->comm, s->fast); /* wakes (or is seen by) an abort or revoke waiting for it */
}

/* Runs one communicator's queued tasks in order; consecutive p2p tasks as one batch. */
ncclResult_t exec_run_tasks(struct task* t) {
  ncclResult_t res = ncclSuccess;
  if (!t) return ncclSuccess;
  int routed = 0;
  NCCLCHECK(dev_route(t, &routed));
  if (routed) return ncclSuccess;
  struct ncclComm* comm = t->a.comm;
  struct call_scope scope;
  scope_open(&scope, comm);
  while (t && res == ncclSuccess) {
    if (t->a.kind == COLL_SEND || t->a.kind == COLL_RECV) {
      int n = 0;
      for (struct task* u = t; u && (u->a.kind == COLL_SEND || u->a.kind == COLL_RECV); u = u->next) n++;
      /* A few sends and receives (the usual group) need no allocation. */
      struct p2p_op stack_ops[16];
      struct p2p_op* ops = n <= 16 ? stack_ops : calloc((size_t)n, sizeof(*ops));
      if (!ops) {
        res = err_set(ncclSystemError, "out of memory for a point-to-point group");
        break;
      }
      comm->op_bytes = 0;
      for (int i = 0; i < n; i++, t = t->next) {
        if (!t->a.op_id) log_call(&t->a, comm->opcount++, NULL);
        size_t bytes = t->a.count * dtype_size(t->a.dt);
        if (bytes > comm->op_bytes) comm->op_bytes = bytes;
        ops[i] = (struct p2p_op){.peer = t->a.peer, .is_send = t->a.kind == COLL_SEND,
                                 .buf = t->a.kind == COLL_SEND ? (char*)t->a.sendbuff : (char*)t->a.recvbuff,
                                 .bytes = bytes, .token = coll_token(&t->a, bytes),
                                 .devmem = t->a.kind == COLL_SEND && (t->a.mem & MEM_GDR)};
      }
      res = call_done(comm, p2p_run(comm, ops, n, 1));
      if (ops != stack_ops) free(ops);
    } else {
      res = call_done(comm, exec_coll(&t->a));
      t = t->next;
    }
  }
  scope_close(&scope);
  return res;
}

/* One collective outside a group, in host memory: what exec_run_tasks does
 * for a list of one, without building the list (a 2-rank 8 B broadcast spent
 * ~5% of its time copying the arguments into a task, the copy's wide loads
 * waiting for the checks' narrow stores). */
ncclResult_t exec_run_one(struct coll_args* a) {
  if ((a->mem & MEM_DEVICE) || a->kind == COLL_SEND || a->kind == COLL_RECV) {
    struct task t = {NULL, *a};
    return exec_run_tasks(&t);
  }
  NCCLCHECK(dev_quiesce(a->comm));
  struct call_scope scope;
  scope_open(&scope, a->comm);
  ncclResult_t res = call_done(a->comm, exec_coll(a));
  scope_close(&scope);
  return res;
}

ncclResult_t enqueue_run_list(struct task* list) {
  ncclResult_t res = exec_run_tasks(list);
  exec_free_tasks(list);
  return res;
}

void enqueue_free_list(struct task* list) { exec_free_tasks(list); }


void exec_free_tasks(struct task* t) {
  while (t) {
    struct task* n = t->next;
    free(t);
    t = n;
  }
}
