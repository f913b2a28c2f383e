/* Connectors and transports. A connector is a one-directional FIFO of slots
 * between two ranks, the only thing algorithms (src/coll) see of a
 * transport: a sender acquires a free slot, writes up to slot_bytes into it
 * and commits it with a header; the receiver acquires the oldest filled
 * slot, consumes it and releases it. A transport (struct transport) is one
 * table of functions that sets connectors up and moves their bytes:
 *   shm.c        slots in a memfd segment both processes map (same host);
 *   net_socket.c slots in local memory on each side, moved over TCP.
 * connect.c keeps the table (priority order), picks the first transport that
 * can connect a peer pair and sets connectors up lazily through the
 * bootstrap. Callers outside src/transport ask a connector's capabilities
 * (conn_caps), never which transport it is. */
#ifndef COLLIE_TRANSPORT_H
#define COLLIE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct pollfd;

struct ncclComm;

/* Every slot carries this header, so a receiver can tell when ranks
 * disagree about a call (different sizes or a different operation) before
 * it writes anything, and so errors travel downstream. */
struct slot_hdr {
  uint64_t opseq;  /* per-connector operation counter, the same on both sides */
  uint64_t total;  /* bytes the whole operation moves on this connector */
  uint32_t bytes;  /* payload bytes in this slot */
  uint32_t flags;  /* SLOT_ERROR: the sender failed; no payload */
};
#define SLOT_ERROR 0x1u
/* Bits 16-31 of flags: a socket sender on the receiver's machine puts the
 * CPU it sends from there, plus one (0: not given); see prim_fd_poll_ns. */
#define SLOT_CPU_SHIFT 16
/* The payload is a single-copy descriptor (struct cma_desc): the receiver
 * reads the data from the sender's memory and then releases the slot. */
#define SLOT_CMA 0x2u
/* Socket streams only: no slot; every later slot of this connection comes on
 * the connection of the opposite connector (net_socket.c, COLLIE_SOCKET_DUPLEX). */
#define SLOT_SWITCH 0x4u
struct cma_desc {
  uint64_t addr;
  uint64_t bytes;
};

struct conn_ops;
struct transport;
struct futex_word; /* futex.h */
/* Channels: independent sets of connectors, so several threads of one rank
 * can drive parts of one collective at once (graph/channels.c). */
#define MAX_CHANNELS 4

struct conn {
  const struct conn_ops* ops;
  struct ncclComm* comm;
  int channel;
  int peer;
  int is_send;
  const struct transport* tp; /* the transport that set it up */
  unsigned caps;              /* TRANSPORT_CAP_*: the transport's, plus what this pair supports */
  int nslots;
  size_t slot_bytes;
  uint64_t opseq; /* operations started on this connector */
  void* priv;     /* the transport's state */
};

