/* The socket transport: TCP connectors, for ranks on different hosts or when shared
 * memory is off. Each side keeps its own ring of slots in local memory; the
 * bytes of a committed slot (header + payload) are written to a socket by
 * progress(), and the receiver's progress() reads them into its free slots.
 * A receiver reads small slots through a per-connection stage (one recv()
 * brings a header with its payload, often the next header too) and large
 * payloads straight to where they belong (the consumer's buffer when it posted
 * one, recv_post), so a small message costs one system call on each side.
 * A connector may use several TCP connections (NCCL_NSOCKS_PERTHREAD x
 * NCCL_SOCKET_NTHREADS): slot k travels on connection k % nsocks, so each
 * connection carries its slots in order and the receiver knows where each
 * belongs. TCP provides the flow control. Everything is nonblocking: progress
 * is made by whoever waits (connect.c's transport_progress, called by every
 * waiter in src/coll before it sleeps).
 * Duplex (COLLIE_SOCKET_DUPLEX): each connector opens its own connection, so
 * data on it flows one way and the receiver's kernel must send every
 * acknowledgement as a packet of its own. Where two ranks have connectors both
 * ways on a channel, each of one connection, the higher rank's sender puts
 * small slots on the connection the lower rank's sender opened (the shared
 * one), where acknowledgements ride on the data going the other way, and
 * larger slots on its own (on the shared connection each side's sends and the
 * other's arriving bytes contend for one socket lock: with every slot there,
 * 9-23% slower at 128-512 KiB). Whenever it changes connection it first
 * writes a SLOT_SWITCH header on the one it leaves; the lower rank's receiver
 * changes when it reads one. Only the sender decides, and the markers order
 * the moves within the stream, so the two sides never need to agree on when.
 * The receiver keeps a stage per connection: bytes read past a marker stay
 * with theirs. Both connections stay open until the connectors close. */
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../bootstrap/socket.h"
#include "../comm.h"
#include "../comm_err.h"
#include "transport.h"

#define SOCK_MAX_CONNS 16
/* A receiver's stage: large enough for a header with an 8 KiB payload and the
 * next header; larger payload remainders skip it (no extra copy). */
#define SOCK_STAGE_BYTES (16 * 1024)
/* Slots of at most this many payload bytes leave with their header from one
 * flat buffer by send(), not as two pieces by sendmsg() (see send_flat). */
#define SOCK_FLAT_BYTES 512
/* A receiver whose recv() found nothing this many times in a row asks
 * poll() first, until data comes. A recv() takes the socket's lock, and a
 * receiver that waits by calling it again and again holds that lock much of
 * the time: the peer's kernel, delivering the next segment (over loopback, in
 * the sender's own system call), spins on it. poll() looks without the lock.
 * 2 ranks a host each over loopback, a stream of small reduces: the root (the
 * receiver) spent 17% of its time spinning on that lock, 6% with poll() first
 * (bench/explain_miss.sh); medians of 9 interleaved rounds (bench/ab_env.sh,
 * us a call, poll first / recv only / Open MPI, whose receiver polls first
 * too): reduce 8-128 B 2.41-2.48 / 2.58-2.61 / 2.45-2.53, broadcast 8-128 B
 * 2.43-2.46 / 2.47-2.53 / 2.47-2.54, 512 B even. Asking poll() at the first
 * empty recv() cost a system call per message where data comes soon (2 ranks
 * exchanging: allreduce 8-2048 B 4.5 against 4.0 us); after 4 the exchanges
 * are even (7 rounds, allgather and alltoall 2-128 KiB within 3% either way). */
#define SOCK_DRY_RECVS 4

/* A receiver of a one-way stream of small slots reads it in batches.
 * Over loopback the sender's own system call runs the receiving side's TCP
 * processing too (queueing the segment, waking the reader), and a reader
 * that takes each segment as it lands makes every one cost the most: a
 * socket queue found empty (nothing to merge the segment into), a buffer
 * freed back to the sender's CPU for each segment, an acknowledgement for
 * every second one. Left in the kernel a few microseconds, the segments
 * that follow are merged into the queued one and read by one recv(). So a
 * link whose last SOCK_LAG_STREAK reads brought data with no slot sent by
 * this process on any socket in between (nothing of this rank's can be what
 * the peer waits for) reads again only COLLIE_SOCKET_LAG_NS after its last
 * small read (one that neither filled the stage nor was a header read alone
 * after a large slot: more may wait after those). An exchange (this rank
 * sends between its reads) never waits, nor does a slot that comes after a
 * pause, nor a rank whose sender (on this machine) last ran on this rank's
 * CPU, which the wait would take from it. 2 ranks a host each over
 * loopback, bound, 5 interleaved rounds (bench/ab_env.sh, medians, us a
 * call, 0 / 2 / 4 / 8 us): broadcast 8 B 2.28 / 1.92 / 1.58 / 1.47, 512 B
 * 2.41 / 2.03 / 1.76 / 1.66, 2 KiB 2.65 / 2.29 / 2.04 / 1.88 (Open MPI 2.29,
 * 2.43, 2.56); reduce 8 B 2.44 against 1.78 at 4 us; allreduce and alltoall
 * unchanged. */
#define SOCK_LAG_STREAK 4
static uint64_t sock_sends; /* slots committed on any socket connector of this process */

/* The kernel's buffers of a data connection (COLLIE_SOCKET_BUFFER bytes,
 * SO_SNDBUF / SO_RCVBUF; 0: the kernel sizes and grows them). Set to a size
 * they stay that size, and a receive buffer of megabytes never closes the
 * window: a stream of small slots then leaves as one TCP segment each, and
 * over loopback each segment's receiving side runs in the sender's system
 * call. Grown by the kernel, a receiver that falls behind closes its window
 * within a few hundred small slots, the sender's next writes are appended to
 * the segment waiting in its queue, and they leave together. 8 ranks, a
 * host each over loopback on 2 CPUs, 20,000 reduces of 32 B (the chain,
 * nstat): 272,075 data segments with 4 MiB buffers, 57,791 grown by the
 * kernel (Open MPI's tcp BTL, which leaves them to the kernel: 22,748).
 * Medians, us a call, 4 MiB / kernel / Open MPI (bench/ab_env.sh, docs/BENCHMARKS.md):
 * 8 ranks reduce 8 B 5.03 / 1.80 / 2.02, broadcast 64 B 5.47 / 2.99 / 12.2;
 * 2 ranks within the rounds' spread at every size and collective but
 * broadcast 256 KiB (31.5 / 42.4 / 49.4: slower, still ahead).
 *
 * A fixed size has a floor, SOCK_BUFFER_MIN. Below it the receive window a
 * receiver can offer stays under one loopback segment (the kernel bounds the
 * segment to half the largest window seen: 32 KiB): the receiver holds its
 * window updates back until a whole segment fits (silly-window avoidance) and
 * the sender holds its bytes back until the window fits one, so the stream
 * moves only when the sender's persist timer fires (every ~200 ms). A 4-rank
 * socket sweep (test_coll 4) that takes 5 s did not finish in 10 min with
 * COLLIE_SOCKET_BUFFER=16384; with 32 KiB it took 6 s, 64 KiB 4.9 s. */
