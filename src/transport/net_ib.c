/* The IB verbs transport: connectors over RC queue pairs (InfiniBand or
 * RoCE), through the verbs layer in net_ib_verbs.c. Each side keeps nslots
 * slots (header + payload) in registered memory with the same layout. The
 * sender RDMA-writes a committed slot (header and payload in one write) into
 * the receiver's slot of the same index, with the slot sequence number as
 * immediate data, which consumes a posted receive and tells the receiver the
 * slot is there. The receiver hands slots back by RDMA-writing its credit
 * limit (slots consumed + nslots) into the sender's control word, so the FIFO
 * model of the other transports holds. The sender starts with no credit: the
 * receiver's first limit is written only once its QPs are in RTR and its
 * receives posted, since a real responder drops packets that reach a QP
 * before RTR and the sender's retries would run out (setup order).
 * Large slots (at least COLLIE_IB_DIRECT_BYTES of payload) handed over with
 * send_commit_ext go straight from the caller's memory: one write gathers
 * the header from the registered slot and the payload from the user buffer,
 * registered through the connector's LRU registration cache
 * (net_ib_verbs.c); such a write is complete before send_commit_ext
 * returns, since callers may reuse the memory right after. Memory freed and
 * mapped again at the same address would leave a real HCA reading the old
 * pages, so cache entries live for one operation (its opseq): the next
 * operation registers afresh - except memory inside a range registered with
 * ncclCommRegister, which is registered whole once and kept until
 * ncclCommDeregister (comm->reg_gen changes; the next operation drops it).
 * Progress is made by whoever waits (poll_cq);
 * NCCL_IB_QPS_PER_CONNECTION QPs carry slots round-robin. Table entry:
 * connect.c; chosen by NCCL_NET=IB, or by default when an HCA is usable. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../bootstrap/bootstrap.h"
#include "../comm.h"
#include "../comm_err.h"
#include "../device/device.h"
#include "../graph/bind.h"
#include "net_ib_verbs.h"
#include "transport.h"

#define IB_HDR_BYTES 64 /* a slot's header area (struct slot_hdr, padded) */

/* Written by the peer with RDMA: the receiver's credit limit (the sender may
 * have committed up to `limit` slots in all; 0 until the receiver is ready)
 * and its poison flag, in the sender's memory. */
struct ib_ctrl {
  volatile uint64_t limit;
  volatile uint64_t poison;
  uint64_t src; /* receiver: the value being written (source of the RDMA) */
  uint64_t src_poison;
};

struct ib_end_info {
  struct ib_conn_info qp;
  uint64_t slots_addr, ctrl_addr;
  uint32_t slots_rkey, ctrl_rkey;
};

struct ib_conn {
  struct ib_qps q;
  struct ibv_mr* slots_mr;
  struct ibv_mr* ctrl_mr;
  char* slots;           /* nslots x stride, registered */
  struct ib_ctrl* ctrl;  /* registered */
  size_t stride;
  struct ib_end_info peer;
  uint8_t* arrived;      /* receiver: slot i's write has landed */
  struct ib_regcache rc; /* sender: user memory registered for direct writes */
  struct ibv_mr** held;  /* sender: slot i's write reads user memory through this MR */
  uint64_t rc_opseq;     /* sender: the operation the cache entries belong to */
  uint64_t op_left;      /* sender: payload bytes of that operation still to commit */
  uint64_t reg_gen;      /* sender: comm->reg_gen when the kept entries were last checked */
  size_t direct_min;     /* sender: payload bytes from which slots go direct (0: never) */
  uint64_t ndirect, nbounce_big; /* sender: slots sent direct / big ones copied (no MR) */
  uint64_t ndevice;      /* sender: slots read from device memory (GPUDirect RDMA) */
  uint32_t pos;          /* sender: slots committed; receiver: slots consumed */
  uint32_t done;         /* sender: writes completed; receiver: slots landed in order */
  int outstanding;       /* send WRs not completed yet */
  int failed;
  char why[160];
};

static const struct ib_port* ib_chosen(struct ncclComm* comm);

static char* ib_slot(struct conn* c, uint32_t i) {
  struct ib_conn* s = c->priv;
  return s->slots + (size_t)(i % (uint32_t)c->nslots) * s->stride;
}

