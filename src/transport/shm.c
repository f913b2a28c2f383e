/* Shared-memory connectors: the receiver creates an anonymous memfd holding
 * the control block and the slots; the sender opens it through
 * /proc/<pid>/fd/<n> and maps it. Nothing is ever named in /dev/shm, so a
 * crash at any moment leaves nothing behind. Head/tail counters are 32-bit
 * futex words: a waiter spins briefly, then sleeps on the word; the other side
 * wakes it only when it said it was sleeping. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../comm.h"
#include "../failures.h"
#include "transport.h"

#define SHM_MAX_SLOTS 16

struct shm_ctrl {
  uint32_t tail; /* slots committed by the sender */
  uint32_t tail_waiters;
  char pad0[56];
  uint32_t head; /* slots released by the receiver */
  uint32_t head_waiters;
  char pad1[56];
  uint32_t send_failed;
  uint32_t recv_failed;
  char pad2[56];
  struct slot_hdr hdr[SHM_MAX_SLOTS];
};

struct shm_conn {
  struct shm_ctrl* ctrl;
  char* data;
  void* map;
  size_t map_len;
  int memfd; /* receiver: open until the sender has mapped it */
  uint32_t pos;
};

struct shm_info {
  int32_t pid;
  int32_t fd;
  uint64_t map_len;
  int32_t nslots;
  uint64_t slot_bytes;
};

static long futex(uint32_t* addr, int op, uint32_t val, const struct timespec* ts) {
  return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static size_t ctrl_bytes(void) { return (sizeof(struct shm_ctrl) + 4095) & ~(size_t)4095; }

static void* shm_send_slot(struct conn* c) {
  struct shm_conn* s = c->priv;
  uint32_t head = __atomic_load_n(&s->ctrl->head, __ATOMIC_ACQUIRE);
  if ((uint32_t)(s->pos - head) >= (uint32_t)c->nslots) return NULL;
  return s->data + (size_t)(s->pos % (uint32_t)c->nslots) * c->slot_bytes;
}

static void wake(uint32_t* word, uint32_t* waiters) {
  /* Pairs with the fence in shm_wait: either the waiter sees the new value
   * before sleeping, or we see its waiter flag here. */
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (__atomic_load_n(waiters, __ATOMIC_RELAXED)) futex(word, FUTEX_WAKE, 1, NULL);
}

static ncclResult_t shm_send_commit(struct conn* c, const struct slot_hdr* h) {
  struct shm_conn* s = c->priv;
  s->ctrl->hdr[s->pos % (uint32_t)c->nslots] = *h;
  s->pos++;
  __atomic_store_n(&s->ctrl->tail, s->pos, __ATOMIC_RELEASE);
  wake(&s->ctrl->tail, &s->ctrl->tail_waiters);
  return ncclSuccess;
}

static const void* shm_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct shm_conn* s = c->priv;
  uint32_t tail = __atomic_load_n(&s->ctrl->tail, __ATOMIC_ACQUIRE);
  if (tail == s->pos) return NULL;
  uint32_t i = s->pos % (uint32_t)c->nslots;
  *h = s->ctrl->hdr[i];
  return s->data + (size_t)i * c->slot_bytes;
}

static ncclResult_t shm_recv_release(struct conn* c) {
  struct shm_conn* s = c->priv;
  s->pos++;
  __atomic_store_n(&s->ctrl->head, s->pos, __ATOMIC_RELEASE);
  wake(&s->ctrl->head, &s->ctrl->head_waiters);
  return ncclSuccess;
}

static ncclResult_t shm_progress(struct conn* c) {
  (void)c;
  return ncclSuccess;
}

/* Sleeps on the counter this side waits for, unless it already moved. */
static void shm_wait(struct conn* c, int timeout_ms) {
  struct shm_conn* s = c->priv;
  uint32_t* word = c->is_send ? &s->ctrl->head : &s->ctrl->tail;
  uint32_t* waiters = c->is_send ? &s->ctrl->head_waiters : &s->ctrl->tail_waiters;
  uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  int ready = c->is_send ? (uint32_t)(s->pos - seen) < (uint32_t)c->nslots : seen != s->pos;
  if (ready) return;
  __atomic_store_n(waiters, 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  /* A stop (abort, revoke, failure) set since the caller's check would be
   * woken only by transport_wake, which may have run already: look again,
   * so only a few instructions are left for a wake to be missed in. */
  if (!comm_stopping(c->comm) && __atomic_load_n(word, __ATOMIC_ACQUIRE) == seen) {
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    futex(word, FUTEX_WAIT, seen, &ts);
  }
  __atomic_store_n(waiters, 0, __ATOMIC_RELAXED);
}

static void shm_fail(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s || !s->ctrl) return;
  uint32_t* flag = c->is_send ? &s->ctrl->send_failed : &s->ctrl->recv_failed;
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  /* Wake whoever waits on either counter so it notices. */
  futex(&s->ctrl->tail, FUTEX_WAKE, 1, NULL);
  futex(&s->ctrl->head, FUTEX_WAKE, 1, NULL);
}