#define SOCK_BUFFER_MIN (64 << 10)

static void sock_buffer(int fd, int which) {
  static int warned;
  int sz = (int)param_int(P_COLLIE_SOCKET_BUFFER, 0, 1 << 30);
  if (sz <= 0) return;
  if (sz < SOCK_BUFFER_MIN) {
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      WARN("socket: COLLIE_SOCKET_BUFFER=%d is below the floor of %d bytes (a smaller TCP window stalls a "
           "loopback stream for the sender's persist timer); using %d",
           sz, SOCK_BUFFER_MIN, SOCK_BUFFER_MIN);
    sz = SOCK_BUFFER_MIN;
  }
  setsockopt(fd, SOL_SOCKET, which, &sz, sizeof(sz)); /* a hint: failure changes nothing else */
}

struct sock_link {
  int fd;        /* the connection this link moves bytes on now */
  int own_fd;    /* the one it opened or accepted, closed with it */
  /* Duplex: the connection not in use (-1 until the shared one is known)
   * and, on a receiver, its stage: fd and park_fd trade places at a marker. */
  int park_fd;
  int cc_small;      /* sender: fd sends with the small-slot congestion control (sock_cc_slot) */
  int park_cc_small; /* the same for park_fd */
  char* park_stage;
  size_t park_off, park_len;
  uint32_t next; /* next slot index this connection carries (k with k % n == index) */
  size_t off;    /* bytes of that slot (header first) moved so far */
  char* stage;   /* receiver: bytes read from the socket, not yet placed */
  size_t stage_off, stage_len;
  int big;       /* receiver: the last slot's payload skipped the stage (read headers alone) */
  int eof;       /* receiver: the peer closed this connection between slots */
  int64_t delack_ns; /* receiver: when TCP_QUICKACK was last turned off (0: never) */
  int dry;           /* receiver: recv() calls in a row that found nothing (see SOCK_DRY_RECVS) */
  int streak;        /* receiver: reads that brought data with no slot sent by this process in between */
  uint64_t sends_seen; /* receiver: sock_sends at the last read that brought data */
  int64_t data_ns;     /* receiver: when that read was */
};

struct sock_conn {
  int nlinks;
  struct sock_link link[SOCK_MAX_CONNS];
  int listen_fd; /* receiver, until the sender connected */
  char* slots;
  struct slot_hdr* hdrs;
  const char** ext; /* sender: payload outside the slot (send_commit_ext), else NULL;
                     * receiver: where a slot's payload was put when not in the slot */
  int readahead;    /* receiver: read slots before they are asked for (COLLIE_SOCKET_READAHEAD) */
  int delayed_ack;  /* receiver: keep the kernel's delayed acknowledgements on (COLLIE_SOCKET_DELAYED_ACK) */
  int64_t lag_ns;   /* receiver: COLLIE_SOCKET_LAG_NS (0: read at once) */
  uint64_t lag_holds; /* receiver: looks that held a read back for a one-way stream (for tests) */
  char* post_dst;   /* receiver: recv_post destination for slot post_idx */
  size_t post_len;
  uint32_t post_idx;
  int posted;
  int asked;       /* receiver: its consumer looked for slot pos and did not find it (cleared as pos moves) */
  int hold;         /* receiver: COLLIE_SOCKET_HOLD (see payload_held) */
  uint64_t staged_large; /* receiver: payloads of SOCK_STAGE_BYTES or more placed in a slot buffer (for tests) */
  uint32_t pos;  /* sender: slots committed; receiver: slots consumed */
  uint32_t done; /* slots moved completely: every slot below is done */
  int failed;    /* the link broke or the peer poisoned/closed it */
  /* The peer runs on this rank's machine (NCCL_HOSTID may still make it
   * another host): slot headers carry the sender's CPU (prim_fd_poll_ns). */
  int same_machine;
  /* Sender to a rank of this machine: switch congestion control by slot size (sock_cc_slot). */
  int cc_switch;
  /* Sender: duplex (see the top of this file). */
  int dx;             /* DX_* */
  size_t dx_max;      /* slots of at most this many payload bytes go on the shared connection */
  int dx_tail;        /* the connection the last committed slot goes on (1: shared) */
  uint8_t* dx_mark;   /* per slot: change connection (marker first) before it */
  size_t dx_off;      /* bytes of the marker being written */
  char flat[sizeof(struct slot_hdr) + SOCK_FLAT_BYTES]; /* sender: header and payload of a small slot */
};

enum { DX_NEVER, DX_WATCH, DX_READY };
static const struct slot_hdr dx_marker = {0, 0, 0, SLOT_SWITCH};

struct sock_hello {
  uint64_t comm_hash;
  int32_t rank;
  int32_t index; /* which of the connector's connections this is */
};

static char* slot_data(struct conn* c, uint32_t i) {
  struct sock_conn* s = c->priv;
  return s->slots + (size_t)(i % (uint32_t)c->nslots) * c->slot_bytes;
}

static size_t slot_len(const struct slot_hdr* h) {
  return sizeof(*h) + ((h->flags & SLOT_ERROR) ? 0 : h->bytes);
}

/* done = the lowest slot some connection has not finished. */
static void update_done(struct sock_conn* s) {
  uint32_t lo = s->link[0].next;
  for (int i = 1; i < s->nlinks; i++)
    if ((int32_t)(s->link[i].next - lo) < 0) lo = s->link[i].next;
  s->done = lo;
}

static void local_cc(int fd);
static int local_cc_auto(void);

/* The opposite connector of c (same peer and channel, other direction) if it
 * is a connected socket connector of one connection; else NULL. */
