/* Point-to-point batches and the collectives built from them (alltoall,
 * gather, scatter). Every op of a batch advances whenever its connector has
 * room or data, so a group of sends and receives completes in any posting
 * order. Messages go slot by slot; an empty message still sends one empty
 * slot so the receiver can check that the sizes agree. */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "../failures.h"
#include "../futex.h"
#include "../graph/bind.h"

static int nslots_for(size_t bytes, size_t slot) { return bytes == 0 ? 1 : (int)((bytes + slot - 1) / slot); }

ncclResult_t p2p_self_pairs(struct ncclComm* comm, const struct p2p_op* ops, int n,
                            ncclResult_t (*move)(void* arg, const struct p2p_op* send, const struct p2p_op* recv),
                            void* arg) {
  int s = 0, r = 0;
  for (;;) {
    while (s < n && !(ops[s].peer == comm->rank && ops[s].is_send)) s++;
    while (r < n && !(ops[r].peer == comm->rank && !ops[r].is_send)) r++;
    if (s == n && r == n) return ncclSuccess;
    if (s == n || r == n)
      return err_set(ncclInvalidUsage, "rank %d: a send to itself has no matching receive (or vice versa) in the group",
                     comm->rank);
    if (ops[s].bytes != ops[r].bytes)
      return err_set(ncclInvalidUsage, "rank %d: send to self of %zu bytes but receive from self of %zu bytes",
                     comm->rank, ops[s].bytes, ops[r].bytes);
    if (move && ops[s].bytes && ops[r].buf != ops[s].buf) NCCLCHECK(move(arg, &ops[s], &ops[r]));
    s++;
    r++;
  }
}

/* A copy to self. Where the collective's results bypass the cache
 * (out_far: its buffers do not fit the host's cache) the copy does too: no
 * line of the destination is read before it is written. 2 ranks, alltoall,
 * unbound, medians of 5 interleaved rounds (bench/ab_env.sh, us, plain /
 * non-temporal / Open MPI): 32 MiB 5066 / 4133 / 5703, 128 MiB 24960 / 21022
 * / 25139 (docs/BENCHMARKS.md, sixty-fourth session). */
static ncclResult_t host_move(void* arg, const struct p2p_op* send, const struct p2p_op* recv) {
  (void)arg;
  size_t n = send->bytes;
  if (recv->buf + n <= send->buf || send->buf + n <= recv->buf) prim_copy_out(recv->buf, send->buf, n, recv->far);
  else memmove(recv->buf, send->buf, n); /* overlapping buffers of the caller's */
  return ncclSuccess;
}

/* Self-messages on host buffers: `copy` 0 only checks that they pair up; 1 copies. */
static ncclResult_t run_self(struct ncclComm* comm, struct p2p_op* ops, int n, int copy) {
  return p2p_self_pairs(comm, ops, n, copy ? host_move : NULL, NULL);
}

static int has_self(struct ncclComm* comm, const struct p2p_op* ops, int n) {
  for (int i = 0; i < n; i++)
    if (ops[i].peer == comm->rank && ops[i].bytes) return 1;
  return 0;
}

/* A single-copy sender waits for its descriptor to be released: only then
 * has the receiver finished reading its buffer. */
static int cma_awaiting_release(const struct p2p_op* op) { return op->cma && op->is_send && op->slots_done == 1; }

/* Single copy: the sender commits a descriptor of its buffer and waits until
 * the receiver, which reads the bytes straight from it, releases the slot. */
