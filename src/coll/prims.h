/* Primitives: the steps every algorithm is written in. Each moves one slot
 * (at most slot_bytes) through a connector, waiting as needed (spin, then
 * yield, then sleep on the connector), checking the slot header against what
 * this rank expects (so disagreeing ranks get an error, never a buffer
 * overrun), and turning failures into errors that are also passed on to the
 * neighbours (poison) so that no rank is left waiting. */
#ifndef COLLIE_PRIMS_H
#define COLLIE_PRIMS_H

#include <string.h>

#include "../comm.h"
#include "../device/reduce.h"

/* An operation's view of one connector: which op it is and its total bytes. */
struct prim_link {
  struct conn* c;
  uint64_t opseq;
  uint64_t total;
  int out_far; /* what this receiving side writes to the caller's buffer goes out to memory (the plan's
                  out_far): reductions and copies there use non-temporal stores */
  int slot_far; /* this sending side fills shared-memory slots with non-temporal stores (the call's
                   comm->slot_far, set by prim_begin; coll/adapt.c) */
  int ahead;    /* this receiving side reduces from shared-memory slots with software prefetches ahead
                   (red_reduce_far; the call's comm->read_ahead, set by prim_begin) */
};

/* Starts an operation on a connector: both sides must call it once per op
 * (out_far 0; an algorithm sets it from coll_args after). */
void prim_begin(struct prim_link* l, struct conn* c, uint64_t total);
/* Whether `bytes` written into a send slot of l go with non-temporal
 * stores: a slot_far link, at least 4 KiB (smaller slots stay plain). */
static inline int prim_slot_far(const struct prim_link* l, size_t bytes) { return l->slot_far && bytes >= 4096; }
/* A copy into the caller's buffer: with non-temporal stores where the
 * result is to bypass the cache (`far`: the plan's out_far), else memcpy.
 * dst and src must not overlap. */
static inline void prim_copy_out(void* dst, const void* src, size_t bytes, int far) {
  if (far) red_copy_far(dst, src, bytes);
  else memcpy(dst, src, bytes);
}
/* Copies `bytes` from src into an acquired send slot (prim_slot_far: with
 * non-temporal stores, else memcpy). */
void prim_slot_copy(const struct prim_link* l, void* slot, const void* src, size_t bytes);

/* Wait for a free send slot / a filled receive slot (header checked:
 * `bytes` must match exactly). */
ncclResult_t prim_send_slot(struct prim_link* l, size_t bytes, void** slot);
ncclResult_t prim_send_commit(struct prim_link* l, size_t bytes);
ncclResult_t prim_recv_slot(struct prim_link* l, size_t bytes, const void** slot);
ncclResult_t prim_recv_release(struct prim_link* l);
/* Sender on a TRANSPORT_CAP_READ_PEER_MEM connector: waits until the
 * receiver has released every slot committed so far (after which it reads
 * nothing more of this rank's memory for them). */
ncclResult_t prim_send_drain(struct prim_link* l);
/* The peer of c left the communicator on purpose (health_peer_left) while
 * this rank waits on c for a slot (released 0) or for every committed slot
 * to come back (released 1): ncclSuccess once that is there (a
 * progress-driven connector is progressed a short while for what the peer
 * sent before it left), else the "left while this rank waited" error. */
ncclResult_t prim_left_wait(struct conn* c, int released);

/* Composite steps over one chunk of `bytes` bytes (count elements for reductions). */
ncclResult_t prim_send(struct prim_link* s, const void* src, size_t bytes);
/* prim_send, then (tee not NULL) the same bytes copied to tee while still in
 * this core's cache: an out-of-place root's or rank's own block, sent from
 * the send buffer and copied to the output after. */
ncclResult_t prim_send_tee(struct prim_link* s, const void* src, size_t bytes, void* tee);
ncclResult_t prim_send_pre(struct prim_link* s, const struct red_op* op, const void* src, size_t count);
ncclResult_t prim_recv(struct prim_link* r, void* dst, size_t bytes);
ncclResult_t prim_recv_copy_send(struct prim_link* r, struct prim_link* s, void* dst, size_t bytes);
ncclResult_t prim_recv_reduce_send(struct prim_link* r, struct prim_link* s, const struct red_op* op,
                                   const void* local, size_t count);
/* dst = recv OP pre(local); with `s` also sends dst on. With r->out_far and
 * dst distinct from local, dst is written with non-temporal stores
 * (red_reduce_out), and with OUT_FAR_FUSE a slot of `s` (shared memory) gets
 * the result in the same pass (without it, plain stores and a copy into the
 * slot); prim_recv and prim_recv_copy_send copy into dst the same way. */
