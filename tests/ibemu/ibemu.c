/* ibemu: a libibverbs emulator for tests (libibemu.so, never installed).
 * Exports the subset of the verbs API that collie's IB transport
 * (src/transport/net_ib*.c) loads with dlopen, compiled against Debian's real
 * <infiniband/verbs.h> so the ABI (struct layouts, the function pointers in
 * struct ibv_context that the inline ibv_post_send/ibv_post_recv/ibv_poll_cq
 * call) is the real one. Tests: tests/ibemu/test_ibemu.c. Design notes:
 * docs/ARCHITECTURE.md does not cover it; the comment below does.
 *
 * The "wire". Every QP binds an abstract Unix socket "collie-ibemu/qp/<qpn>";
 * the bind is what makes the QP number unique on the machine (and the name
 * disappears with the process, so nothing is left behind). modify_qp(RTR)
 * connects to the peer's socket named by dest_qp_num and sends a HELLO with
 * the address the application put in ah_attr; the peer checks it against its
 * own port (LID for IB, a GID of its table for RoCE) before accepting data.
 * So each QP has an outgoing stream (its requests, the peer's acks) and an
 * incoming one (the peer's requests, its acks), both in order.
 *
 * Data. A request carries the sender's (lkey-checked) scatter list, not the
 * bytes: the responder checks rkey, bounds, MR and QP access flags, then pulls
 * the bytes straight into its memory with process_vm_readv from the sender
 * (one copy, like the HCA's DMA; the pid comes from SO_PEERCRED). Inline sends
 * carry the bytes. Immediate data consumes a posted receive; none posted ->
 * receiver-not-ready: the request waits min_rnr_timer and is retried up to the
 * sender's rnr_retry (7 = forever), then RNR_RETRY_EXC_ERR.
 *
 * Progress. A real HCA moves data and acks without the application's CPU, and
 * transports rely on that (a sender may wait on its send completion while the
 * receiver waits on something else). So each process runs one progress
 * thread while it has QPs (started with the first, joined with the last): it
 * accepts connections, serves requests, turns acks into completions and runs
 * the RNR / lost-packet timers. poll_cq only takes completions off the CQ. One
 * mutex guards all emulator state.
 *
 * Failures. A peer whose stream ends without a BYE (the process died, or an
 * injected kill_qp) moves the QP to the error state: the oldest outstanding
 * send completes with RETRY_EXC_ERR, all other WRs with WR_FLUSH_ERR.
 * COLLIE_IBEMU_FAIL=drop:N|corrupt_rkey:N|kill_qp:N acts on the process's
 * (N+1)-th RDMA write. COLLIE_IBEMU_DEVICES names the HCAs, e.g.
 * "mlx5_0:1,mlx5_1:2:roce,mlx5_2:2:ib:down=2"; COLLIE_IBEMU_SYSFS=dir makes
 * each device's ibdev_path dir/<name> (fake sysfs for locality tests). COLLIE_IBEMU_REPORT=path
 * ("%p" -> pid) gets the live object counts when the library unloads. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_get_device_list

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ibemu.h"

#define EXPORT __attribute__((visibility("default")))

enum { MAX_DEVS = 8, MAX_PORTS = 4, ROCE_GIDS = 4, MAX_SGE = 16, MAX_INLINE = 512,
       MAX_WR = 16384, MAX_FRAME = 1 << 20 };

struct emu_dev {
  struct ibv_device ibv; /* first: the ibv_device* handed out points here */
  int index, nports, roce;
  unsigned down_mask; /* bit p set: port p is DOWN */
};

struct emu_ctx {
  struct ibv_context ibv;
  struct emu_dev* dev;
  int async_wfd;
};

struct emu_mr {
  struct ibv_mr ibv;
  struct emu_mr* next;
  uint64_t iova;
  int access;
  uint8_t* base;   /* where iova maps to in this process: the user's memory, or the dma-buf's mapping */
  size_t map_len;  /* dma-buf MRs: the mapping to unmap at deregistration (0: none) */
};

struct emu_cq {
  struct ibv_cq ibv;
  struct emu_cq* next;
  struct ibv_wc* q;
  size_t head, n, cap;
  int armed;
};

struct emu_chan {
  struct ibv_comp_channel ibv;
  struct emu_chan* next;
  int wfd;
};

/* On the wire (same machine, same ABI on both ends). */
enum { W_HELLO = 1, W_REQ, W_ACK, W_BYE };
struct wire_hdr { uint32_t type, len; };
struct wire_hello {
  struct wire_hdr h;
  uint32_t src_qpn, dst_qpn, link_layer, is_global, dlid, pad;
  uint8_t dgid[16];
};
struct wire_req {
  struct wire_hdr h;
  uint64_t seq, raddr, total;
  uint32_t opcode, rkey, imm, nsge, inl, rnr_retry;
  uint64_t lost_ns; /* the sender's retry budget: 4.096 us x 2^timeout x (retry_cnt + 1) */
};
struct wire_sge { uint64_t addr, len; };
struct wire_ack { struct wire_hdr h; uint64_t seq; uint32_t status, pad; };

struct sq_ent { uint64_t wr_id, seq; uint32_t len; enum ibv_wc_opcode op; int signaled; };
struct rq_ent { uint64_t wr_id; int nsge; struct ibv_sge sge[MAX_SGE]; };
struct inreq {
  struct inreq* next;
  struct wire_req r;
  struct wire_sge* sge; /* r.nsge entries, then r.inl inline bytes */
  int rnr_tries;
  uint64_t hold_deadline; /* waiting for this QP's RTR: give up then */
  uint64_t rnr_deadline;
};
struct rbuf { uint8_t* p; size_t len, cap; };

struct emu_qp {
  struct ibv_qp ibv;
  struct emu_qp* next;
  uint64_t id;
  struct emu_dev* dev;
  int sq_sig_all;
  struct ibv_qp_cap cap;
  uint8_t port, timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic, max_dest_rd_atomic;
  int access;
  uint16_t pkey_index;
  enum ibv_mtu mtu;
  uint32_t dest_qpn, rq_psn, sq_psn;
  struct ibv_ah_attr ah;
  int lfd, ofd, ifd;
  struct rbuf ob, ib;     /* what came in on ofd / ifd, not yet a whole frame */
  struct rbuf ow, iw;     /* what could not be sent yet on ofd / ifd: writers never
                             block while holding E.mu (the thread flushes) */
  int no_path, peer_gone, have_hello;
  int in_bye;             /* the current incoming stream said goodbye */
  struct wire_hello hello;
  pid_t in_pid;
  struct sq_ent* sq;
  uint32_t sq_head, sq_n;
  uint64_t post_seq;
  struct rq_ent* rq;
  uint32_t rq_head, rq_n;
  struct inreq *inq, *inq_tail;
  int lost;              /* LOST_*: an injected fault holds the send queue at lost_seq */
  uint64_t lost_seq, lost_deadline;
  int in_broken;         /* refused a request: drop the rest, as a real responder
                            NAKs everything after the PSN it failed on */
};
enum { LOST_NONE, LOST_DROP, LOST_KILL };

enum { FAIL_NONE, FAIL_DROP, FAIL_CORRUPT_RKEY, FAIL_KILL_QP };

static struct {
  pthread_once_t once;
  struct emu_dev devs[MAX_DEVS];
  int ndevs;
  int fail_kind, fail_fired;
  long fail_after, writes;
  pthread_mutex_t mu; /* everything below */
  struct emu_mr* mrs;
  struct emu_cq* cqs;
  struct emu_chan* chans;
  struct emu_qp* qps;
  uint32_t next_key, next_handle;
  uint64_t next_qp_id;
  atomic_uint qpn_seq; /* QP numbers are handed out in sequence, never reused soon */
  struct ibemu_counts n;
  pthread_mutex_t thr_mu; /* progress thread start/stop; taken before mu */
  pthread_t thr;
  int thr_running;
  atomic_int stop;
  int wake[2];
} E = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER,
       .thr_mu = PTHREAD_MUTEX_INITIALIZER, .wake = {-1, -1}};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- configuration ---------------------------------------------------- */

static int parse_devices(const char* spec) {
  char* s = strdup(spec);
  if (!s) return -1;
  int rc = 0;
  char* save = NULL;
  for (char* tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (E.ndevs == MAX_DEVS) { rc = -1; break; }
    struct emu_dev* d = &E.devs[E.ndevs];
    memset(d, 0, sizeof(*d));
    d->nports = 1;
    char* save2 = NULL;
    char* name = strtok_r(tok, ":", &save2);
    if (!name || !*name || strlen(name) >= sizeof(d->ibv.name)) { rc = -1; break; }
    snprintf(d->ibv.name, sizeof(d->ibv.name), "%s", name);
    for (char* f = strtok_r(NULL, ":", &save2); f; f = strtok_r(NULL, ":", &save2)) {
      if (!strcmp(f, "ib")) d->roce = 0;
      else if (!strcmp(f, "roce") || !strcmp(f, "eth")) d->roce = 1;
      else if (!strncmp(f, "down=", 5) && f[5] >= '1' && f[5] <= '0' + MAX_PORTS) d->down_mask |= 1u << (f[5] - '0');
      else if (f[0] >= '1' && f[0] <= '0' + MAX_PORTS && !f[1]) d->nports = f[0] - '0';
      else { rc = -1; break; }
    }
    if (rc) break;
    d->index = E.ndevs;
    d->ibv.node_type = IBV_NODE_CA;
    d->ibv.transport_type = IBV_TRANSPORT_IB;
    snprintf(d->ibv.dev_name, sizeof(d->ibv.dev_name), "uverbs%d", d->index);
    snprintf(d->ibv.dev_path, sizeof(d->ibv.dev_path), "/sys/class/infiniband_verbs/uverbs%d", d->index);
    /* COLLIE_IBEMU_SYSFS=dir: the device's sysfs directory is dir/<name> (a
     * test puts device/local_cpulist there to give the HCA a locality). */
    const char* sysfs = getenv("COLLIE_IBEMU_SYSFS");
    snprintf(d->ibv.ibdev_path, sizeof(d->ibv.ibdev_path), "%s/%s", sysfs && *sysfs ? sysfs : "/sys/class/infiniband",
             name);
    E.ndevs++;
  }
  free(s);
  return rc;
}

