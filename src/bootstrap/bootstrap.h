/* Unique-ID bootstrap: the root (root.c) collects every rank's listening
 * address and hands the table to one rank, which spreads it down a tree
 * (bootstrap.c); ranks then talk over persistent, authenticated TCP
 * connections (one per ordered pair, opened on first use), which gives FIFO
 * order per (peer, tag). Used by init.c for peer-info exchange and by later
 * transports for connection setup. Calls on one bootstrap are serialised. */
#ifndef COLLIE_BOOTSTRAP_H
#define COLLIE_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "nccl.h"
#include "socket.h"

#define BOOTSTRAP_ID_MAGIC 0x44494c43u /* "CLID" */
#define BOOTSTRAP_ID_VERSION 1
/* The root address in this ID is served by rank 0 during init (NCCL_COMM_ID
 * mode) rather than by a thread that ncclGetUniqueId started. */
#define BOOTSTRAP_ID_EXTERNAL_ROOT 0x1

/* What a ncclUniqueId carries (fits its 128 bytes). */
struct bootstrap_id {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint8_t secret[FRAME_SECRET_BYTES];
  uint64_t nonce; /* identifies this root / job; also seeds the comm hash */
  union sock_addr root;
};

/* User tags must stay below this; higher values are the bootstrap's own. */
#define BOOTSTRAP_TAG_INTERNAL 0x80000000u

struct bootstrap;

/* ncclGetUniqueId: a fresh secret and nonce; starts a root thread on a local
 * interface unless NCCL_COMM_ID names the root address. */
ncclResult_t bootstrap_create_id(ncclUniqueId* out);
/* The same, never NCCL_COMM_ID's address: for a communicator made from
 * another (split, shrink), whose ID travels over the parent's bootstrap.
 * NCCL_COMM_ID names one address, so two children (two split colours) or a
 * child made while the parent's root still listens would collide on it. */
ncclResult_t bootstrap_create_fresh_id(ncclUniqueId* out);
/* An ID for a root at `addr` (NCCL_COMM_ID mode). The secret comes from
 * COLLIE_BOOTSTRAP_SECRET, else from the job identity in the environment. */
ncclResult_t bootstrap_id_from_addr(const union sock_addr* addr, ncclUniqueId* out);
/* Checks an ID's header; fills `out`. */
ncclResult_t bootstrap_id_decode(const ncclUniqueId* id, struct bootstrap_id* out);

/* A rank's card: up to CHECKIN_CARD_MAX bytes that travel with its check-in
 * and reach every rank with the address table, so that what every rank must
 * learn about every other (init.c: peer info, keep-alive address) costs no
 * exchange of its own. Called once this rank's bootstrap listener is bound
 * (its address and COLLIE_LISTEN_ANY are given); fills `card`, returns its
 * length, or -1 after err_set. */
typedef int (*bootstrap_card_fn)(void* arg, const union sock_addr* listen_addr, int listen_any, uint8_t* card,
                                 size_t cap);

/* Brings `nranks` ranks together using `nids` IDs (one root each; rank r
 * checks in with root r*nids/nranks's block owner). Blocking; bounded by
 * COLLIE_BOOTSTRAP_TIMEOUT; returns early with ncclSystemError if *abort_flag.
 * make_card may be NULL (empty cards). */
ncclResult_t bootstrap_init(const ncclUniqueId* ids, int nids, int rank, int nranks,
                            volatile uint32_t* abort_flag, bootstrap_card_fn make_card, void* card_arg,
                            struct bootstrap** out);
/* The card `peer` gave at init (NULL, *len 0 for an empty one). */
const uint8_t* bootstrap_card(const struct bootstrap* bs, int peer, uint32_t* len);
void bootstrap_destroy(struct bootstrap* bs);

int bootstrap_rank(const struct bootstrap* bs);
int bootstrap_nranks(const struct bootstrap* bs);
uint64_t bootstrap_nonce(const struct bootstrap* bs);
/* COLLIE_LISTEN_ANY as read at init: transports' listeners follow it too. */
int bootstrap_listen_any(const struct bootstrap* bs);
/* Where a peer listens (valid after init). */
const union sock_addr* bootstrap_peer_addr(const struct bootstrap* bs, int peer);
/* Host name a peer reported (for error messages); "unknown host" until
 * init.c records the names from its peer-info exchange. */
