/* The shm transport: the receiver creates an anonymous memfd (shmseg.c)
 * holding the control block and the slots; the sender opens it through
 * /proc/<pid>/fd/<n> and maps it. Nothing is ever named in /dev/shm, so a
 * crash at any moment leaves nothing behind. Head/tail counters are 32-bit
 * futex words: a waiter spins briefly, then sleeps on the word; the other side
 * wakes it only when it said it was sleeping.
 *
 * A committed slot says so itself: its header (a cache line of its own)
 * carries the slot's sequence number, stored last, and the receiver reads
 * that line, then the payload: two line transfers a slot where a commit
 * counter beside the headers made three. The `tail` word is only what a
 * sleeping receiver waits on: the sender stores it when the receiver has
 * said it sleeps, so its line stays in both caches, read-only. The sender
 * keeps the last value it read of the receiver's `head` and reads the
 * shared one again only when that value says the ring is full. Neither side
 * fences between its store and its look for a sleeper (a full fence waits
 * for the store, and the header stored before it, to reach this CPU's
 * cache: 90% of a commit's time in a loop of 8-byte send/receive pairs). The
 * waiter closes that gap instead: after it has said it sleeps it keeps
 * looking for ARM_POLL_NS, far longer than a store takes to leave a CPU's
 * store buffer, before it sleeps, and it never sleeps without a timeout (the
 * direct path's waiters do the same, coll/direct_shm.c).
 *
 * Where a payload lands in its slot: a payload of at most half a slot
 * moves to the next place in the slot each time the ring comes round to
 * that slot (its size rounded up to 4 KiB, so 4 places for 32 KiB in a
 * slot of 128 KiB), and the header says where (`off`). Why: a sender that
 * writes lines its receiver read one lap before (8 slots of 64 KiB
 * payloads: 512 KiB, half a core's private cache here) finds them still in
 * the receiver's cache and must take each back from there before its store
 * completes; lines a lap of 1 MiB has since pushed out of that cache come
 * from the shared cache or memory, which the prefetchers stream. In a
 * two-process loop on the development VM (2 vCPUs, AMD EPYC Zen 4: 1 MiB
 * private, 16 MiB shared cache; each rank copies its block into its slot
 * and the peer's out, 8 slots of 128 KiB, medians) an exchange of 32 KiB a
 * rank took 5.4-6.7 us always at the slot's start and 3.5-3.8 moving
 * through it, 64 KiB 9.4-11.2 against 6.2-7.1, 16 KiB 2.9-3.4 against 2.0-2.2
 * (from 96 KiB on, nothing to gain: one place a slot). Only where every
 * local rank has a CPU of its own (COLLIE_SLOT_ROTATE=auto, see shm_alloc);
 * 0 keeps every payload at its slot's start, 1 rotates everywhere. */
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "../comm_err.h"
#include "../futex.h"
#include "shmseg.h"
#include "transport.h"

#define SHM_MAX_SLOTS 16
/* How long a waiter that has raised its flag keeps reading the counter
 * before it sleeps (see above). */
#define ARM_POLL_NS 5000

/* A slot's header, a line of its own: seq is pos + 1 once slot pos (of
 * the connector's life) is committed, stored after the rest. A payload of
 * up to SHM_INLINE bytes travels in the line too (the sender copies it
 * there from the slot it wrote, which then stays in its own cache), so a
 * small message is one line transfer, not two. */
#define SHM_INLINE 32
struct shm_hdr {
  struct slot_hdr h;
  uint32_t seq;
  uint32_t off; /* where in the slot the payload starts (a multiple of 4 KiB) */
  char data[SHM_INLINE];
};
_Static_assert(sizeof(struct shm_hdr) == 64, "one cache line a header");

struct shm_ctrl {
  uint32_t tail; /* slots committed, as of the sender's last wake of a sleeping receiver */
  uint32_t tail_waiters;
  char pad0[56];
  uint32_t head; /* slots released by the receiver */
  uint32_t head_waiters;
  char pad1[56];
  uint32_t send_failed;
  uint32_t recv_failed;
  char pad2[56];
  uint64_t shared[CONN_SHARED_WORDS]; /* shared_words: the algorithms' own (one cache line) */
  struct shm_hdr hdr[SHM_MAX_SLOTS];
};

