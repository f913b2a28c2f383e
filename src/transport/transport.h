/* Connectors: one-directional FIFOs of slots between two ranks, the only
 * thing algorithms (src/coll) see of a transport. A sender acquires a free
 * slot, writes up to slot_bytes into it and commits it with a header; the
 * receiver acquires the oldest filled slot, consumes it and releases it.
 * Where the slots live and who moves the bytes is the transport's business:
 *   shm.c     slots in a POSIX shared-memory segment both processes map;
 *   socket.c  slots in local memory on each side, moved over TCP by
 *             transport_progress (called from every wait).
 * connect.c sets connectors up lazily, through bootstrap messages, and picks
 * the transport per peer pair (shm on the same host unless NCCL_SHM_DISABLE,
 * socket otherwise or with NCCL_NET=Socket / different NCCL_HOSTID). */
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

enum conn_type { CONN_SHM = 1, CONN_SOCKET = 2 };

struct conn_ops;
/* Channels: independent sets of connectors, so several threads of one rank
 * can drive parts of one collective at once (graph/channels.c). */
#define MAX_CHANNELS 4

struct conn {
  const struct conn_ops* ops;
  struct ncclComm* comm;
  int channel;
  int peer;
  int is_send;
  int type;
  int nslots;
  size_t slot_bytes;
  uint64_t opseq; /* operations started on this connector */
  void* priv;     /* the transport's state */
};

struct conn_ops {
  /* Sender: a free slot's data area, or NULL if none is free yet. */
  void* (*send_slot)(struct conn* c);
  /* Sender: publish the acquired slot. */
  ncclResult_t (*send_commit)(struct conn* c, const struct slot_hdr* h);
  /* Sender, optional (NULL if unsupported): publish the acquired slot with its
   * payload taken from `data` (caller memory, unchanged until the operation
   * ends) instead of the slot: saves a copy where bytes leave by system call. */
  ncclResult_t (*send_commit_ext)(struct conn* c, const struct slot_hdr* h, const void* data);
  /* Receiver: the oldest filled slot (its header copied to *h), or NULL. */
  const void* (*recv_slot)(struct conn* c, struct slot_hdr* h);
  /* Receiver, optional: the payload of the next slot to consume should land
   * in `dst` (up to `bytes`) if its bytes have not arrived yet; recv_slot then
   * returns `dst` itself. Saves a copy where bytes arrive by system call. */
  void (*recv_post)(struct conn* c, void* dst, size_t bytes);
  /* Receiver: give the slot back to the sender. */
  ncclResult_t (*recv_release)(struct conn* c);
  /* Moves bytes (socket); returns an error when the link failed. */
  ncclResult_t (*progress)(struct conn* c);
  /* Blocks up to timeout_ms until this connector may have changed state. */
  void (*wait)(struct conn* c, int timeout_ms);
  /* Tell the other side this one failed (poison), without blocking. */
  void (*fail)(struct conn* c);
  /* Slots committed but not yet handed to the peer (socket: not yet written). */
  int (*pending)(struct conn* c);
  /* Sockets: fill pollfds (at most 16) with what this connector waits for. */
  int (*pollfds)(struct conn* c, struct pollfd* p);
  /* Has the peer failed/closed? */
  int (*peer_failed)(struct conn* c);
  void (*close)(struct conn* c);
  /* Optional: wake a waiter of this connector sleeping in wait() (it then
   * re-checks the communicator's state); changes nothing else. */
  void (*wake)(struct conn* c);
};

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
/* The communicator failed part-way through an operation: fail every
 * connector, so that every peer waiting on this rank gets an error. */
void transport_poison(struct ncclComm* comm);
/* Wakes every waiter sleeping on a connector of the communicator, from any
 * thread (the failure detector): they notice a recorded error at once. */
void transport_wake(struct ncclComm* comm);
/* Progress every socket connector of channel `ch` (pending sends and
 * receives); each channel is driven by one thread at a time. */
ncclResult_t transport_progress(struct ncclComm* comm, int ch);
/* Sleeps until a socket of channel `ch` can move bytes we want moved (data
 * to read into a free slot, or room for a pending send), or timeout_ms. */
void transport_wait_sockets(struct ncclComm* comm, int ch, int timeout_ms);
/* Waits until every slot committed on a socket connector has left this
 * process: an operation is complete only then (the caller may destroy the
 * communicator next, and closing a socket drops what it still holds). */
ncclResult_t transport_flush(struct ncclComm* comm);

/* Transport constructors (connect.c exchanges `info` blobs through the bootstrap). */
#define TRANSPORT_INFO_BYTES 256
ncclResult_t shm_recv_setup(struct conn* c, void* info, size_t* info_len);
ncclResult_t shm_send_connect(struct conn* c, const void* info, size_t info_len);
ncclResult_t shm_recv_connected(struct conn* c); /* sender mapped it: unlink */
ncclResult_t sock_recv_setup(struct conn* c, void* info, size_t* info_len);
ncclResult_t sock_send_connect(struct conn* c, const void* info, size_t info_len);
ncclResult_t sock_recv_connected(struct conn* c); /* accept the sender's connection */

#endif