struct conn_ops {
  /* Sender: a free slot's data area, or NULL if none is free yet. `bytes`:
   * the most the caller will commit in it (0: not known, or only asking
   * whether a slot is free); a transport may place a smaller payload
   * anywhere in the slot where it fits (shm.c), so the commit must not be
   * larger. */
  void* (*send_slot)(struct conn* c, size_t bytes);
  /* Sender: publish the acquired slot. */
  ncclResult_t (*send_commit)(struct conn* c, const struct slot_hdr* h);
  /* Sender, optional (NULL if unsupported): publish the acquired slot with its
   * payload taken from `data` (caller memory, unchanged until the operation
   * ends) instead of the slot: saves a copy where bytes leave by system call. */
  ncclResult_t (*send_commit_ext)(struct conn* c, const struct slot_hdr* h, const void* data);
  /* Sender, TRANSPORT_CAP_DEVICE_SEND (else NULL): publish the acquired slot
   * with its payload read from device memory at `data` by the NIC (GPUDirect
   * RDMA); the CPU never touches it. Any size; complete when it returns. */
  ncclResult_t (*send_commit_dev)(struct conn* c, const struct slot_hdr* h, const void* data);
  /* Receiver: the oldest filled slot (its header copied to *h), or NULL. */
  const void* (*recv_slot)(struct conn* c, struct slot_hdr* h);
  /* Receiver, optional: the payload of the next slot to consume should land
   * in `dst` (up to `bytes`) if its bytes have not arrived yet; recv_slot then
   * returns `dst` itself. Saves a copy where bytes arrive by system call. */
  void (*recv_post)(struct conn* c, void* dst, size_t bytes);
  /* Receiver: give the slot back to the sender. */
  ncclResult_t (*recv_release)(struct conn* c);
  /* TRANSPORT_CAP_PROGRESS: moves bytes; returns an error when the link failed. */
  ncclResult_t (*progress)(struct conn* c);
  /* Blocks up to timeout_ms until this connector may have changed state. */
  void (*wait)(struct conn* c, int timeout_ms);
  /* Tell the other side this one failed (poison), without blocking. */
  void (*fail)(struct conn* c);
  /* Slots committed but not yet handed to the peer (TRANSPORT_CAP_FLUSH). */
  int (*pending)(struct conn* c);
  /* TRANSPORT_CAP_POLLFD: fill pollfds (at most 16) with what this connector waits for. */
  int (*pollfds)(struct conn* c, struct pollfd* p);
  /* Has the peer failed/closed? */
  int (*peer_failed)(struct conn* c);
  void (*close)(struct conn* c);
  /* Optional: wake a waiter of this connector sleeping in wait() (it then
   * re-checks the communicator's state); changes nothing else. */
  void (*wake)(struct conn* c);
  /* TRANSPORT_CAP_READ_PEER_MEM: copies `bytes` from the peer's address
   * `addr` into dst (single copy); an error if the peer is gone or the range
   * is not its memory. */
  ncclResult_t (*read_peer)(struct conn* c, void* dst, uint64_t addr, size_t bytes);
  /* Optional (NULL: not offered), TRANSPORT_CAP_READ_PEER_MEM: copies
   * `bytes` from src into the peer's address `addr`; errors as read_peer. */
  ncclResult_t (*write_peer)(struct conn* c, uint64_t addr, const void* src, size_t bytes);
  /* Sender, TRANSPORT_CAP_READ_PEER_MEM: committed slots the receiver has not
   * released yet (a single-copy sender waits for 0 before its buffer is free). */
  int (*unreleased)(struct conn* c);
  /* Sender: sleeps up to timeout_ms until the receiver releases a slot. */
  void (*wait_released)(struct conn* c, int timeout_ms);
  /* Optional (NULL: not offered): prepares a sleep on what wait() (released:
   * wait_released()) would sleep on: *w gets the futex word and the value it
   * holds now, and the peer is asked to wake it; 0 when the connector is
   * ready already (nothing prepared). wait_disarm ends a prepared sleep. A
   * waiter for several connectors sleeps on all their words at once. */
  int (*wait_arm)(struct conn* c, int released, struct futex_word* w);
  void (*wait_disarm)(struct conn* c);
  /* Optional (NULL: none): CONN_SHARED_WORDS 64-bit words that both ends of
   * the connector map, zero when it is set up, for an algorithm's own
   * coordination with atomics (cma_reduce.c); the transport never reads them. */
  uint64_t* (*shared_words)(struct conn* c);
};
#define CONN_SHARED_WORDS 8

/* Gets (setting up on first use) the connectors with the given peers.
 * `send_peers` / `recv_peers` list peers this rank sends to / receives from;
 * every rank of the communicator that takes part must call this with the
 * mirror image (a's send peer b <=> b's recv peer a) in the same order of
 * calls. Outputs point into the comm and stay valid until it is destroyed. */
ncclResult_t transport_connect(struct ncclComm* comm, const int* send_peers, int nsend, const int* recv_peers,
                               int nrecv, struct conn** sends, struct conn** recvs);
/* The same on channel `ch` (transport_connect is channel 0). Setting up must
 * happen on one thread per rank, in the same order on every rank. */
ncclResult_t transport_connect_ch(struct ncclComm* comm, int ch, const int* send_peers, int nsend,
                                  const int* recv_peers, int nrecv, struct conn** sends, struct conn** recvs);
void transport_close_all(struct ncclComm* comm);
/* Collective at init (every rank calls it at the same point): probes
 * cross-memory attach between all ranks of a single-host communicator per
 * COLLIE_CMA and sets comm->cma / cma_min_bytes alike on every rank. */
ncclResult_t transport_cma_init(struct ncclComm* comm);
/* COLLIE_CMA as set: CMA_OFF, CMA_AUTO (unset too) or CMA_ON; -1 for any
 * other value. */
