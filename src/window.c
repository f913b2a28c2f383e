/* Memory windows (ncclCommWindowRegister / ncclCommWindowDeregister) over
 * host memory: a collie extension of host semantics. A window is a range of
 * ncclMemAlloc's host memory (hostmem.h: a memfd per allocation) that every
 * rank of the communicator registers in one collective call; each rank then
 * maps the windows of the ranks on its host, so that it can read and write
 * them in place. collie_window_peer_ptr (collie.h) says where a peer's window
 * lies in this process, as MPI_Win_shared_query does for a shared window.
 * Ranks on other hosts take part in the calls but map nothing.
 *
 * Registration is all or nothing: the ranks exchange a descriptor each
 * (through the bootstrap) and then whether their mappings worked, so either
 * every rank gets its window or every rank gets the same error. Device memory
 * is refused (windows there need NCCL's symmetric kernels, which collie's
 * device path does not have). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "failures.h"
#include "hostmem.h"
#include "device/device.h"
#include "device/dev_plan.h"
#include "transport/shmseg.h"

/* What each rank posts at registration; ok 0 carries no mapping data. */
struct win_desc {
  int32_t ok;
  int32_t pid;
  int32_t fd;
  int32_t flags;
  uint64_t ino, len, off, size;
};

struct ncclWindow_vidmem {
  struct ncclComm* comm;
  struct ncclWindow_vidmem* next;
  void* base;
  size_t size;
  int flags;
  int nranks;
  struct shm_seg* segs; /* the peers' allocations, mapped (base NULL: not mapped) */
  char** peer;          /* where each rank's window lies here (NULL: another host) */
  size_t* peer_size;
};

static pthread_mutex_t win_mu = PTHREAD_MUTEX_INITIALIZER;

static void win_free(struct ncclWindow_vidmem* w) {
  if (!w) return;
  for (int i = 0; w->segs && i < w->nranks; i++) shmseg_free(&w->segs[i]);
  free(w->segs);
  free(w->peer);
  free(w->peer_size);
  free(w);
}

/* Whether w is one of comm's live windows. */
static int win_known(struct ncclComm* comm, struct ncclWindow_vidmem* w) {
  int found = 0;
  pthread_mutex_lock(&win_mu);
  for (struct ncclWindow_vidmem* x = comm->windows; x && !found; x = x->next) found = x == w;
  pthread_mutex_unlock(&win_mu);
  return found;
}

/* This rank's side of the registration: 0 and a reason in why if its buffer
 * cannot be a window. */
static int local_check(void* buff, size_t size, int flags, struct win_desc* d, char* why, size_t cap) {
  memset(d, 0, sizeof(*d));
  d->pid = (int32_t)getpid();
  d->flags = flags;
  d->size = size;
  if (device_mem_class(buff) == MEM_DEVICE) {
    snprintf(why, cap, "%p is device memory: device windows need NCCL's symmetric kernels, which collie's device "
             "path does not have", buff);
    return 0;
  }
  struct hostmem_ref ref;
  if (!hostmem_find(buff, size, &ref)) {
    snprintf(why, cap, "[%p, +%zu) does not lie within one allocation of ncclMemAlloc's host memory (collie's "
             "windows are host memory its peers can map)", buff, size);
    return 0;
  }
  d->ok = 1;
  d->fd = ref.fd;
  d->ino = ref.ino;
  d->len = ref.len;
  d->off = ref.off;
  return 1;
}