static ncclResult_t ib_error(struct conn* c, const char* what) {
  struct ib_conn* s = c->priv;
  if (!s->failed) snprintf(s->why, sizeof(s->why), "%s", what);
  s->failed = 1;
  NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
  return err_set(ncclRemoteError, "NET/IB: rank %d: connection with rank %d (%s) failed: %s", c->comm->rank, c->peer,
                 bootstrap_peer_host(c->comm->bs, c->peer), s->why);
}

static ncclResult_t ib_post_recv(struct conn* c, struct ibv_qp* qp) {
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  int rc = ibv_post_recv(qp, &wr, &bad);
  return rc ? ib_error(c, "ibv_post_recv failed") : ncclSuccess;
}

/* Reaps completions: sender writes done, receiver slots landed. A sender's
 * failed write is an error at once (its data is lost). A receiver's failure
 * (a credit write or a posted receive ends in error: the sender closed its
 * end or died) only marks the connector: slots already landed stay readable,
 * and a consumer that waits for more learns it through peer_failed, as with
 * a socket that reached EOF, since a sender that is done closes when it likes. */
static ncclResult_t ib_progress(struct conn* c) {
  struct ib_conn* s = c->priv;
  if (s->failed) return c->is_send ? ib_error(c, s->why) : ncclSuccess;
  struct ibv_wc wc[16];
  int n;
  while ((n = ibv_poll_cq(s->q.cq, 16, wc)) > 0) {
    for (int i = 0; i < n; i++) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        char why[128];
        snprintf(why, sizeof(why), "%s completion: %s", wc[i].opcode & IBV_WC_RECV ? "receive" : "send",
                 s->q.v->wc_status_str(wc[i].status));
        if (c->is_send) return ib_error(c, why);
        if (!s->failed) snprintf(s->why, sizeof(s->why), "%s", why);
        s->failed = 1;
        continue;
      }
      if (wc[i].opcode & IBV_WC_RECV) {
        uint32_t seq = ntohl(wc[i].imm_data);
        s->arrived[seq % (uint32_t)c->nslots] = 1;
        for (int k = 0; k < s->q.nqps; k++)
          if (s->q.qp[k]->qp_num == wc[i].qp_num) NCCLCHECK(ib_post_recv(c, s->q.qp[k]));
      } else {
        s->outstanding--;
        if (c->is_send) {
          s->done++;
          struct ibv_mr** h = &s->held[wc[i].wr_id % (uint32_t)c->nslots];
          if (*h) { ib_reg_put(&s->rc, *h); *h = NULL; }
        }
      }
    }
  }
  if (n < 0) return ib_error(c, "ibv_poll_cq failed");
  if (!c->is_send)
    while ((uint32_t)(s->done - s->pos) < (uint32_t)c->nslots && s->arrived[s->done % (uint32_t)c->nslots]) s->done++;
  if (c->is_send && s->ctrl->poison) return ib_error(c, "the receiver failed");
  return ncclSuccess;
}

/* One signalled RDMA write gathering sg[0..nsg) into raddr; wr_id: the slot
 * sequence (a sender's completion releases that slot's registration). */
static ncclResult_t ib_write_sg(struct conn* c, struct ibv_qp* qp, struct ibv_sge* sg, int nsg, uint64_t raddr,
                                uint32_t rkey, int imm, uint32_t imm_val, int inl, uint64_t wr_id) {
  struct ib_conn* s = c->priv;
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = wr_id;
  wr.sg_list = sg;
  wr.num_sge = nsg;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
  wr.imm_data = htonl(imm_val);
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  int rc = ibv_post_send(qp, &wr, &bad);
  if (rc) return ib_error(c, "ibv_post_send failed");
  s->outstanding++;
  return ncclSuccess;
}

static ncclResult_t ib_write(struct conn* c, struct ibv_qp* qp, void* src, uint32_t len, uint32_t lkey,
                             uint64_t raddr, uint32_t rkey, int imm, uint32_t imm_val, int inl) {
  struct ibv_sge sg = {(uintptr_t)src, len, lkey};
  return ib_write_sg(c, qp, &sg, 1, raddr, rkey, imm, imm_val, inl, ((struct ib_conn*)c->priv)->pos);
}

