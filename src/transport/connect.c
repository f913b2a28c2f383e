/* Lazy connector setup: when an operation needs to talk to a peer and no
 * connector exists yet, the receiving side creates its end (shm segment or
 * socket listener) and sends its description through the bootstrap; the
 * sender attaches and acknowledges; the receiver then finalises (closes the
 * memfd, accepts the socket). Both sides choose the same transport because
 * the receiver decides and says which. */
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../comm.h"
#include "../failures.h"
#include "transport.h"

/* Setup messages carry the channel in their tag. */
#define TAG_CONN_INFO 0x7f000001u
#define TAG_CONN_ACK 0x7f000002u
#define TAG_CH(tag, ch) ((tag) + 0x100u * (uint32_t)(ch))


struct conn_info {
  int32_t type;
  int32_t len;
  uint8_t data[TRANSPORT_INFO_BYTES];
};

/* shm when both ranks share a host (same host hash) and it is not disabled. */
static int choose_type(struct ncclComm* comm, int peer) {
  if (comm->shm_disable) return CONN_SOCKET;
  if (comm->peers[peer].host_hash != comm->peers[comm->rank].host_hash) return CONN_SOCKET;
  return CONN_SHM;
}

static ncclResult_t ensure_tables(struct ncclComm* comm) {
  if (comm->send_conns) return ncclSuccess;
  comm->send_conns = calloc((size_t)comm->nranks * MAX_CHANNELS, sizeof(struct conn*));
  comm->recv_conns = calloc((size_t)comm->nranks * MAX_CHANNELS, sizeof(struct conn*));
  if (!comm->send_conns || !comm->recv_conns) return err_set(ncclSystemError, "out of memory for connectors");
  const char* net = param_str(P_NCCL_NET);
  if (net && strcasecmp(net, "Socket") != 0)
    return err_set(ncclInvalidUsage, "NCCL_NET=%s: only the Socket network transport is built so far", net);
  int64_t nslots = param_int(P_COLLIE_NSLOTS, 2, 16);
  int64_t buff = param_int(P_NCCL_BUFFSIZE, 4096 * 2, (int64_t)1 << 30);
  /* Sockets move whole slots per system call: between hosts (or with shared
   * memory off) default to 4 MiB per connector unless NCCL_BUFFSIZE says otherwise. */
  if (!getenv("NCCL_BUFFSIZE") && (comm->nhosts > 1 || comm->shm_disable)) buff = 4 << 20;
  comm->nslots = (int)nslots;
  comm->slot_bytes = ((size_t)buff / (size_t)nslots) & ~(size_t)63;
  return ncclSuccess;
}

static void conn_free(struct conn* c) {
  if (!c) return;
  if (c->ops) c->ops->close(c);
  free(c);
}

void transport_close_all(struct ncclComm* comm) {
  for (int i = 0; comm->send_conns && i < comm->nranks * MAX_CHANNELS; i++) conn_free(comm->send_conns[i]);
  for (int i = 0; comm->recv_conns && i < comm->nranks * MAX_CHANNELS; i++) conn_free(comm->recv_conns[i]);
  free(comm->send_conns);
  free(comm->recv_conns);
  comm->send_conns = comm->recv_conns = NULL;
}

static struct conn* conn_new(struct ncclComm* comm, int ch, int peer, int is_send) {
  struct conn* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->comm = comm;
  c->channel = ch;
  c->peer = peer;
  c->is_send = is_send;
  c->nslots = comm->nslots;
  c->slot_bytes = comm->slot_bytes;
  return c;
}

ncclResult_t transport_connect(struct ncclComm* comm, const int* send_peers, int nsend, const int* recv_peers,
                               int nrecv, struct conn** sends, struct conn** recvs) {
  return transport_connect_ch(comm, 0, send_peers, nsend, recv_peers, nrecv, sends, recvs);
}

