/* The verbs layer of the IB transport (see net_ib_verbs.h): dlopen of
 * libibverbs, NCCL_IB_HCA device/port discovery with RoCE GID choice, RC QP
 * bring-up from an exchanged blob, and the MR registration cache. Reads its
 * settings from params.def (NCCL_IB_*); errors go through err_set (core.h).
 * Tested against the emulator in tests/ibemu/test_net_ib_verbs.c. */
#include "transport/net_ib_verbs.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "device/device.h"
#include "graph/bind.h"

/* ---- loading ----------------------------------------------------------- */

static struct ib_verbs ib_v;
static const struct ib_verbs* ib_v_ok;
static pthread_once_t ib_v_once = PTHREAD_ONCE_INIT;

static void ib_verbs_load(void) {
  static const struct { const char* name; size_t off; int required; } syms[] = {
#define SYM(field, name, req) {name, offsetof(struct ib_verbs, field), req}
      SYM(get_device_list, "ibv_get_device_list", 1),
      SYM(free_device_list, "ibv_free_device_list", 1),
      SYM(get_device_name, "ibv_get_device_name", 1),
      SYM(open_device, "ibv_open_device", 1),
      SYM(close_device, "ibv_close_device", 1),
      SYM(query_device, "ibv_query_device", 1),
      SYM(query_port, "ibv_query_port", 1),
      SYM(query_gid, "ibv_query_gid", 1),
      SYM(query_gid_ex, "_ibv_query_gid_ex", 0),
      SYM(alloc_pd, "ibv_alloc_pd", 1),
      SYM(dealloc_pd, "ibv_dealloc_pd", 1),
      SYM(reg_mr, "ibv_reg_mr", 1),
      SYM(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", 0),
      SYM(dereg_mr, "ibv_dereg_mr", 1),
      SYM(create_cq, "ibv_create_cq", 1),
      SYM(destroy_cq, "ibv_destroy_cq", 1),
      SYM(create_qp, "ibv_create_qp", 1),
      SYM(modify_qp, "ibv_modify_qp", 1),
      SYM(query_qp, "ibv_query_qp", 1),
      SYM(destroy_qp, "ibv_destroy_qp", 1),
      SYM(wc_status_str, "ibv_wc_status_str", 1),
#undef SYM
  };
  const char* path = param_str(P_COLLIE_IBVERBS_LIBRARY);
  if (!path) path = "libibverbs.so.1";
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: cannot load %s (%s); the IB transport is unavailable", path, dlerror());
    return;
  }
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    void* s = dlsym(h, syms[i].name);
    if (!s && syms[i].required) {
      INFO(LOG_NET | LOG_INIT, "NET/IB: %s lacks %s; the IB transport is unavailable", path, syms[i].name);
      dlclose(h);
      memset(&ib_v, 0, sizeof(ib_v));
      return;
    }
    memcpy((char*)&ib_v + syms[i].off, &s, sizeof(s)); /* object -> function pointer, as dlsym requires */
  }
  ib_v_ok = &ib_v; /* the library stays loaded for the life of the process */
}

const struct ib_verbs* ib_verbs_get(void) {
  pthread_once(&ib_v_once, ib_verbs_load);
  return ib_v_ok;
}

/* ---- devices and ports ------------------------------------------------- */

/* The CPUs near a device: <ibdev_path>/device/local_cpulist (the PCI
 * device's, through the sysfs link). 0, or -1 when it cannot be read. */
static int dev_local_cpus(struct ibv_device* dev, cpu_set_t* out) {
  char path[IBV_SYSFS_PATH_MAX + 32], buf[1024];
  snprintf(path, sizeof(path), "%s/device/local_cpulist", dev->ibdev_path);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
  buf[n] = '\0';
  return n > 0 && bind_cpulist_parse(buf, out) == 0 && CPU_COUNT(out) > 0 ? 0 : -1;
}

/* The device's place in the PCI tree: <ibdev_path>/device resolved (a
 * symlink into /sys/devices/pci...). "" when it cannot be resolved. */
static void dev_pci_path(struct ibv_device* dev, char* out, size_t len) {
  char path[IBV_SYSFS_PATH_MAX + 16], real[PATH_MAX];
  snprintf(path, sizeof(path), "%s/device", dev->ibdev_path);
  if (len) out[0] = '\0';
  if (realpath(path, real) && strlen(real) < len) snprintf(out, len, "%s", real);
}

