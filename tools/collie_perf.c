/* collie-perf: nccl-tests-style benchmark of collie's collectives on host
 * buffers (NULL stream), one rank per process. This file is the NCCL-API
 * backend and the rank set-up (collie-run, mpirun, or a single rank); the
 * driver, the check and the output format are in tools/perf_common.c,
 * shared with bench/mpi_perf.c. Uses only the public API (nccl.h, collie.h). */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collie.h"
#include "nccl.h"
#include "perf_common.h"

#ifdef COLLIE_PERF_MPI
#include <mpi.h>
#endif

#define TOOL "collie-perf"

struct collie_ctx {
  ncclComm_t comm;
  int rank, nranks;
  int32_t barrier_word;
  const char* mem; /* what the rank lines say the buffers are */
  char err[1024];
};

/* Records a failed call for last_error; returns non-zero when r failed. */
static int nccl_failed(struct collie_ctx* c, const char* fn, ncclResult_t r) {
  if (r == ncclSuccess) return 0;
  const char* last = ncclGetLastError(c->comm);
  snprintf(c->err, sizeof(c->err), "%s returned %d (%s)%s%s", fn, (int)r, ncclGetErrorString(r),
           last && *last ? ": " : "", last && *last ? last : "");
  return 1;
}

/* TRY(ctx, ncclX, ...): records "ncclX" and the error when the call fails. */
#define TRY(ctx, fn, ...) nccl_failed((ctx), #fn, fn(__VA_ARGS__))

static int perf_collie_run(void* vctx, enum perf_coll coll, void* send, void* recv, size_t count, int type, int op,
                      int root, int in_place) {
  struct collie_ctx* c = vctx;
  ncclDataType_t t = (ncclDataType_t)type;
  ncclRedOp_t o = (ncclRedOp_t)op;
  cudaStream_t st = (cudaStream_t)0;
  (void)in_place; /* NCCL says in-place by pointer equality */
  switch (coll) {
  case PERF_ALL_REDUCE: return TRY(c, ncclAllReduce, send, recv, count, t, o, c->comm, st);
  case PERF_ALL_GATHER: return TRY(c, ncclAllGather, send, recv, count, t, c->comm, st);
  case PERF_BROADCAST: return TRY(c, ncclBroadcast, send, recv, count, t, root, c->comm, st);
  case PERF_REDUCE: return TRY(c, ncclReduce, send, recv, count, t, o, root, c->comm, st);
  case PERF_REDUCE_SCATTER: return TRY(c, ncclReduceScatter, send, recv, count, t, o, c->comm, st);
  case PERF_ALLTOALL: return TRY(c, ncclAlltoAll, send, recv, count, t, c->comm, st);
  case PERF_GATHER: return TRY(c, ncclGather, send, recv, count, t, root, c->comm, st);
  case PERF_SCATTER: return TRY(c, ncclScatter, send, recv, count, t, root, c->comm, st);
  case PERF_SENDRECV: {
    int to = (c->rank + 1) % c->nranks, from = (c->rank - 1 + c->nranks) % c->nranks;
    if (nccl_failed(c, "ncclGroupStart", ncclGroupStart())) return 1;
    /* The group is closed even after a failed call, and the first error kept. */
    int bad = TRY(c, ncclSend, send, count, t, to, c->comm, st);
    if (!bad) bad = TRY(c, ncclRecv, recv, count, t, from, c->comm, st);
    ncclResult_t r = ncclGroupEnd();
    return bad ? 1 : nccl_failed(c, "ncclGroupEnd", r);
  }
  case PERF_NCOLLS: break;
  }
  snprintf(c->err, sizeof(c->err), "unknown operation %d", (int)coll);
  return 1;
}

static int perf_collie_group_start(void* vctx) { return nccl_failed(vctx, "ncclGroupStart", ncclGroupStart()); }
static int perf_collie_group_end(void* vctx) { return nccl_failed(vctx, "ncclGroupEnd", ncclGroupEnd()); }

/* The barrier is a one-element allreduce: every rank must enter it before
 * any can leave. */
static int perf_collie_barrier(void* vctx) {
  struct collie_ctx* c = vctx;
  return TRY(c, ncclAllReduce, &c->barrier_word, &c->barrier_word, 1, ncclInt32, ncclSum, c->comm, (cudaStream_t)0);
}

static int collie_allreduce_f64(void* vctx, double* v, int op) {
  struct collie_ctx* c = vctx;
  return TRY(c, ncclAllReduce, v, v, 1, ncclFloat64, (ncclRedOp_t)op, c->comm, (cudaStream_t)0);
}

static int collie_allreduce_i64_sum(void* vctx, int64_t* v) {
  struct collie_ctx* c = vctx;
  return TRY(c, ncclAllReduce, v, v, 1, ncclInt64, ncclSum, c->comm, (cudaStream_t)0);
}

/* The communicator already knows every rank's pid and host: no exchange. */
static int perf_collie_rank_lines(void* vctx, const char* mine, char* all) {
  struct collie_ctx* c = vctx;
  (void)mine;
  if (c->rank != 0) return 0;
  for (int r = 0; r < c->nranks; r++) {
    collie_peer_info_t info;
    memset(&info, 0, sizeof(info));
    info.size = sizeof(info);
    if (TRY(c, collie_comm_peer_info, c->comm, r, &info)) return 1;
    perf_format_rank_line(all + (size_t)r * PERF_LINE_LEN, r, info.pid, info.hostname, c->mem);
  }
  return 0;
}