enum { CMA_OFF, CMA_AUTO, CMA_ON };
int cma_mode(void);
/* COLLIE_CMA=auto probes hosts of up to this many ranks: the probe reads
 * every peer from every rank (n^2 reads per host, 6 s of init at 1024 ranks:
 * docs/BENCHMARKS.md, Init scaling). */
#define CMA_AUTO_MAX_RANKS 64
/* Reads bytes at addr in process pid into dst (cma.c); *err: errno on failure. */
ncclResult_t cma_read(int pid, void* dst, uint64_t addr, size_t bytes, int* err);
/* Writes bytes from src to addr in process pid (the same permission as reading). */
ncclResult_t cma_write(int pid, uint64_t addr, const void* src, size_t bytes, int* err);
/* Payload bytes of one connector slot (NCCL_BUFFSIZE / COLLIE_NSLOTS, decided
 * on first use, the same on every rank): the chunk algorithms move per step. */
size_t transport_chunk_bytes(struct ncclComm* comm);
/* The communicator failed part-way through an operation: fail every
 * connector, so that every peer waiting on this rank gets an error. */
void transport_poison(struct ncclComm* comm);
/* Wakes every waiter sleeping on a connector of the communicator, from any
 * thread (the failure detector): they notice a recorded error at once. */
void transport_wake(struct ncclComm* comm);
/* Progress every TRANSPORT_CAP_PROGRESS connector of channel `ch` (pending
 * sends and receives); each channel is driven by one thread at a time. */
ncclResult_t transport_progress(struct ncclComm* comm, int ch);
/* For a waiter of a connector that moves bytes without progress (shared
 * memory) on channel `ch`: progresses the channel's TRANSPORT_CAP_PROGRESS
 * connectors, if it has any, and sets *owed to 1 when one of them still needs
 * this rank (a sender holding bytes the kernel did not take, a net receiver)
 * so that the waiter sleeps only briefly. A rank asleep on shared memory that
 * held the rest of a socket slot stalled a ring mixing both transports: its
 * socket peer waited for those bytes, and through the ring so did the rank
 * it waited for (3 hosts of 2 ranks, 64 KiB socket buffers, reduce-scatter). */
ncclResult_t transport_push(struct ncclComm* comm, int ch, int* owed);
/* Sleeps until an fd of a TRANSPORT_CAP_POLLFD connector of channel `ch` can
 * move bytes we want moved (data to read into a free slot, or room for a
 * pending send), or the communicator stops, or timeout_ms. */
void transport_wait_fds(struct ncclComm* comm, int ch, int timeout_ms);
/* GPUDirect RDMA: 1 if a send of device memory [p, p+bytes) to `peer` goes
 * over a transport whose NIC reads it from the device (the send then needs
 * no staging: coll_args.mem gets MEM_GDR), else 0 with the reason in why. */
int transport_dev_send_ok(struct ncclComm* comm, int peer, const void* p, size_t bytes, char* why, size_t len);
/* Waits until every slot committed on a TRANSPORT_CAP_FLUSH connector has
 * left this process: an operation is complete only then (the caller may destroy the
 * communicator next, and closing a socket drops what it still holds). */
ncclResult_t transport_flush(struct ncclComm* comm);
/* The same for the connectors of channel `ch` only, from the thread that
 * drives that channel: a channel's part of a collective ends with it, since
 * no other thread progresses that channel's connectors (two ranks whose
 * finished channels each held the bytes the other's unfinished one waited
 * for waited forever: 2-channel allreduce over sockets whose buffers filled). */
ncclResult_t transport_flush_ch(struct ncclComm* comm, int ch);
/* For tests: 1 when the kernel has delayed acknowledgements on for every
 * connection of socket receiver c, 0 when not for some, -1 when c is no
 * socket receiver or the kernel does not say; *armed: how many of those
 * connections this library asked for them (COLLIE_SOCKET_DELAYED_ACK). */
int sock_delayed_ack_on(struct conn* c, int* armed);
/* For tests: how many looks of socket receiver c held a read back because
 * its peer's slots came as a one-way stream (COLLIE_SOCKET_LAG_NS; a wait
 * counts once per look), or -1 when c is no socket receiver. */
int64_t sock_lag_holds(struct conn* c);
/* For tests: how many payloads of 16 KiB or more socket receiver c placed in
 * its slot buffer rather than the consumer's (COLLIE_SOCKET_HOLD), or -1
 * when c is no socket receiver. */
