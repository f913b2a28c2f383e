/* The transport table and lazy connector setup. When an operation needs to
 * talk to a peer and no connector exists yet, the receiving side picks the
 * first transport of the table that can connect the pair, makes its end and
 * sends its description (naming the transport) through the bootstrap; the
 * sender attaches and acknowledges with its own description; the receiver
 * then finishes (closes the memfd, accepts the sockets). Talks to the
 * transports (shm.c, net_socket.c) and the bootstrap; nothing above. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../comm.h"
#include "../comm_err.h"
#include "net_plugin.h"
#include "transport.h"

/* Setup messages carry the channel in their tag. */
#define TAG_CONN_INFO 0x7f000001u
#define TAG_CONN_ACK 0x7f000002u
#define TAG_CH(tag, ch) ((tag) + 0x100u * (uint32_t)(ch))

/* Priority order: the first that can connect a pair is used. */
static const struct transport* const transports[] = {&transport_shm, &transport_netplugin,
#ifdef COLLIE_HAVE_IBVERBS
                                                      &transport_ib,
#endif
                                                      &transport_socket};
#define NTRANSPORTS (int)(sizeof(transports) / sizeof(transports[0]))

#ifdef COLLIE_HAVE_IBVERBS
#define NET_NAMES "IB and Socket are"
#else
#define NET_NAMES "Socket is; IB needs a build with infiniband/verbs.h"
#endif

#define TRANSPORT_NAME_BYTES 16

/* Receiver -> sender: which transport and the receiver's end. */
struct conn_info {
  char name[TRANSPORT_NAME_BYTES];
  int32_t len;
  uint8_t data[TRANSPORT_INFO_BYTES];
};

/* Sender -> receiver: attached or not, and the sender's end. */
struct conn_ack {
  int32_t ok;
  int32_t len;
  uint8_t data[TRANSPORT_INFO_BYTES];
};

/* NCCL_NET names the one network transport to use (NULL: any). */
static const char* net_wanted(void) {
  const char* net = param_str(P_NCCL_NET);
  return net && *net ? net : NULL;
}

static const struct transport* choose(struct ncclComm* comm, int peer) {
  const char* net = net_wanted();
  for (int i = 0; i < NTRANSPORTS; i++) {
    const struct transport* t = transports[i];
    if ((t->caps & TRANSPORT_CAP_NET) && net && strcasecmp(net, t->name) != 0) continue;
    if (t->can_connect(comm, peer)) return t;
  }
  return NULL;
}

int transport_dev_send_ok(struct ncclComm* comm, int peer, const void* p, size_t bytes, char* why, size_t len) {
  if (len) why[0] = '\0';
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
    snprintf(why, len, "not a send to another rank");
    return 0;
  }
  /* The transport of a connector already made, else the one setup would pick. */
  struct conn* c = comm->send_conns ? comm->send_conns[peer] : NULL;
  const struct transport* t = c && c->tp ? c->tp : choose(comm, peer);
  if (!t || !(t->caps & TRANSPORT_CAP_DEVICE_SEND) || !t->dev_send_probe) {
    snprintf(why, len, "rank %d is reached over %s, which cannot read device memory", peer, t ? t->name : "nothing");
    return 0;
  }
  return t->dev_send_probe(comm, peer, p, bytes, why, len) == 0;
}

static const struct transport* by_name(const char* name) {
  for (int i = 0; i < NTRANSPORTS; i++)
    if (strcmp(transports[i]->name, name) == 0) return transports[i];
  return NULL;
}

#define PIPE_DEFAULT_BYTES ((size_t)128 << 10)

size_t transport_chunk_bytes(struct ncclComm* comm) {
  if (comm->slot_bytes) return comm->slot_bytes;
  int64_t nslots = param_int(P_COLLIE_NSLOTS, 2, 16);
  int64_t buff = param_int(P_NCCL_BUFFSIZE, 4096 * 2, (int64_t)1 << 30);
  /* Sockets move whole slots per system call: between hosts (or with shared
   * memory off) default to 4 MiB per connector unless NCCL_BUFFSIZE says otherwise. */
  int socket_default = !getenv("NCCL_BUFFSIZE") && (comm->nhosts > 1 || comm->shm_disable);
  if (socket_default) buff = 4 << 20;
  comm->nslots = (int)nslots;
  comm->slot_bytes = ((size_t)buff / (size_t)nslots) & ~(size_t)63;
  /* Large slots suit a stream that goes one way (a broadcast, a send: fewer
   * system calls a byte), but where every rank sends and receives at once,
   * or reduces what comes, 8 slots of 512 KiB cycle 4 MiB of buffers and
   * kernel socket memory, twice a core's private cache here: 2 ranks over
   * loopback TCP, allreduce 2 MiB took 734 us in 512 KiB steps against 488
   * in 128 KiB ones, 32 MiB 15950 against 12685 (docs/BENCHMARKS.md,
   * fourteenth session). With those default slots, such collectives step by
   * 128 KiB (graph/tuning.c, plan_chunk, says which); slots the user chose
   * (NCCL_BUFFSIZE) are steps as they are. */
  comm->pipe_bytes = socket_default ? COLLIE_MIN(comm->slot_bytes, PIPE_DEFAULT_BYTES) : comm->slot_bytes;
  return comm->slot_bytes;
}

