/* Cost model and algorithm choice: the tuner reads the algorithm table
 * (coll/algo_table.c) and, per call, picks the cheapest eligible row the user
 * allows (NCCL_ALGO, NCCL_PROTO) by the rows' own estimate() under this
 * communicator's link costs; logs the choice under NCCL_DEBUG_SUBSYS=TUNING.
 * The link costs come from rank 0's tuning table (graph/calib.c: measured on
 * this machine, cached, or built-in); the same model answers
 * ncclGroupSimulateEnd. Called by the executor (exec.c) and collie-info. */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "../coll/coll.h"
#include "bind.h"

/* NCCL algorithm names collie does not implement: accepted and ignored, so a
 * setting meant for NCCL on GPUs does not stop a job. */
static const char* const nccl_only_algos[] = {"NVLS", "NVLSTree", "CollNetDirect", "CollNetChain", "PAT"};

/* NCCL's list syntax: "A,B" allows only those, "^A,B" allows all but those.
 * Names in `ignore` are skipped (their count in *ignored). -1: unknown name. */
static int parse_list(const char* s, const char* const* names, int count, const char* const* ignore, int nignore,
                      int* mask, int* ignored) {
  *ignored = 0;
  if (!s || !*s) return 0;
  int exclude = s[0] == '^';
  int listed = 0, nlisted = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", s + exclude);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    int found = 0;
    for (int i = 0; i < count; i++)
      if (strcasecmp(tok, names[i]) == 0) {
        listed |= 1 << i;
        found = 1;
      }
    for (int i = 0; i < nignore && !found; i++)
      if (strcasecmp(tok, ignore[i]) == 0) {
        (*ignored)++;
        found = 2;
      }
    if (!found) return -1;
    if (found == 1) nlisted++;
  }
  /* Only names collie lacks ("NVLS"): as if unset. */
  if (!exclude && nlisted == 0) return 0;
  *mask = exclude ? (~listed & ((1 << count) - 1)) : listed;
  return 0;
}

/* The tuning table every rank uses: rank 0's, broadcast through the
 * bootstrap, so ranks whose cache files differ (or that calibrated to
 * different figures) still choose alike. One rank per host (local rank 0)
 * calibrates when its host has no cached table; the others only read the file. */
static ncclResult_t tuning_agree(struct ncclComm* comm) {
  struct tune_table own;
  tune_table_local(&own, comm->rank == 0 || comm->local_rank == 0, 0);
  comm->tune = own;
  if (comm->nranks > 1) NCCLCHECK(bootstrap_bcast(comm->bs, 0, &comm->tune, sizeof(comm->tune)));
  const struct tune_table* t = &comm->tune;
  if (comm->rank != 0 && memcmp(&own, t, sizeof(own)) != 0)
    INFO(LOG_TUNING, "this rank's tuning table (%s) differs from rank 0's: using rank 0's", tune_source_name(own.source));
  INFO(LOG_TUNING | LOG_INIT,
       "tuning table (rank 0's, %s): shm %.2f us/step, copy %.1f GB/s in cache, %.1f GB/s streaming, single copy %.1f "
       "GB/s streaming, %.1f GB/s in cache, %.1f GB/s in a core's cache, %.2f us a call; cache %.0f KiB, a core's %.0f "
       "KiB; sockets %.1f us/step, %.1f GB/s",
       tune_source_name(t->source), t->shm_alpha_us, t->copy_cache_bw / 1e3, t->copy_stream_bw / 1e3, t->cma_bw / 1e3,
       t->cma_cache_bw / 1e3, t->cma_near_bw / 1e3, t->cma_call_us, t->cache_bytes / 1024, t->near_bytes / 1024,
       t->net_alpha_us, t->net_bw / 1e3);
  return ncclSuccess;
}

/* A setting of auto, 0 or 1: -1, 0 or 1 in *out; anything else is
 * ncclInvalidArgument naming the variable. */
static ncclResult_t param_auto01(enum param_id id, int* out) {
  const char* s = param_str(id);
  if (strcmp(s, "auto") == 0) *out = -1;
  else if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0) *out = s[0] - '0';
  else return err_set(ncclInvalidArgument, "%s=\"%s\": expected auto, 0 or 1", param_table[id].name, s);
  return ncclSuccess;
}

/* NCCL_ALGO / NCCL_PROTO into comm->algo_mask / proto_mask, and the
 * COLLIE_STREAM_STORES / COLLIE_SLOT_STREAM / COLLIE_SLOT_ROTATE settings. */