static void shm_wake(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s || !s->ctrl) return;
  futex(&s->ctrl->tail, FUTEX_WAKE, 64, NULL);
  futex(&s->ctrl->head, FUTEX_WAKE, 64, NULL);
}

static int shm_peer_failed(struct conn* c) {
  struct shm_conn* s = c->priv;
  return __atomic_load_n(c->is_send ? &s->ctrl->recv_failed : &s->ctrl->send_failed, __ATOMIC_ACQUIRE) != 0;
}

static void shm_close(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s) return;
  if (s->map) munmap(s->map, s->map_len);
  if (s->memfd >= 0) close(s->memfd);
  free(s);
  c->priv = NULL;
}

static int shm_pending(struct conn* c) {
  (void)c;
  return 0; /* a committed slot is already in the peer's memory */
}

static const struct conn_ops shm_ops = {shm_send_slot, shm_send_commit, NULL, shm_recv_slot, NULL, shm_recv_release,
                                        shm_progress,  shm_wait,        shm_fail,      shm_pending, NULL,
                                        shm_peer_failed, shm_close, shm_wake};

ncclResult_t shm_recv_setup(struct conn* c, void* info, size_t* info_len) {
  if (c->nslots > SHM_MAX_SLOTS) c->nslots = SHM_MAX_SLOTS;
  struct shm_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "shm: out of memory");
  s->memfd = -1;
  c->priv = s;
  c->ops = &shm_ops;
  s->map_len = ctrl_bytes() + (size_t)c->nslots * c->slot_bytes;
  s->memfd = memfd_create("collie-shm", MFD_CLOEXEC);
  if (s->memfd < 0) return err_set(ncclSystemError, "shm: memfd_create failed: %s", strerror(errno));
  /* memfds start 0777; only this user's processes (the peer) may open it. */
  if (fchmod(s->memfd, 0600) != 0) return err_set(ncclSystemError, "shm: fchmod failed: %s", strerror(errno));
  if (ftruncate(s->memfd, (off_t)s->map_len) != 0)
    return err_set(ncclSystemError, "shm: cannot size a %zu-byte segment: %s", s->map_len, strerror(errno));
  s->map = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd, 0);
  if (s->map == MAP_FAILED) {
    s->map = NULL;
    return err_set(ncclSystemError, "shm: mmap of %zu bytes failed: %s", s->map_len, strerror(errno));
  }
  s->ctrl = s->map;
  s->data = (char*)s->map + ctrl_bytes();
  /* Zeroed first: the padding after nslots goes to the peer too. */
  struct shm_info in;
  memset(&in, 0, sizeof(in));
  in.pid = (int32_t)getpid();
  in.fd = s->memfd;
  in.map_len = s->map_len;
  in.nslots = c->nslots;
  in.slot_bytes = c->slot_bytes;
  memcpy(info, &in, sizeof(in));
  *info_len = sizeof(in);
  return ncclSuccess;
}

ncclResult_t shm_send_connect(struct conn* c, const void* info, size_t info_len) {
  struct shm_info in;
  if (info_len != sizeof(in)) return err_set(ncclInternalError, "shm: bad connection info from rank %d", c->peer);
  memcpy(&in, info, sizeof(in));
  struct shm_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "shm: out of memory");
  s->memfd = -1;
  c->priv = s;
  c->ops = &shm_ops;
  c->nslots = in.nslots;
  c->slot_bytes = in.slot_bytes;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", in.pid, in.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return err_set(ncclSystemError,
                   "shm: cannot open rank %d's segment %s: %s (processes in different containers or users? "
                   "set NCCL_SHM_DISABLE=1 to use sockets)",
                   c->peer, path, strerror(errno));
  s->map_len = in.map_len;
  s->map = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (s->map == MAP_FAILED) {
    s->map = NULL;
    return err_set(ncclSystemError, "shm: mmap of rank %d's segment failed: %s", c->peer, strerror(errno));
  }
  s->ctrl = s->map;
  s->data = (char*)s->map + ctrl_bytes();
  return ncclSuccess;
}

ncclResult_t shm_recv_connected(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (s->memfd >= 0) close(s->memfd);
  s->memfd = -1;
  return ncclSuccess;
}