int ib_pci_path(const char* root, const char* bus_id, char* out, size_t len) {
  char id[64], path[PATH_MAX], real[PATH_MAX];
  size_t i = 0;
  for (; bus_id[i] && i + 1 < sizeof(id); i++) id[i] = (char)tolower((unsigned char)bus_id[i]);
  id[i] = '\0';
  if (len) out[0] = '\0';
  if (!id[0]) return -1;
  snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", root, id);
  if (!realpath(path, real) || strlen(real) >= len) return -1;
  snprintf(out, len, "%s", real);
  return 0;
}

int ib_pci_distance(const char* a, const char* b) {
  if (!a || !b || !a[0] || !b[0]) return -1;
  /* Walk both paths component by component while they agree. */
  size_t i = 0, common = 0;
  while (a[i] && a[i] == b[i]) {
    if (a[i] == '/') common = i;
    i++;
  }
  if ((a[i] == '\0' || a[i] == '/') && (b[i] == '\0' || b[i] == '/')) common = i; /* one is a prefix of the other */
  int hops = 0;
  for (const char* p = a + common; *p; p++) hops += *p == '/';
  for (const char* p = b + common; *p; p++) hops += *p == '/';
  return hops;
}

int ib_port_pick_gpu(const struct ib_port* ports, int n, const char* gpu_path, int local_rank, int* hops) {
  int best = -1, cand[IB_MAX_PORTS], nc = 0;
  for (int i = 0; i < n && i < IB_MAX_PORTS; i++) {
    int d = ib_pci_distance(gpu_path, ports[i].pci_path);
    if (d < 0) continue;
    if (best < 0 || d < best) {
      best = d;
      nc = 0;
    }
    if (d == best) cand[nc++] = i;
  }
  if (nc == 0) return -1;
  *hops = best;
  return cand[(local_rank < 0 ? 0 : local_rank) % nc];
}

int ib_port_pick(const struct ib_port* ports, int n, const cpu_set_t* mine, int local_rank, int* local) {
  int cand[IB_MAX_PORTS], nc = 0;
  for (int i = 0; i < n && i < IB_MAX_PORTS; i++) {
    cpu_set_t both;
    if (!ports[i].has_cpus || !mine) continue;
    CPU_AND(&both, &ports[i].cpus, mine);
    if (CPU_COUNT(&both) > 0) cand[nc++] = i;
  }
  *local = nc > 0;
  if (n <= 0) return -1;
  if (nc == 0) return (local_rank < 0 ? 0 : local_rank) % n;
  return cand[(local_rank < 0 ? 0 : local_rank) % nc];
}

int ib_hca_match(const char* spec, const char* dev_name, int port) {
  if (!spec || !*spec) return 1;
  int exclude = 0, exact = 0;
  if (*spec == '^') { exclude = 1; spec++; }
  if (*spec == '=') { exact = 1; spec++; }
  int found = 0;
  while (*spec && !found) {
    const char* end = strchr(spec, ',');
    size_t len = end ? (size_t)(end - spec) : strlen(spec);
    const char* colon = memchr(spec, ':', len);
    size_t nlen = colon ? (size_t)(colon - spec) : len;
    int want_port = colon ? atoi(colon + 1) : -1;
    int name_ok = exact ? (strlen(dev_name) == nlen && !strncmp(dev_name, spec, nlen))
                        : (nlen > 0 && !strncmp(dev_name, spec, nlen));
    if (name_ok && (want_port < 0 || want_port == port)) found = 1;
    spec += len;
    if (*spec == ',') spec++;
  }
  return exclude ? !found : found;
}

static int gid_is_zero(const union ibv_gid* g) {
  static const uint8_t z[16];
  return !memcmp(g->raw, z, 16);
}

static int gid_is_ipv4(const union ibv_gid* g) {
  static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return !memcmp(g->raw, pfx, 12);
}