ncclResult_t prim_recv_reduce_copy(struct prim_link* r, struct prim_link* s, const struct red_op* op,
                                   const void* local, void* dst, size_t count, int avg_n);

/* Two directions at once: sends `sbytes` from src on s and receives `rbytes`
 * into dst from r, `chunk` bytes a slot, moving whichever can move and
 * waiting only when neither can. Neither direction waits for the other, so a
 * rank runs ahead of its peer by as many slots as the connector holds: a
 * peer that loses its CPU for a while finds the data there when it runs
 * again (lock-step, where each slot sent waits for the one received, needs
 * both ranks scheduled at once for every chunk). With `tee` (or NULL), each
 * chunk sent is also copied there right after it goes. */
ncclResult_t prim_exchange(struct prim_link* s, const char* src, size_t sbytes, struct prim_link* r, char* dst,
                           size_t rbytes, size_t chunk, char* tee);

/* The general form: a two-way schedule of items. A send item is `bytes` at
 * src (pre: the op's pre-multiplication applies, PreMulSum), sent once
 * `after` receive items are done; a receive item copies its slot to dst or,
 * with `local`, writes dst = slot OP pre(local) (prim_recv_reduce_copy, avg_n
 * as there). Receives never wait for sends, so two ranks running mirror
 * schedules cannot block each other whatever the slot count. */
struct pump_item {
  const void* src;
  void* dst;
  const void* local;
  size_t bytes;
  int pre;
  int after;
  void* tee; /* send items: where the bytes are also copied, once sent */
};
struct prim_pump {
  struct prim_link *s, *r;
  int nsend, nrecv;
  const struct red_op* op; /* for reducing receive items and pre send items */
  int avg_n;
  /* Fills *it with item i of one direction (is_send 1: the sending one). */
  void (*item)(const struct prim_pump* p, int is_send, int i, struct pump_item* it);
  void* arg;
};
ncclResult_t prim_pump(const struct prim_pump* p);

/* An operation failed part-way: poison every connector of the communicator
 * so neighbours stop waiting (transport_poison); returns `res`. */
ncclResult_t prim_fail(struct ncclComm* comm, ncclResult_t res);

/* Does connector c have a slot now (a free one to send into, a filled one to
 * receive)? Polls once; for a last look before a waiter sleeps or fails. */
int prim_conn_ready(struct conn* c);
/* How long a waiter may wait for a peer (COLLIE_TIMEOUT); -1: forever. */
int64_t prim_deadline(struct ncclComm* comm);
/* What every waiter checks before it sleeps: the abort flag, the call board
 * (if `board`: a peer on the same call with other arguments breaks the
 * communicator) and COLLIE_TIMEOUT (*deadline: 0 until first computed).
 * `peer` names whom we wait for in the message (-1: several). */
ncclResult_t prim_sleep_checks(struct ncclComm* comm, int peer, int64_t* deadline, int board);
/* How long a socket waiter for `peer` polls before it sleeps in poll() (ns).
 * 0 when the peer last sent from this very CPU (ranks of one machine that
 * NCCL_HOSTID or NCCL_SHM_DISABLE put on sockets): it cannot run while this
 * rank polls. The higher rank of such a pair also moves itself to another
 * CPU (COLLIE_UNPAIR, prim_unpair) and then goes on polling. */
int64_t prim_fd_poll_ns(struct ncclComm* comm, int peer);
/* One round of a socket waiter that has waited waited_ns: nothing (it keeps
 * progressing) while prim_fd_poll_ns says poll, then sched_yield() for
 * comm->sock_yield_ns (COLLIE_SOCKET_YIELD_US), then a sleep in poll() on
 * channel ch's fds (100 ms at most). */
void prim_fd_wait(struct ncclComm* comm, int peer, int ch, int64_t waited_ns);
/* COLLIE_UNPAIR's move, for a waiter whose `peer` last ran on this rank's
 * CPU `cpu`: the higher rank of the pair moves itself to another CPU it may
 * use (bind_move_off_cpu: its mask is put back), when every rank of the
 * machine can have a CPU, at most every UNPAIR_INTERVAL_NS per rank, or every
 * UNPAIR_LARGE_INTERVAL_NS while the running call's message (comm->op_bytes)
 * is at least `large` bytes: beside a CPU hog the scheduler puts the pair
 * back together within milliseconds, and for large messages two ranks taking
 * turns on one CPU beat one of them sharing the hog's CPU (the waiter's
 * caller chooses `large`). 1 when it moved. Shared-memory waiters
 * (board_give_way) and socket waiters (prim_fd_poll_ns) both call it. */
int prim_unpair(struct ncclComm* comm, int peer, int cpu, size_t large);

#endif
