/* Shared driver of collie-perf and mpi-perf (see perf_common.h): command
 * line, size loop, timing, data pattern and check, nccl-tests-style output.
 * The backends live in tools/collie_perf.c and bench/mpi_perf.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* getopt_long */
#endif

#include "perf_common.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ names */

static const char* const coll_names[PERF_NCOLLS] = {
    "all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter",
    "alltoall",   "gather",     "scatter",   "sendrecv",
};

/* Printed names are nccl-tests'; the other spellings are accepted on input. */
static const struct {
  const char* name;
  int type;
} type_names[] = {
    {"int8", PERF_INT8},         {"uint8", PERF_UINT8},       {"int32", PERF_INT32},
    {"uint32", PERF_UINT32},     {"int64", PERF_INT64},       {"uint64", PERF_UINT64},
    {"half", PERF_FLOAT16},      {"float", PERF_FLOAT32},     {"double", PERF_FLOAT64},
    {"bfloat16", PERF_BFLOAT16}, {"f8e4m3", PERF_F8E4M3},     {"f8e5m2", PERF_F8E5M2},
    {"char", PERF_INT8},         {"int", PERF_INT32},         {"float16", PERF_FLOAT16},
    {"fp16", PERF_FLOAT16},      {"float32", PERF_FLOAT32},   {"fp32", PERF_FLOAT32},
    {"float64", PERF_FLOAT64},   {"fp64", PERF_FLOAT64},      {"bf16", PERF_BFLOAT16},
    {"fp8_e4m3", PERF_F8E4M3},   {"e4m3", PERF_F8E4M3},       {"fp8_e5m2", PERF_F8E5M2},
    {"e5m2", PERF_F8E5M2},
};

static const char* const op_names[PERF_NOPS] = {"sum", "prod", "max", "min", "avg"};

