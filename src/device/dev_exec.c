/* The device executor: collectives on device buffers, enqueued on the user's
 * CUDA stream. At one rank the work is a kernel on that stream. Otherwise a
 * per-communicator proxy thread runs it staged: an event recorded on the
 * user stream gates the proxy's own stream; the proxy copies the device
 * inputs into host staging, runs the host collective (every algorithm and
 * transport of src/coll), copies the results back and advances a
 * host-mapped counter; a one-thread kernel on the user stream waits for that
 * counter, so later work on the stream sees the results.
 *
 * The proxy never calls a CUDA function that may synchronize the device
 * (allocation, free): a gate kernel holds the user stream until the proxy
 * finishes, so such a call could wait on itself. Staging is a pinned buffer
 * allocated once by the user's thread, or pageable memory the proxy grows
 * with realloc for calls that do not fit. */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../comm.h"
#include "../comm_err.h"
#include "coll/coll.h"
#include "device.h"
#include "device/dev_conn.h"
#include "device/dev_plan.h"
#include "device/kernels.h"
#include "param.h"
#include "transport/transport.h"

#define DEV_PINNED_BYTES ((size_t)8 << 20)

struct dev_job {
  struct dev_job* next;
  int n;
  struct coll_args* a;
  int nstreams;
  cudaStream_t* streams;
  cudaEvent_t* ready; /* one per stream, recorded when the call was enqueued */
  uint32_t seq;
  int host_wait, done;
  ncclResult_t res;
  char err[512];
};

struct dev_state {
  struct ncclComm* comm;
  int dev;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct dev_job *head, *tail;
  int stop, started;
  pthread_t thread;
  uint32_t posted, completed;
  volatile uint32_t* flag; /* host-mapped; slot of the process-wide pool */
  uint32_t* flag_dev;
  cudaStream_t s;
  char* pinned;
  char* heap;
  size_t heap_bytes;
  /* GPU kernels over device connectors (ranks of one host): */
  int kpath, p2p_disable, nch_ready;
  int unroll; /* ds_work.unroll (COLLIE_DEV_UNROLL) */
  struct dconn_tab* conns;
  volatile uint32_t* kwords; /* host-mapped: [0] abort, [1] status (dev_sched.h DS_*) */
  uint32_t* kwords_dev;
  cudaEvent_t last;          /* the comm's last kernel: the next one waits for it */
  int have_last;
};

static ncclResult_t cuda_err(cudaError_t e, const char* what) {
  cudaGetLastError();
  return err_set(ncclUnhandledCudaError, "device path: %s failed: %s", what, cudaGetErrorString(e));
}

/* ---- gate counters: slots of pinned, mapped pages that are never freed, so
 * a gate kernel still queued behind user work after its communicator is gone
 * reads valid memory. A slot's value only grows, also across reuse, so such
 * a late gate still finds its sequence number reached. */
#define FLAG_SLOTS 256
static pthread_mutex_t flag_mu = PTHREAD_MUTEX_INITIALIZER;
static struct flag_page {
  struct flag_page* next;
  volatile uint32_t* host;
  uint32_t* dev;
  unsigned char used[FLAG_SLOTS / 16]; /* slots are 64 bytes apart */
} * flag_pages;

