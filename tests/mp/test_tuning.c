/* The tuner's calibration cache (src/graph/calib.c) and its agreement across
 * ranks (src/graph/tuning.c). "agree N": every rank has its own
 * XDG_CACHE_HOME holding a different tuning table, yet all ranks use rank 0's
 * and choose the same row for every collective and size, and the results are
 * right. "cache": a corrupted file and a file from another CPU are each
 * ignored with one warning and rewritten; an unwritable directory still
 * gives a calibrated table. "oversub": the model picks single copy, the
 * one-shot or the FIFO rows as measured, 2 ranks and more than CPUs. */
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "coll/coll.h"
#include "comm.h"
#include "harness.h"

static const int kinds[] = {COLL_ALLREDUCE, COLL_BROADCAST, COLL_REDUCE, COLL_ALLGATHER,
                            COLL_REDUCESCATTER, COLL_ALLTOALL, COLL_GATHER, COLL_SCATTER};
#define NKINDS ((int)(sizeof(kinds) / sizeof(kinds[0])))
#define NSIZES 13 /* 8 B .. 128 MiB by 4 */
#define NCHOICES (NKINDS * NSIZES)

/* Two tables far apart: A makes every step expensive and copies cheap (few
 * steps win), B the opposite (bandwidth-optimal rows win). */
static void table_for(int rank, struct tune_table* t) {
  tune_table_builtin(t);
  t->shm_alpha_us = rank == 0 ? 40.0 : 0.01;
  t->copy_cache_bw = t->copy_stream_bw = rank == 0 ? 2.0e5 : 150.0;
  t->cma_bw = t->cma_cache_bw = t->cma_near_bw = rank == 0 ? 3.0e5 : 120.0;
  t->cache_bytes = rank == 0 ? 1 << 20 : 64 << 20;
  t->measured = 15;
}

static void choices(struct ncclComm* comm, const struct tune_table* t, int32_t* out) {
  for (int k = 0; k < NKINDS; k++) {
    size_t bytes = 8;
    for (int s = 0; s < NSIZES; s++, bytes *= 4) {
      struct coll_args a;
      memset(&a, 0, sizeof(a));
      a.comm = comm;
      a.kind = kinds[k];
      a.count = bytes / 4;
      a.dt = ncclFloat32;
      out[k * NSIZES + s] = tuning_choose(&a, t, NULL);
    }
  }
}

static int rank_agree(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  char dir[512], why[512];
  snprintf(dir, sizeof(dir), "%s/r%d", (const char*)arg, rank);
  MP_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, "mkdir %s", dir);
  setenv("XDG_CACHE_HOME", dir, 1);
  struct tune_table mine, back;
  table_for(rank, &mine);
  MP_CHECK(tune_cache_store(&mine, NULL, NULL, why, sizeof(why)) == 0, "store: %s", why);
  MP_CHECK(tune_cache_load(&back) == TUNE_LOAD_OK, "own file does not load back");
  MP_CHECK(back.shm_alpha_us == mine.shm_alpha_us && back.copy_stream_bw == mine.copy_stream_bw &&
               back.cache_bytes == mine.cache_bytes && back.source == TUNE_SRC_CACHE,
           "file does not round-trip");

  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  struct tune_table zero;
  table_for(0, &zero);
  MP_CHECK(comm->tune.shm_alpha_us == zero.shm_alpha_us && comm->tune.copy_stream_bw == zero.copy_stream_bw &&
               comm->tune.source == TUNE_SRC_CACHE,
           "rank %d runs with alpha %g bw %g source %d, not rank 0's table", rank, comm->tune.shm_alpha_us,
           comm->tune.copy_stream_bw, comm->tune.source);

  int32_t* all = calloc((size_t)nranks * NCHOICES, sizeof(int32_t));
  int32_t own[NCHOICES];
  MP_CHECK(all != NULL, "oom");
  choices(comm, NULL, all + (size_t)rank * NCHOICES);
  /* What this rank alone would have chosen: the test means something only if that differs. */
  choices(comm, &back, own);
  int differ = 0;
  for (int i = 0; i < NCHOICES; i++) differ += own[i] != all[(size_t)rank * NCHOICES + i];
  if (rank != 0) MP_CHECK(differ > 0, "tables A and B choose alike everywhere: the test proves nothing");
  /* The plan the executor gets is that choice. */
  for (int s = 0; s < NSIZES; s++) {
    struct coll_args a;
    memset(&a, 0, sizeof(a));
    a.comm = comm;
    a.kind = COLL_ALLREDUCE;
    a.count = ((size_t)8 << (2 * s)) / 4;
    a.dt = ncclFloat32;
    struct plan p;
    MP_CHECK(tuning_plan(&a, &p) == ncclSuccess, "tuning_plan");
    MP_CHECK(p.index == all[(size_t)rank * NCHOICES + s], "plan %d vs choice %d", p.index,
             all[(size_t)rank * NCHOICES + s]);
  }
  MP_NCCL(ncclAllGather(all + (size_t)rank * NCHOICES, all, NCHOICES, ncclInt32, comm, NULL));
  for (int r = 1; r < nranks; r++)
    for (int i = 0; i < NCHOICES; i++)
      MP_CHECK(all[(size_t)r * NCHOICES + i] == all[i], "rank %d chose row %d, rank 0 row %d (kind %d, size %d)", r,
               all[(size_t)r * NCHOICES + i], all[i], kinds[i / NSIZES], i % NSIZES);

  /* Results under the agreed choices: sums of small integers are exact. */
  size_t counts[] = {1, 7, 1000, 65536 + 3, 1 << 20};
  for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
    size_t n = counts[c];
    float* buf = malloc(n * sizeof(float));
    float* gat = malloc(n * nranks * sizeof(float));
    MP_CHECK(buf && gat, "oom");
    for (size_t i = 0; i < n; i++) buf[i] = (float)((rank + 1) * (int)(i % 7));
    MP_NCCL(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, NULL));
    float want = (float)(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < n; i++) MP_CHECK(buf[i] == want * (float)(i % 7), "allreduce %zu [%zu] = %g", n, i, buf[i]);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(rank * 3 + (int)(i % 5));
    MP_NCCL(ncclAllGather(buf, gat, n, ncclFloat32, comm, NULL));
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < n; i++)
        MP_CHECK(gat[(size_t)r * n + i] == (float)(r * 3 + (int)(i % 5)), "allgather %zu from %d [%zu]", n, r, i);
    MP_NCCL(ncclBroadcast(rank == 0 ? gat : buf, buf, n, ncclFloat32, 0, comm, NULL));
    for (size_t i = 0; i < n; i++) MP_CHECK(buf[i] == (float)(i % 5), "broadcast %zu [%zu]", n, i);
    free(buf);
    free(gat);
  }
  free(all);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int count_in_file(const char* path, const char* what) {
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof(line), f)) n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

