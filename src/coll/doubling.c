/* Recursive doubling over point-to-point connectors, for small allreduces
 * between hosts: in step k every rank swaps its partial result with the rank
 * whose number differs in bit k and combines the two, so after log2(n) steps
 * every rank holds the whole result. Each rank sends log2(n) messages a call
 * where the one-shot (direct_net.c) sends n-1: on a machine whose ranks are
 * hosts of their own and outnumber its CPUs every message is CPU time the
 * other ranks wait for (tuning.c, sock_oversub), and there the fewer
 * messages win although the steps follow one another.
 *
 * A rank count that is not a power of two folds first: of the first 2*rem
 * ranks (rem = n less the largest power of two p below it), each even one
 * hands its data to the odd one above it and waits; the odd ones and the
 * ranks from 2*rem on, p in all, run the doubling, and each odd one hands
 * the result back at the end.
 *
 * Every rank gets the same bits: a pair combines (lower rank's partial) OP
 * (higher rank's partial) on both sides, so both hold the same value after
 * every step.
 *
 * The same row holds the reduce-scatter by recursive halving (the same
 * pairs, the other way round, with half the data at each step), the
 * allgather (by doubling where n is a power of two, also for large buffers;
 * else Bruck's) and Bruck's alltoall. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "../transport/transport.h"

static size_t doubling_max_bytes(void) { return 64 * 1024; }

/* Between hosts only (shared memory has its mailboxes). The estimates
 * decide against the one-shot: it wins where messages are cheap (its single
 * step), this row where the crowding makes them dear, and above the
 * one-shot's 32 ranks. */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt) * (a->kind == COLL_ALLREDUCE ? 1u : (size_t)comm->nranks);
  return !coll_shm_only(comm) && comm->nranks > 2 && bytes <= doubling_max_bytes();
}

/* The allgather of a power of two of ranks runs in place in the receive
 * buffer (below: no work buffer, no copy at the end), and up to this many
 * bytes in all it beat the ring: over loopback TCP on 2 CPUs, a host per
 * rank, unbound, medians of 3 interleaved rounds, us, ring in whole slots /
 * doubling: 4 ranks 2 MiB 1987 / 1619, 8 MiB 7542 / 6191, 32 MiB 37680 /
 * 27316; 8 ranks 8 MiB 18300 / 17132, 32 MiB 76458 / 72124; beside a busy
 * loop 8 ranks 8 MiB 29330 / 23415, 32 MiB 108004 / 82612 (Open MPI 92-114
 * ms), 4 ranks 8 MiB 13693 / 10004. At 128 MiB the ring's steps overlap
 * better (4 ranks 116167 / 123974, 8 ranks 263269 / 276216) and a doubling
 * step's single exchange of half the buffer waits for the slowest pair
 * (docs/BENCHMARKS.md, eightieth session). Measured with a host per rank
 * only: where hosts hold several ranks, large allgathers keep the ring. */
#define DOUBLING_ALLGATHER_MAX_BYTES ((size_t)32 << 20)

static int pow2(int n) { return (n & (n - 1)) == 0; }

static int eligible_allgather(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt) * (size_t)comm->nranks;
  return eligible(a) || (comm->nhosts == comm->nranks && comm->nranks > 2 && pow2(comm->nranks) &&
                         bytes <= DOUBLING_ALLGATHER_MAX_BYTES);
}

/* The largest power of two not above n: the ranks that take part in the
 * doubling or halving (the other n - pw fold into a neighbour). */
static int pow2_floor(int n) {
  int pw = 1;
  while (pw * 2 <= n) pw *= 2;
  return pw;
}