/* RoCE version of GID i: from ibv_query_gid_ex, else sysfs, else unknown (0). */
static int gid_roce_version(const struct ib_verbs* v, struct ibv_context* ctx, const char* dev, int port, int i) {
  if (v->query_gid_ex) {
    struct ibv_gid_entry e;
    if (v->query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0, sizeof(e)) != 0) return 0;
    return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? 1 : 0;
  }
  char path[256], buf[32] = {0};
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port, i);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  return strstr(buf, "v2") ? 2 : strstr(buf, "RoCE") || strstr(buf, "IB/RoCE") ? 1 : 0;
}

/* Picks the GID of a RoCE port: NCCL_IB_GID_INDEX when set, else the first
 * RoCE v2 GID with an IPv4-mapped address, else the first v2, else index 0. */
static int roce_pick_gid(const struct ib_verbs* v, struct ibv_context* ctx, struct ib_port* p, int tbl_len) {
  int64_t want = param_int(P_NCCL_IB_GID_INDEX, -1, 255);
  if (want >= 0) {
    p->gid_index = (int)want;
    return v->query_gid(ctx, (uint8_t)p->port, (int)want, &p->gid) == 0 && !gid_is_zero(&p->gid) ? 0 : -1;
  }
  int best = -1, best_score = -1;
  for (int i = 0; i < tbl_len; i++) {
    union ibv_gid g;
    if (v->query_gid(ctx, (uint8_t)p->port, i, &g) != 0 || gid_is_zero(&g)) continue;
    int score = (gid_roce_version(v, ctx, p->dev_name, p->port, i) == 2 ? 2 : 0) + gid_is_ipv4(&g);
    if (score > best_score) { best = i; best_score = score; p->gid = g; }
  }
  p->gid_index = best;
  return best >= 0 ? 0 : -1;
}

ncclResult_t ib_discover(struct ib_port* ports, int max, int* n) {
  *n = 0;
  if (param_int(P_NCCL_IB_DISABLE, 0, 1)) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: disabled by NCCL_IB_DISABLE=1");
    return ncclSuccess;
  }
  const struct ib_verbs* v = ib_verbs_get();
  if (!v) return ncclSuccess;
  const char* spec = param_str(P_NCCL_IB_HCA);
  int ndev = 0;
  struct ibv_device** list = v->get_device_list(&ndev);
  if (!list) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: ibv_get_device_list failed: %s", strerror(errno));
    return ncclSuccess;
  }
  for (int d = 0; d < ndev && *n < max; d++) {
    const char* name = v->get_device_name(list[d]);
    struct ibv_context* ctx = v->open_device(list[d]);
    struct ibv_device_attr da;
    if (!ctx) { INFO(LOG_NET, "NET/IB: cannot open %s: %s", name, strerror(errno)); continue; }
    if (v->query_device(ctx, &da) != 0) { v->close_device(ctx); continue; }
    for (int port = 1; port <= da.phys_port_cnt && *n < max; port++) {
      struct ibv_port_attr pa;
      memset(&pa, 0, sizeof(pa));
      if (v->query_port(ctx, (uint8_t)port, (struct _compat_ibv_port_attr*)&pa) != 0) continue;
      if (pa.state != IBV_PORT_ACTIVE || !ib_hca_match(spec, name, port)) continue;
      struct ib_port* p = &ports[*n];
      memset(p, 0, sizeof(*p));
      snprintf(p->dev_name, sizeof(p->dev_name), "%s", name);
      p->dev_index = d;
      p->port = port;
      p->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
      p->lid = pa.lid;
      p->mtu = pa.active_mtu;
      p->has_cpus = dev_local_cpus(list[d], &p->cpus) == 0;
      dev_pci_path(list[d], p->pci_path, sizeof(p->pci_path));
      if (p->link_layer == IBV_LINK_LAYER_ETHERNET) {
        if (roce_pick_gid(v, ctx, p, pa.gid_tbl_len) != 0) {
          WARN("NET/IB: %s:%d: no usable GID (NCCL_IB_GID_INDEX=%s); port skipped", name, port,
               param_str(P_NCCL_IB_GID_INDEX));
          continue;
        }
      } else {
        p->gid_index = 0;
        if (v->query_gid(ctx, (uint8_t)port, 0, &p->gid) != 0) memset(&p->gid, 0, sizeof(p->gid));
      }
      char cpus[128] = "unknown";
      if (p->has_cpus) bind_cpulist(&p->cpus, cpus, sizeof(cpus));
      INFO(LOG_NET | LOG_INIT, "NET/IB: found %s:%d (%s %d, local CPUs %s)", name, port,
           p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE, GID index" : "IB, LID",
           p->link_layer == IBV_LINK_LAYER_ETHERNET ? p->gid_index : (int)p->lid, cpus);
      (*n)++;
    }
    v->close_device(ctx);
  }
  v->free_device_list(list);
  return ncclSuccess;
}

