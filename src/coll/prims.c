/* Primitives over connectors; see prims.h. */
#include "prims.h"

#include "coll.h"
#include "../failures.h"
#include "../futex.h"
#include "../graph/bind.h"

#include <sched.h>
#include <string.h>

const char* coll_name(int kind) {
  static const char* names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce",  "ncclAllGather", "ncclReduceScatter",
                                "ncclAlltoAll",  "ncclGather",    "ncclScatter", "ncclSend",      "ncclRecv"};
  return kind >= 0 && kind <= COLL_RECV ? names[kind] : "?";
}

uint64_t coll_token(const struct coll_args* a, size_t bytes) {
  /* Send and receive are the two halves of one operation. */
  uint64_t kind = (uint64_t)(a->kind == COLL_RECV ? COLL_SEND : a->kind);
  uint64_t red = a->kind == COLL_SEND || a->kind == COLL_RECV ? 0 : (uint64_t)(a->op.kind + 1 + 8 * a->avg);
  return ((uint64_t)bytes & 0xffffffffffffULL) | kind << 48 | (uint64_t)a->dt << 52 | red << 56;
}

void prim_begin(struct prim_link* l, struct conn* c, uint64_t total) {
  l->c = c;
  l->opseq = c->opseq++;
  l->total = total;
  l->out_far = 0;
  int shared = (conn_caps(c) & TRANSPORT_CAP_SHARED_SLOTS) != 0;
  l->slot_far = c->comm->slot_far && shared;
  l->ahead = c->comm->read_ahead && shared;
}

/* dst = in OP pre(local), `in` a received slot (red_reduce_far on an `ahead` link). */
static void reduce_in(const struct prim_link* r, const struct red_op* op, void* dst, const void* in, const void* local,
                      size_t count) {
  if (r->ahead) red_reduce_far(op, dst, in, local, count);
  else red_reduce(op, dst, in, local, count);
}

void prim_slot_copy(const struct prim_link* l, void* slot, const void* src, size_t bytes) {
  if (prim_slot_far(l, bytes)) red_copy_far(slot, src, bytes);
  else if (bytes) memcpy(slot, src, bytes);
}

int64_t prim_deadline(struct ncclComm* comm) {
  /* Read at init: helper threads wait too, and must not call getenv. */
  return comm->timeout_s > 0 ? time_ms() + comm->timeout_s * 1000 : -1;
}

ncclResult_t prim_sleep_checks(struct ncclComm* comm, int peer, int64_t* deadline, int board) {
  /* Abort, revoke, or a failure found elsewhere (a dead peer: health.c). */
  NCCLCHECK(comm_stop_check(comm));
  if (board) {
    ncclResult_t b = board_check(comm);
    if (b != ncclSuccess) {
      comm->broken = 1;
      return b;
    }
  }
  /* When this wait began to sleep and how much of it was counted (per
   * thread: one wait at a time): a held placement counts sleeps from 1 ms. */
  static __thread int64_t asleep_ns, counted_ns;
  if (*deadline == 0) {
    *deadline = prim_deadline(comm);
    if (bind_held()) asleep_ns = time_ns(), counted_ns = 0;
  } else if (bind_held() && asleep_ns > 0) {
    int64_t slept = time_ns() - asleep_ns;
    if (slept >= BIND_HOLD_LONG_NS) {
      bind_hold_count(slept - counted_ns, "a wait's sleep");
      counted_ns = slept;
    }
  }
  if (*deadline > 0 && time_ms() > *deadline) {
    if (peer < 0) return err_set(ncclRemoteError, "rank %d: timed out waiting for its peers (COLLIE_TIMEOUT)", comm->rank);
    return err_set(ncclRemoteError, "rank %d: timed out waiting for rank %d (%s) (COLLIE_TIMEOUT)", comm->rank, peer,
                   bootstrap_peer_host(comm->bs, peer));
  }
  return ncclSuccess;
}

int prim_conn_ready(struct conn* c) {
  struct slot_hdr h;
  return c->is_send ? c->ops->send_slot(c, 0) != NULL : c->ops->recv_slot(c, &h) != NULL;
}