const char* bootstrap_peer_host(const struct bootstrap* bs, int peer);
void bootstrap_set_peer_host(struct bootstrap* bs, int peer, const char* host);
/* How long bootstrap_init took: check-in until the root answered (includes
 * waiting for the last rank to start), then spreading the address table. */
void bootstrap_phase_ms(const struct bootstrap* bs, double* checkin_ms, double* table_ms);

/* The failure detector (health.c) declared `peer` dead: waits for it end
 * with ncclRemoteError at once; the other peers stay reachable (shrink needs
 * them). Safe from any thread. */
void bootstrap_peer_failed(struct bootstrap* bs, int peer);

/* The owning communicator's data path must not outwait its abort, revoke
 * or a recorded failure: once set, every wait of the calls below (not the
 * _ctl ones) checks stop(arg) before it sleeps (a non-success result, with
 * err_set done, ends the call) and sleeps in poll() on wake_fd as well, an
 * fd that becomes readable for good once stop may fail. Set once, right
 * after init, before other threads use bs. */
void bootstrap_set_watch(struct bootstrap* bs, ncclResult_t (*stop)(void* arg), void* arg, int wake_fd);

/* Tagged point-to-point; the sizes on both sides must agree. */
ncclResult_t bootstrap_send(struct bootstrap* bs, int peer, uint32_t tag, const void* data, size_t size);
ncclResult_t bootstrap_recv(struct bootstrap* bs, int peer, uint32_t tag, void* data, size_t size);
/* The same for control messages of a communicator that may be revoked or in
 * error (ncclCommShrink): not stopped by the watch (abort and a peer declared
 * failed still end them); timeout_ms > 0 replaces COLLIE_BOOTSTRAP_TIMEOUT;
 * *timed_out (may be NULL) says whether the call failed for lack of time. */
ncclResult_t bootstrap_send_ctl(struct bootstrap* bs, int peer, uint32_t tag, const void* data, size_t size,
                                int64_t timeout_ms, int* timed_out);
ncclResult_t bootstrap_recv_ctl(struct bootstrap* bs, int peer, uint32_t tag, void* data, size_t size,
                                int64_t timeout_ms, int* timed_out);
/* Allgather (Bruck, log2 n rounds): `all` holds nranks blocks of `size`
 * bytes; block `rank` is ours. */
ncclResult_t bootstrap_allgather(struct bootstrap* bs, void* all, size_t size);
ncclResult_t bootstrap_barrier(struct bootstrap* bs);
ncclResult_t bootstrap_bcast(struct bootstrap* bs, int root, void* data, size_t size);

/* Root threads (root.c). Starts one listening at id->root (port 0: any; the
 * bound address is written back). */
ncclResult_t root_start(struct bootstrap_id* id, int started_by_init);
/* Joins root threads of this process that have finished. */
void root_reap(void);
/* Once this process's rank has its reply from the root serving `id`: if that
 * root runs in this process, waits (bounded) until it has answered every rank
 * of its block, then reaps it. A rank that owns the root and leaves right
 * after its init must not take the other ranks' replies with it. */
void root_wait_served(const struct bootstrap_id* id);
/* For tests only: the root sleeps this long before each reply after the
 * first (a root thread the scheduler left behind). */
extern int root_test_reply_delay_ms;
/* For tests/fuzz only: a root with no listener or thread. root_test_connection
 * hands it one accepted connection (it reads what `fd` holds, as root_main
 * would, and takes or closes the fd); returns 0 still pending, 1 kept, 2
 * dropped. root_test_finish replies as at the end of the bootstrap (the
 * successor addresses, or the list of missing ranks), closes everything, frees
 * the root and returns 1 if every rank had checked in. */
struct root;
struct root* root_test_new(const struct bootstrap_id* id);
int root_test_connection(struct root* r, int fd, const union sock_addr* from);
int root_test_finish(struct root* r);

/* Connections dropped by listeners since process start (strangers, bad
 * frames, stalls); for tests and logs. */
uint64_t bootstrap_dropped_count(void);
void bootstrap_note_dropped(const union sock_addr* from, const char* where, const char* why);

#endif