static ncclResult_t flag_get(volatile uint32_t** host, uint32_t** dev) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&flag_mu);
  for (struct flag_page* p = flag_pages; p; p = p->next)
    for (int i = 0; i < FLAG_SLOTS / 16; i++)
      if (!p->used[i]) {
        p->used[i] = 1;
        *host = p->host + 16 * i;
        *dev = p->dev + 16 * i;
        goto out;
      }
  struct flag_page* p = calloc(1, sizeof(*p));
  void* h = NULL;
  void* d = NULL;
  cudaError_t e = cudaErrorMemoryAllocation;
  if (!p || (e = cudaHostAlloc(&h, FLAG_SLOTS * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess) {
    free(p);
    res = cuda_err(e, "cudaHostAlloc (stream gate counters)");
    goto out;
  }
  if ((e = cudaHostGetDevicePointer(&d, h, 0)) != cudaSuccess) {
    cudaFreeHost(h);
    free(p);
    res = cuda_err(e, "cudaHostGetDevicePointer");
    goto out;
  }
  memset(h, 0, FLAG_SLOTS * sizeof(uint32_t));
  p->host = h;
  p->dev = d;
  p->used[0] = 1;
  p->next = flag_pages;
  flag_pages = p;
  *host = p->host;
  *dev = p->dev;
out:
  pthread_mutex_unlock(&flag_mu);
  return res;
}

static void flag_put(volatile uint32_t* host) {
  pthread_mutex_lock(&flag_mu);
  for (struct flag_page* p = flag_pages; p; p = p->next)
    if (host >= p->host && host < p->host + FLAG_SLOTS) p->used[(host - p->host) / 16] = 0;
  pthread_mutex_unlock(&flag_mu);
}

/* ---- the proxy ---- */

static void job_free(struct dev_job* j) {
  if (!j) return;
  for (int i = 0; i < j->nstreams && j->ready; i++)
    if (j->ready[i]) cudaEventDestroy(j->ready[i]);
  free(j->ready);
  free(j->streams);
  free(j->a);
  free(j);
}

/* Polls a stream (never blocks in the driver: the abort flag and the
 * communicator's failure record stay checked and no core is burnt: yield,
 * then sleep). A copy still pending after DEV_STALL_S says so once, naming
 * it: on a GPU a stall here is otherwise silent. */
#define DEV_STALL_S 10
static ncclResult_t stream_wait(struct dev_state* d, cudaStream_t s, const char* what) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int said = 0;
  for (int it = 0;; it++) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return ncclSuccess;
    if (e != cudaErrorNotReady) return cuda_err(e, what);
    if (__atomic_load_n(&d->comm->abort_flag, __ATOMIC_ACQUIRE))
      return err_set(ncclInvalidUsage, "device path: the communicator was aborted");
    ncclResult_t failed = __atomic_load_n(&d->comm->async_error, __ATOMIC_ACQUIRE);
    if (failed != ncclSuccess && failed != ncclInProgress)
      return err_set(failed, "device path: the communicator failed while %s was pending", what);
    if (it < 64) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
    if (!said && (it & 1023) == 0) {
      struct timespec t1;
      clock_gettime(CLOCK_MONOTONIC, &t1);
      if (t1.tv_sec - t0.tv_sec >= DEV_STALL_S) {
        said = 1;
        WARN("device path: rank %d: %s has not completed after %d s (it waits for the work queued before "
             "the call on the user's stream, and for the GPU); still waiting",
             d->comm->rank, what, DEV_STALL_S);
      }
    }
  }
}

/* GPUDirect RDMA: a send of device memory to a rank whose transport's NIC
 * can read it from the device (NCCL_NET_GDR_READ, transport_dev_send_ok) is
 * not staged. Receives and collectives always are: the host algorithms
 * read, reduce and copy their buffers with the CPU. Written and compiled
 * here; never run on a GPU with an HCA (docs/IB.md). */
static int gdr_send(struct ncclComm* comm, const struct coll_args* a, size_t bytes) {
  if (a->kind != COLL_SEND || !(a->mem & MEM_DEVICE) || comm->gdr_state < 0) return 0;
  if (!param_int(P_NCCL_NET_GDR_READ, 0, 1)) return 0;
  char why[256];
  if (transport_dev_send_ok(comm, a->peer, a->sendbuff, bytes, why, sizeof(why))) return 1;
  INFO(LOG_NET, "device path: send of %zu bytes to rank %d staged: %s", bytes, a->peer, why);
  return 0;
}