static ncclResult_t step_cma(struct p2p_op* op, int* moved) {
  struct conn* c = op->link.c;
  if (op->is_send) {
    if (op->slots_done == 0) {
      void* p = c->ops->send_slot(c, sizeof(struct cma_desc));
      if (!p) return ncclSuccess;
      struct cma_desc d = {(uint64_t)(uintptr_t)op->buf, op->bytes};
      memcpy(p, &d, sizeof(d));
      struct slot_hdr h = {op->link.opseq, op->link.total, (uint32_t)sizeof(d), SLOT_CMA};
      NCCLCHECK(c->ops->send_commit(c, &h));
      op->slots_done = 1;
      *moved = 1;
    }
    if (op->slots_done == 1 && c->ops->unreleased(c) == 0) {
      op->slots_done = 2;
      op->done = op->bytes;
      *moved = 1;
    }
    return ncclSuccess;
  }
  struct slot_hdr h;
  if (!c->ops->recv_slot(c, &h)) return ncclSuccess;
  const void* data;
  NCCLCHECK(prim_recv_slot(&op->link, sizeof(struct cma_desc), &data)); /* checks the header: same call, sizes */
  struct cma_desc d;
  memcpy(&d, data, sizeof(d));
  if (!(h.flags & SLOT_CMA) || d.bytes != op->bytes)
    return err_set(ncclInvalidUsage, "rank %d: rank %d's single-copy message (%llu bytes) does not match this receive of "
                   "%zu bytes", c->comm->rank, c->peer, (unsigned long long)d.bytes, op->bytes);
  NCCLCHECK(c->ops->read_peer(c, op->buf, d.addr, op->bytes));
  NCCLCHECK(prim_recv_release(&op->link));
  op->slots_done = 1;
  op->done = op->bytes;
  *moved = 1;
  return ncclSuccess;
}

/* Advances one op as far as its connector allows; returns 1 if it moved. */
static ncclResult_t step(struct p2p_op* op, size_t slot, int* moved) {
  struct conn* c = op->link.c;
  if (op->cma) return step_cma(op, moved);
  while (op->slots_done < op->nslots) {
    size_t len = COLLIE_MIN(slot, op->bytes - op->done);
    if (op->is_send) {
      void* p = c->ops->send_slot(c, len);
      if (!p) break;
      if (len && op->devmem) {
        /* GPUDirect RDMA: the NIC reads the device buffer; the CPU never does. */
        struct slot_hdr h = {op->link.opseq, op->link.total, (uint32_t)len, 0};
        NCCLCHECK(c->ops->send_commit_dev(c, &h, op->buf + op->done));
      } else if (len && c->ops->send_commit_ext) {
        /* Bytes leave by system call: straight from the caller's buffer. */
        struct slot_hdr h = {op->link.opseq, op->link.total, (uint32_t)len, 0};
        NCCLCHECK(c->ops->send_commit_ext(c, &h, op->buf + op->done));
      } else {
        prim_slot_copy(&op->link, p, op->buf + op->done, len);
        NCCLCHECK(prim_send_commit(&op->link, len));
      }
    } else {
      struct slot_hdr h;
      /* Bytes not arrived yet may land straight in the caller's buffer. */
      if (len && c->ops->recv_post) c->ops->recv_post(c, op->buf + op->done, len);
      const void* p = c->ops->recv_slot(c, &h);
      if (!p) break;
      const void* data;
      NCCLCHECK(prim_recv_slot(&op->link, len, &data)); /* checks the header */
      if (len && data != op->buf + op->done) memcpy(op->buf + op->done, data, len);
      NCCLCHECK(prim_recv_release(&op->link));
    }
    op->done += len;
    op->slots_done++;
    *moved = 1;
  }
  return ncclSuccess;
}

/* Before the first read of the sockets (transport_progress reads whatever
 * has arrived), the first receive on each connector posts where its first
 * slot's payload goes, so the bytes land in the caller's buffer, not in the
 * slot buffer and then again in the caller's. From then on step() posts each
 * next slot before it looks for it. */
static void post_first_receives(struct ncclComm* comm, struct p2p_op* ops, int n, size_t slot, char* seen) {
  memset(seen, 0, (size_t)comm->nranks * 2);
  for (int i = 0; i < n; i++) {
    struct p2p_op* op = &ops[i];
    if (op->peer == comm->rank || op->is_send || seen[2 * op->peer + 1]) continue;
    seen[2 * op->peer + 1] = 1;
    struct conn* c = op->link.c;
    size_t len = COLLIE_MIN(slot, op->bytes);
    if (!op->cma && len && c->ops->recv_post) c->ops->recv_post(c, op->buf, len);
  }
}

/* Batches up to this many ops on communicators up to this many ranks keep
 * their bookkeeping on the stack: five allocations per small message cost
 * more than moving it. */
#define P2P_STACK_OPS 32