static struct sock_conn* dx_opposite(struct conn* c) {
  struct ncclComm* comm = c->comm;
  struct conn** tab = c->is_send ? comm->recv_conns : comm->send_conns;
  if (!tab) return NULL;
  struct conn* o = tab[(size_t)c->channel * comm->nranks + c->peer];
  if (!o || o->ops != c->ops || (!o->is_send && o->opseq == (uint64_t)-1)) return NULL;
  struct sock_conn* os = o->priv;
  return os && os->nlinks == 1 && !os->failed && os->link[0].own_fd >= 0 ? os : NULL;
}

/* Swaps link l's connection (and, on a receiver, its stage) with the parked one. */
static void dx_swap(struct sock_link* l) {
  int fd = l->fd;
  char* st = l->park_stage;
  size_t off = l->park_off, len = l->park_len;
  l->fd = l->park_fd;
  l->park_fd = fd;
  int cc = l->cc_small;
  l->cc_small = l->park_cc_small;
  l->park_cc_small = cc;
  if (st) {
    l->park_stage = l->stage;
    l->park_off = l->stage_off;
    l->park_len = l->stage_len;
    l->stage = st;
    l->stage_off = off;
    l->stage_len = len;
  }
}

/* Sender, committing slot s->pos of `bytes` payload bytes: which connection
 * it goes on; a change puts a marker before it. */
static void dx_route(struct conn* c, struct sock_conn* s, size_t bytes) {
  int shared = bytes <= s->dx_max;
  if (shared && s->dx == DX_WATCH) {
    struct sock_conn* o = dx_opposite(c);
    if (o) {
      /* This end of the shared connection was set up for receiving. */
      int fd = o->link[0].own_fd;
      sock_buffer(fd, SO_SNDBUF);
      s->link[0].park_fd = fd;
      s->dx = DX_READY;
    } else {
      shared = 0;
    }
  }
  s->dx_mark[s->pos % (uint32_t)c->nslots] = shared != s->dx_tail;
  s->dx_tail = shared;
}

/* Writes a marker on link l's connection and changes connection; -1 while
 * the socket is full, 1 when the connection broke, 0 when done. */
static int dx_send_marker(struct conn* c, struct sock_link* l) {
  struct sock_conn* s = c->priv;
  while (s->dx_off < sizeof(dx_marker)) {
    ssize_t rc = send(l->fd, (const char*)&dx_marker + s->dx_off, sizeof(dx_marker) - s->dx_off,
                      MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      s->dx_off += (size_t)rc;
      continue;
    }
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
    return 1;
  }
  s->dx_off = 0;
  s->dx_mark[l->next % (uint32_t)c->nslots] = 0;
  dx_swap(l);
  return 0;
}

/* A send on one of c's connections failed (rc 0: closed, else errno). */
static ncclResult_t send_lost(struct conn* c, ssize_t rc) {
  struct sock_conn* s = c->priv;
  s->failed = 1;
  int err = errno;
  NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
  return err_set(ncclRemoteError, "socket: rank %d lost its connection to rank %d (%s): %s", c->comm->rank, c->peer,
                 bootstrap_peer_host(c->comm->bs, c->peer), rc == 0 ? "closed" : strerror(err));
}

/* Receiver: link l read a SLOT_SWITCH header; the following slots come on
 * the other connection. */
static ncclResult_t dx_follow(struct conn* c, struct sock_link* l) {
  struct sock_conn* s = c->priv;
  if (l->park_fd < 0) {
    struct sock_conn* o = dx_opposite(c);
    if (!o || s->nlinks != 1 || c->comm->rank > c->peer) {
      s->failed = 1;
      return err_set(ncclRemoteError, "socket: rank %d moved its stream to rank %d where it cannot: corrupt stream",
                     c->peer, c->comm->rank);
    }
    if (!(l->park_stage = malloc(SOCK_STAGE_BYTES)))
      return err_set(ncclSystemError, "socket transport: out of memory for a receive stage");
    l->park_fd = o->link[0].own_fd;
    l->park_off = l->park_len = 0;
    sock_buffer(l->park_fd, SO_RCVBUF);
  }
  dx_swap(l);
  l->off = 0;
  return ncclSuccess;
}

/* A small slot (header and at most SOCK_FLAT_BYTES of payload) copied into one
 * buffer and sent by send(): the stream of small messages that a broadcast or
 * reduce root sends is bound by the sender's system calls, and one flat
 * buffer costs the kernel less than a two-piece message (no msghdr and iovec
 * array to import). Measured over loopback, 2 ranks a host each, 7
 * interleaved rounds (bench/ab_env.sh, medians): broadcast 8-128 B 2.68-2.72
 * us a call against 2.81-2.83 (sendmsg), reduce 2.69-2.71 against 2.84-2.94,
 * Open MPI's tcp BTL beside 2.80-2.86; at 512 B 2.93-2.99 against 3.00-3.02.
 * A partial send finishes through the two-piece path (same bytes). Returns
 * send()'s result. */