static ncclResult_t job_run(struct dev_state* d, struct dev_job* j) {
  struct ncclComm* comm = d->comm;
  ncclResult_t res = ncclSuccess;
  if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "device path: the communicator was aborted");
  if (comm->async_error != ncclSuccess)
    return err_set(comm->async_error, "device path: the communicator is in error; call not run");
  for (int i = 0; i < j->nstreams; i++) {
    cudaError_t e = cudaStreamWaitEvent(d->s, j->ready[i], 0);
    if (e != cudaSuccess) return cuda_err(e, "cudaStreamWaitEvent");
  }
  /* Plan the staging of every call of the job (a group runs as one). */
  struct dev_stage* st = calloc((size_t)j->n, sizeof(*st));
  size_t* scalar_off = calloc((size_t)j->n, sizeof(*scalar_off));
  if (!st || !scalar_off) {
    res = err_set(ncclSystemError, "device path: out of memory");
    goto out;
  }
  size_t total = 0;
  for (int i = 0; i < j->n; i++) {
    struct coll_args* a = &j->a[i];
    struct dev_roles r = {0, 0};
    if (a->mem & MEM_DEVICE) dev_roles(a->kind, comm->rank, comm->nranks, a->root, a->count, dtype_size(a->dt), &r);
    if (r.send_bytes && gdr_send(comm, a, r.send_bytes)) {
      a->mem |= MEM_GDR; /* the NIC reads the device buffer: nothing to stage */
      r.send_bytes = 0;
    }
    dev_stage_plan(&st[i], a->sendbuff, r.send_bytes, a->recvbuff, r.recv_bytes, &total);
    scalar_off[i] = (size_t)-1;
    if (a->scalar_ptr && device_mem_class(a->scalar_ptr) == MEM_DEVICE) {
      total = (total + 63) & ~(size_t)63;
      scalar_off[i] = total;
      total += 8;
    }
  }
  char* base = d->pinned;
  if (total > DEV_PINNED_BYTES) {
    if (total > d->heap_bytes) {
      char* h = realloc(d->heap, total);
      if (!h) {
        res = err_set(ncclSystemError, "device path: cannot allocate %zu bytes of staging", total);
        goto out;
      }
      d->heap = h;
      d->heap_bytes = total;
    }
    base = d->heap;
  }
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < j->n && e == cudaSuccess; i++) {
    struct dev_stage* s = &st[i];
    if (s->send_hi > s->send_lo)
      e = cudaMemcpyAsync(base + s->send_off, (const void*)s->send_lo, s->send_hi - s->send_lo, cudaMemcpyDeviceToHost,
                          d->s);
    if (e == cudaSuccess && scalar_off[i] != (size_t)-1)
      e = cudaMemcpyAsync(base + scalar_off[i], j->a[i].scalar_ptr, dtype_size(j->a[i].dt), cudaMemcpyDeviceToHost,
                          d->s);
  }
  if (e != cudaSuccess) {
    res = cuda_err(e, "cudaMemcpyAsync (device to staging)");
    goto out;
  }
  NCCLCHECKGOTO(stream_wait(d, d->s, "the copy of the inputs to host staging"), res, out);
  for (int i = 0; i < j->n; i++) {
    struct coll_args* a = &j->a[i];
    if (scalar_off[i] != (size_t)-1) {
      red_op_init_premulsum(&a->op, base + scalar_off[i], a->dt);
      a->scalar_ptr = NULL;
    }
    if (!(a->mem & MEM_DEVICE)) continue;
    void* ms = dev_stage_map(&st[i], base, a->sendbuff);
    void* mr = dev_stage_map(&st[i], base, a->recvbuff);
    /* A buffer this rank does not use is never touched: keep its value. */
    if (ms) a->sendbuff = ms;
    if (mr) a->recvbuff = mr;
  }
  NCCLCHECKGOTO(enqueue_run_host(j->a, j->n), res, out);
  for (int i = 0; i < j->n && e == cudaSuccess; i++) {
    struct dev_stage* s = &st[i];
    if (s->recv_hi > s->recv_lo)
      e = cudaMemcpyAsync((void*)s->recv_lo, base + s->recv_off, s->recv_hi - s->recv_lo, cudaMemcpyHostToDevice, d->s);
  }
  if (e != cudaSuccess) {
    res = cuda_err(e, "cudaMemcpyAsync (staging to device)");
    goto out;
  }
  res = stream_wait(d, d->s, "the copy of the results from host staging");
out:
  free(st);
  free(scalar_off);
  return res;
}

/* Set on proxy threads: the host collectives they run must not wait for the queue they are draining. */
static __thread int dev_in_proxy;