/* A waiter for several connectors sleeps until any of them moves (all
 * their futex words at once, futex_waitv), at most 1 ms. Sleeping on one of
 * them (the last blocked), a peer that freed a slot or filled one on another
 * woke nobody: its transfer stalled until the timeout. Measured with 3 ranks
 * on 2 CPUs, COLLIE_CMA=0 (the FIFO, as where single copy is refused): rank
 * 0 receives 16 MiB from rank 1 and 4 bytes from rank 2, which calls 50 ms
 * late; rank 1's send took 2.0 ms against 3.0-3.6 sleeping on rank 2's
 * connector (64 MiB: 8.2 against 9-10.8). Returns 0 when a connector does
 * not offer it or the kernel lacks futex_waitv (the caller sleeps on one),
 * 1 when it slept or found one ready. */
#define SLEEP_MAX 64
static int sleep_any(struct ncclComm* comm, struct p2p_op** ops, int n) {
  struct futex_word w[SLEEP_MAX];
  int armed = 0, ready = 0;
  for (int i = 0; i < n; i++)
    if (!ops[i]->link.c->ops->wait_arm) return 0;
  for (; armed < n; armed++) {
    struct conn* c = ops[armed]->link.c;
    if (!c->ops->wait_arm(c, cma_awaiting_release(ops[armed]), &w[armed])) {
      ready = 1;
      break;
    }
  }
  int slept = ready || comm_stopping(comm) || futex_wait_any(w, armed, 1, 1) == 0;
  for (int i = 0; i < armed; i++) ops[i]->link.c->ops->wait_disarm(ops[i]->link.c);
  return slept;
}

/* After polling, a waiter whose rank has a CPU of its own (comm->spin_ns >
 * 0: no more local ranks than CPUs) goes on yielding until this long after
 * its polling ended before it sleeps. A rank that sleeps leaves its CPU
 * idle, and the kernel pulls a busy process waiting beside the other rank
 * onto it: beside a CPU hog, 2 bound ranks of a 2 MiB alltoall each ran 60% of the time (229 of
 * 381 us a call, bench/explain_miss.sh), the hog going to whichever rank
 * slept, where Open MPI's ranks, which never sleep, ran 100% and 47% (the
 * hog stayed beside one). Beside the hog, 2 ranks, medians, us, 5 ms of
 * yields / 16 yields / Open MPI (bench/ab_env.sh, 7 rounds): allgather
 * bound 512 KiB 34.1 / 36.7 / 36.2, 2 MiB 287 / 316 / 283, 8 MiB 1286 /
 * 1431 / 1427; unbound 33.1 / 34.9 / 35.4, 289 / 303 / 305, 1157 / 1393 /
 * 1417; alltoall bound (5 rounds) 32.1 / 34.1 / 34.7, 324 / 345 / 388, 1562
 * / 1750 / 1539; 20 ms and never sleeping were no better than 5. A longer
 * wait (a peer still computing) sleeps as before. */
#define P2P_YIELD_NS 5000000

