/* Tests of the verbs emulator (tests/ibemu/ibemu.c) through the real
 * <infiniband/verbs.h>: device/port/GID queries, the RC state machine, RDMA
 * write with immediate data and send/recv between two forked processes,
 * access and RNR errors, a killed peer, each COLLIE_IBEMU_FAIL mode, and the
 * live object counts. Usage: test_ibemu <case> [args]; ctest runs each case. */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ibemu.h"

#define CHECK(c)                                                            \
  do {                                                                      \
    if (!(c)) {                                                             \
      fprintf(stderr, "[%d] FAIL %s:%d: %s\n", (int)getpid(), __FILE__, __LINE__, #c); \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

enum { WAIT_S = 60, MB = 1 << 20 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void xwrite(int fd, const void* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    CHECK(w > 0);
    p = (const char*)p + w;
    n -= (size_t)w;
  }
}

static void xread(int fd, void* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r > 0); /* EOF: the other process failed */
    p = (char*)p + r;
    n -= (size_t)r;
  }
}

struct end {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  uint8_t* buf;
  size_t len;
  int port, roce, gid_index;
  uint16_t lid;
  union ibv_gid gid;
};

struct info {
  uint32_t qpn, rkey;
  uint16_t lid;
  uint8_t gid[16];
  uint64_t addr, len;
};

struct conn_opts { uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer; };
static const struct conn_opts DEFAULT_OPTS = {14, 7, 7, 12};

static struct ibv_context* open_dev(const char* name) {
  int n = 0;
  struct ibv_device** l = ibv_get_device_list(&n);
  CHECK(l != NULL);
  struct ibv_context* ctx = NULL;
  for (int i = 0; i < n; i++)
    if (!strcmp(ibv_get_device_name(l[i]), name)) ctx = ibv_open_device(l[i]);
  ibv_free_device_list(l);
  CHECK(ctx != NULL);
  return ctx;
}

static struct ibv_qp* make_qp(struct end* e) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.send_cq = ia.recv_cq = e->cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 64;
  ia.cap.max_recv_wr = 64;
  ia.cap.max_send_sge = 2;
  ia.cap.max_recv_sge = 2;
  ia.cap.max_inline_data = 64;
  struct ibv_qp* qp = ibv_create_qp(e->pd, &ia);
  CHECK(qp != NULL);
  return qp;
}

static void qp_init(struct ibv_qp* qp, int port) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = (uint8_t)port;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
}

static void end_open(struct end* e, const char* dev, int port, size_t len, int access) {
  memset(e, 0, sizeof(*e));
  e->ctx = open_dev(dev);
  e->port = port;
  struct ibv_port_attr pa;
  CHECK(ibv_query_port(e->ctx, (uint8_t)port, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE);
  e->roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  e->lid = pa.lid;
  e->gid_index = e->roce ? 3 : 0;
  CHECK(ibv_query_gid(e->ctx, (uint8_t)port, e->gid_index, &e->gid) == 0);
  CHECK((e->pd = ibv_alloc_pd(e->ctx)) != NULL);
  CHECK((e->cq = ibv_create_cq(e->ctx, 256, NULL, NULL, 0)) != NULL);
  e->len = len;
  CHECK((e->buf = calloc(1, len)) != NULL);
  CHECK((e->mr = ibv_reg_mr(e->pd, e->buf, len, access)) != NULL);
  e->qp = make_qp(e);
  qp_init(e->qp, port);
}

static struct info end_info(const struct end* e) {
  struct info i;
  memset(&i, 0, sizeof(i));
  i.qpn = e->qp->qp_num;
  i.rkey = e->mr->rkey;
  i.lid = e->lid;
  memcpy(i.gid, e->gid.raw, 16);
  i.addr = (uintptr_t)e->buf;
  i.len = e->len;
  return i;
}

static int qp_rtr_rts(struct ibv_qp* qp, const struct end* e, const struct info* p, struct conn_opts o) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = p->qpn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = o.min_rnr_timer;
  a.ah_attr.port_num = (uint8_t)e->port;
  if (e->roce) {
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, p->gid, 16);
    a.ah_attr.grh.sgid_index = (uint8_t)e->gid_index;
    a.ah_attr.grh.hop_limit = 255;
  } else {
    a.ah_attr.dlid = p->lid;
  }
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) return rc;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void expect_zero_counts(void) {
  struct ibemu_counts c;
  ibemu_get_counts(&c);
  CHECK(c.contexts == 0 && c.pds == 0 && c.mrs == 0 && c.cqs == 0 && c.qps == 0 && c.channels == 0);
}

static void end_close(struct end* e) {
  CHECK(ibv_destroy_qp(e->qp) == 0);
  CHECK(ibv_dereg_mr(e->mr) == 0);
  CHECK(ibv_destroy_cq(e->cq) == 0);
  CHECK(ibv_dealloc_pd(e->pd) == 0);
  CHECK(ibv_close_device(e->ctx) == 0);
  free(e->buf);
  expect_zero_counts();
}