static int write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* NCCL_ALGO naming only rows that cannot run a call (single copy turned
 * off): the call runs on the collective's first row, correct, and each rank
 * says so once a collective, not once a call (broadcast and reduce have
 * single-copy rows); an allreduce, which has none, is not the choice's
 * concern and runs without a word. */
static int rank_fallback(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  char log[600];
  snprintf(log, sizeof(log), "%s/log.%d", (const char*)arg, rank);
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  setenv("NCCL_ALGO", "CMA", 1);
  setenv("COLLIE_CMA", "0", 1);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t counts[] = {1, 1000, 1 << 18};
  for (int rep = 0; rep < 2; rep++)
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
      size_t n = counts[c];
      float* buf = malloc(n * sizeof(float));
      MP_CHECK(buf != NULL, "oom");
      for (size_t i = 0; i < n; i++) buf[i] = rank == 0 ? (float)(i % 9) : -1.0f;
      MP_NCCL(ncclBroadcast(buf, buf, n, ncclFloat32, 0, comm, NULL));
      for (size_t i = 0; i < n; i++) MP_CHECK(buf[i] == (float)(i % 9), "broadcast %zu [%zu] = %g", n, i, buf[i]);
      for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + 1);
      MP_NCCL(ncclReduce(buf, buf, n, ncclFloat32, ncclSum, 1, comm, NULL));
      if (rank == 1)
        for (size_t i = 0; i < n; i++)
          MP_CHECK(buf[i] == (float)(nranks * (nranks + 1) / 2), "reduce %zu [%zu] = %g", n, i, buf[i]);
      for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + 1);
      MP_NCCL(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, NULL));
      for (size_t i = 0; i < n; i++)
        MP_CHECK(buf[i] == (float)(nranks * (nranks + 1) / 2), "allreduce %zu [%zu] = %g", n, i, buf[i]);
      free(buf);
    }
  MP_NCCL(ncclCommDestroy(comm));
  MP_CHECK(count_in_file(log, "no allowed algorithm runs ncclBroadcast") == 1 &&
               count_in_file(log, "no allowed algorithm runs ncclReduce") == 1,
           "expected one fallback warning for broadcast and one for reduce in %s", log);
  MP_CHECK(count_in_file(log, "no allowed algorithm runs ncclAllReduce") == 0,
           "an allreduce has no single-copy row: no warning expected in %s", log);
  return 0;
}