static ncclResult_t ensure_tables(struct ncclComm* comm) {
  if (comm->send_conns) return ncclSuccess;
  comm->send_conns = calloc((size_t)comm->nranks * MAX_CHANNELS, sizeof(struct conn*));
  comm->recv_conns = calloc((size_t)comm->nranks * MAX_CHANNELS, sizeof(struct conn*));
  if (!comm->send_conns || !comm->recv_conns) return err_set(ncclSystemError, "out of memory for connectors");
  net_plugin_load(); /* once per process: NCCL_NET_PLUGIN, before NCCL_NET is matched */
  const char* net = net_wanted();
  int found = 0;
  for (int i = 0; net && i < NTRANSPORTS; i++)
    found |= (transports[i]->caps & TRANSPORT_CAP_NET) && strcasecmp(net, transports[i]->name) == 0;
  if (net && !found)
    return err_set(ncclInvalidUsage, "NCCL_NET=%s: no network transport of that name is built in (%s)%s%s%s", net,
                   NET_NAMES, *net_plugin_name() ? "; the net plugin loaded is " : " and no net plugin is loaded",
                   net_plugin_name(), *net_plugin_name() ? "" : " (NCCL_NET_PLUGIN)");
  transport_chunk_bytes(comm);
  return ncclSuccess;
}

static void conn_free(struct conn* c) {
  if (!c) return;
  if (c->tp) (c->is_send ? c->tp->send.free : c->tp->recv.free)(c);
  free(c);
}

void transport_close_all(struct ncclComm* comm) {
  for (int i = 0; comm->send_conns && i < comm->nranks * MAX_CHANNELS; i++) conn_free(comm->send_conns[i]);
  for (int i = 0; comm->recv_conns && i < comm->nranks * MAX_CHANNELS; i++) conn_free(comm->recv_conns[i]);
  free(comm->send_conns);
  free(comm->recv_conns);
  comm->send_conns = comm->recv_conns = NULL;
  comm->nflush_sends = 0;
  comm->progress_chans = 0;
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
    const struct transport* t = choose(comm, p);
    if (!t) return err_set(ncclSystemError, "rank %d: no transport can connect it with rank %d", comm->rank, p);
    struct conn* c = conn_new(comm, ch, p, 0);
    if (!c) return err_set(ncclSystemError, "out of memory for a connector");
    c->tp = t;
    c->caps = t->caps;
    struct conn_info info;
    memset(&info, 0, sizeof(info));
    snprintf(info.name, sizeof(info.name), "%s", t->name);
    size_t len = 0;
    res = t->recv.setup ? t->recv.setup(c, info.data, &len) : ncclSuccess;
    if (res != ncclSuccess) {
      conn_free(c);
      return res;
    }
    info.len = (int32_t)len;
    recv_tab[p] = c;
    if (conn_caps(c) & TRANSPORT_CAP_PROGRESS) comm->progress_chans |= 1u << ch;
    c->opseq = (uint64_t)-1; /* marks "not acknowledged yet" */
    NCCLCHECK(bootstrap_send(comm->bs, p, TAG_CH(TAG_CONN_INFO, ch), &info, sizeof(info)));
  }
  /* 2. Sending ends: attach and acknowledge (with this end's description). */
  for (int i = 0; i < nsend; i++) {
    int p = send_peers[i];
    if (send_tab[p]) continue;
    struct conn_info info;
    NCCLCHECK(bootstrap_recv(comm->bs, p, TAG_CH(TAG_CONN_INFO, ch), &info, sizeof(info)));
    info.name[TRANSPORT_NAME_BYTES - 1] = 0;
    struct conn* c = conn_new(comm, ch, p, 1);
    if (!c) return err_set(ncclSystemError, "out of memory for a connector");
    struct conn_ack ack;
    memset(&ack, 0, sizeof(ack));
    size_t len = 0;
    c->tp = by_name(info.name);
    if (c->tp) c->caps = c->tp->caps;
    if (!c->tp) res = err_set(ncclInternalError, "rank %d offered unknown transport \"%s\"", p, info.name);
    else if (info.len < 0 || info.len > TRANSPORT_INFO_BYTES) res = err_set(ncclInternalError, "bad connector info");
    else if (c->tp->send.setup) res = c->tp->send.setup(c, ack.data, &len);
    if (res == ncclSuccess) res = c->tp->send.connect(c, info.data, (size_t)info.len);
    ack.ok = res == ncclSuccess;
    ack.len = (int32_t)len;
    ncclResult_t r2 = bootstrap_send(comm->bs, p, TAG_CH(TAG_CONN_ACK, ch), &ack, sizeof(ack));
    if (res != ncclSuccess || r2 != ncclSuccess) {
      conn_free(c);
      return res != ncclSuccess ? res : r2;
    }
    send_tab[p] = c;
    if (conn_caps(c) & TRANSPORT_CAP_FLUSH) comm->nflush_sends++;
    if (conn_caps(c) & TRANSPORT_CAP_PROGRESS) comm->progress_chans |= 1u << ch;
    INFO(LOG_INIT | LOG_SHM | LOG_NET, "rank %d -> rank %d channel %d via %s (%d x %zu-byte slots)", comm->rank, p, ch,
         c->tp->name, c->nslots, c->slot_bytes);
  }
  /* 3. Receiving ends: finish once the sender is attached. */
  for (int i = 0; i < nrecv; i++) {
    int p = recv_peers[i];
    struct conn* c = recv_tab[p];
    if (c->opseq != (uint64_t)-1) continue;
    struct conn_ack ack;
    NCCLCHECK(bootstrap_recv(comm->bs, p, TAG_CH(TAG_CONN_ACK, ch), &ack, sizeof(ack)));
    if (!ack.ok) {
      recv_tab[p] = NULL;
      conn_free(c);
      return err_set(ncclRemoteError, "rank %d could not attach to rank %d's connector (see its log)", p, comm->rank);
    }
    if (ack.len < 0 || ack.len > TRANSPORT_INFO_BYTES) res = err_set(ncclInternalError, "bad connector acknowledgement");
    else res = c->tp->recv.connect ? c->tp->recv.connect(c, ack.data, (size_t)ack.len) : ncclSuccess;
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
    if (c && (conn_caps(c) & TRANSPORT_CAP_PROGRESS)) NCCLCHECK(c->ops->progress(c));
    c = rt[i];
    if (c && (conn_caps(c) & TRANSPORT_CAP_PROGRESS) && c->opseq != (uint64_t)-1) NCCLCHECK(c->ops->progress(c));
  }
  return ncclSuccess;
}