/* ---- queue pairs ------------------------------------------------------- */

static ncclResult_t verbs_err(const char* what, const struct ib_port* p, int err) {
  return err_set(ncclSystemError, "NET/IB: %s on %s:%d failed: %s", what, p->dev_name, p->port,
                 strerror(err ? err : EIO));
}

ncclResult_t ib_qps_open(struct ib_qps* q, const struct ib_port* port, int nqps, int cq_depth,
                         int max_send_wr, int max_recv_wr) {
  memset(q, 0, sizeof(*q));
  q->v = ib_verbs_get();
  q->port = *port;
  if (!q->v) return err_set(ncclSystemError, "NET/IB: libibverbs is not available");
  if (nqps <= 0) nqps = (int)param_int(P_NCCL_IB_QPS_PER_CONNECTION, 1, IB_MAX_QPS);
  if (nqps > IB_MAX_QPS) return err_set(ncclInvalidArgument, "NET/IB: %d QPs per connection (at most %d)", nqps, IB_MAX_QPS);
  ncclResult_t res = ncclSuccess;
  int ndev = 0;
  struct ibv_device** list = q->v->get_device_list(&ndev);
  if (!list) return verbs_err("ibv_get_device_list", port, errno);
  for (int d = 0; d < ndev && !q->ctx; d++)
    if (!strcmp(q->v->get_device_name(list[d]), port->dev_name)) q->ctx = q->v->open_device(list[d]);
  q->v->free_device_list(list);
  if (!q->ctx) return verbs_err("ibv_open_device", port, errno);
  if (!(q->pd = q->v->alloc_pd(q->ctx))) { res = verbs_err("ibv_alloc_pd", port, errno); goto fail; }
  if (!(q->cq = q->v->create_cq(q->ctx, cq_depth, NULL, NULL, 0))) { res = verbs_err("ibv_create_cq", port, errno); goto fail; }
  for (int i = 0; i < nqps; i++) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ia.recv_cq = q->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)max_send_wr;
    ia.cap.max_recv_wr = (uint32_t)max_recv_wr;
    ia.cap.max_send_sge = 2; /* a direct write gathers the slot header and the user's payload */
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 64;
    if (!(q->qp[i] = q->v->create_qp(q->pd, &ia))) { res = verbs_err("ibv_create_qp", port, errno); goto fail; }
    q->nqps = i + 1;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = (uint8_t)port->port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    int rc = q->v->modify_qp(q->qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc) { res = verbs_err("ibv_modify_qp(INIT)", port, rc); goto fail; }
  }
  return ncclSuccess;
fail:
  ib_qps_close(q);
  return res;
}

void ib_qps_info(const struct ib_qps* q, struct ib_conn_info* info) {
  memset(info, 0, sizeof(*info));
  info->nqps = (uint32_t)q->nqps;
  for (int i = 0; i < q->nqps; i++) info->qpn[i] = q->qp[i]->qp_num;
  info->link_layer = (uint32_t)q->port.link_layer;
  info->mtu = (uint32_t)q->port.mtu;
  info->lid = q->port.lid;
  memcpy(info->gid, q->port.gid.raw, 16);
}

