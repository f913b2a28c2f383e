/* Direct shared-memory algorithms for small messages on one host ("one
 * shot"): every rank copies its input into its own mailbox in shared memory
 * and raises a flag; every rank then reads what it needs straight from the
 * peers' mailboxes. One exchange of flags instead of 2(n-1) ring steps.
 * Reductions combine the mailboxes in rank order on every rank, so all ranks
 * get bitwise identical results. Each rank's mailbox is a ring of NSLOTS
 * small slots (a cache line with the flag, token and up to INLINE_BYTES of
 * data, plus SMALL_BYTES of payload) and two large buffers used alternately,
 * so a rank that waits for nobody (a broadcast or scatter root, a reduce or
 * gather non-root) runs up to NSLOTS calls ahead of its readers; it reuses
 * a slot or buffer only after every peer has finished reading it (their
 * `done` counters; within a streamed broadcast, their `ack` of each chunk).
 * The segments are memfds mapped through /proc/<pid>/fd (nothing in /dev/shm). */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <math.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll.h"
#include "../failures.h"
#include "../futex.h"
#include "../graph/bind.h"
#include "../transport/shmseg.h"

#define MB_CTRL_BYTES 12288
#define TAG_DIRECT_SETUP 0x7f000010u
#define TAG_DIRECT_DONE 0x7f000011u

#define INLINE_BYTES 40
/* How many calls a rank may run ahead of its slowest reader, and the payload
 * of one small slot (messages above it use the two large buffers). */
#define NSLOTS 64
#define SMALL_BYTES 4096
/* From this message size on, a shared-memory waiter moves off its peer's CPU
 * only every UNPAIR_LARGE_INTERVAL_NS (see prim_unpair). With a CPU hog beside
 * 2 unbound ranks, the 2 ms moves made broadcast 2 MiB take 700 us and 8 MiB
 * 2600 (Open MPI 400/1620), allreduce 8 MiB 3250 us, against 465/1730/2910
 * with the 2 MiB limit; a 512 KiB limit lost at allgather 2 MiB (1 MiB a
 * rank: 367 us against 154), whose ranks gain from running apart. */
#define SHM_UNPAIR_LARGE (2u << 20)
/* After a call that used only slots a rank publishes its `done` counter
 * every DONE_EVERY calls, not every call: a writer at the end of its ring
 * polls that line, and a store to it in every call took it back from the
 * writer each time (on the reader, the side that is behind). A writer may
 * therefore find a reader up to DONE_EVERY - 1 calls further than its
 * counter says, and it runs at least NSLOTS - DONE_EVERY + 1 calls ahead of
 * a reader that has stopped calling. No wait can close a circle through it:
 * a writer at call s needs the counter at s - NSLOTS for a slot, and a reader
 * waiting for that writer's call s has finished call s - 1 and published
 * s - DONE_EVERY or later. A large buffer is reused two calls later, so a
 * call that used one publishes at once (a counter held back there left
 * every rank of a run of reduce-scatters waiting for the others'). */
#define DONE_EVERY 8
/* Calls published on the call board that peers can still look up. */
#define BOARD_DEPTH 64
/* Communicators up to this size stream broadcasts larger than a buffer. */
#define ACK_RANKS 64

/* One cache line per call parity: the ready flag, the call's arguments and,
 * for payloads up to INLINE_BYTES, the data itself, so a peer gets all of it
 * in one cache-line transfer. */
struct mb_line {
  uint32_t seq; /* the direct call whose data this line (and mailbox half) holds */
  /* A chunked broadcast (bcast_chunked): the root's stream count (chunks
   * it ever published as a root) after this call's chunks so far, and
   * where this call's count began. Monotonic, so a value left from an
   * earlier call never passes for this one's. */
  uint32_t progress;
  int32_t root;
  uint32_t first;
  uint64_t token;
  char data[INLINE_BYTES];
};

/* One call-board entry (a seqlock: readers ignore it while seq is 0 or
 * changes under them). */
struct board_entry {
  uint32_t seq;
  int32_t root;
  uint64_t token;
};

struct mb_ctrl {
  struct mb_line line[NSLOTS];
  uint32_t done; /* seq of the last direct call whose peers' data this rank has finished reading */
  /* The CPU this rank last ran a call on (checked at the end of each call,
   * stored when it changed): a waiter whose peer sits on its own CPU stops
   * spinning at once, since the peer cannot run until it gives the CPU up
   * (unbound ranks that wake each other are often pulled onto one CPU). A
   * line of its own: waiters read it while this rank writes `done`. */
  int32_t cpu __attribute__((aligned(64)));
  int32_t tid; /* the thread that last published `cpu` from a wait (COLLIE_SPREAD) */
  /* The call board: every collective publishes its sequence number and
   * arguments here (entry seq % BOARD_DEPTH), so a rank that has waited a
   * while can tell a peer that is merely slow from one that called something
   * else (which would otherwise hang both when their calls picked different
   * algorithms), also when that peer has already run a few calls ahead. */
  struct board_entry board[BOARD_DEPTH] __attribute__((aligned(64)));
  /* How many peers sleep on each line's seq and on `done` (futex). Apart
   * from the words they count: a writer reads its counter right after its
   * store, and a counter on the line it just wrote made that read wait for
   * the line to come back from the reader that had it (a third of a
   * broadcast root's time at 2 ranks, 8 B). Here they stay in every
   * cache, read-only, until somebody sleeps. */
  uint32_t line_waiters[NSLOTS] __attribute__((aligned(64)));
  uint32_t done_waiters;
  /* A broadcast streamed through a root's ring (bcast_stream):
   * ack[r] is the stream count of root r up to which this rank has copied
   * its chunks out, so that root may overwrite them. */
  uint32_t ack[ACK_RANKS] __attribute__((aligned(64)));
  uint32_t ack_waiters;
  /* This rank as the root of a streamed broadcast: the stream count of the
   * chunk it is writing into the ring now (a seqlock for readers that fell
   * a ring behind: a chunk copied out while `claim` passed it may be torn)
   * and the address of its buffer, which such readers read instead. */
  uint32_t claim __attribute__((aligned(64)));
  uint64_t src;
  /* Work shared out by blocks (direct_shm_claim_word): a line of its own. */
  uint64_t work __attribute__((aligned(64)));
  /* This rank's latest figures for each weighed collective and size
   * (direct_shm_rates), each under a sequence count: odd while written. */
  struct rate_post {
    uint32_t seq;
    uint32_t v[4]; /* floats, as bits */
  } rates[ADAPT_KINDS * ADAPT_BUCKETS] __attribute__((aligned(64)));
};
_Static_assert(sizeof(struct mb_line) == 64, "one cache line");
_Static_assert(sizeof(struct mb_ctrl) <= MB_CTRL_BYTES, "control fits its page");

struct direct_state {
  int n;
  uint32_t call_seq;
  uint64_t call_token;
  int32_t call_root;
  size_t cap; /* bytes per large mailbox buffer */
  size_t ring_bytes; /* a streamed broadcast's ring: the large buffers and what follows them */
  uint32_t seq;
  int last_symmetric; /* the previous direct call had every rank wait for every other */
  /* Where this call's payload lives (the same on every rank that agrees on
   * the call): inline in the slot's line, the slot's small buffer, or large
   * buffer `big`; and the direct seq that last used each large buffer. */
  int where; /* 0 inline, 1 small, 2 large, 3 the broadcast ring, both large buffers and on (bcast_stream) */
  int big;
  uint32_t nbig;
  uint32_t big_used[2];
  size_t wrote; /* payload bytes this rank put in its place in this call */
  int ahead;    /* every peer direct_exchange waited for had published before it looked */
  int prefetchw; /* the CPU has prefetch-for-store (direct_end) */
  uint32_t* peer_done; /* by rank: the last value read of its done counter */
  uint32_t* peer_ack;  /* by rank: the last value read of its ack[] of this rank */
  unsigned char* left; /* by rank: a streamed broadcast's root went on without it (this call) */
  uint32_t stream;     /* chunks this rank published as a broadcast root, ever */
  int64_t look_ns;     /* when allgather_lag last looked whether other tasks want a CPU */
  int looked_busy;     /* what that look saw: 1 some did */
  int busy;            /* what two looks in a row agreed on (0 until they do) */
  struct mb_ctrl** ctrl; /* by rank */
  char** small;          /* by rank: NSLOTS buffers of SMALL_BYTES */
  char** data;           /* by rank: 2 buffers of cap bytes */
  struct shm_seg* segs;  /* by rank: the mappings */
  size_t map_len;
};

static size_t direct_max_bytes(void) { return 256 * 1024; }

/* A large broadcast payload goes out in chunks: the root publishes the call
 * after its first chunk and its progress after each, so readers copy out
 * while it still copies in (the root's copy no longer adds to theirs). */