static void* ib_send_slot(struct conn* c, size_t bytes) {
  (void)bytes; /* whole slots: a payload starts at the slot's start */
  struct ib_conn* s = c->priv;
  if ((int32_t)((uint32_t)s->ctrl->limit - s->pos) <= 0) return NULL; /* no credit (yet) */
  return ib_slot(c, s->pos) + IB_HDR_BYTES;
}

static ncclResult_t ib_send_commit(struct conn* c, const struct slot_hdr* h) {
  struct ib_conn* s = c->priv;
  char* slot = ib_slot(c, s->pos);
  memcpy(slot, h, sizeof(*h));
  uint32_t i = s->pos % (uint32_t)c->nslots;
  struct ibv_qp* qp = s->q.qp[s->pos % (uint32_t)s->q.nqps];
  NCCLCHECK(ib_write(c, qp, slot, (uint32_t)(IB_HDR_BYTES + h->bytes), s->slots_mr->lkey,
                     s->peer.slots_addr + (uint64_t)i * s->stride, s->peer.slots_rkey, 1, s->pos, 0));
  s->pos++;
  return ib_progress(c);
}

/* The caller's memory behind a direct write: an MR from the cache covering
 * [data, data+bytes), trying first the rest of the operation from data on
 * (later slots of a stream through one buffer then hit), else just this
 * slot's bytes. NULL when it cannot be registered (e.g. read-only memory):
 * the slot is then copied. */
static void ib_op_begin(struct conn* c, const struct slot_hdr* h) {
  struct ib_conn* s = c->priv;
  if (h->opseq != s->rc_opseq) {
    /* A new operation: the previous one's memory may be gone by now, unless
     * it is registered with the communicator and still is. */
    uint64_t gen = __atomic_load_n(&c->comm->reg_gen, __ATOMIC_ACQUIRE);
    if (gen != s->reg_gen) ib_reg_invalidate(&s->rc, NULL, UINTPTR_MAX);
    else ib_reg_invalidate_unkept(&s->rc);
    s->reg_gen = gen;
    s->rc_opseq = h->opseq;
    s->op_left = h->total & 0xffffffffffffull; /* the low 48 bits: bytes of the operation here */
  }
}

static struct ibv_mr* ib_direct_mr(struct conn* c, const struct slot_hdr* h, const void* data) {
  struct ib_conn* s = c->priv;
  ib_op_begin(c, h);
  struct ibv_mr* mr = NULL;
  /* ncclCommRegister'd memory: the whole range, once, kept across operations. */
  uintptr_t lo, hi;
  if (comm_reg_lookup(c->comm, data, h->bytes, &lo, &hi) && ib_reg_try_kept(&s->rc, (void*)lo, hi - lo, &mr) == 0)
    return mr;
  size_t want = s->op_left > h->bytes ? (size_t)s->op_left : h->bytes;
  if (want > h->bytes && ib_reg_try(&s->rc, (void*)data, want, &mr) == 0) return mr;
  if (ib_reg_try(&s->rc, (void*)data, h->bytes, &mr) == 0) return mr;
  INFO_ONCE(LOG_NET, "NET/IB: cannot register %p + %u bytes of user memory (%s); such slots are copied",
            data, h->bytes, strerror(errno));
  return NULL;
}

static ncclResult_t ib_write_direct(struct conn* c, const struct slot_hdr* h, const void* data, struct ibv_mr* mr);

/* Sender: the slot's payload is at `data` (unchanged until the operation
 * ends). Big slots are written from there, small ones copied into the slot. */
static ncclResult_t ib_send_commit_ext(struct conn* c, const struct slot_hdr* h, const void* data) {
  struct ib_conn* s = c->priv;
  char* slot = ib_slot(c, s->pos);
  struct ibv_mr* mr = NULL;
  if (data && h->bytes && s->direct_min && h->bytes >= s->direct_min) {
    mr = ib_direct_mr(c, h, data);
    s->op_left = s->op_left > h->bytes ? s->op_left - h->bytes : 0;
    if (!mr) s->nbounce_big++;
  }
  if (!mr) {
    if (data && h->bytes) memcpy(slot + IB_HDR_BYTES, data, h->bytes);
    return ib_send_commit(c, h);
  }
  NCCLCHECK(ib_write_direct(c, h, data, mr));
  s->ndirect++;
  return ncclSuccess;
}