ncclResult_t ib_qps_connect(struct ib_qps* q, const struct ib_conn_info* peer) {
  const struct ib_port* p = &q->port;
  if (peer->nqps != (uint32_t)q->nqps)
    return err_set(ncclInternalError, "NET/IB: peer has %u QPs per connection, this rank %d (NCCL_IB_QPS_PER_CONNECTION must match)",
                   peer->nqps, q->nqps);
  if (peer->link_layer != (uint32_t)p->link_layer)
    return err_set(ncclSystemError, "NET/IB: %s:%d is %s but the peer's port is %s", p->dev_name, p->port,
                   p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                   peer->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
  enum ibv_mtu mtu = (enum ibv_mtu)peer->mtu < p->mtu ? (enum ibv_mtu)peer->mtu : p->mtu;
  for (int i = 0; i < q->nqps; i++) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = peer->qpn[i];
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = (uint8_t)p->port;
    a.ah_attr.sl = (uint8_t)param_int(P_NCCL_IB_SL, 0, 15);
    if (p->link_layer == IBV_LINK_LAYER_ETHERNET) {
      a.ah_attr.is_global = 1;
      memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
      a.ah_attr.grh.sgid_index = (uint8_t)p->gid_index;
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = (uint8_t)param_int(P_NCCL_IB_TC, 0, 255);
    } else {
      a.ah_attr.dlid = peer->lid;
    }
    int rc = q->v->modify_qp(q->qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc) return verbs_err("ibv_modify_qp(RTR)", p, rc);
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = (uint8_t)param_int(P_NCCL_IB_TIMEOUT, 1, 31);
    a.retry_cnt = (uint8_t)param_int(P_NCCL_IB_RETRY_CNT, 0, 7);
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    rc = q->v->modify_qp(q->qp[i], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc) return verbs_err("ibv_modify_qp(RTS)", p, rc);
  }
  return ncclSuccess;
}

void ib_qps_close(struct ib_qps* q) {
  if (!q->v) return;
  for (int i = 0; i < q->nqps; i++)
    if (q->qp[i]) { q->v->destroy_qp(q->qp[i]); q->qp[i] = NULL; }
  q->nqps = 0;
  if (q->cq) { q->v->destroy_cq(q->cq); q->cq = NULL; }
  if (q->pd) { q->v->dealloc_pd(q->pd); q->pd = NULL; }
  if (q->ctx) { q->v->close_device(q->ctx); q->ctx = NULL; }
}

/* ---- registration cache ------------------------------------------------ */

struct ib_reg {
  struct ib_reg *prev, *next;
  uintptr_t start, end;
  struct ibv_mr* mr;
  int refs;
  int stale; /* invalidated while in use: deregistered at the last put */
  int kept;  /* covers memory its owner promised to keep mapped (ncclCommRegister) */
  int dmabuf; /* device memory registered through a dma-buf */
};

void ib_regcache_init(struct ib_regcache* c, const struct ib_verbs* v, struct ibv_pd* pd, int capacity) {
  memset(c, 0, sizeof(*c));
  c->v = v;
  c->pd = pd;
  c->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  c->capacity = capacity > 0 ? capacity : 1;
}

static void reg_unlink(struct ib_regcache* c, struct ib_reg* e) {
  if (e->prev) e->prev->next = e->next; else c->head = e->next;
  if (e->next) e->next->prev = e->prev;
  e->prev = e->next = NULL;
}

static void reg_push_front(struct ib_regcache* c, struct ib_reg* e) {
  e->prev = NULL;
  e->next = c->head;
  if (c->head) c->head->prev = e;
  c->head = e;
}

static void reg_drop(struct ib_regcache* c, struct ib_reg* e) {
  reg_unlink(c, e);
  c->v->dereg_mr(e->mr);
  c->n--;
  free(e);
}

struct ibv_mr* ib_dmabuf_mr(const struct ib_verbs* v, struct ibv_pd* pd, int access, void* addr, size_t len,
                            uintptr_t* start, uintptr_t* end, char* why, size_t why_len) {
  if (!v->reg_dmabuf_mr) {
    snprintf(why, why_len, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34+)");
    errno = ENOSYS;
    return NULL;
  }
  struct device_dmabuf d;
  if (device_dmabuf_export(addr, len ? len : 1, &d, why, why_len) != 0) return NULL;
  struct ibv_mr* mr = v->reg_dmabuf_mr(pd, 0, d.size, (uint64_t)d.base, d.fd, access);
  int err = errno;
  close(d.fd);
  if (!mr) {
    snprintf(why, why_len, "ibv_reg_dmabuf_mr(%#lx + %zu) failed: %s (no GPUDirect RDMA support in the HCA driver?)",
             (unsigned long)d.base, d.size, strerror(err));
    errno = err;
    return NULL;
  }
  *start = d.base;
  *end = d.base + d.size;
  return mr;
}