static int test_cache(const char* base) {
  char log[600], path[4352], why[512], buf[4096];
  snprintf(log, sizeof(log), "%s/log", base);
  /* Before the library's first log call: warnings go to this file. */
  setenv("NCCL_DEBUG", "WARN", 1);
  setenv("NCCL_DEBUG_FILE", log, 1);
  setenv("XDG_CACHE_HOME", base, 1);
  MP_CHECK(tune_cache_path(path, sizeof(path)) == 0, "no cache path");
  struct tune_table t, u;

  /* No file: calibrated and stored. */
  tune_table_local(&t, 1, 1);
  MP_CHECK(t.source == TUNE_SRC_CALIBRATED, "source %d", t.source);
  MP_CHECK(t.copy_cache_bw > 0 && t.copy_stream_bw > 0 && t.cma_bw > 0 && t.cma_cache_bw > 0 &&
               t.cma_near_bw > 0 && t.cma_call_us > 0 && t.cache_bytes > 0 && t.near_bytes > 0 && t.fuse_gain > 0,
           "non-positive rate");
  MP_CHECK(t.measured & 256, "the fused reduction step was not measured (measured %d)", t.measured);
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_OK && u.copy_stream_bw == t.copy_stream_bw &&
               u.cma_near_bw == t.cma_near_bw && u.cma_call_us == t.cma_call_us && u.near_bytes == t.near_bytes &&
               u.fuse_gain == t.fuse_gain,
           "stored table not loaded");
  tune_table_local(&u, 1, 1);
  MP_CHECK(u.source == TUNE_SRC_CACHE, "second look did not use the cache (source %d)", u.source);

  /* Corrupted: one digit of a rate changed, checksum left alone. */
  FILE* f = fopen(path, "r");
  MP_CHECK(f != NULL, "open %s", path);
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* p = strstr(buf, "copy_stream_bw ");
  MP_CHECK(p != NULL, "no copy_stream_bw line");
  p += strlen("copy_stream_bw ");
  *p = *p == '9' ? '1' : (char)(*p + 1);
  MP_CHECK(write_file(path, buf) == 0, "rewrite");
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_BAD, "corrupted file accepted");
  MP_CHECK(count_in_file(log, "is corrupted") == 1, "expected one corruption warning in %s", log);
  tune_table_local(&u, 1, 1);
  MP_CHECK(u.source == TUNE_SRC_CALIBRATED, "corrupted file not replaced by a calibration");
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_OK, "corrupted file not rewritten");

  /* Garbage. */
  MP_CHECK(write_file(path, "not a tuning table\n") == 0, "write");
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_BAD, "garbage accepted");

  /* Another machine's table (valid checksum, other CPU). */
  tune_table_builtin(&t);
  MP_CHECK(tune_cache_store(&t, NULL, "Foreign CPU 9000 @ 9.99GHz", why, sizeof(why)) == 0, "store: %s", why);
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_BAD, "foreign file accepted");
  MP_CHECK(count_in_file(log, "another machine") == 1, "expected one foreign-file warning in %s", log);
  tune_table_local(&u, 1, 1);
  MP_CHECK(u.source == TUNE_SRC_CALIBRATED, "foreign file not replaced by a calibration");
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_OK, "foreign file not rewritten");
  tune_table_builtin(&t);
  MP_CHECK(tune_cache_store(&t, "some-other-host", NULL, why, sizeof(why)) == 0, "store: %s", why);
  MP_CHECK(tune_cache_load(&u) == TUNE_LOAD_BAD, "other host's file accepted");

  /* Unwritable directory: calibrated for this process, nothing stored. */
  setenv("XDG_CACHE_HOME", "/proc/collie-no-such-dir", 1);
  MP_CHECK(tune_cache_store(&t, NULL, NULL, why, sizeof(why)) != 0, "stored into /proc");
  tune_table_local(&u, 1, 1);
  MP_CHECK(u.source == TUNE_SRC_CALIBRATED, "no calibration without a cache (source %d)", u.source);
  fprintf(stderr, "passed tuning cache: corrupted, garbage, foreign, unwritable\n");
  return 0;
}

/* A calibration's measured rates (bytes/us), call cost and private cache. */
struct rates {
  double copy_cache, copy_stream, cma_stream, cma_cache, cma_near, cma_call_us;
  size_t near_bytes;
};
/* The development machine's, and the Zen 4 guest's (single copy beyond the
 * cache under half memcpy's rate). */
static const struct rates dev_rates = {14756, 13054, 7982, 11262, 28681, 0.45, (size_t)2 << 20};
static const struct rates zen4_rates = {43580, 10140, 4360, 11210, 12500, 1.37, (size_t)1 << 20};

/* A communicator as far as the tuner sees one: nranks on one host of 2
 * CPUs with a 16 MiB cache, the given rates. */
static void two_cpu_comm(struct ncclComm* comm, int nranks, int cma, const struct rates* r) {
  memset(comm, 0, sizeof(*comm));
  comm->nranks = nranks;
  comm->nhosts = comm->nleaders = 1;
  comm->local_size = comm->nlocal = comm->max_local = nranks;
  comm->algo_mask = comm->proto_mask = ~0;
  comm->min_ch = comm->max_ch = 1;
  comm->cma = cma;
  comm->oversub = nranks > 2 ? nranks / 2.0 : 1.0;
  comm->cpus_per_rank = 2.0 / nranks;
  tune_table_builtin(&comm->tune);
  comm->tune.copy_cache_bw = r->copy_cache;
  comm->tune.copy_stream_bw = r->copy_stream;
  comm->tune.cma_bw = r->cma_stream;
  comm->tune.cma_cache_bw = r->cma_cache;
  comm->tune.cma_near_bw = r->cma_near;
  comm->tune.cma_call_us = r->cma_call_us;
  comm->tune.cache_bytes = 16 << 20;
  comm->tune.near_bytes = r->near_bytes;
}

/* The row the cost model alone picks (a communicator as far as the tuner
 * sees one, 2 CPUs, the table the development machine measured). Every rank
 * copies at once in an allgather, so the rows' rates are a CPU's share and
 * single copy (one copy per byte) beats the ring (two) from the threshold
 * on; in a single-copy broadcast only the readers copy, a whole block each
 * in rounds, against a chain whose inner ranks copy twice once the data
 * stream from memory, and the one-shot broadcast copies once a rank with the
 * root's copy overlapping the readers'. Measured there (collie-perf, 5
 * rounds): 4 ranks allgather 512 KiB a rank 387 us against the ring's 463;
 * broadcast figures at their cases below. */