static void init_once(void) {
  const char* spec = getenv("COLLIE_IBEMU_DEVICES");
  if (parse_devices(spec && *spec ? spec : "mlx5_0:1") != 0) {
    fprintf(stderr, "ibemu: cannot parse COLLIE_IBEMU_DEVICES='%s' (name[:ports][:ib|:roce][:down=P],...); no devices\n",
            spec ? spec : "");
    E.ndevs = 0;
  }
  const char* f = getenv("COLLIE_IBEMU_FAIL");
  if (f && *f) {
    static const struct { const char* name; int kind; } kinds[] = {
        {"drop:", FAIL_DROP}, {"corrupt_rkey:", FAIL_CORRUPT_RKEY}, {"kill_qp:", FAIL_KILL_QP}};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
      size_t l = strlen(kinds[i].name);
      if (!strncmp(f, kinds[i].name, l)) {
        char* end;
        long n = strtol(f + l, &end, 10);
        if (*end == '\0' && n >= 0) { E.fail_kind = kinds[i].kind; E.fail_after = n; }
      }
    }
    if (E.fail_kind == FAIL_NONE) fprintf(stderr, "ibemu: ignoring COLLIE_IBEMU_FAIL='%s'\n", f);
  }
  E.next_key = ((uint32_t)getpid() & 0xff) | 0x100;
  /* The responder reads the requester's memory (process_vm_readv): let any
   * process of this user do so even under Yama ptrace_scope=1. */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

static void ensure_init(void) { pthread_once(&E.once, init_once); }

static uint16_t port_lid(const struct emu_dev* d, int port) {
  return d->roce ? 0 : (uint16_t)(1 + d->index * 16 + port);
}

static int gid_count(const struct emu_dev* d) { return d->roce ? ROCE_GIDS : 1; }

/* GID index i of a port: IB has one (fe80::guid); RoCE has v1/v2 pairs,
 * link-local first then an IPv4-mapped address (as mlx5 lists them). */
static void port_gid(const struct emu_dev* d, int port, int i, union ibv_gid* g, uint32_t* type) {
  memset(g, 0, sizeof(*g));
  if (!d->roce || i < 2) {
    g->raw[0] = 0xfe; g->raw[1] = 0x80;
    g->raw[8] = 0x02; g->raw[9] = 0xc9; g->raw[10] = 0x03;
    g->raw[13] = (uint8_t)d->index; g->raw[14] = (uint8_t)port; g->raw[15] = 0x01;
  } else {
    g->raw[10] = 0xff; g->raw[11] = 0xff;
    g->raw[12] = 10; g->raw[13] = (uint8_t)(d->index + 1); g->raw[14] = (uint8_t)port; g->raw[15] = 1;
  }
  *type = !d->roce ? IBV_GID_TYPE_IB : (i % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1);
}

static int port_ok(const struct emu_dev* d, int port) { return port >= 1 && port <= d->nports; }

/* ---- devices and contexts --------------------------------------------- */

EXPORT struct ibv_device** ibv_get_device_list(int* num) {
  ensure_init();
  struct ibv_device** l = calloc((size_t)E.ndevs + 1, sizeof(*l));
  if (!l) { errno = ENOMEM; return NULL; }
  for (int i = 0; i < E.ndevs; i++) l[i] = &E.devs[i].ibv;
  if (num) *num = E.ndevs;
  return l;
}

EXPORT void ibv_free_device_list(struct ibv_device** list) { free(list); }
EXPORT const char* ibv_get_device_name(struct ibv_device* d) { return d ? d->name : NULL; }
EXPORT int ibv_get_device_index(struct ibv_device* d) { return ((struct emu_dev*)d)->index; }
EXPORT __be64 ibv_get_device_guid(struct ibv_device* d) {
  uint64_t g = 0x0002c90300000000ull | ((uint64_t)((struct emu_dev*)d)->index << 8);
  return htobe64(g);
}
EXPORT int ibv_fork_init(void) { return 0; }

static int ops_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad);
EXPORT const char* ibv_wc_status_str(enum ibv_wc_status s);
static int ops_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad);
static int ops_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc);
static int ops_req_notify_cq(struct ibv_cq* cq, int solicited_only);

EXPORT struct ibv_context* ibv_open_device(struct ibv_device* device) {
  ensure_init();
  struct emu_ctx* c = calloc(1, sizeof(*c));
  int p[2] = {-1, -1};
  if (!c || pipe2(p, O_CLOEXEC) != 0) { free(c); errno = ENOMEM; return NULL; }
  c->dev = (struct emu_dev*)device;
  c->ibv.device = device;
  c->ibv.ops.post_send = ops_post_send;
  c->ibv.ops.post_recv = ops_post_recv;
  c->ibv.ops.poll_cq = ops_poll_cq;
  c->ibv.ops.req_notify_cq = ops_req_notify_cq;
  c->ibv.cmd_fd = -1;
  c->ibv.async_fd = p[0]; /* no async events are ever raised */
  c->async_wfd = p[1];
  c->ibv.num_comp_vectors = 1;
  c->ibv.abi_compat = NULL; /* not extended: inline wrappers use the exports */
  pthread_mutex_init(&c->ibv.mutex, NULL);
  pthread_mutex_lock(&E.mu);
  E.n.contexts++;
  pthread_mutex_unlock(&E.mu);
  return &c->ibv;
}

EXPORT int ibv_close_device(struct ibv_context* ctx) {
  struct emu_ctx* c = (struct emu_ctx*)ctx;
  close(c->ibv.async_fd);
  close(c->async_wfd);
  pthread_mutex_destroy(&c->ibv.mutex);
  free(c);
  pthread_mutex_lock(&E.mu);
  E.n.contexts--;
  pthread_mutex_unlock(&E.mu);
  return 0;
}

EXPORT int ibv_get_async_event(struct ibv_context* ctx, struct ibv_async_event* ev) {
  char b;
  ssize_t r = read(ctx->async_fd, &b, 1); /* blocks, or EAGAIN when non-blocking */
  (void)ev;
  if (r >= 0) errno = EIO;
  return -1;
}
EXPORT void ibv_ack_async_event(struct ibv_async_event* ev) { (void)ev; }

EXPORT int ibv_query_device(struct ibv_context* ctx, struct ibv_device_attr* a) {
  struct emu_dev* d = ((struct emu_ctx*)ctx)->dev;
  memset(a, 0, sizeof(*a));
  snprintf(a->fw_ver, sizeof(a->fw_ver), "20.99.%d (ibemu)", d->index);
  a->node_guid = ibv_get_device_guid(&d->ibv);
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = ~0ull;
  a->page_size_cap = 0xfffff000;
  a->vendor_id = 0x02c9;
  a->vendor_part_id = 4123;
  a->max_qp = 1 << 17;
  a->max_qp_wr = MAX_WR;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  a->max_sge = MAX_SGE;
  a->max_cq = 1 << 16;
  a->max_cqe = 1 << 22;
  a->max_mr = 1 << 20;
  a->max_pd = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->max_res_rd_atom = 1 << 20;
  a->max_pkeys = 1;
  a->phys_port_cnt = (uint8_t)d->nports;
  return 0;
}

/* The inline ibv_query_port (non-extended context) memsets the caller's
 * struct and calls this with the older, shorter layout: fill only that. */
EXPORT int ibv_query_port(struct ibv_context* ctx, uint8_t port, struct _compat_ibv_port_attr* out) {
  struct emu_dev* d = ((struct emu_ctx*)ctx)->dev;
  if (!port_ok(d, port)) return EINVAL;
  struct ibv_port_attr a;
  memset(&a, 0, sizeof(a));
  int down = (d->down_mask >> port) & 1;
  a.state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = IBV_MTU_4096;
  a.gid_tbl_len = gid_count(d);
  a.port_cap_flags = d->roce ? 0 : IBV_PORT_SM; /* a plausible capability word */
  a.max_msg_sz = 1u << 30;
  a.pkey_tbl_len = 1;
  a.lid = port_lid(d, port);
  a.sm_lid = d->roce ? 0 : 1;
  a.max_vl_num = 4;
  a.active_width = 2;   /* 4x */
  a.active_speed = 32;  /* EDR */
  a.phys_state = down ? 3 /* disabled */ : 5 /* link up */;
  a.link_layer = d->roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  memcpy(out, &a, offsetof(struct ibv_port_attr, flags));
  return 0;
}