/* Sender, GPUDirect RDMA: `data` is device memory the CPU never touches; the
 * HCA reads it through a dma-buf registration (ib_reg_get_dmabuf: the whole
 * allocation, once per operation, or kept while it is registered with
 * ncclCommRegister), whatever the slot's size. */
static ncclResult_t ib_send_commit_dev(struct conn* c, const struct slot_hdr* h, const void* data) {
  struct ib_conn* s = c->priv;
  if (!h->bytes) return ib_send_commit(c, h);
  ib_op_begin(c, h);
  struct ibv_mr* mr = NULL;
  uintptr_t lo, hi;
  if (comm_reg_lookup(c->comm, data, h->bytes, &lo, &hi))
    NCCLCHECK(ib_reg_get_dmabuf(&s->rc, (void*)lo, hi - lo, 1, &mr));
  else
    NCCLCHECK(ib_reg_get_dmabuf(&s->rc, (void*)data, h->bytes, 0, &mr));
  s->ndevice++;
  return ib_write_direct(c, h, data, mr);
}

/* One write gathering the slot's header (registered slot) and its payload
 * from `data` through `mr` (held until the write completes, which it does
 * before this returns). */
static ncclResult_t ib_write_direct(struct conn* c, const struct slot_hdr* h, const void* data, struct ibv_mr* mr) {
  struct ib_conn* s = c->priv;
  char* slot = ib_slot(c, s->pos);
  memcpy(slot, h, sizeof(*h));
  uint32_t i = s->pos % (uint32_t)c->nslots;
  struct ibv_qp* qp = s->q.qp[s->pos % (uint32_t)s->q.nqps];
  struct ibv_sge sg[2] = {{(uintptr_t)slot, IB_HDR_BYTES, s->slots_mr->lkey},
                          {(uintptr_t)data, h->bytes, mr->lkey}};
  s->held[i] = mr;
  ncclResult_t res = ib_write_sg(c, qp, sg, 2, s->peer.slots_addr + (uint64_t)i * s->stride, s->peer.slots_rkey, 1,
                                 s->pos, 0, s->pos);
  if (res != ncclSuccess) {
    s->held[i] = NULL;
    ib_reg_put(&s->rc, mr);
    return res;
  }
  s->pos++;
  /* The HCA reads the payload at some point before the completion, and
   * callers may write to `data` before the operation ends (the one-shot
   * algorithms combine into an in-place buffer as soon as their receives are
   * done; a socket has taken the bytes by then). So the write completes here,
   * as a socket's send would: one round trip per big slot. Bounded by the
   * QP's retry budget (an error completion) and by abort/revoke. */
  for (unsigned spin = 0; s->held[i]; spin++) {
    NCCLCHECK(ib_progress(c));
    if (!s->held[i]) break;
    NCCLCHECK(comm_stop_check(c->comm));
    if (spin > 64) usleep(20);
  }
  return ncclSuccess;
}

static const void* ib_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct ib_conn* s = c->priv;
  if (s->done == s->pos) return NULL;
  const char* slot = ib_slot(c, s->pos);
  memcpy(h, slot, sizeof(*h));
  return slot + IB_HDR_BYTES;
}

/* Receiver: tells the sender it may commit slots up to pos + nslots. Inline,
 * so the value is copied at post time (later credits only raise it). */
static ncclResult_t ib_send_credit(struct conn* c) {
  struct ib_conn* s = c->priv;
  s->ctrl->src = (uint64_t)(uint32_t)(s->pos + (uint32_t)c->nslots);
  return ib_write(c, s->q.qp[0], &s->ctrl->src, sizeof(uint64_t), s->ctrl_mr->lkey,
                  s->peer.ctrl_addr + offsetof(struct ib_ctrl, limit), s->peer.ctrl_rkey, 0, 0, 1);
}