static ncclResult_t tuning_masks(struct ncclComm* comm) {
  int algos = (1 << ALGO_NNAMES) - 1, ignored = 0;
  const char* s = param_str(P_NCCL_ALGO);
  int nonly = (int)(sizeof(nccl_only_algos) / sizeof(nccl_only_algos[0]));
  if (parse_list(s, algo_names, ALGO_NNAMES, nccl_only_algos, nonly, &algos, &ignored) != 0)
    return err_set(ncclInvalidArgument,
                   "NCCL_ALGO=\"%s\": expected a list of Ring, Tree, Direct, Hier, P2P, CMA (optionally ^-prefixed)", s);
  if (ignored)
    INFO(LOG_TUNING | LOG_ENV, "NCCL_ALGO=%s: NVLS, NVLSTree, CollNetDirect, CollNetChain and PAT are NCCL GPU "
         "algorithms collie does not have; ignored", s);
  int pmask = (1 << PROTO_COUNT) - 1;
  s = param_str(P_NCCL_PROTO);
  if (parse_list(s, proto_names, PROTO_COUNT, NULL, 0, &pmask, &ignored) != 0)
    return err_set(ncclInvalidArgument, "NCCL_PROTO=\"%s\": expected a list of Simple, LL, LL128 (optionally ^-prefixed)", s);
  /* A name stays allowed only if one of its rows runs an allowed protocol
   * (the device path reads the Ring and Tree bits). */
  int with_proto = 0;
  for (int i = 0; i < algo_table_len; i++)
    if (pmask & (1 << algo_table[i]->proto)) with_proto |= 1 << algo_table[i]->name;
  algos &= with_proto;
  comm->algo_mask = algos;
  comm->cma_adapt = param_int(P_COLLIE_CMA_ADAPT, 0, 1) != 0;
  comm->proto_mask = pmask;
  s = param_str(P_COLLIE_STREAM_STORES);
  if (strcmp(s, "auto") == 0) comm->stream_stores = -1;
  else if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0) comm->stream_stores = s[0] - '0';
  else if (strcmp(s, "split") == 0) comm->stream_stores = 2;
  else return err_set(ncclInvalidArgument, "COLLIE_STREAM_STORES=\"%s\": expected auto, 0, 1 or split", s);
  NCCLCHECK(param_auto01(P_COLLIE_SLOT_STREAM, &comm->slot_stream));
  NCCLCHECK(param_auto01(P_COLLIE_READ_AHEAD, &comm->read_ahead_param));
  NCCLCHECK(param_auto01(P_COLLIE_ADAPT_LOAD, &comm->adapt_load));
  comm->slot_far = comm->slot_stream == 1;
  return param_auto01(P_COLLIE_SLOT_ROTATE, &comm->slot_rotate);
}

/* Channel bounds: environment first, then the communicator's config. */
static void tuning_ch_bounds(struct ncclComm* comm) {
  int64_t lo = param_int(P_NCCL_MIN_CTAS, 0, 1 << 20), hi = param_int(P_NCCL_MAX_CTAS, 0, 1 << 20);
  if (!lo && comm->config.minCTAs != NCCL_CONFIG_UNDEF_INT) lo = comm->config.minCTAs;
  if (!hi && comm->config.maxCTAs != NCCL_CONFIG_UNDEF_INT) hi = comm->config.maxCTAs;
  comm->min_ch = (int)(lo < 1 ? 1 : lo > MAX_CHANNELS ? MAX_CHANNELS : lo);
  comm->max_ch = (int)(hi < 1 ? MAX_CHANNELS : hi > MAX_CHANNELS ? MAX_CHANNELS : hi);
  if (comm->max_ch < comm->min_ch) comm->max_ch = comm->min_ch;
}

ncclResult_t tuning_init(struct ncclComm* comm) {
  NCCLCHECK(tuning_masks(comm));
  int algos = comm->algo_mask;
  /* Whether single copy works between this host's ranks decides which rows are eligible. */
  NCCLCHECK(transport_cma_init(comm));
  tuning_ch_bounds(comm);
  /* Every rank must reach the same decisions, so this uses only what all
   * ranks know alike: the most crowded host (ranks per CPU of its ranks'
   * CPU sets, from the exchanged peer info). */
  comm->oversub = 1.0;
  comm->cpus_per_rank = 1e9;
  comm->max_local = 1;
  for (int i = 0; i < comm->nranks; i++) {
    if (comm->peers[i].local_rank != 0) continue;
    int ncpu = bind_host_cpus(comm, comm->peers[i].host_hash);
    double o = ncpu > 0 ? (double)comm->peers[i].local_size / ncpu : 1.0;
    if (o > comm->oversub) comm->oversub = o;
    if (1.0 / o < comm->cpus_per_rank) comm->cpus_per_rank = 1.0 / o;
    if (comm->peers[i].local_size > comm->max_local) comm->max_local = comm->peers[i].local_size;
  }
  /* Machines whose ranks NCCL_HOSTID makes hosts of their own talk over
   * sockets among themselves; more of them than CPUs and every message
   * costs CPU time the others wait for (direct_net.c). */
  comm->sock_oversub = 1.0;
  for (int i = 0; i < comm->nranks; i++) {
    int first = 1, ranks = 0, hosts = 0;
    for (int j = 0; j < comm->nranks && first; j++) {
      if (comm->machine[j] != comm->machine[i]) continue;
      if (j < i) first = 0;
      ranks++;
      if (comm->peers[j].local_rank == 0) hosts++;
    }
    if (!first || hosts < 2) continue;
    int ncpu = bind_machine_cpus(comm, comm->machine[i]);
    if (ncpu > 0 && (double)ranks / ncpu > comm->sock_oversub) comm->sock_oversub = (double)ranks / ncpu;
  }
  NCCLCHECK(tuning_agree(comm));
  if (comm->cma && comm->cma_min_bytes == SIZE_MAX) tuning_cma_thresholds(comm); /* auto: left to the tuner */
  if (log_enabled(LOG_INFO, LOG_TUNING | LOG_ENV)) {
    char list[128] = "";
    for (int i = 0; i < ALGO_NNAMES; i++)
      if (algos & (1 << i)) snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s ", algo_names[i]);
    INFO(LOG_TUNING | LOG_ENV, "algorithms allowed: %s(mask 0x%x)", list, algos);
  }
  return ncclSuccess;
}