EXPORT int ibv_query_gid(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid) {
  struct emu_dev* d = ((struct emu_ctx*)ctx)->dev;
  uint32_t type;
  if (!port_ok(d, port) || index < 0 || index >= gid_count(d)) return -1;
  port_gid(d, port, index, gid, &type);
  return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context* ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry* e, uint32_t flags, size_t entry_size) {
  struct emu_dev* d = ((struct emu_ctx*)ctx)->dev;
  if (flags || entry_size < sizeof(*e)) return EINVAL;
  if (port > 255 || !port_ok(d, (int)port) || index >= (uint32_t)gid_count(d)) return ENODATA;
  memset(e, 0, sizeof(*e));
  port_gid(d, (int)port, (int)index, &e->gid, &e->gid_type);
  e->gid_index = index;
  e->port_num = port;
  e->ndev_ifindex = d->roce ? 1 : 0;
  return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context* ctx, struct ibv_gid_entry* entries,
                                    size_t max, uint32_t flags, size_t entry_size) {
  struct emu_dev* d = ((struct emu_ctx*)ctx)->dev;
  size_t n = 0;
  if (flags || entry_size < sizeof(*entries)) return -EINVAL;
  for (int p = 1; p <= d->nports; p++)
    for (int i = 0; i < gid_count(d); i++) {
      if (n == max) return -ENOMEM;
      _ibv_query_gid_ex(ctx, (uint32_t)p, (uint32_t)i, &entries[n++], 0, sizeof(*entries));
    }
  return (ssize_t)n;
}

EXPORT int ibv_query_pkey(struct ibv_context* ctx, uint8_t port, int index, __be16* pkey) {
  if (!port_ok(((struct emu_ctx*)ctx)->dev, port) || index != 0) return -1;
  *pkey = htobe16(0xffff);
  return 0;
}

/* ---- protection domains and memory regions ----------------------------- */

EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* ctx) {
  struct ibv_pd* pd = calloc(1, sizeof(*pd));
  if (!pd) { errno = ENOMEM; return NULL; }
  pd->context = ctx;
  pthread_mutex_lock(&E.mu);
  pd->handle = ++E.next_handle;
  E.n.pds++;
  pthread_mutex_unlock(&E.mu);
  return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  pthread_mutex_lock(&E.mu);
  int busy = 0;
  for (struct emu_mr* m = E.mrs; m; m = m->next) busy |= m->ibv.pd == pd;
  for (struct emu_qp* q = E.qps; q; q = q->next) busy |= q->ibv.pd == pd;
  if (!busy) E.n.pds--;
  pthread_mutex_unlock(&E.mu);
  if (busy) return EBUSY;
  free(pd);
  return 0;
}

static void mr_add(struct emu_mr* m);

EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                       unsigned int access) {
  int remote = access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  if (!pd || !addr || length == 0 || (remote && !(access & IBV_ACCESS_LOCAL_WRITE))) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_mr* m = calloc(1, sizeof(*m));
  if (!m) { errno = ENOMEM; return NULL; }
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = addr;
  m->ibv.length = length;
  m->iova = iova;
  m->access = (int)access;
  m->base = addr;
  mr_add(m);
  return &m->ibv;
}

/* With the MR filled in: gives it keys and links it (takes E.mu). */
static void mr_add(struct emu_mr* m) {
  pthread_mutex_lock(&E.mu);
  /* Keys stay below 2^31 so a corrupted key (bit 31 flipped) never names an MR. */
  E.next_key += 0x100;
  m->ibv.lkey = m->ibv.rkey = E.next_key & 0x7fffffff;
  m->ibv.handle = ++E.next_handle;
  m->next = E.mrs;
  E.mrs = m;
  E.n.mrs++;
  E.n.mr_regs++;
  if (m->map_len) E.n.dmabuf_regs++;
  pthread_mutex_unlock(&E.mu);
}

EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

EXPORT struct ibv_mr* ibv_reg_mr_iova(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                      int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

/* dma-buf registration (GPUDirect RDMA): [offset, offset+length) of the
 * buffer behind fd, addressed by the HCA as [iova, iova+length). There is no
 * GPU here: the emulator maps the fd (tests pass a memfd standing for device
 * memory) and reads and writes through that mapping, so the registering
 * process's own view of those addresses, if any, is never used. Like a real
 * dma-buf MR it holds its own reference: fd may be closed after this.
 * COLLIE_IBEMU_DMABUF=0 answers EOPNOTSUPP, as an HCA driver without
 * dma-buf support does. */
EXPORT struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length,
                                        uint64_t iova, int fd, int access) {
  const char* off = getenv("COLLIE_IBEMU_DMABUF");
  if (off && strcmp(off, "0") == 0) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  int remote = access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  long pg = sysconf(_SC_PAGESIZE);
  if (!pd || fd < 0 || length == 0 || (remote && !(access & IBV_ACCESS_LOCAL_WRITE)) || offset % (uint64_t)pg) {
    errno = EINVAL;
    return NULL;
  }
  void* map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
  if (map == MAP_FAILED) return NULL; /* errno from mmap (EBADF, ENODEV: not a mappable buffer) */
  struct emu_mr* m = calloc(1, sizeof(*m));
  if (!m) { munmap(map, length); errno = ENOMEM; return NULL; }
  m->ibv.context = pd->context;
  m->ibv.pd = pd;
  m->ibv.addr = (void*)(uintptr_t)offset; /* as rdma-core fills it for dma-buf MRs */
  m->ibv.length = length;
  m->iova = iova;
  m->access = access;
  m->base = map;
  m->map_len = length;
  mr_add(m);
  return &m->ibv;
}

EXPORT int ibv_rereg_mr(struct ibv_mr* mr, int flags, struct ibv_pd* pd, void* addr, size_t length,
                        int access) {
  (void)mr; (void)flags; (void)pd; (void)addr; (void)length; (void)access;
  return EOPNOTSUPP;
}

EXPORT int ibv_dereg_mr(struct ibv_mr* mr) {
  pthread_mutex_lock(&E.mu);
  struct emu_mr** pp = &E.mrs;
  while (*pp && &(*pp)->ibv != mr) pp = &(*pp)->next;
  int found = *pp != NULL;
  if (found) { *pp = (*pp)->next; E.n.mrs--; }
  pthread_mutex_unlock(&E.mu);
  if (!found) return EINVAL;
  struct emu_mr* m = (struct emu_mr*)mr;
  if (m->map_len) munmap(m->base, m->map_len);
  free(m);
  return 0;
}

/* With E.mu held. */
static struct emu_mr* mr_find(uint32_t key, struct ibv_pd* pd) {
  for (struct emu_mr* m = E.mrs; m; m = m->next)
    if (m->ibv.lkey == key) return m->ibv.pd == pd ? m : NULL;
  return NULL;
}

/* Translates [addr, addr+len) of the MR's address space (its iova) to a
 * pointer, or NULL when it is outside the region. */
static uint8_t* mr_range(struct emu_mr* m, uint64_t addr, uint64_t len) {
  if (addr < m->iova || len > m->ibv.length || addr - m->iova > m->ibv.length - len) return NULL;
  return m->base + (addr - m->iova);
}

/* ---- completion channels and queues ------------------------------------ */

EXPORT struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* ctx) {
  struct emu_chan* ch = calloc(1, sizeof(*ch));
  int p[2];
  if (!ch || pipe2(p, O_CLOEXEC) != 0) { free(ch); errno = ENOMEM; return NULL; }
  ch->ibv.context = ctx;
  ch->ibv.fd = p[0];
  ch->wfd = p[1];
  fcntl(ch->wfd, F_SETFL, O_NONBLOCK);
  pthread_mutex_lock(&E.mu);
  ch->next = E.chans;
  E.chans = ch;
  E.n.channels++;
  pthread_mutex_unlock(&E.mu);
  return &ch->ibv;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel* channel) {
  struct emu_chan* ch = (struct emu_chan*)channel;
  pthread_mutex_lock(&E.mu);
  int busy = 0;
  for (struct emu_cq* c = E.cqs; c; c = c->next) busy |= c->ibv.channel == channel;
  struct emu_chan** pp = &E.chans;
  while (*pp && *pp != ch) pp = &(*pp)->next;
  if (!busy && *pp) { *pp = ch->next; E.n.channels--; }
  pthread_mutex_unlock(&E.mu);
  if (busy) return EBUSY;
  close(ch->ibv.fd);
  close(ch->wfd);
  free(ch);
  return 0;
}

EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* ctx, int cqe, void* cq_context,
                                    struct ibv_comp_channel* channel, int comp_vector) {
  if (cqe < 1 || cqe > (1 << 22) || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_cq* c = calloc(1, sizeof(*c));
  if (!c) { errno = ENOMEM; return NULL; }
  c->ibv.context = ctx;
  c->ibv.channel = channel;
  c->ibv.cq_context = cq_context;
  c->ibv.cqe = cqe;
  pthread_mutex_init(&c->ibv.mutex, NULL);
  pthread_cond_init(&c->ibv.cond, NULL);
  pthread_mutex_lock(&E.mu);
  c->ibv.handle = ++E.next_handle;
  c->next = E.cqs;
  E.cqs = c;
  E.n.cqs++;
  pthread_mutex_unlock(&E.mu);
  return &c->ibv;
}

EXPORT int ibv_resize_cq(struct ibv_cq* cq, int cqe) { (void)cq; (void)cqe; return EOPNOTSUPP; }

EXPORT int ibv_destroy_cq(struct ibv_cq* cq) {
  struct emu_cq* c = (struct emu_cq*)cq;
  pthread_mutex_lock(&E.mu);
  int busy = 0;
  for (struct emu_qp* q = E.qps; q; q = q->next) busy |= q->ibv.send_cq == cq || q->ibv.recv_cq == cq;
  struct emu_cq** pp = &E.cqs;
  while (*pp && *pp != c) pp = &(*pp)->next;
  if (!busy && *pp) { *pp = c->next; E.n.cqs--; }
  pthread_mutex_unlock(&E.mu);
  if (busy) return EBUSY;
  pthread_mutex_destroy(&c->ibv.mutex);
  pthread_cond_destroy(&c->ibv.cond);
  free(c->q);
  free(c);
  return 0;
}

/* With E.mu held. The queue grows instead of overrunning (a real CQ would
 * raise an async CQ error; collie sizes its CQs so that cannot happen). */
static void cq_push(struct ibv_cq* cq, const struct ibv_wc* wc) {
  struct emu_cq* c = (struct emu_cq*)cq;
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    struct ibv_wc* q = malloc(cap * sizeof(*q));
    if (!q) { fprintf(stderr, "ibemu: out of memory growing a CQ; completion lost\n"); return; }
    for (size_t i = 0; i < c->n; i++) q[i] = c->q[(c->head + i) % c->cap];
    free(c->q);
    c->q = q;
    c->cap = cap;
    c->head = 0;
  }
  c->q[(c->head + c->n) % c->cap] = *wc;
  c->n++;
  if (c->armed && c->ibv.channel) {
    struct emu_chan* ch = (struct emu_chan*)c->ibv.channel;
    c->armed = 0;
    ssize_t w = write(ch->wfd, &cq, sizeof(cq));
    (void)w; /* a full pipe means events are already pending */
  }
}