/* Hands the oldest slot back: the new credit limit goes to the sender. */
static ncclResult_t ib_recv_release(struct conn* c) {
  struct ib_conn* s = c->priv;
  s->arrived[s->pos % (uint32_t)c->nslots] = 0;
  s->pos++;
  NCCLCHECK(ib_send_credit(c));
  return ib_progress(c);
}

static void ib_wait(struct conn* c, int timeout_ms) {
  (void)c;
  if (timeout_ms > 0) usleep(50); /* completions are polled, not signalled */
}

static void ib_fail(struct conn* c) {
  struct ib_conn* s = c->priv;
  if (!s || s->failed || !s->q.nqps) return;
  s->failed = 1;
  snprintf(s->why, sizeof(s->why), "failed locally");
  if (!c->is_send) {
    /* Best effort: tell the sender through its control word. */
    s->ctrl->src_poison = 1;
    struct ibv_sge sg = {(uintptr_t)&s->ctrl->src_poison, sizeof(uint64_t), s->ctrl_mr->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = s->peer.ctrl_addr + offsetof(struct ib_ctrl, poison);
    wr.wr.rdma.rkey = s->peer.ctrl_rkey;
    (void)ibv_post_send(s->q.qp[0], &wr, &bad);
  }
}

static int ib_pending(struct conn* c) {
  struct ib_conn* s = c->priv;
  return c->is_send && !s->failed && s->done != s->pos;
}

static int ib_peer_failed(struct conn* c) { return ((struct ib_conn*)c->priv)->failed; }

/* Tears down in the order verbs wants: QPs, MRs, CQ, PD, device. */
static void ib_close(struct conn* c) {
  struct ib_conn* s = c->priv;
  if (!s) return;
  const struct ib_verbs* v = s->q.v;
  for (int i = 0; v && i < s->q.nqps; i++)
    if (s->q.qp[i]) { v->destroy_qp(s->q.qp[i]); s->q.qp[i] = NULL; }
  s->q.nqps = 0;
  if (v && s->slots_mr) v->dereg_mr(s->slots_mr);
  if (v && s->ctrl_mr) v->dereg_mr(s->ctrl_mr);
  if (c->is_send && s->rc.v) {
    INFO(LOG_NET, "NET/IB: rank %d -> rank %d: %llu slots written straight from user memory and %llu from device "
         "memory (%llu registrations, %llu reused), %llu big ones copied (not registrable)", c->comm->rank, c->peer,
         (unsigned long long)s->ndirect, (unsigned long long)s->ndevice, (unsigned long long)s->rc.misses,
         (unsigned long long)s->rc.hits, (unsigned long long)s->nbounce_big);
    ib_regcache_destroy(&s->rc);
  }
  ib_qps_close(&s->q);
  free(s->held);
  free(s->slots);
  free(s->ctrl);
  free(s->arrived);
  free(s);
  c->priv = NULL;
}

static const struct conn_ops ib_ops = {
    .send_slot = ib_send_slot,
    .send_commit = ib_send_commit,
    .send_commit_ext = ib_send_commit_ext,
    .send_commit_dev = ib_send_commit_dev,
    .recv_slot = ib_recv_slot,
    .recv_release = ib_recv_release,
    .progress = ib_progress,
    .wait = ib_wait,
    .fail = ib_fail,
    .pending = ib_pending,
    .peer_failed = ib_peer_failed,
    .close = ib_close,
};

/* Both sides: the port, QPs, registered slots and control word. */
static ncclResult_t ib_setup(struct conn* c, void* info, size_t* len) {
  const struct ib_port* port = ib_chosen(c->comm);
  if (!port) return err_set(ncclSystemError, "NET/IB: rank %d has no usable HCA port", c->comm->rank);
  struct ib_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "NET/IB: out of memory");
  c->priv = s;
  c->ops = &ib_ops;
  ncclResult_t res;
  s->stride = IB_HDR_BYTES + ((c->slot_bytes + 63) & ~(size_t)63);
  size_t bytes = s->stride * (size_t)c->nslots;
  int nq = (int)param_int(P_NCCL_IB_QPS_PER_CONNECTION, 1, IB_MAX_QPS);
  int depth = 2 * c->nslots + 8;
  NCCLCHECKGOTO(ib_qps_open(&s->q, port, nq, 2 * depth * nq, depth, c->nslots / nq + 2), res, fail);
  if (posix_memalign((void**)&s->slots, 4096, bytes) != 0 || posix_memalign((void**)&s->ctrl, 4096, 4096) != 0 ||
      !(s->arrived = calloc((size_t)c->nslots, 1)) || !(s->held = calloc((size_t)c->nslots, sizeof(*s->held)))) {
    res = err_set(ncclSystemError, "NET/IB: out of memory for %zu bytes of slots", bytes);
    goto fail;
  }
  memset(s->slots, 0, bytes);
  memset(s->ctrl, 0, 4096);
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  s->slots_mr = s->q.v->reg_mr(s->q.pd, s->slots, bytes, access);
  s->ctrl_mr = s->q.v->reg_mr(s->q.pd, s->ctrl, 4096, access);
  if (!s->slots_mr || !s->ctrl_mr) {
    res = err_set(ncclSystemError, "NET/IB: ibv_reg_mr on %s:%d failed: %s", port->dev_name, port->port, strerror(errno));
    goto fail;
  }
  if (c->is_send) {
    s->direct_min = (size_t)param_int(P_COLLIE_IB_DIRECT_BYTES, 0, INT64_MAX);
    s->rc_opseq = UINT64_MAX;
    ib_regcache_init(&s->rc, s->q.v, s->q.pd, 64);
  }
  if (!c->is_send)
    for (int k = 0; k < s->q.nqps; k++)
      for (int j = 0; j < c->nslots / s->q.nqps + 1; j++) NCCLCHECKGOTO(ib_post_recv(c, s->q.qp[k]), res, fail);
  struct ib_end_info me;
  memset(&me, 0, sizeof(me));
  ib_qps_info(&s->q, &me.qp);
  me.slots_addr = (uintptr_t)s->slots;
  me.slots_rkey = s->slots_mr->rkey;
  me.ctrl_addr = (uintptr_t)s->ctrl;
  me.ctrl_rkey = s->ctrl_mr->rkey;
  memcpy(info, &me, sizeof(me));
  *len = sizeof(me);
  return ncclSuccess;
fail:
  ib_close(c);
  return res;
}

