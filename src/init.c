/* Communicator lifecycle: unique IDs, init (single and scalable roots, config
 * validation, one-process ncclCommInitAll), peer-info exchange, queries,
 * finalize / destroy / abort, last-error and async-error reporting.
 * Talks to bootstrap/ (rank rendezvous), graph/topo.c and device/device.h. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "coll/coll.h"
#include "comm.h"
#include "device/device.h"
#include "failures.h"
#include "procstat.h"
#include "graph/bind.h"
#include "graph/topo.h"

#define CONFIG_MAGIC 0xcafebeefu

COLLIE_EXPORT int collie_version(void) { return COLLIE_VERSION_CODE; }

ncclResult_t comm_check(ncclComm_t comm, const char* fn) {
  if (comm == NULL) return err_set(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (comm->magic != COMM_MAGIC)
    return err_set(ncclInvalidArgument, "%s: comm %p is not a live collie communicator (destroyed, or not from ncclCommInit*)",
                   fn, (void*)comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetVersion, int* version);
ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) return err_set(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId* uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == NULL) return err_set(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  return bootstrap_create_id(uniqueId);
}

NCCL_API(const char*, ncclGetLastError, ncclComm_t comm);
const char* ncclGetLastError(ncclComm_t comm) {
  /* A communicator in error answers with what broke it (a failed peer's rank
   * and host), whichever thread found it: with nonblocking communicators
   * that is the worker, not the caller. */
  if (comm && comm->magic == COMM_MAGIC) {
    ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    if (e != ncclSuccess && e != ncclInProgress) return comm_error_msg(comm);
  }
  const char* t = err_last_thread();
  return t[0] ? t : err_last_global();
}

/* ------------------------------------------------------------ config */

/* Validates a user config and fills `out` with defaults for unset fields.
 * Older (smaller) configs are accepted: only `size` bytes are read. */
static ncclResult_t config_resolve(const ncclConfig_t* in, ncclConfig_t* out) {
  ncclConfig_t def = NCCL_CONFIG_INITIALIZER;
  *out = def;
  if (in == NULL) {
    out->blocking = 1;
    return ncclSuccess;
  }
  if (in->magic != CONFIG_MAGIC)
    return err_set(ncclInvalidArgument,
                   "ncclCommInitRankConfig: config->magic is 0x%x, not 0x%x: initialise the config with "
                   "NCCL_CONFIG_INITIALIZER",
                   in->magic, CONFIG_MAGIC);
  if (in->size < offsetof(ncclConfig_t, blocking) + sizeof(int) || in->size > sizeof(ncclConfig_t))
    return err_set(ncclInvalidArgument,
                   "ncclCommInitRankConfig: config->size %zu is not a size this library knows (%zu max); "
                   "initialise the config with NCCL_CONFIG_INITIALIZER",
                   in->size, sizeof(ncclConfig_t));
  if (in->version < NCCL_VERSION(2, 14, 0) || in->version > NCCL_VERSION_CODE)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->version %u unsupported (2.14.0 .. %d)",
                   in->version, NCCL_VERSION_CODE);
  memcpy(out, in, in->size);
  out->size = sizeof(ncclConfig_t);
  if (out->blocking == NCCL_CONFIG_UNDEF_INT) out->blocking = 1;
  if (out->blocking != 0 && out->blocking != 1)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->blocking must be 0 or 1 (got %d)",
                   out->blocking);
  if (out->cgaClusterSize != NCCL_CONFIG_UNDEF_INT && (out->cgaClusterSize < 0 || out->cgaClusterSize > 8))
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->cgaClusterSize %d outside 0..8",
                   out->cgaClusterSize);
  if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->minCTAs < 1)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->minCTAs %d < 1", out->minCTAs);
  if (out->maxCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs < 1)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->maxCTAs %d < 1", out->maxCTAs);
  if (out->minCTAs != NCCL_CONFIG_UNDEF_INT && out->maxCTAs != NCCL_CONFIG_UNDEF_INT && out->minCTAs > out->maxCTAs)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->minCTAs %d > maxCTAs %d", out->minCTAs,
                   out->maxCTAs);
  if (out->splitShare != NCCL_CONFIG_UNDEF_INT && out->splitShare != 0 && out->splitShare != 1)
    return err_set(ncclInvalidArgument, "ncclCommInitRankConfig: config->splitShare must be 0 or 1 (got %d)",
                   out->splitShare);
  return ncclSuccess;
}

/* ------------------------------------------------------------ init */