static int ops_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc) {
  struct emu_cq* c = (struct emu_cq*)cq;
  int k = 0;
  pthread_mutex_lock(&E.mu);
  while (k < n && c->n > 0) {
    wc[k++] = c->q[c->head];
    c->head = (c->head + 1) % c->cap;
    c->n--;
  }
  pthread_mutex_unlock(&E.mu);
  return k;
}

static int ops_req_notify_cq(struct ibv_cq* cq, int solicited_only) {
  struct emu_cq* c = (struct emu_cq*)cq;
  (void)solicited_only;
  if (!cq->channel) return EINVAL;
  pthread_mutex_lock(&E.mu);
  c->armed = 1;
  pthread_mutex_unlock(&E.mu);
  return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** cq_context) {
  struct ibv_cq* c;
  ssize_t r = read(channel->fd, &c, sizeof(c));
  if (r != (ssize_t)sizeof(c)) return -1;
  *cq = c;
  *cq_context = c->cq_context;
  return 0;
}

EXPORT void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&E.mu);
  cq->comp_events_completed += nevents;
  pthread_mutex_unlock(&E.mu);
}

/* ---- the wire ---------------------------------------------------------- */

static socklen_t qp_addr(uint32_t qpn, struct sockaddr_un* a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  int l = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "collie-ibemu/qp/%u", qpn);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)l);
}

static void wake_thread(void);

static int wbuf_put(struct rbuf* w, const void* p, size_t n) {
  if (n == 0) return 0;
  if (w->cap - w->len < n) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap - w->len < n) cap *= 2;
    uint8_t* q = realloc(w->p, cap);
    if (!q) return -1;
    w->p = q;
    w->cap = cap;
  }
  memcpy(w->p + w->len, p, n);
  w->len += n;
  return 0;
}

/* Sends what is queued in w without blocking; 0, or -1 when the peer is gone. */
static int wire_flush(int fd, struct rbuf* w) {
  size_t off = 0;
  while (off < w->len) {
    ssize_t r = send(fd, w->p + off, w->len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) break;
    if (r < 0) return -1;
    off += (size_t)r;
  }
  if (off) memmove(w->p, w->p + off, w->len - off);
  w->len -= off;
  return 0;
}

/* Sends a frame (a then b) in order after anything already queued in w; what
 * the socket does not take now is queued for the progress thread. 0, or -1
 * when the peer is gone. */
static int wire_send(int fd, struct rbuf* w, const void* a, size_t alen, const void* b, size_t blen) {
  size_t done = 0;
  if (fd < 0) return -1;
  if (w->len == 0) {
    struct iovec iov[2] = {{(void*)a, alen}, {(void*)b, blen}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = blen ? 2 : 1};
    ssize_t r;
    do r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT); while (r < 0 && errno == EINTR);
    if (r < 0 && errno != EAGAIN) return -1;
    if (r > 0) done = (size_t)r;
  }
  if (done >= alen + blen) return 0;
  if (done < alen && wbuf_put(w, (const uint8_t*)a + done, alen - done) != 0) return -1;
  size_t bdone = done > alen ? done - alen : 0;
  if (wbuf_put(w, (const uint8_t*)b + bdone, blen - bdone) != 0) return -1;
  wake_thread(); /* it polls for room now */
  return 0;
}

static void wire_bye(int fd, struct rbuf* w) {
  struct wire_hdr h = {W_BYE, sizeof(h)};
  if (wire_send(fd, w, &h, sizeof(h), NULL, 0) == 0 && fd >= 0) (void)wire_flush(fd, w);
}

static void wire_ack(struct emu_qp* q, uint64_t seq, uint32_t status) {
  struct wire_ack a = {{W_ACK, sizeof(a)}, seq, status, 0};
  (void)wire_send(q->ifd, &q->iw, &a, sizeof(a), NULL, 0); /* a lost ack: the peer is gone */
}

/* Reads what is there into b; 1 if the stream ended or broke. */
static int rbuf_fill(int fd, struct rbuf* b) {
  for (;;) {
    if (b->cap - b->len < 65536) {
      size_t cap = b->cap ? b->cap * 2 : 131072;
      uint8_t* p = realloc(b->p, cap);
      if (!p) return 1;
      b->p = p;
      b->cap = cap;
    }
    ssize_t r = read(fd, b->p + b->len, b->cap - b->len);
    if (r > 0) { b->len += (size_t)r; continue; }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return 0;
    return 1;
  }
}

/* The next complete frame in b (length in *len), or NULL; *bad on garbage. */
static uint8_t* rbuf_frame(struct rbuf* b, size_t off, size_t* len, int* bad) {
  struct wire_hdr h;
  if (b->len - off < sizeof(h)) return NULL;
  memcpy(&h, b->p + off, sizeof(h));
  if (h.len < sizeof(h) || h.len > MAX_FRAME) { *bad = 1; return NULL; }
  if (b->len - off < h.len) return NULL;
  *len = h.len;
  return b->p + off;
}

static void rbuf_free(struct rbuf* b) { free(b->p); memset(b, 0, sizeof(*b)); }

static void inq_free(struct emu_qp* q) {
  while (q->inq) {
    struct inreq* r = q->inq;
    q->inq = r->next;
    free(r->sge);
    free(r);
  }
  q->inq_tail = NULL;
}

static void push_wc(struct ibv_cq* cq, struct emu_qp* q, uint64_t wr_id, enum ibv_wc_status st,
                    enum ibv_wc_opcode op, uint32_t len) {
  struct ibv_wc wc;
  memset(&wc, 0, sizeof(wc));
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = len;
  wc.qp_num = q->ibv.qp_num;
  wc.src_qp = q->dest_qpn;
  cq_push(cq, &wc);
}

/* Moves the QP to the error state: the oldest outstanding send completes
 * with `first`, every other WR with WR_FLUSH_ERR; requests of the peer still
 * queued here are refused. With E.mu held. */