static ssize_t send_flat(struct sock_conn* s, int fd, const struct slot_hdr* h, const char* payload, size_t len) {
  memcpy(s->flat, h, sizeof(*h));
  if (len > sizeof(*h)) memcpy(s->flat + sizeof(*h), payload, len - sizeof(*h));
  return send(fd, s->flat, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* In COLLIE_SOCKET_LOCAL_CC=auto, on a machine with more ranks than CPUs, a
 * sending connection to a rank of this machine changes its congestion
 * control with the size of what it carries:
 * slots of at most SOCK_CC_SMALL_BYTES payload go with BBR (where the kernel
 * lets this process use it), larger ones with local_cc's loss-based choice
 * (cubic or reno); a connection changes only when a slot of the other class
 * comes, so a loop of one size costs no system call. Under cubic a stream of
 * small slots, once the connection has carried a few thousand, moves in lock
 * step: 8 ranks, a host each over loopback on 2 CPUs, a reduce of 32 B took
 * 9-11 us as a run's first size and 28-42 us as its second and later ones,
 * under BBR 10-12 us at every place. BBR on large slots waits for loss
 * probes (local_cc). Medians of 3 interleaved rounds,
 * us a call, cubic / switched / BBR throughout (docs/BENCHMARKS.md): 8 ranks
 * reduce 32 B 28.1 / 9.1 / 9.2, broadcast 128 B 32.2 / 12.3 / 10.1, 4 ranks
 * reduce 32 B 15.6 / 7.3 / 7.5; reduce 8 MiB 18.4 / 18.5 / 22.4 ms, broadcast
 * 32 MiB 59.0 / 59.2 / 75.4 ms. With a CPU for each rank (2 ranks) the
 * small slots gained nothing beyond the rounds' spread (reduce 8 B-2 KiB,
 * time under cubic / switched 0.78-1.02), so there nothing switches. */
#define SOCK_CC_SMALL "bbr"
#define SOCK_CC_SMALL_BYTES 4096
static const char* local_cc_large; /* the algorithm local_cc set, NULL until it did */

static void sock_cc_slot(struct sock_conn* s, struct sock_link* l, size_t len) {
  int small = len <= sizeof(struct slot_hdr) + SOCK_CC_SMALL_BYTES;
  if (small == l->cc_small) return;
  const char* name = small ? SOCK_CC_SMALL : __atomic_load_n(&local_cc_large, __ATOMIC_RELAXED);
  if (name && setsockopt(l->fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0) l->cc_small = small;
  else s->cc_switch = 0; /* refused: the connection keeps what it has */
}

static ncclResult_t sock_progress_send(struct conn* c) {
  struct sock_conn* s = c->priv;
  for (int li = 0; li < s->nlinks; li++) {
    struct sock_link* l = &s->link[li];
    while ((int32_t)(s->pos - l->next) > 0) {
      if (s->dx != DX_NEVER && l->off == 0 && s->dx_mark[l->next % (uint32_t)c->nslots]) {
        int st = dx_send_marker(c, l);
        if (st < 0) break; /* the socket is full */
        if (st > 0) return send_lost(c, -1);
      }
      struct slot_hdr* h = &s->hdrs[l->next % (uint32_t)c->nslots];
      size_t len = slot_len(h);
      const char* src = s->ext[l->next % (uint32_t)c->nslots];
      if (!src) src = slot_data(c, l->next);
      if (l->off == 0 && s->cc_switch) sock_cc_slot(s, l, len);
      int blocked = 0;
      while (l->off < len) {
        ssize_t rc;
        if (l->off == 0 && len <= sizeof(s->flat)) {
          rc = send_flat(s, l->fd, h, src, len);
        } else {
          /* Header and payload in one call: one segment for small slots. */
          struct iovec iov[2];
          int niov = 0;
          if (l->off < sizeof(*h)) iov[niov++] = (struct iovec){(char*)h + l->off, sizeof(*h) - l->off};
          size_t poff = l->off > sizeof(*h) ? l->off - sizeof(*h) : 0;
          if (len > sizeof(*h)) iov[niov++] = (struct iovec){(char*)src + poff, len - sizeof(*h) - poff};
          struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
          rc = sendmsg(l->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (rc > 0) {
          l->off += (size_t)rc;
          continue;
        }
        if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          blocked = 1;
          break;
        }
        return send_lost(c, rc);
      }
      if (blocked) break;
      l->off = 0;
      l->next += (uint32_t)s->nlinks;
    }
  }
  update_done(s);
  return ncclSuccess;
}

/* Data flows one way on a connection, so the kernel's acknowledgements
 * cannot ride on replies: each is a packet of its own, which both ends'
 * kernels must build and process. TCP_QUICKACK off ("ping-pong" mode)
 * acknowledges every second small segment instead of each; large transfers
 * are acknowledged as before (every full segment or two). The kernel leaves
 * that mode whenever its delayed-ack timer fires (an odd segment left
 * unacknowledged for its minimum of some tens of ms), so the receiver turns it
 * back on after data arrives, at most every DELACK_REARM_NS. */
#define DELACK_REARM_NS (20 * 1000 * 1000)

static void delack_arm(struct sock_conn* s, struct sock_link* l, int64_t now) {
  if (!s->delayed_ack) return;
  if (l->delack_ns && now - l->delack_ns < DELACK_REARM_NS) return;
  int off = 0;
  setsockopt(l->fd, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof(off)); /* a hint: failure changes nothing else */
  l->delack_ns = now;
}

/* The peer last sent from the CPU this rank runs on (same machine): time
 * this rank spends waiting there is time its sender cannot run. */
static int peer_on_my_cpu(struct conn* c) {
  struct sock_conn* s = c->priv;
  if (!s->same_machine) return 0;
  int pc = __atomic_load_n(&c->comm->peer_cpu[c->peer], __ATOMIC_RELAXED);
  return pc >= 0 && pc == sched_getcpu();
}

/* Does the payload of link l's slot, whose header has come, stay in the
 * kernel for now? A large one does until its consumer posts a buffer for it
 * (recv_post) or looks for the slot (recv_slot): read earlier, while the
 * consumer is still in an earlier call (a peer ahead of it sent its next
 * message), it went into the slot buffer and from there, once posted, into
 * the consumer's buffer: a second copy, and the first touch of each page of
 * the slot buffers a fault (4 MiB per connector between hosts), taken call
 * after call until every slot had once been filled early. Over loopback, 8
 * ranks each a host of its own on 2 CPUs, alltoall of 2 MiB (perf stat -a -e
 * page-faults, whole runs of 1 / 30 / 300 calls): 11,560 / 34,393 / 40,626
 * faults and 0.23 / 0.55 / 1.29 s read early, 11,557 / 11,549 / 11,571 and
 * 0.21 / 0.27 / 0.82 s held; rank 0's calls 1-11 took 4.3-32 ms read early
 * (means over 25 calls: 16 ms, 6, 3.3, 2.9, then ~2.4 from the 100th on)
 * and 2.2-6.3 ms held (means 4.1-5.6 ms over the first 25, 2.1-2.7 after;
 * docs/BENCHMARKS.md, seventy-sixth session). Held, the connection is left
 * out of the waits on every connector (transport_wait_fds): it stays
 * readable, and a waiter for another peer would not sleep. */
static int payload_held(const struct sock_conn* s, const struct sock_link* l, const struct slot_hdr* h) {
  if (!s->hold || l->off != sizeof(*h) || (h->flags & SLOT_ERROR) || h->bytes < SOCK_STAGE_BYTES) return 0;
  if (s->posted && s->post_idx == l->next) return 0;
  return !(s->asked && l->next == s->pos);
}

/* Where the payload of the slot link l is filling goes. Decided when its
 * first payload byte is placed, so a consumer that posts its buffer after the
 * header came (but before the payload) still gets the bytes directly. */
static char* payload_dst(struct conn* c, struct sock_link* l, const struct slot_hdr* h) {
  struct sock_conn* s = c->priv;
  uint32_t idx = l->next % (uint32_t)c->nslots;
  if (l->off == sizeof(*h)) {
    s->ext[idx] = s->posted && s->post_idx == l->next && h->bytes <= s->post_len ? s->post_dst : NULL;
    if (!s->ext[idx] && h->bytes >= SOCK_STAGE_BYTES) s->staged_large++;
  }
  return s->ext[idx] ? (char*)s->ext[idx] : slot_data(c, l->next);
}

/* Places received bytes into the slots the consumer may take next (only the
 * next one unless COLLIE_SOCKET_READAHEAD: bytes left in the kernel can still
 * go straight to the consumer's buffer). `may_read` 0: only what is staged
 * already, no system call. */
static ncclResult_t recv_links(struct conn* c, int may_read) {
  struct sock_conn* s = c->priv;
  uint32_t window = s->readahead ? (uint32_t)c->nslots : 1;
  for (int li = 0; li < s->nlinks && !s->failed; li++) {
    struct sock_link* l = &s->link[li];
    while (!l->eof && (uint32_t)(l->next - s->pos) < window) {
      struct slot_hdr* h = &s->hdrs[l->next % (uint32_t)c->nslots];
      size_t need = l->off < sizeof(*h) ? sizeof(*h) : slot_len(h);
      int blocked = 0;
      while (l->off < need) {
        if (payload_held(s, l, h)) {
          blocked = 1;
          break;
        }
        if (l->stage_off == l->stage_len) {
          if (!may_read) {
            blocked = 1;
            break;
          }
          /* A large payload remainder is read in place; anything else through
           * the stage, which may bring the following slots along. After a
           * large slot the next header is read alone, so that a stream of
           * large slots is not copied through the stage in part. */
          int direct = l->off >= sizeof(*h) && need - l->off >= SOCK_STAGE_BYTES;
          if (!direct && l->streak >= SOCK_LAG_STREAK && l->data_ns) {
            if (__atomic_load_n(&sock_sends, __ATOMIC_RELAXED) != l->sends_seen) l->streak = 0;
            else if (time_ns() - l->data_ns < s->lag_ns && !peer_on_my_cpu(c)) { /* a one-way stream: let it gather */
              s->lag_holds++;
              blocked = 1;
              break;
            }
          }
          if (l->dry >= SOCK_DRY_RECVS) {
            struct pollfd pf = {.fd = l->fd, .events = POLLIN};
            if (poll(&pf, 1, 0) == 0) { /* nothing yet (data, a close and an error all wake it) */
              blocked = 1;
              break;
            }
          }
          char* p = direct ? payload_dst(c, l, h) + (l->off - sizeof(*h)) : l->stage;
          size_t want = direct ? need - l->off : l->big && l->off < sizeof(*h) ? sizeof(*h) - l->off : SOCK_STAGE_BYTES;
          ssize_t rc = recv(l->fd, p, want, MSG_DONTWAIT);
          if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (l->dry < SOCK_DRY_RECVS) l->dry++;
          } else {
            l->dry = 0;
          }
          if (rc > 0) {
            /* One clock read for both (a read that brought data). */
            int64_t now = s->delayed_ack || s->lag_ns ? time_ns() : 0;
            delack_arm(s, l, now);
            if (s->lag_ns) {
              uint64_t sent = __atomic_load_n(&sock_sends, __ATOMIC_RELAXED);
              l->streak = sent == l->sends_seen ? l->streak + 1 : 0;
              l->sends_seen = sent;
              /* After a read that filled the stage, or a header read alone
               * after a large slot, more may be waiting: the next read is
               * not held back. */
              l->data_ns = !direct && !l->big && (size_t)rc < want ? now : 0;
            }
            if (direct) l->off += (size_t)rc;
            else {
              l->stage_off = 0;
              l->stage_len = (size_t)rc;
            }
            continue;
          }
          if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            blocked = 1;
            break;
          }
          /* A close between slots is how a peer that finished (and destroyed
           * its communicator) says goodbye: what it sent is still ours to
           * consume, on this connection and on the others, which may still
           * hold slots in the kernel (a peer closes all of them at once, and
           * any may be seen first). A waiter that needs a slot this
           * connection would have carried sees peer_failed. */
          if (rc == 0 && l->off == 0) {
            l->eof = 1;
            blocked = 1;
            break;
          }
          s->failed = 1;
          int err = errno;
          NCCLCHECK(comm_await_cause(c->comm, CAUSE_WAIT_MS));
          return err_set(ncclRemoteError, "socket: rank %d (%s) closed its connection to rank %d%s%s", c->peer,
                         bootstrap_peer_host(c->comm->bs, c->peer), c->comm->rank, rc == 0 ? "" : ": ",
                         rc == 0 ? "" : strerror(err));
        }
        size_t take = COLLIE_MIN(l->stage_len - l->stage_off, need - l->off);
        char* p = l->off < sizeof(*h) ? (char*)h + l->off : payload_dst(c, l, h) + (l->off - sizeof(*h));
        memcpy(p, l->stage + l->stage_off, take);
        l->stage_off += take;
        l->off += take;
        if (l->off == sizeof(*h) && (h->flags & SLOT_SWITCH)) {
          NCCLCHECK(dx_follow(c, l));
          need = sizeof(*h);
          continue;
        }
        if (l->off == sizeof(*h)) {
          if (!(h->flags & SLOT_ERROR) && h->bytes > c->slot_bytes) {
            s->failed = 1;
            return err_set(ncclRemoteError, "socket: rank %d sent a %u-byte slot (max %zu): corrupt stream", c->peer,
                           h->bytes, c->slot_bytes);
          }
          uint32_t cpu = h->flags >> SLOT_CPU_SHIFT;
          if (cpu && s->same_machine) __atomic_store_n(&c->comm->peer_cpu[c->peer], (int32_t)cpu - 1, __ATOMIC_RELAXED);
          need = slot_len(h);
        }
      }
      if (blocked) break;
      l->big = slot_len(h) - sizeof(*h) >= SOCK_STAGE_BYTES;
      l->off = 0;
      l->next += (uint32_t)s->nlinks;
    }
  }
  update_done(s);
  return ncclSuccess;
}

static ncclResult_t sock_progress_recv(struct conn* c) { return recv_links(c, 1); }

static ncclResult_t sock_progress(struct conn* c) {
  return c->is_send ? sock_progress_send(c) : sock_progress_recv(c);
}

static void* sock_send_slot(struct conn* c, size_t bytes) {
  (void)bytes; /* whole slots: a payload starts at the slot's start */
  struct sock_conn* s = c->priv;
  if ((uint32_t)(s->pos - s->done) >= (uint32_t)c->nslots) return NULL;
  return slot_data(c, s->pos);
}

static ncclResult_t sock_send_commit_ext(struct conn* c, const struct slot_hdr* h, const void* data) {
  struct sock_conn* s = c->priv;
  if (s->dx != DX_NEVER) dx_route(c, s, h->bytes);
  struct slot_hdr* mine = &s->hdrs[s->pos % (uint32_t)c->nslots];
  *mine = *h;
  if (s->same_machine) {
    int cpu = sched_getcpu();
    if (cpu >= 0 && cpu < 0xffff) mine->flags = (mine->flags & 0xffffu) | (uint32_t)(cpu + 1) << SLOT_CPU_SHIFT;
  }
  s->ext[s->pos % (uint32_t)c->nslots] = data;
  s->pos++;
  __atomic_fetch_add(&sock_sends, 1, __ATOMIC_RELAXED);
  return sock_progress_send(c);
}

static ncclResult_t sock_send_commit(struct conn* c, const struct slot_hdr* h) {
  return sock_send_commit_ext(c, h, NULL);
}

static const void* sock_recv_slot(struct conn* c, struct slot_hdr* h) {
  struct sock_conn* s = c->priv;
  if (s->done == s->pos) {
    s->asked = 1; /* its payload, if held, may come now */
    return NULL;
  }
  *h = s->hdrs[s->pos % (uint32_t)c->nslots];
  const char* ext = s->ext[s->pos % (uint32_t)c->nslots];
  return ext ? ext : slot_data(c, s->pos);
}

static void sock_recv_post(struct conn* c, void* dst, size_t bytes) {
  struct sock_conn* s = c->priv;
  s->post_dst = dst;
  s->post_len = bytes;
  s->post_idx = s->pos;
  s->posted = 1;
  /* The slot's payload has begun to arrive into the slot buffer (progress ran
   * for another connector before this post): move what came and let the
   * rest land in dst. */
  struct sock_link* l = &s->link[s->pos % (uint32_t)s->nlinks];
  uint32_t idx = s->pos % (uint32_t)c->nslots;
  const struct slot_hdr* h = &s->hdrs[idx];
  if (l->next == s->pos && l->off > sizeof(*h) && !s->ext[idx] && !(h->flags & SLOT_ERROR) && h->bytes <= bytes) {
    memcpy(dst, slot_data(c, s->pos), l->off - sizeof(*h));
    s->ext[idx] = dst;
  }
}

static ncclResult_t sock_recv_release(struct conn* c) {
  struct sock_conn* s = c->priv;
  s->ext[s->pos % (uint32_t)c->nslots] = NULL;
  s->posted = 0;
  s->asked = 0;
  s->pos++;
  /* Only what is staged: the next waiter reads the socket anyway, and a read
   * here would take the next header before its consumer could post a buffer. */
  return recv_links(c, 0);
}

/* The connections still open, as poll entries; how many. `all` 0: not those
 * whose payload is held (readable, but nothing moves until the consumer comes). */
static int link_pollfds(struct conn* c, struct pollfd* p, int all) {
  struct sock_conn* s = c->priv;
  int n = 0;
  for (int i = 0; i < s->nlinks; i++) {
    const struct sock_link* l = &s->link[i];
    if (l->eof || (!all && !c->is_send && payload_held(s, l, &s->hdrs[l->next % (uint32_t)c->nslots]))) continue;
    p[n++] = (struct pollfd){.fd = l->fd, .events = c->is_send ? POLLOUT : POLLIN};
  }
  return n;
}

static void sock_wait(struct conn* c, int timeout_ms) {
  struct pollfd p[SOCK_MAX_CONNS];
  poll(p, (nfds_t)link_pollfds(c, p, 1), timeout_ms); /* its consumer waits: nothing is held from it */
}

static void sock_fail(struct conn* c) {
  struct sock_conn* s = c->priv;
  if (!s) return;
  /* Shutting the connections down is the poison: the peer reads EOF / EPIPE. */
  for (int i = 0; i < s->nlinks; i++) {
    if (s->link[i].fd >= 0) shutdown(s->link[i].fd, SHUT_RDWR);
    if (s->link[i].park_fd >= 0) shutdown(s->link[i].park_fd, SHUT_RDWR);
  }
  s->failed = 1;
}

static int sock_pending(struct conn* c) {
  struct sock_conn* s = c->priv;
  return c->is_send && s->done != s->pos;
}

static int sock_pollfds(struct conn* c, struct pollfd* p) {
  struct sock_conn* s = c->priv;
  if (s->failed) return 0;
  if (c->is_send && s->done == s->pos) return 0; /* nothing to send */
  if (!c->is_send && (uint32_t)(s->done - s->pos) >= (uint32_t)c->nslots) return 0; /* no free slot */
  return link_pollfds(c, p, 0);
}

/* Failed: a connection broke, or the slot the consumer waits for would come
 * on a connection the peer closed. */
static int sock_peer_failed(struct conn* c) {
  struct sock_conn* s = c->priv;
  return s->failed || (!c->is_send && s->done == s->pos && s->link[s->pos % (uint32_t)s->nlinks].eof);
}

static void sock_close(struct conn* c) {
  struct sock_conn* s = c->priv;
  if (!s) return;
  for (int i = 0; i < s->nlinks; i++) {
    if (s->link[i].own_fd >= 0) close(s->link[i].own_fd);
    free(s->link[i].stage);
    free(s->link[i].park_stage);
  }
  if (s->listen_fd >= 0) close(s->listen_fd);
  free(s->slots);
  free(s->hdrs);
  free(s->ext);
  free(s->dx_mark);
  free(s);
  c->priv = NULL;
}

static const struct conn_ops sock_ops = {
    .send_slot = sock_send_slot,
    .send_commit = sock_send_commit,
    .send_commit_ext = sock_send_commit_ext,
    .recv_slot = sock_recv_slot,
    .recv_post = sock_recv_post,
    .recv_release = sock_recv_release,
    .progress = sock_progress,
    .wait = sock_wait,
    .fail = sock_fail,
    .pending = sock_pending,
    .pollfds = sock_pollfds,
    .peer_failed = sock_peer_failed,
    .close = sock_close,
};

int sock_delayed_ack_on(struct conn* c, int* armed) {
  *armed = 0;
  if (!c || c->ops != &sock_ops || c->is_send) return -1;
  struct sock_conn* s = c->priv;
  int on = 1;
  for (int i = 0; i < s->nlinks; i++) {
    if (s->link[i].delack_ns) ++*armed;
    int quick = 0;
    socklen_t len = sizeof(quick);
    /* The kernel answers whether it acknowledges at once (not in ping-pong mode). */
    if (s->link[i].fd < 0 || getsockopt(s->link[i].fd, IPPROTO_TCP, TCP_QUICKACK, &quick, &len) != 0) return -1;
    if (quick) on = 0;
  }
  return on;
}

int64_t sock_lag_holds(struct conn* c) {
  if (!c || c->ops != &sock_ops || c->is_send) return -1;
  return (int64_t)((struct sock_conn*)c->priv)->lag_holds;
}

int64_t sock_staged_large(struct conn* c) {
  if (!c || c->ops != &sock_ops || c->is_send) return -1;
  return (int64_t)((struct sock_conn*)c->priv)->staged_large;
}

int sock_congestion(struct conn* c, char* name, size_t len) {
  if (!c || c->ops != &sock_ops || len < 2) return -1;
  struct sock_conn* s = c->priv;
  for (int i = 0; i < s->nlinks; i++) {
    char cc[32] = {0};
    socklen_t n = sizeof(cc) - 1;
    if (s->link[i].own_fd < 0 || getsockopt(s->link[i].own_fd, IPPROTO_TCP, TCP_CONGESTION, cc, &n) != 0) return -1;
    if (i > 0 && strcmp(cc, name) != 0) return -1;
    snprintf(name, len, "%s", cc);
  }
  return 0;
}

int sock_duplex(struct conn* c) {
  if (!c || c->ops != &sock_ops) return -1;
  struct sock_conn* s = c->priv;
  struct sock_conn* o = dx_opposite(c);
  return s->nlinks == 1 && o && (s->link[0].fd == o->link[0].own_fd || s->link[0].park_fd == o->link[0].own_fd);
}

static int nsocks_wanted(void) {
  int64_t per = param_int(P_NCCL_NSOCKS_PERTHREAD, 1, SOCK_MAX_CONNS);
  int64_t threads = param_int(P_NCCL_SOCKET_NTHREADS, 1, SOCK_MAX_CONNS);
  int64_t n = per * threads;
  return (int)(n > SOCK_MAX_CONNS ? SOCK_MAX_CONNS : n);
}

static ncclResult_t sock_alloc(struct conn* c, int nlinks) {
  struct sock_conn* s = calloc(1, sizeof(*s));
  if (!s) return err_set(ncclSystemError, "socket transport: out of memory");
  s->listen_fd = -1;
  s->nlinks = nlinks;
  s->same_machine = c->comm->machine[c->peer] == c->comm->machine[c->comm->rank];
  s->dx = DX_NEVER;
  for (int i = 0; i < SOCK_MAX_CONNS; i++) {
    s->link[i].fd = s->link[i].own_fd = s->link[i].park_fd = -1;
    s->link[i].next = (uint32_t)i;
  }
  c->priv = s;
  c->ops = &sock_ops;
  s->slots = malloc((size_t)c->nslots * c->slot_bytes);
  s->hdrs = calloc((size_t)c->nslots, sizeof(*s->hdrs));
  s->ext = calloc((size_t)c->nslots, sizeof(*s->ext));
  if (!s->slots || !s->hdrs || !s->ext) return err_set(ncclSystemError, "socket transport: out of memory for slots");
  return ncclSuccess;
}

/* The congestion control of a sending connection to a rank of this machine
 * (COLLIE_SOCKET_LOCAL_CC; the sender's algorithm sets its window). Over
 * loopback nothing is ever lost and round trips take ~5 us: BBR sizes the
 * window to that bandwidth-delay product (14-48 segments of 64 KiB seen),
 * and whenever the receiver's kernel holds its acknowledgements back (it
 * does while the application has not read what arrived: the window it could
 * offer would shrink) the sender waits for its 2 ms loss probe, whose
 * retransmission the receiver then reports as a duplicate. Measured (2
 * ranks, a host each, broadcast/reduce/alltoall/allreduce 128 KiB-8 MiB, 10
 * calls after 70; `perf stat -e tcp:tcp_retransmit_skb`): 528-854
 * retransmissions a sweep with BBR, 158-272 with cubic or reno. */
static int local_cc_auto(void) {
  const char* want = param_str(P_COLLIE_SOCKET_LOCAL_CC);
  return !want || !*want || strcmp(want, "auto") == 0;
}

static void local_cc(int fd) {
  static int logged;
  int is_auto = local_cc_auto();
  const char* want = is_auto ? "auto" : param_str(P_COLLIE_SOCKET_LOCAL_CC);
  if (strcmp(want, "system") == 0) return;
  const char* tries[2] = {want, NULL};
  if (is_auto) {
    tries[0] = "cubic";
    tries[1] = "reno"; /* allowed to every user by default */
  }
  for (int i = 0; i < 2 && tries[i]; i++) {
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, tries[i], (socklen_t)strlen(tries[i])) == 0) {
      __atomic_store_n(&local_cc_large, tries[i], __ATOMIC_RELAXED);
      if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        INFO(LOG_NET, "socket: connections to ranks of this machine use TCP congestion control %s%s "
             "(COLLIE_SOCKET_LOCAL_CC=%s)", tries[i],
             is_auto ? " (" SOCK_CC_SMALL " for small slots where the machine's ranks outnumber its CPUs)" : "", want);
      return;
    }
  }
  if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
    WARN("socket: the kernel refused TCP congestion control %s for connections to ranks of this machine (%s); "
         "they keep its default", tries[1] ? "cubic or reno" : want, strerror(errno));
}