/* The row the model picks on `comm` for `bytes` a rank of float32 (-1: none). */
static int pick_on(struct ncclComm* comm, int kind, size_t bytes) {
  struct coll_args a;
  memset(&a, 0, sizeof(a));
  a.comm = comm;
  a.kind = kind;
  a.count = bytes / 4;
  a.dt = ncclFloat32;
  int idx = tuning_choose(&a, &comm->tune, NULL);
  return idx < 0 ? -1 : algo_table[idx]->name;
}

static int pick_cma(int nranks, int kind, size_t bytes, int cma) {
  struct ncclComm comm;
  two_cpu_comm(&comm, nranks, cma, &dev_rates);
  comm.cma_min_bytes = comm.cma_min_stream = nranks > 2 ? (size_t)128 << 10 : (size_t)16 << 10;
  return pick_on(&comm, kind, bytes);
}

static int pick(int nranks, int kind, size_t bytes) { return pick_cma(nranks, kind, bytes, 1); }

static int test_oversub(void) {
  struct {
    int nranks, kind;
    size_t bytes; /* per rank */
    int algo;
  } want[] = {
      /* Above 256 KiB a rank the allgather streams each rank's block through
       * its ring in turn (direct_shm.c, stream_allgather); measured on
       * another machine (ms, medians of 5, against single copy and Open
       * MPI): 8 ranks 1 MiB a rank 4.4 against 7.6 (7.3), 16 MiB 76 against
       * 105 (109); 4 ranks 512 KiB 0.40 against 0.81 (0.98), 8 MiB 11.2
       * against 11.5 (15.1). */
      {4, COLL_ALLGATHER, (size_t)512 << 10, ALGO_DIRECT}, {4, COLL_ALLGATHER, (size_t)8 << 20, ALGO_DIRECT},
      {8, COLL_ALLGATHER, (size_t)1 << 20, ALGO_DIRECT},   {8, COLL_ALLGATHER, (size_t)16 << 20, ALGO_DIRECT},
      /* Not where every rank has a CPU (eligible()). */
      {2, COLL_ALLGATHER, (size_t)512 << 10, ALGO_CMA},
      {4, COLL_ALLGATHER, (size_t)32 << 10, ALGO_DIRECT},
      /* The one-shot broadcast (the root copies in, in chunks, readers
       * copy out at once; above 256 KiB streamed through the root's two
       * buffers), measured (us): 8 ranks 128 KiB 18-28 against the ring's
       * 37-44, 2 MiB 471 against single copy's 870, 32 MiB 15710 against
       * 18111 (beside a CPU hog 31667 against 23994 until a root could leave
       * a late reader behind; then 33.8 ms against 34.1, and streamed only up
       * to 8 MiB, until another machine measured it ahead at every size: 32
       * MiB 16.3 against 21.9 ms, 6.8 against 10.8 at 4 ranks, and ahead
       * beside a hog too); 4 ranks 32 KiB 6.0 against the ring's 6.7, 2 MiB
       * 277 against 358; 2 ranks 2 KiB 0.35 against the ring's 0.79. At 2 ranks the
       * root of a single-copy broadcast writes blocks into its reader's
       * buffer while the reader reads (two copiers): single copy from the
       * threshold on, measured in place (us, against the rows picked before)
       * 512 KiB 13.1 against 20.8, 8 MiB 418 against the ring's 649, 32 MiB
       * 2492 against 3070. */
      {8, COLL_BROADCAST, (size_t)128 << 10, ALGO_DIRECT}, {8, COLL_BROADCAST, (size_t)2 << 20, ALGO_DIRECT},
      {8, COLL_BROADCAST, (size_t)8 << 20, ALGO_DIRECT},   {8, COLL_BROADCAST, (size_t)32 << 20, ALGO_DIRECT},
      {4, COLL_BROADCAST, (size_t)32 << 10, ALGO_DIRECT},  {4, COLL_BROADCAST, (size_t)2 << 20, ALGO_DIRECT},
      {4, COLL_BROADCAST, (size_t)32 << 20, ALGO_DIRECT}, {8, COLL_BROADCAST, (size_t)256 << 20, ALGO_DIRECT},
      {2, COLL_BROADCAST, (size_t)2 << 10, ALGO_DIRECT},   {2, COLL_BROADCAST, (size_t)64 << 10, ALGO_CMA},
      {2, COLL_BROADCAST, (size_t)128 << 10, ALGO_CMA},    {2, COLL_BROADCAST, (size_t)8 << 20, ALGO_CMA},
      {2, COLL_BROADCAST, (size_t)32 << 20, ALGO_CMA},
      /* The tree allreduce moves its bytes at about half the ring's rate
       * with more ranks than CPUs; measured at 8 ranks (us, tree / ring /
       * one-shot): 32 KiB 55 / 70 / 45, 128 KiB 131 / 196 / 197, 512 KiB 845
       * / 525 / 614, 2 MiB 3854 / 1912 / 1871 (the one-shot stops at 256
       * KiB). The model chose the tree at 32-512 KiB before. */
      {8, COLL_ALLREDUCE, (size_t)32 << 10, ALGO_DIRECT},  {8, COLL_ALLREDUCE, (size_t)128 << 10, ALGO_RING},
      {8, COLL_ALLREDUCE, (size_t)512 << 10, ALGO_RING},
      /* From 1 MiB a rank (COLLIE_MAPPED=auto) the mapped allreduce's row,
       * which runs the row the tuner would pick without it (here the ring)
       * when any rank's buffers are not ncclMemAlloc's host memory. */
      {8, COLL_ALLREDUCE, (size_t)2 << 20, ALGO_MAPPED},  {2, COLL_ALLREDUCE, (size_t)512 << 10, ALGO_RING},
      {2, COLL_ALLREDUCE, (size_t)1 << 20, ALGO_MAPPED},
      /* The one-shot up to 4 KiB posted at 2 ranks (its small buffers are
       * prefetched for the next call): measured (us, one-shot / ring or
       * pairwise) reduce 4 KiB 0.30 / 0.63, reduce-scatter 4 KiB posted 0.69
       * / 1.16, alltoall 4 KiB posted 0.66 / 1.24; from 8 KiB the ring and
       * the pairwise batch as before (reduce 8 KiB 1.23 / 0.94). The model
       * had the ring and the pairwise batch from 2 KiB. */
      {2, COLL_REDUCE, (size_t)4 << 10, ALGO_DIRECT},       {2, COLL_REDUCE, (size_t)8 << 10, ALGO_RING},
      {2, COLL_REDUCESCATTER, (size_t)2 << 10, ALGO_DIRECT}, {2, COLL_REDUCESCATTER, (size_t)4 << 10, ALGO_RING},
      {2, COLL_ALLTOALL, (size_t)2 << 10, ALGO_DIRECT},     {2, COLL_ALLTOALL, (size_t)4 << 10, ALGO_P2P},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    int got = pick(want[i].nranks, want[i].kind, want[i].bytes);
    if (got != want[i].algo) {
      fprintf(stderr, "FAILED %s of %zu bytes a rank at %d ranks on 2 CPUs: %s, expected %s\n",
              coll_name(want[i].kind), want[i].bytes, want[i].nranks,
              got < 0 ? "none" : algo_name(got), algo_name(want[i].algo));
      bad = 1;
    }
  }
  /* Where single copy is off a streaming root cannot leave a late reader
   * behind, and streams stop at 8 MiB (BCAST_STREAM_NOLEAVE_MAX). */
  struct {
    int nranks, kind;
    size_t bytes;
    int direct;
  } nocma[] = {
      {8, COLL_BROADCAST, (size_t)2 << 20, 1},  {8, COLL_BROADCAST, (size_t)32 << 20, 0},
      {8, COLL_ALLGATHER, (size_t)1 << 20, 1},  {8, COLL_ALLGATHER, (size_t)16 << 20, 0},
      {4, COLL_ALLGATHER, (size_t)8 << 20, 1},  {4, COLL_ALLGATHER, (size_t)32 << 20, 0},
  };
  for (size_t i = 0; i < sizeof(nocma) / sizeof(nocma[0]); i++) {
    int got = pick_cma(nocma[i].nranks, nocma[i].kind, nocma[i].bytes, 0);
    if ((got == ALGO_DIRECT) != nocma[i].direct || got == ALGO_CMA || got < 0) {
      fprintf(stderr, "FAILED without single copy, %s of %zu bytes a rank at %d ranks on 2 CPUs: %s, expected %s\n",
              coll_name(nocma[i].kind), nocma[i].bytes, nocma[i].nranks, got < 0 ? "none" : algo_name(got),
              nocma[i].direct ? "Direct" : "neither Direct nor CMA");
      bad = 1;
    }
  }
  /* The point-to-point thresholds under a table whose single copy beyond
   * the cache is under half memcpy's rate (the Zen 4 guest's calibration):
   * the FIFO's two copies are ahead with a CPU for each rank and at 2 ranks
   * a CPU, while at 4 ranks a CPU (8 on 2) its time there counts twice
   * (tuning_cma_thresholds) and an alltoall whose buffers leave the cache
   * goes by single copy from 32 KiB messages; a lone message never does. */
  struct {
    int nranks;
    size_t stream; /* cma_min_stream expected, SIZE_MAX: none */
  } thr[] = {{2, SIZE_MAX}, {4, SIZE_MAX}, {8, (size_t)32 << 10}, {16, (size_t)8 << 10}};
  for (size_t i = 0; i < sizeof(thr) / sizeof(thr[0]); i++) {
    struct ncclComm comm;
    two_cpu_comm(&comm, thr[i].nranks, 1, &zen4_rates);
    tuning_cma_thresholds(&comm);
    if (comm.cma_min_bytes != SIZE_MAX || comm.cma_min_stream != thr[i].stream) {
      fprintf(stderr, "FAILED single-copy thresholds at %d ranks on 2 CPUs: %zu, %zu where buffers leave the cache; "
              "expected none, %zu\n", thr[i].nranks, comm.cma_min_bytes, comm.cma_min_stream, thr[i].stream);
      bad = 1;
    }
  }
  if (!bad) fprintf(stderr, "passed tuning oversub: single copy against the FIFO rows, 2-16 ranks on 2 CPUs\n");
  return bad;
}