static ncclResult_t reg_get(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr, int quiet, int keep,
                            int dev) {
  uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t start = (uintptr_t)addr & ~(pg - 1);
  uintptr_t end = ((uintptr_t)addr + (len ? len : 1) + pg - 1) & ~(pg - 1);
  if (dev) { /* a hit needs the exact bytes: the allocation around them is not known yet */
    start = (uintptr_t)addr;
    end = (uintptr_t)addr + (len ? len : 1);
  }
  for (struct ib_reg* e = c->head; e; e = e->next) {
    if (!e->stale && e->dmabuf == dev && e->start <= start && end <= e->end) {
      reg_unlink(c, e);
      reg_push_front(c, e);
      e->refs++;
      c->hits++;
      e->kept |= keep;
      *mr = e->mr;
      return ncclSuccess;
    }
  }
  struct ib_reg* e = calloc(1, sizeof(*e));
  if (!e) return err_set(ncclSystemError, "NET/IB: out of memory for a registration entry");
  char why[256] = "";
  if (dev) {
    e->mr = ib_dmabuf_mr(c->v, c->pd, c->access, addr, len, &start, &end, why, sizeof(why));
    e->dmabuf = 1;
  } else {
    e->mr = c->v->reg_mr(c->pd, (void*)start, end - start, c->access);
  }
  if (!e->mr) {
    int err = errno;
    free(e);
    if (quiet) return ncclSystemError;
    if (dev) return err_set(ncclSystemError, "NET/IB: GPUDirect RDMA: cannot register device memory %p + %zu: %s", addr,
                            len, why);
    return err_set(ncclSystemError, "NET/IB: ibv_reg_mr(%p, %zu bytes) failed: %s", (void*)start,
                   (size_t)(end - start), strerror(err));
  }
  e->start = start;
  e->end = end;
  e->refs = 1;
  e->kept = keep;
  reg_push_front(c, e);
  c->n++;
  c->misses++;
  /* Evict least recently used entries nobody holds. */
  struct ib_reg* tail = c->head;
  while (tail && tail->next) tail = tail->next;
  for (struct ib_reg* t = tail; t && c->n > c->capacity;) {
    struct ib_reg* prev = t->prev;
    if (t->refs == 0) { reg_drop(c, t); c->evictions++; }
    t = prev;
  }
  *mr = e->mr;
  return ncclSuccess;
}

ncclResult_t ib_reg_get(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr) {
  return reg_get(c, addr, len, mr, 0, 0, 0);
}

int ib_reg_try(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr) {
  return reg_get(c, addr, len, mr, 1, 0, 0) == ncclSuccess ? 0 : -1;
}

int ib_reg_try_kept(struct ib_regcache* c, void* addr, size_t len, struct ibv_mr** mr) {
  return reg_get(c, addr, len, mr, 1, 1, 0) == ncclSuccess ? 0 : -1;
}

ncclResult_t ib_reg_get_dmabuf(struct ib_regcache* c, void* addr, size_t len, int keep, struct ibv_mr** mr) {
  return reg_get(c, addr, len, mr, 0, keep, 1);
}

void ib_reg_put(struct ib_regcache* c, struct ibv_mr* mr) {
  for (struct ib_reg* e = c->head; e; e = e->next) {
    if (e->mr != mr) continue;
    if (e->refs > 0) e->refs--;
    if (e->refs == 0 && (e->stale || c->n > c->capacity)) reg_drop(c, e);
    return;
  }
}

static void reg_invalidate(struct ib_regcache* c, uintptr_t s, uintptr_t t, int kept_too) {
  for (struct ib_reg* e = c->head; e;) {
    struct ib_reg* next = e->next;
    if (e->start < t && s < e->end && (kept_too || !e->kept)) {
      if (e->refs == 0) reg_drop(c, e); else e->stale = 1;
    }
    e = next;
  }
}

void ib_reg_invalidate(struct ib_regcache* c, void* addr, size_t len) {
  reg_invalidate(c, (uintptr_t)addr, (uintptr_t)addr + len, 1);
}

void ib_reg_invalidate_unkept(struct ib_regcache* c) { reg_invalidate(c, 0, UINTPTR_MAX, 0); }

void ib_regcache_destroy(struct ib_regcache* c) {
  while (c->head) reg_drop(c, c->head);
}