struct sock_info {
  union sock_addr addr;
  int32_t nlinks;
};

static ncclResult_t sock_recv_setup(struct conn* c, void* info, size_t* info_len) {
  NCCLCHECK(sock_alloc(c, nsocks_wanted()));
  struct sock_conn* s = c->priv;
  s->readahead = (int)param_int(P_COLLIE_SOCKET_READAHEAD, 0, 1);
  s->hold = !s->readahead && param_int(P_COLLIE_SOCKET_HOLD, 0, 1); /* read ahead: into the slots, as asked */
  s->delayed_ack = (int)param_int(P_COLLIE_SOCKET_DELAYED_ACK, 0, 1);
  s->lag_ns = param_int(P_COLLIE_SOCKET_LAG_NS, 0, 1000000);
  for (int i = 0; i < s->nlinks; i++)
    if (!(s->link[i].stage = malloc(SOCK_STAGE_BYTES)))
      return err_set(ncclSystemError, "socket transport: out of memory for a receive stage");
  struct sock_info in;
  memset(&in, 0, sizeof(in));
  in.addr = *bootstrap_peer_addr(c->comm->bs, c->comm->rank);
  if (in.addr.sa.sa_family == AF_INET) in.addr.sin.sin_port = 0;
  else in.addr.sin6.sin6_port = 0;
  NCCLCHECK(sock_listen_on(&in.addr, bootstrap_listen_any(c->comm->bs), &s->listen_fd));
  /* Accepted connections inherit the listener's congestion control. */
  if (s->same_machine) local_cc(s->listen_fd);
  in.nlinks = s->nlinks;
  memcpy(info, &in, sizeof(in));
  *info_len = sizeof(in);
  return ncclSuccess;
}

