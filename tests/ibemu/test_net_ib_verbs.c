/* Tests of the IB transport's verbs layer (src/transport/net_ib_verbs.c)
 * against the emulator (libibemu.so, loaded through COLLIE_IBVERBS_LIBRARY):
 * NCCL_IB_HCA selection, RoCE GID choice, the unavailable-library path, QP
 * bring-up between two processes (NCCL_IB_QPS_PER_CONNECTION QPs) and the
 * registration cache, NIC choice by PCI distance to a GPU (a fake sysfs
 * tree). Usage: test_net_ib_verbs hca|unavailable|qp DEV|regcache|pci */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibemu.h"
#include "transport/net_ib_verbs.h"

#define CHECK(c)                                                                         \
  do {                                                                                   \
    if (!(c)) {                                                                          \
      fprintf(stderr, "[%d] FAIL %s:%d: %s\n", (int)getpid(), __FILE__, __LINE__, #c);   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static void expect_zero_counts(void) {
  struct ibemu_counts c;
  ibemu_get_counts(&c);
  CHECK(c.contexts == 0 && c.pds == 0 && c.mrs == 0 && c.cqs == 0 && c.qps == 0);
}

/* Discovers with NCCL_IB_HCA=spec and returns "dev:port,dev:port". */
static const char* ports_with(const char* spec) {
  static char out[512];
  if (spec) setenv("NCCL_IB_HCA", spec, 1); else unsetenv("NCCL_IB_HCA");
  struct ib_port p[IB_MAX_PORTS];
  int n = -1;
  CHECK(ib_discover(p, IB_MAX_PORTS, &n) == ncclSuccess);
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    char one[IB_NAME_MAX + 16];
    snprintf(one, sizeof(one), "%s%.*s:%d", i ? "," : "", IB_NAME_MAX - 1, p[i].dev_name, p[i].port);
    CHECK(strlen(out) + strlen(one) < sizeof(out));
    strcat(out, one);
  }
  unsetenv("NCCL_IB_HCA");
  return out;
}

#define EXPECT_PORTS(spec, want)                                                 \
  do {                                                                           \
    const char* got_ = ports_with(spec);                                         \
    if (strcmp(got_, want)) {                                                    \
      fprintf(stderr, "NCCL_IB_HCA=%s: got '%s', want '%s'\n", spec ? spec : "(unset)", got_, want); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

/* Devices (ctest env): mlx5_0:1 IB, mlx5_1:2 IB, mlx5_10:1 RoCE, mlx4_0:2 IB with port 1 down. */
static int test_hca(void) {
  CHECK(ib_hca_match(NULL, "mlx5_0", 1) && ib_hca_match("", "mlx5_0", 1));
  CHECK(ib_hca_match("mlx5", "mlx5_3", 2) && !ib_hca_match("=mlx5", "mlx5_3", 2));
  CHECK(ib_hca_match("mlx5_0:1", "mlx5_0", 1) && !ib_hca_match("mlx5_0:1", "mlx5_0", 2));
  CHECK(!ib_hca_match("^mlx5_0", "mlx5_0", 1) && ib_hca_match("^mlx5_0", "mlx4_0", 1));
  CHECK(ib_hca_match("^=mlx5_1", "mlx5_10", 1) && !ib_hca_match("^=mlx5_1", "mlx5_1", 1));
  EXPECT_PORTS(NULL, "mlx5_0:1,mlx5_1:1,mlx5_1:2,mlx5_10:1,mlx4_0:2");
  EXPECT_PORTS("mlx5_1", "mlx5_1:1,mlx5_1:2,mlx5_10:1");
  EXPECT_PORTS("=mlx5_1", "mlx5_1:1,mlx5_1:2");
  EXPECT_PORTS("=mlx5_1:2", "mlx5_1:2");
  EXPECT_PORTS("mlx5_0:1,mlx5_1:2", "mlx5_0:1,mlx5_1:2");
  EXPECT_PORTS("^mlx5", "mlx4_0:2");
  EXPECT_PORTS("^=mlx5_1,mlx4_0", "mlx5_0:1,mlx5_10:1");
  EXPECT_PORTS("mlx4_0:1", ""); /* down */
  EXPECT_PORTS("nosuch", "");
  setenv("NCCL_IB_DISABLE", "1", 1);
  EXPECT_PORTS(NULL, "");
  unsetenv("NCCL_IB_DISABLE");
  /* RoCE GID: RoCE v2 with an IPv4-mapped address by default, else as told. */
  struct ib_port p[IB_MAX_PORTS];
  int n;
  setenv("NCCL_IB_HCA", "=mlx5_10", 1);
  CHECK(ib_discover(p, IB_MAX_PORTS, &n) == ncclSuccess && n == 1);
  CHECK(p[0].link_layer == IBV_LINK_LAYER_ETHERNET && p[0].gid_index == 3);
  CHECK(p[0].gid.raw[10] == 0xff && p[0].gid.raw[11] == 0xff);
  setenv("NCCL_IB_GID_INDEX", "1", 1);
  CHECK(ib_discover(p, IB_MAX_PORTS, &n) == ncclSuccess && n == 1 && p[0].gid_index == 1);
  CHECK(p[0].gid.raw[0] == 0xfe && p[0].gid.raw[1] == 0x80);
  setenv("NCCL_IB_GID_INDEX", "9", 1); /* not in the table: port skipped with a WARN */
  CHECK(ib_discover(p, IB_MAX_PORTS, &n) == ncclSuccess && n == 0);
  unsetenv("NCCL_IB_GID_INDEX");
  setenv("NCCL_IB_HCA", "=mlx5_1", 1);
  CHECK(ib_discover(p, IB_MAX_PORTS, &n) == ncclSuccess && n == 2);
  CHECK(p[0].link_layer == IBV_LINK_LAYER_INFINIBAND && p[0].lid != 0 && p[1].lid != p[0].lid);
  CHECK(ib_discover(p, 1, &n) == ncclSuccess && n == 1); /* bounded by max */
  unsetenv("NCCL_IB_HCA");
  expect_zero_counts();
  return 0;
}

static int test_unavailable(void) {
  CHECK(ib_verbs_get() == NULL);
  struct ib_port p[4];
  int n = -1;
  CHECK(ib_discover(p, 4, &n) == ncclSuccess && n == 0);
  struct ib_qps q;
  memset(p, 0, sizeof(p));
  CHECK(ib_qps_open(&q, &p[0], 1, 16, 4, 4) != ncclSuccess);
  return 0;
}

static void xwrite(int fd, const void* b, size_t n) { CHECK(write(fd, b, n) == (ssize_t)n); }
static void xread(int fd, void* b, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char*)b + got, n - got);
    CHECK(r > 0);
    got += (size_t)r;
  }
}