/* Bruck's alltoall saves messages only where ceil(log2 n) < n-1 (not at 3
 * ranks: 2 steps against 2 messages each way), and pays for it with copies
 * and steps that wait for each other: past about 12 KiB per block the
 * pairwise exchange's overlapping messages win. Measured while it still
 * rotated in and out and unpacked each step (twice today's copies; 8 ranks
 * gained up to a fifth since, 4 ranks within the spread), over loopback TCP
 * on 2 CPUs, a host per rank, unbound, medians of 5-7 rounds, us, Bruck / pairwise
 * (bench/ab_env.sh alltoall def=X=1 p2p=NCCL_ALGO=P2P): 3 ranks, 60 B - 64 KiB
 * in all, 15.6-32.4 / 14.3-24.1 at every size; 4 ranks 64 KiB (16 KiB blocks)
 * 51.1 / 38.3 (bound 45.0 / 32.8), 32 KiB 33.1 / 35.3; 5 ranks 64 KiB (13 KiB)
 * 92.6 / 67.7, 16 KiB 51.2 / 57.8; 6 ranks 64 KiB (11 KiB) 88.8 / 101.1; 8
 * ranks 64 KiB (8 KiB) 165 / 185, 128 KiB 255 / 198. */
#define BRUCK_ALLTOALL_MAX_BLOCK (12 * 1024)

static int eligible_alltoall(const struct coll_args* a) {
  int n = a->comm->nranks;
  return eligible(a) && coll_ceil_log2(n) < n - 1 && a->count * dtype_size(a->dt) <= BRUCK_ALLTOALL_MAX_BLOCK;
}

/* A step is a message each way; ceil(log2 n) of them: the allreduce's
 * swaps plus one for the fold and the unfold together (a message one way
 * each, only 2*rem ranks take part), and the steps of both Bruck schemes.
 * Where messages are dear (sock_oversub) the one-shot counts each of its n-1
 * as a step (direct_net.c). 3 / 5 / 6 ranks
 * over loopback TCP on 2 CPUs, 8 B, us, one-shot / doubling / Open MPI:
 * 13.9 / 11.5 / 16.7, 41.0 / 25.1 / 38.2, 52.5 / 29.9 / 47.4. */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  if (a->kind == COLL_ALLGATHER) return coll_ceil_log2(n) * c->link.alpha_us + (n - 1) * bytes / c->link.bw;
  if (a->kind == COLL_ALLTOALL) return coll_ceil_log2(n) * (c->link.alpha_us + (n / 2) * bytes / c->link.bw);
  if (a->kind == COLL_REDUCESCATTER) {
    /* Halving: (pw-1)/pw of the buffer; the fold sends all of it, the unfold a block. */
    int pw = pow2_floor(n);
    double all = bytes * n, moved = all * (pw - 1) / pw + (pw < n ? all + bytes : 0.0);
    return coll_ceil_log2(n) * c->link.alpha_us + moved / c->link.bw;
  }
  return coll_ceil_log2(n) * (c->link.alpha_us + bytes / c->link.bw);
}

/* One step: `out` goes to rank `to` (-1: nothing goes), `in_bytes` from
 * rank `from` (-1: nothing comes) arrive in `tmp`. `out` may be the caller's
 * buffer, which a socket may still read from after the batch
 * (send_commit_ext): it must have left before the caller overwrites it. */
static ncclResult_t step2(struct coll_args* a, int to, const char* out, size_t out_bytes, int from, char* tmp,
                          size_t in_bytes) {
  struct p2p_op ops[2];
  int k = 0;
  uint64_t tok = coll_token(a, a->count * dtype_size(a->dt));
  if (to >= 0) ops[k++] = (struct p2p_op){.peer = to, .is_send = 1, .buf = (char*)out, .bytes = out_bytes, .token = tok};
  if (from >= 0) ops[k++] = (struct p2p_op){.peer = from, .is_send = 0, .buf = tmp, .bytes = in_bytes, .token = tok};
  NCCLCHECK(p2p_run(a->comm, ops, k, 0));
  return to >= 0 ? transport_flush(a->comm) : ncclSuccess;
}

/* A swap of `bytes` with `peer` (do_send / do_recv: either half alone). */
static ncclResult_t swap(struct coll_args* a, int peer, const char* out, char* tmp, size_t bytes, int do_send,
                         int do_recv) {
  return step2(a, do_send ? peer : -1, out, bytes, do_recv ? peer : -1, tmp, bytes);
}