/* Polls until n completions arrived (bounded); returns how many did. */
static int wait_wc(struct ibv_cq* cq, struct ibv_wc* wc, int n) {
  int got = 0;
  double end = now_s() + WAIT_S;
  while (got < n && now_s() < end) {
    int k = ibv_poll_cq(cq, n - got, wc + got);
    CHECK(k >= 0);
    got += k;
    if (k == 0) usleep(200);
  }
  return got;
}

static void post_write(struct end* e, uint64_t wr_id, size_t off, size_t len, const struct info* p,
                       size_t roff, int imm, uint32_t imm_val, int flags) {
  struct ibv_sge sg = {(uintptr_t)(e->buf + off), (uint32_t)len, e->mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | flags;
  wr.imm_data = htonl(imm_val);
  wr.wr.rdma.remote_addr = p->addr + roff;
  wr.wr.rdma.rkey = p->rkey;
  CHECK(ibv_post_send(e->qp, &wr, &bad) == 0);
}

static void post_recv(struct end* e, uint64_t wr_id, size_t off, size_t len) {
  struct ibv_sge sg = {(uintptr_t)(e->buf + off), (uint32_t)len, e->mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = len ? &sg : NULL;
  wr.num_sge = len ? 1 : 0;
  CHECK(ibv_post_recv(e->qp, &wr, &bad) == 0);
}

static enum ibv_qp_state qp_state(struct ibv_qp* qp) {
  struct ibv_qp_attr a;
  struct ibv_qp_init_attr ia;
  CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0);
  return a.qp_state;
}

static uint8_t pattern(int rank, int msg, size_t i) { return (uint8_t)(rank * 31 + msg * 7 + i * 13 + (i >> 9)); }

/* ---- two processes ----------------------------------------------------- */

struct pipes { int rd, wr; };
typedef int (*side_fn)(int rank, struct pipes p, const char* const* args);

/* Forks rank 0 and 1 connected by a pipe pair; fails unless both exit 0
 * (rank 1 may instead die of SIGKILL when allowed). */
static int run_two(side_fn fn, const char* const* args, int rank1_may_be_killed) {
  int a[2], b[2];
  CHECK(pipe(a) == 0 && pipe(b) == 0);
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    CHECK(pid[r] >= 0);
    if (pid[r] == 0) {
      struct pipes p = r == 0 ? (struct pipes){b[0], a[1]} : (struct pipes){a[0], b[1]};
      close(r == 0 ? a[0] : b[0]);
      close(r == 0 ? b[1] : a[1]);
      exit(fn(r, p, args));
    }
  }
  close(a[0]); close(a[1]); close(b[0]); close(b[1]);
  int ok = 1;
  for (int r = 0; r < 2; r++) {
    int st;
    CHECK(waitpid(pid[r], &st, 0) == pid[r]);
    int good = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (r == 1 && rank1_may_be_killed) good |= WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (!good) { fprintf(stderr, "rank %d ended with status 0x%x\n", r, st); ok = 0; }
  }
  return ok ? 0 : 1;
}

static struct info exchange(struct end* e, struct pipes p) {
  struct info me = end_info(e), peer;
  xwrite(p.wr, &me, sizeof(me));
  xread(p.rd, &peer, sizeof(peer));
  return peer;
}

static void sync_pipe(struct pipes p) {
  char c = 'x';
  xwrite(p.wr, &c, 1);
  xread(p.rd, &c, 1);
}

/* Both ranks write K messages with immediate data into the peer's receive
 * half, then one SEND_WITH_IMM into a posted buffer; checks every byte and
 * completion (in order, opcode, imm, byte_len). */
enum { K = 7, HALF = 16 * MB };
static const size_t SIZES[K] = {1, 100, 4096, 65536 + 3, MB, 8 * MB - 5, 32};