struct blob { struct ib_conn_info info; uint64_t addr; uint32_t rkey; };

enum { MSG = 1 << 20 };

/* Two processes: discover DEV, open NCCL_IB_QPS_PER_CONNECTION QPs, exchange
 * blobs, connect, and RDMA-write-with-imm a distinct 1 MiB on every QP. */
static int qp_side(int rank, int rd, int wr, const char* dev) {
  setenv("NCCL_IB_HCA", dev, 1);
  struct ib_port ports[IB_MAX_PORTS];
  int n;
  CHECK(ib_discover(ports, IB_MAX_PORTS, &n) == ncclSuccess && n >= 1);
  struct ib_qps q;
  CHECK(ib_qps_open(&q, &ports[0], 0, 256, 32, 32) == ncclSuccess);
  CHECK(q.nqps == 2);
  size_t len = (size_t)2 * IB_MAX_QPS * MSG;
  uint8_t* buf = calloc(1, len);
  CHECK(buf != NULL);
  struct ib_regcache rc;
  ib_regcache_init(&rc, q.v, q.pd, 8);
  struct ibv_mr* mr;
  CHECK(ib_reg_get(&rc, buf, len, &mr) == ncclSuccess);
  struct blob me, peer;
  memset(&me, 0, sizeof(me));
  ib_qps_info(&q, &me.info);
  me.addr = (uintptr_t)buf;
  me.rkey = mr->rkey;
  xwrite(wr, &me, sizeof(me));
  xread(rd, &peer, sizeof(peer));
  CHECK(ib_qps_connect(&q, &peer.info) == ncclSuccess);
  for (int i = 0; i < q.nqps; i++) {
    struct ibv_recv_wr r, *bad;
    memset(&r, 0, sizeof(r));
    r.wr_id = (uint64_t)(100 + i);
    CHECK(ibv_post_recv(q.qp[i], &r, &bad) == 0);
  }
  char c = 0;
  xwrite(wr, &c, 1);
  xread(rd, &c, 1);
  for (int i = 0; i < q.nqps; i++) {
    uint8_t* src = buf + (size_t)i * MSG;
    memset(src, rank * 16 + i + 1, MSG);
    struct ibv_sge sg = {(uintptr_t)src, MSG, mr->lkey};
    struct ibv_send_wr w, *bad;
    memset(&w, 0, sizeof(w));
    w.wr_id = (uint64_t)i;
    w.sg_list = &sg;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    w.send_flags = IBV_SEND_SIGNALED;
    w.imm_data = htonl((uint32_t)i);
    w.wr.rdma.remote_addr = peer.addr + (size_t)(IB_MAX_QPS + i) * MSG;
    w.wr.rdma.rkey = peer.rkey;
    CHECK(ibv_post_send(q.qp[i], &w, &bad) == 0);
  }
  struct ibv_wc wc[2 * IB_MAX_QPS];
  int got = 0;
  time_t end = time(NULL) + 60;
  while (got < 2 * q.nqps && time(NULL) < end) {
    int k = ibv_poll_cq(q.cq, 2 * q.nqps - got, wc + got);
    CHECK(k >= 0);
    got += k;
    if (!k) usleep(200);
  }
  CHECK(got == 2 * q.nqps);
  for (int i = 0; i < got; i++) {
    CHECK(wc[i].status == IBV_WC_SUCCESS);
    if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      int k = (int)ntohl(wc[i].imm_data);
      CHECK(k >= 0 && k < q.nqps && wc[i].byte_len == MSG && wc[i].qp_num == q.qp[k]->qp_num);
    }
  }
  for (int i = 0; i < q.nqps; i++)
    for (size_t j = 0; j < MSG; j += 4093) CHECK(buf[(size_t)(IB_MAX_QPS + i) * MSG + j] == (1 - rank) * 16 + i + 1);
  xwrite(wr, &c, 1);
  xread(rd, &c, 1);
  ib_reg_put(&rc, mr);
  ib_regcache_destroy(&rc);
  ib_qps_close(&q);
  ib_qps_close(&q); /* twice is harmless */
  free(buf);
  expect_zero_counts();
  return 0;
}