/* Link costs for a call moving `bytes` per rank under table t. Shared memory
 * moves data at the copy rate: the cache-resident one while the host's
 * ranks' buffers (send and receive, every rank of the most crowded host) fit
 * in the last-level cache, the streaming one beyond. An oversubscribed host
 * (ranks waiting for a CPU) pays per step and shares the rate. */
static struct tune_cost cost_for(const struct ncclComm* comm, const struct tune_table* t, double bytes) {
  struct tune_cost c;
  int cached = 2.0 * bytes * comm->max_local <= t->cache_bytes;
  double shm_bw = cached ? t->copy_cache_bw : t->copy_stream_bw;
  c.local.alpha_us = t->shm_alpha_us;
  c.local.bw = shm_bw;
  c.cma_bw = (cached ? t->cma_cache_bw : t->cma_bw) / comm->oversub;
  /* Never below the in-cache rate (a noisy calibration could have it so). */
  c.cma_near_bw = COLLIE_MAX(t->cma_near_bw, t->cma_cache_bw) / comm->oversub;
  /* Ranks that take turns on a CPU push each other's data out of its
   * private cache: no private-cache rate when oversubscribed (8 ranks on 2
   * CPUs: single copy lost 16% at 64 KiB messages). */
  c.near_bytes = comm->oversub > 1 ? 0 : t->near_bytes;
  c.cma_call_us = t->cma_call_us;
  c.resident = cached;
  if (coll_shm_only(comm)) {
    c.link.alpha_us = t->shm_alpha_us + (comm->oversub > 1 ? t->oversub_alpha_us * comm->oversub : 0);
    c.link.bw = shm_bw / comm->oversub;
  } else {
    c.link.alpha_us = t->net_alpha_us * comm->oversub;
    c.link.bw = t->net_bw / comm->oversub;
  }
  return c;
}

/* COLLIE_CMA=auto: the smallest point-to-point message (a power of two,
 * 4 KiB-256 MiB) that single copy moves faster than the FIFO under the
 * agreed table: the FIFO copies every byte twice (into a slot, out of it),
 * single copy once at its own rate (a core's private-cache rate while
 * source and destination fit there) but pays a handshake (the descriptor
 * out, the release back: two steps, and the measured system call). On the
 * development machine that gives 16 KiB at 2 ranks (alltoall of 32 KiB, 16
 * KiB a peer: 2.02 us against the FIFO's 2.66) and 128 KiB at 4 and 8 ranks
 * on 2 CPUs (4 ranks: single copy lost at 8 KiB messages, even at 32 KiB,
 * 1.7x faster at 128 KiB; 8 ranks: lost 16% at 64 KiB, won 1.2-1.5x from
 * 256 KiB). Every rank computes it from the same table and host figures, so
 * all choose alike.
 *
 * cma_min_bytes judges a message by its own size, as if it were the call's
 * only data (a lone send). An alltoall or a scatter moves n messages
 * at once: when its buffers together leave the cache the copies run at the
 * streaming rates however small each message is, and there single copy's
 * one pass beats the FIFO's two from a much smaller message
 * (cma_min_stream, used by p2p_cma). On a Zen 3 guest whose calibration put
 * single copy in cache under half the memcpy rate, cma_min_bytes came to 8
 * MiB at 2 ranks and 4 MiB at 4: alltoall at 4 ranks, 2 MiB a rank (512 KiB
 * messages), took 1091 us by the FIFO against 723 by single copy, 8 ranks 2
 * MiB 2947 against 2486, 2 ranks 8 MiB 1974 against 1737 (medians of 5,
 * docs/BENCHMARKS.md).
 *
 * Where more ranks take turns on a CPU, the FIFO beyond the cache ran
 * slower than two streaming copies predict, single copy at its calibrated
 * rate: a slot's reader waits for a writer that is not running, and the
 * CPU's other ranks evict the slot before it is read, where a single-copy
 * reader needs only its own turn. So the FIFO's time there counts oversub/2
 * times (at least once). On the Zen 4 guest, whose calibration puts single
 * copy beyond the cache at 4.4 GB/s against memcpy's 10.1 (the model had
 * the FIFO ahead at every size), alltoall medians of 5 interleaved rounds,
 * us, FIFO / single copy / Open MPI: 8 ranks on 2 CPUs, two runs, 512 KiB a
 * rank 364 / 247 / 275, 2 MiB 1877 / 1801 / 1725 and 1120 / 929 / 1282, 8
 * MiB 8302 / 7645 / 8019 and 5940 / 6237 / 6476, 32 MiB 37115 / 29304 /
 * 29908 and 31064 / 22800 / 25884. At 4 ranks two runs disagreed (the FIFO
 * swings with the guest's slow stretches, single copy and Open MPI do not):
 * 2 MiB 845 / 540 / 599 and 331 / 403 / 508, 32 MiB 19146 / 14045 / 13289
 * and 11536 / 12443 / 14146, 128 MiB 54724 / 55049 / 50330 and 43726 /
 * 52600 / 53156; there the factor is 1 and the model decides as before. */