static void fill_local_info(ncclComm_t comm, collie_peer_info_t* me) {
  memset(me, 0, sizeof(*me));
  me->size = sizeof(*me);
  me->rank = comm->rank;
  me->pid = (int)getpid();
  comm->machine[comm->rank] = topo_machine_hash();
  comm->proc_start[comm->rank] = proc_start_ticks(0);
  me->host_hash = topo_host_hash(comm->machine[comm->rank], me->hostname, sizeof(me->hostname));
  topo_local_placement(&me->numa_node, me->cpuset, sizeof(me->cpuset));
  me->cuda_dev = comm->cuda_dev;
  device_pci_bus_id(comm->cuda_dev, me->pci_bus_id, sizeof(me->pci_bus_id));
}

/* Peer info travels as a packed record (the bootstrap card), not as
 * collie_peer_info_t: the fixed fields, then each string as a length byte
 * and its characters. About 35 bytes instead of 270 per rank on one host,
 * and every rank receives every other's record. */
#define PEER_WIRE_MAX (4 + 4 + 8 + 4 + 4 + 8 + 8 + 3 + 64 + 128 + 32)

static size_t put_str(uint8_t* p, const char* str, size_t cap) {
  size_t l = strnlen(str, cap - 1);
  p[0] = (uint8_t)l;
  memcpy(p + 1, str, l);
  return 1 + l;
}

static size_t peer_pack(const collie_peer_info_t* me, uint64_t machine, uint64_t start, uint8_t* p) {
  int32_t v[2] = {me->rank, me->pid}, w[2] = {me->numa_node, me->cuda_dev};
  memcpy(p, v, 8);
  memcpy(p + 8, &me->host_hash, 8);
  memcpy(p + 16, w, 8);
  memcpy(p + 24, &machine, 8);
  memcpy(p + 32, &start, 8);
  size_t o = 40;
  o += put_str(p + o, me->hostname, sizeof(me->hostname));
  o += put_str(p + o, me->cpuset, sizeof(me->cpuset));
  o += put_str(p + o, me->pci_bus_id, sizeof(me->pci_bus_id));
  return o;
}

static int get_str(const uint8_t* p, size_t n, size_t* o, char* out, size_t cap) {
  if (*o + 1 > n || p[*o] >= cap || *o + 1 + p[*o] > n) return -1;
  size_t l = p[*o];
  memcpy(out, p + *o + 1, l);
  out[l] = '\0';
  *o += 1 + l;
  return 0;
}

/* 0, or -1 when the record is not exactly one well-formed packed record. */
static int peer_unpack(const uint8_t* p, size_t n, collie_peer_info_t* out, uint64_t* machine, uint64_t* start) {
  int32_t v[2], w[2];
  size_t o = 40;
  if (n < o) return -1;
  memset(out, 0, sizeof(*out));
  memcpy(v, p, 8);
  memcpy(&out->host_hash, p + 8, 8);
  memcpy(w, p + 16, 8);
  memcpy(machine, p + 24, 8);
  memcpy(start, p + 32, 8);
  out->size = sizeof(*out);
  out->rank = v[0];
  out->pid = v[1];
  out->numa_node = w[0];
  out->cuda_dev = w[1];
  if (get_str(p, n, &o, out->hostname, sizeof(out->hostname)) || get_str(p, n, &o, out->cpuset, sizeof(out->cpuset)) ||
      get_str(p, n, &o, out->pci_bus_id, sizeof(out->pci_bus_id)))
    return -1;
  return o == n ? 0 : -1;
}

/* bootstrap_init's card: this rank's keep-alive listener address (zero for
 * a one-rank communicator), then its packed peer info. The listener is opened
 * here, before the check-in, so that neighbours can dial it as soon as they
 * have the table: no exchange of keep-alive addresses at init. */
struct setup_card {
  ncclComm_t comm;
  int health_fd; /* the keep-alive listener until health_init takes it; -1 */
  union sock_addr health_addr;
};

static int make_card(void* arg, const union sock_addr* listen_addr, int listen_any, uint8_t* card, size_t cap) {
  struct setup_card* sc = arg;
  ncclComm_t comm = sc->comm;
  size_t a = sizeof(union sock_addr);
  _Static_assert(sizeof(union sock_addr) + PEER_WIRE_MAX <= CHECKIN_CARD_MAX, "peer info must fit a bootstrap card");
  if (cap < a + PEER_WIRE_MAX) {
    err_set(ncclInternalError, "bootstrap card of %zu bytes cannot hold the peer info", cap);
    return -1;
  }
  memset(&sc->health_addr, 0, a);
  if (comm->nranks > 1 && health_listen(listen_addr, listen_any, &sc->health_fd, &sc->health_addr) != ncclSuccess)
    return -1;
  memcpy(card, &sc->health_addr, a);
  return (int)(a + peer_pack(&comm->peers[comm->rank], comm->machine[comm->rank], comm->proc_start[comm->rank], card + a));
}