_Static_assert(8 * CONN_SHARED_WORDS == 64, "the shared words fill one cache line");

struct shm_conn {
  struct shm_ctrl* ctrl;
  char* data;
  struct shm_seg seg; /* receiver: its fd stays open until the sender has mapped it */
  uint32_t pos;
  uint32_t seen;   /* sender: the receiver's head when last read */
  uint32_t off;    /* sender: where slot pos's payload goes (the last sized send_slot; 0 after a commit) */
  int rotate;      /* COLLIE_SLOT_ROTATE */
};

struct shm_info {
  int32_t pid;
  int32_t fd;
  uint64_t map_len;
  int32_t nslots;
  uint64_t slot_bytes;
};

static size_t ctrl_bytes(void) { return (sizeof(struct shm_ctrl) + 4095) & ~(size_t)4095; }

#define SHM_PLACE_BYTES ((size_t)4 << 10)

/* Where in its slot the payload of slot pos goes, given at most `bytes`:
 * the next of the slot's places on every lap (see the top). A payload that
 * travels in the header's line stays put (no divisions for it). */
static uint32_t slot_place(const struct conn* c, const struct shm_conn* s, size_t bytes) {
  if (!s->rotate || bytes <= SHM_INLINE) return 0;
  size_t step = (bytes + SHM_PLACE_BYTES - 1) & ~(SHM_PLACE_BYTES - 1);
  size_t places = c->slot_bytes / step;
  if (places < 2) return 0;
  uint32_t lap = s->pos / (uint32_t)c->nslots;
  return (uint32_t)((lap % places) * step);
}

static void* shm_send_slot(struct conn* c, size_t bytes) {
  struct shm_conn* s = c->priv;
  if ((uint32_t)(s->pos - s->seen) >= (uint32_t)c->nslots) {
    s->seen = __atomic_load_n(&s->ctrl->head, __ATOMIC_ACQUIRE);
    if ((uint32_t)(s->pos - s->seen) >= (uint32_t)c->nslots) return NULL;
  }
  /* Asking with 0 (is a slot free?) leaves a place chosen for this slot as it is. */
  if (bytes) s->off = slot_place(c, s, bytes);
  return s->data + (size_t)(s->pos % (uint32_t)c->nslots) * c->slot_bytes + s->off;
}

/* No fence before the look at the waiters flag: shm_wait_arm's waiter
 * keeps reading the word long enough to see this store (see the top). */
static void wake(uint32_t* word, uint32_t* waiters) {
  if (__atomic_load_n(waiters, __ATOMIC_RELAXED)) futex_wake(word, 1, 1);
}

static ncclResult_t shm_send_commit(struct conn* c, const struct slot_hdr* h) {
  struct shm_conn* s = c->priv;
  uint32_t i = s->pos % (uint32_t)c->nslots;
  uint32_t off = s->off;
  s->off = 0;
  if (h->bytes > c->slot_bytes - off)
    return err_set(ncclInternalError, "shm: %u bytes committed where send_slot was told at most %zu", h->bytes,
                   (size_t)(c->slot_bytes - off));
  struct shm_hdr* x = &s->ctrl->hdr[i];
  x->h = *h;
  x->off = off;
  if (h->bytes && h->bytes <= SHM_INLINE) memcpy(x->data, s->data + (size_t)i * c->slot_bytes + off, h->bytes);
  s->pos++;
  __atomic_store_n(&x->seq, s->pos, __ATOMIC_RELEASE);
  /* A sleeping receiver waits on tail: move it, then wake. */
  if (__atomic_load_n(&s->ctrl->tail_waiters, __ATOMIC_RELAXED)) {
    __atomic_store_n(&s->ctrl->tail, s->pos, __ATOMIC_RELEASE);
    futex_wake(&s->ctrl->tail, 1, 1);
  }
  return ncclSuccess;
}