void tuning_cma_thresholds(struct ncclComm* comm) {
  const struct tune_table* t = &comm->tune;
  size_t min = SIZE_MAX, stream = SIZE_MAX;
  struct tune_cost far = cost_for(comm, t, 1e15); /* beyond any cache */
  for (size_t bytes = (size_t)4 << 10; bytes <= ((size_t)256 << 20); bytes *= 2) {
    struct tune_cost c = cost_for(comm, t, (double)bytes);
    double fifo = 2.0 * (double)bytes / c.link.bw;
    double single = tune_cma_handshake_us(&c) + (double)bytes / tune_cma_bw(&c, 2.0 * (double)bytes);
    if (single < fifo && min == SIZE_MAX) min = bytes;
    fifo = 2.0 * (double)bytes / far.link.bw * COLLIE_MAX(1.0, comm->oversub / 2.0);
    single = tune_cma_handshake_us(&far) + (double)bytes / far.cma_bw;
    if (single < fifo && stream == SIZE_MAX) stream = bytes;
  }
  comm->cma_min_bytes = min;
  comm->cma_min_stream = COLLIE_MIN(stream, min);
  if (min == SIZE_MAX && stream == SIZE_MAX)
    INFO(LOG_INIT | LOG_SHM | LOG_TUNING, "single copy (cross-memory attach): works between this host's %d ranks, "
         "but the FIFO is faster at every size under the tuning table (COLLIE_CMA=auto)", comm->nranks);
  else if (min == SIZE_MAX)
    INFO(LOG_INIT | LOG_SHM | LOG_TUNING, "single copy (cross-memory attach) between this host's %d ranks: only "
         "in an alltoall or scatter whose buffers leave the cache, from %zu KiB messages (COLLIE_CMA=auto; "
         "COLLIE_CMA=1: every size)", comm->nranks, comm->cma_min_stream >> 10);
  else
    INFO(LOG_INIT | LOG_SHM | LOG_TUNING, "single copy (cross-memory attach) between this host's %d ranks: for "
         "point-to-point messages and the single-copy broadcast and allgather rows from %zu KiB, in an alltoall or "
         "scatter whose buffers leave the cache from %zu KiB (COLLIE_CMA=auto; COLLIE_CMA=1: every size)",
         comm->nranks, min >> 10, comm->cma_min_stream >> 10);
}

/* Channels for a row that can split: more only pay when each rank has CPUs
 * to spare and the message is large enough to hide the hand-off to the
 * helper threads. */
static int channels_for(const struct coll_args* a, const struct algo* al) {
  const struct ncclComm* comm = a->comm;
  if (!(al->flags & ALGO_F_CHANNELS) || comm->nranks == 1 || a->count == 0) return 1;
  double cpus_per_rank = comm->cpus_per_rank;
  size_t bytes = a->count * dtype_size(a->dt);
  int want = bytes >= ((size_t)8 << 20) && cpus_per_rank >= 2 ? (int)cpus_per_rank : 1;
  if (want < comm->min_ch) want = comm->min_ch;
  if (want > comm->max_ch) want = comm->max_ch;
  /* Every channel needs at least one element to move. */
  if ((size_t)want > a->count) want = a->count ? (int)a->count : 1;
  return want;
}

static double row_estimate(const struct coll_args* a, const struct algo* al, const struct tune_cost* c) {
  if (a->comm->nranks == 1) return 0.2 + (double)a->count * (double)dtype_size(a->dt) / (4 * c->link.bw);
  return al->estimate(a, c);
}

/* Index of the row to run, or -1 if the table has none for this collective.
 * Rows named `skip` (an ALGO_*; -1: none) are left out. */
static int choose_but(const struct coll_args* a, const struct tune_table* tab, double* est, int skip) {
  const struct ncclComm* comm = a->comm;
  struct tune_cost c = cost_for(comm, tab ? tab : &comm->tune, (double)a->count * (double)dtype_size(a->dt));
  int best = -1, fallback = -1;
  double best_t = 0;
  for (int i = 0; i < algo_table_len; i++) {
    const struct algo* al = algo_table[i];
    if (al->coll != a->kind || al->name == skip || !al->eligible(a)) continue;
    if (fallback < 0) fallback = i;
    if (!(comm->algo_mask & (1 << al->name)) || !(comm->proto_mask & (1 << al->proto))) continue;
    /* Count 0 moves nothing: no model needed. */
    double t = a->count == 0 ? 0 : row_estimate(a, al, &c);
    if (best < 0 || t < best_t) {
      best = i;
      best_t = t;
    }
  }
  /* Nothing the user allows fits this call: the collective's first row always works. */
  if (best < 0 && fallback >= 0) {
    best = fallback;
    best_t = row_estimate(a, algo_table[best], &c);
  }
  if (est) *est = best_t;
  return best;
}

