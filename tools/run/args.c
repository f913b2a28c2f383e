/* collie-run's command line: the usage text, parse_args and the checks on each
 * option. Fills struct options (run.h) for collie_run.c's main. To add an
 * option: one OPT_* value, one long_opts row, one case in parse_option, one line
 * of usage_long, and any cross-option check in check_options. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elastic/store.h"
#include "run.h"

/* Variables the launcher owns; -x may not set them, since a rank that saw a
 * different COLLIE_SIZE than its peers would hang in the bootstrap. */
static const char* const reserved_vars[] = {
    "COLLIE_RANK",
    "COLLIE_SIZE",
    "COLLIE_LOCAL_RANK",
    "COLLIE_LOCAL_SIZE",
    "COLLIE_BOOTSTRAP_SECRET",
    "COLLIE_BOOTSTRAP_ROOT_FD",
    "COLLIE_RENDEZVOUS",
    "COLLIE_RENDEZVOUS_SECRET",
    "COLLIE_ELASTIC_SLOT",
    "COLLIE_ELASTIC_RESTARTS",
};

static void usage_short(FILE* f) {
  fprintf(f,
          "usage: collie-run -n N [--tag-output] [--timeout SECONDS] "
          "[-x VAR=VALUE]... [--] program [args...]\n"
          "       collie-run --elastic --min N --max M [-n K] [options] [--] program [args...]\n"
          "Try 'collie-run --help' for more.\n");
}

static void usage_long(void) {
  printf(
      "usage: collie-run -n N [options] [--] program [args...]\n"
      "\n"
      "Start N ranks of a program on this host and supervise them.\n"
      "\n"
      "Options:\n"
      "  -n, --np N           number of ranks (1..%d); required\n"
      "  --tag-output         prefix every line a rank writes to stdout or\n"
      "                       stderr with \"[RANK] \"\n"
      "  --timeout SECONDS    stop the job if it runs longer than this\n"
      "  -x VAR=VALUE         set VAR for every rank (may be repeated)\n"
      "  --bind-to WHAT       bind each rank to one core, one hwthread, its\n"
      "                       NUMA node, or none. Default: each rank an equal,\n"
      "                       disjoint share of the cores collie-run may use,\n"
      "                       inside one NUMA node when possible (no binding\n"
      "                       when there are more ranks than cores); none also\n"
      "                       sets COLLIE_BIND=none unless it is set already\n"
      "  --report-bindings    print each rank's CPUs on stderr\n"
      "  -h, --help           show this help and exit\n"
      "  --version            show the version and exit\n"
      "\n"
      "Elastic jobs (programs that use collie_elastic_* or collie.elastic):\n"
      "  --elastic            serve a rendezvous store and keep the job going\n"
      "                       when workers fail (see below)\n"
      "  --min N, --max M     fewest workers the job trains with, most it takes in\n"
      "                       (-n defaults to M: the workers started at first)\n"
      "  --reset-limit K      fail the job when the membership changed more than\n"
      "                       K times (default COLLIE_ELASTIC_RESET_LIMIT, or none)\n"
      "  --slot-failures F    a slot whose worker failed F times is not restarted\n"
      "                       and its workers are refused by the store (default 3;\n"
      "                       0: restart forever)\n"
      "  --rendezvous-timeout S  a rendezvous waits this long for slow workers,\n"
      "                       then goes on with those present (>= --min) or fails\n"
      "                       (default 60)\n"
      "  --heartbeat-timeout S   a worker silent this long is dead (default 10)\n"
      "  --store URL          keep the job's state in an etcd cluster,\n"
      "                       etcd://[user:password@]host:port[,host:port...][/job]\n"
      "                       (etcds:// for TLS), instead of serving a store here;\n"
      "                       workers on other machines can join it (docs/ELASTIC.md)\n"
      "\n"
      "With --elastic each worker gets COLLIE_RENDEZVOUS (the store's address),\n"
      "COLLIE_RENDEZVOUS_SECRET, COLLIE_ELASTIC_SLOT (0..N-1) and\n"
      "COLLIE_ELASTIC_RESTARTS (how often that slot was restarted); ranks come\n"
      "from the store, epoch by epoch. A worker that fails is restarted in its\n"
      "slot (a new worker that joins the running job) until the slot has failed\n"
      "--slot-failures times. Once a worker exits with 0 nothing is restarted.\n"
      "The job ends when every worker has exited: status 0 if one of them\n"
      "exited with 0 and the store did not fail the job, else 1.\n"
      "\n"
      "Each rank gets COLLIE_RANK, COLLIE_SIZE, COLLIE_LOCAL_RANK,\n"
      "COLLIE_LOCAL_SIZE, COLLIE_BOOTSTRAP_SECRET (a fresh random secret per\n"
      "job) and NCCL_COMM_ID=127.0.0.1:PORT on a free loopback port, unless\n"
      "NCCL_COMM_ID is already set, in which case it is passed on unchanged.\n"
      "Only rank 0 reads the launcher's stdin, and not when it is a terminal.\n"
      "\n"
      "If a rank exits with a non-zero status or is killed by a signal, the\n"
      "other ranks get SIGTERM, then SIGKILL after %d seconds. SIGINT, SIGTERM\n"
      "and SIGHUP sent to collie-run are forwarded to the ranks, with the same\n"
      "escalation to SIGKILL. Ranks run in process groups of their own, so\n"
      "helper processes they start are signalled too.\n"
      "\n"
      "Exit status:\n"
      "  0        every rank exited with status 0\n"
      "  1        a rank exited with a non-zero status (127 from a program\n"
      "           that could not be executed counts too), or collie-run\n"
      "           itself failed\n"
      "  2        usage error\n"
      "  124      --timeout expired\n"
      "  128+S    a rank was killed by signal S, or collie-run received\n"
      "           signal S\n"
      "The first event decides the status; what the other ranks do while\n"
      "being stopped does not change it.\n",
      MAX_RANKS, KILL_GRACE_MS / 1000);
}