static const char* perf_collie_last_error(void* vctx) { return ((struct collie_ctx*)vctx)->err; }

/* -R 1: ncclMemAlloc's host memory, which the ranks of a host map (the
 * mapped allreduce). */
static int perf_collie_mem_alloc(void* vctx, void** p, size_t bytes) {
  return TRY((struct collie_ctx*)vctx, ncclMemAlloc, p, bytes);
}
static void perf_collie_mem_free(void* vctx, void* p) { (void)TRY((struct collie_ctx*)vctx, ncclMemFree, p); }

static int mpi_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

static int other_launcher(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("SLURM_NTASKS") || getenv("WORLD_SIZE");
}

/* Builds the world communicator: collie-run's environment first, then MPI
 * (when built with it) handing rank 0's unique ID around, then whatever
 * launcher collie_comm_init_from_env recognises; with no launcher, one rank. */
static int make_comm(struct collie_ctx* c, int* used_mpi) {
  *used_mpi = 0;
  if (getenv("COLLIE_RANK") || getenv("COLLIE_SIZE"))
    return TRY(c, collie_comm_init_from_env, &c->comm);
#ifdef COLLIE_PERF_MPI
  if (mpi_launched()) {
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS) {
      snprintf(c->err, sizeof(c->err), "MPI_Init failed");
      return 1;
    }
    *used_mpi = 1;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* Rank 0's status travels with the ID, so its failure stops everyone. */
    struct {
      int ok;
      ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof(msg));
    if (rank == 0) msg.ok = !TRY(c, ncclGetUniqueId, &msg.id);
    MPI_Bcast(&msg, (int)sizeof(msg), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (!msg.ok) {
      if (rank != 0) snprintf(c->err, sizeof(c->err), "rank 0 could not create the unique ID");
      return 1;
    }
    return TRY(c, ncclCommInitRank, &c->comm, size, msg.id, rank);
  }
#else
  (void)mpi_launched;
#endif
  if (other_launcher()) return TRY(c, collie_comm_init_from_env, &c->comm);
  ncclUniqueId id;
  if (TRY(c, ncclGetUniqueId, &id)) return 1;
  return TRY(c, ncclCommInitRank, &c->comm, 1, id, 0);
}

int main(int argc, char** argv) {
  struct perf_args args;
  int pr = perf_parse_args(argc, argv, TOOL, &args);
  if (pr == PERF_PARSE_HELP) return 0;
  if (pr != PERF_PARSE_OK) return 2;

  struct collie_ctx ctx;
  memset(&ctx, 0, sizeof(ctx));
  int used_mpi = 0;
  if (make_comm(&ctx, &used_mpi)) {
    fprintf(stderr, "%s: cannot create the communicator: %s\n", TOOL, ctx.err);
#ifdef COLLIE_PERF_MPI
    if (used_mpi) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    return 1;
  }
  int rc = PERF_EXIT_FAILED;
  if (TRY(&ctx, ncclCommUserRank, ctx.comm, &ctx.rank) || TRY(&ctx, ncclCommCount, ctx.comm, &ctx.nranks)) {
    fprintf(stderr, "%s: %s\n", TOOL, ctx.err);
    goto done;
  }

  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  int cv = collie_version();
  char banner[128];
  snprintf(banner, sizeof(banner), "collie %d.%d.%d, NCCL API %d, host buffers, NULL stream", cv / 10000,
           cv / 100 % 100, cv % 100, nccl_version);

  struct perf_backend b = {
      .tool = TOOL,
      .banner = banner,
      .rank = ctx.rank,
      .nranks = ctx.nranks,
      .types = (1u << PERF_NTYPES) - 1,
      .ops = (1u << PERF_NOPS) - 1,
      .flags = PERF_NO_INPLACE_ALLTOALL,
      .ctx = &ctx,
      .run = perf_collie_run,
      .group_start = perf_collie_group_start,
      .group_end = perf_collie_group_end,
      .barrier = perf_collie_barrier,
      .allreduce_f64 = collie_allreduce_f64,
      .allreduce_i64_sum = collie_allreduce_i64_sum,
      .rank_lines = perf_collie_rank_lines,
      .last_error = perf_collie_last_error,
      .mem_alloc = perf_collie_mem_alloc,
      .mem_free = perf_collie_mem_free,
  };
  ctx.mem = args.local_register ? "host memory from ncclMemAlloc" : "host memory";
  rc = perf_main(&args, &b);

done:
  /* After a failed call the peers may be stuck inside a collective: abort
   * rather than destroy, which may wait for them. */
  if (rc == PERF_EXIT_FAILED)
    ncclCommAbort(ctx.comm);
  else
    ncclCommDestroy(ctx.comm);
#ifdef COLLIE_PERF_MPI
  if (used_mpi) {
    if (rc == PERF_EXIT_FAILED) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }
#endif
  return rc == PERF_EXIT_FAILED ? 1 : rc;
}
