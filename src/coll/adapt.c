/* Paths weighed by measurement. A large broadcast, allgather or alltoall
 * between the ranks of one host runs either the tuner's row (the FIFO: two
 * copies, each slot written by one CPU and read by another) or the
 * single-copy row (each reader pulls straight from the sender's buffer); a
 * large allreduce, reduce or reduce-scatter (and a broadcast, allgather or
 * alltoall whose row fills slots, beside single copy where that is weighed:
 * adapt_pick3) runs the tuner's row with ordinary or with non-temporal
 * stores into the slots it fills (COLLIE_SLOT_STREAM), and a reduction that
 * fits a core's cache also with plain stores and its reads of the peers'
 * slots prefetched ahead (COLLIE_READ_AHEAD). Each takes whichever this
 * communicator has measured faster for that collective and size lately.
 *
 * Why measured and not modelled: the FIFO's speed depends on how far apart
 * the ranks' CPUs are, and on a virtual machine that changes while the job
 * runs. On the development VM (2 vCPUs, AMD EPYC family 25) a cache line
 * went back and forth between the two CPUs in about 70 ns most of the time
 * and in about 330 ns for stretches of 5-15 s (the host had moved a vCPU
 * away from the other's cache); in those stretches the FIFO allgather of 32
 * MiB took 15-17 ms instead of 4-5, Open MPI's FIFO as long, while single
 * copy (collie's and Open MPI's) stayed at 4.5-6 ms: the bytes it reads
 * were not written by the other CPU a moment before. Outside them the FIFO
 * was 5-15% faster than single copy. Slots filled with non-temporal stores
 * reach the reader from memory, not from the writer's cache: in a stretch a
 * 2-rank allreduce of 2 MiB took 180 us so against 1000 with ordinary
 * stores, outside them 250 against 155. A one-off calibration sees one of
 * the two states; this follows them.
 *
 * How: a pick (a one-slot exchange through the direct mailboxes, which
 * carries each rank's last measured rates for that bucket; see below for
 * the slots' stores alone) chooses the path
 * for a window of the bucket's calls (adapt_window: one call for each of the
 * first picks from 256 KiB a rank, then about 8 MiB a rank's worth; 16
 * calls below 256 KiB); every rank times each call of the window to its
 * return (the window's first from the exchange, the others from its own
 * entry) and keeps the window's median as the rate of the path it ran. All
 * ranks take the slowest rank's rate of each path from the same posts and
 * count the bucket's calls alike, so they all pick the same path. Where
 * only the slots' stores are weighed (each writer's own choice, which no
 * reader needs to know) there is no exchange: a rank posts its rates in its
 * mailbox control page and reads the others' latest posts without waiting
 * (direct_shm_rates), so a rank that runs ahead keeps its lead; the ranks
 * then may pick differently for a window.
 * The first calls of a bucket try both (the tuner's row first, which also
 * takes the first-touch page faults, then the alternative, then the tuner's
 * row again); then the alternative runs where it measured faster by a
 * margin (single copy clearly faster, ADAPT_MARGIN; the slots' other way a
 * little, ADAPT_SLOTS_MARGIN: coll.h), the tuner's row otherwise, and now
 * and then one call runs the other to see whether that changed
 * (adapt_pick). While a rank waits for a CPU (another busy process;
 * COLLIE_ADAPT_LOAD, load_look below) the tuner's row holds for
 * ADAPT_WINDOW calls at a time: beside a busy process on 2
 * CPUs, call times swung 10x with the scheduler, the pick flipped between
 * the paths on them, and each per-call exchange waited for both ranks to be
 * on a CPU (2 ranks, 2 MiB, held against weighed, bound: broadcast 277
 * against 398 us, alltoall 197 against 276; docs/BENCHMARKS.md). */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll.h"
#include "../graph/bind.h"

/* Per rank, from here on single copy is weighed too, and the first picks
 * cover a call each (below it single copy's system call costs more than a
 * small message's copy; an allgather of 256 KiB a rank took 20-25 us, in a
 * slow stretch 130-175 us by the FIFO, 37-43 by single copy, Open MPI
 * 32-36). */
#define ADAPT_MIN_BYTES ((size_t)256 << 10)
#define ADAPT_MAX_RANKS 64