static void* proxy_main(void* arg) {
  struct dev_state* d = arg;
  dev_in_proxy = 1;
  cudaSetDevice(d->dev);
  log_set_rank(d->comm->rank);
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->head && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
    struct dev_job* j = d->head;
    if (!j) break;
    d->head = j->next;
    if (!d->head) d->tail = NULL;
    pthread_mutex_unlock(&d->mu);
    j->res = job_run(d, j);
    if (j->res != ncclSuccess) {
      snprintf(j->err, sizeof(j->err), "%s", err_last_thread());
      ncclResult_t none = ncclSuccess;
      __atomic_compare_exchange_n(&d->comm->async_error, &none, j->res, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
      WARN("device path: rank %d: %s", d->comm->rank, j->err);
    }
    /* Release the user streams whatever happened: a failed call must not hang the GPU. */
    __atomic_store_n(d->flag, j->seq, __ATOMIC_RELEASE);
    pthread_mutex_lock(&d->mu);
    d->completed = j->seq;
    if (j->host_wait) j->done = 1;
    else job_free(j);
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

/* ---- setup ---- */

static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER;

/* Ranks in separate processes on one GPU: without MPS their contexts take
 * turns by time slice, and every hand-off between their kernels waits for
 * one (measured on an H200: about 9 ms per 2-rank allreduce of any size,
 * 43-71 us under MPS). Said once per process, as a WARN, with the remedy. */
static void shared_gpu_advice(struct ncclComm* comm) {
  static int said;
  const char* mine = comm->peers[comm->rank].pci_bus_id;
  int others = 0;
  for (int i = 0; i < comm->nranks; i++)
    if (i != comm->rank && comm->peers[i].pid != comm->peers[comm->rank].pid &&
        comm->machine[i] == comm->machine[comm->rank] && mine[0] && strcmp(comm->peers[i].pci_bus_id, mine) == 0)
      others++;
  if (!others || __atomic_exchange_n(&said, 1, __ATOMIC_ACQ_REL)) return;
  const char* pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
  char ctl[512];
  snprintf(ctl, sizeof(ctl), "%s/control", pipe && pipe[0] ? pipe : "/tmp/nvidia-mps");
  if (access(ctl, F_OK) == 0) {
    INFO(LOG_INIT, "rank %d shares GPU %s with %d rank(s) in other processes; an MPS control pipe is there (%s)",
         comm->rank, mine, others, ctl);
    return;
  }
  WARN("rank %d shares GPU %s with %d rank(s) in other processes and no MPS server was found (%s): their kernels "
       "take turns by time slice, so each device collective waits milliseconds; start MPS (nvidia-cuda-mps-control -d) "
       "or drive the ranks from threads of one process",
       comm->rank, mine, others, ctl);
}

static ncclResult_t state_get(struct ncclComm* comm, struct dev_state** out) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&state_mu);
  struct dev_state* d = comm->dev;
  if (d) goto done;
  if (comm->cuda_dev < 0) {
    res = err_set(ncclInvalidUsage, "device path: communicator was created without a CUDA device");
    goto done;
  }
  d = calloc(1, sizeof(*d));
  if (!d) {
    res = err_set(ncclSystemError, "device path: out of memory");
    goto done;
  }
  d->comm = comm;
  d->dev = comm->cuda_dev;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  int saved = -1;
  cudaGetDevice(&saved);
  cudaError_t e = cudaSetDevice(d->dev);
  if (e != cudaSuccess) {
    res = cuda_err(e, "cudaSetDevice");
    goto fail;
  }
  NCCLCHECKGOTO(flag_get(&d->flag, &d->flag_dev), res, fail);
  d->posted = d->completed = __atomic_load_n(d->flag, __ATOMIC_ACQUIRE);
  if ((e = cudaStreamCreateWithFlags(&d->s, cudaStreamNonBlocking)) != cudaSuccess) {
    res = cuda_err(e, "cudaStreamCreateWithFlags");
    goto fail;
  }
  void* p = NULL;
  if ((e = cudaHostAlloc(&p, DEV_PINNED_BYTES, cudaHostAllocPortable)) != cudaSuccess) {
    res = cuda_err(e, "cudaHostAlloc (staging)");
    goto fail;
  }
  d->pinned = p;
  d->kpath = comm->nhosts == 1 && comm->nranks > 1 && param_int(P_COLLIE_DEVICE_KERNELS, 0, 1) == 1;
  d->unroll = param_int(P_COLLIE_DEV_UNROLL, 1, DS_UNROLL) > 1 ? DS_UNROLL : 1;
  d->p2p_disable = (int)param_int(P_NCCL_P2P_DISABLE, 0, 1);
  if (d->kpath) {
    void* kw = NULL;
    if ((e = cudaHostAlloc(&kw, 64, cudaHostAllocMapped | cudaHostAllocPortable)) != cudaSuccess) {
      res = cuda_err(e, "cudaHostAlloc (kernel abort word)");
      goto fail;
    }
    memset(kw, 0, 64);
    d->kwords = kw;
    if ((e = cudaHostGetDevicePointer((void**)&d->kwords_dev, kw, 0)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&d->last, cudaEventDisableTiming)) != cudaSuccess) {
      res = cuda_err(e, "kernel path setup");
      goto fail;
    }
  }
  int rc = pthread_create(&d->thread, NULL, proxy_main, d);
  if (rc != 0) {
    res = err_set(ncclSystemError, "device path: cannot start the proxy thread: %s", strerror(rc));
    goto fail;
  }
  d->started = 1;
  if (saved >= 0) cudaSetDevice(saved);
  INFO(LOG_INIT | LOG_PROXY, "comm %p rank %d: device path on CUDA device %d (%s)", (void*)comm, comm->rank, d->dev,
       d->kpath ? (d->p2p_disable ? "GPU kernels over registered shm; send/recv staged"
                                  : "GPU kernels over CUDA IPC p2p; send/recv staged")
                : "staged through the proxy thread");
  if (d->kpath) shared_gpu_advice(comm);
  comm->dev = d;
  goto done;