/* The real rank of doubling rank v. */
static int real_rank(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

/* The fold: of the first 2*rem ranks each even one hands `bytes` of `buf`
 * (`count` elements, already scaled) to the odd one above it, which combines
 * them into its own (lower OP higher). Sets *v to this rank's number in the
 * doubling, -1 for a rank folded away. */
static ncclResult_t fold(struct coll_args* a, const struct red_op* sum, int rem, char* buf, char* tmp, size_t bytes,
                         size_t count, int* v) {
  int r = a->comm->rank;
  *v = r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem;
  if (r >= 2 * rem) return ncclSuccess;
  if (r % 2 == 0) return swap(a, r + 1, buf, tmp, bytes, 1, 0);
  NCCLCHECK(swap(a, r - 1, buf, tmp, bytes, 0, 1));
  red_reduce(sum, buf, tmp, buf, count);
  return ncclSuccess;
}

/* The allreduce of `count` elements from `in` into `out` (may be `in`). */
static ncclResult_t allreduce(struct coll_args* a, const void* in, char* out, size_t count) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t bytes = count * dtype_size(a->dt);
  int pw = pow2_floor(n), rem = n - pw;
  char small[4096];
  char* tmp = bytes <= sizeof(small) ? small : malloc(bytes);
  if (!tmp) return err_set(ncclSystemError, "out of memory in a recursive-doubling %s", coll_name(a->kind));
  /* Partials are already scaled (premulsum): later steps only sum. */
  struct red_op sum = a->op;
  if (sum.kind == RED_PREMULSUM) sum.kind = RED_SUM;
  red_pre(&a->op, out, in, count);
  int v; /* this rank's number in the doubling; -1: folded away */
  ncclResult_t res = fold(a, &sum, rem, out, tmp, bytes, count, &v);
  for (int mask = 1; v >= 0 && mask < pw && res == ncclSuccess; mask <<= 1) {
    int pv = v ^ mask;
    res = swap(a, real_rank(pv, rem), out, tmp, bytes, 1, 1);
    if (res != ncclSuccess) break;
    if (v < pv) red_reduce(&sum, out, out, tmp, count);
    else red_reduce(&sum, out, tmp, out, count);
  }
  if (res == ncclSuccess && r < 2 * rem) {
    if (r % 2 == 1) res = swap(a, r - 1, out, tmp, bytes, 1, 0);
    else res = swap(a, r + 1, out, out, bytes, 0, 1);
  }
  if (res == ncclSuccess && a->avg) red_div(a->dt, out, out, count, n);
  if (tmp != small) free(tmp);
  return res;
}

/* The blocks of doubling ranks lo..hi-1, as a byte offset and length: rank
 * v < rem stands for real ranks 2v and 2v+1 (two blocks), the others for one
 * each, so the share of v starts at block 2v or v+rem. */
static void share(int lo, int hi, int rem, size_t b, size_t* off, size_t* len) {
  size_t first = (size_t)(lo < rem ? 2 * lo : lo + rem), end = (size_t)(hi < rem ? 2 * hi : hi + rem);
  *off = first * b;
  *len = (end - first) * b;
}

/* Reduce-scatter by recursive halving: the doubling ranks split their range
 * of blocks in two at every step; each keeps the half holding its own share,
 * sends the other half to the rank differing in that bit and combines the
 * half it gets (lower rank's OP higher's). log2(n) messages of n/2, n/4, ...
 * blocks: the ring's bytes in fewer, larger messages. The fold first (the
 * whole buffer), and at the end the odd rank of a folded pair sends the even
 * one its block. */
