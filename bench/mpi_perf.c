/* mpi-perf: the same benchmark as collie-perf (same command line, timing,
 * check and output: tools/perf_common.c), with MPI collectives instead of
 * collie's, for side-by-side comparisons (bench/compare_mpi.sh). Started by
 * mpirun. Ops: sum, prod, min, max (MPI has no avg). Every collie type: MPI
 * has no 16- or 8-bit floats, so those are opaque types of their size, reduced
 * by user-defined ops (element by element through double: slow, but it lets
 * the check run on every type). */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "perf_common.h"

#define TOOL "mpi-perf"

/* The 16- and 8-bit float types, built at start-up (build_minifloats). */
static MPI_Datatype mini_types[PERF_NTYPES];
static MPI_Op mini_ops[PERF_NOPS];

static bool is_minifloat(int t) {
  return t == PERF_FLOAT16 || t == PERF_BFLOAT16 || t == PERF_F8E4M3 || t == PERF_F8E5M2;
}

static int mini_type_of(MPI_Datatype dt) {
  for (int t = 0; t < PERF_NTYPES; t++)
    if (is_minifloat(t) && mini_types[t] == dt) return t;
  return -1;
}

static void mini_reduce(int op, void* in, void* inout, int* len, MPI_Datatype* dt) {
  int t = mini_type_of(*dt);
  if (t < 0) return;
  for (int i = 0; i < *len; i++) {
    double a = perf_load(t, in, (size_t)i), b = perf_load(t, inout, (size_t)i), r;
    switch (op) {
    case PERF_SUM: r = a + b; break;
    case PERF_PROD: r = a * b; break;
    case PERF_MAX: r = a > b ? a : b; break;
    default: r = a < b ? a : b; break;
    }
    perf_store(t, inout, (size_t)i, r);
  }
}
static void mini_sum(void* in, void* inout, int* len, MPI_Datatype* dt) { mini_reduce(PERF_SUM, in, inout, len, dt); }
static void mini_prod(void* in, void* inout, int* len, MPI_Datatype* dt) { mini_reduce(PERF_PROD, in, inout, len, dt); }
static void mini_max(void* in, void* inout, int* len, MPI_Datatype* dt) { mini_reduce(PERF_MAX, in, inout, len, dt); }
static void mini_min(void* in, void* inout, int* len, MPI_Datatype* dt) { mini_reduce(PERF_MIN, in, inout, len, dt); }

static void build_minifloats(void) {
  for (int t = 0; t < PERF_NTYPES; t++) {
    if (!is_minifloat(t)) continue;
    MPI_Type_contiguous(1, perf_type_size(t) == 2 ? MPI_UINT16_T : MPI_UINT8_T, &mini_types[t]);
    MPI_Type_commit(&mini_types[t]);
  }
  MPI_Op_create(mini_sum, 1, &mini_ops[PERF_SUM]);
  MPI_Op_create(mini_prod, 1, &mini_ops[PERF_PROD]);
  MPI_Op_create(mini_max, 1, &mini_ops[PERF_MAX]);
  MPI_Op_create(mini_min, 1, &mini_ops[PERF_MIN]);
}

static void free_minifloats(void) {
  for (int t = 0; t < PERF_NTYPES; t++)
    if (is_minifloat(t)) MPI_Type_free(&mini_types[t]);
  for (int o = PERF_SUM; o <= PERF_MIN; o++) MPI_Op_free(&mini_ops[o]);
}

struct mpi_ctx {
  int rank, nranks;
  char err[MPI_MAX_ERROR_STRING + 128];
};