static ncclResult_t sock_send_connect(struct conn* c, const void* info, size_t info_len) {
  struct sock_info in;
  if (info_len != sizeof(in)) return err_set(ncclInternalError, "socket: bad connection info from rank %d", c->peer);
  memcpy(&in, info, sizeof(in));
  if (in.nlinks < 1 || in.nlinks > SOCK_MAX_CONNS)
    return err_set(ncclInternalError, "socket: rank %d asked for %d connections", c->peer, in.nlinks);
  NCCLCHECK(sock_alloc(c, in.nlinks));
  struct sock_conn* s = c->priv;
  int64_t deadline = time_ms() + param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  for (int i = 0; i < s->nlinks; i++) {
    /* A refused connection is retried until the deadline; a receiver that
     * died after describing its connector refuses every attempt, so the
     * failure recorded meanwhile (health.c) ends the retries, not the whole
     * bootstrap timeout (a survivor of a rank killed during the first
     * operation's setup waited there for it). */
    struct sock_connect_opts opt = {s->same_machine ? local_cc : NULL, comm_stop_check_cb, c->comm};
    int st = sock_connect_opt(&in.addr, deadline, &c->comm->abort_flag, &opt, &s->link[i].fd);
    if (st == SOCK_ABORTED) NCCLCHECK(comm_stop_check(c->comm));
    if (st != SOCK_OK)
      return err_set(ncclRemoteError, "socket: rank %d cannot connect to rank %d (%s): %s", c->comm->rank, c->peer,
                     bootstrap_peer_host(c->comm->bs, c->peer), sock_status_str(st));
    struct sock_hello hello = {c->comm->comm_hash, c->comm->rank, i};
    if (sock_send_all(s->link[i].fd, &hello, sizeof(hello), deadline, &c->comm->abort_flag) != SOCK_OK)
      return err_set(ncclRemoteError, "socket: rank %d: handshake with rank %d failed", c->comm->rank, c->peer);
    sock_buffer(s->link[i].fd, SO_SNDBUF);
    s->link[i].own_fd = s->link[i].fd;
  }
  s->cc_switch = s->same_machine && c->comm->machine_size > c->comm->machine_cpus && local_cc_auto() &&
                 __atomic_load_n(&local_cc_large, __ATOMIC_RELAXED);
  /* The higher rank of a pair puts small slots on the shared connection (see the top of this file). */
  int64_t dx = param_int(P_COLLIE_SOCKET_DUPLEX, 0, (int64_t)1 << 30);
  if (s->nlinks == 1 && c->comm->rank > c->peer && dx > 0) {
    if (!(s->dx_mark = calloc((size_t)c->nslots, 1)))
      return err_set(ncclSystemError, "socket transport: out of memory for slots");
    s->dx_max = (size_t)dx;
    s->dx = DX_WATCH;
  }
  return ncclSuccess;
}