/* How long a waiter on fds (sockets) keeps polling before it sleeps in poll(). */
#define SOCKET_POLL_NS 40000
/* From this message size on, a socket waiter moves off its peer's CPU only
 * every UNPAIR_LARGE_INTERVAL_NS (see prim_unpair). Beside a CPU hog, 2
 * unbound ranks a host each over loopback (5 interleaved rounds, us): moving
 * every 2 ms, allreduce 2 MiB took 1819 and 8 MiB 7027, allgather 2 MiB 967,
 * alltoall 512 KiB 226 (Open MPI 1343, 8307, 597, 226); with this limit 887,
 * 4982, 536, 149. Below it, moving pays: allreduce 8 B-128 KiB 3.7-42 us
 * against 9.4-55 without moves. */
#define SOCKET_UNPAIR_LARGE (256u << 10)

int64_t prim_fd_poll_ns(struct ncclComm* comm, int peer) {
  /* A machine with more ranks than CPUs: a waiter that polls holds the CPU
   * the rank it waits for may need (prim_fd_wait yields instead). */
  if (comm->sock_yield_ns > 0) return 0;
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank) return SOCKET_POLL_NS;
  int pc = __atomic_load_n(&comm->peer_cpu[peer], __ATOMIC_RELAXED);
  if (pc < 0) return SOCKET_POLL_NS;
  /* Polling longer when the peer last sent from another CPU was tried
   * (2 ms, as shared-memory waiters): a root that only sends has only an
   * old stamp of its receiver's CPU, and spun out 2 ms on the CPU that
   * receiver had come to share (8 MiB-256 MiB broadcast and reduce at 2
   * unbound ranks over TCP: 0.56-0.77x Open MPI against 0.87-1.0). */
  int me = sched_getcpu();
  if (me != pc) return SOCKET_POLL_NS;
  /* Two ranks that take turns on one CPU while another runs something else
   * (unbound ranks beside a CPU hog: the scheduler keeps the pair together,
   * and each polled out its 40 us before the other could run: 55 us a
   * 2-rank allreduce of 8 B against 16 us sleeping at once and 6-7 us on two
   * CPUs). */
  return prim_unpair(comm, peer, me, SOCKET_UNPAIR_LARGE) ? SOCKET_POLL_NS : 0;
}

void prim_fd_wait(struct ncclComm* comm, int peer, int ch, int64_t waited_ns) {
  int64_t poll_ns = prim_fd_poll_ns(comm, peer);
  if (waited_ns < poll_ns) return;
  /* More ranks than CPUs: every waiter runnable and yielding hands the CPU to
   * a rank with work at once; sleeping in poll() left CPUs idle while wake-ups
   * were on their way (4 ranks over loopback TCP on 2 CPUs, alltoall of 128 B:
   * 22.7 us a call against 51.6; allreduce of 4 MiB 3.4 ms against 5.3). */
  if (waited_ns < poll_ns + comm->sock_yield_ns) {
    __atomic_fetch_add(&comm->sock_yields, 1, __ATOMIC_RELAXED);
    bind_yield();
    return;
  }
  transport_wait_fds(comm, ch, 100);
}