/* A 2-rank communicator as far as the tuner sees one: on one host or two,
 * a CPU a rank, the built-in table with 16 MiB of cache (fixed: the checks
 * do not depend on this machine), COLLIE_STREAM_STORES=0 until set. */
static void two_rank_comm(struct ncclComm* comm, int nhosts) {
  memset(comm, 0, sizeof(*comm));
  comm->nranks = 2;
  comm->nhosts = comm->nleaders = nhosts;
  comm->local_size = comm->nlocal = comm->max_local = nhosts == 1 ? 2 : 1;
  comm->algo_mask = comm->proto_mask = ~0;
  comm->min_ch = comm->max_ch = 1;
  comm->oversub = comm->cpus_per_rank = 1.0;
  tune_table_builtin(&comm->tune);
  comm->tune.cache_bytes = (double)(16 << 20);
}

/* The plan's chunk (graph/tuning.c plan_chunk, transport_chunk_bytes): a
 * communicator across hosts has 512 KiB socket slots by default; the
 * collectives where every rank sends and receives at once or reduces step by
 * 128 KiB (2 ranks over loopback TCP, allreduce 2 MiB: 488 us against 734 in
 * whole slots), one-way streams by whole slots, and so does a reduce of 2
 * ranks (one hop: 2 MiB over TCP 427 us against 649 in 128 KiB steps; at 4
 * ranks the chain fills sooner in 128 KiB steps); with NCCL_BUFFSIZE set,
 * every collective steps by the slot the user chose. On one host the slot
 * is 128 KiB and every collective steps by it but a reduce that fits the
 * last-level cache, whose chain steps by 32 KiB (a copy on one side, a
 * reduction on the other: 128 KiB at 2 ranks 8.9 us against 11.1-11.9 in
 * whole slots). */