/* Receiver: slot pos is committed. */
static int slot_ready(const struct conn* c, const struct shm_conn* s) {
  return __atomic_load_n(&s->ctrl->hdr[s->pos % (uint32_t)c->nslots].seq, __ATOMIC_ACQUIRE) == s->pos + 1;
}

static const void* shm_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct shm_conn* s = c->priv;
  if (!slot_ready(c, s)) return NULL;
  uint32_t i = s->pos % (uint32_t)c->nslots;
  const struct shm_hdr* x = &s->ctrl->hdr[i];
  *h = x->h;
  if (h->bytes <= SHM_INLINE) return x->data;
  uint32_t off = x->off;
  /* The sender's word for where: it must lie in the slot (else the
   * receiver treats the slot as failed, reading nothing outside it). */
  if (off % SHM_PLACE_BYTES || h->bytes > c->slot_bytes || off > c->slot_bytes - h->bytes) {
    h->flags |= SLOT_ERROR;
    return s->data + (size_t)i * c->slot_bytes;
  }
  return s->data + (size_t)i * c->slot_bytes + off;
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

/* What the waiter waits for: released (a sender) every committed slot back,
 * else a free slot (a sender) or a committed one (a receiver). */
static int arm_ready(struct conn* c, const struct shm_conn* s, int released) {
  if (!c->is_send) return slot_ready(c, s);
  uint32_t head = __atomic_load_n(&s->ctrl->head, __ATOMIC_ACQUIRE);
  return released ? head == s->pos : (uint32_t)(s->pos - head) < (uint32_t)c->nslots;
}

/* The counter this side waits for (released: a sender waiting for every
 * committed slot back) and its waiters flag; 0 when it is ready already.
 * Otherwise the flag is raised, so the peer's next move wakes the word, and
 * the waiter keeps looking for ARM_POLL_NS after that (a move between the
 * first look and the flag would wake nobody). */
static int shm_wait_arm(struct conn* c, int released, struct futex_word* w) {
  struct shm_conn* s = c->priv;
  uint32_t* word = c->is_send ? &s->ctrl->head : &s->ctrl->tail;
  uint32_t* waiters = c->is_send ? &s->ctrl->head_waiters : &s->ctrl->tail_waiters;
  uint32_t seen = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  if (arm_ready(c, s, released)) return 0;
  __atomic_store_n(waiters, 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  /* A stop (abort, revoke, failure) set since the caller's check would be
   * woken only by transport_wake, which may have run already: look again,
   * so only a few instructions are left for a wake to be missed in. */
  if (comm_stopping(c->comm)) {
    __atomic_store_n(waiters, 0, __ATOMIC_RELAXED);
    return 0;
  }
  /* The other side looks at the flag without a fence after its store
   * (wake): keep reading until that store must have become visible. */
  int64_t t0 = time_ns();
  for (int i = 0;; i++) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != seen || arm_ready(c, s, released)) {
      __atomic_store_n(waiters, 0, __ATOMIC_RELAXED);
      return 0;
    }
    if ((i & 7) == 7 && time_ns() - t0 >= ARM_POLL_NS) break;
    cpu_relax();
  }
  *w = (struct futex_word){word, seen};
  return 1;
}

static void shm_wait_disarm(struct conn* c) {
  struct shm_conn* s = c->priv;
  __atomic_store_n(c->is_send ? &s->ctrl->head_waiters : &s->ctrl->tail_waiters, 0, __ATOMIC_RELAXED);
}

/* Sleeps on the counter this side waits for, unless it already moved. */
static void shm_wait(struct conn* c, int timeout_ms) {
  struct futex_word w;
  if (!shm_wait_arm(c, 0, &w)) return;
  futex_wait(w.word, w.val, timeout_ms, 1);
  shm_wait_disarm(c);
}

static void shm_fail(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s || !s->ctrl) return;
  uint32_t* flag = c->is_send ? &s->ctrl->send_failed : &s->ctrl->recv_failed;
  __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
  /* Wake whoever waits on either counter so it notices. */
  futex_wake(&s->ctrl->tail, 1, 1);
  futex_wake(&s->ctrl->head, 1, 1);
}