/* Every rank's peer info, from the cards that came with the bootstrap table,
 * and the predecessor's keep-alive address. */
static ncclResult_t read_cards(ncclComm_t comm, const char* fn, union sock_addr* prev_health) {
  size_t a = sizeof(union sock_addr);
  int prev = (comm->rank + comm->nranks - 1) % comm->nranks;
  for (int i = 0; i < comm->nranks; i++) {
    uint32_t len;
    const uint8_t* card = bootstrap_card(comm->bs, i, &len);
    if (!card || len < a || peer_unpack(card + a, len - a, &comm->peers[i], &comm->machine[i], &comm->proc_start[i]) != 0 || comm->peers[i].rank != i)
      return err_set(ncclInternalError, "%s: peer info from rank %d is malformed or inconsistent (%u bytes, rank field %d)",
                     fn, i, len, comm->peers[i].rank);
    if (i == prev) memcpy(prev_health, card, a);
  }
  if (comm->nranks > 1 && !sock_addr_valid(prev_health))
    return err_set(ncclInternalError, "%s: rank %d sent no keep-alive address", fn, prev);
  return ncclSuccess;
}

struct host_key {
  uint64_t hash;
  int rank;
};

static int host_key_cmp(const void* a, const void* b) {
  const struct host_key *x = a, *y = b;
  if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Local rank (position among the ranks of the same host, by rank) and local
 * size of every peer, and the number of hosts. Sorting by (host, rank) keeps
 * it O(n log n) per rank: comparing every pair cost a second at 1024 ranks
 * summed over the ranks. */
static ncclResult_t compute_locality(ncclComm_t comm) {
  int n = comm->nranks, nhosts = 0;
  struct host_key* keys = malloc(sizeof(*keys) * (size_t)n);
  if (!keys) return err_set(ncclSystemError, "out of memory computing locality for %d ranks", n);
  for (int i = 0; i < n; i++) keys[i] = (struct host_key){comm->peers[i].host_hash, i};
  qsort(keys, (size_t)n, sizeof(*keys), host_key_cmp);
  for (int g = 0; g < n;) {
    int e = g;
    while (e < n && keys[e].hash == keys[g].hash) e++;
    for (int i = g; i < e; i++) {
      comm->peers[keys[i].rank].local_rank = i - g;
      comm->peers[keys[i].rank].local_size = e - g;
    }
    nhosts++;
    g = e;
  }
  free(keys);
  comm->local_rank = comm->peers[comm->rank].local_rank;
  comm->local_size = comm->peers[comm->rank].local_size;
  comm->nhosts = nhosts;
  comm->machine_size = comm->machine_rank = 0;
  for (int i = 0; i < n; i++)
    if (comm->machine[i] == comm->machine[comm->rank]) {
      comm->machine_size++;
      if (i < comm->rank) comm->machine_rank++;
    }
  return ncclSuccess;
}

/* Releases what init built (threads first, then connections, then memory);
 * the shell (magic, peers, error record) stays. Idempotent: a nonblocking
 * init that failed releases early and ncclCommDestroy comes later. */
static void comm_release(ncclComm_t comm) {
  health_stop(comm, 1);
  channels_free(comm);
  if (comm->unpair_moves)
    INFO(LOG_TUNING, "rank %d moved itself off a CPU it shared with a peer %llu time(s) (COLLIE_UNPAIR)",
         comm->rank, (unsigned long long)comm->unpair_moves);
  comm->unpair_moves = 0;
  if (comm->spread_moves || comm->spread_refused)
    INFO(LOG_TUNING,
         "rank %d moved itself to a less crowded CPU %llu time(s), and stayed %llu time(s) because another task "
         "wanted a CPU (COLLIE_SPREAD)",
         comm->rank, (unsigned long long)comm->spread_moves, (unsigned long long)comm->spread_refused);
  comm->spread_moves = comm->spread_refused = 0;
  if (comm->bcast_left || comm->bcast_pulled)
    INFO(LOG_TUNING,
         "rank %d went on without a late reader of its streamed broadcasts %llu time(s), and finished %llu of its "
         "peers' from their buffers (left behind)",
         comm->rank, (unsigned long long)comm->bcast_left, (unsigned long long)comm->bcast_pulled);
  if (comm->allgather_pulled)
    INFO(LOG_TUNING, "rank %d ran %llu allgather(s) as single copy, as other tasks wanted a CPU", comm->rank,
         (unsigned long long)comm->allgather_pulled);
  bind_comm_release(comm);
  free(comm->reduce_tmp);
  comm->reduce_tmp = NULL;
  mapped_free(comm);
  window_free_all(comm);
  direct_free(comm);
  transport_close_all(comm);
  rings_free(comm);
  free(comm->redops);
  comm->redops = NULL;
  comm->nredops = 0;
  bootstrap_destroy(comm->bs);
  comm->bs = NULL;
}

static void comm_free(ncclComm_t comm) {
  if (!comm) return;
  async_stop(comm, 1);
  dev_comm_free(comm); /* drains the device queue: its proxy uses the connectors */
  comm_release(comm);
  free(comm->peers);
  free(comm->machine);
  free(comm->proc_start);
  free(comm->peer_cpu);
  if (comm->stop_fd >= 0) close(comm->stop_fd);
  pthread_mutex_destroy(&comm->err_lock);
  comm->magic = 0;
  free(comm);
}

static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static void print_version(void) {
  if (getenv("NCCL_DEBUG") && log_enabled(LOG_VERSION, LOG_ALL))
    log_msg(LOG_VERSION, LOG_ALL, __FILE__, __LINE__, "collie %d.%d.%d (NCCL API %d.%d.%d)", COLLIE_VERSION_MAJOR,
            COLLIE_VERSION_MINOR, COLLIE_VERSION_PATCH, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

/* Everything init does once the shell exists: rendezvous, peer info,
 * locality, rings, tuning, the keep-alive ring. */
static ncclResult_t comm_setup(ncclComm_t comm, int nids, const ncclUniqueId* ids, const char* fn) {
  int rank = comm->rank, nranks = comm->nranks;
  int64_t t0 = time_ns();
  ncclResult_t res = ncclSuccess;
  struct setup_card sc = {comm, -1, {{0}}};
  union sock_addr prev_health;
  fill_local_info(comm, &comm->peers[rank]);
  NCCLCHECKGOTO(bootstrap_init(ids, nids, rank, nranks, &comm->abort_flag, make_card, &sc, &comm->bs), res, out);
  int64_t t_bs = time_ns();
  /* Lazy connector setup waits in the bootstrap: revoke and failures end it too. */
  bootstrap_set_watch(comm->bs, comm_stop_check_cb, comm, comm->stop_fd);
  NCCLCHECKGOTO(read_cards(comm, fn, &prev_health), res, out);
  int64_t t_info = time_ns();
  for (int i = 0; i < nranks; i++) bootstrap_set_peer_host(comm->bs, i, comm->peers[i].hostname);
  NCCLCHECKGOTO(compute_locality(comm), res, out);
  bind_comm(comm); /* before any helper thread starts: they inherit the mask */
  {
    /* Waiters poll before sleeping only while every local rank can have a CPU
     * (a rank-local choice: it changes timing, never what is computed). */
    long ncpu = bind_host_cpus(comm, comm->peers[comm->rank].host_hash);
    if (ncpu <= 0) ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* The CPUs of the machine's ranks (their CPU sets as they came to init). */
    comm->machine_cpus = bind_machine_cpus(comm, comm->machine[comm->rank]);
    if (comm->machine_cpus <= 0) comm->machine_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* A host of several ranks counts the machine's ranks too (several hosts
     * on one machine: NCCL_HOSTID, containers): a rank that polls its shared
     * memory holds a CPU that a rank of another host may need (3 hosts of 2
     * ranks on 2 CPUs: allreduce of 32 KiB 5.3 ms a call polling, 0.27 ms
     * not; 16 MiB 262 ms against 40). A host of one rank has no shared
     * memory to poll, and its socket waiters do not poll where the machine
     * is crowded (sock_yield_ns), so it is left as it was. */
    int crowded = comm->local_size > ncpu || (comm->local_size > 1 && comm->machine_size > comm->machine_cpus);
    int64_t spin_us = param_str(P_COLLIE_SPIN) ? param_int(P_COLLIE_SPIN, 0, 60 * 1000 * 1000) : (crowded ? 0 : 2000);
    comm->spin_ns = 1000 * spin_us;
    /* Waiters may move this rank off a CPU it shares with a peer
     * (prim_unpair) when every rank of the machine can have a CPU of this
     * rank's own. */
    cpu_set_t mine;
    int mycpus = sched_getaffinity(0, sizeof(mine), &mine) == 0 ? CPU_COUNT(&mine) : 0;
    comm->unpair = comm->machine_size > 1 && comm->machine_size <= mycpus && comm->spin_ns > 0 &&
                   param_int(P_COLLIE_UNPAIR, 0, 1);
    /* Socket waiters of a machine with more ranks than CPUs yield instead of
     * polling or sleeping. */
    comm->sock_yield_ns = 1000 * (param_str(P_COLLIE_SOCKET_YIELD_US)
                                      ? param_int(P_COLLIE_SOCKET_YIELD_US, 0, 60 * 1000 * 1000)
                                      : (comm->machine_size > comm->machine_cpus ? 1000 : 0));
    comm->spread = comm->local_size > mycpus && mycpus >= 2 && param_int(P_COLLIE_SPREAD, 0, 1);
  }
  comm->comm_hash = bootstrap_nonce(comm->bs) ^ 0x636f6c6c6965ULL;
  comm->shm_disable = (int)param_int(P_NCCL_SHM_DISABLE, 0, 1);
  comm->timeout_s = param_int(P_COLLIE_TIMEOUT, 0, 86400 * 365);
  NCCLCHECKGOTO(rings_init(comm), res, out);
  NCCLCHECKGOTO(tuning_init(comm), res, out);
  int64_t t_setup = time_ns();
  int hfd = sc.health_fd;
  sc.health_fd = -1; /* health_init closes it, whatever happens */
  NCCLCHECKGOTO(health_init(comm, hfd, &prev_health), res, out);
  int64_t t_end = time_ns();
  INFO(LOG_INIT, "comm %p rank %d nranks %d hosts %d local %d/%d cudaDev %d commHash 0x%llx%s - Init COMPLETE (%.3f ms)",
       (void*)comm, rank, nranks, comm->nhosts, comm->local_rank, comm->local_size, comm->cuda_dev,
       (unsigned long long)comm->comm_hash, comm->nonblocking ? " nonblocking" : "", (t_end - t0) / 1e6);
  /* One line per rank that bench/init_scaling.sh parses: where init's time went. */
  double checkin_ms, table_ms;
  bootstrap_phase_ms(comm->bs, &checkin_ms, &table_ms);
  INFO(LOG_INIT, "init phases ms: checkin %.3f table %.3f peerinfo %.3f setup %.3f keepalive %.3f total %.3f",
       checkin_ms, table_ms, (t_info - t_bs) / 1e6, (t_setup - t_info) / 1e6, (t_end - t_setup) / 1e6,
       (t_end - t0) / 1e6);
out:
  if (sc.health_fd >= 0) close(sc.health_fd);
  return res;
}

struct async_init {
  const char* fn;
  int nids;
  ncclUniqueId ids[];
};

static ncclResult_t comm_setup_async(struct ncclComm* comm, void* arg) {
  struct async_init* ai = arg;
  if (comm->cuda_dev >= 0) device_set(comm->cuda_dev); /* the device current at the call */
  ncclResult_t res = comm_setup(comm, ai->nids, ai->ids, ai->fn);
  if (res != ncclSuccess) comm_release(comm);
  return res;
}

ncclResult_t comm_init(ncclComm_t* newcomm, int nranks, int nids, const ncclUniqueId* ids, int rank,
                       const ncclConfig_t* config, const char* fn) {
  if (newcomm == NULL) return err_set(ncclInvalidArgument, "%s: newcomm is NULL", fn);
  *newcomm = NULL;
  if (nranks < 1) return err_set(ncclInvalidArgument, "%s: nranks %d < 1", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return err_set(ncclInvalidArgument, "%s: rank %d outside [0, %d)", fn, rank, nranks);
  if (ids == NULL) return err_set(ncclInvalidArgument, "%s: unique ID pointer is NULL", fn);
  if (nids < 1 || nids > nranks)
    return err_set(ncclInvalidArgument, "%s: nId %d outside [1, nranks=%d]", fn, nids, nranks);
  ncclConfig_t cfg;
  NCCLCHECK(config_resolve(config, &cfg));
  if (param_str(P_NCCL_COMM_BLOCKING)) cfg.blocking = (int)param_int(P_NCCL_COMM_BLOCKING, 0, 1);

  log_reset();
  pthread_once(&version_once, print_version);
  comm_busy_setup();
  int saved_rank = log_get_rank();
  log_set_rank(rank);
  ncclResult_t res = ncclSuccess;
  ncclComm_t comm = calloc(1, sizeof(*comm));
  if (!comm) {
    log_set_rank(saved_rank);
    return err_set(ncclSystemError, "%s: out of memory", fn);
  }
  comm->magic = COMM_MAGIC;
  comm->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->config = cfg;
  comm->nonblocking = !cfg.blocking;
  comm->cuda_dev = device_current();
  comm->async_error = ncclSuccess;
  pthread_mutex_init(&comm->err_lock, NULL);
  if (comm->stop_fd < 0) {
    res = err_set(ncclSystemError, "%s: eventfd failed: %s", fn, strerror(errno));
    goto fail;
  }
  comm->peers = calloc((size_t)nranks, sizeof(*comm->peers));
  comm->machine = calloc((size_t)nranks, sizeof(*comm->machine));
  comm->proc_start = calloc((size_t)nranks, sizeof(*comm->proc_start));
  comm->peer_cpu = malloc(sizeof(*comm->peer_cpu) * (size_t)nranks);
  if (!comm->peers || !comm->machine || !comm->proc_start || !comm->peer_cpu) {
    res = err_set(ncclSystemError, "%s: out of memory for %d peers", fn, nranks);
    goto fail;
  }
  for (int i = 0; i < nranks; i++) comm->peer_cpu[i] = -1;
  /* Inside a group a blocking init is deferred to ncclGroupEnd: it runs on the
   * worker of a nonblocking one, and the group's end turns it blocking. */
  int deferred = !comm->nonblocking && group_active();
  if (comm->nonblocking || deferred) {
    /* The worker runs the init; the handle is valid at once and reads
     * ncclInProgress (ncclCommGetAsyncError) until the init is over. */
    struct async_init* ai = malloc(sizeof(*ai) + sizeof(ncclUniqueId) * (size_t)nids);
    if (!ai) {
      res = err_set(ncclSystemError, "%s: out of memory", fn);
      goto fail;
    }
    ai->fn = fn;
    ai->nids = nids;
    memcpy(ai->ids, ids, sizeof(ncclUniqueId) * (size_t)nids);
    comm->async_error = ncclInProgress;
    res = async_start(comm, comm_setup_async, ai, free);
    if (res != ncclSuccess) {
      free(ai);
      goto fail;
    }
    *newcomm = comm;
    log_set_rank(saved_rank < 0 ? rank : saved_rank);
    if (deferred) {
      comm->nonblocking = 1; /* until ncclGroupEnd */
      return group_defer_init(comm);
    }
    return ncclInProgress;
  }
  NCCLCHECKGOTO(comm_setup(comm, nids, ids, fn), res, fail);
  *newcomm = comm;
  log_set_rank(saved_rank < 0 ? rank : saved_rank);
  return ncclSuccess;
fail:
  comm_free(comm);
  log_set_rank(saved_rank);
  return res;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRank(ncclComm_t* newcomm, int nranks, ncclUniqueId commId, int rank) {
  return comm_init(newcomm, nranks, 1, &commId, rank, NULL, "ncclCommInitRank");
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t* config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return comm_init(comm, nranks, 1, &commId, rank, config, "ncclCommInitRankConfig");
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t* newcomm, int nranks, int myrank, int nId,
         ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                                      ncclConfig_t* config) {
  return comm_init(newcomm, nranks, nId, commIds, myrank, config, "ncclCommInitRankScalable");
}

struct init_all_arg {
  ncclComm_t* slot;
  int nranks, rank, dev;
  ncclUniqueId id;
  ncclResult_t res;
  char err[512];
};

static void* init_all_thread(void* p) {
  struct init_all_arg* a = p;
  if (a->dev >= 0) device_set(a->dev);
  a->res = comm_init(a->slot, a->nranks, 1, &a->id, a->rank, NULL, "ncclCommInitAll");
  /* NCCL_COMM_BLOCKING=0: this call still returns complete communicators. */
  if (a->res == ncclInProgress) {
    async_drain(*a->slot);
    a->res = __atomic_load_n(&(*a->slot)->async_error, __ATOMIC_ACQUIRE);
    if (a->res != ncclSuccess) err_set(a->res, "%s", comm_error_msg(*a->slot));
  }
  if (a->res != ncclSuccess) snprintf(a->err, sizeof(a->err), "%s", err_last_thread());
  return NULL;
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == NULL) return err_set(ncclInvalidArgument, "ncclCommInitAll: comms is NULL");
  if (ndev < 1) return err_set(ncclInvalidArgument, "ncclCommInitAll: ndev %d < 1", ndev);
  int ndevices = device_count();
  for (int i = 0; devlist && i < ndev; i++) {
    if (devlist[i] < 0 || (ndevices > 0 && devlist[i] >= ndevices))
      return err_set(ncclInvalidArgument, "ncclCommInitAll: devlist[%d] = %d is not a device (have %d)", i, devlist[i],
                     ndevices);
  }
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  struct init_all_arg* args = calloc((size_t)ndev, sizeof(*args));
  pthread_t* threads = calloc((size_t)ndev, sizeof(*threads));
  if (!args || !threads) {
    free(args);
    free(threads);
    return err_set(ncclSystemError, "ncclCommInitAll: out of memory");
  }
  int started = 0;
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < ndev; i++) {
    comms[i] = NULL;
    args[i] = (struct init_all_arg){.slot = &comms[i], .nranks = ndev, .rank = i, .id = id};
    /* Without GPUs every rank runs on the host; with them, rank i uses devlist[i] (or device i). */
    args[i].dev = ndevices > 0 ? (devlist ? devlist[i] : i % ndevices) : -1;
    int rc = pthread_create(&threads[i], NULL, init_all_thread, &args[i]);
    if (rc != 0) {
      res = err_set(ncclSystemError, "ncclCommInitAll: cannot start thread %d: %s", i, strerror(rc));
      break;
    }
    started++;
  }
  /* If a thread could not start, the started ranks fail on the bootstrap timeout. */
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  for (int i = 0; i < started && res == ncclSuccess; i++)
    if (args[i].res != ncclSuccess) res = err_set(args[i].res, "ncclCommInitAll: rank %d: %s", i, args[i].err);
  if (res != ncclSuccess) {
    for (int i = 0; i < ndev; i++) {
      comm_free(comms[i]);
      comms[i] = NULL;
    }
  }
  free(args);
  free(threads);
  return res;
}

/* ------------------------------------------------------------ teardown */

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  NCCLCHECK(comm_check(comm, "ncclCommFinalize"));
  if (comm->finalized) return err_set(ncclInvalidUsage, "ncclCommFinalize: comm %p was already finalized", (void*)comm);
  if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE))
    return err_set(ncclInvalidUsage, "ncclCommFinalize: comm %p was revoked", (void*)comm);
  /* Host work completes inside its call; a nonblocking communicator's queue
   * may still be running (ncclCommGetAsyncError tells when it is done). */
  dev_quiesce(comm); /* device calls queued on streams have run */
  comm->finalized = 1;
  return async_pending(comm) ? ncclInProgress : ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  NCCLCHECK(comm_check(comm, "ncclCommDestroy"));
  /* Queued nonblocking work completes first (it fails fast if a peer died). */
  async_stop(comm, 0);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void*)comm, comm->rank, comm->nranks);
  comm_free(comm);
  root_reap();
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  NCCLCHECK(comm_check(comm, "ncclCommAbort"));
  int64_t t0 = time_ns();
  /* Leaving with nothing running is a goodbye; cutting work short is a
   * failure the peers must hear about (they may be waiting on this rank). */
  int interrupted = comm_busy_count(comm) > 0 || async_pending(comm) > 0;
  __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
  comm_wake_waiters(comm);
  async_stop(comm, 1);
  /* A call blocked on another thread notices the flag before its next sleep
   * (every wait sleeps at most 100 ms) and returns; only then is it safe to
   * free what it uses. */
  if (!comm_wait_idle(comm, 5000)) {
    WARN("ncclCommAbort: comm %p rank %d: an operation on another thread did not stop; its memory is left allocated",
         (void*)comm, comm->rank);
    return ncclSuccess;
  }
  if (interrupted) transport_poison(comm);
  health_stop(comm, !interrupted && __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE) == ncclSuccess);
  INFO(LOG_INIT, "comm %p rank %d nranks %d - Abort COMPLETE (%.3f ms)", (void*)comm, comm->rank, comm->nranks,
       (time_ns() - t0) / 1e6);
  comm_free(comm);
  root_reap();
  return ncclSuccess;
}