#define BCAST_CHUNK ((size_t)16384)
static int bcast_chunked(size_t bytes) { return bytes > BCAST_CHUNK; }
static uint32_t bcast_chunks(size_t bytes) { return (uint32_t)((bytes + BCAST_CHUNK - 1) / BCAST_CHUNK); }
/* Larger than a large buffer: the root streams the payload through a ring
 * of chunks (BCAST_RING_BYTES: both large buffers and the space after
 * them), overwriting a chunk once every reader acknowledged it or was left
 * behind (wait_acks), at every size. It stopped at 8 MiB until leaving
 * laggards behind existed (a call spanning several of the scheduler's slices
 * meets a reader descheduled now and then; beside a CPU hog, while the root
 * waited for every reader, streamed 32 MiB took 1.3-1.6x as long as single
 * copy). Since then, bound, medians of 5 interleaved rounds, ms at 8 / 32 /
 * 128 MiB, streamed against single copy (Open MPI): 4 ranks on 2 CPUs 1.52 /
 * 6.75 / 27.6 against 1.62 / 10.8 / 42.5 (3.38 / 14.0 / 53.0), with a hog
 * 2.89 / 12.3 / 49.3 against 2.76 / 16.4 / 61.1 (4.98 / 18.2 / 74.7); 8
 * ranks 3.52 / 16.3 / 72.0 against 4.09 / 21.9 / 87.5 (4.51 / 21.2 / 95.1),
 * with a hog 5.10 / 22.0 / 79.8 against 5.41 / 24.9 / 100 (4.76 / 26.9 /
 * 103); 8 ranks at 16 MiB 6.38 against 11.4 (11.6) (docs/BENCHMARKS.md,
 * thirty-seventh session). Where single copy is off (COLLIE_CMA=0, or the
 * probe failed: agreed by every rank) a root cannot leave a reader behind,
 * and the limit stays: 8 ranks, 3 rounds, against the ring, 32 MiB 18.4 ms
 * against 13.1, 128 MiB 59.4 against 71.0, beside a hog 25.6 against 28.0
 * and 115 against 127: no clear winner, so what was measured before holds. */
#define BCAST_STREAM_NOLEAVE_MAX ((size_t)8 << 20)
/* The ring was the two large buffers (512 KiB) until 8 ranks on 2 CPUs,
 * broadcast of 8 MiB, measured 5.0 ms (median of 5 interleaved rounds,
 * rounds 2.4-5.7) against 3.1 ms (2.6-3.8) with a ring of 1 MiB and 3.3 ms
 * with 2 MiB (Open MPI 5.0 ms in the same run): a reader that the scheduler
 * set aside held the root up once the root was a ring ahead. 2 and 4 ranks,
 * 2-8 MiB: within the rounds' spread. The part past the large buffers is
 * faulted in by the first streamed broadcast, not at setup. */
#define BCAST_RING_BYTES ((size_t)1 << 20)
/* A streamed broadcast's root waits at most this long for a reader that is
 * a whole ring behind (a reader the scheduler has set aside, or one that
 * came late); then, where single copy works (comm->cma), it goes on without
 * that reader, which finds the chunk it wanted overwritten (`claim`) and
 * reads the rest straight from the root's buffer; the root waits for it
 * only at the end, while its buffer must stay. */
#define BCAST_LAG_NS 200000

static int bcast_stream(const struct ncclComm* comm, size_t bytes) {
  return bytes > direct_max_bytes() && comm->nranks <= ACK_RANKS && (comm->cma || bytes <= BCAST_STREAM_NOLEAVE_MAX);
}
_Static_assert(256 * 1024 % BCAST_CHUNK == 0 && BCAST_RING_BYTES % BCAST_CHUNK == 0, "the ring holds whole chunks");

/* No fence between the store and the waiter check: a full fence here would
 * wait for the store to reach the cache on every call. The waiter closes
 * the gap instead (wait_seq): after announcing itself it keeps polling for
 * far longer than a store takes to become visible before it sleeps, and it
 * never sleeps without a timeout. */
static void publish(uint32_t* word, uint32_t* waiters, uint32_t v) {
  __atomic_store_n(word, v, __ATOMIC_RELEASE);
  if (__atomic_load_n(waiters, __ATOMIC_RELAXED)) futex_wake(word, 64, 1);
}

/* Whether this CPU has PREFETCHW (x86: CPUID 0x80000001, ECX bit 8); the
 * instruction is not used where it is not announced. */
static int have_prefetchw(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  return __get_cpuid(0x80000001u, &a, &b, &c, &d) && (c & (1u << 8));
#else
  return 1;
#endif
}

/* Asks for the cache line at p in exclusive state now, so that a store to it
 * later does not wait for it. */
static inline void prefetch_for_store(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetchw %0" ::"m"(*(const char*)p));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

ncclResult_t board_give_way(struct ncclComm* comm, int peer) {
  struct direct_state* d = comm->direct;
  if (!d || peer < 0 || peer >= d->n || peer == comm->rank) return ncclSuccess;
  /* A waiter runs: its CPU is where it is now. Written only when it changed
   * (the line also holds `done`, which peers poll). */
  int me = sched_getcpu();
  int32_t* mine = &d->ctrl[comm->rank]->cpu;
  if (__atomic_load_n(mine, __ATOMIC_RELAXED) != me) __atomic_store_n(mine, me, __ATOMIC_RELAXED);
  if (me < 0 || __atomic_load_n(&d->ctrl[peer]->cpu, __ATOMIC_RELAXED) != me) return ncclSuccess;
  NCCLCHECK(comm_stop_check(comm)); /* a yield may be long on a crowded CPU */
  /* Two ranks that wait for each other on one CPU run one at a time, a
   * context switch per handoff (~3 us a symmetric call at 2 ranks), while
   * another CPU runs something else: the scheduler keeps such a pair
   * together (the wake-ups and yields between them look like one task
   * handing work to another). With room for every local rank, the higher
   * rank of the pair moves itself off the shared CPU (prim_unpair: at most
   * every 2 ms, every 100 ms in calls of SHM_UNPAIR_LARGE and more). */
  if (prim_unpair(comm, peer, me, SHM_UNPAIR_LARGE)) {
    __atomic_store_n(mine, sched_getcpu(), __ATOMIC_RELAXED);
    return ncclSuccess;
  }
  bind_yield();
  return ncclSuccess;
}

/* How often a waiter of a communicator with more local ranks than CPUs
 * looks at where the ranks run (COLLIE_SPREAD). */
#define SPREAD_INTERVAL_NS 2000000

/* Unbound ranks that outnumber the CPUs stay where the scheduler first put
 * them: every one of them is always runnable (they yield, they seldom
 * sleep), so the kernel's balancer sees no idle CPU and rarely moves a task
 * it ran a moment ago. 8 ranks on 2 CPUs were left 5 and 3, or 6 and 2, for
 * whole runs, and a symmetric call waits for the crowded CPU's turn of each
 * of its ranks: alltoall of 32 B-2 KiB took 7-15 us a call there, 4.3-6.3 on
 * 4 and 4 (docs/BENCHMARKS.md). The CPUs the ranks published at the end of
 * their last one-shot call (direct_end) or in their last look from a wait
 * (here) say how they are spread; the one rank that bind_spread_target
 * picks moves itself and says where it now is. With two ranks a CPU the
 * place in the ring picks the CPU instead: ring neighbours that share a CPU
 * take turns on it at every step (4 ranks on 2 CPUs, each pinned, medians
 * of 3 runs: allreduce 512 KiB 299 us neighbours together against 192
 * apart, 2 MiB 1270 / 796, 8 MiB 4901 / 3234; reduce-scatter 2 MiB 502 /
 * 395), and counting ranks alone left either placement, whichever came
 * first. At 8 ranks on 2 CPUs blocks of neighbours did better at 128 KiB-2
 * MiB and worse at 8 MiB, and at 3 ranks on 2 alternating gained nothing:
 * the count rule stays there (docs/BENCHMARKS.md). */
/* Whether some task outside this communicator's ranks wants a CPU now: 1
 * yes (or cannot tell), 0 no. The kernel's count of runnable tasks
 * (machine-wide) less the ranks that were runnable both before and after it
 * was read: a rank asleep at that instant is in neither, and one that
 * changed state in between is not taken off, so the guess errs toward
 * "yes". (Comparing the count with the communicator's size alone let a
 * busy process pass whenever ranks slept in their waits: 8 ranks of a 2 MiB
 * reduce beside a CPU hog moved onto its CPU 70 times in one run, 19 ms a
 * call against 5.6 unmoved. Requiring every rank runnable never moved: the
 * rank alone on the emptier CPU has nobody to yield to and soon sleeps.) */
static int others_want_cpu(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  unsigned char was[64];
  int ours = 1, runnable = -1; /* this rank runs */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < d->n; i++) {
      if (i == comm->rank) continue;
      int tid = __atomic_load_n(&d->ctrl[i]->tid, __ATOMIC_RELAXED);
      int r = bind_thread_runnable(comm->peers[i].pid, tid > 0 ? tid : comm->peers[i].pid) == 1;
      if (pass == 0) was[i] = (unsigned char)r;
      else ours += r && was[i];
    }
    if (pass == 0 && (runnable = bind_runnable_tasks()) < 0) return 1;
  }
  return runnable > ours;
}

/* How long a rank that was refused a move waits before it looks again
 * (a refusal reads up to 3 (2n - 1) small files under /proc). */
#define SPREAD_REFUSED_NS 50000000