static void shm_wake(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s || !s->ctrl) return;
  futex_wake(&s->ctrl->tail, 64, 1);
  futex_wake(&s->ctrl->head, 64, 1);
}

static int shm_peer_failed(struct conn* c) {
  struct shm_conn* s = c->priv;
  return __atomic_load_n(c->is_send ? &s->ctrl->recv_failed : &s->ctrl->send_failed, __ATOMIC_ACQUIRE) != 0;
}

static void shm_close(struct conn* c) {
  struct shm_conn* s = c->priv;
  if (!s) return;
  shmseg_free(&s->seg);
  free(s);
  c->priv = NULL;
}

static int shm_pending(struct conn* c) {
  (void)c;
  return 0; /* a committed slot is already in the peer's memory */
}

/* Single copy: read or write the peer's memory (cma.c does the system calls). */
static ncclResult_t shm_peer_copy(struct conn* c, void* local, uint64_t addr, size_t bytes, int write) {
  int err = 0, pid = (int)c->comm->peers[c->peer].pid;
  if ((write ? cma_write(pid, addr, local, bytes, &err) : cma_read(pid, local, addr, bytes, &err)) == ncclSuccess)
    return ncclSuccess;
  /* The peer died (ESRCH) or passed a range that is not its memory. */
  NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
  return err_set(ncclRemoteError, "rank %d: single-copy %s of %zu bytes %s rank %d failed: %s", c->comm->rank,
                 write ? "write" : "read", bytes, write ? "to" : "from", c->peer, strerror(err));
}

static ncclResult_t shm_read_peer(struct conn* c, void* dst, uint64_t addr, size_t bytes) {
  return shm_peer_copy(c, dst, addr, bytes, 0);
}

static ncclResult_t shm_write_peer(struct conn* c, uint64_t addr, const void* src, size_t bytes) {
  return shm_peer_copy(c, (void*)src, addr, bytes, 1); /* process_vm_writev only reads the local side */
}

static int shm_unreleased(struct conn* c) {
  struct shm_conn* s = c->priv;
  return (int)(s->pos - __atomic_load_n(&s->ctrl->head, __ATOMIC_ACQUIRE));
}

/* Sender: sleeps until the receiver has released every committed slot. */
static void shm_wait_released(struct conn* c, int timeout_ms) {
  struct futex_word w;
  if (!shm_wait_arm(c, 1, &w)) return;
  futex_wait(w.word, w.val, timeout_ms, 1);
  shm_wait_disarm(c);
}

static uint64_t* shm_shared_words(struct conn* c) {
  struct shm_conn* s = c->priv;
  return s->ctrl->shared;
}

static const struct conn_ops shm_ops = {
    .send_slot = shm_send_slot,
    .send_commit = shm_send_commit,
    .recv_slot = shm_recv_slot,
    .recv_release = shm_recv_release,
    .progress = shm_progress,
    .wait = shm_wait,
    .fail = shm_fail,
    .pending = shm_pending,
    .peer_failed = shm_peer_failed,
    .close = shm_close,
    .wake = shm_wake,
    .read_peer = shm_read_peer,
    .write_peer = shm_write_peer,
    .unreleased = shm_unreleased,
    .wait_released = shm_wait_released,
    .wait_arm = shm_wait_arm,
    .wait_disarm = shm_wait_disarm,
    .shared_words = shm_shared_words,
};

static struct shm_conn* shm_alloc(struct conn* c) {
  struct shm_conn* s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->seg.fd = -1;
  /* auto: where every local rank has a CPU of its own. Ranks that take
   * turns on a CPU read and write slots on that CPU, where the lines stay
   * in its cache at the slot starts and the wider footprint only misses
   * more (4 ranks on 2 CPUs: alltoall of 8 KiB to each peer 38 us a call
   * rotating against 11 at the starts, 12 connectors of 1 MiB). */
  s->rotate = c->comm->slot_rotate == 1 || (c->comm->slot_rotate < 0 && c->comm->oversub <= 1.0);
  c->priv = s;
  c->ops = &shm_ops;
  /* Every rank agreed at init that it can read every other's memory. */
  if (c->comm->cma) c->caps |= TRANSPORT_CAP_READ_PEER_MEM;
  return s;
}