/* From here to ADAPT_MIN_BYTES a rank, the slots' stores are weighed in
 * windows: the ranks exchange rates and pick a path once every ADAPT_WINDOW
 * calls of the bucket (all count alike, so all know when without asking),
 * the path holds for the window, and its rate is that of the window's
 * median call, timed by each rank from its own entry (a preempted call does
 * not count; a slow stretch slows them all). An exchange a call
 * would cost about 1 us of a 4 us reduce of 32 KiB; one a window, a few
 * percent of one call. Why weigh there at all: in the slow stretches (above)
 * the FIFO with plain stores took 3-4x as long at 32-128 KiB (2 ranks:
 * reduce of 32 KiB 17-18 us against 4-5, of 128 KiB 57-74 against 14-20,
 * alltoall of 32 KiB 11.6-12.8 against 2.8-3.9) while non-temporal slot
 * stores, in the rounds beside them, stayed at 2.7-5 and 8-20 us; outside the
 * stretches neither wins everywhere (2 ranks, bound: non-temporal 1.3x slower
 * for the allreduce of 128 KiB and 1.6x for the allgather, 1.2-1.5x faster
 * for the broadcast, reduce and alltoall of 32 KiB), so the choice is
 * measured, not fixed. docs/BENCHMARKS.md. Single copy is not weighed
 * there: its system call costs more than a small message's copy. */
#define ADAPT_WINDOW_MIN_BYTES ((size_t)32 << 10)

int adapt_pick(uint32_t call, double rate_plan, double rate_alt, int slots, int* trial) {
  *trial = call < ADAPT_TRIES;
  if (call < ADAPT_TRIES) return call == 1;
  int best = rate_alt > (slots ? ADAPT_SLOTS_MARGIN : ADAPT_MARGIN) * rate_plan;
  /* On the tuner's row every call measures it, so a slow stretch shows at
   * once; single copy's rate changes little, so it is tried seldom
   * (ADAPT_EXPLORE_ALT: a lone single-copy call among FIFO calls costs 3-4x
   * one in a run of them, 2 ranks, allgather of 2 MiB: 240-470 us against
   * about 100, the FIFO's 60-80; tried every 64 calls, the weighing cost
   * 5-7% at 4-8 MiB, docs/BENCHMARKS.md). On single copy, the tuner's row is
   * tried every ADAPT_EXPLORE calls to see the stretch end. The slots' other
   * way costs what the two differ by, and is tried every ADAPT_EXPLORE calls
   * from either: tried every ADAPT_EXPLORE_ALT, a non-temporal trial that
   * came out slow in the bucket's first calls held for the rest of a
   * benchmark's size (2 ranks, alltoall of 2 MiB: 85.5 us against 78.7,
   * broadcast 81.1 against 66.7; docs/BENCHMARKS.md, seventy-second session). */
  uint32_t period = best || slots ? ADAPT_EXPLORE : ADAPT_EXPLORE_ALT;
  *trial = call % period == 0;
  return *trial ? !best : best;
}

/* Three paths, where the tuner's row fills slots: the row with plain slot
 * stores [0], path [1], the row with the FIFO's other way [2]. Path [1] is
 * single copy (slots1 0: the slots' other way is non-temporal stores) or,
 * for a reduction, non-temporal slot stores (slots1 1: [2] is plain stores
 * with the slots read ahead). The first four calls try them ([0], [1], [2],
 * [0]); then [2] is weighed against [0] as adapt_pick weighs the slots'
 * ways, and [1] against the better of the two with its own margin. Path [1]
 * is tried as adapt_pick tries single copy from the FIFO; the FIFO's other
 * way every ADAPT_EXPLORE calls, half way between. */
int adapt_pick3(uint32_t call, const double rate[3], int slots1, int* trial) {
  static const int first[ADAPT_TRIES3] = {0, 1, 2, 0};
  *trial = call < ADAPT_TRIES3;
  if (call < ADAPT_TRIES3) return first[call];
  int fifo = rate[2] > ADAPT_SLOTS_MARGIN * rate[0] ? 2 : 0;
  if (rate[1] > (slots1 ? ADAPT_SLOTS_MARGIN : ADAPT_MARGIN) * rate[fifo]) {
    *trial = call % ADAPT_EXPLORE == 0;
    return *trial ? fifo : 1;
  }
  if (call % ADAPT_EXPLORE_ALT == 0) {
    *trial = 1;
    return 1;
  }
  *trial = call % ADAPT_EXPLORE == ADAPT_EXPLORE / 2;
  return *trial ? 2 - fifo : fifo;
}

