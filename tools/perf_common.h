/* The part of collie-perf (tools/collie_perf.c, NCCL API) and mpi-perf
 * (bench/mpi_perf.c, MPI) that must not drift between the two: the
 * nccl-tests-style command line, the size loop, the timing method, the data
 * pattern and its check, and the output format. Each tool only supplies a
 * backend (struct perf_backend) that runs one collective.
 * Depends on neither nccl.h nor mpi.h. */
#ifndef COLLIE_PERF_COMMON_H_
#define COLLIE_PERF_COMMON_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The operations, in the order of the usage text. */
enum perf_coll {
  PERF_ALL_REDUCE,
  PERF_ALL_GATHER,
  PERF_BROADCAST,
  PERF_REDUCE,
  PERF_REDUCE_SCATTER,
  PERF_ALLTOALL,
  PERF_GATHER,
  PERF_SCATTER,
  PERF_SENDRECV,
  PERF_NCOLLS
};

/* Element types: the same numbers as ncclDataType_t, so the NCCL backend can
 * cast; other backends map them. */
enum perf_type {
  PERF_INT8 = 0,
  PERF_UINT8 = 1,
  PERF_INT32 = 2,
  PERF_UINT32 = 3,
  PERF_INT64 = 4,
  PERF_UINT64 = 5,
  PERF_FLOAT16 = 6,
  PERF_FLOAT32 = 7,
  PERF_FLOAT64 = 8,
  PERF_BFLOAT16 = 9,
  PERF_F8E4M3 = 10,
  PERF_F8E5M2 = 11,
  PERF_NTYPES = 12
};

/* Reduction operators: the same numbers as ncclRedOp_t. */
enum perf_op { PERF_SUM = 0, PERF_PROD = 1, PERF_MAX = 2, PERF_MIN = 3, PERF_AVG = 4, PERF_NOPS = 5 };

/* -d all, -o all, -r all. */
#define PERF_ALL (-1)

/* What the command line asked for. */
struct perf_args {
  enum perf_coll coll;
  size_t minbytes, maxbytes;
  size_t stepbytes;   /* additive step, used when stepfactor <= 1 */
  long stepfactor;    /* multiplicative step when > 1 */
  int iters;          /* timed calls per size */
  int warmup;         /* untimed calls per size before the barrier */
  int min_ms;         /* -M: at least this long per size (more calls than iters); 0: off */
  int agg;            /* calls per group (-m); 1 unless the backend has groups */
  int check;          /* checked runs per size and placement; 0 = no check */
  int average;        /* time across ranks: 0 rank 0, 1 mean, 2 min, 3 max */
  int report_cputime; /* only changes the column title: host calls are synchronous */
  int timeout_s;      /* 0: none; else the whole run is stopped after this */
  int type;           /* enum perf_type or PERF_ALL */
  int op;             /* enum perf_op or PERF_ALL */
  int root;           /* a rank or PERF_ALL */
  int local_register; /* -R 1: buffers from the backend's mem_alloc (ncclMemAlloc) */
  int placement;      /* -P: PERF_PLACE_BOTH, _OUT or _IN */
};

/* -P: which placements a size is timed in (both: out of place, then in place). */
enum { PERF_PLACE_BOTH, PERF_PLACE_OUT, PERF_PLACE_IN };

/* Backend flags: where a backend's semantics differ from NCCL's. */
/* The root of an out-of-place broadcast leaves its receive buffer alone
 * (MPI_Bcast has a single buffer): do not check it there. */
#define PERF_BCAST_ROOT_NO_RECV 0x1u
/* In-place reduce-scatter leaves this rank's block at the start of the buffer
 * (MPI_IN_PLACE), not at offset rank * count (NCCL). */
#define PERF_RS_INPLACE_AT_START 0x2u
/* The library refuses in-place alltoall (its result is undefined anyway):
 * the in-place columns of alltoall say N/A. */
#define PERF_NO_INPLACE_ALLTOALL 0x4u

#define PERF_LINE_LEN 256