ncclResult_t transport_connect_ch(struct ncclComm* comm, int ch, const int* send_peers, int nsend,
                                  const int* recv_peers, int nrecv, struct conn** sends, struct conn** recvs) {
  NCCLCHECK(ensure_tables(comm));
  struct conn** send_tab = comm->send_conns + (size_t)ch * comm->nranks;
  struct conn** recv_tab = comm->recv_conns + (size_t)ch * comm->nranks;
  ncclResult_t res = ncclSuccess;
  /* 1. Receiving ends first: create them and describe them to the senders. */
  for (int i = 0; i < nrecv; i++) {
    int p = recv_peers[i];
    if (recv_tab[p]) continue;
    struct conn* c = conn_new(comm, ch, p, 0);
    if (!c) return err_set(ncclSystemError, "out of memory for a connector");
    c->type = choose_type(comm, p);
    struct conn_info info = {.type = c->type};
    size_t len = 0;
    res = c->type == CONN_SHM ? shm_recv_setup(c, info.data, &len) : sock_recv_setup(c, info.data, &len);
    if (res != ncclSuccess) {
      conn_free(c);
      return res;
    }
    info.len = (int32_t)len;
    recv_tab[p] = c;
    c->opseq = (uint64_t)-1; /* marks "not acknowledged yet" */
    NCCLCHECK(bootstrap_send(comm->bs, p, TAG_CH(TAG_CONN_INFO, ch), &info, sizeof(info)));
  }
  /* 2. Sending ends: attach and acknowledge. */
  for (int i = 0; i < nsend; i++) {
    int p = send_peers[i];
    if (send_tab[p]) continue;
    struct conn_info info;
    NCCLCHECK(bootstrap_recv(comm->bs, p, TAG_CH(TAG_CONN_INFO, ch), &info, sizeof(info)));
    struct conn* c = conn_new(comm, ch, p, 1);
    if (!c) return err_set(ncclSystemError, "out of memory for a connector");
    c->type = info.type;
    if (info.len < 0 || info.len > TRANSPORT_INFO_BYTES) res = err_set(ncclInternalError, "bad connector info");
    else if (info.type == CONN_SHM) res = shm_send_connect(c, info.data, (size_t)info.len);
    else if (info.type == CONN_SOCKET) res = sock_send_connect(c, info.data, (size_t)info.len);
    else res = err_set(ncclInternalError, "rank %d offered unknown transport %d", p, info.type);
    int32_t ok = res == ncclSuccess;
    ncclResult_t r2 = bootstrap_send(comm->bs, p, TAG_CH(TAG_CONN_ACK, ch), &ok, sizeof(ok));
    if (res != ncclSuccess || r2 != ncclSuccess) {
      conn_free(c);
      return res != ncclSuccess ? res : r2;
    }
    send_tab[p] = c;
    if (c->type == CONN_SOCKET) comm->nsock_sends++;
    INFO(LOG_INIT | LOG_SHM | LOG_NET, "rank %d -> rank %d channel %d via %s (%d x %zu-byte slots)", comm->rank, p, ch,
         c->type == CONN_SHM ? "shm" : "socket", c->nslots, c->slot_bytes);
  }
  /* 3. Receiving ends: finish once the sender is attached. */
  for (int i = 0; i < nrecv; i++) {
    int p = recv_peers[i];
    struct conn* c = recv_tab[p];
    if (c->opseq != (uint64_t)-1) continue;
    int32_t ok = 0;
    NCCLCHECK(bootstrap_recv(comm->bs, p, TAG_CH(TAG_CONN_ACK, ch), &ok, sizeof(ok)));
    if (!ok) {
      recv_tab[p] = NULL;
      conn_free(c);
      return err_set(ncclRemoteError, "rank %d could not attach to rank %d's connector (see its log)", p, comm->rank);
    }
    res = c->type == CONN_SHM ? shm_recv_connected(c) : sock_recv_connected(c);
    if (res != ncclSuccess) {
      recv_tab[p] = NULL;
      conn_free(c);
      return res;
    }
    c->opseq = 0;
  }
  for (int i = 0; i < nsend; i++) sends[i] = send_tab[send_peers[i]];
  for (int i = 0; i < nrecv; i++) recvs[i] = recv_tab[recv_peers[i]];
  return ncclSuccess;
}