static ncclResult_t reducescatter(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t esz = dtype_size(a->dt), b = a->count * esz, all = a->count * (size_t)n;
  int pw = pow2_floor(n), rem = n - pw;
  char small[8192];
  char* acc = 2 * b * (size_t)n <= sizeof(small) ? small : malloc(2 * b * (size_t)n);
  if (!acc) return err_set(ncclSystemError, "out of memory in a recursive-halving reduce-scatter");
  char* tmp = acc + b * (size_t)n;
  struct red_op sum = a->op;
  if (sum.kind == RED_PREMULSUM) sum.kind = RED_SUM;
  red_pre(&a->op, acc, a->sendbuff, all);
  int v;
  ncclResult_t res = fold(a, &sum, rem, acc, tmp, b * (size_t)n, all, &v);
  int lo = 0, hi = pw;
  for (int mask = pw / 2; v >= 0 && mask >= 1 && res == ncclSuccess; mask /= 2) {
    int pv = v ^ mask, mid = lo + (hi - lo) / 2, low = v < mid;
    size_t ko, kb, so, sb;
    share(low ? lo : mid, low ? mid : hi, rem, b, &ko, &kb); /* the half kept */
    share(low ? mid : lo, low ? hi : mid, rem, b, &so, &sb); /* the half sent */
    res = step2(a, real_rank(pv, rem), acc + so, sb, real_rank(pv, rem), tmp, kb);
    if (res != ncclSuccess) break;
    if (v < pv) red_reduce(&sum, acc + ko, acc + ko, tmp, kb / esz);
    else red_reduce(&sum, acc + ko, tmp, acc + ko, kb / esz);
    if (low) hi = mid;
    else lo = mid;
  }
  char* out = a->recvbuff;
  if (res == ncclSuccess && r < 2 * rem) {
    if (r % 2 == 1) res = swap(a, r - 1, acc + (size_t)(r - 1) * b, tmp, b, 1, 0);
    else res = swap(a, r + 1, NULL, out, b, 0, 1);
  }
  if (res == ncclSuccess) {
    if (v >= 0) memcpy(out, acc + (size_t)r * b, b);
    if (a->avg) red_div(a->dt, out, out, a->count, n);
  }
  if (acc != small) free(acc);
  return res;
}

/* Allgather by recursive doubling, n a power of two: before step k this
 * rank holds, in place in the receive buffer, the 2^k blocks of the ranks
 * that share its number but for the low k bits; it swaps them with the rank
 * whose number differs in bit k, whose 2^k blocks land next to its own. */
static ncclResult_t allgather_pow2(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t b = a->count * dtype_size(a->dt);
  char* out = a->recvbuff;
  if (out + (size_t)r * b != (const char*)a->sendbuff) memcpy(out + (size_t)r * b, a->sendbuff, b);
  ncclResult_t res = ncclSuccess;
  for (int mask = 1; mask < n && res == ncclSuccess; mask <<= 1) {
    int pr = r ^ mask;
    size_t mine = (size_t)(r & ~(mask - 1)) * b, theirs = (size_t)(pr & ~(mask - 1)) * b, len = (size_t)mask * b;
    res = step2(a, pr, out + mine, len, pr, out + theirs, len);
  }
  return res;
}

/* Allgather by Bruck's scheme (any rank count): after step k this rank holds
 * the blocks of ranks r .. r+2^k-1 (mod n) in that order in `acc`; in step k
 * it sends the first min(2^k, n-2^k) of them to rank r-2^k and receives as
 * many from rank r+2^k; at the end block i of `acc` is rank (r+i) mod n's. */
static ncclResult_t allgather(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t b = a->count * dtype_size(a->dt);
  if (pow2(n)) return allgather_pow2(a);
  char* acc = malloc(b * (size_t)n);
  if (!acc) return err_set(ncclSystemError, "out of memory in a Bruck allgather");
  memcpy(acc, a->sendbuff, b);
  ncclResult_t res = ncclSuccess;
  int have = 1;
  for (int d = 1; d < n && res == ncclSuccess; d *= 2) {
    int m = d < n - d ? d : n - d;
    res = step2(a, (r - d + n) % n, acc, (size_t)m * b, (r + d) % n, acc + (size_t)have * b, (size_t)m * b);
    have += m;
  }
  if (res == ncclSuccess) {
    char* out = a->recvbuff;
    for (int i = 0; i < n; i++) {
      char* dst = out + (size_t)((r + i) % n) * b;
      if (dst != acc + (size_t)i * b) memcpy(dst, acc + (size_t)i * b, b);
    }
  }
  free(acc);
  return res;
}