static int plan_chunk_of_n(int nranks, int nhosts, int kind, size_t count, size_t* slot) {
  struct ncclComm comm;
  two_rank_comm(&comm, nhosts);
  comm.nranks = nranks;
  struct coll_args a;
  memset(&a, 0, sizeof(a));
  a.comm = &comm;
  a.kind = kind;
  a.count = count;
  a.dt = ncclFloat32;
  a.root = 0;
  struct plan p;
  if (tuning_plan(&a, &p) != ncclSuccess) return -1;
  *slot = comm.slot_bytes;
  return (int)p.chunk;
}

static int plan_chunk_of(int nhosts, int kind, size_t count, size_t* slot) {
  return plan_chunk_of_n(2, nhosts, kind, count, slot);
}

/* The plan's out_far bits for an allreduce of `bytes` a rank at 2 ranks of one
 * host (16 MiB of cache), with this fused-step gain in the table and this
 * COLLIE_STREAM_STORES (-1 auto, 0, 1, 2 split). */
static int plan_far_of(size_t bytes, double fuse_gain, int stream_stores) {
  struct ncclComm comm;
  two_rank_comm(&comm, 1);
  comm.stream_stores = stream_stores;
  comm.tune.fuse_gain = fuse_gain;
  struct coll_args a;
  memset(&a, 0, sizeof(a));
  a.comm = &comm;
  a.kind = COLL_ALLREDUCE;
  a.count = bytes / 4;
  a.dt = ncclFloat32;
  struct plan p;
  if (tuning_plan(&a, &p) != ncclSuccess) return -1;
  return p.out_far;
}

/* Streamed results beyond the cache; the ring's step that also fills a send
 * slot streams in the same pass only where the table measured that pass
 * faster, or where COLLIE_STREAM_STORES says so. */