/*
 * A backend runs collectives for the driver in perf_main. Every function is
 * collective: all ranks call it in the same order. Each returns 0 on success
 * and non-zero on failure, after which last_error describes the failure; the
 * driver then stops, reports it and exits non-zero.
 */
struct perf_backend {
  const char* tool;    /* program name for messages, e.g. "collie-perf" */
  const char* banner;  /* one line for the header, e.g. the library version */
  int rank, nranks;
  unsigned types;      /* bit (1u << type) for each supported enum perf_type */
  unsigned ops;        /* bit (1u << op) for each supported enum perf_op */
  unsigned flags;      /* PERF_* backend flags */
  void* ctx;
  /* One call of `coll`. count is NCCL's count argument (elements per rank
   * block; see perf_main). send/recv follow NCCL's in-place layout, where
   * in_place says the two point into the same buffer. op is ignored by
   * collectives that do not reduce, root by those that have none. */
  int (*run)(void* ctx, enum perf_coll coll, void* send, void* recv, size_t count, int type, int op,
             int root, int in_place);
  /* Optional (NULL: -m greater than 1 is refused): bracket -m calls. */
  int (*group_start)(void* ctx);
  int (*group_end)(void* ctx);
  int (*barrier)(void* ctx);
  /* *v becomes the sum, minimum or maximum (PERF_SUM/MIN/MAX) over ranks. */
  int (*allreduce_f64)(void* ctx, double* v, int op);
  int (*allreduce_i64_sum)(void* ctx, int64_t* v);
  /* Rank 0 gets every rank's description line: all[r * PERF_LINE_LEN]. */
  int (*rank_lines)(void* ctx, const char* mine, char* all);
  const char* (*last_error)(void* ctx);
  /* Optional (NULL: -R 1 is refused): the library's own allocator for the
   * send and receive buffers (collie: ncclMemAlloc, host memory that the
   * ranks of a host can map). Not collective. */
  int (*mem_alloc)(void* ctx, void** p, size_t bytes);
  void (*mem_free)(void* ctx, void* p);
};

/* perf_parse_args results (also the exit status to use on return). */
#define PERF_PARSE_OK 0
#define PERF_PARSE_HELP 1  /* help was printed: exit 0 */
#define PERF_PARSE_USAGE 2 /* a message and the usage were printed: exit 2 */

/*
 * Parses the command line: [OPERATION] [options]. The operation is the first
 * non-option argument, or comes from argv[0] when the program was started
 * through a link named like nccl-tests' binaries (all_reduce_perf, ...).
 * Messages go to stderr, help to stdout.
 */
int perf_parse_args(int argc, char** argv, const char* tool, struct perf_args* a);

/* Prints the help text. */
void perf_usage(FILE* f, const char* tool);

/* perf_main results. */
#define PERF_EXIT_OK 0
#define PERF_EXIT_WRONG 1  /* some results were wrong; every rank knows */
#define PERF_EXIT_USAGE 2  /* a type, op, root or -m the backend cannot honour; every rank knows */
#define PERF_EXIT_FAILED 3 /* a call failed on this rank: peers may be stuck; exit with status 1 */

/*
 * Runs the benchmark described by `a` on `b` and prints the results on rank
 * 0. Returns one of PERF_EXIT_*.
 */
int perf_main(const struct perf_args* a, const struct perf_backend* b);

/* nccl-tests' "#  Rank ..." line for one rank, into buf[PERF_LINE_LEN]. */
void perf_format_rank_line(char* buf, int rank, int pid, const char* host, const char* what);

/* Element i of a buffer of `type`, as a double, and back (round to nearest
 * even; integers wrap). */
double perf_load(int type, const void* buf, size_t i);
void perf_store(int type, void* buf, size_t i, double v);

size_t perf_type_size(int type);
const char* perf_type_name(int type);
const char* perf_op_name(int op);
const char* perf_coll_name(enum perf_coll coll);

#endif /* COLLIE_PERF_COMMON_H_ */
