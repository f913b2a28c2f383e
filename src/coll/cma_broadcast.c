/* Single-copy broadcast on one host: every other rank reads the root's
 * buffer straight from its memory (cross-memory attach, through the p2p
 * batch's single-copy messages), all at once; one copy per byte received
 * instead of the ring's two per hop. Eligible when the communicator's probe
 * found cross-memory attach working (transport/cma.c).
 *
 * At 2 ranks the root, which would only wait, copies too: the reader reads
 * blocks from the front of the buffer (process_vm_readv), the root writes
 * blocks from the back straight into the reader's receive buffer
 * (process_vm_writev), and the two meet where their speeds say. A claim
 * word in the reader's mailbox (direct_shm_claim_word: tag << 48 | front <<
 * 24 | back, front grown by the reader, back shrunk by the root, both by
 * compare-and-swap) makes each block one rank's. Per call: the reader sets
 * the word; both post their buffer's address (direct_shm_share) and so know
 * each other's; both take blocks until none is left; both post whether
 * their copies worked. The root waits for its reader's post (its buffer
 * must stay until the reader has read); the reader waits for the root's
 * only if the root wrote blocks into its buffer. A failed copy is an error
 * on both. A rank without a CPU costs nothing but its posts: the other
 * takes every block. Standalone, 2 processes on 2 CPUs, one call a
 * handshake: 512 KiB 22.6 us read by the reader alone, 11.7 split; 2 MiB
 * 198 / 71; 8 MiB 807 / 395 (docs/ARCHITECTURE.md has the library's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"

/* A block: half the message, in whole pages, from 16 KiB (one system call
 * costs about as much as copying 16 KiB here) to 256 KiB: up to 512 KiB the
 * reader and the root take one block each, at once. Quarters (the first
 * version, so that a faster rank could take three) lost to halves at every
 * size they differ (2 ranks, in place, bound, 5 interleaved rounds, us a
 * call, quarters / halves / Open MPI): 48 KiB 4.36 / 2.34 / 2.88 (three
 * blocks of 16 KiB, two of them the reader's), 64 KiB 3.30 / 2.58 / 3.21,
 * 128 KiB 4.45 / 3.68 / 5.15, 256 KiB 6.51 / 5.67 / 9.06, 512 KiB 10.5 / 9.8
 * / 17.2; unbound alike; beside a busy loop (7 rounds) 64 KiB 6.87 / 5.12,
 * 256 KiB 13.2 / 10.8, 512 KiB 21.2 / 18.2 (Open MPI 6.61, 18.1, 33.7).
 * Blocks of up to 4 MiB gained 5-10% at 1-8 MiB, where collie is 2-3x Open
 * MPI already and a rank slowed by another process gives its peer fewer
 * blocks to take over: not kept. */
static size_t split_block(size_t bytes) {
  size_t b = bytes / 2 / 4096 * 4096;
  return COLLIE_MAX((size_t)16 << 10, COLLIE_MIN((size_t)256 << 10, b));
}

struct split_desc {
  uint64_t addr; /* the root's send buffer, the reader's receive buffer */
  uint64_t token;
  int32_t pid;
  int32_t root;
  uint64_t tag;
  int32_t out_of_place; /* the root: its receive buffer is another */
  int32_t pad0;
  uint64_t pad[3];
};
_Static_assert(sizeof(struct split_desc) == 64, "one cache line a rank");

/* The root takes blocks only from this many in a message: a message of one
 * block is the reader's alone. Had the root written it, the reader would
 * wait for the root's post and the root for the reader's, a round trip a
 * call (2 ranks, 16 KiB in place, 5 interleaved rounds: 3.39 us a call
 * against 1.60 left to the reader; Open MPI 1.58). From two blocks the
 * root's share pays (32 KiB, the root leaving the last block too: 3.78
 * against 1.98). */
#define SPLIT_ROOT_BLOCKS 2