static void qp_error(struct emu_qp* q, enum ibv_wc_status first) {
  if (getenv("COLLIE_IBEMU_DEBUG"))
    fprintf(stderr, "ibemu[%d]: QP %u -> error (%s): state %d sq %u rq %u no_path %d peer_gone %d ofd %d ifd %d\n",
            (int)getpid(), q->ibv.qp_num, ibv_wc_status_str(first), q->ibv.state, q->sq_n, q->rq_n, q->no_path,
            q->peer_gone, q->ofd, q->ifd);
  for (uint32_t i = 0; i < q->sq_n; i++) {
    struct sq_ent* s = &q->sq[(q->sq_head + i) % q->cap.max_send_wr];
    push_wc(q->ibv.send_cq, q, s->wr_id, i == 0 ? first : IBV_WC_WR_FLUSH_ERR, s->op, 0);
  }
  q->sq_n = 0;
  for (uint32_t i = 0; i < q->rq_n; i++) {
    struct rq_ent* r = &q->rq[(q->rq_head + i) % q->cap.max_recv_wr];
    push_wc(q->ibv.recv_cq, q, r->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
  }
  q->rq_n = 0;
  for (struct inreq* r = q->inq; r; r = r->next) wire_ack(q, r->r.seq, IBV_WC_RETRY_EXC_ERR);
  inq_free(q);
  q->lost = LOST_NONE;
  q->ibv.state = IBV_QPS_ERR;
}

/* Sends what is queued in w, waiting up to about a second for room: acks
 * queued before a QP goes away must reach the peer (an HCA sends them as it
 * executes the request, before the application sees the completion). */
static void wire_drain(int fd, struct rbuf* w) {
  for (int i = 0; fd >= 0 && w->len > 0 && i < 100; i++) {
    if (wire_flush(fd, w) != 0) return;
    if (w->len > 0) {
      struct pollfd p = {fd, POLLOUT, 0};
      (void)poll(&p, 1, 10);
    }
  }
}

/* BYE after whatever is still queued; with a backlog the socket cannot take
 * within about a second, the peer sees the stream end without it, as if this
 * process had died. */
static void qp_close_links(struct emu_qp* q, int bye) {
  if (bye) {
    wire_bye(q->ofd, &q->ow);
    wire_bye(q->ifd, &q->iw);
    wire_drain(q->ofd, &q->ow);
    wire_drain(q->ifd, &q->iw);
  }
  if (q->ofd >= 0) close(q->ofd);
  if (q->ifd >= 0) close(q->ifd);
  q->ofd = q->ifd = -1;
  rbuf_free(&q->ob);
  rbuf_free(&q->ib);
  rbuf_free(&q->ow);
  rbuf_free(&q->iw);
}

/* A stream with the peer ended. Our outgoing one (our requests, its acks):
 * gracefully (BYE seen) nothing is lost unless sends are still unacked;
 * otherwise the peer died and the QP fails. The incoming one (its requests,
 * our acks) decides nothing about our sends, whose acks travel on the other
 * stream and may still be on their way (the streams are not ordered with
 * each other): it fails the QP only when it came from our peer and ended
 * without a BYE (the peer died). A stale connection (from a QP that is not
 * our destination) ending changes nothing. */
static void qp_link_down(struct emu_qp* q, int* fd, struct rbuf* b, struct rbuf* w) {
  int out = fd == &q->ofd;
  int from_peer = q->have_hello && q->hello.src_qpn == q->dest_qpn;
  int in_bye = q->in_bye;
  close(*fd);
  *fd = -1;
  rbuf_free(b);
  rbuf_free(w);
  if (!out) q->have_hello = q->in_bye = 0;
  if (q->ibv.state == IBV_QPS_RESET || q->ibv.state == IBV_QPS_ERR) return;
  if (out ? (!q->peer_gone || q->sq_n > 0) : (from_peer && !in_bye)) qp_error(q, IBV_WC_RETRY_EXC_ERR);
}

static int path_ok(struct emu_qp* q) {
  const struct wire_hello* h = &q->hello;
  if (!q->have_hello || h->dst_qpn != q->ibv.qp_num || h->src_qpn != q->dest_qpn) return 0;
  int ll = q->dev->roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  if (h->link_layer != (uint32_t)ll) return 0;
  if (!q->dev->roce) return h->dlid == port_lid(q->dev, q->port);
  if (!h->is_global) return 0;
  for (int i = 0; i < gid_count(q->dev); i++) {
    union ibv_gid g;
    uint32_t t;
    port_gid(q->dev, q->port, i, &g, &t);
    if (!memcmp(g.raw, h->dgid, 16)) return 1;
  }
  return 0;
}

static uint64_t rnr_ns(uint8_t t) {
  /* IB spec's minimum RNR NAK timer field, in microseconds x100. */
  static const uint32_t us100[32] = {65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
                                     256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
                                     12288, 16384, 24576, 32768, 49152};
  return (uint64_t)us100[t & 31] * 10000ull;
}

/* Copies `total` bytes described by the request into the local segments. */
static int data_move(struct emu_qp* q, struct inreq* r, struct iovec* dst, int ndst) {
  if (r->r.total == 0) return 0;
  if (r->r.inl) {
    const uint8_t* src = (const uint8_t*)(r->sge + r->r.nsge);
    for (int i = 0; i < ndst; i++) { memcpy(dst[i].iov_base, src, dst[i].iov_len); src += dst[i].iov_len; }
    return 0;
  }
  struct iovec src[MAX_SGE];
  for (uint32_t i = 0; i < r->r.nsge; i++) {
    src[i].iov_base = (void*)(uintptr_t)r->sge[i].addr;
    src[i].iov_len = r->sge[i].len;
  }
  /* process_vm_readv may stop short on large transfers: advance and retry. */
  int si = 0, di = 0;
  uint64_t left = r->r.total;
  while (left > 0) {
    ssize_t n = process_vm_readv(q->in_pid, dst + di, (unsigned long)(ndst - di), src + si,
                                 (unsigned long)((int)r->r.nsge - si), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      static atomic_int warned;
      if (!atomic_exchange(&warned, 1))
        fprintf(stderr, "ibemu: process_vm_readv from pid %d: %s\n", (int)q->in_pid, strerror(errno));
      return -1;
    }
    left -= (uint64_t)n;
    for (size_t k = (size_t)n; k > 0;) {
      size_t t = k < dst[di].iov_len ? k : dst[di].iov_len;
      dst[di].iov_base = (uint8_t*)dst[di].iov_base + t; dst[di].iov_len -= t; k -= t;
      if (dst[di].iov_len == 0 && di < ndst - 1) di++;
    }
    for (size_t k = (size_t)n; k > 0;) {
      size_t t = k < src[si].iov_len ? k : src[si].iov_len;
      src[si].iov_base = (uint8_t*)src[si].iov_base + t; src[si].iov_len -= t; k -= t;
      if (src[si].iov_len == 0 && si < (int)r->r.nsge - 1) si++;
    }
  }
  return 0;
}

/* Serves the peer's queued requests in order, as far as possible now. */
static void process_inq(struct emu_qp* q) {
  struct inreq* r;
  while ((r = q->inq) != NULL) {
    enum ibv_qp_state st = q->ibv.state;
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT) {
      /* A real responder drops packets before RTR and the sender retries
       * until its retry budget is spent; here the request waits that long. */
      uint64_t now = now_ns();
      if (r->hold_deadline == 0) r->hold_deadline = now + r->r.lost_ns;
      if (now < r->hold_deadline) return;
    }
    uint32_t op = r->r.opcode;
    int is_write = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
    int has_imm = op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_SEND_WITH_IMM;
    int needs_recv = op != IBV_WR_RDMA_WRITE;
    enum ibv_wc_status status = IBV_WC_SUCCESS;
    struct iovec dst[MAX_SGE];
    int ndst = 0;
    if (st == IBV_QPS_ERR || st == IBV_QPS_RESET || st == IBV_QPS_INIT || !path_ok(q) || q->in_broken) {
      status = IBV_WC_RETRY_EXC_ERR; /* a real responder drops what it cannot take */
    } else if (is_write) {
      struct emu_mr* m = mr_find(r->r.rkey, q->ibv.pd);
      uint8_t* p = m ? mr_range(m, r->r.raddr, r->r.total) : NULL;
      if (!p || !(m->access & IBV_ACCESS_REMOTE_WRITE) || !(q->access & IBV_ACCESS_REMOTE_WRITE))
        status = IBV_WC_REM_ACCESS_ERR;
      else { dst[0].iov_base = p; dst[0].iov_len = r->r.total; ndst = 1; }
    }
    struct rq_ent* rq = NULL;
    if (status == IBV_WC_SUCCESS && needs_recv) {
      if (q->rq_n == 0) {
        uint64_t now = now_ns();
        if (r->rnr_deadline == 0 || now >= r->rnr_deadline) {
          if (r->rnr_deadline != 0 && r->r.rnr_retry != 7 && ++r->rnr_tries > (int)r->r.rnr_retry)
            status = IBV_WC_RNR_RETRY_EXC_ERR;
          else
            r->rnr_deadline = now + rnr_ns(q->min_rnr_timer);
        }
        if (status == IBV_WC_SUCCESS) return; /* the thread retries at the deadline */
      } else {
        rq = &q->rq[q->rq_head];
        if (!is_write) {
          uint64_t room = 0, left = r->r.total;
          for (int i = 0; i < rq->nsge; i++) room += rq->sge[i].length;
          if (room < r->r.total) {
            status = IBV_WC_REM_INV_REQ_ERR;
          } else {
            for (int i = 0; i < rq->nsge && left > 0; i++) {
              struct emu_mr* m = mr_find(rq->sge[i].lkey, q->ibv.pd);
              uint64_t l = rq->sge[i].length < left ? rq->sge[i].length : left;
              uint8_t* p = m ? mr_range(m, rq->sge[i].addr, l) : NULL;
              if (!p) { status = IBV_WC_REM_OP_ERR; break; } /* deregistered since posted */
              dst[ndst].iov_base = p;
              dst[ndst++].iov_len = l;
              left -= l;
            }
          }
        }
      }
    }
    if (status == IBV_WC_SUCCESS && data_move(q, r, dst, ndst) != 0) status = IBV_WC_REM_OP_ERR;
    if (rq) {
      q->rq_head = (q->rq_head + 1) % q->cap.max_recv_wr;
      q->rq_n--;
      struct ibv_wc wc;
      memset(&wc, 0, sizeof(wc));
      wc.wr_id = rq->wr_id;
      wc.status = status == IBV_WC_SUCCESS ? IBV_WC_SUCCESS
                  : status == IBV_WC_REM_INV_REQ_ERR ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_QP_OP_ERR;
      wc.opcode = is_write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
      wc.byte_len = (uint32_t)r->r.total;
      wc.imm_data = r->r.imm;
      wc.wc_flags = has_imm ? IBV_WC_WITH_IMM : 0;
      wc.qp_num = q->ibv.qp_num;
      wc.src_qp = q->dest_qpn;
      wc.slid = q->dev->roce ? 0 : q->ah.dlid;
      cq_push(q->ibv.recv_cq, &wc);
    }
    if (status != IBV_WC_SUCCESS) q->in_broken = 1;
    if (status != IBV_WC_SUCCESS && getenv("COLLIE_IBEMU_DEBUG"))
      fprintf(stderr, "ibemu[%d]: QP %u refuses request %llu of QP %u: %s (state %d path_ok %d hello %d src %u dst %u)\n",
              (int)getpid(), q->ibv.qp_num, (unsigned long long)r->r.seq, q->hello.src_qpn, ibv_wc_status_str(status),
              st, path_ok(q), q->have_hello, q->hello.src_qpn, q->hello.dst_qpn);
    wire_ack(q, r->r.seq, status);
    q->inq = r->next;
    if (!q->inq) q->inq_tail = NULL;
    free(r->sge);
    free(r);
  }
}