ncclResult_t transport_push(struct ncclComm* comm, int ch, int* owed) {
  *owed = 0;
  if (!(comm->progress_chans >> ch & 1u)) return ncclSuccess;
  NCCLCHECK(transport_progress(comm, ch));
  struct conn** st = comm->send_conns + (size_t)ch * comm->nranks;
  struct conn** rt = comm->recv_conns + (size_t)ch * comm->nranks;
  for (int i = 0; i < comm->nranks; i++) {
    struct conn *s = st[i], *r = rt[i];
    /* A receiver that moves bytes by progress without an fd to wait on (a
     * net plugin, IB) posts its free slots only when progressed. */
    if ((s && (conn_caps(s) & TRANSPORT_CAP_PROGRESS) && s->ops->pending(s)) ||
        (r && (conn_caps(r) & TRANSPORT_CAP_PROGRESS) && !(conn_caps(r) & TRANSPORT_CAP_POLLFD) &&
         r->opseq != (uint64_t)-1)) {
      *owed = 1;
      break;
    }
  }
  return ncclSuccess;
}

ncclResult_t transport_flush(struct ncclComm* comm) { return transport_flush_ch(comm, -1); }

ncclResult_t transport_flush_ch(struct ncclComm* comm, int ch) {
  /* Runs after every operation: nothing to scan when no connector can hold bytes back. */
  if (!comm->nflush_sends) return ncclSuccess;
  int lo = ch < 0 ? 0 : ch * comm->nranks, hi = ch < 0 ? comm->nranks * MAX_CHANNELS : (ch + 1) * comm->nranks;
  for (int i = lo; i < hi; i++) {
    struct conn* c = comm->send_conns[i];
    if (!c || !(conn_caps(c) & TRANSPORT_CAP_FLUSH)) continue;
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

void transport_wait_fds(struct ncclComm* comm, int ch, int timeout_ms) {
  struct pollfd pfds[257];
  int n = 0;
  /* Readable for good after abort, revoke or a failure found elsewhere: ends the sleep. */
  if (comm->stop_fd >= 0) pfds[n++] = (struct pollfd){.fd = comm->stop_fd, .events = POLLIN};
  struct conn** st = comm->send_conns + (size_t)ch * comm->nranks;
  struct conn** rt = comm->recv_conns + (size_t)ch * comm->nranks;
  for (int i = 0; i < comm->nranks && n <= 257 - 16; i++) {
    struct conn* c = st[i];
    if (c && (conn_caps(c) & TRANSPORT_CAP_POLLFD)) n += c->ops->pollfds(c, pfds + n);
    c = rt[i];
    if (c && (conn_caps(c) & TRANSPORT_CAP_POLLFD) && c->opseq != (uint64_t)-1) n += c->ops->pollfds(c, pfds + n);
  }
  poll(pfds, (nfds_t)n, timeout_ms);
}