fail:
  if (d->last) cudaEventDestroy(d->last);
  if (d->kwords) cudaFreeHost((void*)d->kwords);
  if (d->pinned) cudaFreeHost(d->pinned);
  if (d->s) cudaStreamDestroy(d->s);
  if (d->flag) flag_put(d->flag);
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free(d);
  d = NULL;
  if (saved >= 0) cudaSetDevice(saved);
done:
  pthread_mutex_unlock(&state_mu);
  *out = d;
  return res;
}

/* A premulsum scalar the call reads at run time (ncclScalarDevice): returns
 * the pointer for the kernel to read when it is device memory; otherwise reads
 * the host value now into *f / *u and returns NULL. */
static const void* scalar_resolve(const struct coll_args* a, double* f, uint64_t* u) {
  if (!a->scalar_ptr) return NULL;
  if (device_mem_class(a->scalar_ptr) == MEM_DEVICE) return a->scalar_ptr;
  struct red_op op;
  red_op_init_premulsum(&op, a->scalar_ptr, a->dt);
  *f = op.scalar.f;
  *u = op.scalar.u;
  return NULL;
}

/* ---- one rank: kernels straight on the stream (also inside graph capture) ---- */

static ncclResult_t local_run(const struct coll_args* a) {
  size_t esz = dtype_size(a->dt);
  size_t bytes = a->count * esz;
  if (bytes == 0) return ncclSuccess;
  const char* err = "";
  int rc = 0;
  int reduces = a->kind == COLL_ALLREDUCE || a->kind == COLL_REDUCE || a->kind == COLL_REDUCESCATTER;
  if (reduces && a->op.kind == RED_PREMULSUM) {
    struct kern_scalar ks = {a->op.scalar.f, a->op.scalar.u, NULL};
    ks.dev_ptr = scalar_resolve(a, &ks.f, &ks.u);
    rc = kern_pre((int)a->dt, ks, a->recvbuff, a->sendbuff, a->count, a->stream, &err);
  } else {
    rc = kern_copy(a->recvbuff, a->sendbuff, bytes, a->stream, &err);
  }
  if (rc != 0) return err_set(ncclUnhandledCudaError, "%s: kernel launch failed: %s", coll_name(a->kind), err);
  return ncclSuccess;
}

/* One rank, a pair of a send to itself and a receive from itself: one device
 * copy on the receive's stream. Another send stream is joined first (the
 * copy reads what was queued before the send) and waits for the copy after
 * (the send completes when its buffer has been read). */
struct self_group {
  const struct p2p_op* ops;
  const struct coll_args* a; /* a[i] made ops[i] */
};