/* A frame from the peer's requester (on our incoming stream). */
static int in_frame(struct emu_qp* q, const uint8_t* f, size_t len) {
  struct wire_hdr h;
  memcpy(&h, f, sizeof(h));
  if (h.type == W_HELLO && len == sizeof(struct wire_hello)) {
    memcpy(&q->hello, f, sizeof(q->hello));
    q->have_hello = 1;
    return 0;
  }
  if (h.type == W_BYE) {
    /* Only the connected peer's goodbye counts; one from a QP that is not
     * this QP's destination (a stale connection) changes nothing here. */
    if (q->have_hello && q->hello.src_qpn == q->dest_qpn) q->peer_gone = 1;
    q->in_bye = 1;
    if (getenv("COLLIE_IBEMU_DEBUG"))
      fprintf(stderr, "ibemu[%d]: QP %u (dest %u, state %d): goodbye from QP %u\n", (int)getpid(), q->ibv.qp_num,
              q->dest_qpn, q->ibv.state, q->have_hello ? q->hello.src_qpn : 0);
    inq_free(q);
    return 0;
  }
  if (h.type != W_REQ || len < sizeof(struct wire_req)) return -1;
  struct inreq* r = calloc(1, sizeof(*r));
  if (!r) return -1;
  memcpy(&r->r, f, sizeof(r->r));
  size_t extra = len - sizeof(r->r);
  if (r->r.nsge > MAX_SGE || extra != r->r.nsge * sizeof(struct wire_sge) + r->r.inl ||
      (r->r.inl && r->r.inl != r->r.total)) {
    free(r);
    return -1;
  }
  r->sge = malloc(extra + 1);
  if (!r->sge) { free(r); return -1; }
  memcpy(r->sge, f + sizeof(r->r), extra);
  if (q->inq_tail) q->inq_tail->next = r; else q->inq = r;
  q->inq_tail = r;
  return 0;
}

/* A frame from the peer's responder (on our outgoing stream). */
static int out_frame(struct emu_qp* q, const uint8_t* f, size_t len) {
  struct wire_hdr h;
  memcpy(&h, f, sizeof(h));
  if (h.type == W_BYE) {
    q->peer_gone = 1;
    if (q->sq_n > 0) qp_error(q, IBV_WC_RETRY_EXC_ERR);
    return 0;
  }
  if (h.type != W_ACK || len != sizeof(struct wire_ack)) return -1;
  struct wire_ack a;
  memcpy(&a, f, sizeof(a));
  if (q->sq_n == 0 || q->ibv.state == IBV_QPS_ERR) return 0; /* already flushed */
  struct sq_ent* s = &q->sq[q->sq_head];
  if (s->seq != a.seq) return -1;
  if (a.status != IBV_WC_SUCCESS) { qp_error(q, (enum ibv_wc_status)a.status); return 0; }
  q->sq_head = (q->sq_head + 1) % q->cap.max_send_wr;
  q->sq_n--;
  if (s->signaled) push_wc(q->ibv.send_cq, q, s->wr_id, IBV_WC_SUCCESS, s->op, s->len);
  return 0;
}

static void drain(struct emu_qp* q, int out) {
  int* fd = out ? &q->ofd : &q->ifd;
  struct rbuf* b = out ? &q->ob : &q->ib;
  struct rbuf* w = out ? &q->ow : &q->iw;
  int ended = rbuf_fill(*fd, b), bad = 0;
  size_t off = 0, len;
  uint8_t* f;
  while (*fd >= 0 && (f = rbuf_frame(b, off, &len, &bad)) != NULL) {
    if ((out ? out_frame(q, f, len) : in_frame(q, f, len)) != 0) { bad = 1; break; }
    off += len;
  }
  if (*fd < 0) return; /* the QP was reset meanwhile */
  memmove(b->p, b->p + off, b->len - off);
  b->len -= off;
  if (bad) fprintf(stderr, "ibemu: QP %u: malformed frame from its peer\n", q->ibv.qp_num);
  if (ended || bad) qp_link_down(q, fd, b, w);
}

static void wake_thread(void) {
  char c = 1;
  if (E.wake[1] >= 0) { ssize_t w = write(E.wake[1], &c, 1); (void)w; }
}

/* An injected fault's time has come. It fails the WR it was injected on, so
 * earlier writes (sent, acks on their way) complete normally first. */
static void lost_expired(struct emu_qp* q, uint64_t now) {
  if (q->sq_n == 0) { q->lost = LOST_NONE; return; }
  if (q->sq[q->sq_head].seq != q->lost_seq) { q->lost_deadline = now + 1000000; return; }
  if (q->lost == LOST_KILL) {
    qp_close_links(q, 0); /* both ends see the link die: no BYE */
    qp_error(q, IBV_WC_FATAL_ERR);
  } else {
    qp_error(q, IBV_WC_RETRY_EXC_ERR);
  }
}

static void* progress_main(void* arg) {
  (void)arg;
  struct pollfd* pfd = NULL;
  uint64_t* ids = NULL;
  size_t cap = 0;
  while (!atomic_load(&E.stop)) {
    pthread_mutex_lock(&E.mu);
    size_t need = 1 + 3 * (size_t)E.n.qps, n = 1;
    if (need > cap) {
      struct pollfd* p2 = realloc(pfd, need * sizeof(*pfd));
      uint64_t* i2 = p2 ? realloc(ids, need * sizeof(*ids)) : NULL;
      if (p2) pfd = p2;
      if (i2) ids = i2;
      if (!p2 || !i2) { pthread_mutex_unlock(&E.mu); usleep(1000); continue; }
      cap = need;
    }
    pfd[0] = (struct pollfd){E.wake[0], POLLIN, 0};
    uint64_t now = now_ns(), next = now + 1000000000ull;
    for (struct emu_qp* q = E.qps; q; q = q->next) {
      int fds[3] = {q->ifd < 0 ? q->lfd : -1, q->ifd, q->ofd};
      short ev[3] = {POLLIN, (short)(POLLIN | (q->iw.len ? POLLOUT : 0)), (short)(POLLIN | (q->ow.len ? POLLOUT : 0))};
      for (int k = 0; k < 3; k++)
        if (fds[k] >= 0) { pfd[n] = (struct pollfd){fds[k], ev[k], 0}; ids[n++] = q->id * 4 + (uint64_t)k; }
      if (q->inq && q->inq->rnr_deadline && q->inq->rnr_deadline < next) next = q->inq->rnr_deadline;
      if (q->inq && q->inq->hold_deadline && q->inq->hold_deadline < next) next = q->inq->hold_deadline;
      if (q->lost && q->lost_deadline < next) next = q->lost_deadline;
    }
    pthread_mutex_unlock(&E.mu);
    int ms = next > now ? (int)((next - now + 999999) / 1000000) : 0;
    int rc = poll(pfd, n, ms);
    if (rc < 0 && errno != EINTR) break;
    if (pfd[0].revents) { char b[64]; while (read(E.wake[0], b, sizeof(b)) > 0) {} }
    pthread_mutex_lock(&E.mu);
    for (size_t i = 1; i < n; i++) {
      if (!pfd[i].revents) continue;
      struct emu_qp* q = E.qps;
      while (q && q->id != ids[i] / 4) q = q->next;
      if (!q) continue;
      int k = (int)(ids[i] % 4);
      if (k == 0 && q->lfd == pfd[i].fd && q->ifd < 0) {
        int fd = accept4(q->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          struct ucred uc;
          socklen_t ul = sizeof(uc);
          getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul);
          q->ifd = fd;
          q->in_pid = uc.pid;
          q->have_hello = q->in_broken = q->in_bye = 0;
        }
      } else if (k >= 1 && (k == 1 ? q->ifd : q->ofd) == pfd[i].fd) {
        int out = k == 2;
        int* fd = out ? &q->ofd : &q->ifd;
        struct rbuf* w = out ? &q->ow : &q->iw;
        if ((pfd[i].revents & POLLOUT) && wire_flush(*fd, w) != 0)
          qp_link_down(q, fd, out ? &q->ob : &q->ib, w);
        else if (pfd[i].revents & ~POLLOUT)
          drain(q, out);
      }
    }
    now = now_ns();
    for (struct emu_qp* q = E.qps; q; q = q->next) {
      if (q->lost && now >= q->lost_deadline) lost_expired(q, now);
      process_inq(q);
    }
    pthread_mutex_unlock(&E.mu);
  }
  free(pfd);
  free(ids);
  return NULL;
}

/* ---- queue pairs ------------------------------------------------------- */

EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* ia) {
  struct ibv_qp_cap* c = &ia->cap;
  if (ia->qp_type != IBV_QPT_RC || ia->srq) { errno = EOPNOTSUPP; return NULL; }
  if (!ia->send_cq || !ia->recv_cq || c->max_send_wr < 1 || c->max_send_wr > MAX_WR ||
      c->max_recv_wr > MAX_WR || c->max_send_sge > MAX_SGE || c->max_recv_sge > MAX_SGE ||
      c->max_inline_data > MAX_INLINE) {
    errno = EINVAL;
    return NULL;
  }
  struct emu_qp* q = calloc(1, sizeof(*q));
  if (!q) { errno = ENOMEM; return NULL; }
  if (c->max_recv_wr == 0) c->max_recv_wr = 1; /* keeps the ring arithmetic simple */
  q->cap = *c;
  q->sq = calloc(c->max_send_wr, sizeof(*q->sq));
  q->rq = calloc(c->max_recv_wr, sizeof(*q->rq));
  q->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  q->ofd = q->ifd = -1;
  if (!q->sq || !q->rq || q->lfd < 0) goto fail;
  /* The bind reserves the QP number machine-wide. Numbers go on from the
   * process's last one instead of refilling the lowest free one: like an HCA's
   * allocator, a destroyed QP's number comes back only after the space wraps,
   * so a peer still holding the old number cannot reach the new QP (it did:
   * a stale peer's goodbye marked a fresh QP of the same number gone). */
  uint32_t base = ((uint32_t)getpid() * 977u) & 0xffffff;
  int bound = 0;
  for (uint32_t k = 0; k < 4096 && !bound; k++) {
    uint32_t i = atomic_fetch_add(&E.qpn_seq, 1u);
    uint32_t qpn = (base + i * 7919u) & 0xffffff;
    if (qpn < 2) continue;
    struct sockaddr_un a;
    socklen_t al = qp_addr(qpn, &a);
    if (bind(q->lfd, (struct sockaddr*)&a, al) == 0) { q->ibv.qp_num = qpn; bound = 1; }
    else if (errno != EADDRINUSE) break;
  }
  if (!bound || listen(q->lfd, 4) != 0) goto fail;
  q->dev = ((struct emu_ctx*)pd->context)->dev;
  q->ibv.context = pd->context;
  q->ibv.qp_context = ia->qp_context;
  q->ibv.pd = pd;
  q->ibv.send_cq = ia->send_cq;
  q->ibv.recv_cq = ia->recv_cq;
  q->ibv.state = IBV_QPS_RESET;
  q->ibv.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q->ibv.mutex, NULL);
  pthread_cond_init(&q->ibv.cond, NULL);
  q->sq_sig_all = ia->sq_sig_all;

  pthread_mutex_lock(&E.thr_mu);
  if (!E.thr_running) {
    if (pipe2(E.wake, O_CLOEXEC | O_NONBLOCK) != 0) { pthread_mutex_unlock(&E.thr_mu); goto fail_mx; }
    atomic_store(&E.stop, 0);
    if (pthread_create(&E.thr, NULL, progress_main, NULL) != 0) {
      close(E.wake[0]); close(E.wake[1]);
      E.wake[0] = E.wake[1] = -1;
      pthread_mutex_unlock(&E.thr_mu);
      goto fail_mx;
    }
    E.thr_running = 1;
  }
  pthread_mutex_lock(&E.mu);
  q->ibv.handle = ++E.next_handle;
  q->id = ++E.next_qp_id;
  q->next = E.qps;
  E.qps = q;
  E.n.qps++;
  pthread_mutex_unlock(&E.mu);
  pthread_mutex_unlock(&E.thr_mu);
  wake_thread();
  return &q->ibv;
fail_mx:
  pthread_mutex_destroy(&q->ibv.mutex);
  pthread_cond_destroy(&q->ibv.cond);
fail:
  if (q->lfd >= 0) close(q->lfd);
  free(q->sq);
  free(q->rq);
  free(q);
  errno = ENOMEM;
  return NULL;
}

EXPORT int ibv_destroy_qp(struct ibv_qp* qp) {
  struct emu_qp* q = (struct emu_qp*)qp;
  pthread_mutex_lock(&E.thr_mu);
  pthread_mutex_lock(&E.mu);
  struct emu_qp** pp = &E.qps;
  while (*pp && *pp != q) pp = &(*pp)->next;
  if (!*pp) { pthread_mutex_unlock(&E.mu); pthread_mutex_unlock(&E.thr_mu); return EINVAL; }
  *pp = q->next;
  E.n.qps--;
  if (getenv("COLLIE_IBEMU_DEBUG"))
    fprintf(stderr, "ibemu[%d]: destroy QP %u (dest %u, state %d, sq %u)\n", (int)getpid(), q->ibv.qp_num, q->dest_qpn,
            q->ibv.state, q->sq_n);
  qp_close_links(q, 1);
  close(q->lfd);
  inq_free(q);
  int idle = E.n.qps == 0;
  pthread_mutex_unlock(&E.mu);
  if (idle && E.thr_running) {
    atomic_store(&E.stop, 1);
    wake_thread();
    pthread_join(E.thr, NULL);
    close(E.wake[0]); close(E.wake[1]);
    E.wake[0] = E.wake[1] = -1;
    E.thr_running = 0;
  } else {
    wake_thread();
  }
  pthread_mutex_unlock(&E.thr_mu);
  pthread_mutex_destroy(&q->ibv.mutex);
  pthread_cond_destroy(&q->ibv.cond);
  free(q->sq);
  free(q->rq);
  free(q);
  return 0;
}

/* Attributes each RC transition requires and allows (IB spec's table). */
static int qp_masks(enum ibv_qp_state from, enum ibv_qp_state to, int* req, int* opt) {
  *req = IBV_QP_STATE;
  *opt = 0;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return 0;
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    *req |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    *req |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    *req |= IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
           IBV_QP_PATH_MIG_STATE;
  } else if (from == IBV_QPS_RTS && to == IBV_QPS_RTS) {
    *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
           IBV_QP_PATH_MIG_STATE;
  } else {
    return -1;
  }
  return 0;
}

/* INIT -> RTR: connect to the peer QP and say which address we used. */
static void qp_connect(struct emu_qp* q) {
  struct sockaddr_un a;
  socklen_t al = qp_addr(q->dest_qpn, &a);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, al) != 0) {
    if (fd >= 0) close(fd);
    q->no_path = 1; /* sends will fail as a real QP's retries would */
    return;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  int sz = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  struct wire_hello h;
  memset(&h, 0, sizeof(h));
  h.h = (struct wire_hdr){W_HELLO, sizeof(h)};
  h.src_qpn = q->ibv.qp_num;
  h.dst_qpn = q->dest_qpn;
  h.link_layer = q->dev->roce ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  h.is_global = q->ah.is_global;
  h.dlid = q->ah.dlid;
  memcpy(h.dgid, q->ah.grh.dgid.raw, 16);
  q->ofd = fd;
  if (wire_send(fd, &q->ow, &h, sizeof(h), NULL, 0) != 0) {
    close(fd);
    q->ofd = -1;
    rbuf_free(&q->ow);
    q->no_path = 1;
  }
}

EXPORT int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* at, int mask) {
  struct emu_qp* q = (struct emu_qp*)qp;
  int rc = 0;
  pthread_mutex_lock(&E.mu);
  enum ibv_qp_state from = q->ibv.state;
  enum ibv_qp_state to = (mask & IBV_QP_STATE) ? at->qp_state : from;
  int req, opt;
  if (!(mask & IBV_QP_STATE)) mask |= IBV_QP_STATE; /* same-state modify */
  if ((mask & IBV_QP_CUR_STATE) && at->cur_qp_state != from) { rc = EINVAL; goto out; }
  if (qp_masks(from, to, &req, &opt) != 0 || (mask & req) != req || (mask & ~(req | opt)) != 0) {
    rc = EINVAL;
    goto out;
  }
  if ((mask & IBV_QP_PORT) && (!port_ok(q->dev, at->port_num) ||
                               ((q->dev->down_mask >> at->port_num) & 1))) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_PKEY_INDEX) && at->pkey_index != 0) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_PATH_MTU) && (at->path_mtu < IBV_MTU_256 || at->path_mtu > IBV_MTU_4096)) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_TIMEOUT) && at->timeout > 31) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_RETRY_CNT) && at->retry_cnt > 7) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_RNR_RETRY) && at->rnr_retry > 7) { rc = EINVAL; goto out; }
  if ((mask & IBV_QP_MIN_RNR_TIMER) && at->min_rnr_timer > 31) { rc = EINVAL; goto out; }
  if (mask & IBV_QP_AV) {
    const struct ibv_ah_attr* ah = &at->ah_attr;
    if (q->dev->roce ? (!ah->is_global || ah->grh.sgid_index >= ROCE_GIDS) : (ah->dlid == 0)) { rc = EINVAL; goto out; }
  }
  if (to == IBV_QPS_RESET) {
    qp_close_links(q, 1);
    inq_free(q);
    q->sq_n = q->rq_n = 0;
    q->sq_head = q->rq_head = 0;
    q->no_path = q->peer_gone = q->have_hello = q->lost = q->in_broken = q->in_bye = 0;
  } else if (to == IBV_QPS_ERR) {
    qp_error(q, IBV_WC_WR_FLUSH_ERR);
  }
  if (mask & IBV_QP_PORT) q->port = at->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) q->access = (int)at->qp_access_flags;
  if (mask & IBV_QP_PKEY_INDEX) q->pkey_index = at->pkey_index;
  if (mask & IBV_QP_PATH_MTU) q->mtu = at->path_mtu;
  if (mask & IBV_QP_DEST_QPN) q->dest_qpn = at->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) q->rq_psn = at->rq_psn;
  if (mask & IBV_QP_SQ_PSN) q->sq_psn = at->sq_psn;
  if (mask & IBV_QP_AV) q->ah = at->ah_attr;
  if (mask & IBV_QP_TIMEOUT) q->timeout = at->timeout;
  if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = at->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = at->rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->min_rnr_timer = at->min_rnr_timer;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->max_rd_atomic = at->max_rd_atomic;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->max_dest_rd_atomic = at->max_dest_rd_atomic;
  q->ibv.state = to;
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    qp_connect(q);
    process_inq(q); /* requests that arrived before RTR */
  }
out:
  pthread_mutex_unlock(&E.mu);
  if (rc == 0) wake_thread();
  return rc;
}