static int side_pair(int rank, struct pipes p, const char* const* args) {
  struct end e;
  end_open(&e, args[0], atoi(args[1]), 2 * HALF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct info peer = exchange(&e, p);
  CHECK(qp_rtr_rts(e.qp, &e, &peer, DEFAULT_OPTS) == 0);
  CHECK(qp_state(e.qp) == IBV_QPS_RTS);
  for (int i = 0; i < K; i++) post_recv(&e, 100 + i, 0, 0);
  size_t send_off = HALF - 4096;
  post_recv(&e, 100 + K, HALF + send_off, 4096);
  sync_pipe(p); /* both have receives posted */
  size_t off = 0;
  for (int i = 0; i < K; i++) {
    for (size_t j = 0; j < SIZES[i]; j++) e.buf[off + j] = pattern(rank, i, j);
    post_write(&e, (uint64_t)i, off, SIZES[i], &peer, HALF + off, 1, (uint32_t)(rank << 16 | i),
               i == K - 1 ? IBV_SEND_INLINE : 0);
    off += SIZES[i];
  }
  /* SEND_WITH_IMM of 256 bytes from the end of the send half. */
  size_t s_off = HALF - 256;
  for (size_t j = 0; j < 256; j++) e.buf[s_off + j] = pattern(rank, K, j);
  struct ibv_sge sg = {(uintptr_t)(e.buf + s_off), 256, e.mr->lkey};
  struct ibv_send_wr wr, *bad;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = K;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(0xabcd);
  CHECK(ibv_post_send(e.qp, &wr, &bad) == 0);

  struct ibv_wc wc[2 * (K + 1)];
  CHECK(wait_wc(e.cq, wc, 2 * (K + 1)) == 2 * (K + 1));
  int nsend = 0, nrecv = 0;
  for (int i = 0; i < 2 * (K + 1); i++) {
    CHECK(wc[i].status == IBV_WC_SUCCESS);
    CHECK(wc[i].qp_num == e.qp->qp_num);
    if (wc[i].opcode == IBV_WC_RDMA_WRITE || wc[i].opcode == IBV_WC_SEND) {
      CHECK(wc[i].wr_id == (uint64_t)nsend); /* in order */
      CHECK(wc[i].opcode == (nsend < K ? IBV_WC_RDMA_WRITE : IBV_WC_SEND));
      nsend++;
    } else {
      CHECK(wc[i].wr_id == (uint64_t)(100 + nrecv));
      CHECK(wc[i].src_qp == peer.qpn);
      CHECK(wc[i].wc_flags & IBV_WC_WITH_IMM);
      if (nrecv < K) {
        CHECK(wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM);
        CHECK(wc[i].byte_len == SIZES[nrecv]);
        CHECK(ntohl(wc[i].imm_data) == (uint32_t)((1 - rank) << 16 | nrecv));
      } else {
        CHECK(wc[i].opcode == IBV_WC_RECV);
        CHECK(wc[i].byte_len == 256);
        CHECK(ntohl(wc[i].imm_data) == 0xabcd);
      }
      nrecv++;
    }
  }
  CHECK(nsend == K + 1 && nrecv == K + 1);
  off = 0;
  for (int i = 0; i < K; i++) {
    for (size_t j = 0; j < SIZES[i]; j++) CHECK(e.buf[HALF + off + j] == pattern(1 - rank, i, j));
    off += SIZES[i];
  }
  for (size_t j = 0; j < 256; j++) CHECK(e.buf[HALF + send_off + j] == pattern(1 - rank, K, j));
  struct ibv_wc extra;
  CHECK(ibv_poll_cq(e.cq, 1, &extra) == 0);
  sync_pipe(p); /* both done before either QP goes away */
  end_close(&e);
  return 0;
}

/* Rank 0 writes where rank 1's MR does not allow it. */
static int side_access(int rank, struct pipes p, const char* const* args) {
  int bounds = !strcmp(args[0], "bounds");
  int access = IBV_ACCESS_LOCAL_WRITE | (rank == 1 && !bounds ? 0 : IBV_ACCESS_REMOTE_WRITE);
  struct end e;
  end_open(&e, "mlx5_0", 1, 4096, access);
  struct info peer = exchange(&e, p);
  CHECK(qp_rtr_rts(e.qp, &e, &peer, DEFAULT_OPTS) == 0);
  if (rank == 1) post_recv(&e, 7, 0, 0);
  sync_pipe(p);
  if (rank == 0) {
    memset(e.buf, 0x5a, 4096);
    post_write(&e, 1, 0, 100, &peer, bounds ? 4096 - 10 : 0, 1, 1, 0);
    post_write(&e, 2, 0, 100, &peer, 0, 0, 0, 0);
    struct ibv_wc wc[2];
    CHECK(wait_wc(e.cq, wc, 2) == 2);
    CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR);
    CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(qp_state(e.qp) == IBV_QPS_ERR);
  }
  sync_pipe(p);
  if (rank == 1) {
    struct ibv_wc wc;
    CHECK(ibv_poll_cq(e.cq, 1, &wc) == 0); /* the receive was not consumed */
    for (int i = 0; i < 4096; i++) CHECK(e.buf[i] == 0); /* nothing landed */
  }
  sync_pipe(p);
  end_close(&e);
  return 0;
}

/* dma-buf MRs (what GPUDirect RDMA registers): a memfd stands for device
 * memory. Rank 0 writes from its dma-buf MR, addressed by an iova that is a
 * PROT_NONE view of the buffer in its own process (so a read through the
 * registering process's addresses would fault: the bytes must come through
 * the emulator's own mapping), into rank 1's dma-buf MR, addressed by an iova
 * that is not mapped in rank 1 at all; rank 1 finds the bytes in the memfd.
 * The fds are closed right after registering (the MR holds its own
 * reference). Also: the MR's fields, bad arguments, and
 * COLLIE_IBEMU_DMABUF=0 refusing as a driver without dma-buf support does. */