static int kind_index(int kind) {
  switch (kind) {
    case COLL_BROADCAST: return 0;
    case COLL_ALLGATHER: return 1;
    case COLL_ALLTOALL: return 2;
    case COLL_ALLREDUCE: return 3;
    case COLL_REDUCE: return 4;
    case COLL_REDUCESCATTER: return 5;
    default: return -1;
  }
}

/* What a call moves per rank, by which it is bucketed, weighed and timed:
 * the block of a broadcast or allgather, the buffer of an allreduce or
 * reduce, all that an alltoall or reduce-scatter rank sends. */
static size_t weighed_bytes(const struct coll_args* a) {
  size_t bytes = a->count * dtype_size(a->dt);
  return a->kind == COLL_ALLTOALL || a->kind == COLL_REDUCESCATTER ? bytes * (size_t)a->comm->nranks : bytes;
}

static int bucket_of(size_t bytes) {
  int b = 0;
  while (b < ADAPT_BUCKETS - 1 && ((size_t)2 << b) <= bytes) b++;
  return b; /* floor(log2(bytes)) */
}

static const struct algo* cma_row(int kind) {
  for (int i = 0; i < algo_table_len; i++)
    if (algo_table[i]->coll == kind && algo_table[i]->name == ALGO_CMA) return algo_table[i];
  return NULL;
}

/* The alternative to the tuner's row for this call: ALT_CMA, the
 * single-copy row; ALT_SLOTS, the same row with non-temporal stores into the
 * slots; ALT_CMA_SLOTS, both (adapt_pick3); ALT_SLOTS_AHEAD, a reduction's
 * row with non-temporal slot stores [1] or with plain ones and its reads of
 * the peers' slots prefetched ahead [2] (adapt_pick3 again: read-ahead is
 * weighed against plain stores as the FIFO's other store kind is there, and
 * non-temporal stores against the better of the two as single copy is);
 * ALT_NONE, not weighed. */
enum { ALT_NONE, ALT_CMA, ALT_SLOTS, ALT_CMA_SLOTS, ALT_SLOTS_AHEAD };

/* Path `use` of alternative `alt`: single copy; the slots with non-temporal
 * stores; the slots read ahead. */
static int is_cma(int alt, int use) { return use == 1 && (alt == ALT_CMA || alt == ALT_CMA_SLOTS); }
static int nt_slots(int alt, int use) {
  return ((alt == ALT_SLOTS || alt == ALT_SLOTS_AHEAD) && use == 1) || (alt == ALT_CMA_SLOTS && use == 2);
}
static int read_ahead(int alt, int use) { return alt == ALT_SLOTS_AHEAD && use == 2; }
static int three_paths(int alt) { return alt == ALT_CMA_SLOTS || alt == ALT_SLOTS_AHEAD; }

