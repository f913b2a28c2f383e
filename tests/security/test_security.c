/* Security properties of a running job, checked from inside its processes:
 *   shm     shared-memory segments (memfds) are mode 0600 and nothing is
 *           created in /dev/shm;
 *   listen  every listening socket (the root, each rank's bootstrap listener,
 *           socket-transport listeners) is bound to the chosen interface's
 *           address (loopback under NCCL_SOCKET_IFNAME=lo), never the wildcard;
 *   listen_any  with COLLIE_LISTEN_ANY=1 they are all wildcard binds (shows
 *           the check above can fail).
 * Usage: test_security shm|listen|listen_any [nranks] */
#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "../mp/harness.h"

static const char* mode;
static int sync_pipe[2]; /* rank 0 -> rank 1: "I saw my transport listener" */

/* ------------------------------------------------------------ shm */

/* Checks every collie memfd mapped into this process. */
static int check_memfd_modes(int rank, int* nshm) {
  FILE* f = fopen("/proc/self/maps", "r");
  MP_CHECK(f != NULL, "cannot read /proc/self/maps");
  char line[1024];
  int bad = 0;
  *nshm = 0;
  while (fgets(line, sizeof(line), f)) {
    char* name = strstr(line, "/memfd:collie");
    if (!name) continue;
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    char path[128];
    snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", lo, hi);
    struct stat st;
    if (stat(path, &st) != 0) {
      fprintf(stderr, "rank %d: cannot stat %s (%s)\n", rank, path, strerror(errno));
      bad = 1;
      continue;
    }
    if ((st.st_mode & 07777) != 0600 || st.st_uid != geteuid()) {
      fprintf(stderr, "rank %d: segment %.*s has mode %o owner %u (want 0600, %u)\n", rank,
              (int)strcspn(name, "\n"), name, st.st_mode & 07777, st.st_uid, geteuid());
      bad = 1;
    }
    if (strncmp(name, "/memfd:collie-shm", 17) == 0) (*nshm)++;
  }
  fclose(f);
  return bad;
}

static int count_dev_shm(void) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static int shm_rank(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  /* Small (one-shot mailboxes) and large (ring over shm connectors). */
  size_t sizes[2] = {64, 1 << 20};
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    float* buf = malloc(n * sizeof(float));
    MP_CHECK(buf != NULL, "malloc");
    for (size_t i = 0; i < n; i++) buf[i] = (float)(rank + 1);
    MP_NCCL(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm, NULL));
    float want = (float)nranks * (nranks + 1) / 2;
    MP_CHECK(buf[0] == want && buf[n - 1] == want, "allreduce gave %g, want %g", buf[0], want);
    free(buf);
  }
  int nshm = 0;
  int bad = check_memfd_modes(rank, &nshm);
  MP_CHECK(!bad, "segments with the wrong mode (above)");
  MP_CHECK(nshm > 0, "no collie-shm segment mapped: the test did not exercise shared memory");
  printf("rank %d: %d shm segment mappings, all mode 0600\n", rank, nshm);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* ------------------------------------------------------------ listeners */

/* Appends the bound address of every listening socket of this process to
 * `out` (deduplicated by fd number). Returns how many it found. */
struct seen {
  int n;
  int fd[64];
  union {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
  } addr[64];
};

static int scan_listeners(struct seen* s) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  struct dirent* e;
  int found = 0;
  while ((e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
    int acc = 0;
    socklen_t len = sizeof(acc);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || !acc) continue;
    int dom = 0;
    len = sizeof(dom);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) != 0 || (dom != AF_INET && dom != AF_INET6)) continue;
    found++;
    int known = 0;
    for (int i = 0; i < s->n; i++) known |= s->fd[i] == fd;
    if (known || s->n == 64) continue;
    len = sizeof(s->addr[0]);
    if (getsockname(fd, &s->addr[s->n].sa, &len) != 0) continue;
    s->fd[s->n++] = fd;
  }
  closedir(d);
  return found;
}

static int is_wildcard(const struct seen* s, int i) {
  if (s->addr[i].sa.sa_family == AF_INET) return s->addr[i].sin.sin_addr.s_addr == htonl(INADDR_ANY);
  return IN6_IS_ADDR_UNSPECIFIED(&s->addr[i].sin6.sin6_addr);
}