static int choose(const struct coll_args* a, const struct tune_table* tab, double* est) {
  return choose_but(a, tab, est, -1);
}

/* A reduce over shared memory of at most the last-level cache steps by 32
 * KiB: its chain (ring_reduce.c, cma_reduce.c) is a copy on one side and a
 * reduction on the other, and in whole 128 KiB slots the two overlapped
 * badly. 2 ranks, bound, medians of 5-9
 * interleaved rounds (TRANSPORT=shm bench/ab_env.sh reduce, Open MPI beside):
 * 128 KiB 8.9 us against 11.1-11.9 in 128 KiB steps (Open MPI 8.6-9.1), 256 KiB
 * 17.1 against 21.8 (16.5), 2 MiB 191 against 220, 8 MiB 784 against 889;
 * 512 KiB even (34.8, 35.7). 64 KiB steps were as good at 128 KiB and 2-8
 * MiB but as unsteady as whole slots at 256-512 KiB (21.1 at 256 KiB; 31.6
 * and 41.6 at 512 KiB); 16 KiB steps cost 14.2 at 128 KiB and 3.6 against
 * 2.2 at 32 KiB (two steps). 4 ranks: even to 128 KiB, 0.76-0.87x
 * the time from 512 KiB. Beyond the cache (16 MiB here) the whole slots
 * win back: 128 MiB 20660 against 21086 us, and beside a CPU hog 32 MiB 7313
 * against 7892, 128 MiB 30129 against 33141. Allreduce at 2 ranks in 32 KiB
 * steps was 5-12% slower from 128 KiB, so the others keep the pipeline step. */
#define REDUCE_SHM_STEP_BYTES ((size_t)32 << 10)

/* Collectives where every rank sends and receives at once, or reduces what
 * comes, step by the pipeline step (transport_chunk_bytes), and so does a
 * 2-rank allgather; the others by whole slots: an allgather of more ranks
 * (a block passed on n-2 times: fewer, larger steps measured faster),
 * broadcast (a one-way stream: larger steps measured faster),
 * a reduce of 2 ranks (the same stream, reduced at its end) and the
 * point-to-point rows (alltoall, gather, scatter), whose batches step by the
 * slot for every message. */
static size_t plan_chunk(const struct coll_args* a) {
  struct ncclComm* comm = a->comm;
  size_t slot = transport_chunk_bytes(comm);
  switch (a->kind) {
    case COLL_REDUCE:
      if (coll_shm_only(comm) && (double)a->count * (double)dtype_size(a->dt) <= comm->tune.cache_bytes)
        return COLLIE_MIN(comm->pipe_bytes, REDUCE_SHM_STEP_BYTES);
      /* Two ranks: one hop, a one-way stream as a broadcast is; no chain to
       * fill, so whole slots cost fewer steps. Over loopback TCP (bound, 5
       * interleaved rounds, medians) 512 KiB steps against 128 KiB: 512 KiB
       * 118 against 146 us, 2 MiB 427/649, 8 MiB 2505/3046, 32 MiB
       * 10999/13296, 128 MiB 49454/53048; beside a CPU hog, unbound, even or
       * ahead to 32 MiB, 128 MiB 65/61 ms in rounds of 49-73. At 4 ranks the
       * chain's fill costs more than the steps save (512 KiB 603 against 353
       * us, 32 MiB 38.0 against 33.6 ms): the pipeline step stays there. */
      return comm->nranks == 2 ? slot : comm->pipe_bytes;
    case COLL_ALLGATHER:
      /* Past 2 ranks every block is received and passed on at each rank of
       * the ring, chunk by chunk, and each step of each rank needs that rank
       * scheduled: over loopback TCP on 2 CPUs, a host per rank, unbound
       * (medians of 3 interleaved rounds, us, 128 KiB steps / whole 512 KiB
       * slots), 8 ranks 8 MiB 20610 / 18300, 32 MiB 89074 / 76458, 128 MiB
       * 314062 / 263269; beside a busy loop 32 MiB 152664 / 94939 (Open MPI
       * 92-114 ms), 128 MiB 382626 / 277807; 4 ranks 2 MiB 3221 / 1987, 128
       * MiB 150312 / 116167, beside the loop 32 MiB 63692 / 40903; 128-512
       * KiB even (docs/BENCHMARKS.md, eightieth session). Nothing is
       * reduced, and over sockets the bytes go from the caller's buffer to
       * the kernel and from the kernel to the caller's buffer, so the slot
       * footprint that made the others step by 128 KiB is not touched. 2
       * ranks (prim_exchange: each rank's block crosses once) keep the
       * pipeline step, measured faster there in an earlier session, and so
       * do rings that mix shared memory and sockets (hosts of several
       * ranks; not measured with whole slots). Whole slots hung such a ring
       * once (netns.multihost, 3 hosts of 2 ranks, its allgather): a rank
       * asleep on a shared-memory connector did not push the rest of a
       * socket slot the kernel had not taken; waiters push since
       * (transport_push), and 128 KiB steps had the same hang with 64 KiB
       * socket buffers (coll.hosts3_6_smallbuf). */
      return comm->nranks == 2 || comm->nhosts != comm->nranks ? comm->pipe_bytes : slot;
    case COLL_ALLREDUCE:
    case COLL_REDUCESCATTER: return comm->pipe_bytes;
    default: return slot;
  }
}