static int adapt_alt(const struct coll_args* a, const struct plan* p) {
  const struct ncclComm* comm = a->comm;
  size_t bytes = weighed_bytes(a);
  if (kind_index(a->kind) < 0 || bytes < ADAPT_WINDOW_MIN_BYTES || p->algo->name == ALGO_CMA) return ALT_NONE;
  if (!coll_shm_only(comm) || comm->nranks < 2 || comm->nranks > ADAPT_MAX_RANKS) return ALT_NONE;
  /* Ranks that take turns on a CPU do not copy at once, and every exchange
   * waits for all of them to run: the model's choice stands there. (Tried
   * for alltoall at 4 ranks on 2 CPUs: one call's time, or the time from
   * one exchange to the next, varied up to 10x from call to call as the
   * scheduler ran the ranks, and the pick flipped between the paths.) */
  if (comm->oversub > 1.0) return ALT_NONE;
  /* Single copy where it works and NCCL_ALGO allows it (COLLIE_CMA_ADAPT). */
  int cma = bytes >= ADAPT_MIN_BYTES && kind_index(a->kind) <= 2 && comm->cma && comm->cma_adapt &&
            (comm->algo_mask & (1 << ALGO_CMA)) && cma_row(a->kind);
  /* The slots' stores (COLLIE_SLOT_STREAM=auto), where the row fills slots
   * at all: the one-shot rows copy through their own mailboxes. */
  int slots = comm->slot_stream < 0 && p->algo->name != ALGO_DIRECT;
  /* A reduction's reads of its peers' slots (COLLIE_READ_AHEAD=auto),
   * where what it reads of its own buffer fits its core's private cache:
   * read ahead, a reduce of 128 KiB between 2 ranks on 2 CPUs took 6.8 us
   * against 10.3 one hour and 7.2 against 6.0 the next (the VM's two vCPUs
   * nearer each other then: Open MPI's 9.7 and 12.7); beyond that cache the
   * local source's own stream limits it (a reduce-scatter reading 4 MiB a
   * rank 1.04-1.08x slower read ahead, a reduce of 1-8 MiB even). */
  int reduction = a->kind == COLL_ALLREDUCE || a->kind == COLL_REDUCE || a->kind == COLL_REDUCESCATTER;
  if (slots && !cma && reduction && comm->read_ahead_param < 0 && (double)bytes <= comm->tune.near_bytes)
    return ALT_SLOTS_AHEAD;
  return cma && slots ? ALT_CMA_SLOTS : cma ? ALT_CMA : slots ? ALT_SLOTS : ALT_NONE;
}

/* Whether this rank's thread waits for a CPU (COLLIE_ADAPT_LOAD=auto):
 * from the time it spent runnable but not running against its time on a
 * CPU since the last look (/proc/thread-self/schedstat), one look at most
 * every ADAPT_LOOK_NS. Beside a busy process on 2 CPUs, 2 ranks in a tight
 * loop of collectives waited 29-63% of their runnable time; alone, 2-3%.
 * (Counting runnable tasks, as direct_shm.c's look does, reads two ranks
 * that wait for each other as other load.) A look with under 2 ms runnable
 * keeps the verdict, for up to a second. */
#define ADAPT_LOOK_NS 50000000
int adapt_load_verdict(int64_t run_ns, int64_t wait_ns, int64_t since_ns, int was) {
  if (run_ns + wait_ns >= 2000000) return wait_ns * 100 > ADAPT_LOAD_PERCENT * (run_ns + wait_ns);
  return since_ns > 1000000000 ? 0 : was;
}

static int load_look(struct ncclComm* comm) {
  if (comm->adapt_load >= 0) return comm->adapt_load;
  int64_t now = time_ns(), run, wait;
  if (comm->load_ns && now - comm->load_ns < ADAPT_LOOK_NS) return comm->load_busy;
  if (bind_thread_schedstat(&run, &wait) != 0) return 0;
  /* Another thread's figures are no difference to this one's. */
  int tid = (int)syscall(SYS_gettid);
  if (comm->load_ns && tid == comm->load_tid) {
    int64_t drun = run - comm->load_run, dwait = wait - comm->load_wait;
    int busy = adapt_load_verdict(drun, dwait, now - comm->load_ns, comm->load_busy);
    if (busy != comm->load_busy)
      INFO(LOG_TUNING, "rank %d %s for a CPU (%.0f%% of its runnable time in the last %.0f ms)", comm->rank,
           busy ? "waits" : "no longer waits", drun + dwait > 0 ? 100.0 * (double)dwait / (double)(drun + dwait) : 0.0,
           (double)(now - comm->load_ns) / 1e6);
    comm->load_busy = busy;
  }
  comm->load_ns = now;
  comm->load_tid = tid;
  comm->load_run = run;
  comm->load_wait = wait;
  return comm->load_busy;
}

static int cmp_u32(const void* x, const void* y) {
  uint32_t a = *(const uint32_t*)x, b = *(const uint32_t*)y;
  return a < b ? -1 : a > b;
}