/* Accepts the sender's connections (it has connected by the time its
 * acknowledgement arrived). */
static ncclResult_t sock_recv_connect(struct conn* c, const void* info, size_t len) {
  (void)info;
  (void)len;
  struct sock_conn* s = c->priv;
  int64_t deadline = time_ms() + param_int(P_COLLIE_BOOTSTRAP_TIMEOUT, 1, 86400) * 1000;
  int got = 0;
  while (got < s->nlinks) {
    union sock_addr from;
    int fd;
    int st = sock_accept(s->listen_fd, &fd, &from);
    if (st == SOCK_OK) {
      struct sock_hello hello;
      if (sock_recv_all(fd, &hello, sizeof(hello), time_ms() + 5000, &c->comm->abort_flag) == SOCK_OK &&
          hello.comm_hash == c->comm->comm_hash && hello.rank == c->peer && hello.index >= 0 &&
          hello.index < s->nlinks && s->link[hello.index].fd < 0) {
        s->link[hello.index].fd = s->link[hello.index].own_fd = fd;
        sock_buffer(fd, SO_RCVBUF);
        got++;
        continue;
      }
      bootstrap_note_dropped(&from, "socket transport", "bad handshake");
      close(fd);
      continue;
    }
    if (time_ms() > deadline)
      return err_set(ncclRemoteError, "socket: rank %d waited in vain for rank %d to connect", c->comm->rank, c->peer);
    NCCLCHECK(comm_stop_check(c->comm));
    struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
    poll(&p, 1, 100);
  }
  close(s->listen_fd);
  s->listen_fd = -1;
  return ncclSuccess;
}

/* The fallback: any two ranks that can reach each other's bootstrap address. */
static int sock_can_connect(struct ncclComm* comm, int peer) {
  (void)comm;
  (void)peer;
  return 1;
}

const struct transport transport_socket = {
    .name = "Socket",
    .caps = TRANSPORT_CAP_PROGRESS | TRANSPORT_CAP_POLLFD | TRANSPORT_CAP_SYSCALL_DATA | TRANSPORT_CAP_FLUSH |
            TRANSPORT_CAP_NET,
    .can_connect = sock_can_connect,
    .send = {NULL, sock_send_connect, sock_close},
    .recv = {sock_recv_setup, sock_recv_connect, sock_close},
    .ops = &sock_ops,
};