ncclResult_t p2p_run(struct ncclComm* comm, struct p2p_op* ops, int n, int p2p_only) {
  NCCLCHECK(run_self(comm, ops, n, 0));
  /* The copies to self wait until the first time the peers' messages do
   * not move (a full socket, a peer not there yet): they fill that wait
   * instead of delaying every peer's first bytes. */
  int self_left = has_self(comm, ops, n);
  int speers_s[P2P_STACK_OPS + 1], rpeers_s[P2P_STACK_OPS + 1];
  struct conn *sc_s[P2P_STACK_OPS + 1], *rc_s[P2P_STACK_OPS + 1];
  char seen_s[2 * P2P_STACK_OPS];
  int on_stack = n <= P2P_STACK_OPS && comm->nranks <= P2P_STACK_OPS;
  int* speers = on_stack ? speers_s : malloc(sizeof(int) * (size_t)(n + 1));
  int* rpeers = on_stack ? rpeers_s : malloc(sizeof(int) * (size_t)(n + 1));
  struct conn** sc = on_stack ? sc_s : malloc(sizeof(*sc) * (size_t)(n + 1));
  struct conn** rc = on_stack ? rc_s : malloc(sizeof(*rc) * (size_t)(n + 1));
  char* seen = on_stack ? seen_s : calloc((size_t)comm->nranks * 2, 1);
  if (on_stack) memset(seen_s, 0, sizeof(seen_s));
  ncclResult_t res = ncclSuccess;
  if (!speers || !rpeers || !sc || !rc || !seen) {
    res = err_set(ncclSystemError, "out of memory in a point-to-point group");
    goto out;
  }
  int ns = 0, nr = 0;
  for (int i = 0; i < n; i++) {
    int p = ops[i].peer;
    if (p == comm->rank) continue;
    if (ops[i].is_send && !seen[2 * p]) {
      seen[2 * p] = 1;
      speers[ns++] = p;
    } else if (!ops[i].is_send && !seen[2 * p + 1]) {
      seen[2 * p + 1] = 1;
      rpeers[nr++] = p;
    }
  }
  NCCLCHECKGOTO(transport_connect(comm, speers, ns, rpeers, nr, sc, rc), res, out);
  /* Ops to the same peer in the same direction run one after the other. */
  int active = 0;
  for (int i = 0; i < n; i++) {
    struct p2p_op* op = &ops[i];
    if (op->peer == comm->rank) continue;
    struct conn* c = op->is_send ? comm->send_conns[op->peer] : comm->recv_conns[op->peer];
    prim_begin(&op->link, c, op->token);
    op->done = 0;
    op->slots_done = 0;
    /* Both sides decide alike: same caps (agreed at init), same size (or the token differs). */
    op->cma = (conn_caps(c) & TRANSPORT_CAP_READ_PEER_MEM) &&
              ((op->single_copy && op->bytes > 0) || p2p_cma(comm, op->bytes, op->footprint));
    if (op->devmem && (!c->ops->send_commit_dev || op->cma)) {
      res = err_set(ncclInternalError, "rank %d: a send of device memory to rank %d was not staged, but its %s "
                    "connector cannot read device memory", comm->rank, op->peer, conn_transport_name(c));
      goto out;
    }
    op->nslots = op->cma ? (op->is_send ? 2 : 1) : nslots_for(op->bytes, comm->slot_bytes);
    active++;
  }
  post_first_receives(comm, ops, n, comm->slot_bytes, seen);
  int idle = 0, yields = 0, spun_out = 0;
  int64_t deadline = 0, t0 = 0;
  struct p2p_op* sleep_on[SLEEP_MAX];
  while (active > 0 && res == ncclSuccess) {
    int moved = 0;
    /* Pull in what the sockets hold first, so the steps below see it. */
    if ((res = transport_progress(comm, 0)) != ncclSuccess) break;
    active = 0;
    memset(seen, 0, (size_t)comm->nranks * 2);
    struct conn* blocked = NULL;
    struct p2p_op* blocked_op = NULL;
    int nblocked = 0;
    for (int i = 0; i < n && res == ncclSuccess; i++) {
      struct p2p_op* op = &ops[i];
      if (op->peer == comm->rank || op->slots_done == op->nslots) continue;
      char* busy = &seen[2 * op->peer + !op->is_send];
      active++;
      if (*busy) continue; /* an earlier op on this connector is not finished */
      *busy = 1;
      res = step(op, comm->slot_bytes, &moved);
      if (op->slots_done < op->nslots) {
        blocked = op->link.c;
        blocked_op = op;
        if (nblocked < SLEEP_MAX) sleep_on[nblocked++] = op;
        if (blocked->ops->peer_failed(blocked) && (res = comm_await_cause(comm, CAUSE_WAIT_MS)) == ncclSuccess)
          res = err_set(ncclRemoteError, "rank %d: rank %d (%s) failed or left during a point-to-point group",
                        comm->rank, op->peer, bootstrap_peer_host(comm->bs, op->peer));
      } else {
        active--;
      }
    }
    if (res != ncclSuccess || active == 0) break;
    if (!moved && self_left) {
      self_left = 0;
      (void)run_self(comm, ops, n, 1); /* paired up at the start */
      moved = 1;
    }
    if (moved) {
      idle = yields = spun_out = 0;
      t0 = 0;
      continue;
    }
    if (blocked && (conn_caps(blocked) & TRANSPORT_CAP_POLLFD)) {
      /* Sockets: sleep in poll() until some connection can move bytes. */
      if ((res = prim_sleep_checks(comm, -1, &deadline, !p2p_only && ++idle % 64 == 0)) != ncclSuccess) break;
      /* Keep progressing for a short while (small replies come fast), then sleep. */
      int64_t now = time_ns();
      if (t0 == 0) t0 = now;
      prim_fd_wait(comm, blocked->peer, 0, now - t0);
      continue;
    }
    /* While polling, the clock is read every 8th poll only (a read costs as
     * much as a poll and delayed seeing the peer's slot: a tenth of a
     * 2-rank 8-byte send/receive loop's samples); once over, polling stays
     * over until something moves. */
    ++idle;
    if (!spun_out && ((t0 != 0 && (idle & 7) != 0) || comm_keep_polling(comm, idle, &t0))) {
      /* A blocked peer on this CPU cannot run while this rank spins. */
      if (idle >= comm_min_polls(comm) && (idle & 15) == 0 && blocked &&
          (res = board_give_way(comm, blocked->peer)) != ncclSuccess)
        break;
      continue;
    }
    spun_out = 1;
    /* t0: when the polling began (comm_keep_polling set it before it ended). */
    if (yields++ < 16 || (comm->spin_ns > 0 && time_ns() - t0 < comm->spin_ns + P2P_YIELD_NS)) {
      if ((res = comm_stop_check(comm)) != ncclSuccess) break; /* a yield may be long on a crowded CPU */
      board_spread(comm);
      bind_yield();
      continue;
    }
    if ((res = prim_sleep_checks(comm, -1, &deadline, !p2p_only)) != ncclSuccess) break;
    /* Several connectors may be pending: sleep briefly on one of them. */
    int releasing = blocked_op && cma_awaiting_release(blocked_op);
    if (blocked && health_peer_left(comm, blocked->peer)) {
      if ((res = prim_left_wait(blocked, releasing)) != ncclSuccess) break;
      continue;
    }
    if (nblocked > 1 && sleep_any(comm, sleep_on, nblocked)) continue;
    if (blocked && releasing) blocked->ops->wait_released(blocked, 1);
    else if (blocked) blocked->ops->wait(blocked, 1);
  }
  if (res == ncclSuccess && self_left) res = run_self(comm, ops, n, 1);
  if (res != ncclSuccess) transport_poison(comm);
out:
  if (!on_stack) {
    free(speers);
    free(rpeers);
    free(sc);
    free(rc);
    free(seen);
  }
  return res;
}