/* Results written with non-temporal stores (COLLIE_STREAM_STORES): auto,
 * where the receive buffers of the host's ranks alone exceed its last-level
 * cache. Measured (16 MiB cache; TRANSPORT=shm bench/ab_env.sh OP
 * nt=X=1 plain=COLLIE_STREAM_STORES=0, medians of 3 rounds): 2-rank
 * allreduce out of place 1.25x faster at 32 MiB, 1.22x at 128, 1.16x at
 * 256; reduce-scatter 1.11x at 32 and 128; reduce 1.17x at 128; 4 ranks
 * allreduce 1.10x at 32, 1.17x at 128. At 8 MiB at 2 ranks (buffers that
 * still half fit) even, so not there. In place never (exec.c).
 * The step that reduces into the caller's buffer and fills the next send
 * slot in the same pass (OUT_FAR_FUSE) only where this machine's table says
 * that pass beats plain stores and a copy (fuse_gain, graph/calib.c): a
 * Zen 5 guest ran 2-rank allreduces of 32-256 MiB 1.2-1.35x faster without
 * it, while its reduce-scatter and broadcast still gained from the streamed
 * copies and reductions that fill no slot. */
static int out_far(const struct coll_args* a) {
  const struct ncclComm* comm = a->comm;
  if (comm->stream_stores >= 0)
    return comm->stream_stores == 0 ? 0 : OUT_FAR_STREAM | (comm->stream_stores == 1 ? OUT_FAR_FUSE : 0);
  if ((double)a->count * (double)dtype_size(a->dt) * comm->max_local <= comm->tune.cache_bytes) return 0;
  return OUT_FAR_STREAM | (comm->tune.fuse_gain > 1.0 ? OUT_FAR_FUSE : 0);
}

/* Reductions read their peers' slots with software prefetches ahead
 * (red_reduce_far) where COLLIE_READ_AHEAD=1; with auto, only where the
 * weighing by measurement picks it (coll/adapt.c, ALT_SLOTS_AHEAD): it was
 * 1.3-1.5x faster or 1.2x slower on the same machine an hour apart. */
static int read_ahead(const struct coll_args* a) { return a->comm->read_ahead_param == 1; }

ncclResult_t tuning_plan(const struct coll_args* a, struct plan* p) {
  struct ncclComm* comm = a->comm;
  /* Same call shape as last time: same plan (the model, the channel count and
   * the chunk are pure functions of it and of the communicator). */
  struct tune_memo* m = a->kind < (int)(sizeof(comm->memo) / sizeof(comm->memo[0])) ? &comm->memo[a->kind] : NULL;
  if (m && m->valid && m->count == a->count && m->dt == a->dt) {
    *p = (struct plan){algo_table[m->algo], m->algo, m->nch, m->chunk, m->out_far, read_ahead(a)};
    return ncclSuccess;
  }
  double t = 0;
  int idx = choose(a, NULL, &t);
  if (idx < 0) return err_set(ncclInternalError, "no algorithm in the table runs %s", coll_name(a->kind));
  /* choose() fell back to the collective's first row although the user
   * allows rows of this collective that cannot run this call (NCCL_ALGO=CMA
   * under the single-copy threshold or with COLLIE_CMA=0): say so once a
   * collective, so that nobody measures another row unawares. Where the
   * user's choice names no row of this collective at all (NCCL_ALGO=Ring
   * and an alltoall) it does not concern it: the INFO line below says it. */
  const struct algo* al = algo_table[idx];
  int named = 0;
  for (int i = 0; i < algo_table_len && !named; i++)
    named = algo_table[i]->coll == a->kind && (comm->algo_mask & (1 << algo_table[i]->name)) &&
            (comm->proto_mask & (1 << algo_table[i]->proto));
  if ((!(comm->algo_mask & (1 << al->name)) || !(comm->proto_mask & (1 << al->proto))) && named && a->kind < 32 &&
      !(comm->algo_fallback_warned & (1u << a->kind))) {
    comm->algo_fallback_warned |= 1u << a->kind;
    WARN("NCCL_ALGO=%s NCCL_PROTO=%s: no allowed algorithm runs %s of %zu x %s on these %d ranks%s; running %s/%s "
         "(said once a collective)", param_str(P_NCCL_ALGO) ? param_str(P_NCCL_ALGO) : "(unset)",
         param_str(P_NCCL_PROTO) ? param_str(P_NCCL_PROTO) : "(unset)", coll_name(a->kind), a->count,
         dtype_name(a->dt), comm->nranks,
         (comm->algo_mask & (1 << ALGO_CMA)) && comm->cma ? " (single copy runs from the threshold COLLIE_CMA=auto "
                                                            "sets; COLLIE_CMA=1: every size)" : "",
         algo_name(al->name), proto_names[al->proto]);
  }
  INFO(LOG_TUNING, "%s %zu x %s on %d ranks: %s/%s (%.1f us predicted)", coll_name(a->kind), a->count,
       dtype_name(a->dt), comm->nranks, algo_name(algo_table[idx]->name), proto_names[algo_table[idx]->proto], t);
  p->algo = algo_table[idx];
  p->index = idx;
  p->nch = channels_for(a, p->algo);
  p->chunk = plan_chunk(a);
  p->out_far = out_far(a);
  p->read_ahead = read_ahead(a);
  if (m) *m = (struct tune_memo){1, a->dt, a->count, idx, p->nch, p->chunk, p->out_far};
  return ncclSuccess;
}