/* Alltoall by Bruck's scheme: block i first holds what this rank sends to
 * rank r+i; in step k every block whose index has bit k set goes to rank
 * r+2^k, which keeps it at the same index, so at the end block i holds what
 * rank r-i sent here. ceil(log2 n) messages each way, of about n/2 blocks
 * each, where the pairwise exchange (p2p.c) sends n-1.
 *
 * Blocks stay where they are and `at` says where each is: the first step
 * packs straight from the send buffer (no rotation into a work buffer),
 * every step's message lands in a region of its own (nothing later writes
 * over a block that is still to go, so no unpacking), and each block is
 * copied once into the receive buffer at the end: a pack per step and one
 * copy out, half the copies of rotating in, packing, unpacking and
 * rotating out (8 ranks: 20 blocks copied a call against 40). */
static ncclResult_t alltoall(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  int n = comm->nranks, r = comm->rank;
  size_t b = a->count * dtype_size(a->dt);
  /* Block i travels once for each bit set in i; no step moves more than the
   * first, n/2 blocks (of any 2d indices, d have bit d set). */
  size_t got = 0, most = (size_t)n / 2;
  for (int i = 1; i < n; i++) got += (size_t)__builtin_popcount((unsigned)i);
  const char** at = malloc(sizeof(const char*) * (size_t)n + (got + most) * b); /* pointers first: aligned */
  if (!at) return err_set(ncclSystemError, "out of memory in a Bruck alltoall");
  char *pack = (char*)(at + n), *land = pack + most * b;
  const char* in = a->sendbuff;
  for (int i = 0; i < n; i++) at[i] = in + (size_t)((r + i) % n) * b;
  ncclResult_t res = ncclSuccess;
  for (int d = 1; d < n && res == ncclSuccess; d *= 2) {
    size_t m = 0;
    for (int i = 0; i < n; i++)
      if (i & d) memcpy(pack + (m++) * b, at[i], b);
    res = step2(a, (r + d) % n, pack, m * b, (r - d + n) % n, land, m * b);
    m = 0;
    for (int i = 0; res == ncclSuccess && i < n; i++)
      if (i & d) at[i] = land + (m++) * b;
    land += m * b;
  }
  char* out = a->recvbuff;
  for (int i = 0; res == ncclSuccess && i < n; i++) memcpy(out + (size_t)((r - i + n) % n) * b, at[i], b);
  free(at);
  return res;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  if (a->count == 0) return ncclSuccess;
  switch (a->kind) {
    case COLL_ALLREDUCE: return allreduce(a, a->sendbuff, a->recvbuff, a->count);
    case COLL_REDUCESCATTER: return reducescatter(a);
    case COLL_ALLGATHER: return allgather(a);
    case COLL_ALLTOALL: return alltoall(a);
    default: return err_set(ncclInternalError, "recursive doubling has no %s", coll_name(a->kind));
  }
}

#define DOUBLING_ROW(coll, elig) {coll, ALGO_DOUBLING, PROTO_LL, 0, elig, estimate, run}
const struct algo algo_doubling_allreduce = DOUBLING_ROW(COLL_ALLREDUCE, eligible);
const struct algo algo_doubling_reducescatter = DOUBLING_ROW(COLL_REDUCESCATTER, eligible);
const struct algo algo_doubling_allgather = DOUBLING_ROW(COLL_ALLGATHER, eligible_allgather);
const struct algo algo_doubling_alltoall = DOUBLING_ROW(COLL_ALLTOALL, eligible_alltoall);