static ncclResult_t self_copy(void* arg, const struct p2p_op* sop, const struct p2p_op* rop) {
  const struct self_group* g = arg;
  cudaStream_t ss = (cudaStream_t)g->a[sop - g->ops].stream, rs = (cudaStream_t)g->a[rop - g->ops].stream;
  cudaEvent_t sent = NULL, copied = NULL;
  cudaError_t e = cudaSuccess;
  if (ss != rs) {
    e = cudaEventCreateWithFlags(&sent, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(sent, ss);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(rs, sent, 0);
  }
  const char* err = "";
  int rc = e == cudaSuccess ? kern_copy(rop->buf, sop->buf, sop->bytes, rs, &err) : 0;
  if (e == cudaSuccess && rc == 0 && ss != rs) {
    e = cudaEventRecord(copied, rs);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(ss, copied, 0);
  }
  if (sent) cudaEventDestroy(sent);
  if (copied) cudaEventDestroy(copied);
  if (e != cudaSuccess) return cuda_err(e, "joining the send's and the receive's streams");
  if (rc != 0) return err_set(ncclUnhandledCudaError, "ncclRecv: kernel launch failed: %s", err);
  return ncclSuccess;
}

/* One rank, a run of sends to itself and receives from itself on device
 * buffers (a group: PyTorch's all_to_all_single with split sizes issues one):
 * they pair up as a host batch's do (p2p_self_pairs), every pair is checked
 * before any copy is queued, and each pair is a copy on the GPU (self_copy)
 * instead of a trip through the proxy's host staging. */
static ncclResult_t local_self_p2p(struct ncclComm* comm, const struct coll_args* a, int m) {
  struct p2p_op stack[16];
  struct p2p_op* ops = m <= 16 ? stack : calloc((size_t)m, sizeof(*ops));
  if (!ops) return err_set(ncclSystemError, "device path: out of memory for a group of %d sends and receives", m);
  for (int i = 0; i < m; i++) {
    int send = a[i].kind == COLL_SEND;
    ops[i] = (struct p2p_op){.peer = a[i].peer, .is_send = send,
                             .buf = send ? (char*)a[i].sendbuff : (char*)a[i].recvbuff,
                             .bytes = a[i].count * dtype_size(a[i].dt)};
  }
  struct self_group g = {ops, a};
  ncclResult_t res = p2p_self_pairs(comm, ops, m, NULL, NULL);
  if (res == ncclSuccess) res = p2p_self_pairs(comm, ops, m, self_copy, &g);
  if (ops != stack) free(ops);
  return res;
}

/* ---- ranks of one host: the collective runs as a GPU kernel (kern_sched) ---- */

static int kernel_kind(const struct ncclComm* comm, const struct coll_args* a) {
  if (!(a->mem & MEM_DEVICE)) return -1;
  switch (a->kind) {
    case COLL_ALLREDUCE: {
      int ring_ok = comm->algo_mask & (1 << ALGO_RING), tree_ok = comm->algo_mask & (1 << ALGO_TREE);
      size_t bytes = a->count * dtype_size(a->dt);
      if (tree_ok && (!ring_ok || (comm->nranks > 2 && bytes <= ((size_t)64 << 10)))) return DS_ALLREDUCE_TREE;
      return DS_ALLREDUCE_RING;
    }
    case COLL_ALLGATHER: return DS_ALLGATHER;
    case COLL_REDUCESCATTER: return DS_REDUCESCATTER;
    case COLL_BROADCAST: return DS_BROADCAST;
    case COLL_REDUCE: return DS_REDUCE;
    default: return -1;
  }
}

static ncclResult_t kernel_run(struct dev_state* d, const struct coll_args* a) {
  struct ncclComm* comm = d->comm;
  uint32_t st = __atomic_load_n(&d->kwords[1], __ATOMIC_ACQUIRE);
  if (st != DS_OK) {
    ncclResult_t none = ncclSuccess;
    __atomic_compare_exchange_n(&comm->async_error, &none, ncclSystemError, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return err_set(ncclSystemError, "%s: an earlier device kernel of this communicator stopped (%s); call not run",
                   coll_name(a->kind), st == DS_ABORTED ? "aborted" : "timed out waiting for a peer");
  }
  if (a->count == 0) return ncclSuccess;
  struct ds_work w;
  memset(&w, 0, sizeof(w));
  w.kind = kernel_kind(comm, a);
  w.dt = (int)a->dt;
  w.red = a->op.kind;
  w.avg_n = a->avg ? comm->nranks : 0;
  w.nranks = comm->nranks;
  w.rank = comm->rank;
  w.root = a->root;
  w.nslots = DS_NSLOTS;
  w.slot_bytes = DS_SLOT_BYTES;
  w.count = a->count;
  w.scalar.f = a->op.scalar.f;
  w.scalar.u = a->op.scalar.u;
  w.scalar_dev = scalar_resolve(a, &w.scalar.f, &w.scalar.u);
  w.sendbuff = a->sendbuff;
  w.recvbuff = a->recvbuff;
  w.abort = d->kwords_dev;
  w.status = d->kwords_dev + 1;
  w.timeout_ns = (uint64_t)comm->timeout_s * 1000000000ull;
  w.unroll = d->unroll;
  size_t bytes = a->count * dtype_size(a->dt) * (a->kind == COLL_ALLGATHER || a->kind == COLL_REDUCESCATTER ? (size_t)comm->nranks : 1);
  w.nch = ds_channels(bytes, DS_SLOT_BYTES, comm->min_ch, comm->max_ch);
  /* Every rank reaches this for the same call with the same channel count: connectors are set up in step. */
  while (d->nch_ready < w.nch) {
    NCCLCHECK(dconn_setup(comm, &d->conns, d->nch_ready, d->p2p_disable, d->s));
    d->nch_ready++;
  }
  for (int c = 0; c < w.nch; c++) dconn_wire(d->conns, comm->rank, c, &w.ch[c]);
  if (a->op_id)
    INFO(LOG_COLL, "%s: opCount %llx as a GPU kernel: schedule %d, %d channel(s), %s connectors", coll_name(a->kind),
         (unsigned long long)(a->op_id - 1), w.kind, w.nch, d->p2p_disable ? "host-memory" : "p2p");
  cudaStream_t s = (cudaStream_t)a->stream;
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(s, &cs);
  if (e != cudaSuccess) return cuda_err(e, "cudaStreamIsCapturing");
  /* Kernels of one communicator share its connectors: one at a time, in call
   * order, across streams. A captured call is ordered by the graph instead. */
  int captured = cs != cudaStreamCaptureStatusNone;
  if (!captured && d->have_last && (e = cudaStreamWaitEvent(s, d->last, 0)) != cudaSuccess)
    return cuda_err(e, "cudaStreamWaitEvent");
  const char* err = "";
  if (kern_sched(&w, s, &err) != 0)
    return err_set(ncclUnhandledCudaError, "%s: kernel launch failed: %s", coll_name(a->kind), err);
  if (!captured) {
    if ((e = cudaEventRecord(d->last, s)) != cudaSuccess) return cuda_err(e, "cudaEventRecord");
    d->have_last = 1;
  }
  return ncclSuccess;
}

static int stream_index(cudaStream_t* s, int n, cudaStream_t x) {
  for (int i = 0; i < n; i++)
    if (s[i] == x) return i;
  return -1;
}

static ncclResult_t submit(struct ncclComm* comm, const struct coll_args* a, int n, int host_wait);

ncclResult_t dev_submit(struct ncclComm* comm, const struct coll_args* a, int n, int host_wait) {
  /* The first call of a communicator sets things up (pinned words, device
   * connectors: cudaHostAlloc, cudaMalloc, IPC, a synchronize on collie's own
   * stream). Under stream capture in the global or thread-local mode those
   * calls would fail or invalidate the user's capture; relaxed mode for the
   * duration of this call allows them, as none touches a captured stream. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t me = cudaThreadExchangeStreamCaptureMode(&mode);
  ncclResult_t res = submit(comm, a, n, host_wait);
  if (me == cudaSuccess) cudaThreadExchangeStreamCaptureMode(&mode);
  else cudaGetLastError();
  return res;
}

static ncclResult_t submit(struct ncclComm* comm, const struct coll_args* a, int n, int host_wait) {
  struct dev_state* d = NULL;
  NCCLCHECK(state_get(comm, &d));
  ncclResult_t res = ncclSuccess;
  int saved = -1;
  cudaGetDevice(&saved);
  if (saved != d->dev) cudaSetDevice(d->dev);
  int local = comm->nranks == 1 && !host_wait;
  for (int i = 0; i < n && local; i++)
    if (!(a[i].mem & MEM_DEVICE)) local = 0;
  if (local) {
    /* Earlier staged calls on other streams do not order these (as in NCCL); on the same stream they do.
     * Consecutive sends and receives pair up among themselves, as a host point-to-point batch does. */
    for (int i = 0; i < n && res == ncclSuccess;) {
      int k = i;
      while (k < n && (a[k].kind == COLL_SEND || a[k].kind == COLL_RECV)) k++;
      if (k > i) {
        res = local_self_p2p(comm, &a[i], k - i);
        i = k;
      } else {
        res = local_run(&a[i++]);
      }
    }
    goto out;
  }
  int kern = d->kpath && !host_wait;
  for (int i = 0; i < n && kern; i++)
    if (kernel_kind(comm, &a[i]) < 0) kern = 0;
  if (kern) {
    for (int i = 0; i < n && res == ncclSuccess; i++) res = kernel_run(d, &a[i]);
    goto out;
  }
  struct dev_job* j = calloc(1, sizeof(*j));
  if (!j) {
    res = err_set(ncclSystemError, "device path: out of memory");
    goto out;
  }
  j->n = n;
  j->host_wait = host_wait;
  j->a = malloc(sizeof(*a) * (size_t)n);
  j->streams = calloc((size_t)n, sizeof(*j->streams));
  j->ready = calloc((size_t)n, sizeof(*j->ready));
  if (!j->a || !j->streams || !j->ready) {
    job_free(j);
    res = err_set(ncclSystemError, "device path: out of memory");
    goto out;
  }
  memcpy(j->a, a, sizeof(*a) * (size_t)n);
  for (int i = 0; i < n; i++) {
    if (!(a[i].mem & MEM_DEVICE)) continue;
    cudaStream_t s = (cudaStream_t)a[i].stream;
    if (stream_index(j->streams, j->nstreams, s) >= 0) continue;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
      job_free(j);
      res = err_set(ncclInvalidUsage,
                    "%s: the stream is being captured into a CUDA graph; collie runs multi-rank device calls through "
                    "its proxy thread, which cannot be captured (one-rank communicators can)",
                    coll_name(a[i].kind));
      goto out;
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&j->ready[j->nstreams], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(j->ready[j->nstreams], s);
    j->streams[j->nstreams++] = s;
    if (e != cudaSuccess) {
      job_free(j);
      res = cuda_err(e, "recording an event on the user stream");
      goto out;
    }
  }
  pthread_mutex_lock(&d->mu);
  uint32_t seq = j->seq = ++d->posted;
  if (d->tail) d->tail->next = j;
  else d->head = j;
  d->tail = j;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  /* The gates: each stream waits for this call's sequence number. */
  for (int i = 0; i < j->nstreams && res == ncclSuccess; i++) {
    const char* err = "";
    if (kern_wait_flag(d->flag_dev, seq, j->streams[i], &err) != 0)
      res = err_set(ncclUnhandledCudaError, "device path: cannot launch the stream gate: %s", err);
  }
  /* j belongs to the proxy now (unless we wait for it). */
  if (host_wait) {
    pthread_mutex_lock(&d->mu);
    while (!j->done) pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    if (res == ncclSuccess && j->res != ncclSuccess) res = err_set(j->res, "%s", j->err);
    job_free(j);
  }
out:
  if (saved >= 0 && saved != d->dev) cudaSetDevice(saved);
  return res;
}

ncclResult_t dev_quiesce(struct ncclComm* comm) {
  struct dev_state* d = comm->dev;
  if (!d || dev_in_proxy) return ncclSuccess;
  pthread_mutex_lock(&d->mu);
  while (d->completed != d->posted) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  return ncclSuccess;
}

void dev_exec_free(struct ncclComm* comm) {
  struct dev_state* d = comm->dev;
  if (!d) return;
  pthread_mutex_lock(&d->mu);
  d->stop = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  if (d->started) pthread_join(d->thread, NULL);
  int saved = -1;
  cudaGetDevice(&saved);
  cudaSetDevice(d->dev);
  /* Kernels still use the connectors: wait for the last one; after
   * ncclCommAbort, the abort word makes their waits give up. */
  for (int it = 0; d->have_last; it++) {
    /* After ncclCommAbort, or once the communicator has failed (a peer died:
     * its kernels would wait for it forever), the abort word stops them. */
    if (comm_stopping(comm)) __atomic_store_n(&d->kwords[0], 1, __ATOMIC_RELEASE);
    cudaError_t e = cudaEventQuery(d->last);
    if (e != cudaErrorNotReady) break;
    struct timespec ts = {0, it < 100 ? 100000 : 1000000};
    nanosleep(&ts, NULL);
  }
  cudaGetLastError();
  dconn_free(d->conns);
  if (d->last) cudaEventDestroy(d->last);
  if (d->kwords) cudaFreeHost((void*)d->kwords);
  cudaStreamSynchronize(d->s);
  cudaStreamDestroy(d->s);
  cudaFreeHost(d->pinned);
  if (saved >= 0) cudaSetDevice(saved);
  free(d->heap);
  flag_put(d->flag);
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free(d);
  comm->dev = NULL;
}