static int test_far(void) {
  static const struct {
    size_t bytes;
    double gain;
    int stores, want;
    const char* what;
  } cases[] = {
      {(size_t)64 << 20, 1.2, -1, OUT_FAR_STREAM | OUT_FAR_FUSE, "auto, beyond the cache, the one pass faster"},
      {(size_t)64 << 20, 0.7, -1, OUT_FAR_STREAM, "auto, beyond the cache, the one pass slower"},
      {(size_t)4 << 20, 1.2, -1, 0, "auto, in cache"},
      {(size_t)4 << 20, 0.7, 1, OUT_FAR_STREAM | OUT_FAR_FUSE, "1, in cache, the one pass slower"},
      {(size_t)64 << 20, 1.2, 2, OUT_FAR_STREAM, "split, the one pass faster"},
      {(size_t)64 << 20, 1.2, 0, 0, "0, beyond the cache"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int got = plan_far_of(cases[i].bytes, cases[i].gain, cases[i].stores);
    if (got != cases[i].want) {
      fprintf(stderr, "FAILED tuning far: %s: out_far %d, expected %d\n", cases[i].what, got, cases[i].want);
      bad = 1;
    }
  }
  if (!bad) fprintf(stderr, "passed tuning far: streamed results and the fused ring step as the table says\n");
  return bad;
}

static int test_chunk(void) {
  int bad = 0;
  size_t slot = 0;
  const size_t big = (size_t)8 << 20; /* floats: 32 MiB */
  unsetenv("NCCL_BUFFSIZE");
  static const struct {
    int kind, pipe;
  } rows[] = {{COLL_ALLREDUCE, 1}, {COLL_REDUCE, 0},   {COLL_REDUCESCATTER, 1}, {COLL_ALLGATHER, 1},
              {COLL_BROADCAST, 0}, {COLL_ALLTOALL, 0}, {COLL_GATHER, 0},        {COLL_SCATTER, 0}};
  /* A reduce of 4 ranks between 4 hosts: a chain to fill, 128 KiB steps. */
  for (int k = 0; k < 2; k++) {
    size_t count = k == 0 ? (size_t)512 << 10 : big;
    int across4 = plan_chunk_of_n(4, 4, COLL_REDUCE, count, &slot);
    if (slot != (size_t)512 << 10 || across4 != 128 << 10) {
      fprintf(stderr, "FAILED reduce of %zu B at 4 ranks across hosts: chunk %d, slot %zu (expected 131072, slot 524288)\n",
              count * sizeof(float), across4, slot);
      bad = 1;
    }
    /* Hosts of several ranks (shared memory and sockets in one ring): the step. */
    int mixed = plan_chunk_of_n(6, 3, COLL_ALLGATHER, count, &slot);
    if (slot != (size_t)512 << 10 || mixed != 128 << 10) {
      fprintf(stderr, "FAILED allgather of %zu B at 6 ranks on 3 hosts: chunk %d, slot %zu (expected 131072, slot 524288)\n",
              count * sizeof(float), mixed, slot);
      bad = 1;
    }
    /* An allgather of more than 2 ranks, a host each, passes every block on: whole slots. */
    static const int ns[] = {3, 8};
    for (size_t k2 = 0; k2 < sizeof(ns) / sizeof(ns[0]); k2++) {
      int n = ns[k2];
      int ag = plan_chunk_of_n(n, n, COLL_ALLGATHER, count, &slot);
      if (slot != (size_t)512 << 10 || ag != (int)slot) {
        fprintf(stderr, "FAILED allgather of %zu B at %d ranks across hosts: chunk %d, slot %zu (expected both 524288)\n",
                count * sizeof(float), n, ag, slot);
        bad = 1;
      }
    }
  }
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    /* 2 MiB: a reduce of 2 ranks that would fit the cache steps by whole slots between hosts. */
    int across = plan_chunk_of(2, rows[i].kind, (size_t)512 << 10, &slot);
    size_t want = rows[i].pipe ? (size_t)128 << 10 : slot;
    if (slot != (size_t)512 << 10 || across != (int)want) {
      fprintf(stderr, "FAILED %s across hosts: chunk %d, slot %zu (expected %zu, slot 524288)\n",
              coll_name(rows[i].kind), across, slot, want);
      bad = 1;
    }
    /* A 16 MiB cache: a reduce of 2 MiB fits it (32 KiB steps), one of 32
     * MiB does not (the slot); every other collective steps by the slot. */
    for (int k = 0; k < 2; k++) {
      size_t count = k == 0 ? (size_t)512 << 10 : big;
      int local = plan_chunk_of(1, rows[i].kind, count, &slot);
      size_t want_local = rows[i].kind == COLL_REDUCE && k == 0 ? (size_t)32 << 10 : slot;
      if (local != (int)want_local || slot != (size_t)128 << 10) {
        fprintf(stderr, "FAILED %s of %zu B on one host: chunk %d, slot %zu (expected %zu, slot 131072)\n",
                coll_name(rows[i].kind), count * sizeof(float), local, slot, want_local);
        bad = 1;
      }
    }
  }
  setenv("NCCL_BUFFSIZE", "4194304", 1);
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    int across = plan_chunk_of(2, rows[i].kind, big, &slot);
    if (slot != (size_t)512 << 10 || across != (int)slot) {
      fprintf(stderr, "FAILED %s across hosts with NCCL_BUFFSIZE=4194304: chunk %d, slot %zu (expected both 524288)\n",
              coll_name(rows[i].kind), across, slot);
      bad = 1;
    }
  }
  unsetenv("NCCL_BUFFSIZE");
  if (!bad) fprintf(stderr, "passed tuning chunk: 128 KiB steps for two-way collectives and chains over large socket slots, whole slots for an allgather of more than 2 ranks a host each\n");
  return bad;
}

/* The row the cost model picks for `bytes` a rank of float32 over sockets,
 * nranks ranks on hosts of per_host ranks each, 2 CPUs for all (-1: none). */
static int pick_hosts(int nranks, int per_host, int kind, size_t bytes) {
  struct ncclComm comm;
  two_cpu_comm(&comm, nranks, 0, &dev_rates);
  comm.nhosts = comm.nleaders = nranks / per_host;
  comm.local_size = comm.nlocal = comm.max_local = per_host;
  comm.sock_oversub = nranks / 2.0;
  return pick_on(&comm, kind, bytes);
}

/* Bruck's alltoall (doubling.c) against the pairwise batch, over sockets
 * with every rank a host of its own and 2 CPUs for all: never at 3 ranks
 * (no message saved), and only up to 12 KiB blocks (BRUCK_ALLTOALL_MAX_BLOCK;
 * measured at 4 ranks, 16 KiB blocks, 51 us against the pairwise 38). */