static ncclResult_t shm_recv_setup(struct conn* c, void* info, size_t* info_len) {
  if (c->nslots > SHM_MAX_SLOTS) c->nslots = SHM_MAX_SLOTS;
  struct shm_conn* s = shm_alloc(c);
  if (!s) return err_set(ncclSystemError, "shm: out of memory");
  NCCLCHECK(shmseg_create(ctrl_bytes() + (size_t)c->nslots * c->slot_bytes, "shm connector", &s->seg));
  s->ctrl = s->seg.base;
  s->data = (char*)s->seg.base + ctrl_bytes();
  /* Rotating payloads reach every page of the slots only after a lap per
   * place (256 calls of 4 KiB messages through 8 slots of 128 KiB), each
   * first touch a fault: fault them all in now. 2 ranks, alltoall of 4 KiB
   * a rank, unbound: the first 250 calls took 13 us each, the rest 1. */
  if (s->rotate) shmseg_prefault(s->seg.base, s->seg.len);
  /* Zeroed first: the padding after nslots goes to the peer too. */
  struct shm_info in;
  memset(&in, 0, sizeof(in));
  in.pid = (int32_t)getpid();
  in.fd = s->seg.fd;
  in.map_len = s->seg.len;
  in.nslots = c->nslots;
  in.slot_bytes = c->slot_bytes;
  memcpy(info, &in, sizeof(in));
  *info_len = sizeof(in);
  return ncclSuccess;
}

static ncclResult_t shm_send_connect(struct conn* c, const void* info, size_t info_len) {
  struct shm_info in;
  if (info_len != sizeof(in)) return err_set(ncclInternalError, "shm: bad connection info from rank %d", c->peer);
  memcpy(&in, info, sizeof(in));
  /* The receiver sized the segment: its numbers must describe it exactly. */
  if (in.nslots < 1 || in.nslots > SHM_MAX_SLOTS || in.slot_bytes == 0 || in.slot_bytes > ((uint64_t)1 << 31) ||
      in.map_len != ctrl_bytes() + (uint64_t)in.nslots * in.slot_bytes)
    return err_set(ncclInternalError, "shm: rank %d described an inconsistent segment (%d slots of %llu bytes, %llu "
                   "bytes in all)", c->peer, (int)in.nslots, (unsigned long long)in.slot_bytes,
                   (unsigned long long)in.map_len);
  struct shm_conn* s = shm_alloc(c);
  if (!s) return err_set(ncclSystemError, "shm: out of memory");
  c->nslots = in.nslots;
  c->slot_bytes = in.slot_bytes;
  NCCLCHECK(shmseg_open(in.pid, in.fd, in.map_len, c->peer, "shm connector", &s->seg));
  s->ctrl = s->seg.base;
  s->data = (char*)s->seg.base + ctrl_bytes();
  if (s->rotate) shmseg_prefault(s->seg.base, s->seg.len); /* its own mapping too (shmseg.h) */
  return ncclSuccess;
}

/* The sender has mapped the segment: the fd is no longer needed. */
static ncclResult_t shm_recv_connect(struct conn* c, const void* info, size_t len) {
  (void)info;
  (void)len;
  struct shm_conn* s = c->priv;
  shmseg_drop_fd(&s->seg);
  return ncclSuccess;
}

static int shm_can_connect(struct ncclComm* comm, int peer) {
  return !comm->shm_disable && comm->peers[peer].host_hash == comm->peers[comm->rank].host_hash;
}

const struct transport transport_shm = {
    .name = "shm",
    .caps = TRANSPORT_CAP_SHARED_SLOTS,
    .can_connect = shm_can_connect,
    .send = {NULL, shm_send_connect, shm_close},
    .recv = {shm_recv_setup, shm_recv_connect, shm_close},
    .ops = &shm_ops,
};