static int side_dmabuf(int rank, struct pipes p, const char* const* args) {
  (void)args;
  const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 2 * pg, n = 5000;
  struct end e;
  end_open(&e, "mlx5_0", 1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  int fd = memfd_create("ibemu-test-dmabuf", MFD_CLOEXEC);
  CHECK(fd >= 0 && ftruncate(fd, (off_t)(3 * pg)) == 0);
  uint8_t* rw = mmap(NULL, 3 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  uint8_t* dv = mmap(NULL, 3 * pg, PROT_NONE, MAP_SHARED, fd, 0); /* "device" addresses */
  CHECK(rw != MAP_FAILED && dv != MAP_FAILED);
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  uint64_t iova = rank == 0 ? (uintptr_t)(dv + pg) : 0x100000000000ull; /* rank 1: mapped nowhere */
  CHECK(ibv_reg_dmabuf_mr(e.pd, pg + 1, len, iova, fd, access) == NULL && errno == EINVAL); /* offset not paged */
  CHECK(ibv_reg_dmabuf_mr(e.pd, pg, len, iova, fd, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
  setenv("COLLIE_IBEMU_DMABUF", "0", 1);
  CHECK(ibv_reg_dmabuf_mr(e.pd, pg, len, iova, fd, access) == NULL && errno == EOPNOTSUPP);
  unsetenv("COLLIE_IBEMU_DMABUF");
  struct ibv_mr* dm = ibv_reg_dmabuf_mr(e.pd, pg, len, iova, fd, access);
  CHECK(dm && dm->addr == (void*)(uintptr_t)pg && dm->length == len && dm->lkey == dm->rkey);
  close(fd);
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  CHECK(k.mrs == 2 && k.dmabuf_regs == 1 && k.mr_regs == 2);
  struct info me = end_info(&e), peer;
  me.addr = iova;
  me.rkey = dm->rkey;
  me.len = len;
  xwrite(p.wr, &me, sizeof(me));
  xread(p.rd, &peer, sizeof(peer));
  CHECK(qp_rtr_rts(e.qp, &e, &peer, DEFAULT_OPTS) == 0);
  if (rank == 1) {
    memset(rw, 0xee, 3 * pg);
    post_recv(&e, 9, 0, 0);
  } else {
    for (size_t i = 0; i < 3 * pg; i++) rw[i] = pattern(0, 1, i);
  }
  sync_pipe(p);
  if (rank == 0) {
    /* n bytes from 100 bytes into the MR (file offset pg + 100) to 200 bytes
     * into the peer's MR (its file offset pg + 200). */
    struct ibv_sge sg = {iova + 100, (uint32_t)n, dm->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 5;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(77);
    wr.wr.rdma.remote_addr = peer.addr + 200;
    wr.wr.rdma.rkey = peer.rkey;
    CHECK(ibv_post_send(e.qp, &wr, &bad) == 0);
    struct ibv_wc wc;
    CHECK(wait_wc(e.cq, &wc, 1) == 1 && wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS);
  } else {
    struct ibv_wc wc;
    CHECK(wait_wc(e.cq, &wc, 1) == 1 && wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS && ntohl(wc.imm_data) == 77);
    for (size_t i = 0; i < 3 * pg; i++) {
      int in = i >= pg + 200 && i < pg + 200 + n;
      uint8_t want = in ? pattern(0, 1, i - 100) : 0xee;
      if (rw[i] != want) {
        fprintf(stderr, "rank 1: byte %zu of the dma-buf is %u, want %u\n", i, rw[i], want);
        return 1;
      }
    }
  }
  sync_pipe(p);
  CHECK(ibv_dereg_mr(dm) == 0);
  munmap(rw, 3 * pg);
  munmap(dv, 3 * pg);
  end_close(&e);
  return 0;
}

/* Rank 1 posts no receive: rank 0's write with immediate data is not ready
 * at the receiver; "exceeded" gives up after rnr_retry=2, "late" (infinite
 * retries) succeeds once rank 1 posts a receive 100 ms later. */
static int side_rnr(int rank, struct pipes p, const char* const* args) {
  int late = !strcmp(args[0], "late");
  struct conn_opts o = DEFAULT_OPTS;
  o.rnr_retry = late ? 7 : 2;
  o.min_rnr_timer = 14; /* 1.28 ms */
  struct end e;
  end_open(&e, "mlx5_0", 1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct info peer = exchange(&e, p);
  CHECK(qp_rtr_rts(e.qp, &e, &peer, o) == 0);
  sync_pipe(p);
  struct ibv_wc wc;
  if (rank == 0) {
    post_write(&e, 1, 0, 64, &peer, 0, 1, 42, 0);
    sync_pipe(p); /* posted */
    CHECK(wait_wc(e.cq, &wc, 1) == 1);
    CHECK(wc.wr_id == 1);
    CHECK(wc.status == (late ? IBV_WC_SUCCESS : IBV_WC_RNR_RETRY_EXC_ERR));
  } else {
    sync_pipe(p);
    if (late) {
      usleep(100000);
      post_recv(&e, 9, 0, 0);
      CHECK(wait_wc(e.cq, &wc, 1) == 1);
      CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 9 && ntohl(wc.imm_data) == 42 && wc.byte_len == 64);
    }
  }
  sync_pipe(p);
  if (rank == 1 && !late) CHECK(ibv_poll_cq(e.cq, 1, &wc) == 0);
  end_close(&e);
  return 0;
}

/* Rank 1 dies (SIGKILL) while rank 0 has a send outstanding and a receive
 * posted: both complete in error and the QP is in the error state. */
static int side_peer_killed(int rank, struct pipes p, const char* const* args) {
  (void)args;
  struct end e;
  end_open(&e, "mlx5_0", 1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct info peer = exchange(&e, p);
  CHECK(qp_rtr_rts(e.qp, &e, &peer, DEFAULT_OPTS) == 0);
  sync_pipe(p);
  if (rank == 1) {
    char c;
    xread(p.rd, &c, 1);
    kill(getpid(), SIGKILL);
    pause();
  }
  post_recv(&e, 5, 0, 0);
  post_write(&e, 1, 0, 64, &peer, 0, 1, 1, 0); /* held: rank 1 has no receive */
  xwrite(p.wr, "k", 1);
  struct ibv_wc wc[2];
  CHECK(wait_wc(e.cq, wc, 2) == 2);
  CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_RETRY_EXC_ERR);
  CHECK(wc[1].wr_id == 5 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
  CHECK(qp_state(e.qp) == IBV_QPS_ERR);
  post_write(&e, 2, 0, 64, &peer, 0, 0, 0, 0); /* accepted, flushed at once */
  CHECK(wait_wc(e.cq, wc, 1) == 1);
  CHECK(wc[0].wr_id == 2 && wc[0].status == IBV_WC_WR_FLUSH_ERR);
  end_close(&e);
  return 0;
}

/* COLLIE_IBEMU_FAIL=<mode>:2 on rank 0: its third RDMA write fails. */
static int side_fail(int rank, struct pipes p, const char* const* args) {
  const char* mode = args[0];
  char env[64];
  snprintf(env, sizeof(env), "%s:2", mode);
  if (rank == 0) setenv("COLLIE_IBEMU_FAIL", env, 1);
  struct conn_opts o = DEFAULT_OPTS;
  o.timeout = 8; /* a lost write fails after 4.096 us * 2^8 * (2 + 1) = 3 ms */
  o.retry_cnt = 2;
  struct end e;
  end_open(&e, "mlx5_0", 1, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct info peer = exchange(&e, p);
  CHECK(qp_rtr_rts(e.qp, &e, &peer, o) == 0);
  if (rank == 1)
    for (int i = 0; i < 8; i++) post_recv(&e, (uint64_t)(100 + i), 0, 0);
  sync_pipe(p);
  enum ibv_wc_status third = !strcmp(mode, "drop") ? IBV_WC_RETRY_EXC_ERR
                             : !strcmp(mode, "corrupt_rkey") ? IBV_WC_REM_ACCESS_ERR : IBV_WC_FATAL_ERR;
  int killq = !strcmp(mode, "kill_qp");
  struct ibv_wc wc[8];
  if (rank == 0) {
    memset(e.buf, 0x77, 8192);
    for (int i = 0; i < 5; i++) post_write(&e, (uint64_t)i, 0, 1000, &peer, (size_t)i * 1000, 1, (uint32_t)i, 0);
    CHECK(wait_wc(e.cq, wc, 5) == 5);
    for (int i = 0; i < 5; i++) {
      CHECK(wc[i].wr_id == (uint64_t)i);
      CHECK(wc[i].status == (i < 2 ? IBV_WC_SUCCESS : i == 2 ? third : IBV_WC_WR_FLUSH_ERR));
    }
    CHECK(qp_state(e.qp) == IBV_QPS_ERR);
    sync_pipe(p);
  } else {
    sync_pipe(p);
    int want = killq ? 8 : 2; /* kill_qp: the link died, the rest is flushed */
    CHECK(wait_wc(e.cq, wc, want) == want);
    for (int i = 0; i < want; i++) {
      CHECK(wc[i].wr_id == (uint64_t)(100 + i));
      CHECK(wc[i].status == (i < 2 ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR));
    }
    CHECK(ibv_poll_cq(e.cq, 1, wc) == 0);
    for (int i = 0; i < 2000; i++) CHECK(e.buf[i] == 0x77);
    for (int i = 2000; i < 5000; i++) CHECK(e.buf[i] == 0); /* the failed writes never landed */
    CHECK(qp_state(e.qp) == (killq ? IBV_QPS_ERR : IBV_QPS_RTS));
  }
  sync_pipe(p);
  end_close(&e);
  return 0;
}

/* ---- one process ------------------------------------------------------- */

/* Open descriptors of this process: teardown must give back every one. */
static int count_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  CHECK(d != NULL);
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static int test_devices(void) {
  int n = 0;
  struct ibv_device** l = ibv_get_device_list(&n);
  CHECK(l && n == 3 && l[3] == NULL);
  CHECK(!strcmp(ibv_get_device_name(l[0]), "mlx5_0") && !strcmp(ibv_get_device_name(l[1]), "mlx5_1"));
  ibv_free_device_list(l);
  struct ibv_context* c0 = open_dev("mlx5_0");
  struct ibv_context* c1 = open_dev("mlx5_1");
  struct ibv_context* c2 = open_dev("mlx5_2");
  struct ibv_device_attr da;
  CHECK(ibv_query_device(c1, &da) == 0 && da.phys_port_cnt == 2);
  struct ibv_port_attr pa;
  CHECK(ibv_query_port(c0, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0);
  uint16_t lid0 = pa.lid;
  CHECK(ibv_query_port(c2, 1, &pa) == 0 && pa.lid != 0 && pa.lid != lid0);
  CHECK(ibv_query_port(c1, 1, &pa) == 0);
  CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len == 4);
  CHECK(ibv_query_port(c1, 2, &pa) == 0 && pa.state == IBV_PORT_DOWN);
  CHECK(ibv_query_port(c0, 2, &pa) != 0);
  struct ibv_gid_entry ge;
  CHECK(ibv_query_gid_ex(c1, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2);
  CHECK(ibv_query_gid_ex(c1, 1, 2, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V1);
  CHECK(ibv_query_gid_ex(c1, 1, 3, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2);
  CHECK(ge.gid.raw[10] == 0xff && ge.gid.raw[11] == 0xff); /* IPv4-mapped */
  CHECK(ibv_query_gid_ex(c0, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_IB);
  CHECK(ibv_query_gid_ex(c0, 1, 1, &ge, 0) != 0);
  union ibv_gid g;
  CHECK(ibv_query_gid(c1, 1, 4, &g) != 0);
  struct ibv_pd* pd = ibv_alloc_pd(c0);
  char buf[64];
  errno = 0;
  CHECK(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
  CHECK(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE) == NULL); /* needs LOCAL_WRITE */
  struct ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  CHECK(mr && mr->addr == buf && mr->length == sizeof(buf));
  struct ibemu_counts cnt;
  ibemu_get_counts(&cnt);
  CHECK(cnt.contexts == 3 && cnt.pds == 1 && cnt.mrs == 1);
  CHECK(ibv_dealloc_pd(pd) == EBUSY);
  struct ibv_comp_channel* ch = ibv_create_comp_channel(c0);
  struct ibv_cq* cq = ibv_create_cq(c0, 16, (void*)buf, ch, 0);
  CHECK(ch && cq && ibv_destroy_comp_channel(ch) == EBUSY);
  CHECK(ibv_req_notify_cq(cq, 0) == 0);
  CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(ch) == 0);
  CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0);
  CHECK(ibv_close_device(c0) == 0 && ibv_close_device(c1) == 0 && ibv_close_device(c2) == 0);
  expect_zero_counts();
  return 0;
}

static int test_qp_states(void) {
  int fds = count_fds();
  struct end a, b;
  end_open(&a, "mlx5_0", 1, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  memset(&b, 0, sizeof(b));
  b = a; /* same context, PD and CQ; its own QP */
  struct ibv_qp* q = make_qp(&a);
  struct ibv_qp_attr at;
  memset(&at, 0, sizeof(at));
  at.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE) == EINVAL); /* RESET -> RTR */
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) == EINVAL); /* no port */
  at.port_num = 2;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == EINVAL);
  CHECK(qp_state(q) == IBV_QPS_RESET);
  qp_init(q, 1);
  CHECK(qp_state(q) == IBV_QPS_INIT);
  struct ibv_sge sg = {(uintptr_t)a.buf, 8, a.mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  CHECK(ibv_post_send(q, &wr, &bad) == EINVAL && bad == &wr); /* not RTS */
  memset(&at, 0, sizeof(at));
  at.qp_state = IBV_QPS_RTS;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == EINVAL); /* INIT -> RTS */
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_4096;
  at.ah_attr.dlid = a.lid;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == EINVAL); /* no dest */
  /* Loopback: q <-> a.qp in one process. */
  struct info ia = end_info(&a), iq = ia;
  iq.qpn = q->qp_num;
  CHECK(qp_rtr_rts(a.qp, &a, &iq, DEFAULT_OPTS) == 0);
  CHECK(qp_rtr_rts(q, &a, &ia, DEFAULT_OPTS) == 0);
  memset(&at, 0, sizeof(at));
  at.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(q, &at, IBV_QP_STATE) == EINVAL); /* RTS -> RTR */
  memcpy(a.buf, "loopback", 8);
  b.qp = q;
  post_write(&b, 3, 0, 8, &ia, 4096, 0, 0, 0);
  struct ibv_wc wc;
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 3);
  CHECK(!memcmp(a.buf + 4096, "loopback", 8));
  /* Bad lkey: a local protection error. */
  sg.lkey ^= 0x1000;
  wr.wr_id = 4;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = ia.addr;
  wr.wr.rdma.rkey = ia.rkey;
  CHECK(ibv_post_send(q, &wr, &bad) == 0);
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 4);
  /* To ERR: posted receives flush; then RESET and INIT again. */
  post_recv(&a, 8, 0, 0);
  memset(&at, 0, sizeof(at));
  at.qp_state = IBV_QPS_ERR;
  CHECK(ibv_modify_qp(a.qp, &at, IBV_QP_STATE) == 0);
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 8);
  at.qp_state = IBV_QPS_RESET;
  CHECK(ibv_modify_qp(a.qp, &at, IBV_QP_STATE) == 0 && qp_state(a.qp) == IBV_QPS_RESET);
  qp_init(a.qp, 1);
  CHECK(ibv_destroy_cq(a.cq) == EBUSY);
  struct ibv_qp_init_attr ud;
  memset(&ud, 0, sizeof(ud));
  ud.send_cq = ud.recv_cq = a.cq;
  ud.qp_type = IBV_QPT_UD;
  ud.cap.max_send_wr = ud.cap.max_recv_wr = 1;
  CHECK(ibv_create_qp(a.pd, &ud) == NULL);
  CHECK(ibv_destroy_qp(q) == 0);
  end_close(&a);
  CHECK(count_fds() == fds);
  return 0;
}