/* The op arrays of alltoall, gather and scatter (2n ops at most): on the
 * stack up to this many ranks. */
#define OPS_STACK_RANKS 8

static struct p2p_op* ops_get(int n, struct p2p_op* stack) {
  return n <= OPS_STACK_RANKS ? stack : malloc(sizeof(struct p2p_op) * (size_t)(2 * n));
}

static ncclResult_t run_ops(struct coll_args* a, struct p2p_op* ops, int n, struct p2p_op* stack) {
  ncclResult_t res = p2p_run(a->comm, ops, n, 0);
  if (ops != stack) free(ops);
  return res;
}

ncclResult_t p2p_alltoall(struct coll_args* a, int single_copy) {
  int n = a->comm->nranks, r = a->comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  /* Every rank's send, slots and receive buffers: n messages each. */
  size_t fp = 3 * (size_t)n * bytes * (size_t)a->comm->max_local;
  if (bytes == 0) return ncclSuccess;
  struct p2p_op stack[2 * OPS_STACK_RANKS];
  struct p2p_op* ops = ops_get(n, stack);
  if (!ops) return err_set(ncclSystemError, "out of memory in alltoall");
  int k = 0;
  /* Start with the next rank and go around, so ranks do not all hit the same peer. */
  for (int i = 0; i < n; i++) {
    int p = (r + i) % n;
    ops[k++] = (struct p2p_op){.peer = p, .is_send = 1, .buf = (char*)a->sendbuff + (size_t)p * bytes,
                               .bytes = bytes, .footprint = fp, .token = coll_token(a, bytes),
                               .single_copy = single_copy};
    int q = (r - i + n) % n;
    ops[k++] = (struct p2p_op){.peer = q, .is_send = 0, .buf = (char*)a->recvbuff + (size_t)q * bytes,
                               .bytes = bytes, .footprint = fp, .token = coll_token(a, bytes),
                               .single_copy = single_copy, .far = a->out_far != 0};
  }
  return run_ops(a, ops, k, stack);
}