/* ------------------------------------------------------------ queries */

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  NCCLCHECK(comm_check(comm, "ncclCommGetAsyncError"));
  if (asyncError == NULL) return err_set(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  ncclResult_t e = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  /* Nonblocking work queued or running (or a revoke not yet quiescent). */
  if (e == ncclSuccess && (async_pending(comm) ||
                           (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE) && comm_busy_count(comm))))
    e = ncclInProgress;
  *asyncError = e;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  NCCLCHECK(comm_check(comm, "ncclCommCount"));
  if (count == NULL) return err_set(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  NCCLCHECK(comm_check(comm, "ncclCommCuDevice"));
  if (device == NULL) return err_set(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = comm->cuda_dev;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  NCCLCHECK(comm_check(comm, "ncclCommUserRank"));
  if (rank == NULL) return err_set(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = comm->rank;
  return ncclSuccess;
}

COLLIE_EXPORT ncclResult_t collie_comm_peer_info(ncclComm_t comm, int rank, collie_peer_info_t* info) {
  NCCLCHECK(comm_check(comm, "collie_comm_peer_info"));
  if (info == NULL) return err_set(ncclInvalidArgument, "collie_comm_peer_info: info is NULL");
  if (rank < 0 || rank >= comm->nranks)
    return err_set(ncclInvalidArgument, "collie_comm_peer_info: rank %d outside [0, %d)", rank, comm->nranks);
  if (info->size < offsetof(collie_peer_info_t, rank) + sizeof(int) || info->size > (size_t)1 << 20)
    return err_set(ncclInvalidArgument, "collie_comm_peer_info: info->size %zu invalid; set it to sizeof(collie_peer_info_t)",
                   info->size);
  size_t n = COLLIE_MIN(info->size, sizeof(collie_peer_info_t));
  size_t caller = info->size;
  memcpy(info, &comm->peers[rank], n);
  info->size = caller;
  return ncclSuccess;
}

/* ------------------------------------------------------------ split */

#define TAG_SPLIT_ID 0x7e000000u

struct split_entry {
  int32_t color, key;
};

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  NCCLCHECK(comm_check(comm, "ncclCommSplit"));
  if (newcomm == NULL) return err_set(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return err_set(ncclInvalidArgument, "ncclCommSplit: color %d is negative (use NCCL_SPLIT_NOCOLOR to opt out)", color);
  if (comm->finalized) return err_set(ncclInvalidUsage, "ncclCommSplit: the parent communicator was finalized");
  async_drain(comm); /* the parent's queued work goes first */
  if (comm->async_error != ncclSuccess)
    return err_set(ncclInvalidUsage, "ncclCommSplit: the parent communicator is in error (%s)",
                   ncclGetErrorString(comm->async_error));
  /* Every rank learns every (color, key); each color's members are ordered by
   * key, then parent rank; the first of them makes the unique ID and hands it
   * to the others. The split number in the tag keeps consecutive splits apart. */
  int n = comm->nranks;
  struct split_entry* all = calloc((size_t)n, sizeof(*all));
  int* members = calloc((size_t)n, sizeof(int));
  ncclResult_t res = ncclSuccess;
  if (!all || !members) {
    res = err_set(ncclSystemError, "ncclCommSplit: out of memory");
    goto out;
  }
  all[comm->rank] = (struct split_entry){color, key};
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, all, sizeof(*all)), res, out);
  uint32_t tag = TAG_SPLIT_ID + (uint32_t)(comm->nsplits++ & 0xffffff);
  if (color == NCCL_SPLIT_NOCOLOR) goto out;
  int m = 0;
  for (int r = 0; r < n; r++) {
    if (all[r].color != color) continue;
    int k = m++;
    while (k > 0 && (all[members[k - 1]].key > all[r].key)) {
      members[k] = members[k - 1];
      k--;
    }
    members[k] = r;
  }
  int newrank = 0;
  while (members[newrank] != comm->rank) newrank++;
  ncclUniqueId id;
  if (newrank == 0) {
    NCCLCHECKGOTO(bootstrap_create_fresh_id(&id), res, out);
    for (int i = 1; i < m; i++) NCCLCHECKGOTO(bootstrap_send(comm->bs, members[i], tag, &id, sizeof(id)), res, out);
  } else {
    NCCLCHECKGOTO(bootstrap_recv(comm->bs, members[0], tag, &id, sizeof(id)), res, out);
  }
  INFO(LOG_INIT, "ncclCommSplit: rank %d color %d key %d -> rank %d of %d", comm->rank, color, key, newrank, m);
  res = comm_init(newcomm, m, 1, &id, newrank, config ? config : &comm->config, "ncclCommSplit");
out:
  free(all);
  free(members);
  return res;
}