void board_spread(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  if (!comm->spread || d == NULL) return;
  int64_t now = time_ns();
  if (now - comm->spread_ns < SPREAD_INTERVAL_NS) return;
  comm->spread_ns = now;
  int32_t cpu_of[64];
  cpu_set_t mask;
  int me = sched_getcpu();
  struct mb_ctrl* my = d->ctrl[comm->rank];
  /* Where this rank runs now, not where its last call ended (point-to-point
   * and ring waits publish it only here), and which thread waits. */
  if (me >= 0 && __atomic_load_n(&my->cpu, __ATOMIC_RELAXED) != me) __atomic_store_n(&my->cpu, me, __ATOMIC_RELAXED);
  int32_t tid = (int32_t)syscall(SYS_gettid);
  if (__atomic_load_n(&my->tid, __ATOMIC_RELAXED) != tid) __atomic_store_n(&my->tid, tid, __ATOMIC_RELAXED);
  if (d->n > 64 || sched_getaffinity(0, sizeof(mask), &mask) != 0) return;
  for (int i = 0; i < d->n; i++) cpu_of[i] = __atomic_load_n(&d->ctrl[i]->cpu, __ATOMIC_RELAXED);
  cpu_of[comm->rank] = me;
  int to = bind_spread_target(cpu_of, d->n, comm->rank, comm->ring_pos ? comm->ring_pos[comm->rank] : -1, &mask);
  if (to < 0) return;
  /* Beside another busy process the kernel's balancer keeps ranks off its
   * CPU, and spreading them evenly put some back beside it: a call then
   * waits for that process's time slices (8 ranks and a CPU hog on 2 CPUs:
   * alltoall 32 B took 2.2 ms a call, 12.6 us without moves). Move only
   * while every rank runs and no other task wants a CPU. */
  /* A rank that changes state while it is looked at reads as another task:
   * only three such looks in a row refuse (a busy process is in every one). */
  int others = 1;
  for (int look = 0; look < 3 && others; look++) others = others_want_cpu(comm);
  if (others) {
    comm->spread_refused++;
    comm->spread_ns = now + SPREAD_REFUSED_NS - SPREAD_INTERVAL_NS;
    return;
  }
  if (bind_move_to_cpu(to) != 1) return;
  comm->spread_moves++;
  __atomic_store_n(&my->cpu, to, __ATOMIC_RELAXED);
}

/* Waits until (int32)(*word - want) >= 0. A peer that last ran on this
 * rank's CPU cannot run while this rank spins: after the first polls the
 * waiter yields to it (every 16th poll) instead of spinning its whole spin
 * time first. One-way waits (a writer waiting for a reader to free a slot, a
 * reader waiting for a writer that returns without waiting for it) lost ~2 ms
 * per 64 calls that way (broadcast 8 B at 2 unbound ranks: 40-130 us a call);
 * symmetric ones too, once a CPU hog had the scheduler put both unbound ranks
 * on one CPU: reduce 8 B took 10 us a call with the 2 ms spin time (every
 * timed loop spun out once), 0.2 us with the yield. Between ranks on
 * different CPUs nothing changes. */
/* With limit_ns > 0 the wait ends after about that long even if the word
 * is short (*reached 0; it then never sleeps, only polls and yields). */
static inline int past_limit(int64_t limit_ns, int64_t* start) {
  if (limit_ns <= 0) return 0;
  int64_t now = time_ns();
  if (*start == 0) *start = now;
  return now - *start > limit_ns;
}
static inline __attribute__((always_inline)) ncclResult_t wait_seq_for(struct ncclComm* comm, uint32_t* word,
                                                                     uint32_t* waiters, uint32_t want, int peer,
                                                                     int64_t limit_ns, int* reached) {
  int64_t deadline = 0, t0 = 0, start = 0;
  int yields = 0, spinning = 1;
  *reached = 1;
  for (int it = 0;; it++) {
    uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if ((int32_t)(v - want) >= 0) return ncclSuccess;
    /* While spinning, the clock is read on every 16th poll only: a clock
     * read costs as much as several polls and would delay seeing the peer's
     * store. Once the spin time is over it stays over. A peer that shares
     * this CPU cannot run while this rank spins: yield to it instead (a
     * yield, not a futex sleep, so nobody has to wake anybody). */
    if (spinning) {
      /* The first check at comm_min_polls, as comm_keep_polling's own: with
       * no spin time (more ranks than CPUs) this rank yields as soon as there. */
      int first = comm_min_polls(comm);
      if (it < first || ((it - first) & 15) != 0) {
        cpu_relax();
        continue;
      }
      if (past_limit(limit_ns, &start)) {
        *reached = 0;
        return ncclSuccess;
      }
      if (comm_keep_polling(comm, it, &t0)) {
        NCCLCHECK(board_give_way(comm, peer));
        continue;
      }
      spinning = 0;
    }
    board_spread(comm);
    if (limit_ns > 0) {
      /* Bounded: yield (the peer may need this CPU) until the limit, no sleep. */
      if (past_limit(limit_ns, &start)) {
        *reached = 0;
        return ncclSuccess;
      }
      NCCLCHECK(comm_stop_check(comm));
      bind_yield();
      continue;
    }
    if (yields++ < 16) {
      NCCLCHECK(comm_stop_check(comm)); /* a yield may be long on a crowded CPU */
      bind_yield();
      continue;
    }
    NCCLCHECK(prim_sleep_checks(comm, peer, &deadline, 1));
    if (health_peer_left(comm, peer)) {
      if ((int32_t)(__atomic_load_n(word, __ATOMIC_ACQUIRE) - want) >= 0) return ncclSuccess;
      return comm_left_error(comm, peer);
    }
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    int moved = 0;
    for (int k = 0; k < 512 && !moved; k++) {
      moved = __atomic_load_n(word, __ATOMIC_ACQUIRE) != v;
      cpu_relax();
    }
    if (!moved) futex_wait(word, v, 20, 1);
    __atomic_fetch_sub(waiters, 1, __ATOMIC_RELAXED);
  }
}

static ncclResult_t wait_seq(struct ncclComm* comm, uint32_t* word, uint32_t* waiters, uint32_t want, int peer) {
  int reached;
  return wait_seq_for(comm, word, waiters, want, peer, 0, &reached);
}

void direct_free(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  if (!d) return;
  for (int i = 0; d->segs && i < d->n; i++) shmseg_free(&d->segs[i]);
  free(d->ctrl);
  free(d->small);
  free(d->peer_done);
  free(d->peer_ack);
  free(d->left);
  free(d->data);
  free(d->segs);
  free(d);
  comm->direct = NULL;
}

/* Local ranks up to which direct_setup faults every mailbox page in. */
#define PREFAULT_MAX_RANKS 16

struct mb_info {
  int32_t pid;
  int32_t fd;
};

static ncclResult_t direct_setup(struct ncclComm* comm) {
  if (comm->direct) return ncclSuccess;
  int n = comm->nranks;
  struct direct_state* d = calloc(1, sizeof(*d));
  if (!d) return err_set(ncclSystemError, "out of memory for the direct algorithm");
  comm->direct = d;
  d->n = n;
  d->prefetchw = have_prefetchw();
  d->cap = direct_max_bytes();
  d->ring_bytes = COLLIE_MAX(2 * d->cap, BCAST_RING_BYTES);
  d->map_len = MB_CTRL_BYTES + NSLOTS * SMALL_BYTES + d->ring_bytes;
  d->ctrl = calloc((size_t)n, sizeof(*d->ctrl));
  d->small = calloc((size_t)n, sizeof(*d->small));
  d->peer_done = calloc((size_t)n, sizeof(*d->peer_done));
  d->peer_ack = calloc((size_t)n, sizeof(*d->peer_ack));
  d->left = calloc((size_t)n, sizeof(*d->left));
  d->data = calloc((size_t)n, sizeof(*d->data));
  d->segs = calloc((size_t)n, sizeof(*d->segs));
  struct mb_info* all = calloc((size_t)n, sizeof(*all));
  ncclResult_t res = ncclSuccess;
  if (!d->ctrl || !d->small || !d->peer_done || !d->peer_ack || !d->left || !d->data || !d->segs || !all) {
    res = err_set(ncclSystemError, "out of memory for the direct algorithm");
    goto out;
  }
  for (int i = 0; i < n; i++) d->segs[i].fd = -1;
  NCCLCHECKGOTO(shmseg_create(d->map_len, "direct mailbox", &d->segs[comm->rank]), res, out);
  all[comm->rank] = (struct mb_info){(int32_t)getpid(), d->segs[comm->rank].fd};
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, all, sizeof(*all)), res, out);
  for (int i = 0; i < n; i++) {
    if (i != comm->rank && (res = shmseg_open(all[i].pid, all[i].fd, d->map_len, i, "direct mailbox", &d->segs[i])) !=
                               ncclSuccess)
      break;
    d->ctrl[i] = d->segs[i].base;
    d->small[i] = (char*)d->segs[i].base + MB_CTRL_BYTES;
    d->data[i] = d->small[i] + NSLOTS * SMALL_BYTES;
  }
  /* Fault every page in now, on every mapping: a slot's first use would
   * otherwise cost a page fault on the writer and on each reader (64 slots
   * and two large buffers: a loop of 128 B broadcasts, the first to use the
   * small slots, took 0.66 us a call over its first 100 calls, 0.07 after).
   * Not on wide hosts: every rank maps every mailbox (~1.3 MiB each), and
   * page tables for all of them at hundreds of ranks would cost far more
   * than the faults of the slots actually used. */
  size_t used = MB_CTRL_BYTES + NSLOTS * SMALL_BYTES + 2 * d->cap; /* every call may use these */
  for (int i = 0; res == ncclSuccess && i < n && n <= PREFAULT_MAX_RANKS; i++)
    shmseg_prefault(d->segs[i].base, used); /* every mapping its own touch (shmseg.h) */
  if (res == ncclSuccess) d->ctrl[comm->rank]->cpu = -1; /* no call run yet: on no CPU */
  /* Everybody mapped everything before anyone drops its fd. */
  ncclResult_t r2 = bootstrap_barrier(comm->bs);
  if (res == ncclSuccess) res = r2;