static ncclResult_t ib_connect(struct conn* c, const void* info, size_t len) {
  struct ib_conn* s = c->priv;
  if (len != sizeof(s->peer)) return err_set(ncclInternalError, "NET/IB: bad connector info (%zu bytes)", len);
  memcpy(&s->peer, info, sizeof(s->peer));
  NCCLCHECK(ib_qps_connect(&s->q, &s->peer.qp));
  /* The receiver connects last (after the sender's acknowledgement, so the
   * sender's QPs are in RTS): its QPs are in RTR and its receives posted now,
   * so it grants the first nslots credits. Until then the sender writes
   * nothing. */
  if (!c->is_send) NCCLCHECK(ib_send_credit(c));
  return ncclSuccess;
}

/* ---- port choice --------------------------------------------------------- */

static struct ib_port ib_ports[IB_MAX_PORTS];
static int ib_nports = -1;
static pthread_mutex_t ib_ports_mu = PTHREAD_MUTEX_INITIALIZER;

/* The port of this rank (ports discovered once per process): among the
 * ports NCCL_IB_HCA allows, with a GPU (its PCI bus id known at init) those
 * nearest to it in the PCI tree (sysfs paths); else, or when no place is
 * known, those whose device is local to the CPUs this process may run on
 * (sysfs local_cpulist); dealt round-robin over the local ranks; none
 * local (or unknown): all ports, round-robin. */
