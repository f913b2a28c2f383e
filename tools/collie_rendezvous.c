/* collie-rendezvous: the elastic rendezvous store (src/elastic/store.c) as a
 * program of its own, for elastic jobs whose workers another launcher starts
 * (mpirun, Slurm, a script, several hosts). It prints the two variables the
 * workers need and serves until the job is over or it is told to stop. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "elastic/store.h"
#include "param.h"

#ifndef COLLIE_VERSION
#define COLLIE_VERSION "0.1.0"
#endif

static void usage(FILE* f) {
  fprintf(f,
          "usage: collie-rendezvous --min N --max M [options]\n"
          "\n"
          "Serve the rendezvous store of an elastic collie job. Prints\n"
          "  COLLIE_RENDEZVOUS=ADDR:PORT\n"
          "  COLLIE_RENDEZVOUS_SECRET=HEX\n"
          "on stdout; give both to every worker (collie_elastic_init, collie.elastic).\n"
          "\n"
          "Options:\n"
          "  --min N, --max M      fewest workers to train with, most to take in\n"
          "  --port P              port to listen on (default: any free port)\n"
          "  --bind ADDR           address to listen on (default: the interface that\n"
          "                        NCCL_SOCKET_IFNAME selects, else the first up one)\n"
          "  --secret HEX          32 hex digits (default: COLLIE_RENDEZVOUS_SECRET, else random)\n"
          "  --expect K            the first epoch forms as soon as K workers are there\n"
          "  --settle-ms MS        otherwise it waits until no worker registered for MS\n"
          "                        (default 1000)\n"
          "  --reset-limit K       fail the job after more than K membership changes\n"
          "                        (default COLLIE_ELASTIC_RESET_LIMIT, else none)\n"
          "  --slot-failures F     refuse workers of a slot (COLLIE_ELASTIC_SLOT, else\n"
          "                        the host name) that failed F times (default 3; 0: never)\n"
          "  --rendezvous-timeout S  wait this long for slow workers (default 60)\n"
          "  --heartbeat-timeout S   a worker silent this long is dead (default 10)\n"
          "  --quiet               do not log membership events on stderr\n"
          "\n"
          "Exits 0 once workers have registered and every one of them has gone (left\n"
          "or died) without the job failing; 1 when the job failed (reset limit,\n"
          "too few workers); 128+S on signal S.\n");
}

__attribute__((format(printf, 1, 2), noreturn)) static void die_usage(const char* fmt, ...) {
  va_list ap;
  fprintf(stderr, "collie-rendezvous: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  usage(stderr);
  exit(2);
}

static long num(const char* s, const char* what, long lo, long hi) {
  char* end;
  errno = 0;
  if (!isdigit((unsigned char)s[0])) die_usage("%s needs a whole number, got '%s'", what, s);
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) die_usage("%s must lie in %ld..%ld, got '%s'", what, lo, hi, s);
  return v;
}

int main(int argc, char** argv) {
  enum { O_MIN = 256, O_MAX, O_PORT, O_BIND, O_SECRET, O_EXPECT, O_SETTLE, O_RESET, O_SLOTF, O_RDZV, O_HB, O_QUIET, O_VERSION };
  static const struct option opts[] = {
      {"min", required_argument, NULL, O_MIN},       {"max", required_argument, NULL, O_MAX},
      {"port", required_argument, NULL, O_PORT},     {"bind", required_argument, NULL, O_BIND},
      {"secret", required_argument, NULL, O_SECRET}, {"expect", required_argument, NULL, O_EXPECT},
      {"settle-ms", required_argument, NULL, O_SETTLE}, {"reset-limit", required_argument, NULL, O_RESET},
      {"slot-failures", required_argument, NULL, O_SLOTF}, {"rendezvous-timeout", required_argument, NULL, O_RDZV},
      {"heartbeat-timeout", required_argument, NULL, O_HB}, {"quiet", no_argument, NULL, O_QUIET},
      {"help", no_argument, NULL, 'h'},              {"version", no_argument, NULL, O_VERSION},
      {NULL, 0, NULL, 0}};
  struct store_opts so;
  memset(&so, 0, sizeof(so));
  so.reset_limit = -1;
  so.slot_fail_limit = 3;
  so.settle_ms = 1000;
  so.rdzv_timeout_ms = 60000;
  so.hb_timeout_ms = 10000;
  so.handshake_ms = 5000;
  so.log_prefix = "collie-rendezvous";
  long port = 0;
  const char* bind_addr = NULL;
  const char* secret = param_str(P_COLLIE_RENDEZVOUS_SECRET);
  const char* rl = param_str(P_COLLIE_ELASTIC_RESET_LIMIT);
  if (rl && *rl) so.reset_limit = (int)num(rl, "COLLIE_ELASTIC_RESET_LIMIT", 0, 1000000);
  opterr = 0;
  for (;;) {
    int c = getopt_long(argc, argv, ":h", opts, NULL);
    if (c == -1) break;
    switch (c) {
      case O_MIN: so.min = (int)num(optarg, "--min", 1, EPROTO_MAX_WORKERS); break;
      case O_MAX: so.max = (int)num(optarg, "--max", 1, EPROTO_MAX_WORKERS); break;
      case O_PORT: port = num(optarg, "--port", 0, 65535); break;
      case O_BIND: bind_addr = optarg; break;
      case O_SECRET: secret = optarg; break;
      case O_EXPECT: so.expect = (int)num(optarg, "--expect", 0, EPROTO_MAX_WORKERS); break;
      case O_SETTLE: so.settle_ms = num(optarg, "--settle-ms", 0, 3600 * 1000); break;
      case O_RESET: so.reset_limit = (int)num(optarg, "--reset-limit", 0, 1000000); break;
      case O_SLOTF: so.slot_fail_limit = (int)num(optarg, "--slot-failures", 0, 1000000); break;
      case O_RDZV: so.rdzv_timeout_ms = num(optarg, "--rendezvous-timeout", 1, 7L * 24 * 3600) * 1000; break;
      case O_HB: so.hb_timeout_ms = num(optarg, "--heartbeat-timeout", 1, 7L * 24 * 3600) * 1000; break;
      case O_QUIET: so.log_prefix = NULL; break;
      case 'h': usage(stdout); return 0;
      case O_VERSION: printf("collie-rendezvous (collie) %s\n", COLLIE_VERSION); return 0;
      case ':': die_usage("option '%s' needs a value", argv[optind - 1]);
      default: die_usage("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) die_usage("unexpected argument '%s'", argv[optind]);
  if (so.min == 0 || so.max == 0) die_usage("--min and --max are required");
  if (so.min > so.max) die_usage("--min (%d) is larger than --max (%d)", so.min, so.max);

  char hex[2 * EPROTO_SECRET_BYTES + 1];
  if (secret && *secret) {
    if (eproto_parse_secret(secret, so.secret) != 0) die_usage("the secret must be %d hex digits", 2 * EPROTO_SECRET_BYTES);
  } else if (getrandom(so.secret, sizeof(so.secret), 0) != (ssize_t)sizeof(so.secret)) {
    fprintf(stderr, "collie-rendezvous: cannot get random bytes: %s\n", strerror(errno));
    return 1;
  }
  eproto_format_secret(so.secret, hex);

  if (bind_addr) {
    char buf[300];
    snprintf(buf, sizeof(buf), strchr(bind_addr, ':') ? "[%s]:1" : "%s:1", bind_addr);
    if (sock_parse_addr(buf, "--bind", &so.bind) != ncclSuccess) {
      fprintf(stderr, "collie-rendezvous: %s\n", ncclGetLastError(NULL));
      return 2;
    }
  } else {
    char ifname[64];
    if (sock_pick_interface(NULL, &so.bind, ifname, sizeof(ifname)) != ncclSuccess) {
      fprintf(stderr, "collie-rendezvous: %s\n", ncclGetLastError(NULL));
      return 1;
    }
  }
  if (so.bind.sa.sa_family == AF_INET6)
    so.bind.sin6.sin6_port = htons((uint16_t)port);
  else
    so.bind.sin.sin_port = htons((uint16_t)port);

  /* Signals are taken synchronously below; the store thread inherits the mask. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  struct store* st;
  if (store_start(&so, &st) != ncclSuccess) {
    fprintf(stderr, "collie-rendezvous: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  union sock_addr a;
  char abuf[SOCK_ADDR_STRLEN];
  store_address(st, &a);
  printf("COLLIE_RENDEZVOUS=%s\nCOLLIE_RENDEZVOUS_SECRET=%s\n", sock_addr_str(&a, abuf, sizeof(abuf)), hex);
  fflush(stdout);

  int rc = 0;
  for (;;) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000000};
    int sig = sigtimedwait(&sigs, NULL, &ts);
    if (sig > 0) {
      fprintf(stderr, "collie-rendezvous: got signal %d (%s); stopping\n", sig, strsignal(sig));
      rc = 128 + sig;
      break;
    }
    char msg[512];
    if (store_failed(st, msg, sizeof(msg))) {
      /* Stay a moment so waiting workers can still hear why. */
      fprintf(stderr, "collie-rendezvous: the job failed: %s\n", msg);
      sleep(3);
      rc = 1;
      break;
    }
    int reg, live;
    store_counts(st, &reg, &live);
    if (reg > 0 && live == 0) {
      uint32_t epoch, resets;
      store_progress(st, &epoch, &resets);
      if (so.log_prefix) fprintf(stderr, "collie-rendezvous: every worker has gone after %u epoch(s), %u reset(s)\n", epoch, resets);
      break;
    }
  }
  store_stop(st);
  return rc;
}