/* Maps the windows of the ranks on this host. */
static ncclResult_t map_all(struct ncclComm* comm, struct ncclWindow_vidmem* w, const struct win_desc* all) {
  int me = comm->rank;
  for (int i = 0; i < comm->nranks; i++) {
    w->peer_size[i] = all[i].size;
    if (i == me) {
      w->peer[i] = w->base;
      continue;
    }
    if (comm->peers[i].host_hash != comm->peers[me].host_hash) continue; /* another host (NCCL_HOSTID too) */
    NCCLCHECK(shmseg_open(all[i].pid, all[i].fd, all[i].len, i, "memory window", &w->segs[i]));
    w->peer[i] = (char*)w->segs[i].base + all[i].off;
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
         int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags) {
  NCCLCHECK(comm_check(comm, "ncclCommWindowRegister"));
  if (win == NULL) return err_set(ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  *win = NULL;
  if (buff == NULL || size == 0)
    return err_set(ncclInvalidArgument, "ncclCommWindowRegister: buff %p / size %zu: need a non-empty buffer", buff,
                   size);
  if (winFlags != NCCL_WIN_DEFAULT && winFlags != NCCL_WIN_COLL_SYMMETRIC)
    return err_set(ncclInvalidArgument, "ncclCommWindowRegister: unknown winFlags 0x%x", (unsigned)winFlags);
  if (winFlags == NCCL_WIN_COLL_SYMMETRIC && (uintptr_t)buff % NCCL_WIN_REQUIRED_ALIGNMENT)
    return err_set(ncclInvalidArgument,
                   "ncclCommWindowRegister: a symmetric window must start at a multiple of %d bytes (%p does not)",
                   NCCL_WIN_REQUIRED_ALIGNMENT, buff);
  /* Queued work of a nonblocking communicator uses the bootstrap too: let it finish first. */
  if (comm->nonblocking) async_drain(comm);
  int n = comm->nranks, me = comm->rank;
  struct win_desc* all = calloc((size_t)n, sizeof(*all));
  int32_t* mapped = calloc((size_t)n, sizeof(*mapped));
  struct ncclWindow_vidmem* w = calloc(1, sizeof(*w));
  if (w) {
    w->segs = calloc((size_t)n, sizeof(*w->segs));
    w->peer = calloc((size_t)n, sizeof(*w->peer));
    w->peer_size = calloc((size_t)n, sizeof(*w->peer_size));
    for (int i = 0; w->segs && i < n; i++) w->segs[i] = (struct shm_seg){NULL, 0, -1};
  }
  ncclResult_t res = ncclSuccess;
  if (!all || !mapped || !w || !w->segs || !w->peer || !w->peer_size) {
    /* Nothing to exchange into: the peers' exchange then ends in its timeout, with an error. */
    res = err_set(ncclSystemError, "ncclCommWindowRegister: rank %d: out of memory", me);
    goto out;
  }
  char why[384] = "";
  local_check(buff, size, winFlags, &all[me], why, sizeof(why));
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, all, sizeof(*all)), res, out);
  for (int i = 0; i < n; i++) {
    if (!all[i].ok) {
      res = i == me ? err_set(ncclInvalidUsage, "ncclCommWindowRegister: rank %d: %s", me, why)
                    : err_set(ncclInvalidUsage, "ncclCommWindowRegister: rank %d could not register its buffer "
                              "(its ncclGetLastError says why)", i);
      goto out;
    }
  }
  for (int i = 0; i < n; i++) {
    if (all[i].flags != winFlags) {
      res = err_set(ncclInvalidArgument, "ncclCommWindowRegister: rank %d passed winFlags 0x%x, rank %d 0x%x", i,
                    (unsigned)all[i].flags, me, (unsigned)winFlags);
      goto out;
    }
    if (winFlags == NCCL_WIN_COLL_SYMMETRIC && all[i].size != size) {
      res = err_set(ncclInvalidArgument,
                    "ncclCommWindowRegister: symmetric window of %zu bytes on rank %d but %llu on rank %d", size, me,
                    (unsigned long long)all[i].size, i);
      goto out;
    }
  }
  w->comm = comm;
  w->base = buff;
  w->size = size;
  w->flags = winFlags;
  w->nranks = n;
  char map_why[512] = "";
  ncclResult_t mres = map_all(comm, w, all);
  if (mres != ncclSuccess) snprintf(map_why, sizeof(map_why), "%s", err_last_thread());
  mapped[me] = mres == ncclSuccess;
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, mapped, sizeof(*mapped)), res, out);
  for (int i = 0; i < n; i++) {
    if (!mapped[i]) {
      res = i == me ? err_set(mres, "ncclCommWindowRegister: rank %d: %s", me, map_why)
                    : err_set(ncclSystemError, "ncclCommWindowRegister: rank %d could not map its peers' windows", i);
      goto out;
    }
  }
  pthread_mutex_lock(&win_mu);
  w->next = comm->windows;
  comm->windows = w;
  pthread_mutex_unlock(&win_mu);
  INFO(LOG_REG, "comm %p rank %d: window %p + %zu registered (%s), %d peer window(s) mapped", (void*)comm, me, buff,
       size, winFlags == NCCL_WIN_COLL_SYMMETRIC ? "symmetric" : "default", comm->local_size - 1);
  *win = w;
  w = NULL;
out:
  win_free(w);
  free(all);
  free(mapped);
  return res;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  NCCLCHECK(comm_check(comm, "ncclCommWindowDeregister"));
  if (win == NULL || !win_known(comm, win))
    return err_set(ncclInvalidArgument, "ncclCommWindowDeregister: %p is not a window of comm %p", (void*)win,
                   (void*)comm);
  if (comm->nonblocking) async_drain(comm);
  /* Nobody unmaps (and lets its owner free the memory) while a peer may still use it. */
  ncclResult_t res = bootstrap_barrier(comm->bs);
  pthread_mutex_lock(&win_mu);
  for (struct ncclWindow_vidmem** p = &comm->windows; *p; p = &(*p)->next)
    if (*p == win) {
      *p = win->next;
      break;
    }
  pthread_mutex_unlock(&win_mu);
  win_free(win);
  return res;
}

void window_free_all(struct ncclComm* comm) {
  pthread_mutex_lock(&win_mu);
  struct ncclWindow_vidmem* w = comm->windows;
  comm->windows = NULL;
  pthread_mutex_unlock(&win_mu);
  while (w) {
    struct ncclWindow_vidmem* next = w->next;
    win_free(w);
    w = next;
  }
}

COLLIE_EXPORT ncclResult_t collie_window_peer_ptr(ncclComm_t comm, ncclWindow_t win, int rank, void** ptr, size_t* size) {
  NCCLCHECK(comm_check(comm, "collie_window_peer_ptr"));
  if (ptr == NULL) return err_set(ncclInvalidArgument, "collie_window_peer_ptr: ptr is NULL");
  *ptr = NULL;
  if (size) *size = 0;
  if (win == NULL || !win_known(comm, win))
    return err_set(ncclInvalidArgument, "collie_window_peer_ptr: %p is not a window of comm %p", (void*)win,
                   (void*)comm);
  if (rank < 0 || rank >= comm->nranks)
    return err_set(ncclInvalidArgument, "collie_window_peer_ptr: rank %d is not in 0..%d", rank, comm->nranks - 1);
  if (!win->peer[rank])
    return err_set(ncclInvalidUsage, "collie_window_peer_ptr: rank %d is on another host; its window is not mapped",
                   rank);
  *ptr = win->peer[rank];
  if (size) *size = win->peer_size[rank];
  return ncclSuccess;
}