ncclResult_t transport_progress(struct ncclComm* comm, int ch) {
  if (!comm->send_conns) return ncclSuccess;
  struct conn** st = comm->send_conns + (size_t)ch * comm->nranks;
  struct conn** rt = comm->recv_conns + (size_t)ch * comm->nranks;
  for (int i = 0; i < comm->nranks; i++) {
    struct conn* c = st[i];
    if (c && c->type == CONN_SOCKET) NCCLCHECK(c->ops->progress(c));
    c = rt[i];
    if (c && c->type == CONN_SOCKET && c->opseq != (uint64_t)-1) NCCLCHECK(c->ops->progress(c));
  }
  return ncclSuccess;
}

ncclResult_t transport_flush(struct ncclComm* comm) {
  /* Runs after every operation: nothing to scan on shared-memory-only communicators. */
  if (!comm->nsock_sends) return ncclSuccess;
  for (int i = 0; i < comm->nranks * MAX_CHANNELS; i++) {
    struct conn* c = comm->send_conns[i];
    if (!c || c->type != CONN_SOCKET) continue;
    while (c->ops->pending(c)) {
      /* Keep receiving too: the peer may need our reads to make room. */
      NCCLCHECK(transport_progress(comm, c->channel));
      if (!c->ops->pending(c)) break;
      if (c->ops->peer_failed(c))
        return err_set(ncclRemoteError, "rank %d: connection to rank %d failed while flushing", comm->rank, c->peer);
      /* Abort, revoke, or a peer declared dead (also one that went silent). */
      NCCLCHECK(comm_stop_check(comm));
      c->ops->wait(c, 10);
    }
  }
  return ncclSuccess;
}

void transport_wake(struct ncclComm* comm) {
  /* Tables and entries are written by the thread that sets connectors up:
   * read each once; an entry is either NULL or a connector set up in full. */
  struct conn** st = __atomic_load_n(&comm->send_conns, __ATOMIC_ACQUIRE);
  struct conn** rt = __atomic_load_n(&comm->recv_conns, __ATOMIC_ACQUIRE);
  for (int i = 0; st && rt && i < comm->nranks * MAX_CHANNELS; i++) {
    struct conn* c = __atomic_load_n(&st[i], __ATOMIC_ACQUIRE);
    if (c && c->ops && c->ops->wake) c->ops->wake(c);
    c = __atomic_load_n(&rt[i], __ATOMIC_ACQUIRE);
    if (c && c->ops && c->ops->wake) c->ops->wake(c);
  }
}

void transport_poison(struct ncclComm* comm) {
  comm->broken = 1;
  for (int i = 0; comm->send_conns && i < comm->nranks * MAX_CHANNELS; i++) {
    if (comm->send_conns[i] && comm->send_conns[i]->ops) comm->send_conns[i]->ops->fail(comm->send_conns[i]);
    if (comm->recv_conns[i] && comm->recv_conns[i]->ops && comm->recv_conns[i]->opseq != (uint64_t)-1)
      comm->recv_conns[i]->ops->fail(comm->recv_conns[i]);
  }
}

void transport_wait_sockets(struct ncclComm* comm, int ch, int timeout_ms) {
  struct pollfd pfds[257];
  int n = 0;
  /* Readable for good after abort, revoke or a failure found elsewhere: ends the sleep. */
  if (comm->stop_fd >= 0) pfds[n++] = (struct pollfd){.fd = comm->stop_fd, .events = POLLIN};
  struct conn** st = comm->send_conns + (size_t)ch * comm->nranks;
  struct conn** rt = comm->recv_conns + (size_t)ch * comm->nranks;
  for (int i = 0; i < comm->nranks && n <= 257 - 16; i++) {
    struct conn* c = st[i];
    if (c && c->type == CONN_SOCKET) n += c->ops->pollfds(c, pfds + n);
    c = rt[i];
    if (c && c->type == CONN_SOCKET && c->opseq != (uint64_t)-1) n += c->ops->pollfds(c, pfds + n);
  }
  poll(pfds, (nfds_t)n, timeout_ms);
}