static int is_loopback(const struct seen* s, int i) {
  if (s->addr[i].sa.sa_family == AF_INET) return (ntohl(s->addr[i].sin.sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&s->addr[i].sin6.sin6_addr);
}

/* Every listener recorded must be loopback (listen) or wildcard (listen_any). */
static int check_seen(const char* who, const struct seen* s) {
  int want_any = strcmp(mode, "listen_any") == 0, bad = 0;
  for (int i = 0; i < s->n; i++) {
    char host[INET6_ADDRSTRLEN] = "?";
    const void* a = s->addr[i].sa.sa_family == AF_INET ? (const void*)&s->addr[i].sin.sin_addr
                                                        : (const void*)&s->addr[i].sin6.sin6_addr;
    inet_ntop(s->addr[i].sa.sa_family, a, host, sizeof(host));
    int ok = want_any ? is_wildcard(s, i) : (is_loopback(s, i) && !is_wildcard(s, i));
    printf("%s: listener fd %d bound to %s: %s\n", who, s->fd[i], host, ok ? "ok" : "WRONG");
    bad |= !ok;
  }
  return bad;
}

struct scanner {
  pthread_t t;
  int stop;
  int base; /* listeners seen before the transport existed */
  struct seen s;
};

/* Rank 0's watcher: records listeners while rank 0 sets up its socket
 * connector, and tells rank 1 when it has seen the new one. */
static void* scan_main(void* arg) {
  struct scanner* sc = arg;
  int told = 0;
  while (!__atomic_load_n(&sc->stop, __ATOMIC_ACQUIRE)) {
    scan_listeners(&sc->s);
    if (!told && sc->s.n > sc->base) {
      char x = 1;
      told = write(sync_pipe[1], &x, 1) == 1;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static int listen_rank(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  char host[32];
  snprintf(host, sizeof(host), "security-host-%d", rank);
  setenv("NCCL_HOSTID", host, 1); /* every rank its own host: socket transport */
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  struct scanner sc;
  memset(&sc, 0, sizeof(sc));
  MP_CHECK(scan_listeners(&sc.s) >= 1, "no bootstrap listener found after init");
  sc.base = sc.s.n;
  int v = rank;
  if (rank == 0) {
    MP_CHECK(pthread_create(&sc.t, NULL, scan_main, &sc) == 0, "pthread_create");
    MP_NCCL(ncclRecv(&v, 1, ncclInt, 1, comm, NULL));
    __atomic_store_n(&sc.stop, 1, __ATOMIC_RELEASE);
    pthread_join(sc.t, NULL);
    MP_CHECK(v == 1, "received %d", v);
    MP_CHECK(sc.s.n > sc.base, "never saw the socket transport's listener (rank 1 sends only after it appears)");
  } else if (rank == 1) {
    /* Holds its send until rank 0 has seen its transport listener, so that
     * listener is still open when looked at (bounded: rank 0 fails if not). */
    struct pollfd p = {.fd = sync_pipe[0], .events = POLLIN};
    poll(&p, 1, 30000);
    MP_NCCL(ncclSend(&v, 1, ncclInt, 0, comm, NULL));
  }
  /* Every pair connected: more transport listeners come and go; all checked. */
  int sum = rank;
  MP_NCCL(ncclAllReduce(&sum, &sum, 1, ncclInt, ncclSum, comm, NULL));
  MP_CHECK(sum == nranks * (nranks - 1) / 2, "allreduce %d", sum);
  scan_listeners(&sc.s);
  char who[32];
  snprintf(who, sizeof(who), "rank %d", rank);
  MP_CHECK(check_seen(who, &sc.s) == 0, "listener bound to the wrong address (above)");
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* The parent hosts the root thread: its listener is checked the same way. */
static int parent_after_ids(const ncclUniqueId* ids, int nids) {
  struct seen s;
  memset(&s, 0, sizeof(s));
  if (scan_listeners(&s) < 1) {
    fprintf(stderr, "FAIL: no root listener in the parent\n");
    return 1;
  }
  return check_seen("root", &s);
}

static int dev_shm_before;
static int parent_after_run(void) {
  int now = count_dev_shm();
  if (now > dev_shm_before) {
    fprintf(stderr, "FAIL: /dev/shm holds %d entries after the run, %d before\n", now, dev_shm_before);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  (void)mp_run; /* harness.h helper this test does not need */
  mode = argc > 1 ? argv[1] : "shm";
  int n = argc > 2 ? atoi(argv[2]) : 3;
  if (pipe(sync_pipe) != 0) return 1;
  struct mp_hooks hooks = {NULL, parent_after_run};
  int rc;
  dev_shm_before = count_dev_shm();
  if (strcmp(mode, "shm") == 0) {
    rc = mp_run_hooks(n, 1, shm_rank, NULL, NULL, 0, 120, &hooks);
  } else if (strcmp(mode, "listen") == 0 || strcmp(mode, "listen_any") == 0) {
    if (strcmp(mode, "listen_any") == 0) setenv("COLLIE_LISTEN_ANY", "1", 1);
    else unsetenv("COLLIE_LISTEN_ANY");
    if (n < 2) n = 2;
    hooks.after_ids = parent_after_ids;
    rc = mp_run_hooks(n, 1, listen_rank, NULL, NULL, 0, 120, &hooks);
  } else {
    fprintf(stderr, "usage: test_security shm|listen|listen_any [nranks]\n");
    return 2;
  }
  printf("%s: %s\n", mode, rc ? "FAILED" : "passed");
  return rc;
}