/* Completion events: an armed CQ on a channel signals its fd once per arm. */
static int test_events(void) {
  struct end a;
  end_open(&a, "mlx5_0", 1, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_comp_channel* ch = ibv_create_comp_channel(a.ctx);
  CHECK(ch != NULL);
  int tag;
  struct ibv_cq* cq = ibv_create_cq(a.ctx, 16, &tag, ch, 0);
  CHECK(cq != NULL);
  struct end b = a;
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.send_cq = a.cq;
  ia.recv_cq = cq; /* receive completions go to the evented CQ */
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  CHECK((b.qp = ibv_create_qp(a.pd, &ia)) != NULL);
  qp_init(b.qp, 1);
  struct info ia_ = end_info(&a), ib_ = end_info(&b);
  CHECK(qp_rtr_rts(a.qp, &a, &ib_, DEFAULT_OPTS) == 0);
  CHECK(qp_rtr_rts(b.qp, &a, &ia_, DEFAULT_OPTS) == 0);
  post_recv(&b, 11, 0, 0);
  CHECK(ibv_req_notify_cq(cq, 0) == 0);
  struct pollfd pf = {ch->fd, POLLIN, 0};
  CHECK(poll(&pf, 1, 0) == 0); /* nothing yet */
  post_write(&a, 1, 0, 16, &ib_, 4096, 1, 77, 0);
  CHECK(poll(&pf, 1, WAIT_S * 1000) == 1);
  struct ibv_cq* ev_cq = NULL;
  void* ev_ctx = NULL;
  CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == &tag);
  ibv_ack_cq_events(cq, 1);
  struct ibv_wc wc;
  CHECK(wait_wc(cq, &wc, 1) == 1 && wc.wr_id == 11 && ntohl(wc.imm_data) == 77);
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
  CHECK(poll(&pf, 1, 0) == 0); /* not re-armed: no second event */
  CHECK(ibv_destroy_qp(b.qp) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
  end_close(&a);
  return 0;
}

/* More in flight than the emulator's sockets hold (8192 inline 512-byte
 * writes posted before any is polled, one process): must not deadlock. */
static int test_flood(void) {
  enum { N = 8192, SZ = 512 };
  struct end a;
  end_open(&a, "mlx5_0", 1, (size_t)N * SZ * 2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_cq* big = ibv_create_cq(a.ctx, N, NULL, NULL, 0);
  CHECK(big != NULL);
  struct end b = a;
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.send_cq = ia.recv_cq = big;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = N;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = SZ;
  CHECK((b.qp = ibv_create_qp(a.pd, &ia)) != NULL);
  qp_init(b.qp, 1);
  struct info ia_ = end_info(&a), ib_ = end_info(&b);
  CHECK(qp_rtr_rts(a.qp, &a, &ib_, DEFAULT_OPTS) == 0);
  CHECK(qp_rtr_rts(b.qp, &a, &ia_, DEFAULT_OPTS) == 0);
  for (size_t i = 0; i < (size_t)N * SZ; i++) a.buf[i] = (uint8_t)(i * 7 + (i >> 12));
  for (int i = 0; i < N; i++)
    post_write(&b, (uint64_t)i, (size_t)i * SZ, SZ, &ia_, (size_t)N * SZ + (size_t)i * SZ, 0, 0, IBV_SEND_INLINE);
  static struct ibv_wc wc[N];
  CHECK(wait_wc(big, wc, N) == N);
  for (int i = 0; i < N; i++) CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i);
  CHECK(!memcmp(a.buf, a.buf + (size_t)N * SZ, (size_t)N * SZ));
  CHECK(ibv_destroy_qp(b.qp) == 0);
  CHECK(ibv_destroy_cq(big) == 0);
  end_close(&a);
  return 0;
}

/* A write that reaches a QP not yet in RTR: it lands once the QP gets there
 * within the sender's retry budget, and fails with RETRY_EXC_ERR otherwise. */
static int test_early(void) {
  struct end a, b;
  end_open(&a, "mlx5_0", 1, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  b = a;
  b.qp = make_qp(&a);
  qp_init(b.qp, 1);
  struct info ia = end_info(&a), ib = end_info(&b);
  struct conn_opts slow = DEFAULT_OPTS;
  slow.timeout = 18; /* 1.07 s x 8 */
  CHECK(qp_rtr_rts(b.qp, &a, &ia, slow) == 0);
  memcpy(a.buf + 8, "early!", 6);
  post_write(&b, 1, 8, 6, &ia, 4096, 0, 0, 0); /* a.qp is still in INIT */
  usleep(10000);
  CHECK(qp_rtr_rts(a.qp, &a, &ib, DEFAULT_OPTS) == 0);
  struct ibv_wc wc;
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
  CHECK(!memcmp(a.buf + 4096, "early!", 6));
  /* Never RTR: the retry budget (4.096 us x 2^8 x 3 = 3 ms) runs out. */
  struct ibv_qp* c = make_qp(&a);
  struct ibv_qp* d = make_qp(&a);
  qp_init(c, 1);
  qp_init(d, 1);
  struct info id = ia;
  id.qpn = d->qp_num;
  struct conn_opts fast = DEFAULT_OPTS;
  fast.timeout = 8;
  fast.retry_cnt = 2;
  CHECK(qp_rtr_rts(c, &a, &id, fast) == 0);
  struct ibv_qp* first = b.qp;
  b.qp = c;
  post_write(&b, 2, 8, 6, &ia, 0, 0, 0, 0);
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(qp_state(d) == IBV_QPS_INIT);
  CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0 && ibv_destroy_qp(first) == 0);
  end_close(&a);
  return 0;
}

/* RTR with an address that is not the peer's: sends fail as retries would. */
static int test_wrong_address(void) {
  int fds = count_fds();
  struct end a, b;
  end_open(&a, "mlx5_0", 1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  b = a;
  b.qp = make_qp(&a);
  qp_init(b.qp, 1);
  struct info ia = end_info(&a), ib = end_info(&b);
  struct info wrong = ia;
  wrong.lid = (uint16_t)(ia.lid + 100);
  CHECK(qp_rtr_rts(a.qp, &a, &ib, DEFAULT_OPTS) == 0);
  CHECK(qp_rtr_rts(b.qp, &a, &wrong, DEFAULT_OPTS) == 0);
  post_write(&b, 1, 0, 8, &ia, 0, 0, 0, 0);
  struct ibv_wc wc;
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_RETRY_EXC_ERR);
  /* A QP number nobody owns. */
  struct ibv_qp* c = make_qp(&a);
  qp_init(c, 1);
  struct info none = ia;
  none.qpn = 1;
  CHECK(qp_rtr_rts(c, &a, &none, DEFAULT_OPTS) == 0);
  struct ibv_qp* first = b.qp;
  b.qp = c;
  post_write(&b, 2, 0, 8, &ia, 0, 0, 0, 0);
  CHECK(wait_wc(a.cq, &wc, 1) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(ibv_destroy_qp(c) == 0);
  CHECK(ibv_destroy_qp(first) == 0);
  end_close(&a);
  CHECK(count_fds() == fds);
  return 0;
}

/* COLLIE_IBEMU_REPORT: a clean child reports zeros, a leaky one its leaks. */
static int test_report(void) {
  char dir[] = "/tmp/ibemu-report-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char pattern_path[128];
  snprintf(pattern_path, sizeof(pattern_path), "%s/counts.%%p", dir);
  setenv("COLLIE_IBEMU_REPORT", pattern_path, 1);
  int ok = 1;
  for (int leak = 0; leak < 2; leak++) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      struct end e;
      end_open(&e, "mlx5_0", 1, 4096, IBV_ACCESS_LOCAL_WRITE);
      if (!leak) { end_close(&e); exit(0); }
      CHECK(ibv_destroy_qp(e.qp) == 0);
      CHECK(ibv_destroy_cq(e.cq) == 0);
      exit(0); /* context, PD and MR left behind */
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char path[160], text[256] = {0};
    snprintf(path, sizeof(path), "%s/counts.%d", dir, (int)pid);
    FILE* f = fopen(path, "r");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    unlink(path);
    CHECK(n > 0);
    const char* want = leak ? "contexts 1\npds 1\nmrs 1\ncqs 0\nqps 0\nchannels 0\n"
                            : "contexts 0\npds 0\nmrs 0\ncqs 0\nqps 0\nchannels 0\n";
    if (strcmp(text, want) != 0) { fprintf(stderr, "report %s:\n%s", path, text); ok = 0; }
  }
  rmdir(dir);
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s devices|qp_states|wrong_address|events|flood|early|pair DEV PORT|access bounds|flags|"
                    "rnr exceeded|late|peer_killed|fail drop|corrupt_rkey|kill_qp|report|dmabuf\n", argv[0]);
    return 2;
  }
  const char* t = argv[1];
  const char* const* args = (const char* const*)argv + 2;
  int rc;
  if (!strcmp(t, "devices")) rc = test_devices();
  else if (!strcmp(t, "qp_states")) rc = test_qp_states();
  else if (!strcmp(t, "wrong_address")) rc = test_wrong_address();
  else if (!strcmp(t, "events")) rc = test_events();
  else if (!strcmp(t, "flood")) rc = test_flood();
  else if (!strcmp(t, "early")) rc = test_early();
  else if (!strcmp(t, "report")) rc = test_report();
  else if (!strcmp(t, "pair") && argc == 4) rc = run_two(side_pair, args, 0);
  else if (!strcmp(t, "access") && argc == 3) rc = run_two(side_access, args, 0);
  else if (!strcmp(t, "rnr") && argc == 3) rc = run_two(side_rnr, args, 0);
  else if (!strcmp(t, "peer_killed")) rc = run_two(side_peer_killed, args, 1);
  else if (!strcmp(t, "fail") && argc == 3) rc = run_two(side_fail, args, 0);
  else if (!strcmp(t, "dmabuf")) rc = run_two(side_dmabuf, args, 0);
  else { fprintf(stderr, "unknown case %s\n", t); return 2; }
  if (rc == 0) printf("PASS %s\n", t);
  return rc;
}