int64_t sock_staged_large(struct conn* c);
/* For tests: the TCP congestion control of every connection of socket
 * connector c (sender: the connections it connected; receiver: those it
 * accepted) into name (0), or -1 when c is no socket connector, the kernel
 * does not say, or its connections differ. */
int sock_congestion(struct conn* c, char* name, size_t len);
/* For tests: 1 when socket connector c moves its bytes over the TCP
 * connection of its opposite connector (same peer and channel, the other
 * direction; COLLIE_SOCKET_DUPLEX), 0 when over its own, -1 when c is no
 * socket connector. */
int sock_duplex(struct conn* c);

/* ---- transports */

/* Capability flags: what a caller may rely on, instead of testing names. */
/* Bytes move only when progress() runs (no helper thread, no shared memory):
 * waiters must call transport_progress. */
#define TRANSPORT_CAP_PROGRESS 0x1u
/* Waiters sleep in poll() on the fds pollfds() returns (transport_wait_fds). */
#define TRANSPORT_CAP_POLLFD 0x2u
/* Bytes cross by system call: send_commit_ext / recv_post save a copy. */
#define TRANSPORT_CAP_SYSCALL_DATA 0x4u
/* Committed slots may still sit in this process: transport_flush must wait. */
#define TRANSPORT_CAP_FLUSH 0x8u
/* Can read a peer process's memory directly (single copy: read_peer,
 * unreleased, wait_released); set per connector when the communicator's
 * probe succeeded (transport_cma_init). */
#define TRANSPORT_CAP_READ_PEER_MEM 0x10u
/* A network transport: chosen by NCCL_NET=<name>. */
#define TRANSPORT_CAP_NET 0x20u
/* Sends can read device memory (GPUDirect RDMA: send_commit_dev), for the
 * buffers dev_send_probe accepts. */
#define TRANSPORT_CAP_DEVICE_SEND 0x40u
/* Send slots lie in memory that the peer's CPU reads straight after the
 * commit (shared memory): worth filling with non-temporal stores where the
 * two CPUs are far apart (prim_link.slot_far). */
#define TRANSPORT_CAP_SHARED_SLOTS 0x80u

/* Opaque blobs exchanged through the bootstrap during setup. */
#define TRANSPORT_INFO_BYTES 256

/* One side's setup: the transport fills c->priv and c->ops.
 *   setup    makes this end and describes it in info (at most
 *            TRANSPORT_INFO_BYTES; *len 0 if nothing to say);
 *   connect  attaches to the peer's end from the peer's info;
 *   free     releases what setup/connect made (c->ops->close does the same
 *            for a connector in use; free must cope with a half-made one).
 * The order (connect.c): receiver setup -> info to sender; sender setup and
 * connect(receiver info) -> acknowledgement with the sender's info; receiver
 * connect(sender info). Both sides agree on the transport because the
 * receiver chooses it and names it in its message. */
struct transport_side {
  ncclResult_t (*setup)(struct conn* c, void* info, size_t* len);
  ncclResult_t (*connect)(struct conn* c, const void* peer_info, size_t len);
  void (*free)(struct conn* c);
};

/* A transport: how connectors between two ranks are made and run. Kept in
 * one array in priority order (connect.c); adding a transport is one file
 * and one entry there. */
struct transport {
  const char* name; /* also what NCCL_NET names for a network transport */
  unsigned caps;    /* TRANSPORT_CAP_* */
  /* Can this transport connect this rank with `peer` (both sides must answer
   * alike: only exchanged peer info and shared settings may decide)? */
  int (*can_connect)(struct ncclComm* comm, int peer);
  /* TRANSPORT_CAP_DEVICE_SEND: 0 if a send of device memory [p, p+bytes) to
   * `peer` can be read by the NIC straight from the device, else -1 and why. */
  int (*dev_send_probe)(struct ncclComm* comm, int peer, const void* p, size_t bytes, char* why, size_t len);
  struct transport_side send, recv;
  const struct conn_ops* ops; /* data operations of its connectors */
};

extern const struct transport transport_shm;
extern const struct transport transport_socket;
/* net_ib.c: built when infiniband/verbs.h was found (COLLIE_HAVE_IBVERBS). */
extern const struct transport transport_ib;

/* What connector c can do (TRANSPORT_CAP_*). */
static inline unsigned conn_caps(const struct conn* c) { return c->caps; }
/* The transport's name, for messages. */
static inline const char* conn_transport_name(const struct conn* c) { return c->tp->name; }

#endif