ncclResult_t tuning_plan_but(const struct coll_args* a, int skip, struct plan* p) {
  int idx = choose_but(a, NULL, NULL, skip);
  if (idx < 0) return err_set(ncclInternalError, "no algorithm in the table runs %s", coll_name(a->kind));
  p->algo = algo_table[idx];
  p->index = idx;
  p->nch = channels_for(a, p->algo);
  p->chunk = plan_chunk(a);
  p->out_far = out_far(a);
  p->read_ahead = read_ahead(a);
  return ncclSuccess;
}

double coll_estimate_us(const struct coll_args* a) {
  double t = 0;
  return choose(a, NULL, &t) < 0 ? 0 : t;
}

int tuning_choose(const struct coll_args* a, const struct tune_table* t, double* est_us) {
  double e = 0;
  int idx = choose(a, t, &e);
  if (est_us) *est_us = e;
  return idx;
}


/* collie-info --tuning: a communicator of nranks ranks on this host, as far
 * as the tuner sees one (no connections), this process's table, and the
 * plan for each collective and size. */
ncclResult_t tuning_report(FILE* f, int nranks, int factor) {
  struct ncclComm* comm = calloc(1, sizeof(*comm));
  if (!comm) return err_set(ncclSystemError, "out of memory");
  ncclResult_t res = ncclSuccess;
  comm->nranks = nranks;
  comm->nhosts = comm->nleaders = 1;
  comm->local_size = comm->nlocal = comm->max_local = nranks;
  comm->config.minCTAs = comm->config.maxCTAs = NCCL_CONFIG_UNDEF_INT;
  NCCLCHECKGOTO(tuning_masks(comm), res, out);
  tuning_ch_bounds(comm);
  comm->shm_disable = param_int(P_NCCL_SHM_DISABLE, 0, 1) == 1;
  /* Single copy as COLLIE_CMA asks, assuming the probe at init succeeds. */
  int cma = cma_mode();
  if (cma < 0) {
    res = err_set(ncclInvalidArgument, "COLLIE_CMA=\"%s\": expected auto, 0 or 1", param_str(P_COLLIE_CMA));
    goto out;
  }
  comm->cma = nranks > 1 && !comm->shm_disable && (cma == CMA_ON || (cma == CMA_AUTO && nranks <= CMA_AUTO_MAX_RANKS));
  comm->cma_min_bytes = comm->cma_min_stream = cma == CMA_ON ? 1 : SIZE_MAX;
  cpu_set_t set;
  int ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 1) ncpu = 1;
  comm->oversub = nranks > ncpu ? (double)nranks / ncpu : 1.0;
  comm->cpus_per_rank = (double)ncpu / nranks;
  tune_table_local(&comm->tune, 1, 0);
  if (comm->cma && cma == CMA_AUTO) tuning_cma_thresholds(comm);
  const struct tune_table* t = &comm->tune;
  char path[4352] = "(no cache directory)";
  tune_cache_path(path, sizeof(path));
  const char* m = (t->source == TUNE_SRC_BUILTIN) ? "built-in" : "measured";
  fprintf(f, "tuning table: %s%s%s\n", tune_source_name(t->source), t->source == TUNE_SRC_BUILTIN ? "" : ", ",
          t->source == TUNE_SRC_BUILTIN ? "" : path);
  fprintf(f, "  %-18s %12.2f us   built-in\n", "shm step", t->shm_alpha_us);
  fprintf(f, "  %-18s %12.2f us   built-in (per rank per CPU when oversubscribed)\n", "oversubscribed step",
          t->oversub_alpha_us);
  fprintf(f, "  %-18s %12.2f GB/s %s (memcpy, 1-4 MiB)\n", "copy in cache", t->copy_cache_bw / 1e3,
          t->measured & 1 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f GB/s %s (memcpy, LLC-sized block, 8-32 MiB)\n", "copy streaming", t->copy_stream_bw / 1e3,
          t->measured & 2 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f GB/s %s (process_vm_readv, 1-4 MiB)\n", "single copy cache", t->cma_cache_bw / 1e3,
          t->measured & 16 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f GB/s %s (process_vm_readv, LLC-sized block)\n", "single copy", t->cma_bw / 1e3,
          t->measured & 4 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f GB/s %s (process_vm_readv, an eighth of a core's cache)\n", "single copy near",
          t->cma_near_bw / 1e3, t->measured & 32 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f us   %s (process_vm_readv of 64 bytes)\n", "single copy call", t->cma_call_us,
          t->measured & 64 ? m : "built-in");
  fprintf(f, "  %-18s %12.0f KiB  %s (last-level cache)\n", "cache", t->cache_bytes / 1024,
          t->measured & 8 ? m : "built-in");
  fprintf(f, "  %-18s %12.0f KiB  %s (a core's private cache)\n", "core cache", t->near_bytes / 1024,
          t->measured & 128 ? m : "built-in");
  fprintf(f, "  %-18s %12.2f us   built-in\n", "socket step", t->net_alpha_us);
  fprintf(f, "  %-18s %12.2f GB/s built-in\n", "socket rate", t->net_bw / 1e3);
  if (!comm->cma) fprintf(f, "single copy: off\n");
  else if (cma == CMA_ON) fprintf(f, "single copy: every message (COLLIE_CMA=1)\n");
  else if (comm->cma_min_stream == SIZE_MAX) fprintf(f, "single copy: none (the FIFO is faster at every size)\n");
  else if (comm->cma_min_bytes == SIZE_MAX)
    fprintf(f, "single copy: only in an alltoall or scatter whose buffers leave the cache, from %zu KiB per "
            "message (COLLIE_CMA=auto, if the probe at init succeeds)\n", comm->cma_min_stream >> 10);
  else
    fprintf(f, "single copy: from %zu KiB per message; in an alltoall or scatter whose buffers leave the "
            "cache from %zu KiB (COLLIE_CMA=auto, if the probe at init succeeds)\n",
            comm->cma_min_bytes >> 10, comm->cma_min_stream >> 10);
  if (comm->stream_stores >= 0)
    fprintf(f, "non-temporal result stores: %s (COLLIE_STREAM_STORES=%s)\n",
            comm->stream_stores == 0   ? "never"
            : comm->stream_stores == 1 ? "always, also in a ring step that fills a send slot"
                                       : "always, but not in a ring step that fills a send slot",
            comm->stream_stores == 2 ? "split" : comm->stream_stores ? "1" : "0");
  else
    fprintf(f, "non-temporal result stores: above %.0f KiB per rank (COLLIE_STREAM_STORES=auto: the %d ranks' "
            "receive buffers beyond the cache); %s a ring step that also fills a send slot (that pass at %.2fx of "
            "plain stores and a copy, %s)\n", t->cache_bytes / nranks / 1024, nranks,
            t->fuse_gain > 1.0 ? "also in" : "not in", t->fuse_gain, t->measured & 256 ? "measured" : "built-in");
  if (comm->read_ahead_param >= 0)
    fprintf(f, "slots read ahead by reductions: %s (COLLIE_READ_AHEAD=%d)\n",
            comm->read_ahead_param ? "always" : "never", comm->read_ahead_param);
  else if (comm->oversub > 1.0 || comm->slot_stream >= 0)
    fprintf(f, "slots read ahead by reductions: never here (COLLIE_READ_AHEAD=auto: weighed where the slots' stores "
            "are, %s)\n", comm->oversub > 1.0 ? "and ranks share CPUs here" : "and COLLIE_SLOT_STREAM is set");
  else
    fprintf(f, "slots read ahead by reductions: weighed from 32 KiB to %.0f KiB of the rank's own buffer (COLLIE_READ_AHEAD="
            "auto: a core's private cache)\n", t->near_bytes / 1024);
  fprintf(f, "choices at %d ranks on one host (%d CPUs), float32, sum; bytes per rank:\n", nranks, ncpu);
  fprintf(f, "%-14s %12s %-10s %-8s %8s %10s %14s\n", "collective", "bytes", "algorithm", "protocol", "channels",
          "chunk", "predicted_us");
  static const int kinds[] = {COLL_ALLREDUCE,     COLL_BROADCAST, COLL_REDUCE, COLL_ALLGATHER,
                              COLL_REDUCESCATTER, COLL_ALLTOALL,  COLL_GATHER, COLL_SCATTER};
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
    for (size_t bytes = 8; bytes <= ((size_t)256 << 20); bytes *= (size_t)factor) {
      struct coll_args a;
      memset(&a, 0, sizeof(a));
      a.comm = comm;
      a.kind = kinds[k];
      a.count = bytes / 4;
      a.dt = ncclFloat32;
      a.redop = ncclSum;
      double est = 0;
      int idx = choose(&a, NULL, &est);
      if (idx < 0) {
        fprintf(f, "%-14s %12zu (no row)\n", coll_name(a.kind), bytes);
        continue;
      }
      const struct algo* al = algo_table[idx];
      fprintf(f, "%-14s %12zu %-10s %-8s %8d %10zu %14.1f\n", coll_name(a.kind), bytes, algo_name(al->name),
              proto_names[al->proto], channels_for(&a, al), plan_chunk(&a), est);
    }
  }
out:
  free(comm);
  return res;
}