static int test_qp(const char* dev) {
  setenv("NCCL_IB_QPS_PER_CONNECTION", "2", 1);
  int a[2], b[2];
  CHECK(pipe(a) == 0 && pipe(b) == 0);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    CHECK((pid[r] = fork()) >= 0);
    if (pid[r] == 0) exit(r == 0 ? qp_side(0, b[0], a[1], dev) : qp_side(1, a[0], b[1], dev));
  }
  close(a[0]); close(a[1]); close(b[0]); close(b[1]);
  int ok = 1;
  for (int r = 0; r < 2; r++) {
    int st;
    CHECK(waitpid(pid[r], &st, 0) == pid[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "rank %d failed (0x%x)\n", r, st); ok = 0; }
  }
  return ok ? 0 : 1;
}

static int test_regcache(void) {
  struct ib_port ports[IB_MAX_PORTS];
  int n;
  CHECK(ib_discover(ports, IB_MAX_PORTS, &n) == ncclSuccess && n >= 1);
  struct ib_qps q;
  CHECK(ib_qps_open(&q, &ports[0], 1, 16, 4, 4) == ncclSuccess);
  struct ib_regcache c;
  ib_regcache_init(&c, q.v, q.pd, 2);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 16 * pg;
  uint8_t* m = mmap(NULL, 4 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(m != MAP_FAILED);
  struct ibemu_counts cnt;
  struct ibv_mr *a, *a2, *b, *d, *e;
  /* Reuse: a sub-range of a registered range hits. */
  CHECK(ib_reg_get(&c, m, len, &a) == ncclSuccess);
  CHECK(ib_reg_get(&c, m + 100, 1000, &a2) == ncclSuccess && a2 == a);
  CHECK(c.hits == 1 && c.misses == 1 && c.n == 1);
  ib_reg_put(&c, a2);
  ib_reg_put(&c, a);
  /* Eviction: a third range pushes out the least recently used one. */
  CHECK(ib_reg_get(&c, m + len, len, &b) == ncclSuccess);
  ib_reg_put(&c, b);
  CHECK(ib_reg_get(&c, m, 10, &a2) == ncclSuccess && a2 == a); /* a is now most recent */
  ib_reg_put(&c, a2);
  CHECK(ib_reg_get(&c, m + 2 * len, len, &d) == ncclSuccess);
  CHECK(c.n == 2 && c.evictions == 1);
  ibemu_get_counts(&cnt);
  CHECK(cnt.mrs == 2);
  CHECK(ib_reg_get(&c, m + len, 10, &b) == ncclSuccess && c.misses == 4); /* b was evicted */
  /* Held entries are not evicted: three held, capacity two. */
  CHECK(ib_reg_get(&c, m + 3 * len, len, &e) == ncclSuccess);
  CHECK(c.n == 3);
  ib_reg_put(&c, d);
  CHECK(c.n == 2); /* released over capacity: dropped at its put */
  ib_reg_put(&c, b);
  ib_reg_put(&c, e);
  /* The same address re-registered after free: invalidation drops the stale MR. */
  CHECK(ib_reg_get(&c, m, len, &a) == ncclSuccess);
  ib_reg_put(&c, a);
  uint32_t old_key = a->lkey;
  ib_reg_invalidate(&c, m, len);
  CHECK(munmap(m, len) == 0);
  CHECK(mmap(m, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == m);
  uint64_t misses = c.misses;
  CHECK(ib_reg_get(&c, m, len, &a) == ncclSuccess && c.misses == misses + 1 && a->lkey != old_key);
  /* Invalidated while held: a new get registers afresh; the old MR goes at its put. */
  ib_reg_invalidate(&c, m, len);
  CHECK(ib_reg_get(&c, m, len, &a2) == ncclSuccess && a2 != a);
  ibemu_get_counts(&cnt);
  int mrs = cnt.mrs;
  ib_reg_put(&c, a);
  ibemu_get_counts(&cnt);
  CHECK(cnt.mrs == mrs - 1);
  ib_reg_put(&c, a2);
  /* Kept entries (ncclCommRegister'd memory) survive the per-operation
   * invalidation of everything else, not an explicit one. */
  ib_reg_invalidate(&c, NULL, UINTPTR_MAX);
  CHECK(c.n == 0);
  CHECK(ib_reg_try_kept(&c, m + len, len, &b) == 0);
  CHECK(ib_reg_try(&c, m + 2 * len, len, &d) == 0);
  ib_reg_put(&c, b);
  ib_reg_put(&c, d);
  ib_reg_invalidate_unkept(&c);
  CHECK(c.n == 1);
  misses = c.misses;
  CHECK(ib_reg_try(&c, m + len + 10, 100, &a) == 0 && a == b && c.misses == misses);
  ib_reg_put(&c, a);
  ib_reg_invalidate(&c, m + len, 1);
  CHECK(c.n == 0);
  ib_regcache_destroy(&c);
  ibemu_get_counts(&cnt);
  CHECK(cnt.mrs == 0 && c.n == 0);
  munmap(m, 4 * len);
  ib_qps_close(&q);
  expect_zero_counts();
  return 0;
}

/* Makes directory path and its parents. */
static void mkdirs(const char* path) {
  char p[1024];
  snprintf(p, sizeof(p), "%s", path);
  for (char* s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      mkdir(p, 0700);
      *s = '/';
    }
  mkdir(p, 0700);
}

/* NIC choice by PCI distance to the rank's GPU, on a fake sysfs tree:
 * the GPU 0000:0a:00.0 sits behind a switch (03:08.0) under root complex
 * pci0000:00; mlx5_0 is under another root complex, mlx5_1 behind the same
 * switch, mlx5_10 under the same root complex through another bridge.
 * The emulator's devices point at it (COLLIE_IBEMU_SYSFS: <dir>/<name>/device
 * is a symlink into <dir>/devices, as sysfs links /sys/class/infiniband). */
static int test_pci(void) {
  char dir[] = "/tmp/collie-pci-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char p[1024], q[1024];
  static const char* gpu = "devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:08.0/0000:0a:00.0";
  static const struct { const char* name; const char* at; } nics[] = {
      {"mlx5_0", "devices/pci0000:80/0000:80:01.0/0000:81:00.0"},
      {"mlx5_1", "devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:10.0/0000:05:00.0"},
      {"mlx5_10", "devices/pci0000:00/0000:00:02.0/0000:06:00.0"},
  };
  snprintf(p, sizeof(p), "%s/%s", dir, gpu);
  mkdirs(p);
  snprintf(p, sizeof(p), "%s/bus/pci/devices", dir);
  mkdirs(p);
  snprintf(p, sizeof(p), "%s/bus/pci/devices/0000:0a:00.0", dir);
  snprintf(q, sizeof(q), "../../../%s", gpu);
  CHECK(symlink(q, p) == 0);
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof(p), "%s/%s", dir, nics[i].at);
    mkdirs(p);
    snprintf(p, sizeof(p), "%s/%s", dir, nics[i].name);
    mkdirs(p);
    snprintf(p, sizeof(p), "%s/%s/device", dir, nics[i].name);
    snprintf(q, sizeof(q), "../%s", nics[i].at);
    CHECK(symlink(q, p) == 0);
  }
  /* Distances on plain paths. */
  CHECK(ib_pci_distance("/s/devices/pci0000:00/a/b", "/s/devices/pci0000:00/a/b") == 0);
  CHECK(ib_pci_distance("/s/devices/pci0000:00/a/b", "/s/devices/pci0000:00/a/c") == 2);
  CHECK(ib_pci_distance("/s/devices/pci0000:00/a/b", "/s/devices/pci0000:00/a/bc") == 2);
  CHECK(ib_pci_distance("/s/devices/pci0000:00/a", "/s/devices/pci0000:00/a/b") == 1);
  CHECK(ib_pci_distance("/s/devices/pci0000:00/a/b", "/s/devices/pci0000:80/x/y") == 6);
  CHECK(ib_pci_distance("", "/s/a") == -1 && ib_pci_distance("/s/a", "") == -1);
  /* The GPU's place from its bus id as CUDA writes it (upper case). */
  char gp[PATH_MAX], want[PATH_MAX];
  CHECK(ib_pci_path(dir, "0000:0A:00.0", gp, sizeof(gp)) == 0);
  snprintf(p, sizeof(p), "%s/%s", dir, gpu);
  CHECK(realpath(p, want) && !strcmp(gp, want));
  CHECK(ib_pci_path(dir, "0000:0C:00.0", q, sizeof(q)) == -1 && q[0] == '\0');
  CHECK(ib_pci_path(dir, "", q, sizeof(q)) == -1);
  /* Discovery reads each device's place; the GPU picks the nearest. */
  setenv("COLLIE_IBEMU_SYSFS", dir, 1);
  struct ib_port ports[IB_MAX_PORTS];
  int n = 0, hops = -1;
  setenv("NCCL_IB_HCA", "=mlx5_0,mlx5_1:1,mlx5_10", 1);
  CHECK(ib_discover(ports, IB_MAX_PORTS, &n) == ncclSuccess && n == 3);
  for (int i = 0; i < n; i++) CHECK(strstr(ports[i].pci_path, "/devices/pci0000:") != NULL);
  int g = ib_port_pick_gpu(ports, n, gp, 0, &hops);
  CHECK(g >= 0 && !strcmp(ports[g].dev_name, "mlx5_1") && hops == 4);
  CHECK(ib_port_pick_gpu(ports, n, gp, 1, &hops) == g); /* one nearest port: every local rank */
  CHECK(ib_port_pick_gpu(ports, n, "", 0, &hops) == -1);
  /* Without mlx5_1: the same root complex beats the other one. */
  setenv("NCCL_IB_HCA", "=mlx5_0,mlx5_10", 1);
  CHECK(ib_discover(ports, IB_MAX_PORTS, &n) == ncclSuccess && n == 2);
  g = ib_port_pick_gpu(ports, n, gp, 0, &hops);
  CHECK(g >= 0 && !strcmp(ports[g].dev_name, "mlx5_10") && hops == 6);
  /* No place known for any port: -1 (the caller falls back to CPU locality). */
  for (int i = 0; i < n; i++) ports[i].pci_path[0] = '\0';
  CHECK(ib_port_pick_gpu(ports, n, gp, 0, &hops) == -1);
  /* Two equally near ports are dealt over the local ranks. */
  snprintf(ports[0].pci_path, sizeof(ports[0].pci_path), "%s/devices/pci0000:00/0000:00:01.0/0000:02:00.0/x", dir);
  snprintf(ports[1].pci_path, sizeof(ports[1].pci_path), "%s/devices/pci0000:00/0000:00:01.0/0000:02:00.0/y", dir);
  CHECK(ib_port_pick_gpu(ports, n, gp, 0, &hops) == 0 && hops == 3 && ib_port_pick_gpu(ports, n, gp, 1, &hops) == 1);
  unsetenv("NCCL_IB_HCA");
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0);
  expect_zero_counts();
  return 0;
}

int main(int argc, char** argv) {
  int rc;
  if (argc == 2 && !strcmp(argv[1], "hca")) rc = test_hca();
  else if (argc == 2 && !strcmp(argv[1], "unavailable")) rc = test_unavailable();
  else if (argc == 3 && !strcmp(argv[1], "qp")) rc = test_qp(argv[2]);
  else if (argc == 2 && !strcmp(argv[1], "regcache")) rc = test_regcache();
  else if (argc == 2 && !strcmp(argv[1], "pci")) rc = test_pci();
  else { fprintf(stderr, "usage: %s hca|unavailable|qp DEV|regcache|pci\n", argv[0]); return 2; }
  if (rc == 0) printf("PASS %s\n", argv[1]);
  return rc;
}