__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char* fmt, ...) {
  va_list ap;
  fprintf(stderr, "collie-run: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  usage_short(stderr);
  exit(EXIT_USAGE);
}

/* Decimal only, no sign, no spaces: "-n 0x10" or "-n ' 4'" are more likely
 * mistakes than intent. */
static bool parse_count(const char* s, long lo, long hi, long* out) {
  if (!isdigit((unsigned char)s[0])) return false;
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

static bool valid_env_name(const char* s, size_t len) {
  if (len == 0 || isdigit((unsigned char)s[0])) return false;
  for (size_t i = 0; i < len; i++)
    if (!isalnum((unsigned char)s[i]) && s[i] != '_') return false;
  return true;
}

static void check_extra_env(const char* arg) {
  const char* eq = strchr(arg, '=');
  if (eq == NULL || !valid_env_name(arg, (size_t)(eq - arg))) usage_error("-x expects VAR=VALUE, got '%s'", arg);
  for (size_t i = 0; i < sizeof(reserved_vars) / sizeof(reserved_vars[0]); i++) {
    const char* r = reserved_vars[i];
    if ((size_t)(eq - arg) == strlen(r) && strncmp(arg, r, strlen(r)) == 0)
      usage_error("%s is set by collie-run and cannot be given with -x", r);
  }
}

enum {
  OPT_TAG_OUTPUT = 256,
  OPT_TIMEOUT,
  OPT_VERSION,
  OPT_ELASTIC,
  OPT_MIN,
  OPT_MAX,
  OPT_STORE,
  OPT_RESET_LIMIT,
  OPT_SLOT_FAILURES,
  OPT_RDZV_TIMEOUT,
  OPT_HB_TIMEOUT,
  OPT_BIND_TO,
  OPT_REPORT_BINDINGS,
};

/* Defaults, before the environment and the command line. */
static void set_defaults(struct options* o) {
  memset(o, 0, sizeof(*o));
  o->reset_limit = -1;
  o->slot_failures = 3;
  o->rdzv_timeout_s = 60;
  o->hb_timeout_s = 10;
  o->bind = BIND_SHARE;
  const char* rl = getenv("COLLIE_ELASTIC_RESET_LIMIT");
  long v;
  if (rl != NULL && rl[0] != '\0') {
    if (!parse_count(rl, 0, 1000000, &v))
      usage_error("COLLIE_ELASTIC_RESET_LIMIT must be a whole number, got '%s'", rl);
    o->reset_limit = (int)v;
  }
}

/* One option c with its value arg (NULL for a flag); spelled is the option as
 * the user wrote it, for messages. */
static void parse_option(int c, char* arg, const char* spelled, struct options* o) {
  long v;
  switch (c) {
    case 'n':
      if (!parse_count(arg, 1, MAX_RANKS, &v))
        usage_error("-n needs a whole number from 1 to %d, got '%s'", MAX_RANKS, arg);
      o->nranks = (int)v;
      break;
    case OPT_TAG_OUTPUT: o->tag_output = true; break;
    case OPT_TIMEOUT:
      /* A year is far beyond any test job and keeps the deadline
       * arithmetic in milliseconds well inside 64 bits. */
      if (!parse_count(arg, 1, 365L * 24 * 3600, &v))
        usage_error("--timeout needs a whole number of seconds >= 1, got '%s'", arg);
      o->timeout_s = v;
      break;
    case 'x':
      check_extra_env(arg);
      o->extra_env[o->n_extra++] = arg;
      break;
    case OPT_ELASTIC: o->elastic = true; break;
    case OPT_MIN:
    case OPT_MAX:
      if (!parse_count(arg, 1, EPROTO_MAX_WORKERS, &v))
        usage_error("--%s needs a whole number from 1 to %d, got '%s'", c == OPT_MIN ? "min" : "max",
                    EPROTO_MAX_WORKERS, arg);
      *(c == OPT_MIN ? &o->min : &o->max) = (int)v;
      break;
    case OPT_RESET_LIMIT:
      if (!parse_count(arg, 0, 1000000, &v)) usage_error("--reset-limit needs a whole number, got '%s'", arg);
      o->reset_limit = (int)v;
      break;
    case OPT_SLOT_FAILURES:
      if (!parse_count(arg, 0, 1000000, &v)) usage_error("--slot-failures needs a whole number, got '%s'", arg);
      o->slot_failures = (int)v;
      break;
    case OPT_STORE:
      if (strncmp(arg, "etcd://", 7) != 0 && strncmp(arg, "etcds://", 8) != 0)
        usage_error("--store needs an etcd://host:port[,host:port...] URL, got '%s'", arg);
      o->store_url = arg;
      break;
    case OPT_RDZV_TIMEOUT:
    case OPT_HB_TIMEOUT:
      if (!parse_count(arg, 1, 7L * 24 * 3600, &v))
        usage_error("%s needs a whole number of seconds >= 1, got '%s'", spelled, arg);
      *(c == OPT_RDZV_TIMEOUT ? &o->rdzv_timeout_s : &o->hb_timeout_s) = v;
      break;
    case OPT_BIND_TO:
      if (bind_mode_parse(arg, &o->bind) != 0 || o->bind == BIND_SHARE)
        usage_error("--bind-to needs core, hwthread, numa or none, got '%s'", arg);
      o->bind_given = true;
      break;
    case OPT_REPORT_BINDINGS: o->report_bindings = true; break;
    case 'h': usage_long(); exit(0);
    case OPT_VERSION: printf("collie-run (collie) %s\n", COLLIE_VERSION); exit(0);
    case ':': usage_error("option '%s' needs a value", spelled);
    default:
      /* optopt is 0 for an unknown long option; the short one may sit
       * inside a cluster such as -tq, so name just the letter. */
      if (optopt != 0) usage_error("unknown option '-%c'", optopt);
      usage_error("unknown option '%s'", spelled);
  }
}

/* Checks that involve more than one option, once all are known. */
static void check_options(struct options* o) {
  if (o->elastic) {
    if (o->min == 0 || o->max == 0) usage_error("--elastic needs --min N and --max M");
    if (o->min > o->max) usage_error("--min (%d) is larger than --max (%d)", o->min, o->max);
    if (o->nranks == 0) o->nranks = o->max;
    if (o->nranks < o->min || o->nranks > o->max)
      usage_error("-n %d must lie between --min %d and --max %d", o->nranks, o->min, o->max);
  } else if (o->min || o->max || o->store_url) {
    usage_error("--min, --max and --store need --elastic");
  }
  if (o->nranks == 0) usage_error("-n N is required");
}

void parse_args(int argc, char** argv, struct options* o) {
  static const struct option long_opts[] = {
      {"np", required_argument, NULL, 'n'},
      {"tag-output", no_argument, NULL, OPT_TAG_OUTPUT},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, OPT_VERSION},
      {"elastic", no_argument, NULL, OPT_ELASTIC},
      {"min", required_argument, NULL, OPT_MIN},
      {"max", required_argument, NULL, OPT_MAX},
      {"reset-limit", required_argument, NULL, OPT_RESET_LIMIT},
      {"slot-failures", required_argument, NULL, OPT_SLOT_FAILURES},
      {"rendezvous-timeout", required_argument, NULL, OPT_RDZV_TIMEOUT},
      {"heartbeat-timeout", required_argument, NULL, OPT_HB_TIMEOUT},
      {"store", required_argument, NULL, OPT_STORE},
      {"bind-to", required_argument, NULL, OPT_BIND_TO},
      {"report-bindings", no_argument, NULL, OPT_REPORT_BINDINGS},
      {NULL, 0, NULL, 0},
  };

  set_defaults(o);
  o->extra_env = calloc((size_t)argc, sizeof(char*));
  if (o->extra_env == NULL) {
    fprintf(stderr, "collie-run: out of memory\n");
    exit(EXIT_FAILED);
  }
  opterr = 0;
  /* '+': stop at the program name, so its own options stay its own. */
  for (;;) {
    int c = getopt_long(argc, argv, "+:n:x:h", long_opts, NULL);
    if (c == -1) break;
    parse_option(c, optarg, argv[optind - 1], o);
  }
  check_options(o);
  if (optind >= argc) usage_error("no program given");
  o->prog_argv = &argv[optind];
}