static const size_t type_sizes[PERF_NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

size_t perf_type_size(int type) { return type >= 0 && type < PERF_NTYPES ? type_sizes[type] : 0; }
const char* perf_type_name(int type) { return type >= 0 && type < PERF_NTYPES ? type_names[type].name : "?"; }
const char* perf_op_name(int op) { return op >= 0 && op < PERF_NOPS ? op_names[op] : "?"; }
const char* perf_coll_name(enum perf_coll coll) { return coll < PERF_NCOLLS ? coll_names[coll] : "?"; }

static bool coll_reduces(enum perf_coll c) {
  return c == PERF_ALL_REDUCE || c == PERF_REDUCE || c == PERF_REDUCE_SCATTER;
}
static bool coll_rooted(enum perf_coll c) {
  return c == PERF_BROADCAST || c == PERF_REDUCE || c == PERF_GATHER || c == PERF_SCATTER;
}

/* "all_reduce", "allreduce", "all-reduce" and "all_reduce_perf" name the same operation. */
static int coll_from_name(const char* s) {
  char norm[64];
  size_t n = 0;
  for (; *s && n + 1 < sizeof(norm); s++)
    if (*s != '_' && *s != '-') norm[n++] = *s;
  norm[n] = '\0';
  if (n > 4 && strcmp(norm + n - 4, "perf") == 0) norm[n - 4] = '\0';
  for (int c = 0; c < PERF_NCOLLS; c++) {
    char cn[64];
    size_t k = 0;
    for (const char* p = coll_names[c]; *p; p++)
      if (*p != '_') cn[k++] = *p;
    cn[k] = '\0';
    if (strcmp(norm, cn) == 0) return c;
  }
  return -1;
}

/* ------------------------------------------------------------ command line */

void perf_usage(FILE* f, const char* tool) {
  fprintf(f,
          "usage: %s OPERATION [options]\n"
          "       OPERATION_perf [options]   (through a link named like nccl-tests' programs)\n"
          "\n"
          "nccl-tests-style benchmark of one collective on host buffers.\n"
          "OPERATION: all_reduce all_gather broadcast reduce reduce_scatter alltoall\n"
          "           gather scatter sendrecv\n"
          "\n"
          "Options (nccl-tests' names; sizes take K, M, G or T suffixes, powers of 1024):\n"
          "  -b, --minbytes SIZE      smallest size (default 32M)\n"
          "  -e, --maxbytes SIZE      largest size (default 32M)\n"
          "  -f, --stepfactor N       multiply the size by N each step\n"
          "  -i, --stepbytes SIZE     add SIZE each step (used when -f is not given or\n"
          "                           is 1; with neither option the factor is 2)\n"
          "  -n, --iters N            timed calls per size (default 20)\n"
          "  -w, --warmup_iters N     untimed calls per size before timing (default 5)\n"
          "  -M, --min_time_ms MS     (collie) time at least MS ms per size: more than -n\n"
          "                           calls where the warm-up's second half says one call\n"
          "                           is short; ranks take the slowest rank's figure\n"
          "                           (default 0: exactly -n calls)\n"
          "  -m, --agg_iters N        calls per group, when the library has groups (default 1)\n"
          "  -c, --check N            check the result N times per size, 0 = never (default 1)\n"
          "  -o, --op OP              sum prod min max avg all (default sum)\n"
          "  -d, --datatype TYPE      int8 uint8 int32 uint32 int64 uint64 half|float16\n"
          "                           float|float32 double|float64 bfloat16 f8e4m3 f8e5m2\n"
          "                           all (default float)\n"
          "  -r, --root R             root rank, or all (default 0)\n"
          "  -R, --local_register 0|1 1: send and receive buffers from the library's own\n"
          "                           allocator (collie: ncclMemAlloc, host memory the\n"
          "                           ranks of a host can map; default 0: malloc)\n"
          "  -P, --placement WHICH    (collie) out, in or both (default): time only the\n"
          "                           out-of-place calls, only the in-place ones, or both;\n"
          "                           the columns of the other say N/A\n"
          "  -a, --average 0|1|2|3    time reported: 0 rank 0, 1 mean, 2 min, 3 max over\n"
          "                           ranks (default 1)\n"
          "  -T, --timeout SECONDS    stop the whole run after SECONDS (default 0: never)\n"
          "  -C, --report_cputime 0|1 title the time column cputime (host calls are\n"
          "                           synchronous: the figure is the same)\n"
          "  -z, --blocking 0|1       accepted; calls on host buffers always block\n"
          "  -y, --stream_null 0|1    accepted; the stream is always NULL\n"
          "  -p, --parallel_init 0|1  accepted; ignored\n"
          "  -t, --nthreads 1         -g, --ngpus 1    -G, --cudagraph 0\n"
          "                           accepted with these values only\n"
          "  -h, --help               show this help and exit\n"
          "\n"
          "Ranks: one per process, started by collie-run (or mpirun, see the docs);\n"
          "with no launcher a single rank runs. Only rank 0 prints. The exit status\n"
          "is 0, 1 if a result was wrong or a call failed, 2 for a usage error.\n",
          tool);
}

static int usage_error(const char* tool, const char* fmt, const char* arg) {
  fprintf(stderr, "%s: ", tool);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  fprintf(stderr, "usage: %s OPERATION [-b SIZE] [-e SIZE] [-f N|-i SIZE] [-n N] [-w N] [-c N]\n"
                  "       [-o OP] [-d TYPE] [-r ROOT] [-a MODE] ...   ('%s --help' for more)\n",
          tool, tool);
  return PERF_PARSE_USAGE;
}

/* A size: a non-negative number, optionally with a fraction, then at most
 * one of K, M, G, T (binary units), optionally followed by B; nothing else. */
static int parse_size(const char* s, size_t* out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char* end;
  double v = strtod(s, &end);
  if (end == s || errno != 0 || !(v >= 0)) return -1;
  double unit = 1;
  if (*end && *end != 'B' && *end != 'b') {
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; break;
    case 'm': case 'M': unit = 1024.0 * 1024; break;
    case 'g': case 'G': unit = 1024.0 * 1024 * 1024; break;
    case 't': case 'T': unit = 1024.0 * 1024 * 1024 * 1024; break;
    default: return -1;
    }
    end++;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0') return -1;
  v *= unit;
  if (v >= 9.0e18) return -1;
  *out = (size_t)v;
  return 0;
}

static int parse_int(const char* s, long min, long max, long* out) {
  if (!s || !*s) return -1;
  errno = 0;
  char* end;
  long v = strtol(s, &end, 0);
  if (*end != '\0' || errno != 0 || v < min || v > max) return -1;
  *out = v;
  return 0;
}

int perf_parse_args(int argc, char** argv, const char* tool, struct perf_args* a) {
  static const struct option longopts[] = {
      {"nthreads", required_argument, 0, 't'},     {"ngpus", required_argument, 0, 'g'},
      {"minbytes", required_argument, 0, 'b'},     {"maxbytes", required_argument, 0, 'e'},
      {"stepbytes", required_argument, 0, 'i'},    {"stepfactor", required_argument, 0, 'f'},
      {"iters", required_argument, 0, 'n'},        {"agg_iters", required_argument, 0, 'm'},
      {"warmup_iters", required_argument, 0, 'w'}, {"parallel_init", required_argument, 0, 'p'},
      {"check", required_argument, 0, 'c'},        {"op", required_argument, 0, 'o'},
      {"datatype", required_argument, 0, 'd'},     {"root", required_argument, 0, 'r'},
      {"blocking", required_argument, 0, 'z'},     {"stream_null", required_argument, 0, 'y'},
      {"timeout", required_argument, 0, 'T'},      {"cudagraph", required_argument, 0, 'G'},
      {"report_cputime", required_argument, 0, 'C'}, {"average", required_argument, 0, 'a'},
      {"min_time_ms", required_argument, 0, 'M'}, {"help", no_argument, 0, 'h'},
      {"local_register", required_argument, 0, 'R'}, {"placement", required_argument, 0, 'P'},
      {0, 0, 0, 0},
  };
  memset(a, 0, sizeof(*a));
  a->coll = PERF_NCOLLS;
  a->minbytes = a->maxbytes = 32u << 20;
  a->stepbytes = 1u << 20;
  a->stepfactor = 2;
  a->iters = 20;
  a->warmup = 5;
  a->agg = 1;
  a->check = 1;
  a->average = 1;
  a->type = PERF_FLOAT32;
  a->op = PERF_SUM;
  a->root = 0;
  bool have_factor = false, have_step = false;

  /* Started as all_reduce_perf & co: the operation is in the program's name. */
  const char* base = argv[0] ? strrchr(argv[0], '/') : NULL;
  base = base ? base + 1 : (argv[0] ? argv[0] : "");
  size_t bl = strlen(base);
  if (bl > 5 && strcmp(base + bl - 5, "_perf") == 0) {
    int c = coll_from_name(base);
    if (c >= 0) a->coll = (enum perf_coll)c;
  }

  opterr = 0;
  optind = 1;
  long v;
  for (;;) {
    int c = getopt_long(argc, argv, ":t:g:b:e:i:f:n:m:w:M:p:c:o:d:r:z:y:T:G:C:a:R:P:h", longopts, NULL);
    if (c == -1) break;
    switch (c) {
    case 'h': perf_usage(stdout, tool); return PERF_PARSE_HELP;
    case 'b':
      if (parse_size(optarg, &a->minbytes)) return usage_error(tool, "invalid size for -b/--minbytes: '%s'", optarg);
      break;
    case 'e':
      if (parse_size(optarg, &a->maxbytes)) return usage_error(tool, "invalid size for -e/--maxbytes: '%s'", optarg);
      break;
    case 'i':
      if (parse_size(optarg, &a->stepbytes)) return usage_error(tool, "invalid size for -i/--stepbytes: '%s'", optarg);
      have_step = true;
      break;
    case 'f':
      if (parse_int(optarg, 1, 1L << 20, &v)) return usage_error(tool, "invalid -f/--stepfactor: '%s' (an integer >= 1)", optarg);
      a->stepfactor = v;
      have_factor = true;
      break;
    case 'n':
      if (parse_int(optarg, 1, INT32_MAX, &v)) return usage_error(tool, "invalid -n/--iters: '%s' (an integer >= 1)", optarg);
      a->iters = (int)v;
      break;
    case 'w':
      if (parse_int(optarg, 0, INT32_MAX, &v)) return usage_error(tool, "invalid -w/--warmup_iters: '%s'", optarg);
      a->warmup = (int)v;
      break;
    case 'm':
      if (parse_int(optarg, 1, 1 << 20, &v)) return usage_error(tool, "invalid -m/--agg_iters: '%s' (an integer >= 1)", optarg);
      a->agg = (int)v;
      break;
    case 'c':
      if (parse_int(optarg, 0, 1 << 20, &v)) return usage_error(tool, "invalid -c/--check: '%s' (an integer >= 0)", optarg);
      a->check = (int)v;
      break;
    case 'o':
      if (strcmp(optarg, "all") == 0) {
        a->op = PERF_ALL;
      } else {
        a->op = -2;
        for (int k = 0; k < PERF_NOPS; k++)
          if (strcmp(optarg, op_names[k]) == 0) a->op = k;
        if (a->op == -2) return usage_error(tool, "unknown -o/--op '%s' (sum prod min max avg all)", optarg);
      }
      break;
    case 'd':
      if (strcmp(optarg, "all") == 0) {
        a->type = PERF_ALL;
      } else {
        a->type = -2;
        for (size_t k = 0; k < sizeof(type_names) / sizeof(type_names[0]); k++)
          if (strcmp(optarg, type_names[k].name) == 0) a->type = type_names[k].type;
        if (a->type == -2) return usage_error(tool, "unknown -d/--datatype '%s'", optarg);
      }
      break;
    case 'r':
      if (strcmp(optarg, "all") == 0 || strcmp(optarg, "-1") == 0) {
        a->root = PERF_ALL;
      } else {
        if (parse_int(optarg, 0, INT32_MAX, &v)) return usage_error(tool, "invalid -r/--root: '%s' (a rank or all)", optarg);
        a->root = (int)v;
      }
      break;
    case 'a':
      if (parse_int(optarg, 0, 3, &v)) return usage_error(tool, "invalid -a/--average: '%s' (0, 1, 2 or 3)", optarg);
      a->average = (int)v;
      break;
    case 'M':
      if (parse_int(optarg, 0, 3600 * 1000, &v)) return usage_error(tool, "invalid -M/--min_time_ms: '%s' (milliseconds)", optarg);
      a->min_ms = (int)v;
      break;
    case 'T':
      if (parse_int(optarg, 0, INT32_MAX, &v)) return usage_error(tool, "invalid -T/--timeout: '%s' (seconds)", optarg);
      a->timeout_s = (int)v;
      break;
    case 'C':
      if (parse_int(optarg, 0, 1, &v)) return usage_error(tool, "invalid -C/--report_cputime: '%s' (0 or 1)", optarg);
      a->report_cputime = (int)v;
      break;
    case 'R':
      if (parse_int(optarg, 0, 1, &v)) return usage_error(tool, "invalid -R/--local_register: '%s' (0 or 1)", optarg);
      a->local_register = (int)v;
      break;
    case 'P':
      if (strcmp(optarg, "both") == 0) a->placement = PERF_PLACE_BOTH;
      else if (strcmp(optarg, "out") == 0) a->placement = PERF_PLACE_OUT;
      else if (strcmp(optarg, "in") == 0) a->placement = PERF_PLACE_IN;
      else return usage_error(tool, "invalid -P/--placement: '%s' (out, in or both)", optarg);
      break;
    case 'z': case 'y': case 'p':
      if (parse_int(optarg, 0, 1, &v)) return usage_error(tool, "invalid value '%s' (0 or 1)", optarg);
      break;
    case 't': case 'g':
      if (parse_int(optarg, 1, 1, &v))
        return usage_error(tool, "'%s': one rank per process only (-t 1 -g 1); start more ranks with collie-run -n N", optarg);
      break;
    case 'G':
      if (parse_int(optarg, 0, 0, &v)) return usage_error(tool, "'%s': CUDA graphs (-G) are not supported with host buffers", optarg);
      break;
    case ':': {
      char opt[3] = {'-', (char)optopt, 0};
      return usage_error(tool, "option %s needs a value", optopt ? opt : argv[optind - 1]);
    }
    default: {
      char opt[3] = {'-', (char)optopt, 0};
      return usage_error(tool, "unknown option %s", optopt ? opt : argv[optind - 1]);
    }
    }
  }
  for (int i = optind; i < argc; i++) {
    if (a->coll != PERF_NCOLLS) return usage_error(tool, "unexpected argument '%s'", argv[i]);
    int c = coll_from_name(argv[i]);
    if (c < 0) return usage_error(tool, "unknown operation '%s'", argv[i]);
    a->coll = (enum perf_coll)c;
  }
  if (a->coll == PERF_NCOLLS) return usage_error(tool, "%s", "no operation given (e.g. all_reduce)");
  if (a->minbytes > a->maxbytes) return usage_error(tool, "%s", "-b/--minbytes is larger than -e/--maxbytes");
  /* nccl-tests: a factor above 1 wins, else the additive step. collie's
   * default factor is 2, unless -i alone asks for an additive step. */
  if (have_step && !have_factor) a->stepfactor = 1;
  if (a->stepfactor <= 1 && a->stepbytes == 0 && a->minbytes < a->maxbytes)
    return usage_error(tool, "%s", "the step is 0: give -f N (N > 1) or -i SIZE (SIZE > 0)");
  return PERF_PARSE_OK;
}

/* ------------------------------------------------------------ element values */

/* A minifloat format: half, bfloat16 and the two fp8 formats. `ieee`: the
 * top exponent means inf/NaN; otherwise (e4m3) only all-ones is NaN. */
struct minifloat {
  int ebits, mbits, bias;
  bool ieee;
};
static const struct minifloat mf_half = {5, 10, 15, true};
static const struct minifloat mf_bf16 = {8, 7, 127, true};
static const struct minifloat mf_e4m3 = {4, 3, 7, false};
static const struct minifloat mf_e5m2 = {5, 2, 15, true};

/* Rounds to nearest even; out-of-range values become inf (ieee) or the
 * largest finite value (e4m3). */
static uint32_t mf_encode(double x, const struct minifloat* f) {
  uint32_t sign = signbit(x) ? 1u << (f->ebits + f->mbits) : 0;
  uint32_t eall = (1u << f->ebits) - 1, mall = (1u << f->mbits) - 1;
  if (isnan(x)) return sign | eall << f->mbits | mall;
  uint32_t emax_field = f->ieee ? eall - 1 : eall;
  uint32_t mmax_top = f->ieee ? mall : mall - 1; /* mantissa limit in the top binade */
  uint32_t inf_or_max = f->ieee ? (eall << f->mbits) : (emax_field << f->mbits | mmax_top);
  double a = fabs(x);
  if (a == 0) return sign;
  if (isinf(a)) return sign | inf_or_max;
  int e;
  frexp(a, &e);
  int E = e - 1, emin = 1 - f->bias;
  if (E < emin) E = emin;
  double q = rint(ldexp(a, f->mbits - E));
  if (q >= ldexp(1.0, f->mbits + 1)) {
    q /= 2;
    E++;
  }
  uint64_t qi = (uint64_t)q;
  uint32_t field, mant;
  if (qi < (1u << f->mbits)) {
    field = 0;
    mant = (uint32_t)qi;
  } else {
    if (E + f->bias > (int)emax_field) return sign | inf_or_max;
    field = (uint32_t)(E + f->bias);
    mant = (uint32_t)(qi - (1u << f->mbits));
    if (field == emax_field && mant > mmax_top) return sign | inf_or_max;
  }
  return sign | field << f->mbits | mant;
}

static double mf_decode(uint32_t bits, const struct minifloat* f) {
  uint32_t eall = (1u << f->ebits) - 1, mall = (1u << f->mbits) - 1;
  bool neg = (bits >> (f->ebits + f->mbits)) & 1;
  uint32_t field = (bits >> f->mbits) & eall, mant = bits & mall;
  double v;
  if (f->ieee && field == eall)
    v = mant ? NAN : INFINITY;
  else if (!f->ieee && field == eall && mant == mall)
    v = NAN;
  else if (field == 0)
    v = ldexp((double)mant, 1 - f->bias - f->mbits);
  else
    v = ldexp((double)(mant | (1u << f->mbits)), (int)field - f->bias - f->mbits);
  return neg ? -v : v;
}

void perf_store(int type, void* buf, size_t i, double v) {
  switch (type) {
  case PERF_INT8: ((int8_t*)buf)[i] = (int8_t)(int64_t)v; break;
  case PERF_UINT8: ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v; break;
  case PERF_INT32: ((int32_t*)buf)[i] = (int32_t)(int64_t)v; break;
  case PERF_UINT32: ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v; break;
  case PERF_INT64: ((int64_t*)buf)[i] = (int64_t)v; break;
  case PERF_UINT64: ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v; break;
  case PERF_FLOAT16: ((uint16_t*)buf)[i] = (uint16_t)mf_encode(v, &mf_half); break;
  case PERF_FLOAT32: ((float*)buf)[i] = (float)v; break;
  case PERF_FLOAT64: ((double*)buf)[i] = v; break;
  case PERF_BFLOAT16: ((uint16_t*)buf)[i] = (uint16_t)mf_encode(v, &mf_bf16); break;
  case PERF_F8E4M3: ((uint8_t*)buf)[i] = (uint8_t)mf_encode(v, &mf_e4m3); break;
  case PERF_F8E5M2: ((uint8_t*)buf)[i] = (uint8_t)mf_encode(v, &mf_e5m2); break;
  }
}

double perf_load(int type, const void* buf, size_t i) {
  switch (type) {
  case PERF_INT8: return ((const int8_t*)buf)[i];
  case PERF_UINT8: return ((const uint8_t*)buf)[i];
  case PERF_INT32: return ((const int32_t*)buf)[i];
  case PERF_UINT32: return ((const uint32_t*)buf)[i];
  case PERF_INT64: return (double)((const int64_t*)buf)[i];
  case PERF_UINT64: return (double)((const uint64_t*)buf)[i];
  case PERF_FLOAT16: return mf_decode(((const uint16_t*)buf)[i], &mf_half);
  case PERF_FLOAT32: return ((const float*)buf)[i];
  case PERF_FLOAT64: return ((const double*)buf)[i];
  case PERF_BFLOAT16: return mf_decode(((const uint16_t*)buf)[i], &mf_bf16);
  case PERF_F8E4M3: return mf_decode(((const uint8_t*)buf)[i], &mf_e4m3);
  case PERF_F8E5M2: return mf_decode(((const uint8_t*)buf)[i], &mf_e5m2);
  }
  return NAN;
}

static bool type_unsigned(int t) {
  return t == PERF_UINT8 || t == PERF_UINT32 || t == PERF_UINT64;
}
static bool type_float(int t) { return t >= PERF_FLOAT16 && t <= PERF_F8E5M2; }

/* Relative tolerance of avg results (a division, so rounding is allowed). */
static double avg_tolerance(int t) {
  switch (t) {
  case PERF_FLOAT16: return 1.0 / 512;
  case PERF_FLOAT32: return 1e-6;
  case PERF_FLOAT64: return 1e-12;
  case PERF_BFLOAT16: return 1.0 / 64;
  case PERF_F8E4M3: return 1.0 / 8;
  case PERF_F8E5M2: return 1.0 / 4;
  }
  return 0;
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

#define OP_COPY (-1) /* pattern for the collectives that only move data */

/*
 * Element idx of rank `rank`'s input: small integers, so that every order of
 * reduction gives the same exact result in every type, fp8 included.
 * For one idx, the sum pattern cycles -1, 0, 1 over consecutive ranks, so no
 * partial sum of up to 24 ranks leaves the integers e5m2 holds exactly (|x| <= 8);
 * prod multiplies at most one 2 per 8 ranks; min/max stay within -2..2;
 * copies use -4..4. Unsigned types use the non-negative shifts of the same.
 * `seed` changes every checked run, so a stale result does not pass.
 */
static double pattern(int type, int op, int rank, size_t idx, uint32_t seed) {
  uint64_t h = mix64((uint64_t)idx ^ ((uint64_t)seed << 40)) >> 8;
  bool sg = !type_unsigned(type);
  switch (op) {
  case PERF_SUM:
  case PERF_AVG: return (double)((h + (uint64_t)rank) % 3) - (sg ? 1 : 0);
  case PERF_PROD: {
    uint64_t k = (h + (uint64_t)rank) % 8;
    return k == 0 ? 2 : (k == 3 && sg) ? -1 : 1;
  }
  case PERF_MIN:
  case PERF_MAX: return (double)((h + 3 * (uint64_t)rank) % 5) - (sg ? 2 : 0);
  default: return (double)((h + 5 * (uint64_t)rank) % 9) - (sg ? 4 : 0);
  }
}

/* The exact result of reducing element idx over all ranks. */
static double reduced(int type, int op, int nranks, size_t idx, uint32_t seed) {
  double acc = pattern(type, op, 0, idx, seed);
  for (int r = 1; r < nranks; r++) {
    double v = pattern(type, op, r, idx, seed);
    switch (op) {
    case PERF_SUM: case PERF_AVG: acc += v; break;
    case PERF_PROD: acc *= v; break;
    case PERF_MAX: acc = v > acc ? v : acc; break;
    case PERF_MIN: acc = v < acc ? v : acc; break;
    }
  }
  return op == PERF_AVG ? acc / nranks : acc;
}

static bool value_ok(int type, int op, double got, double want) {
  if (op == PERF_AVG) {
    if (!type_float(type)) return fabs(got - want) < 1.0; /* truncated or rounded */
    double scale = fabs(want) > 1 ? fabs(want) : 1;
    return fabs(got - want) <= avg_tolerance(type) * scale;
  }
  /* Round-trip the exact value through the type: wraps integers as the
   * library's arithmetic does. */
  unsigned char tmp[8];
  perf_store(type, tmp, 0, want);
  return got == perf_load(type, tmp, 0);
}

/* ------------------------------------------------------------ layouts */

/* nccl-tests' definitions: for a size of S bytes, count = S / sizeof(type);
 * what each rank sends and receives, the count argument of the call, where
 * the in-place buffers sit (offset * rank, in elements) and the bus
 * bandwidth factor. */
struct layout {
  size_t param;       /* count argument of the call */
  size_t send, recv;  /* elements in each rank's send / receive buffer */
  size_t send_inplace, recv_inplace;
  double bus_factor;
};

static void layout_for(enum perf_coll c, size_t count, int n, struct layout* l) {
  size_t per = count / (size_t)n;
  double ring = n > 1 ? (double)(n - 1) / n : 0;
  memset(l, 0, sizeof(*l));
  switch (c) {
  case PERF_ALL_REDUCE:
    l->param = l->send = l->recv = count;
    l->bus_factor = 2 * ring;
    break;
  case PERF_BROADCAST: case PERF_REDUCE: case PERF_SENDRECV:
    l->param = l->send = l->recv = count;
    l->bus_factor = 1;
    break;
  case PERF_ALL_GATHER: case PERF_GATHER:
    l->param = l->send = per;
    l->recv = per * (size_t)n;
    l->send_inplace = per;
    l->bus_factor = ring;
    break;
  case PERF_REDUCE_SCATTER: case PERF_SCATTER:
    l->param = l->recv = per;
    l->send = per * (size_t)n;
    l->recv_inplace = per;
    l->bus_factor = ring;
    break;
  case PERF_ALLTOALL:
    l->param = per;
    l->send = l->recv = per * (size_t)n;
    l->bus_factor = ring;
    break;
  case PERF_NCOLLS: break;
  }
}

/* ------------------------------------------------------------ the run */

struct run_state {
  const struct perf_args* a;
  const struct perf_backend* b;
  char* sendbuf;
  char* recvbuf;
  size_t bufbytes;
  uint32_t seed;
  int errors;        /* results with wrong elements */
  double bw_sum;
  int bw_count;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const struct perf_backend* b, const char* what) {
  fprintf(stderr, "%s: rank %d: %s failed: %s\n", b->tool, b->rank, what,
          b->last_error ? b->last_error(b->ctx) : "(no message)");
  return PERF_EXIT_FAILED;
}

/* NCCL's buffers for one call: out-of-place, the two buffers; in place, both
 * inside the receive buffer at the offsets of the layout. */
static void buffers_for(struct run_state* s, const struct layout* l, size_t ts, int in_place, char** send,
                        char** recv) {
  int rank = s->b->rank;
  if (!in_place) {
    *send = s->sendbuf;
    *recv = s->recvbuf;
  } else {
    *send = s->recvbuf + l->send_inplace * (size_t)rank * ts;
    *recv = s->recvbuf + l->recv_inplace * (size_t)rank * ts;
  }
}

/* Fills the inputs, runs the collective once and counts the wrong elements
 * on this rank. Returns -1 when the call failed. */
static int64_t check_once(struct run_state* s, const struct layout* l, int type, int op, int root, int in_place) {
  const struct perf_backend* b = s->b;
  enum perf_coll c = s->a->coll;
  size_t ts = perf_type_size(type);
  int me = b->rank, n = b->nranks;
  char *send, *recv;
  buffers_for(s, l, ts, in_place, &send, &recv);
  uint32_t seed = ++s->seed;
  int pop = coll_reduces(c) ? op : OP_COPY;

  /* 0x7f bytes never equal an expected value: NaN or huge in the float
   * types, 127 or more in the integer ones. */
  size_t extent = (l->send > l->recv ? l->send : l->recv) * ts;
  memset(s->recvbuf, 0x7f, extent);
  if (!in_place) memset(s->sendbuf, 0x7f, l->send * ts);
  bool feeds = !(c == PERF_BROADCAST || c == PERF_SCATTER) || me == root;
  if (feeds)
    for (size_t i = 0; i < l->send; i++) perf_store(type, send, i, pattern(type, pop, me, i, seed));

  if (b->run(b->ctx, c, send, recv, l->param, type, op, root, in_place)) return -1;

  /* Which elements of which buffer hold this rank's result. */
  const char* out = recv;
  if (in_place && c == PERF_REDUCE_SCATTER && (b->flags & PERF_RS_INPLACE_AT_START)) out = s->recvbuf;
  if ((c == PERF_REDUCE || c == PERF_GATHER) && me != root) return 0;
  if (c == PERF_BROADCAST && !in_place && me == root && (b->flags & PERF_BCAST_ROOT_NO_RECV)) return 0;

  int64_t wrong = 0;
  size_t first = 0;
  double first_want = 0, first_got = 0;
  size_t per = l->param;
  for (size_t k = 0; k < l->recv; k++) {
    double want;
    switch (c) {
    case PERF_ALL_REDUCE: case PERF_REDUCE: want = reduced(type, op, n, k, seed); break;
    case PERF_REDUCE_SCATTER: want = reduced(type, op, n, (size_t)me * per + k, seed); break;
    case PERF_ALL_GATHER: case PERF_GATHER: want = pattern(type, pop, (int)(k / per), k % per, seed); break;
    case PERF_BROADCAST: want = pattern(type, pop, root, k, seed); break;
    case PERF_SCATTER: want = pattern(type, pop, root, (size_t)me * per + k, seed); break;
    case PERF_ALLTOALL: want = pattern(type, pop, (int)(k / per), (size_t)me * per + k % per, seed); break;
    case PERF_SENDRECV: want = pattern(type, pop, (me - 1 + n) % n, k, seed); break;
    default: want = NAN; break;
    }
    double got = perf_load(type, out, k);
    if (!value_ok(type, pop, got, want)) {
      if (wrong == 0) {
        first = k;
        first_want = want;
        first_got = got;
      }
      wrong++;
    }
  }
  if (wrong)
    fprintf(stderr,
            "%s: rank %d: %s %s %s root %d count %zu %s: %" PRId64
            " wrong elements; first at %zu: expected %g, got %g\n",
            b->tool, me, perf_coll_name(c), perf_type_name(type), coll_reduces(c) ? perf_op_name(op) : "none",
            coll_rooted(c) ? root : -1, l->param, in_place ? "in-place" : "out-of-place", wrong, first,
            first_want, first_got);
  return wrong;
}

static void format_time(char* buf, size_t len, double us) {
  if (us >= 10000.0)
    snprintf(buf, len, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(buf, len, "%7.1f", us);
  else if (us >= 1.0)
    snprintf(buf, len, "%7.2f", us);
  else
    /* Below a microsecond two decimals are a 10-20% step (0.05 against 0.06
     * us): one more, so ratios between such times mean something. */
    snprintf(buf, len, "%7.3f", us);
}

/* One size, one placement: check, warm up, synchronise, time; prints the
 * four result columns on rank 0. */
static int bench_one(struct run_state* s, const struct layout* l, int type, int op, int root, int in_place) {
  const struct perf_args* a = s->a;
  const struct perf_backend* b = s->b;
  enum perf_coll c = a->coll;
  size_t ts = perf_type_size(type);
  char *send, *recv;
  buffers_for(s, l, ts, in_place, &send, &recv);

  int other = a->placement == (in_place ? PERF_PLACE_OUT : PERF_PLACE_IN); /* -P left this placement out */
  if ((in_place && c == PERF_ALLTOALL && (b->flags & PERF_NO_INPLACE_ALLTOALL)) || other) {
    if (b->rank == 0) printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
    return 0;
  }

  /* nccl-tests reports no error count for in-place alltoall and sendrecv
   * (their result is not defined); nor does it when checking is off. */
  bool report = a->check > 0 && !(in_place && (c == PERF_ALLTOALL || c == PERF_SENDRECV));
  int64_t wrong = 0;
  if (report) {
    for (int k = 0; k < a->check; k++) {
      int64_t w = check_once(s, l, type, op, root, in_place);
      if (w < 0) return fail(b, perf_coll_name(c));
      if (b->allreduce_i64_sum(b->ctx, &w)) return fail(b, "allreduce of the error count");
      wrong = w;
      if (wrong) break;
    }
  }

  /* The warm-up's second half (the first touches pages and fills caches)
   * gives the time of one call for -M. */
  int warmup = a->warmup > 0 || a->min_ms <= 0 ? a->warmup : 1;
  double tw = 0;
  for (int k = 0; k < warmup; k++) {
    if (k == warmup / 2) tw = now_s();
    if (b->run(b->ctx, c, send, recv, l->param, type, op, root, in_place)) return fail(b, perf_coll_name(c));
  }
  int iters = a->iters;
  if (a->min_ms > 0) {
    /* Every rank must make the same number of calls: the slowest's estimate. */
    double per = (now_s() - tw) / (warmup - warmup / 2);
    if (b->allreduce_f64(b->ctx, &per, PERF_MAX)) return fail(b, "allreduce of the warm-up time");
    double want = a->min_ms * 1e-3 / (per * a->agg > 1e-9 ? per * a->agg : 1e-9);
    if (want > iters) iters = want < 1e7 ? (int)want + 1 : 10000000;
  }
  if (b->barrier(b->ctx)) return fail(b, "barrier");

  double t0 = now_s();
  for (int it = 0; it < iters; it++) {
    if (a->agg > 1 && b->group_start(b->ctx)) return fail(b, "group start");
    for (int k = 0; k < a->agg; k++)
      if (b->run(b->ctx, c, send, recv, l->param, type, op, root, in_place)) return fail(b, perf_coll_name(c));
    if (a->agg > 1 && b->group_end(b->ctx)) return fail(b, "group end");
  }
  double sec = (now_s() - t0) / ((double)iters * a->agg);

  int mode = a->average == 2 ? PERF_MIN : a->average == 3 ? PERF_MAX : PERF_SUM;
  if (a->average == 0 && b->rank != 0) sec = 0;
  if (b->allreduce_f64(b->ctx, &sec, mode)) return fail(b, "allreduce of the time");
  if (a->average == 1) sec /= b->nranks;

  size_t bytes = (l->send > l->recv ? l->send : l->recv) * ts;
  double algbw = sec > 0 ? (double)bytes / 1e9 / sec : 0;
  double busbw = algbw * l->bus_factor;
  s->bw_sum += busbw;
  s->bw_count++;
  if (wrong) s->errors++;
  if (b->rank == 0) {
    char tbuf[32], wbuf[32];
    format_time(tbuf, sizeof(tbuf), sec * 1e6);
    if (report)
      snprintf(wbuf, sizeof(wbuf), "%5" PRId64, wrong);
    else
      snprintf(wbuf, sizeof(wbuf), "%5s", "N/A");
    printf("  %7s  %6.2f  %6.2f  %5s", tbuf, algbw, busbw, wbuf);
  }
  return 0;
}

static int sweep(struct run_state* s, int type, int op, int root) {
  const struct perf_args* a = s->a;
  const struct perf_backend* b = s->b;
  size_t ts = perf_type_size(type);
  for (size_t size = a->minbytes; size <= a->maxbytes;) {
    struct layout l;
    layout_for(a->coll, size / ts, b->nranks, &l);
    if (b->rank == 0)
      printf("%12zu  %12zu  %8s  %6s  %6d", (l.send > l.recv ? l.send : l.recv) * ts, l.param, perf_type_name(type),
             coll_reduces(a->coll) ? perf_op_name(op) : "none", coll_rooted(a->coll) ? root : -1);
    for (int in_place = 0; in_place < 2; in_place++) {
      int rc = bench_one(s, &l, type, op, root, in_place);
      if (rc) {
        if (b->rank == 0) printf("\n");
        return rc;
      }
    }
    if (b->rank == 0) printf("\n");
    if (a->stepfactor > 1) {
      if (size > SIZE_MAX / (size_t)a->stepfactor) break;
      size = size ? size * (size_t)a->stepfactor : 1;
    } else {
      /* A step of 0 (allowed when -b equals -e) measures that one size once. */
      if (a->stepbytes == 0 || size > SIZE_MAX - a->stepbytes) break;
      size += a->stepbytes;
    }
  }
  return 0;
}

static char timeout_msg[128];

static void on_timeout(int sig) {
  (void)sig;
  ssize_t r = write(2, timeout_msg, strlen(timeout_msg));
  (void)r;
  _exit(124);
}

void perf_format_rank_line(char* buf, int rank, int pid, const char* host, const char* what) {
  snprintf(buf, PERF_LINE_LEN, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s", rank, 0, pid, host,
           -1, 0, what);
}

static void print_header(const struct run_state* s, const char* lines) {
  const struct perf_args* a = s->a;
  const struct perf_backend* b = s->b;
  printf("# %s %s: %d rank%s; %s\n", b->tool, perf_coll_name(a->coll), b->nranks, b->nranks == 1 ? "" : "s",
         b->banner);
  printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d agg iters: %d "
         "validation: %d graph: 0\n",
         a->minbytes, a->maxbytes, a->stepfactor > 1 ? (size_t)a->stepfactor : a->stepbytes,
         a->stepfactor > 1 ? "factor" : "bytes", a->warmup, a->iters, a->agg, a->check);
  if (a->min_ms > 0) printf("# min time per size: %d ms (more calls than iters where one call is short)\n", a->min_ms);
  printf("#\n# Using devices\n");
  for (int r = 0; r < b->nranks; r++) printf("%s\n", lines + (size_t)r * PERF_LINE_LEN);
  printf("#\n");
  const char* t = a->report_cputime ? "cputime" : "time";
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "",
         "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type", "redop",
         "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

int perf_main(const struct perf_args* a, const struct perf_backend* b) {
  struct run_state s;
  memset(&s, 0, sizeof(s));
  s.a = a;
  s.b = b;
  setvbuf(stdout, NULL, _IOLBF, 0);

  /* The same checks on every rank, so all of them stop together. */
  if (a->type != PERF_ALL && !(b->types & (1u << a->type))) {
    if (b->rank == 0) fprintf(stderr, "%s: datatype %s is not supported\n", b->tool, perf_type_name(a->type));
    return PERF_EXIT_USAGE;
  }
  if (coll_reduces(a->coll) && a->op != PERF_ALL && !(b->ops & (1u << a->op))) {
    if (b->rank == 0) fprintf(stderr, "%s: op %s is not supported\n", b->tool, perf_op_name(a->op));
    return PERF_EXIT_USAGE;
  }
  if (coll_rooted(a->coll) && a->root != PERF_ALL && a->root >= b->nranks) {
    if (b->rank == 0) fprintf(stderr, "%s: root %d is not a rank (there are %d)\n", b->tool, a->root, b->nranks);
    return PERF_EXIT_USAGE;
  }
  if (a->agg > 1 && (!b->group_start || !b->group_end)) {
    if (b->rank == 0) fprintf(stderr, "%s: -m (aggregated calls) is not supported\n", b->tool);
    return PERF_EXIT_USAGE;
  }
  if (a->local_register && (!b->mem_alloc || !b->mem_free)) {
    if (b->rank == 0) fprintf(stderr, "%s: -R 1 (the library's allocator) is not supported\n", b->tool);
    return PERF_EXIT_USAGE;
  }
  if (a->timeout_s > 0) {
    snprintf(timeout_msg, sizeof(timeout_msg), "%s: rank %d: -T %d: time is up; stopping\n", b->tool, b->rank,
             a->timeout_s);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_timeout;
    sigaction(SIGALRM, &sa, NULL);
    alarm((unsigned)a->timeout_s);
  }

  /* Every size uses the start of buffers of the largest size; touched once
   * here so that page faults stay out of the timings. */
  s.bufbytes = ((a->maxbytes > 0 ? a->maxbytes : 1) + 63) / 64 * 64;
  int64_t bad = 0;
  int alloc_failed;
  if (a->local_register) {
    alloc_failed = b->mem_alloc(b->ctx, (void**)&s.sendbuf, s.bufbytes) != 0;
    if (!alloc_failed) alloc_failed = b->mem_alloc(b->ctx, (void**)&s.recvbuf, s.bufbytes) != 0;
    if (alloc_failed) fprintf(stderr, "%s: rank %d: %s\n", b->tool, b->rank, b->last_error(b->ctx));
  } else {
    alloc_failed = posix_memalign((void**)&s.sendbuf, 64, s.bufbytes) || posix_memalign((void**)&s.recvbuf, 64, s.bufbytes);
  }
  if (alloc_failed) {
    fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes\n", b->tool, b->rank, s.bufbytes);
    bad = 1;
  } else {
    memset(s.sendbuf, 0, s.bufbytes);
    memset(s.recvbuf, 0, s.bufbytes);
  }
  int rc = 0;
  if (b->allreduce_i64_sum(b->ctx, &bad)) {
    rc = fail(b, "the first allreduce (start-up)");
    goto out;
  }
  if (bad) {
    rc = PERF_EXIT_FAILED;
    goto out;
  }

  char mine[PERF_LINE_LEN], host[64];
  if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "?");
  host[sizeof(host) - 1] = '\0';
  perf_format_rank_line(mine, b->rank, (int)getpid(), host,
                        a->local_register ? "host memory from the library's allocator" : "host memory");
  char* lines = calloc((size_t)b->nranks, PERF_LINE_LEN);
  if (!lines) {
    fprintf(stderr, "%s: out of memory\n", b->tool);
    rc = PERF_EXIT_FAILED;
    goto out;
  }
  if (b->rank_lines(b->ctx, mine, lines)) {
    free(lines);
    rc = fail(b, "gathering rank descriptions");
    goto out;
  }
  if (b->rank == 0) print_header(&s, lines);
  free(lines);

  int t0 = a->type == PERF_ALL ? 0 : a->type, t1 = a->type == PERF_ALL ? PERF_NTYPES - 1 : a->type;
  bool reduces = coll_reduces(a->coll), rooted = coll_rooted(a->coll);
  int o0 = !reduces ? PERF_SUM : a->op == PERF_ALL ? 0 : a->op;
  int o1 = !reduces ? PERF_SUM : a->op == PERF_ALL ? PERF_NOPS - 1 : a->op;
  int r0 = !rooted ? 0 : a->root == PERF_ALL ? 0 : a->root;
  int r1 = !rooted ? 0 : a->root == PERF_ALL ? b->nranks - 1 : a->root;
  for (int t = t0; t <= t1 && rc == 0; t++) {
    if (!(b->types & (1u << t))) continue;
    for (int o = o0; o <= o1 && rc == 0; o++) {
      if (reduces && !(b->ops & (1u << o))) continue;
      for (int r = r0; r <= r1 && rc == 0; r++) rc = sweep(&s, t, o, r);
    }
  }
  if (rc == 0 && b->rank == 0) {
    printf("# Out of bounds values : %d %s\n", s.errors, s.errors ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", s.bw_count ? s.bw_sum / s.bw_count : 0.0);
    printf("#\n");
  }
  if (rc == 0 && s.errors) rc = PERF_EXIT_WRONG;
out:
  if (a->local_register) {
    if (s.sendbuf) b->mem_free(b->ctx, s.sendbuf);
    if (s.recvbuf) b->mem_free(b->ctx, s.recvbuf);
  } else {
    free(s.sendbuf);
    free(s.recvbuf);
  }
  return rc;
}