/* From ADAPT_MIN_BYTES, a window spans about this many bytes a rank (at
 * least one call, at most ADAPT_WINDOW): an exchange also makes every rank
 * wait for the others, so a broadcast root or a reduce's sender that runs
 * ahead of its readers by several calls (direct_shm.c's mailboxes, the
 * slots) loses that lead at every pick. 2 ranks, bound, in place, medians of
 * 5 interleaved rounds (bench/ab_env.sh broadcast / reduce, us, a pick every
 * call / windows of 8 MiB / nothing weighed): broadcast 256 KiB 14.3 / 13.1
 * / 11.2, 512 KiB 27.4 / 23.8 / 23.8, 2 MiB 104 / 93.5 / 98.6, 4 MiB 204 /
 * 192 / 190; reduce 256 KiB 23.5 / 22.4 / 21.8, 512 KiB 40.0 / 37.4 / 36.9,
 * 1 MiB 68.6 / 65.5 / 66.2; allgather, alltoall and allreduce even within
 * the rounds' spread (docs/BENCHMARKS.md, sixty-first session). The
 * reaction to a slow stretch (seconds long) stays within a millisecond. */
#define ADAPT_WINDOW_BYTES ((size_t)8 << 20)

/* Calls one pick covers, the same on every rank (bytes and the bucket's
 * count agree): ADAPT_WINDOW below ADAPT_MIN_BYTES; from there a call for
 * each of the first picks (`tries`: each path tried once, and the tuner's
 * row again), then ADAPT_WINDOW_BYTES' worth. */
uint32_t adapt_window(size_t bytes, uint32_t calls, uint32_t tries) {
  if (bytes < ADAPT_MIN_BYTES) return ADAPT_WINDOW;
  if (calls < tries) return 1;
  size_t w = ADAPT_WINDOW_BYTES / bytes;
  return w < 1 ? 1 : w > ADAPT_WINDOW ? ADAPT_WINDOW : (uint32_t)w;
}

/* The first call of a window (adapt_window): the ranks
 * swap their rates for the bucket and all apply adapt_pick to the same
 * figures; the path holds for the window. */
static ncclResult_t pick(struct ncclComm* comm, const struct coll_args* a, const struct plan* p, int alt,
                         struct adapt_bucket* b, size_t bytes) {
  /* The last window's rate: its (lower) median call's, a window of one its only call's. */
  if (b->nwin > 0) {
    qsort(b->win_ns, b->nwin, sizeof(b->win_ns[0]), cmp_u32);
    b->rate[b->cur] = (float)((double)bytes / ((double)b->win_ns[(b->nwin - 1) / 2] / 1e3)); /* bytes per us */
  }
  float mine[4] = {b->rate[0], b->rate[1], b->rate[2], (float)load_look(comm)}, all[4 * ADAPT_MAX_RANKS];
  /* Single copy or the FIFO is a choice all ranks must make alike: they
   * swap their figures and wait for each other. The slots' stores are each
   * writer's own: it reads the others' latest figures without waiting
   * (a broadcast root or a reduce's sender that runs calls ahead kept
   * losing that lead at every exchange: 2 ranks, broadcast of 128 KiB in
   * place 4.65 us a call against 4.05 without the exchanges). */
  if (alt == ALT_SLOTS || alt == ALT_SLOTS_AHEAD)
    NCCLCHECK(direct_shm_rates(comm, kind_index(a->kind) * ADAPT_BUCKETS + bucket_of(bytes), mine, all));
  else
    NCCLCHECK(direct_shm_share(comm, mine, sizeof(mine), all));
  int busy = 0;
  for (int r = 0; r < comm->nranks; r++) busy |= all[4 * r + 3] != 0.0f;
  /* A path is as fast as its slowest rank: a broadcast root that posts into
   * its mailbox and returns at once would otherwise make the one-shot look
   * fast while its readers take the time. */
  double low[3] = {all[0], all[1], all[2]};
  for (int r = 1; r < comm->nranks; r++)
    for (int k = 0; k < 3; k++) low[k] = COLLIE_MIN(low[k], (double)all[4 * r + k]);
  /* Single copy is weighed with the wide margin, the slots' ways with the narrow one. */
  int slots1 = alt == ALT_SLOTS || alt == ALT_SLOTS_AHEAD;
  int trial, use = three_paths(alt) ? adapt_pick3(b->calls, low, slots1, &trial)
                                    : adapt_pick(b->calls, low[0], low[1], slots1, &trial);
  uint32_t tries = three_paths(alt) ? ADAPT_TRIES3 : ADAPT_TRIES;
  uint32_t window = adapt_window(bytes, b->calls, tries);
  /* While a rank waits for a CPU, the tuner's row runs ADAPT_WINDOW calls
   * at a time without an exchange: a call's time there says more about the
   * scheduler than about the path, the weighing flipped between the paths
   * on such times, and each exchange needs every rank on a CPU at once. A
   * reduction that may read ahead holds on that (plain slot stores, reads
   * ahead): beside a busy process it was the faster in three runs of four
   * (2 ranks, bound, medians of 3-5 interleaved rounds, us, read ahead /
   * plain: reduce 32 KiB 4.45 / 6.02, 5.29 / 7.45, 5.76 / 8.02; 128 KiB 15.8
   * / 22.6, 16.6 / 27.7, 20.0 / 27.8; Open MPI 21.7-26.5; allreduce 128 KiB
   * 22.3 / 27.6). In the fourth, with the busy process slowing the ranks
   * little (reduce 128 KiB 9.4 us plain), the reduce lost 1.08x at 128 KiB
   * and 1.2x at 512 KiB, the allreduce and reduce-scatter of 128 KiB still
   * gained 1.2-1.3x. */
  if (busy && b->calls >= tries) {
    trial = 0;
    use = alt == ALT_SLOTS_AHEAD ? 2 : 0;
    window = ADAPT_WINDOW;
  }
  if (!trial && use != b->last && comm->rank == 0)
    INFO(LOG_TUNING, "%s of %zu bytes a rank: now %s%s (measured %.2f GB/s against %.2f, the slowest rank's%s)",
         coll_name(a->kind), bytes, is_cma(alt, use) ? "single copy" : algo_name(p->algo->name),
         is_cma(alt, use) || alt == ALT_CMA ? ""
         : nt_slots(alt, use)               ? " with non-temporal slot stores"
         : read_ahead(alt, use)             ? " with plain slot stores, reading the slots ahead"
                                            : " with plain slot stores",
         low[use] / 1e3, low[b->last] / 1e3,
         busy         ? "; a rank waits for a CPU: held for a window of calls"
         : window > 1 ? ", weighed once a window of calls"
                      : "");
  if (!trial) b->last = use;
  b->calls++;
  b->cur = use;
  b->left = window;
  b->nwin = 0;
  return ncclSuccess;
}

