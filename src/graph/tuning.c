/* Cost model and algorithm choice: latency + bytes / bandwidth per algorithm
 * and transport. Picks, per call, the cheapest algorithm the user allows
 * (NCCL_ALGO, NCCL_PROTO) and logs the choice under NCCL_DEBUG_SUBSYS=TUNING.
 * The constants are this machine's rough figures (docs/BENCHMARKS.md); the
 * same model answers ncclGroupSimulateEnd. */
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <unistd.h>

#include "../coll/coll.h"

static const char* algo_names[ALGO_COUNT] = {"Ring", "Tree", "Direct", "Hier"};
const char* algo_name(int algo) { return algo >= 0 && algo < ALGO_COUNT ? algo_names[algo] : "?"; }

/* NCCL's list syntax: "A,B" allows only those, "^A,B" allows all but those. */
static int parse_list(const char* s, const char* const* names, int count, int* mask) {
  if (!s || !*s) return 0;
  int exclude = s[0] == '^';
  int listed = 0;
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
    if (!found) return -1;
  }
  *mask = exclude ? (~listed & ((1 << count) - 1)) : listed;
  return 0;
}

/* Number of CPUs in a list such as "0-3,8" ("..." ends a truncated list). */
int cpulist_count(const char* s) {
  int n = 0;
  while (s && *s) {
    char* end;
    long a = strtol(s, &end, 10);
    if (end == s) break;
    long b = a;
    if (*end == '-') b = strtol(end + 1, &end, 10);
    if (b >= a) n += (int)(b - a + 1);
    s = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
  return n;
}

ncclResult_t tuning_init(struct ncclComm* comm) {
  int algos = (1 << ALGO_COUNT) - 1;
  const char* s = param_str(P_NCCL_ALGO);
  if (parse_list(s, algo_names, ALGO_COUNT, &algos) != 0)
    return err_set(ncclInvalidArgument, "NCCL_ALGO=\"%s\": expected a list of Ring, Tree, Direct, Hier (optionally ^-prefixed)", s);
  static const char* protos[] = {"Simple", "LL", "LL128"};
  int pmask = 7;
  s = param_str(P_NCCL_PROTO);
  if (parse_list(s, protos, 3, &pmask) != 0)
    return err_set(ncclInvalidArgument, "NCCL_PROTO=\"%s\": expected a list of Simple, LL, LL128 (optionally ^-prefixed)", s);
  if (!(pmask & 1)) algos &= ~((1 << ALGO_RING) | (1 << ALGO_TREE) | (1 << ALGO_HIER));
  if (!(pmask & 2)) algos &= ~(1 << ALGO_DIRECT);
  comm->algo_mask = algos;
  /* Channel bounds: environment first, then the communicator's config. */
  int64_t lo = param_int(P_NCCL_MIN_CTAS, 0, 1 << 20), hi = param_int(P_NCCL_MAX_CTAS, 0, 1 << 20);
  if (!lo && comm->config.minCTAs != NCCL_CONFIG_UNDEF_INT) lo = comm->config.minCTAs;
  if (!hi && comm->config.maxCTAs != NCCL_CONFIG_UNDEF_INT) hi = comm->config.maxCTAs;
  comm->min_ch = (int)(lo < 1 ? 1 : lo > MAX_CHANNELS ? MAX_CHANNELS : lo);
  comm->max_ch = (int)(hi < 1 ? MAX_CHANNELS : hi > MAX_CHANNELS ? MAX_CHANNELS : hi);
  if (comm->max_ch < comm->min_ch) comm->max_ch = comm->min_ch;
  /* Every rank must reach the same decisions, so this uses only what all
   * ranks know alike: the most crowded host (ranks per CPU of its ranks'
   * CPU sets, from the exchanged peer info). */
  comm->oversub = 1.0;
  comm->cpus_per_rank = 1e9;
  for (int i = 0; i < comm->nranks; i++) {
    if (comm->peers[i].local_rank != 0) continue;
    int ncpu = cpulist_count(comm->peers[i].cpuset);
    double o = ncpu > 0 ? (double)comm->peers[i].local_size / ncpu : 1.0;
    if (o > comm->oversub) comm->oversub = o;
    if (1.0 / o < comm->cpus_per_rank) comm->cpus_per_rank = 1.0 / o;
  }
  INFO(LOG_TUNING | LOG_ENV, "algorithms allowed: %s%s%s%s(mask 0x%x)", algos & 1 ? "Ring " : "",
       algos & 2 ? "Tree " : "", algos & 4 ? "Direct " : "", algos & 8 ? "Hier " : "", algos);
  return ncclSuccess;
}

struct link_cost {
  double alpha_us; /* per dependent step */
  double gbps;     /* payload bandwidth of one link */
};

/* Constants fitted to collie-perf runs on the development machine (2 cores):
 * a shared-memory step costs ~0.3 us when every rank has a CPU and ~3 us at
 * 2 ranks per CPU; sockets ~10 us per step and ~2 GB/s on loopback. */
static struct link_cost cost_for(const struct ncclComm* comm) {
  int shm = comm->nhosts == 1 && !comm->shm_disable;
  struct link_cost c;
  if (shm) {
    c.alpha_us = 0.3 + (comm->oversub > 1 ? 1.5 * comm->oversub : 0);
    c.gbps = 12.0 / comm->oversub;
  } else {
    c.alpha_us = 10.0 * comm->oversub;
    c.gbps = 2.0 / comm->oversub;
  }
  return c;
}

static int log2ceil(int n) {
  int l = 0;
  while ((1 << l) < n) l++;
  return l;
}

double algo_estimate_us(const struct coll_args* a, int algo) {
  const struct ncclComm* comm = a->comm;
  int n = comm->nranks;
  double bytes = (double)a->count * (double)dtype_size(a->dt);
  struct link_cost c = cost_for(comm);
  double bw = c.gbps * 1e3; /* bytes per microsecond */
  if (n == 1) return 0.2 + bytes / (4 * bw);
  if (algo == ALGO_DIRECT && !shm_direct(a)) {
    /* One exchange; every message costs a little sender time. */
    double per = a->kind == COLL_BROADCAST || a->kind == COLL_REDUCE ? 1.0 : (double)(n - 1);
    return c.alpha_us + 0.1 * c.alpha_us * per + per * bytes / bw;
  }
  switch (a->kind) {
    case COLL_ALLREDUCE:
      if (algo == ALGO_DIRECT) return c.alpha_us + (n + 1) * bytes / (bw * 4.0 / 3.0);
      if (algo == ALGO_TREE) return 2.0 * log2ceil(n) * c.alpha_us + 2.0 * bytes / bw;
      if (algo == ALGO_HIER) {
        /* Shared-memory reduce and broadcast chains plus a ring of leaders. */
        int h = comm->nleaders, l = comm->nranks / h;
        return 2.0 * (l - 1) * 0.3 + 2.0 * bytes / 12e3 + 2.0 * (h - 1) * c.alpha_us + 2.0 * (h - 1) / h * bytes / bw;
      }
      return 2.0 * (n - 1) * c.alpha_us + 2.0 * (n - 1) / n * bytes / bw;
    case COLL_REDUCESCATTER:
      if (algo == ALGO_DIRECT) return c.alpha_us + (2.0 * n) * bytes / (bw * 4.0 / 3.0);
      return (n - 1) * c.alpha_us + (n - 1) * bytes / bw;
    case COLL_ALLGATHER:
      if (algo == ALGO_DIRECT) return c.alpha_us + (n + 1) * bytes / (bw * 4.0 / 3.0);
      return (n - 1) * c.alpha_us + (n - 1) * bytes / bw;
    case COLL_BROADCAST:
    case COLL_REDUCE:
      if (algo == ALGO_DIRECT) return c.alpha_us + (n + 1) * bytes / (bw * 4.0 / 3.0);
      return (n - 1) * c.alpha_us + bytes / bw;
    default: /* point-to-point based: one step, everything through the root or the links */
      return c.alpha_us + (n - 1) * bytes / bw;
  }
}

/* Direct means shared-memory mailboxes on one host, point-to-point otherwise. */
int shm_direct(const struct coll_args* a) { return a->comm->nhosts == 1 && !a->comm->shm_disable; }

/* Bytes a rank's mailbox must hold for the direct algorithm. */
static size_t direct_bytes(const struct coll_args* a) {
  size_t b = a->count * dtype_size(a->dt);
  return a->kind == COLL_REDUCESCATTER ? b * (size_t)a->comm->nranks : b;
}

int tuning_choose(const struct coll_args* a) {
  int cand = 1 << ALGO_RING;
  if (a->kind == COLL_ALLREDUCE) cand |= 1 << ALGO_TREE;
  if (a->kind == COLL_ALLREDUCE && a->comm->nhosts > 1 && a->comm->nleaders < a->comm->nranks) cand |= 1 << ALGO_HIER;
  if (a->kind <= COLL_REDUCESCATTER &&
      (shm_direct(a) ? direct_eligible(a, direct_bytes(a))
                     : net_direct_eligible(a, a->count * dtype_size(a->dt))))
    cand |= 1 << ALGO_DIRECT;
  int allowed = cand & a->comm->algo_mask;
  if (!allowed) allowed = 1 << ALGO_RING; /* nothing allowed fits this call: the ring always works */
  int best = -1;
  double best_t = 0;
  for (int al = 0; al < ALGO_COUNT; al++) {
    if (!(allowed & (1 << al))) continue;
    double t = algo_estimate_us(a, al);
    if (best < 0 || t < best_t) {
      best = al;
      best_t = t;
    }
  }
  TRACE(LOG_TUNING, "%s %zu x %s on %d ranks: %s (%.1f us predicted)", coll_name(a->kind), a->count,
        dtype_name(a->dt), a->comm->nranks, algo_name(best), best_t);
  return best;
}

double coll_estimate_us(const struct coll_args* a) {
  if (a->kind > COLL_REDUCESCATTER) return algo_estimate_us(a, ALGO_RING);
  return algo_estimate_us(a, tuning_choose(a));
}

int tuning_channels(const struct coll_args* a, int algo) {
  const struct ncclComm* comm = a->comm;
  if (algo != ALGO_RING || a->kind > COLL_REDUCESCATTER || comm->nranks == 1) return 1;
  /* More channels only pay when each rank has CPUs to spare and the message
   * is large enough to hide the hand-off to the helper threads. */
  double cpus_per_rank = comm->cpus_per_rank;
  size_t bytes = a->count * dtype_size(a->dt);
  int want = bytes >= ((size_t)8 << 20) && cpus_per_rank >= 2 ? (int)cpus_per_rank : 1;
  if (want < comm->min_ch) want = comm->min_ch;
  if (want > comm->max_ch) want = comm->max_ch;
  /* Every channel needs at least one element to move. */
  if ((size_t)want > a->count) want = a->count ? (int)a->count : 1;
  return want;
}