int prim_unpair(struct ncclComm* comm, int peer, int cpu, size_t large) {
  if (!comm->unpair || comm->rank < peer) return 0;
  int64_t every = comm->op_bytes >= large ? UNPAIR_LARGE_INTERVAL_NS : UNPAIR_INTERVAL_NS;
  int64_t now = time_ns();
  int64_t last = __atomic_load_n(&comm->unpair_ns, __ATOMIC_RELAXED);
  if (now - last <= every ||
      !__atomic_compare_exchange_n(&comm->unpair_ns, &last, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return 0;
  if (bind_move_off_cpu(cpu) != 1) return 0;
  __atomic_fetch_add(&comm->unpair_moves, 1, __ATOMIC_RELAXED);
  return 1;
}

/* Is what a waiter of c waits for there: a slot (prim_conn_ready) or, for a
 * sender whose receiver reads its memory (released), every slot back? */
static int wait_done(struct conn* c, int released) {
  return released ? c->ops->unreleased(c) == 0 : prim_conn_ready(c);
}

/* How long a waiter whose peer has left keeps progressing a progress-driven
 * connector for what the peer sent before it left. */
#define LEFT_DRAIN_NS (100 * 1000 * 1000)

/* One round of waiting for connector c after `it` unsuccessful polls
 * (released: for every committed slot to come back, see wait_done).
 * wait_round2's `also` (NULL: none) is a second connector of the same channel
 * the caller waits on as well (prim_pump: a free slot to send into while data
 * is to come); a sleeping waiter then sleeps on both (wait_arm), so either
 * wakes it. */
static ncclResult_t wait_round2(struct conn* c, struct conn* also, int released, int it, int64_t* deadline,
                                int64_t* t0);

ncclResult_t prim_left_wait(struct conn* c, int released) {
  /* Look once more: what it wrote before leaving is visible by now. On a
   * transport that moves bytes by progress (a net plugin), what it sent last
   * may still be on its way when its goodbye arrives, which comes over
   * another connection (a 2-rank sweep over the test plugin failed in its
   * last allgather once in about 50 runs; a 3-rank one-shot allreduce after
   * a shrink, in p2p_run, once in about 30 runs of netplugin.kill_setup_10
   * beside a CPU hog): keep progressing a little while before calling it
   * gone. */
  if (wait_done(c, released)) return ncclSuccess;
  int64_t end = time_ns() + LEFT_DRAIN_NS;
  while ((conn_caps(c) & TRANSPORT_CAP_PROGRESS) && !c->ops->peer_failed(c) && time_ns() < end &&
         transport_progress(c->comm, c->channel) == ncclSuccess) {
    if (wait_done(c, released)) return ncclSuccess;
    sched_yield();
  }
  return comm_left_error(c->comm, c->peer);
}
static ncclResult_t wait_round(struct conn* c, int released, int it, int64_t* deadline, int64_t* t0) {
  return wait_round2(c, NULL, released, it, deadline, t0);
}

/* Sleeps on both connectors at once (their futex words) at most timeout_ms;
 * 0 when one of them does not offer it (the caller sleeps on c alone). */
static int wait_both(struct conn* c, struct conn* also, int timeout_ms) {
  if (!c->ops->wait_arm || !also->ops->wait_arm) return 0;
  struct futex_word w[2];
  int armed = 0;
  if (c->ops->wait_arm(c, 0, &w[0])) {
    armed = 1;
    if (also->ops->wait_arm(also, 0, &w[1])) armed = 2;
  }
  if (armed == 2 && !comm_stopping(c->comm)) (void)futex_wait_any(w, 2, timeout_ms, 1);
  if (armed >= 1) c->ops->wait_disarm(c);
  if (armed == 2) also->ops->wait_disarm(also);
  return 1;
}

static ncclResult_t wait_round2(struct conn* c, struct conn* also, int released, int it, int64_t* deadline,
                                int64_t* t0) {
  struct ncclComm* comm = c->comm;
  if (c->ops->peer_failed(c)) {
    NCCLCHECK(comm_await_cause(comm, CAUSE_WAIT_MS));
    return err_set(ncclRemoteError, "rank %d: rank %d (%s) failed or left during the operation", comm->rank, c->peer,
                   bootstrap_peer_host(comm->bs, c->peer));
  }
  if (conn_caps(c) & TRANSPORT_CAP_PROGRESS) {
    NCCLCHECK(transport_progress(comm, c->channel));
    /* What progress just read (or sent) may be exactly what we wait for:
     * let the caller look again before anything sleeps. */
    if (wait_done(c, released)) return ncclSuccess;
  }
  /* Bytes that move by system call (sockets): nothing to gain by polling in
   * user space (the kernel must run to move bytes, and polling with system
   * calls takes its CPU): sleep in poll() on every fd of the channel until
   * one can move bytes. */
  if (conn_caps(c) & TRANSPORT_CAP_POLLFD) {
    NCCLCHECK(prim_sleep_checks(comm, c->peer, deadline, it % 64 == 63));
    /* A reply to a small message comes within tens of microseconds: keep
     * progressing that long (latency), then sleep (bandwidth). */
    int64_t now = time_ns();
    if (*t0 == 0) *t0 = now;
    prim_fd_wait(comm, c->peer, c->channel, now - *t0);
    return ncclSuccess;
  }
  if (comm_keep_polling(comm, it, t0)) {
    /* A peer on this CPU cannot run while this rank spins (unbound ranks
     * that a CPU hog crowded onto one CPU): hand it the CPU. */
    if (it >= comm_min_polls(comm) && (it & 15) == 0) NCCLCHECK(board_give_way(comm, c->peer));
    cpu_relax();
    return ncclSuccess;
  }
  /* The channel's connectors that move bytes only by progress (sockets of
   * a ring that also crosses shared memory) need this rank too while it
   * waits here: push them before every yield and sleep, and sleep briefly
   * while they hold something (transport_push; a connector of that kind
   * progressed the channel above). */
  int owed = 0;
  if (!(conn_caps(c) & TRANSPORT_CAP_PROGRESS)) NCCLCHECK(transport_push(comm, c->channel, &owed));
  if (owed && wait_done(c, released)) return ncclSuccess;
  /* Polling is over: a few yields (the peer may be runnable on this CPU),
   * then every round sleeps (the deadline is set on the first such round). */
  if (*deadline == 0 && it % 16 != 15) {
    /* On a crowded CPU each yield may cost a whole round of the run queue:
     * look at the stop flags (three loads) before every one. */
    NCCLCHECK(comm_stop_check(comm));
    /* Channel 0 runs on the calling thread; helpers of the others are pinned. */
    if (c->channel == 0) board_spread(comm);
    bind_yield();
    return ncclSuccess;
  }
  NCCLCHECK(prim_sleep_checks(comm, c->peer, deadline, 1));
  if (health_peer_left(comm, c->peer)) return prim_left_wait(c, released);
  int ms = owed ? 1 : 100;
  if (released) c->ops->wait_released(c, ms);
  else if (!also || !wait_both(c, also, ms)) c->ops->wait(c, ms);
  return ncclSuccess;
}

ncclResult_t prim_send_slot(struct prim_link* l, size_t bytes, void** slot) {
  int64_t deadline = 0, t0 = 0;
  for (int it = 0;; it++) {
    void* p = l->c->ops->send_slot(l->c, bytes);
    if (p) {
      *slot = p;
      return ncclSuccess;
    }
    NCCLCHECK(wait_round(l->c, 0, it, &deadline, &t0));
  }
}

ncclResult_t prim_send_drain(struct prim_link* l) {
  int64_t deadline = 0, t0 = 0;
  for (int it = 0; !wait_done(l->c, 1); it++) NCCLCHECK(wait_round(l->c, 1, it, &deadline, &t0));
  return ncclSuccess;
}

ncclResult_t prim_send_commit(struct prim_link* l, size_t bytes) {
  struct slot_hdr h = {l->opseq, l->total, (uint32_t)bytes, 0};
  return l->c->ops->send_commit(l->c, &h);
}

ncclResult_t prim_recv_slot(struct prim_link* l, size_t bytes, const void** slot) {
  int64_t deadline = 0, t0 = 0;
  struct conn* c = l->c;
  for (int it = 0;; it++) {
    struct slot_hdr h;
    const void* p = c->ops->recv_slot(c, &h);
    if (p) {
      if (h.flags & SLOT_ERROR) {
        NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
        return err_set(ncclRemoteError, "rank %d: rank %d reported an error in this operation (see its log)",
                       c->comm->rank, c->peer);
      }
      if (h.opseq != l->opseq || h.total != l->total || h.bytes != bytes)
        return err_set(ncclInvalidUsage,
                       "rank %d: rank %d's call does not match this one (its operation #%llu: %s of %llu bytes of %s, "
                       "slot of %u bytes; here #%llu: %s of %llu bytes of %s, slot of %zu): ranks passed different "
                       "counts, datatypes, operators or collectives",
                       c->comm->rank, c->peer, (unsigned long long)h.opseq, coll_name((int)(h.total >> 48 & 0xf)),
                       (unsigned long long)(h.total & 0xffffffffffffULL), dtype_name((ncclDataType_t)(h.total >> 52 & 0xf)),
                       h.bytes, (unsigned long long)l->opseq, coll_name((int)(l->total >> 48 & 0xf)),
                       (unsigned long long)(l->total & 0xffffffffffffULL),
                       dtype_name((ncclDataType_t)(l->total >> 52 & 0xf)), bytes);
      *slot = p;
      return ncclSuccess;
    }
    NCCLCHECK(wait_round(c, 0, it, &deadline, &t0));
  }
}

ncclResult_t prim_recv_release(struct prim_link* l) { return l->c->ops->recv_release(l->c); }

/* Fills the acquired send slot with `bytes` from src and publishes it: the
 * op's pre-multiplication applied when op is a PreMulSum (into the slot),
 * else straight from src where bytes leave by system call, else copied. */
static ncclResult_t send_fill(struct prim_link* s, void* slot, const struct red_op* op, const void* src,
                              size_t bytes) {
  if (op && op->kind == RED_PREMULSUM) {
    if (bytes) red_pre(op, slot, src, bytes / dtype_size(op->dt));
    return prim_send_commit(s, bytes);
  }
  if (s->c->ops->send_commit_ext && bytes) {
    struct slot_hdr h = {s->opseq, s->total, (uint32_t)bytes, 0};
    return s->c->ops->send_commit_ext(s->c, &h, src);
  }
  prim_slot_copy(s, slot, src, bytes);
  return prim_send_commit(s, bytes);
}

ncclResult_t prim_send(struct prim_link* s, const void* src, size_t bytes) {
  void* slot;
  NCCLCHECK(prim_send_slot(s, bytes, &slot));
  return send_fill(s, slot, NULL, src, bytes);
}

ncclResult_t prim_send_tee(struct prim_link* s, const void* src, size_t bytes, void* tee) {
  NCCLCHECK(prim_send(s, src, bytes));
  if (tee && bytes) memcpy(tee, src, bytes);
  return ncclSuccess;
}

ncclResult_t prim_send_pre(struct prim_link* s, const struct red_op* op, const void* src, size_t count) {
  void* slot;
  NCCLCHECK(prim_send_slot(s, count * dtype_size(op->dt), &slot));
  return send_fill(s, slot, op, src, count * dtype_size(op->dt));
}

ncclResult_t prim_recv(struct prim_link* r, void* dst, size_t bytes) {
  const void* slot;
  if (r->c->ops->recv_post && bytes) r->c->ops->recv_post(r->c, dst, bytes);
  NCCLCHECK(prim_recv_slot(r, bytes, &slot));
  if (bytes && slot != dst) {
    prim_copy_out(dst, slot, bytes, r->out_far);
  }
  return prim_recv_release(r);
}

/* Sends pump item i if a slot is free; *moved says whether it went. */
static ncclResult_t pump_send(const struct prim_pump* p, const struct pump_item* it, int* moved) {
  void* slot = p->s->c->ops->send_slot(p->s->c, it->bytes);
  if (!slot) return ncclSuccess;
  *moved = 1;
  NCCLCHECK(send_fill(p->s, slot, it->pre ? p->op : NULL, it->src, it->bytes));
  if (it->tee && it->bytes) memcpy(it->tee, it->src, it->bytes);
  return ncclSuccess;
}

/* Receives pump item i if its slot has arrived. */
static ncclResult_t pump_recv(const struct prim_pump* p, const struct pump_item* it, int* moved) {
  struct prim_link* r = p->r;
  struct slot_hdr h;
  if (!it->local && it->bytes && r->c->ops->recv_post) r->c->ops->recv_post(r->c, it->dst, it->bytes);
  if (!r->c->ops->recv_slot(r->c, &h)) return ncclSuccess;
  *moved = 1;
  if (it->local)
    return prim_recv_reduce_copy(r, NULL, p->op, it->local, it->dst, it->bytes / dtype_size(p->op->dt), p->avg_n);
  return prim_recv(r, it->dst, it->bytes); /* checks the header, copies, releases */
}

ncclResult_t prim_pump(const struct prim_pump* p) {
  struct ncclComm* comm = p->s->c->comm;
  int si = 0, ri = 0, it = 0;
  int64_t deadline = 0, t0 = 0;
  struct pump_item sit, rit;
  while (si < p->nsend || ri < p->nrecv) {
    int moved = 0, send_ready = 0;
    if (conn_caps(p->s->c) & TRANSPORT_CAP_PROGRESS) NCCLCHECK(transport_progress(comm, p->s->c->channel));
    /* Receiving first: it waits for nothing of this rank's. */
    for (; ri < p->nrecv; ri++) {
      int m = 0;
      p->item(p, 0, ri, &rit);
      NCCLCHECK(pump_recv(p, &rit, &m));
      if (!m) break;
      moved = 1;
    }
    for (; si < p->nsend; si++) {
      int m = 0;
      p->item(p, 1, si, &sit);
      if (sit.after > ri) break;
      send_ready = 1;
      NCCLCHECK(pump_send(p, &sit, &m));
      if (!m) break;
      moved = 1;
    }
    if (moved) {
      it = 0;
      t0 = 0;
      continue;
    }
    /* Nothing moved: wait for the next slot to receive and, when the next
     * send only lacks a free slot, for that as well (a socket waiter sleeps
     * on every fd of the channel either way). */
    if (ri < p->nrecv)
      NCCLCHECK(wait_round2(p->r->c, si < p->nsend && send_ready ? p->s->c : NULL, 0, it++, &deadline, &t0));
    else
      NCCLCHECK(wait_round(p->s->c, 0, it++, &deadline, &t0));
  }
  return ncclSuccess;
}

struct exchange_arg {
  const char* src;
  char* dst, *tee;
  size_t sbytes, rbytes, chunk;
};

static void exchange_item(const struct prim_pump* p, int is_send, int i, struct pump_item* it) {
  const struct exchange_arg* x = p->arg;
  size_t off = (size_t)i * x->chunk;
  *it = (struct pump_item){0};
  if (is_send) {
    it->src = x->src + off;
    it->tee = x->tee ? x->tee + off : NULL;
    it->bytes = COLLIE_MIN(x->chunk, x->sbytes - off);
  } else {
    it->dst = x->dst + off;
    it->bytes = COLLIE_MIN(x->chunk, x->rbytes - off);
  }
}

static int pump_slots(size_t bytes, size_t chunk) { return (int)((bytes + chunk - 1) / chunk); }

ncclResult_t prim_exchange(struct prim_link* s, const char* src, size_t sbytes, struct prim_link* r, char* dst,
                           size_t rbytes, size_t chunk, char* tee) {
  struct exchange_arg x = {src, dst, tee, sbytes, rbytes, chunk};
  struct prim_pump p = {s, r, pump_slots(sbytes, chunk), pump_slots(rbytes, chunk), NULL, 0, exchange_item, &x};
  return prim_pump(&p);
}

ncclResult_t prim_recv_copy_send(struct prim_link* r, struct prim_link* s, void* dst, size_t bytes) {
  const void* in;
  void* out;
  if (dst && bytes && r->c->ops->recv_post) r->c->ops->recv_post(r->c, dst, bytes);
  NCCLCHECK(prim_recv_slot(r, bytes, &in));
  if (dst && s->c->ops->send_commit_ext) {
    /* Forward from the destination: it holds the same bytes and stays put. */
    if (bytes && in != dst) memcpy(dst, in, bytes);
    NCCLCHECK(prim_recv_release(r));
    return prim_send(s, dst, bytes);
  }
  NCCLCHECK(prim_send_slot(s, bytes, &out));
  if (bytes) {
    prim_slot_copy(s, out, in, bytes);
    if (dst && dst != in) prim_copy_out(dst, in, bytes, r->out_far);
  }
  NCCLCHECK(prim_send_commit(s, bytes));
  return prim_recv_release(r);
}

ncclResult_t prim_recv_reduce_send(struct prim_link* r, struct prim_link* s, const struct red_op* op,
                                   const void* local, size_t count) {
  size_t bytes = count * dtype_size(op->dt);
  const void* in;
  void* out;
  NCCLCHECK(prim_recv_slot(r, bytes, &in));
  NCCLCHECK(prim_send_slot(s, bytes, &out));
  if (count) {
    if (prim_slot_far(s, bytes)) red_reduce_out(op, out, NULL, in, local, count, 1, r->ahead);
    else reduce_in(r, op, out, in, local, count);
  }
  NCCLCHECK(prim_send_commit(s, bytes));
  return prim_recv_release(r);
}

ncclResult_t prim_recv_reduce_copy(struct prim_link* r, struct prim_link* s, const struct red_op* op,
                                   const void* local, void* dst, size_t count, int avg_n) {
  size_t bytes = count * dtype_size(op->dt);
  const void* in;
  NCCLCHECK(prim_recv_slot(r, bytes, &in));
  if (r->out_far && count && dst != local && dst != in) {
    /* The result goes to memory: stream it there; a shared-memory send slot
     * (read again at once) takes it from the same pass where this machine
     * runs that pass faster (OUT_FAR_FUSE, graph/tuning.c). A transport that
     * sends from the caller's memory (send_commit_ext) reads dst, so it
     * keeps the plain path. */
    if (!s) {
      red_reduce_out(op, dst, NULL, in, local, count, avg_n, r->ahead);
      return prim_recv_release(r);
    }
    if (!s->c->ops->send_commit_ext && (r->out_far & OUT_FAR_FUSE)) {
      void* out;
      NCCLCHECK(prim_send_slot(s, bytes, &out));
      red_reduce_out(op, dst, out, in, local, count, avg_n, r->ahead);
      NCCLCHECK(prim_send_commit(s, bytes));
      return prim_recv_release(r);
    }
  }
  if (count) {
    reduce_in(r, op, dst, in, local, count);
    if (avg_n > 1) red_div(op->dt, dst, dst, count, avg_n);
  }
  NCCLCHECK(prim_recv_release(r));
  if (s) NCCLCHECK(prim_send(s, dst, bytes));
  return ncclSuccess;
}

ncclResult_t prim_fail(struct ncclComm* comm, ncclResult_t res) {
  transport_poison(comm);
  return res;
}