ncclResult_t adapt_plan(struct coll_args* a, struct plan* p, struct adapt_ticket* t) {
  t->bucket = NULL;
  int alt = adapt_alt(a, p);
  if (alt == ALT_NONE) return ncclSuccess;
  struct ncclComm* comm = a->comm;
  size_t bytes = weighed_bytes(a);
  struct adapt_bucket* b = &comm->adapt[kind_index(a->kind)][bucket_of(bytes)];
  if (b->left == 0) NCCLCHECK(pick(comm, a, p, alt, b, bytes));
  b->left--;
  int use = b->cur;
  /* Elsewhere the slots' stores stay as COLLIE_SLOT_STREAM set them. */
  if (alt != ALT_CMA) comm->slot_far = nt_slots(alt, use);
  if (alt == ALT_SLOTS_AHEAD) p->read_ahead = read_ahead(alt, use);
  if (is_cma(alt, use)) {
    p->algo = cma_row(a->kind);
    for (int i = 0; i < algo_table_len; i++)
      if (algo_table[i] == p->algo) p->index = i;
    p->nch = 1;
  }
  t->bucket = b;
  t->comm = comm;
  t->start_ns = time_ns();
  return ncclSuccess;
}

void adapt_done(const struct adapt_ticket* t, ncclResult_t res) {
  if (!t->bucket) return;
  /* The slots' stores were this call's alone (send/recv outside a
   * collective read comm->slot_far too). */
  t->comm->slot_far = t->comm->slot_stream == 1;
  if (res != ncclSuccess) return;
  int64_t ns = time_ns() - t->start_ns;
  if (ns < 1) ns = 1;
  struct adapt_bucket* b = t->bucket;
  if (b->nwin < ADAPT_WINDOW) b->win_ns[b->nwin++] = (uint32_t)COLLIE_MIN(ns, (int64_t)UINT32_MAX);
}