out:
  if (d->segs) shmseg_drop_fd(&d->segs[comm->rank]);
  free(all);
  if (res != ncclSuccess) direct_free(comm);
  return res;
}

/* Where rank i keeps the current call's payload. */
static char* place(struct direct_state* d, int i) {
  unsigned k = d->seq % NSLOTS;
  if (d->where == 0) return d->ctrl[i]->line[k].data;
  if (d->where == 1) return d->small[i] + (size_t)k * SMALL_BYTES;
  if (d->where == 3) return d->data[i];
  return d->data[i] + (size_t)d->big * d->cap;
}

/* Waits until every peer's counter at byte `word_off` of its control page
 * (its futex waiters at `waiters_off`) reaches `need`. seen[] holds the last
 * values read: a peer already known to be there is not touched. */
static ncclResult_t wait_peers(struct ncclComm* comm, uint32_t* seen, size_t word_off, size_t waiters_off,
                               uint32_t need) {
  struct direct_state* d = comm->direct;
  for (int i = 0; i < d->n; i++) {
    if (i == comm->rank || (int32_t)(seen[i] - need) >= 0) continue;
    uint32_t* word = (uint32_t*)((char*)d->ctrl[i] + word_off);
    NCCLCHECK(wait_seq(comm, word, (uint32_t*)((char*)d->ctrl[i] + waiters_off), need, i));
    seen[i] = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  }
  return ncclSuccess;
}

/* Starts a call whose payload is `bytes` (per rank): returns where to put it
 * (the inline part of this call's slot, its small buffer, or a large buffer),
 * once no peer can still be reading what that place held before: slot
 * seq % NSLOTS was last used by call seq - NSLOTS, a large buffer by
 * big_used[]. Peers' done counters are read only when the last values seen
 * do not already show that, so a rank running ahead touches no peer's memory
 * on most calls. After a symmetric call (everybody waited for everybody)
 * every peer has finished call seq - 2: each published that call only after
 * finishing the one before. */
static ncclResult_t direct_begin(struct ncclComm* comm, size_t bytes, int writes, char** mine) {
  NCCLCHECK(direct_setup(comm));
  struct direct_state* d = comm->direct;
  uint32_t seq = ++d->seq;
  /* Compared as signed differences throughout, so the first calls (need
   * "before" 0) and the wrap of seq need no special case. */
  uint32_t need = seq - NSLOTS;
  /* A large buffer last used before `need` is covered by it; moving the
   * record forward keeps it within a signed difference of seq forever. */
  for (int b = 0; b < 2; b++)
    if ((int32_t)(need - d->big_used[b]) > 0) d->big_used[b] = need;
  d->wrote = 0;
  d->where = bytes <= INLINE_BYTES ? 0 : bytes <= SMALL_BYTES ? 1 : bytes <= d->cap ? 2 : 3;
  /* big_used[] records the calls in which this rank wrote its own large
   * buffers (a rank that only reads leaves them as they were): a streamed
   * allgather's next root then waits only for the readers of its own last
   * stream, not for the readers of the root before it. */
  if (d->where == 3) {
    /* Only a streamed broadcast (or an allgather's streamed blocks) is larger
     * than a buffer (eligible()): it takes both, once no peer can still read
     * either. */
    for (int b = 0; b < 2; b++) {
      if ((int32_t)(d->big_used[b] - need) > 0) need = d->big_used[b];
      if (writes) d->big_used[b] = seq;
    }
  } else if (d->where == 2) {
    d->big = (int)(d->nbig++ & 1);
    if ((int32_t)(d->big_used[d->big] - need) > 0) need = d->big_used[d->big];
    if (writes) d->big_used[d->big] = seq;
  }
  if (writes && !(d->last_symmetric && (int32_t)(seq - 2 - need) >= 0))
    NCCLCHECK(wait_peers(comm, d->peer_done, offsetof(struct mb_ctrl, done), offsetof(struct mb_ctrl, done_waiters),
                         need));
  *mine = place(d, comm->rank);
  return ncclSuccess;
}

/* direct_begin, then this rank's payload into its buffer. */
static ncclResult_t direct_post(struct ncclComm* comm, const void* src, size_t bytes) {
  char* mine;
  NCCLCHECK(direct_begin(comm, bytes, 1, &mine));
  memcpy(mine, src, bytes);
  comm->direct->wrote = bytes;
  return ncclSuccess;
}

static const char* peer_data(struct direct_state* d, int i, size_t bytes) {
  (void)bytes; /* the place was chosen from it in direct_begin */
  return place(d, i);
}

/* A rank that reads from a peer running ahead of it (a broadcast reader, a
 * reduce root, when the peer had published before it looked) asks for the
 * peer's next slot line and as many bytes of its next small buffer now: the
 * peer wrote them calls ago, and the next call would otherwise wait for each
 * line in turn (the small buffers are a page apart: the hardware's own
 * prefetch does not follow). Where the peer is not ahead nothing is asked
 * for: a line taken shared before the peer writes it costs the peer a
 * transfer. The large buffers are left to the hardware. */
static void prefetch_next_range(struct direct_state* d, int i, size_t from, size_t bytes) {
  if (!d->ahead || d->where > 1) return;
  unsigned next = (d->seq + 1) % NSLOTS;
  __builtin_prefetch(&d->ctrl[i]->line[next], 0, 3);
  if (d->where == 1)
    for (size_t off = from & ~(size_t)63; off < from + bytes; off += 64)
      __builtin_prefetch(d->small[i] + next * SMALL_BYTES + off, 0, 3);
}

static void prefetch_next_from(struct direct_state* d, int i, size_t bytes) { prefetch_next_range(d, i, 0, bytes); }

static void publish_ready(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  struct mb_line* l = &d->ctrl[comm->rank]->line[d->seq % NSLOTS];
  l->token = d->call_token;
  l->root = d->call_root;
  publish(&l->seq, &d->ctrl[comm->rank]->line_waiters[d->seq % NSLOTS], d->seq);
}

static void describe_token(uint64_t t, char* buf, size_t n) {
  static const char* kinds[] = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                                "alltoall", "gather", "scatter", "send/recv", "send/recv"};
  unsigned kind = (unsigned)(t >> 48) & 0xf;
  snprintf(buf, n, "%s of %llu bytes of %s", kind < 10 ? kinds[kind] : "?",
           (unsigned long long)(t & 0xffffffffffffULL), dtype_name((ncclDataType_t)((t >> 52) & 0xf)));
}

/* Publishes my line (unless nobody reads it: publish_mine 0) and waits for
 * peer `src`'s (every peer's if src < 0); then checks that they are on the
 * same call with the same arguments. d->ahead says whether every peer waited
 * for had published before the first look. */
static ncclResult_t direct_exchange(struct ncclComm* comm, int src, int publish_mine) {
  struct direct_state* d = comm->direct;
  if (publish_mine) publish_ready(comm);
  d->ahead = 1;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < d->n && res == ncclSuccess; i++) {
    if (i == comm->rank || (src >= 0 && i != src)) continue;
    struct mb_line* l = &d->ctrl[i]->line[d->seq % NSLOTS];
    if ((int32_t)(__atomic_load_n(&l->seq, __ATOMIC_ACQUIRE) - d->seq) < 0) d->ahead = 0;
    res = wait_seq(comm, &l->seq, &d->ctrl[i]->line_waiters[d->seq % NSLOTS], d->seq, i);
    if (res == ncclSuccess && (l->token != d->call_token || l->root != d->call_root)) {
      /* The board names both calls when it still holds the peer's entry; the
       * line's token decides in any case: never read a disagreeing payload. */
      res = board_check(comm);
      if (res == ncclSuccess) {
        char mine[128], theirs[128];
        describe_token(d->call_token, mine, sizeof(mine));
        describe_token(l->token, theirs, sizeof(theirs));
        res = err_set(ncclInvalidUsage,
                      "rank %d: one-shot call #%u does not match across ranks: this rank called %s (root %d), rank %d "
                      "called %s (root %d)",
                      comm->rank, d->seq, mine, (int)d->call_root, i, theirs, (int)l->root);
      }
    }
  }
  if (res != ncclSuccess) {
    transport_poison(comm);
    struct mb_ctrl* me = d->ctrl[comm->rank];
    publish(&me->done, &me->done_waiters, d->seq);
  }
  d->last_symmetric = src < 0;
  return res;
}

/* Ends a call: peers may reuse the buffers this rank read (published every
 * DONE_EVERY calls). The CPU word is
 * written only when it changed (waiting peers read it: a store every call
 * would take the line back from them each time). Then it asks for what the
 * next call will write, in exclusive state: the next slot's line and, when
 * this call wrote a small buffer, as many bytes of the next one. Its readers
 * took those lines shared when they read them NSLOTS calls ago, and a
 * broadcast root or reduce non-root, which waits for nobody, otherwise
 * stalls on every one of those transfers in every call. 2 ranks on 2 CPUs,
 * medians of 5 interleaved runs (us a call, before / after): broadcast in
 * place 8 B 0.103 / 0.073 (Open MPI 0.098), 128 B 0.133 / 0.080, 512 B
 * 0.145 / 0.096, 2 KiB 0.295 / 0.198; allgather 2 KiB 0.516 / 0.415,
 * allreduce 2 KiB 0.806 / 0.682. The large buffers (from 4 KiB) are left
 * to the hardware's own prefetch: no change measured at 8 KiB. */