static int test_bruck(void) {
  struct {
    int nranks;
    size_t block;
    int bruck;
  } want[] = {{3, 1024, 0}, {3, 8 << 10, 0}, {4, 16 << 10, 0}, {5, 13 << 10, 0}, {8, 16 << 10, 0},
              {4, 8 << 10, 1}, {8, 8 << 10, 1}, {6, 10 << 10, 1}};
  int bad = 0;
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    int got = pick_hosts(want[i].nranks, 1, COLL_ALLTOALL, want[i].block);
    if ((got == ALGO_DOUBLING) != want[i].bruck || got < 0) {
      fprintf(stderr, "FAILED alltoall of %zu-byte blocks at %d ranks, a host each on 2 CPUs: %s, expected %s\n",
              want[i].block, want[i].nranks, got < 0 ? "none" : algo_name(got),
              want[i].bruck ? "Doubling" : "not Doubling");
      bad = 1;
    }
  }
  /* The allgather by doubling in place: a power of two of ranks, a host
   * each, up to 32 MiB in all; the ring beyond, for other counts and where
   * hosts hold several ranks (bytes a rank). */
  struct {
    int nranks, per_host;
    size_t bytes;
    int doubling;
  } ag[] = {{4, 1, 512 << 10, 1}, {4, 1, 8 << 20, 1},  {8, 1, 4 << 20, 1},   {8, 1, 16 << 20, 0},
            {6, 1, 1 << 20, 0},   {8, 2, 1 << 20, 0},  {4, 1, 32 << 20, 0}};
  for (size_t i = 0; i < sizeof(ag) / sizeof(ag[0]); i++) {
    int got = pick_hosts(ag[i].nranks, ag[i].per_host, COLL_ALLGATHER, ag[i].bytes);
    if ((got == ALGO_DOUBLING) != ag[i].doubling || got < 0) {
      fprintf(stderr, "FAILED allgather of %zu B a rank at %d ranks, %d a host: %s, expected %s\n", ag[i].bytes,
              ag[i].nranks, ag[i].per_host, got < 0 ? "none" : algo_name(got),
              ag[i].doubling ? "Doubling" : "not Doubling");
      bad = 1;
    }
  }
  if (!bad)
    fprintf(stderr, "passed tuning bruck: Bruck's alltoall where it saves messages, small blocks only; the "
                    "allgather by doubling for a power of two of hosts up to 32 MiB\n");
  return bad;
}

/* The binomial-tree reduce (binomial.c) against the chain, over sockets with
 * every rank a host of its own and 2 CPUs for all: from 4 ranks, small
 * messages (measured even or ahead at 8 B-32 KiB, 4 and 8 ranks); not at 3
 * ranks (two steps either way), not above 64 KiB, and not where a host holds
 * several ranks (the ring's chain crosses between hosts once per host). */
static int test_binomial(void) {
  struct {
    int nranks, per_host;
    size_t bytes;
    int tree;
  } want[] = {{4, 1, 8, 1},      {4, 1, 512, 1}, {8, 1, 8, 1},       {8, 1, 2048, 1},  {16, 1, 512, 1},
              {3, 1, 8, 0},      {8, 1, 128 << 10, 0}, {8, 2, 512, 0}, {4, 2, 8, 0}};
  int bad = 0;
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    int n = want[i].nranks, k = want[i].per_host;
    int got = pick_hosts(n, k, COLL_REDUCE, want[i].bytes);
    if ((got == ALGO_TREE) != want[i].tree || got < 0) {
      fprintf(stderr, "FAILED reduce of %zu bytes at %d ranks, %d a host, on 2 CPUs: %s, expected %s\n",
              want[i].bytes, n, k, got < 0 ? "none" : algo_name(got), want[i].tree ? "Tree" : "not Tree");
      bad = 1;
    }
  }
  if (!bad) fprintf(stderr, "passed tuning binomial: the tree reduce between hosts from 4 ranks, small messages\n");
  return bad;
}

int main(int argc, char** argv) {
  char base[] = "/tmp/collie-tuning-XXXXXX";
  if (!mkdtemp(base)) return 1;
  int rc;
  if (argc > 1 && strcmp(argv[1], "cache") == 0) {
    rc = test_cache(base);
  } else if (argc > 1 && strcmp(argv[1], "oversub") == 0) {
    rc = test_oversub();
  } else if (argc > 1 && strcmp(argv[1], "chunk") == 0) {
    rc = test_chunk();
  } else if (argc > 1 && strcmp(argv[1], "bruck") == 0) {
    rc = test_bruck();
  } else if (argc > 1 && strcmp(argv[1], "binomial") == 0) {
    rc = test_binomial();
  } else if (argc > 1 && strcmp(argv[1], "far") == 0) {
    rc = test_far();
  } else if (argc > 1 && strcmp(argv[1], "fallback") == 0) {
    rc = mp_run(2, rank_fallback, base, 120);
    fprintf(stderr, "%s NCCL_ALGO fallback warning, 2 ranks\n", rc ? "FAILED" : "passed");
  } else if (argc > 2 && strcmp(argv[1], "agree") == 0) {
    int n = atoi(argv[2]);
    rc = mp_run(n, rank_agree, base, 300);
    fprintf(stderr, "%s tuning agreement, %d ranks\n", rc ? "FAILED" : "passed", n);
  } else {
    fprintf(stderr, "usage: test_tuning cache | oversub | chunk | bruck | binomial | far | fallback | agree NRANKS\n");
    rc = 2;
  }
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
  if (system(cmd) != 0) rc = rc ? rc : 1;
  return rc;
}