static MPI_Datatype mpi_type(int t) {
  switch (t) {
  case PERF_INT8: return MPI_INT8_T;
  case PERF_UINT8: return MPI_UINT8_T;
  case PERF_INT32: return MPI_INT32_T;
  case PERF_UINT32: return MPI_UINT32_T;
  case PERF_INT64: return MPI_INT64_T;
  case PERF_UINT64: return MPI_UINT64_T;
  case PERF_FLOAT32: return MPI_FLOAT;
  case PERF_FLOAT64: return MPI_DOUBLE;
  }
  return is_minifloat(t) ? mini_types[t] : MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(int type, int op) {
  if (is_minifloat(type)) return op >= PERF_SUM && op <= PERF_MIN ? mini_ops[op] : MPI_OP_NULL;
  switch (op) {
  case PERF_SUM: return MPI_SUM;
  case PERF_PROD: return MPI_PROD;
  case PERF_MAX: return MPI_MAX;
  case PERF_MIN: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

static int mpi_failed(struct mpi_ctx* c, const char* fn, int r) {
  if (r == MPI_SUCCESS) return 0;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(r, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  snprintf(c->err, sizeof(c->err), "%s returned %d: %s", fn, r, msg);
  return 1;
}

static int mpi_run(void* vctx, enum perf_coll coll, void* send, void* recv, size_t count, int type, int op,
                   int root, int in_place) {
  struct mpi_ctx* c = vctx;
  if (count > INT_MAX) {
    snprintf(c->err, sizeof(c->err), "count %zu does not fit MPI's int counts", count);
    return 1;
  }
  int n = (int)count;
  MPI_Datatype t = mpi_type(type);
  MPI_Op o = mpi_op(type, op);
  MPI_Comm w = MPI_COMM_WORLD;
  int me = c->rank;
  /* NCCL's in-place layouts (see perf_common.c) map onto MPI_IN_PLACE. */
  switch (coll) {
  case PERF_ALL_REDUCE:
    return mpi_failed(c, "MPI_Allreduce", MPI_Allreduce(in_place ? MPI_IN_PLACE : send, recv, n, t, o, w));
  case PERF_ALL_GATHER:
    return mpi_failed(c, "MPI_Allgather", MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, t, recv, n, t, w));
  case PERF_BROADCAST:
    /* One buffer: the root sends from its send buffer (PERF_BCAST_ROOT_NO_RECV). */
    return mpi_failed(c, "MPI_Bcast", MPI_Bcast(me == root ? send : recv, n, t, root, w));
  case PERF_REDUCE:
    return mpi_failed(c, "MPI_Reduce",
                      MPI_Reduce(in_place && me == root ? MPI_IN_PLACE : send, recv, n, t, o, root, w));
  case PERF_REDUCE_SCATTER:
    /* In place, the result lands at the start (PERF_RS_INPLACE_AT_START). */
    if (in_place)
      return mpi_failed(c, "MPI_Reduce_scatter_block", MPI_Reduce_scatter_block(MPI_IN_PLACE, send, n, t, o, w));
    return mpi_failed(c, "MPI_Reduce_scatter_block", MPI_Reduce_scatter_block(send, recv, n, t, o, w));
  case PERF_ALLTOALL:
    return mpi_failed(c, "MPI_Alltoall", MPI_Alltoall(in_place ? MPI_IN_PLACE : send, n, t, recv, n, t, w));
  case PERF_GATHER:
    return mpi_failed(c, "MPI_Gather",
                      MPI_Gather(in_place && me == root ? MPI_IN_PLACE : send, n, t, recv, n, t, root, w));
  case PERF_SCATTER:
    return mpi_failed(c, "MPI_Scatter",
                      MPI_Scatter(send, n, t, in_place && me == root ? MPI_IN_PLACE : recv, n, t, root, w));
  case PERF_SENDRECV: {
    int to = (me + 1) % c->nranks, from = (me - 1 + c->nranks) % c->nranks;
    if (in_place)
      return mpi_failed(c, "MPI_Sendrecv_replace",
                        MPI_Sendrecv_replace(recv, n, t, to, 0, from, 0, w, MPI_STATUS_IGNORE));
    return mpi_failed(c, "MPI_Sendrecv", MPI_Sendrecv(send, n, t, to, 0, recv, n, t, from, 0, w, MPI_STATUS_IGNORE));
  }
  case PERF_NCOLLS: break;
  }
  snprintf(c->err, sizeof(c->err), "unknown operation %d", (int)coll);
  return 1;
}

static int mpi_barrier(void* vctx) { return mpi_failed(vctx, "MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD)); }

static int mpi_allreduce_f64(void* vctx, double* v, int op) {
  return mpi_failed(vctx, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, mpi_op(PERF_FLOAT64, op), MPI_COMM_WORLD));
}

static int mpi_allreduce_i64_sum(void* vctx, int64_t* v) {
  return mpi_failed(vctx, "MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
}

static int mpi_rank_lines(void* vctx, const char* mine, char* all) {
  return mpi_failed(vctx, "MPI_Gather",
                    MPI_Gather(mine, PERF_LINE_LEN, MPI_CHAR, all, PERF_LINE_LEN, MPI_CHAR, 0, MPI_COMM_WORLD));
}

static const char* mpi_last_error(void* vctx) { return ((struct mpi_ctx*)vctx)->err; }

int main(int argc, char** argv) {
  struct perf_args args;
  int pr = perf_parse_args(argc, argv, TOOL, &args);
  if (pr == PERF_PARSE_HELP) return 0;
  if (pr != PERF_PARSE_OK) return 2;

  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    fprintf(stderr, "%s: MPI_Init failed\n", TOOL);
    return 1;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  struct mpi_ctx ctx;
  memset(&ctx, 0, sizeof(ctx));
  MPI_Comm_rank(MPI_COMM_WORLD, &ctx.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ctx.nranks);
  build_minifloats();

  /* The first line of the library's version, e.g. "Open MPI v4.1.4, ...". */
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  version[len] = '\0';
  version[strcspn(version, "\n,")] = '\0';
  char banner[MPI_MAX_LIBRARY_VERSION_STRING + 64];
  snprintf(banner, sizeof(banner), "%s, host buffers", version);

  unsigned types = 0;
  for (int t = 0; t < PERF_NTYPES; t++)
    if (mpi_type(t) != MPI_DATATYPE_NULL) types |= 1u << t;
  struct perf_backend b = {
      .tool = TOOL,
      .banner = banner,
      .rank = ctx.rank,
      .nranks = ctx.nranks,
      .types = types,
      .ops = 1u << PERF_SUM | 1u << PERF_PROD | 1u << PERF_MAX | 1u << PERF_MIN,
      .flags = PERF_BCAST_ROOT_NO_RECV | PERF_RS_INPLACE_AT_START,
      .ctx = &ctx,
      .run = mpi_run,
      .group_start = NULL,
      .group_end = NULL,
      .barrier = mpi_barrier,
      .allreduce_f64 = mpi_allreduce_f64,
      .allreduce_i64_sum = mpi_allreduce_i64_sum,
      .rank_lines = mpi_rank_lines,
      .last_error = mpi_last_error,
  };
  int rc = perf_main(&args, &b);
  if (rc == PERF_EXIT_FAILED) MPI_Abort(MPI_COMM_WORLD, 1);
  free_minifloats();
  MPI_Finalize();
  return rc;
}