/* Up to this many bytes an out-of-place root only copies its own buffer and
 * its reader reads everything. */
#define SPLIT_ALONE ((size_t)512 << 10)

struct split_result {
  int32_t ok;
  int32_t err; /* errno of the failed copy */
};

static ncclResult_t run_split(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int me = comm->rank, root = a->root, reader = 1 - root, is_root = me == root;
  size_t bytes = a->count * dtype_size(a->dt), blk = split_block(bytes);
  uint64_t nblocks = (bytes + blk - 1) / blk;
  if (nblocks > CLAIM_MAX) return err_set(ncclInvalidArgument, "single-copy broadcast: %zu bytes is too large", bytes);
  uint64_t* w;
  NCCLCHECK(direct_shm_claim_word(comm, reader, &w));
  uint64_t tag = ++comm->split_calls % 0xffff + 1;
  /* Before the exchange: once the root has seen the reader's line it may take blocks. */
  if (!is_root) __atomic_store_n(w, claim_pack(tag, 0, nblocks), __ATOMIC_RELEASE);
  struct split_desc mine = {(uint64_t)(uintptr_t)(is_root ? a->sendbuff : a->recvbuff), coll_token(a, bytes),
                            (int32_t)getpid(), root, tag, is_root && a->recvbuff != a->sendbuff, 0, {0}};
  struct split_desc all[2];
  NCCLCHECK(direct_shm_share(comm, &mine, sizeof(mine), all));
  if (all[0].token != all[1].token || all[0].root != all[1].root || all[0].tag != all[1].tag)
    return prim_fail(comm, err_set(ncclInvalidUsage, "rank %d: rank %d's broadcast does not match this one (count, "
                                   "datatype or root differ)", me, 1 - me));
  const struct split_desc* peer = &all[1 - me];
  struct split_result r = {1, 0};
  /* Out of place, the root's own copy comes first and the reader starts
   * meanwhile; up to SPLIT_ALONE bytes the reader then takes the whole
   * buffer in one read: the root's copy takes about as long, and the split
   * only added system calls (2 ranks, 32-128 KiB: 0.7-0.9 us a call). */
  int all_at_once = !is_root && all[root].out_of_place && bytes <= SPLIT_ALONE;
  if (is_root && a->recvbuff != a->sendbuff) prim_copy_out(a->recvbuff, a->sendbuff, bytes, a->out_far);
  uint64_t cur = 0, k, end;
  if (is_root && nblocks < SPLIT_ROOT_BLOCKS) goto done;
  for (;;) {
    cur = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    do {
      if (claim_tag(cur) != tag || claim_front(cur) >= claim_back(cur)) goto done;
      k = is_root ? claim_back(cur) - 1 : claim_front(cur);
      end = all_at_once ? claim_back(cur) : k + 1;
    } while (!__atomic_compare_exchange_n(w, &cur,
                                          is_root ? claim_pack(tag, claim_front(cur), k) : claim_pack(tag, end, claim_back(cur)),
                                          0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    size_t off = (size_t)k * blk, len = COLLIE_MIN(is_root ? blk : (size_t)(end - k) * blk, bytes - off);
    ncclResult_t res = is_root ? cma_write(peer->pid, peer->addr + off, (const char*)a->sendbuff + off, len, &r.err)
                               : cma_read(peer->pid, (char*)a->recvbuff + off, peer->addr + off, len, &r.err);
    if (res != ncclSuccess) {
      r.ok = 0;
      break;
    }
    if (is_root) comm->bcast_pushed++;
  }
done:;
  /* The root waits for its reader: its buffer must stay until the reader
   * has read its blocks. A reader that took every block itself (the root
   * wrote nothing here) need not wait for the root and goes on, as a
   * single-copy reader always did. */
  struct split_result rs[2];
  if (!is_root && r.ok && claim_back(cur) == nblocks) {
    NCCLCHECK(direct_shm_post(comm, &r, sizeof(r)));
    return ncclSuccess;
  }
  NCCLCHECK(direct_shm_share(comm, &r, sizeof(r), rs));
  for (int i = 0; i < 2; i++)
    if (!rs[i].ok)
      return prim_fail(comm, err_set(ncclSystemError, "rank %d: single-copy broadcast: rank %d could not %s rank %d's "
                                     "buffer (%s)", me, i, i == root ? "write to" : "read", 1 - i,
                                     strerror(rs[i].err)));
  return ncclSuccess;
}

/* Under COLLIE_CMA=auto the row is weighed from the point-to-point
 * threshold on (graph/tuning.c); COLLIE_CMA=1 allows every size. */
static int eligible(const struct coll_args* a) { return coll_cma_eligible(a); }

/* The n-1 readers each read the root's block once (half the FIFO's copies),
 * at its core's private-cache rate while the root's block and its own copy
 * fit there. The root only waits, so the readers have the host's CPUs to
 * themselves: the table's rates are a CPU's share when every rank copies
 * (graph/tuning.c divides them by the ranks per CPU), a reader that has a
 * CPU copies at the whole rate. One system call moves a reader's whole
 * block, so with more readers than CPUs they run in rounds, each a handshake
 * and a whole block (4 ranks on 2 CPUs, 2-32 MiB: two blocks' time; 8 ranks:
 * four), and the root returns once its last reader has released its buffer
 * (8 ranks on 2 CPUs, 32 KiB: 35 us against the ring's 12). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  if (n == 2) {
    /* Two copiers where the two ranks have a CPU each, a system call per
     * block, two exchanges; each copier's blocks are its share of a block's
     * footprint. */
    double blk = (double)split_block((size_t)bytes), blocks = ceil(bytes / blk);
    double copiers = COLLIE_MIN(blocks < SPLIT_ROOT_BLOCKS ? 1.0 : 2.0, COLLIE_MAX(1.0, comm->cpus_per_rank * 2.0));
    return 2.0 * c->link.alpha_us + ceil(blocks / copiers) * c->cma_call_us +
           bytes / (copiers * tune_cma_bw(c, 2.0 * bytes / copiers) * comm->oversub);
  }
  double cpus = COLLIE_MAX(1.0, comm->cpus_per_rank * n);
  double rounds = ceil((n - 1) / COLLIE_MIN((double)(n - 1), cpus));
  return rounds * (tune_cma_handshake_us(c) + bytes / (tune_cma_bw(c, 2.0 * bytes) * comm->oversub));
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes == 0) return ncclSuccess;
  if (n == 2) return run_split(a);
  struct p2p_op* ops = calloc((size_t)n + 1, sizeof(*ops));
  if (!ops) return err_set(ncclSystemError, "out of memory in a single-copy broadcast");
  int k = 0;
  uint64_t tok = coll_token(a, bytes);
  if (r == a->root) {
    for (int i = 1; i < n; i++)
      ops[k++] = (struct p2p_op){.peer = (r + i) % n, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes,
                                 .token = tok, .single_copy = 1};
    /* Out of place, the root's own copy is a message to itself: the batch
     * makes it while the readers read, not before they can start. */
    if (a->recvbuff != a->sendbuff) {
      ops[k++] = (struct p2p_op){.peer = r, .is_send = 1, .buf = (char*)a->sendbuff, .bytes = bytes, .token = tok};
      ops[k++] = (struct p2p_op){.peer = r, .is_send = 0, .buf = a->recvbuff, .bytes = bytes, .token = tok};
    }
  } else {
    ops[k++] = (struct p2p_op){.peer = a->root, .is_send = 0, .buf = a->recvbuff, .bytes = bytes, .token = tok,
                               .single_copy = 1};
  }
  ncclResult_t res = p2p_run(comm, ops, k, 0);
  free(ops);
  return res;
}

const struct algo algo_cma_broadcast = {COLL_BROADCAST, ALGO_CMA, PROTO_SIMPLE, 0, eligible, estimate, run};