static const struct ib_port* ib_chosen(struct ncclComm* comm) {
  pthread_mutex_lock(&ib_ports_mu);
  if (ib_nports < 0 && ib_discover(ib_ports, IB_MAX_PORTS, &ib_nports) != ncclSuccess) ib_nports = 0;
  int n = ib_nports;
  pthread_mutex_unlock(&ib_ports_mu);
  if (n <= 0) return NULL;
  cpu_set_t mine;
  int have = sched_getaffinity(0, sizeof(mine), &mine) == 0, local = 0;
  char cpus[128] = "unknown";
  if (have) bind_cpulist(&mine, cpus, sizeof(cpus));
  const char* gpu = comm->peers ? comm->peers[comm->rank].pci_bus_id : "";
  char gpu_path[PATH_MAX];
  int hops = -1;
  if (gpu[0] && ib_pci_path("/sys", gpu, gpu_path, sizeof(gpu_path)) == 0) {
    int g = ib_port_pick_gpu(ib_ports, n, gpu_path, comm->local_rank, &hops);
    if (g >= 0) {
      const struct ib_port* p = &ib_ports[g];
      INFO_ONCE(LOG_NET | LOG_INIT, "NET/IB: using %s:%d (%s) for rank %d (GPU %s): nearest to its GPU (%d PCI hops)",
                p->dev_name, p->port, p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", comm->rank, gpu, hops);
      return p;
    }
  }
  int i = ib_port_pick(ib_ports, n, have ? &mine : NULL, comm->local_rank, &local);
  const struct ib_port* p = &ib_ports[i];
  INFO_ONCE(LOG_NET | LOG_INIT, "NET/IB: using %s:%d (%s) for rank %d (CPUs %s): %s", p->dev_name, p->port,
            p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", comm->rank, cpus,
            local ? "local to its CPUs" : n > 1 ? "no NIC local to its CPUs, round-robin" : "the only port");
  return p;
}

static int ib_can_connect(struct ncclComm* comm, int peer) {
  (void)peer;
  return ib_chosen(comm) != NULL;
}

/* GPUDirect RDMA for a send of device memory (the device executor asks
 * before staging it): once per communicator, registering the first such
 * buffer's dma-buf on this rank's port tells whether libibverbs, the CUDA
 * driver and the HCA's driver all support it (one INFO line either way);
 * after that, per call, whether this buffer can be exported. */
static int ib_dev_send_probe(struct ncclComm* comm, int peer, const void* p, size_t bytes, char* why, size_t len) {
  (void)peer;
  if (comm->gdr_state < 0) {
    snprintf(why, len, "GPUDirect RDMA is off for this communicator (see the NET/IB INFO line)");
    return -1;
  }
  /* Memory that cannot be exported says nothing about the HCA: the next
   * buffer is asked again. A check only: the send registers it. */
  if (device_dmabuf_export(p, bytes, NULL, why, len) != 0) return -1;
  if (comm->gdr_state > 0) return 0;
  const struct ib_port* port = ib_chosen(comm);
  struct ib_qps q;
  memset(&q, 0, sizeof(q));
  if (!port) {
    snprintf(why, len, "no usable HCA port");
  } else if (ib_qps_open(&q, port, 1, 4, 1, 1) != ncclSuccess) {
    snprintf(why, len, "%s", err_last_thread());
  } else {
    uintptr_t lo, hi;
    struct ibv_mr* mr = ib_dmabuf_mr(q.v, q.pd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
                                     (void*)p, bytes, &lo, &hi, why, len);
    if (mr) {
      q.v->dereg_mr(mr);
      comm->gdr_state = 1;
    }
  }
  ib_qps_close(&q);
  if (comm->gdr_state > 0) {
    INFO(LOG_NET | LOG_INIT, "NET/IB: GPUDirect RDMA on %s:%d for rank %d: sends read device memory through dma-buf "
         "registrations", port->dev_name, port->port, comm->rank);
    return 0;
  }
  comm->gdr_state = -1;
  INFO(LOG_NET | LOG_INIT, "NET/IB: GPUDirect RDMA off for rank %d: %s; device buffers are staged through host memory",
       comm->rank, why);
  return -1;
}

const struct transport transport_ib = {
    .name = "IB",
    .caps = TRANSPORT_CAP_PROGRESS | TRANSPORT_CAP_FLUSH | TRANSPORT_CAP_NET | TRANSPORT_CAP_DEVICE_SEND,
    .can_connect = ib_can_connect,
    .dev_send_probe = ib_dev_send_probe,
    .send = {ib_setup, ib_connect, ib_close},
    .recv = {ib_setup, ib_connect, ib_close},
    .ops = &ib_ops,
};