static void direct_end(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  struct mb_ctrl* me = d->ctrl[comm->rank];
  int cpu = sched_getcpu();
  if (__atomic_load_n(&me->cpu, __ATOMIC_RELAXED) != cpu) __atomic_store_n(&me->cpu, cpu, __ATOMIC_RELAXED);
  if (d->seq % DONE_EVERY == 0 || d->where > 1) publish(&me->done, &me->done_waiters, d->seq);
  if (d->where > 1 || !d->prefetchw) return;
  unsigned next = (d->seq + 1) % NSLOTS;
  /* Only a slot that is already free: a writer at the end of its ring would
   * take the line from the reader that has yet to read it, then lose it to
   * that reader and take it again to write it. */
  if (!d->last_symmetric) {
    uint32_t need = d->seq + 1 - NSLOTS;
    for (int i = 0; i < d->n; i++)
      if (i != comm->rank && (int32_t)(d->peer_done[i] - need) < 0) return;
  }
  prefetch_for_store(&me->line[next]);
  if (d->where == 1)
    for (size_t off = 0; off < d->wrote; off += 64) prefetch_for_store(d->small[comm->rank] + next * SMALL_BYTES + off);
}

ncclResult_t board_publish(struct ncclComm* comm, uint64_t token, int root) {
  if (comm->nhosts != 1 || comm->nranks == 1 || comm->shm_disable) return ncclSuccess;
  NCCLCHECK(direct_setup(comm));
  struct direct_state* d = comm->direct;
  d->call_seq++;
  d->call_token = token;
  d->call_root = root;
  struct board_entry* e = &d->ctrl[comm->rank]->board[d->call_seq % BOARD_DEPTH];
  /* A seqlock: readers ignore the entry while seq is 0 or changes under them. */
  __atomic_store_n(&e->seq, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(&e->token, token, __ATOMIC_RELAXED);
  __atomic_store_n(&e->root, root, __ATOMIC_RELAXED);
  __atomic_store_n(&e->seq, d->call_seq, __ATOMIC_RELEASE);
  return ncclSuccess;
}

ncclResult_t board_check(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  if (!d || !d->call_seq) return ncclSuccess;
  for (int i = 0; i < d->n; i++) {
    if (i == comm->rank) continue;
    /* The peer's entry for this rank's current call, if it has got that far
     * and not yet BOARD_DEPTH calls further. */
    struct board_entry* e = &d->ctrl[i]->board[d->call_seq % BOARD_DEPTH];
    uint32_t seq = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
    if (seq != d->call_seq) continue;
    uint64_t tok = __atomic_load_n(&e->token, __ATOMIC_RELAXED);
    int32_t root = __atomic_load_n(&e->root, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    /* The peer may be reusing the entry: only a stable entry counts. */
    if (__atomic_load_n(&e->seq, __ATOMIC_RELAXED) != seq) continue;
    if (tok == d->call_token && root == d->call_root) continue;
    char mine[128], theirs[128];
    describe_token(d->call_token, mine, sizeof(mine));
    describe_token(tok, theirs, sizeof(theirs));
    if (tok == d->call_token)
      return err_set(ncclInvalidUsage, "rank %d: collective #%u (%s) has root %d here but root %d on rank %d",
                     comm->rank, seq, mine, d->call_root, root, i);
    return err_set(ncclInvalidUsage,
                   "rank %d: collective #%u does not match across ranks: this rank called %s, rank %d called %s",
                   comm->rank, seq, mine, i, theirs);
  }
  return ncclSuccess;
}

/* The bytes a rank puts in its mailbox for call a (reduce-scatter and
 * alltoall post all n blocks, a scatter's root too). */
static size_t posted_bytes(const struct coll_args* a) {
  size_t b = a->count * dtype_size(a->dt);
  int all = a->kind == COLL_REDUCESCATTER || a->kind == COLL_ALLTOALL || a->kind == COLL_SCATTER;
  return all ? b * (size_t)a->comm->nranks : b;
}

/* One host, and this rank's part fits its mailbox; or a broadcast, or an
 * allgather where ranks outnumber CPUs, streamed (stream_allgather). With a
 * CPU for every rank the ring moves as many copies with every rank busy at
 * once, and the streams' acknowledgements and the ends of the n broadcasts
 * cost more: 2 ranks on 2 CPUs, medians of 7 interleaved rounds, us at 1 / 2
 * / 4 MiB gathered, the ring 87 / 124 / 228 against 107 / 160 / 267
 * streamed (Open MPI 120 / 189 / 393). */
static int eligible(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  size_t b = posted_bytes(a);
  if ((a->kind == COLL_BROADCAST || (a->kind == COLL_ALLGATHER && comm->oversub > 1.0)) && bcast_stream(comm, b)) b = 0;
  return coll_shm_only(comm) && comm->nranks > 1 && b <= direct_max_bytes();
}

/* A broadcast of `bytes` (estimate(), below, says why). */
static double bcast_estimate(const struct ncclComm* comm, double bytes, const struct tune_cost* c) {
  int n = comm->nranks;
  /* Chunked at 2 ranks, the bytes take the ring's one hop (two copies, the
   * root's and the reader's, each on its CPU) in smaller steps: no faster
   * in cache than the ring, whose model has no such bonus. 2 ranks, bound,
   * in place, us, one-shot / ring (collie-perf, 300 calls): 512 KiB 22.9 /
   * 18.9, 1 MiB 42.7 / 35.3, 2 MiB 93.0 / 71.5, 4 MiB 200 / 139; out of
   * place 2 MiB 145 / 81. At 4 ranks on 2 CPUs the one-shot's fewer copies
   * win (2 MiB 220 / 284 us), as modelled. */
  int hop = n == 2 && bcast_chunked((size_t)bytes);
  double rate = c->resident && !hop ? c->link.bw * 4.0 / 3.0 : c->link.bw;
  double cpus = COLLIE_MAX(1.0, comm->cpus_per_rank * n), copies, chunks = 0;
  if (bcast_chunked((size_t)bytes)) {
    chunks = ceil(bytes / (double)BCAST_CHUNK);
    copies = (double)BCAST_CHUNK / bytes + ceil(n / COLLIE_MIN((double)n, cpus));
  } else {
    copies = 1.0 + ceil((n - 1) / COLLIE_MIN((double)(n - 1), cpus));
  }
  return 0.7 * c->link.alpha_us + chunks * 0.25 * c->local.alpha_us + copies * bytes / (rate * comm->oversub);
}

/* One exchange of flags; every rank copies in once and reads n (n+1 copies),
 * at 4/3 of the link rate (the data stays in cache). Reduce-scatter and
 * alltoall post and read whole inputs: 2n. The exchange is one cache line
 * per rank (flag, token and up to INLINE_BYTES of data) where a ring or
 * point-to-point step is a FIFO slot plus its header and head/tail counters
 * (and a handshake per peer): 0.7 of a step. Measured at 2 ranks on 2 CPUs
 * (minimum of 7 interleaved runs, 8-512 B): broadcast 0.06-0.08 us against
 * the ring's 0.11-0.33, reduce 0.09-0.19 against 0.13-0.34; the ring wins
 * again from about 8 KiB, which this factor reproduces (crossover ~3.5 KiB). */
static double estimate(const struct coll_args* a, const struct tune_cost* c) {
  int n = a->comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  double k = a->kind == COLL_REDUCESCATTER || a->kind == COLL_ALLTOALL ? 2.0 * n : n + 1.0;
  /* Alltoall with more ranks than CPUs once had no discount here (the
   * pairwise batch measured 8-15% faster at 4 ranks on 2 CPUs); since waiters
   * there yield after 4 polls instead of 64 the one exchange wins: 32 B-8 KiB,
   * 3 interleaved runs, 4 ranks 2.5-4.6 us against P2P's 3.7-8.2, 8 ranks
   * 7.4-11.7 against 9.3-13.9. */
  double rate = c->link.bw * 4.0 / 3.0;
  if (a->kind == COLL_BROADCAST) {
    /* Only the root copies in and each reader copies out once, at a whole
     * CPU's rate (link.bw is the share of one of the ranks on a CPU; the
     * in-cache 4/3 only while the data stay in the host's cache). Up to a
     * chunk: the root's copy, then the readers' in rounds of one a CPU.
     * Chunked, the root's copy overlaps the readers': n copies in rounds
     * over the CPUs, after the first chunk, and every chunk costs its
     * progress store and the readers' checks of it (and, streamed, their
     * acknowledgements): a quarter of an uncrowded step, which at 2 ranks
     * leaves large messages to the ring (the same two copies a byte; 8-128
     * MiB streamed: 2.5-6% slower). Counting n+1 copies at the shared rate
     * had 8 ranks on 2 CPUs at 128 KiB estimated at 240 us: the ring (37-44
     * us) was chosen where this measures 18-28 (Open MPI 27-48). */
    return bcast_estimate(a->comm, bytes, c);
  }
  /* Blocks larger than a buffer: n streamed broadcasts in a row. */
  if (a->kind == COLL_ALLGATHER && bytes > (double)direct_max_bytes()) return n * bcast_estimate(a->comm, bytes, c);
  /* A payload that fits the small buffers is prefetched for the next call
   * (direct_end): with a CPU per rank it moves at several times the copy
   * rate, and the one-shot beats the ring and the pairwise batch up to 4 KiB
   * posted. Measured at 2 ranks on 2 CPUs (medians of 3 interleaved runs,
   * us, one-shot / the row chosen before): reduce 2 KiB 0.249 / 0.540 (ring),
   * reduce-scatter 2 KiB 0.540 / 0.829 (ring), alltoall 2 KiB 0.526 / 0.823
   * (pairwise); from 8 KiB (the large buffers, not prefetched) reduce 1.23 /
   * 0.94 and broadcast 1.02 / 0.93 lose, so the rate stays there. With more
   * ranks than CPUs the runs differ more than the rows: unchanged. */
  if (posted_bytes(a) <= SMALL_BYTES && a->comm->oversub <= 1.0) rate = c->link.bw * 2.5;
  return 0.7 * c->link.alpha_us + k * bytes / rate;
}

/* Reduces element range [off, off+count) of every rank's mailbox into dst. */
static void reduce_all(struct direct_state* d, const struct red_op* op, char* dst, size_t bytes, size_t off_bytes,
                       size_t count, int avg, int me, const void* own) {
  const void* srcs[64];
  int n = d->n;
  if (n <= 64) {
    for (int i = 0; i < n; i++) srcs[i] = (i == me && own ? (const char*)own : peer_data(d, i, bytes)) + off_bytes;
    red_reduce_n(op, dst, srcs, n, count);
  } else {
    red_pre(op, dst, (me == 0 && own ? (const char*)own : peer_data(d, 0, bytes)) + off_bytes, count);
    for (int i = 1; i < n; i++)
      red_reduce(op, dst, dst, (i == me && own ? (const char*)own : peer_data(d, i, bytes)) + off_bytes, count);
  }
  if (avg) red_div(op->dt, dst, dst, count, n);
}

static ncclResult_t direct_allreduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  NCCLCHECK(direct_post(comm, a->sendbuff, bytes));
  NCCLCHECK(direct_exchange(comm, -1, 1));
  reduce_all(comm->direct, &a->op, a->recvbuff, bytes, 0, a->count, a->avg, -1, NULL);
  direct_end(comm);
  return ncclSuccess;
}

static ncclResult_t direct_reduce(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  int root = comm->rank == a->root;
  /* Nobody reads the root's mailbox in a reduce: its own part comes straight
   * from its send buffer (red_reduce_n allows it to be the destination too;
   * reduce_all's path for more than 64 ranks does not), and it publishes
   * nothing, so it need not wait for a slot either. */
  int own = root && comm->nranks <= 64;
  if (own) {
    char* mine;
    NCCLCHECK(direct_begin(comm, bytes, 0, &mine));
  } else {
    NCCLCHECK(direct_post(comm, a->sendbuff, bytes));
  }
  if (root) {
    NCCLCHECK(direct_exchange(comm, -1, !own));
    reduce_all(comm->direct, &a->op, a->recvbuff, bytes, 0, a->count, a->avg, own ? comm->rank : -1,
               own ? a->sendbuff : NULL);
    for (int i = 0; i < comm->nranks; i++)
      if (i != comm->rank) prefetch_next_from(comm->direct, i, bytes);
  } else {
    publish_ready(comm);
  }
  /* Non-roots wait for nobody: the next call must check the done counters. */
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

static ncclResult_t direct_reducescatter(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t esz = dtype_size(a->dt), bytes = a->count * esz, total = bytes * (size_t)comm->nranks;
  NCCLCHECK(direct_post(comm, a->sendbuff, total));
  NCCLCHECK(direct_exchange(comm, -1, 1));
  reduce_all(comm->direct, &a->op, a->recvbuff, total, (size_t)comm->rank * bytes, a->count, a->avg, -1, NULL);
  direct_end(comm);
  return ncclSuccess;
}

static ncclResult_t stream_allgather(struct coll_args* a);

static ncclResult_t direct_allgather(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  if (bytes > direct_max_bytes()) return stream_allgather(a);
  NCCLCHECK(direct_post(comm, a->sendbuff, bytes));
  NCCLCHECK(direct_exchange(comm, -1, 1));
  for (int i = 0; i < comm->nranks; i++) {
    char* dst = (char*)a->recvbuff + (size_t)i * bytes;
    if (i == comm->rank && dst == a->sendbuff) continue;
    memcpy(dst, i == comm->rank ? (const char*)a->sendbuff : peer_data(comm->direct, i, bytes), bytes);
  }
  direct_end(comm);
  return ncclSuccess;
}

ncclResult_t direct_shm_share(struct ncclComm* comm, const void* mine, size_t bytes, void* all) {
  if (bytes > SMALL_BYTES) return err_set(ncclInternalError, "direct_shm_share: %zu bytes is more than a slot", bytes);
  NCCLCHECK(direct_post(comm, mine, bytes));
  NCCLCHECK(direct_exchange(comm, -1, 1));
  for (int i = 0; all && i < comm->nranks; i++)
    memcpy((char*)all + (size_t)i * bytes, peer_data(comm->direct, i, bytes), bytes);
  direct_end(comm);
  return ncclSuccess;
}

ncclResult_t direct_shm_rates(struct ncclComm* comm, int key, const float mine[4], float* all) {
  if (key < 0 || key >= ADAPT_KINDS * ADAPT_BUCKETS) return err_set(ncclInternalError, "direct_shm_rates: key %d", key);
  NCCLCHECK(direct_setup(comm));
  struct direct_state* d = comm->direct;
  struct rate_post* own = &d->ctrl[comm->rank]->rates[key];
  uint32_t seq = __atomic_load_n(&own->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&own->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  for (int k = 0; k < 4; k++) {
    uint32_t bits;
    memcpy(&bits, &mine[k], sizeof(bits));
    __atomic_store_n(&own->v[k], bits, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&own->seq, seq + 2, __ATOMIC_RELEASE);
  for (int r = 0; r < comm->nranks; r++) {
    float* out = all + 4 * r;
    if (r == comm->rank) {
      memcpy(out, mine, 4 * sizeof(float));
      continue;
    }
    const struct rate_post* p = &d->ctrl[r]->rates[key];
    memset(out, 0, 4 * sizeof(float));
    /* A post being written is read again, after the first few tries
     * giving the CPU away (its writer may have lost the CPU in the middle);
     * one that keeps changing counts as none this time. */
    for (int tries = 0; tries < 12; tries++) {
      if (tries >= 4) sched_yield();
      uint32_t s1 = __atomic_load_n(&p->seq, __ATOMIC_ACQUIRE), v[4];
      if (s1 & 1) continue;
      for (int k = 0; k < 4; k++) v[k] = __atomic_load_n(&p->v[k], __ATOMIC_RELAXED);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&p->seq, __ATOMIC_RELAXED) != s1) continue;
      memcpy(out, v, sizeof(v));
      break;
    }
  }
  return ncclSuccess;
}

ncclResult_t direct_shm_claim_word(struct ncclComm* comm, int rank, uint64_t** word) {
  NCCLCHECK(direct_setup(comm));
  *word = &comm->direct->ctrl[rank]->work;
  return ncclSuccess;
}

ncclResult_t direct_shm_post(struct ncclComm* comm, const void* mine, size_t bytes) {
  if (bytes > SMALL_BYTES) return err_set(ncclInternalError, "direct_shm_post: %zu bytes is more than a slot", bytes);
  NCCLCHECK(direct_post(comm, mine, bytes));
  publish_ready(comm);
  /* It waited for nobody: the next call must check the done counters. */
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

ncclResult_t direct_shm_fetch(struct ncclComm* comm, int from, void* dst, size_t bytes) {
  if (bytes > SMALL_BYTES) return err_set(ncclInternalError, "direct_shm_fetch: %zu bytes is more than a slot", bytes);
  char* mine;
  NCCLCHECK(direct_begin(comm, bytes, 0, &mine));
  NCCLCHECK(direct_exchange(comm, from, 0));
  memcpy(dst, peer_data(comm->direct, from, bytes), bytes);
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

ncclResult_t direct_shm_collect(struct ncclComm* comm, void* all, size_t bytes) {
  if (bytes > SMALL_BYTES) return err_set(ncclInternalError, "direct_shm_collect: %zu bytes is more than a slot", bytes);
  char* mine;
  NCCLCHECK(direct_begin(comm, bytes, 0, &mine));
  NCCLCHECK(direct_exchange(comm, -1, 0));
  for (int i = 0; i < comm->nranks; i++)
    if (i != comm->rank) memcpy((char*)all + (size_t)i * bytes, peer_data(comm->direct, i, bytes), bytes);
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

/* Every rank posts its whole send buffer (n blocks) and reads block `rank`
 * of every peer's: one exchange instead of n-1 pairwise FIFO messages. */
static ncclResult_t direct_alltoall(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt), total = bytes * (size_t)comm->nranks;
  size_t mine = (size_t)comm->rank * bytes;
  NCCLCHECK(direct_post(comm, a->sendbuff, total));
  NCCLCHECK(direct_exchange(comm, -1, 1));
  for (int i = 0; i < comm->nranks; i++) {
    /* Never in place (the API front refuses sendbuff == recvbuff). */
    const char* src = i == comm->rank ? (const char*)a->sendbuff + mine : peer_data(comm->direct, i, total) + mine;
    memcpy((char*)a->recvbuff + (size_t)i * bytes, src, bytes);
  }
  direct_end(comm);
  return ncclSuccess;
}

/* Gather: as a reduce (direct_reduce), with copies for the reduction. The
 * non-roots post their block and go on, up to NSLOTS calls ahead of the
 * root; the root posts nothing (nobody reads its mailbox), waits for every
 * peer and copies each block into its place. Where it went through the
 * point-to-point batch, a FIFO slot and its handshake per peer, a loop of
 * small gathers cost a round trip each: 2 ranks on 2 CPUs, 8-512 B, 0.28-0.30
 * us a call against Open MPI's 0.08-0.15; one-shot, 0.06-0.12 (scatter, as
 * below: 0.27-0.30, 0.09-0.19, 0.06-0.09; docs/BENCHMARKS.md). */
static ncclResult_t direct_gather(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  if (comm->rank == a->root) {
    char* mine;
    NCCLCHECK(direct_begin(comm, bytes, 0, &mine));
    NCCLCHECK(direct_exchange(comm, -1, 0));
    for (int i = 0; i < comm->nranks; i++) {
      char* dst = (char*)a->recvbuff + (size_t)i * bytes;
      if (i != comm->rank) {
        memcpy(dst, peer_data(comm->direct, i, bytes), bytes);
        prefetch_next_from(comm->direct, i, bytes);
      } else if (dst != a->sendbuff) {
        memcpy(dst, a->sendbuff, bytes);
      }
    }
  } else {
    NCCLCHECK(direct_post(comm, a->sendbuff, bytes));
    publish_ready(comm);
  }
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

/* Scatter: as a broadcast (direct_broadcast) of the root's whole send
 * buffer, of which each rank copies out its own block. The root waits for
 * nobody but the readers of the slot it reuses. */
static ncclResult_t direct_scatter(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt), total = bytes * (size_t)comm->nranks;
  size_t off = (size_t)comm->rank * bytes;
  char* mine;
  NCCLCHECK(direct_begin(comm, total, comm->rank == a->root, &mine));
  if (comm->rank == a->root) {
    memcpy(mine, a->sendbuff, total);
    comm->direct->wrote = total;
    publish_ready(comm);
    const char* own = (const char*)a->sendbuff + off;
    if (a->recvbuff != own) memcpy(a->recvbuff, own, bytes);
  } else {
    NCCLCHECK(direct_exchange(comm, a->root, 0));
    memcpy(a->recvbuff, peer_data(comm->direct, a->root, total) + off, bytes);
    prefetch_next_range(comm->direct, a->root, off, bytes);
  }
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

/* Until every reader the root has not left behind has acknowledged stream
 * count `need`; a reader still short of it after lag_ns (BCAST_LAG_NS,
 * ALLGATHER_LAG_NS) is left behind (left[]), where `may_leave`. */
static ncclResult_t wait_acks(struct ncclComm* comm, uint32_t need, int may_leave, int64_t lag_ns) {
  struct direct_state* d = comm->direct;
  int me = comm->rank;
  if (!may_leave)
    return wait_peers(comm, d->peer_ack, offsetof(struct mb_ctrl, ack) + (size_t)me * sizeof(uint32_t),
                      offsetof(struct mb_ctrl, ack_waiters), need);
  for (int i = 0; i < d->n; i++) {
    if (i == me || d->left[i] || (int32_t)(d->peer_ack[i] - need) >= 0) continue;
    int reached;
    NCCLCHECK(wait_seq_for(comm, &d->ctrl[i]->ack[me], &d->ctrl[i]->ack_waiters, need, i, lag_ns, &reached));
    if (reached) {
      d->peer_ack[i] = need;
    } else {
      d->left[i] = 1;
      comm->bcast_left++;
    }
  }
  return ncclSuccess;
}

/* The root of a chunked broadcast: the call is published with the first
 * chunk in, then each further chunk's arrival (the stream count). Streamed,
 * chunk j goes to the ring's place j % ring once every reader has
 * acknowledged the chunk that held it (ack[]; only within this call: the
 * ring was free when the call began, direct_begin), or the root has left
 * that reader behind (wait_acks): then `claim` tells readers which chunk is
 * being overwritten, and the root waits at the end until every reader it
 * left has read the rest from its buffer. */
static ncclResult_t bcast_root_chunks(struct ncclComm* comm, char* mine, const char* src, size_t bytes,
                                      int64_t lag_ns) {
  struct direct_state* d = comm->direct;
  int me = comm->rank;
  unsigned slot = d->seq % NSLOTS;
  struct mb_ctrl* ctrl = d->ctrl[me];
  struct mb_line* l = &ctrl->line[slot];
  uint32_t* waiters = &ctrl->line_waiters[slot];
  int streamed = d->where == 3;
  size_t ring = streamed ? d->ring_bytes / BCAST_CHUNK : SIZE_MAX;
  int may_leave = streamed && comm->cma;
  uint32_t first = d->stream;
  uint32_t nchunks = bcast_chunks(bytes);
  d->stream += nchunks;
  l->first = first;
  if (streamed) {
    memset(d->left, 0, (size_t)d->n);
    __atomic_store_n(&ctrl->src, (uint64_t)(uintptr_t)src, __ATOMIC_RELAXED);
  }
  for (size_t off = 0, j = 0; off < bytes; off += BCAST_CHUNK, j++) {
    if (j >= ring) {
      NCCLCHECK(wait_acks(comm, first + (uint32_t)(j - ring) + 1, may_leave, lag_ns));
      /* Before the first store into the place: a full barrier, so no reader
       * can see the new bytes without also seeing the claim. */
      if (may_leave) __atomic_store_n(&ctrl->claim, first + (uint32_t)j + 1, __ATOMIC_SEQ_CST);
    }
    memcpy(mine + (j % ring) * BCAST_CHUNK, src + off, COLLIE_MIN(BCAST_CHUNK, bytes - off));
    if (j == 0) {
      __atomic_store_n(&l->progress, first + 1, __ATOMIC_RELAXED);
      publish_ready(comm);
    } else {
      publish(&l->progress, waiters, first + (uint32_t)j + 1);
    }
  }
  /* The readers left behind read this rank's buffer: it must stay until they are done. */
  for (int i = 0; may_leave && i < d->n; i++)
    if (d->left[i]) {
      NCCLCHECK(wait_seq(comm, &d->ctrl[i]->ack[me], &d->ctrl[i]->ack_waiters, first + nchunks, i));
      d->peer_ack[i] = first + nchunks;
    }
  return ncclSuccess;
}

/* A reader of a chunked broadcast copies each chunk once the root has;
 * streamed, it acknowledges each so the root may reuse its place. A reader
 * that finds the chunk it copied overwritten (the root went on without it,
 * wait_acks) reads the rest of the message from the root's buffer. */
static ncclResult_t bcast_read_chunks(struct ncclComm* comm, int root, char* dst, const char* src, size_t bytes) {
  struct direct_state* d = comm->direct;
  unsigned slot = d->seq % NSLOTS;
  struct mb_ctrl* rc = d->ctrl[root];
  struct mb_line* l = &rc->line[slot];
  uint32_t* waiters = &rc->line_waiters[slot];
  struct mb_ctrl* me = d->ctrl[comm->rank];
  int streamed = d->where == 3;
  size_t ring = streamed ? d->ring_bytes / BCAST_CHUNK : SIZE_MAX;
  int may_be_left = streamed && comm->cma;
  uint32_t first = __atomic_load_n(&l->first, __ATOMIC_RELAXED);
  uint32_t last = first + bcast_chunks(bytes);
  for (size_t off = 0, j = 0; off < bytes; off += BCAST_CHUNK, j++) {
    uint32_t want = first + (uint32_t)j + 1;
    NCCLCHECK(wait_seq(comm, &l->progress, waiters, want, root));
    memcpy(dst + off, src + (j % ring) * BCAST_CHUNK, COLLIE_MIN(BCAST_CHUNK, bytes - off));
    if (may_be_left) {
      /* Loads of the copy before the load of the claim (a seqlock's read side). */
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      uint32_t claim = __atomic_load_n(&rc->claim, __ATOMIC_RELAXED);
      if ((int32_t)(claim - (want + (uint32_t)ring)) >= 0) {
        /* The root has begun to overwrite this chunk's place: this chunk
         * and the rest come from its buffer, which stays until this rank
         * acknowledges the last chunk. */
        uint64_t from = __atomic_load_n(&rc->src, __ATOMIC_RELAXED) + off;
        int err = 0;
        if (cma_read(comm->peers[root].pid, dst + off, from, bytes - off, &err) != ncclSuccess)
          return err_set(ncclSystemError, "rank %d: reading the rest of rank %d's broadcast (%zu bytes) from its "
                         "buffer failed: %s", comm->rank, root, bytes - off, strerror(err));
        comm->bcast_pulled++;
        publish(&me->ack[root], &me->ack_waiters, last);
        return ncclSuccess;
      }
    }
    if (streamed) publish(&me->ack[root], &me->ack_waiters, want);
  }
  return ncclSuccess;
}

/* An allgather of blocks larger than a mailbox buffer: n streamed
 * broadcasts, rank 0's block first, each through its root's ring (as
 * direct_broadcast); each rank copies its own block into place at the end,
 * where nobody waits for it. Every reader copies each block once, out of a
 * ring that stays in the host's cache, where single copy (the CMA row) has
 * every rank pull n-1 whole blocks through the kernel at its slower rate
 * (3.9 GB/s here against 7.5 for a streaming copy). A root leaves a reader
 * behind after ALLGATHER_LAG_NS, not BCAST_LAG_NS: here a late reader is
 * usually still reading the root before (a broadcast's readers have nothing
 * else to do), and once left it holds its root up at the end of the block
 * and so comes late to the next root as well. 8 ranks on 2 CPUs, bound,
 * medians of 5 interleaved rounds, ms at 16 / 32 / 64 / 128 / 256 MiB
 * gathered, lag 200 us / 500 us / 2 ms against single copy (Open MPI):
 * 9.47 / 20.3 / 41.1 / 106 / 168, 8.34 / 17.4 / 40.9 / 76.2 / 168, 10.5 /
 * 17.3 / 34.9 / 72.8 / 149 against 11.6 / 23.0 / 47.8 / 105 / 218 (13.8 /
 * 29.0 / 59.0 / 109 / 212); beside a busy process 16.6 / 28.7 / 60.3 / 115 /
 * 242, 13.9 / 33.7 / 55.0 / 113 / 207, 15.3 / 36.7 / 72.2 / 136 / 254
 * against 14.7 / 29.5 / 59.5 / 119 / 230 (16.6 / 31.0 / 58.4 / 124 / 252)
 * (docs/BENCHMARKS.md, thirty-eighth session). */
#define ALLGATHER_LAG_NS 500000
/* ... unless no task outside the communicator wants a CPU: then a reader a
 * ring behind is one of the ranks taking turns on its CPU and comes back
 * within the others' slices, and the pull that leaving it costs is dearer
 * than the wait. 8 ranks on 2 CPUs, bound, no other load, medians of 3
 * interleaved rounds (bench/ab_env.sh all_gather, calls 4-7 of a size), ms
 * at 32 / 64 / 128 / 256 MiB gathered, lag 500 us / 5 ms / 20 ms (Open MPI):
 * 9.04 / 19.8 / 64.8 / 148, 9.60 / 18.0 / 65.4 / 80.3, 8.66 / 18.4 / 37.7 /
 * 95.1 (12.4 / 23.1 / 47.5 / 121): with 500 us a root left about 7 readers
 * a call, and the calls of 256 MiB took 200-500 ms for their first ten
 * (each pull first reads pages through the kernel that this reader never
 * read so; on the development VM such first accesses cost a trip to the
 * host), 70-85 ms with 20 ms. Beside a CPU hog the short lag stays: 20 ms
 * took 274 / 555 ms at 128 / 256 MiB against 104 / 233. Whether other tasks
 * want a CPU is looked at (others_want_cpu, three looks as board_spread) at
 * most every QUIET_LOOK_NS. Then, interleaved, this against 500 us always
 * (Open MPI): 9.37 / 30.0 / 37.7 / 93.6 against 21.8 / 26.3 / 77.9 / 110
 * (13.2 / 51.3 / 49.0 / 111); beside the hog every look saw it (the short
 * lag ran; rounds there vary 2-5x). */
#define ALLGATHER_LAG_QUIET_NS 20000000
#define QUIET_LOOK_NS 100000000
/* A look that disagrees with the state is confirmed by the next one, taken
 * at least QUIET_CONFIRM_NS later, before the state changes: a task that
 * wanted a CPU for a moment (a kernel thread, a rank's keep-alive thread,
 * the launcher) is gone by then, a busy process is not. One look deciding
 * alone made 2 of 8 runs of twenty 256 MiB allgathers at 4 ranks on 2 CPUs
 * (bound, no other load) run one call as single copy: 650-760 ms against
 * 37-40 (each rank pulls pages through the kernel that it never read so);
 * that call was the median's whole margin in the sweep (compare_mpi.sh,
 * rounds of 2 calls: 0.36x Open MPI in one, 2.07x in the next). */
#define QUIET_CONFIRM_NS 10000000
int look_confirmed(int state, int* last_look, int look) {
  if (look == *last_look) state = look;
  *last_look = look;
  return state;
}

static int64_t allgather_lag(struct ncclComm* comm) {
  struct direct_state* d = comm->direct;
  int64_t now = time_ns();
  int64_t every = d->looked_busy == d->busy ? QUIET_LOOK_NS : QUIET_CONFIRM_NS;
  if (d->look_ns == 0 || now - d->look_ns > every) {
    int others = 1;
    for (int look = 0; look < 3 && others; look++) others = others_want_cpu(comm);
    d->busy = look_confirmed(d->busy, &d->looked_busy, others);
    d->look_ns = now;
  }
  return d->busy ? ALLGATHER_LAG_NS : ALLGATHER_LAG_QUIET_NS;
}

/* Beside other load, from blocks of ALLGATHER_PULL_MIN, the single-copy
 * row instead, where it works and NCCL_ALGO allows it: n streams in a row
 * wait for every reader of each, and the hog's slices hold them up, where
 * each rank pulling every block straight from its sender waits for nobody
 * but the senders' posts. 8 ranks on 2 CPUs beside a CPU hog, bound, medians
 * of 3 interleaved rounds (bench/ab_env.sh all_gather HOG=1), ms at 32 / 64
 * / 128 / 256 MiB gathered, streamed against single copy (Open MPI): 17.0 /
 * 56.0 / 91.2 / 238 against 16.1 / 31.3 / 89.1 / 163 (17.5 / 54.0 / 73.5 /
 * 148). The ranks agree (one exchange a call: any rank that saw other load
 * decides), since every rank must run the same row. */
extern const struct algo algo_cma_allgather;
#define ALLGATHER_PULL_MIN ((size_t)4 << 20)
static ncclResult_t stream_allgather(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  int64_t lag = allgather_lag(comm);
  if (bytes >= ALLGATHER_PULL_MIN && comm->cma && (comm->algo_mask & (1 << ALGO_CMA)) &&
      comm->nranks <= ACK_RANKS) {
    int32_t busy = comm->direct->busy, all[ACK_RANKS];
    NCCLCHECK(direct_shm_share(comm, &busy, sizeof(busy), all));
    for (int i = 0; i < comm->nranks; i++)
      if (all[i]) {
        comm->allgather_pulled++;
        return algo_cma_allgather.run(a, NULL);
      }
  }
  for (int r = 0; r < comm->nranks; r++) {
    char* mine;
    char* dst = (char*)a->recvbuff + (size_t)r * bytes;
    NCCLCHECK(direct_begin(comm, bytes, comm->rank == r, &mine));
    if (comm->rank == r) {
      NCCLCHECK(bcast_root_chunks(comm, mine, a->sendbuff, bytes, lag));
    } else {
      NCCLCHECK(direct_exchange(comm, r, 0));
      NCCLCHECK(bcast_read_chunks(comm, r, dst, peer_data(comm->direct, r, bytes), bytes));
    }
    comm->direct->last_symmetric = 0;
    direct_end(comm);
  }
  char* own = (char*)a->recvbuff + (size_t)comm->rank * bytes;
  if (own != a->sendbuff) memcpy(own, a->sendbuff, bytes);
  return ncclSuccess;
}

static ncclResult_t direct_broadcast(struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t bytes = a->count * dtype_size(a->dt);
  char* mine;
  NCCLCHECK(direct_begin(comm, bytes, comm->rank == a->root, &mine));
  if (comm->rank == a->root) {
    if (bcast_chunked(bytes)) {
      NCCLCHECK(bcast_root_chunks(comm, mine, a->sendbuff, bytes, BCAST_LAG_NS));
    } else {
      memcpy(mine, a->sendbuff, bytes);
      comm->direct->wrote = bytes;
      publish_ready(comm);
    }
    if (a->recvbuff != a->sendbuff) memcpy(a->recvbuff, a->sendbuff, bytes);
  } else {
    NCCLCHECK(direct_exchange(comm, a->root, 0));
    const char* src = peer_data(comm->direct, a->root, bytes);
    if (bcast_chunked(bytes)) {
      NCCLCHECK(bcast_read_chunks(comm, a->root, a->recvbuff, src, bytes));
    } else {
      memcpy(a->recvbuff, src, bytes);
      prefetch_next_from(comm->direct, a->root, bytes);
    }
  }
  comm->direct->last_symmetric = 0;
  direct_end(comm);
  return ncclSuccess;
}

static ncclResult_t run(struct coll_args* a, const struct plan* p) {
  (void)p;
  switch (a->kind) {
    case COLL_ALLREDUCE: return direct_allreduce(a);
    case COLL_BROADCAST: return direct_broadcast(a);
    case COLL_REDUCE: return direct_reduce(a);
    case COLL_ALLGATHER: return direct_allgather(a);
    case COLL_REDUCESCATTER: return direct_reducescatter(a);
    case COLL_ALLTOALL: return direct_alltoall(a);
    case COLL_GATHER: return direct_gather(a);
    case COLL_SCATTER: return direct_scatter(a);
    default: return err_set(ncclInternalError, "direct (shared memory) has no %s", coll_name(a->kind));
  }
}

#define DIRECT_SHM_ROW(coll) {coll, ALGO_DIRECT, PROTO_LL, 0, eligible, estimate, run}
const struct algo algo_direct_shm_allreduce = DIRECT_SHM_ROW(COLL_ALLREDUCE);
const struct algo algo_direct_shm_broadcast = DIRECT_SHM_ROW(COLL_BROADCAST);
const struct algo algo_direct_shm_reduce = DIRECT_SHM_ROW(COLL_REDUCE);
const struct algo algo_direct_shm_allgather = DIRECT_SHM_ROW(COLL_ALLGATHER);
const struct algo algo_direct_shm_reducescatter = DIRECT_SHM_ROW(COLL_REDUCESCATTER);
const struct algo algo_direct_shm_alltoall = DIRECT_SHM_ROW(COLL_ALLTOALL);
const struct algo algo_direct_shm_gather = DIRECT_SHM_ROW(COLL_GATHER);
const struct algo algo_direct_shm_scatter = DIRECT_SHM_ROW(COLL_SCATTER);