EXPORT int ibv_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* at, int mask, struct ibv_qp_init_attr* ia) {
  struct emu_qp* q = (struct emu_qp*)qp;
  (void)mask;
  pthread_mutex_lock(&E.mu);
  memset(at, 0, sizeof(*at));
  at->qp_state = at->cur_qp_state = q->ibv.state;
  at->path_mtu = q->mtu;
  at->qkey = 0;
  at->rq_psn = q->rq_psn;
  at->sq_psn = q->sq_psn;
  at->dest_qp_num = q->dest_qpn;
  at->qp_access_flags = (unsigned)q->access;
  at->cap = q->cap;
  at->ah_attr = q->ah;
  at->pkey_index = q->pkey_index;
  at->max_rd_atomic = q->max_rd_atomic;
  at->max_dest_rd_atomic = q->max_dest_rd_atomic;
  at->min_rnr_timer = q->min_rnr_timer;
  at->port_num = q->port;
  at->timeout = q->timeout;
  at->retry_cnt = q->retry_cnt;
  at->rnr_retry = q->rnr_retry;
  if (ia) {
    memset(ia, 0, sizeof(*ia));
    ia->qp_context = q->ibv.qp_context;
    ia->send_cq = q->ibv.send_cq;
    ia->recv_cq = q->ibv.recv_cq;
    ia->cap = q->cap;
    ia->qp_type = IBV_QPT_RC;
    ia->sq_sig_all = q->sq_sig_all;
  }
  pthread_mutex_unlock(&E.mu);
  return 0;
}

/* Checks a local scatter entry against its MR (lkey, bounds, same PD). */
static int sge_ok(struct emu_qp* q, const struct ibv_sge* s, int need_write) {
  struct emu_mr* m = mr_find(s->lkey, q->ibv.pd);
  if (!m || (need_write && !(m->access & IBV_ACCESS_LOCAL_WRITE))) return 0;
  return s->length == 0 || mr_range(m, s->addr, s->length) != NULL;
}

static uint64_t lost_timeout_ns(const struct emu_qp* q) {
  if (q->timeout == 0) return UINT64_MAX / 2; /* 0 means wait forever */
  return (4096ull << q->timeout) * (q->retry_cnt + 1ull);
}

static int ops_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  struct emu_qp* q = (struct emu_qp*)qp;
  int rc = 0, wake = 0;
  pthread_mutex_lock(&E.mu);
  for (; wr; wr = wr->next) {
    enum ibv_qp_state st = q->ibv.state;
    int op = wr->opcode;
    if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) { rc = EINVAL; break; }
    if ((op != IBV_WR_RDMA_WRITE && op != IBV_WR_RDMA_WRITE_WITH_IMM && op != IBV_WR_SEND &&
         op != IBV_WR_SEND_WITH_IMM) || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge) {
      rc = EINVAL;
      break;
    }
    if (q->sq_n == q->cap.max_send_wr) { rc = ENOMEM; break; }
    uint64_t total = 0;
    for (int i = 0; i < wr->num_sge; i++) total += wr->sg_list[i].length;
    int inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
    if (inl && total > q->cap.max_inline_data) { rc = EINVAL; break; }
    struct sq_ent* s = &q->sq[(q->sq_head + q->sq_n) % q->cap.max_send_wr];
    s->wr_id = wr->wr_id;
    s->seq = q->post_seq++;
    s->len = (uint32_t)total;
    s->op = (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM) ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    s->signaled = q->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    q->sq_n++;
    if (st == IBV_QPS_ERR) { qp_error(q, IBV_WC_WR_FLUSH_ERR); continue; }
    int local_ok = 1;
    for (int i = 0; !inl && i < wr->num_sge; i++) local_ok &= sge_ok(q, &wr->sg_list[i], 0);
    if (!local_ok) { qp_error(q, IBV_WC_LOC_PROT_ERR); continue; }
    if (q->no_path || q->peer_gone || q->ofd < 0) { qp_error(q, IBV_WC_RETRY_EXC_ERR); continue; }
    uint32_t rkey = wr->wr.rdma.rkey;
    if (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
      E.writes++;
      if (E.fail_kind != FAIL_NONE && !E.fail_fired && E.writes > E.fail_after) {
        E.fail_fired = 1;
        if (E.fail_kind == FAIL_CORRUPT_RKEY) rkey ^= 0x80000000u;
        if (E.fail_kind != FAIL_CORRUPT_RKEY && !q->lost) {
          q->lost = E.fail_kind == FAIL_DROP ? LOST_DROP : LOST_KILL;
          q->lost_seq = s->seq;
          q->lost_deadline = now_ns() + (q->lost == LOST_DROP ? lost_timeout_ns(q) : 0);
          wake = 1;
        }
      }
    }
    if (q->lost) continue; /* lost on the wire; the retry timer fails the QP */
    struct wire_req r;
    memset(&r, 0, sizeof(r));
    struct wire_sge sg[MAX_SGE];
    uint8_t inl_buf[MAX_INLINE];
    size_t nsg = inl ? 0 : (size_t)wr->num_sge, ilen = 0;
    /* The responder reads the bytes from this process where the lkey's MR
     * maps them (its iova translated: user memory or a dma-buf mapping). */
    for (size_t i = 0; i < nsg; i++) {
      const struct ibv_sge* e = &wr->sg_list[i];
      struct emu_mr* m = e->length ? mr_find(e->lkey, q->ibv.pd) : NULL;
      uint8_t* p = m ? mr_range(m, e->addr, e->length) : NULL; /* checked by sge_ok above */
      sg[i] = (struct wire_sge){p ? (uint64_t)(uintptr_t)p : e->addr, e->length};
    }
    if (inl)
      for (int i = 0; i < wr->num_sge; i++) {
        if (wr->sg_list[i].length) memcpy(inl_buf + ilen, (void*)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        ilen += wr->sg_list[i].length;
      }
    /* The sge list and the inline bytes travel as one body after the header. */
    uint8_t body[MAX_SGE * sizeof(struct wire_sge) + MAX_INLINE];
    memcpy(body, sg, nsg * sizeof(sg[0]));
    memcpy(body + nsg * sizeof(sg[0]), inl_buf, ilen);
    size_t blen = nsg * sizeof(sg[0]) + ilen;
    r.h = (struct wire_hdr){W_REQ, (uint32_t)(sizeof(r) + blen)};
    r.seq = s->seq;
    r.raddr = wr->wr.rdma.remote_addr;
    r.total = total;
    r.opcode = (uint32_t)op;
    r.rkey = rkey;
    r.imm = wr->imm_data;
    r.nsge = (uint32_t)nsg;
    r.inl = (uint32_t)ilen;
    r.rnr_retry = q->rnr_retry;
    r.lost_ns = lost_timeout_ns(q);
    if (wire_send(q->ofd, &q->ow, &r, sizeof(r), body, blen) != 0) qp_error(q, IBV_WC_RETRY_EXC_ERR);
  }
  pthread_mutex_unlock(&E.mu);
  if (wake) wake_thread();
  if (rc && bad) *bad = wr;
  return rc;
}

static int ops_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
  struct emu_qp* q = (struct emu_qp*)qp;
  int rc = 0;
  pthread_mutex_lock(&E.mu);
  for (; wr; wr = wr->next) {
    if (q->ibv.state == IBV_QPS_RESET || wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) { rc = EINVAL; break; }
    if (q->rq_n == q->cap.max_recv_wr) { rc = ENOMEM; break; }
    int ok = 1;
    for (int i = 0; i < wr->num_sge; i++) ok &= sge_ok(q, &wr->sg_list[i], 1);
    if (!ok) { rc = EINVAL; break; }
    struct rq_ent* r = &q->rq[(q->rq_head + q->rq_n) % q->cap.max_recv_wr];
    r->wr_id = wr->wr_id;
    r->nsge = wr->num_sge;
    if (wr->num_sge > 0) memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(r->sge[0]));
    q->rq_n++;
    if (q->ibv.state == IBV_QPS_ERR) qp_error(q, IBV_WC_WR_FLUSH_ERR);
  }
  process_inq(q); /* a request may have been waiting for this receive */
  pthread_mutex_unlock(&E.mu);
  if (rc && bad) *bad = wr;
  return rc;
}

/* ---- status strings, counts -------------------------------------------- */

EXPORT const char* ibv_wc_status_str(enum ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "work request flushed";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_FATAL_ERR: return "fatal error";
    default: return "other error";
  }
}

EXPORT int ibemu_qps_on(const char* dev) {
  int n = 0;
  pthread_mutex_lock(&E.mu);
  for (struct emu_qp* q = E.qps; q; q = q->next) n += !strcmp(q->dev->ibv.name, dev);
  pthread_mutex_unlock(&E.mu);
  return n;
}

EXPORT void ibemu_get_counts(struct ibemu_counts* c) {
  pthread_mutex_lock(&E.mu);
  *c = E.n;
  pthread_mutex_unlock(&E.mu);
}

__attribute__((destructor)) static void ibemu_report(void) {
  const char* path = getenv("COLLIE_IBEMU_REPORT");
  if (!path || !*path) return;
  char buf[4096];
  size_t o = 0;
  for (const char* p = path; *p && o + 16 < sizeof(buf); p++) {
    if (p[0] == '%' && p[1] == 'p') { o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%d", (int)getpid()); p++; }
    else buf[o++] = *p;
  }
  buf[o] = '\0';
  FILE* f = fopen(buf, "w");
  if (!f) return;
  struct ibemu_counts c = E.n;
  fprintf(f, "contexts %d\npds %d\nmrs %d\ncqs %d\nqps %d\nchannels %d\n", c.contexts, c.pds, c.mrs,
          c.cqs, c.qps, c.channels);
  fclose(f);
}