static ncclResult_t direct_gather(struct coll_args* a) {
  int n = a->comm->nranks, r = a->comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  struct p2p_op stack[2 * OPS_STACK_RANKS];
  struct p2p_op* ops = ops_get(n, stack);
  if (!ops) return err_set(ncclSystemError, "out of memory in gather");
  int k = 0;
  /* No footprint: single copy would have the root read every block itself,
   * one after the other, where the FIFO shares the copies with the senders
   * (4 ranks, 8 MiB: 1943 us against the FIFO's 1205). */
  ops[k++] = (struct p2p_op){.peer = a->root, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes,
                             .token = coll_token(a, bytes)};
  if (r == a->root)
    for (int p = 0; p < n; p++)
      ops[k++] = (struct p2p_op){.peer = p, .is_send = 0, .buf = (char*)a->recvbuff + (size_t)p * bytes,
                                 .bytes = bytes, .token = coll_token(a, bytes)};
  return run_ops(a, ops, k, stack);
}

static ncclResult_t direct_scatter(struct coll_args* a) {
  int n = a->comm->nranks, r = a->comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  /* The root's send buffer, the slots and the receive buffers: n messages each. */
  size_t fp = 3 * (size_t)n * bytes;
  if (bytes == 0) return ncclSuccess;
  struct p2p_op stack[2 * OPS_STACK_RANKS];
  struct p2p_op* ops = ops_get(n, stack);
  if (!ops) return err_set(ncclSystemError, "out of memory in scatter");
  int k = 0;
  if (r == a->root)
    for (int p = 0; p < n; p++)
      ops[k++] = (struct p2p_op){.peer = p, .is_send = 1, .buf = (char*)a->sendbuff + (size_t)p * bytes,
                                 .bytes = bytes, .footprint = fp, .token = coll_token(a, bytes)};
  ops[k++] = (struct p2p_op){.peer = a->root, .is_send = 0, .buf = (char*)a->recvbuff, .bytes = bytes,
                             .footprint = fp, .token = coll_token(a, bytes)};
  return run_ops(a, ops, k, stack);
}

/* One step; everything through the root or the links. A gather whose
 * blocks go by single copy has its root read them one after the other (each
 * a handshake and a system call) and copy its own: the pushed row
 * (cma_gather.c) shares those copies out. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  int n = a->comm->nranks;
  if (a->kind == COLL_GATHER && coll_cma_eligible(a))
    return c->link.alpha_us + (n - 1) * tune_cma_handshake_us(c) + n * bytes / tune_cma_bw(c, 2.0 * bytes);
  /* Where a machine's ranks are hosts of their own and outnumber its CPUs,
   * each of an alltoall's n-1 messages each way is a step (direct_net.c,
   * doubling.c). */
  if (a->kind == COLL_ALLTOALL && a->comm->sock_oversub > 1)
    return (n - 1) * (1.1 * c->link.alpha_us + bytes / c->link.bw);
  return c->link.alpha_us + (n - 1) * bytes / c->link.bw;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  switch (a->kind) {
    case COLL_ALLTOALL: return p2p_alltoall(a, 0);
    case COLL_GATHER: return direct_gather(a);
    case COLL_SCATTER: return direct_scatter(a);
    default: return err_set(ncclInternalError, "point-to-point rows have no %s", coll_name(a->kind));
  }
}

const struct algo algo_p2p_alltoall = {COLL_ALLTOALL, ALGO_P2P, PROTO_SIMPLE, 0, algo_always, estimate, run};
const struct algo algo_p2p_gather = {COLL_GATHER, ALGO_P2P, PROTO_SIMPLE, 0, algo_always, estimate, run};
const struct algo algo_p2p_scatter = {COLL_SCATTER, ALGO_P2P, PROTO_SIMPLE, 0, algo_always, estimate, run};
