/* Small messages on one host (src/coll/direct_shm.c, p2p.c, enqueue.c):
 *   zero N   collectives of count 0 return after their argument checks and
 *            synchronise with nobody: some ranks make hundreds of them (alone,
 *            and inside groups beside real calls) that the others never make,
 *            then every rank runs checked collectives that must still match.
 *   a2a N    alltoall at every size from 1 element to past the Direct row's
 *            limit, interleaved with broadcasts (whose root runs ahead through
 *            the mailbox slots) and allgathers; every result checked.
 *   paired N every rank starts on the same CPU (see rank_paired); with
 *            COLLIE_TEST_SOCKETS=1 every rank is a host of its own
 *            (NCCL_HOSTID), so they talk over sockets on one machine.
 *   spread N more ranks than CPUs, placed 3 to 1 on two: with COLLIE_SPREAD
 *            on the highest rank of the crowded CPU moves (see rank_spread).
 *   helpers N a host per rank on one machine, two channels: the ranks' channel
 *            helper threads must sit on different CPUs where the machine
 *            has a CPU per rank, and keep the process's mask where it has
 *            fewer (see rank_helpers).
 *   delack N a host per rank over sockets: small checked allreduces, then
 *            every receiving connection's kernel acknowledgement mode must
 *            be what COLLIE_SOCKET_DELAYED_ACK asks (see rank_delack).
 *   lag N    a host per rank over sockets (N = 2): streams of small
 *            broadcasts and reduces of mixed sizes, then paced small ones,
 *            then small allreduces; every result checked; a receiver of the
 *            streams holds reads back (COLLIE_SOCKET_LAG_NS > 0, ranks on
 *            CPUs of their own) or never (0), and never during the
 *            exchanges (see rank_lag).
 *   localcc N a host per rank over sockets: checked allreduces, then every
 *            sending connection's congestion control must be what
 *            COLLIE_SOCKET_LOCAL_CC asks (see rank_localcc).
 *   duplex N a host per rank over sockets: point-to-point groups that mix
 *            small and larger messages (so the higher rank's sender changes
 *            connection at every second message, and each receiver finds
 *            bytes past a marker in its stage), then collectives; every
 *            result checked, then which connectors used the shared
 *            connection must be what COLLIE_SOCKET_DUPLEX and
 *            NCCL_NSOCKS_PERTHREAD ask (see rank_duplex).
 *   cmaauto N one host, COLLIE_CMA=auto: single copy is either off (the probe
 *            failed) or on for point-to-point messages from a threshold the
 *            tuner computed, never for the single-copy collective rows; then
 *            alltoalls and send/recv pairs around that threshold, checked
 *            (see rank_cmaauto).
 *   adapt N  one host: large collectives weighed between the tuner's row
 *            and its alternative (single copy, or non-temporal stores into
 *            the slots) by measured rates, alike on every rank; every result
 *            checked (see rank_adapt).
 *   runahead N one host, NCCL_ALGO=Direct: a broadcast root and reduce
 *            non-roots that wait for nobody run 57 calls ahead of readers
 *            that have stopped calling (the one-shot's 64 slots, less what a
 *            reader may not yet have published, DONE_EVERY - 1); every value
 *            checked when the readers catch up (see rank_runahead).
 *   yield N  a host per rank over sockets, every rank on one CPU (more ranks
 *            than CPUs): every collective and alltoall at sizes from 1 float
 *            to 64 Ki, checked; socket waiters must have yielded (unset
 *            COLLIE_SOCKET_YIELD_US) or never (0); small broadcasts go
 *            by the ring's chain, small reduces by the binomial tree (see
 *            rank_yield).
 *   rotate 2 one host: payloads sent through a shared-memory connector of
 *            their own land where COLLIE_SLOT_ROTATE says in their slots,
 *            and arrive whole (see rank_rotate).
 * Run with NCCL_ALGO=Direct too, so the Direct alltoall row takes every size
 * it can. Uses the fork harness (harness.h). */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "comm.h"
#include "coll/coll.h"
#include "coll/prims.h"

/* Makes this rank a host of its own (NCCL_HOSTID), so it talks to the
 * others over sockets although they share the machine. */
static void own_host(const char* prefix, int rank) {
  char h[32];
  snprintf(h, sizeof(h), "%s%d", prefix, rank);
  setenv("NCCL_HOSTID", h, 1);
}

static float val(int it, int from, int to, size_t i) { return (float)((it * 131 + from * 17 + to * 7 + (int)i) % 1000); }

static int rank_zero(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  float* buf = malloc(64 * sizeof(float) * (size_t)nranks);
  float* out = malloc(64 * sizeof(float) * (size_t)nranks);
  MP_CHECK(buf && out, "out of memory");
  for (int round = 0; round < 20; round++) {
    /* Odd ranks (and rank 0 on even rounds) make count-0 calls the others never make. */
    if (rank % 2 == 1 || (rank == 0 && round % 2 == 0)) {
      for (int k = 0; k < 10; k++) {
        MP_NCCL(ncclAllReduce(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
        MP_NCCL(ncclBroadcast(NULL, NULL, 0, ncclFloat, k % nranks, comm, NULL));
        MP_NCCL(ncclReduce(NULL, NULL, 0, ncclFloat, ncclMax, k % nranks, comm, NULL));
        MP_NCCL(ncclAllGather(NULL, NULL, 0, ncclFloat, comm, NULL));
        MP_NCCL(ncclReduceScatter(NULL, NULL, 0, ncclFloat, ncclSum, comm, NULL));
        MP_NCCL(ncclAlltoAll(NULL, NULL, 0, ncclFloat, comm, NULL));
        MP_NCCL(ncclGather(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
        MP_NCCL(ncclScatter(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
      }
    }
    /* Argument checks still run for count 0: a bad root or datatype fails. */
    MP_CHECK(ncclBroadcast(NULL, NULL, 0, ncclFloat, nranks, comm, NULL) == ncclInvalidArgument,
             "count-0 broadcast with root %d outside the communicator did not fail", nranks);
    MP_CHECK(ncclAllReduce(NULL, NULL, 0, (ncclDataType_t)99, ncclSum, comm, NULL) == ncclInvalidArgument,
             "count-0 allreduce with datatype 99 did not fail");
    /* A group with count-0 calls beside a real allreduce (the count-0 calls only on some ranks). */
    for (int i = 0; i < 16; i++) buf[i] = val(round, rank, 0, (size_t)i);
    MP_NCCL(ncclGroupStart());
    if (rank % 2 == 0) MP_NCCL(ncclAllGather(NULL, NULL, 0, ncclFloat, comm, NULL));
    MP_NCCL(ncclAllReduce(buf, out, 16, ncclFloat, ncclSum, comm, NULL));
    if (rank % 2 == 1) MP_NCCL(ncclBroadcast(NULL, NULL, 0, ncclFloat, 0, comm, NULL));
    MP_NCCL(ncclGroupEnd());
    for (int i = 0; i < 16; i++) {
      float want = 0;
      for (int r = 0; r < nranks; r++) want += val(round, r, 0, (size_t)i);
      MP_CHECK(out[i] == want, "round %d allreduce element %d is %g, want %g", round, i, out[i], want);
    }
    /* A broadcast from a rotating root (its root runs ahead) and an alltoall. */
    int root = round % nranks;
    for (int i = 0; i < 8; i++) buf[i] = val(round, rank, 1, (size_t)i);
    MP_NCCL(ncclBroadcast(buf, out, 8, ncclFloat, root, comm, NULL));
    for (int i = 0; i < 8; i++)
      MP_CHECK(out[i] == val(round, root, 1, (size_t)i), "round %d broadcast element %d is %g", round, i, out[i]);
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < 2; i++) buf[p * 2 + i] = val(round, rank, p, (size_t)i);
    MP_NCCL(ncclAlltoAll(buf, out, 2, ncclFloat, comm, NULL));
    for (int p = 0; p < nranks; p++)
      for (int i = 0; i < 2; i++)
        MP_CHECK(out[p * 2 + i] == val(round, p, rank, (size_t)i), "round %d alltoall block %d element %d is %g",
                 round, p, i, out[p * 2 + i]);
  }
  free(buf);
  free(out);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int rank_a2a(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  /* Per-peer block sizes (elements) up to past the Direct row's 256 KiB per rank. */
  size_t maxc = (size_t)(320 * 1024) / sizeof(float) / (size_t)nranks + 3;
  float* send = malloc(maxc * sizeof(float) * (size_t)nranks);
  float* recv = malloc(maxc * sizeof(float) * (size_t)nranks);
  MP_CHECK(send && recv, "out of memory");
  int it = 0;
  for (size_t count = 1; count <= maxc; count = count < 16 ? count + 1 : count * 3 + 1, it++) {
    for (int rep = 0; rep < 3; rep++, it++) {
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < count; i++) send[(size_t)p * count + i] = val(it, rank, p, i);
      memset(recv, 0xff, count * sizeof(float) * (size_t)nranks);
      MP_NCCL(ncclAlltoAll(send, recv, count, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < count; i++)
          MP_CHECK(recv[(size_t)p * count + i] == val(it, p, rank, i),
                   "call %d alltoall count %zu: block %d element %zu is %g, want %g", it, count, p, i,
                   recv[(size_t)p * count + i], val(it, p, rank, i));
      /* The send buffer is the caller's again. */
      for (size_t i = 0; i < count * (size_t)nranks; i++) send[i] = -3.f;
      /* Small broadcasts whose root runs ahead of the next alltoall's readers. */
      size_t bc = count < 64 ? count : 64;
      int root = (it + rep) % nranks;
      for (int k = 0; k < 5; k++) {
        for (size_t i = 0; i < bc; i++) send[i] = val(it + k, rank, 99, i);
        MP_NCCL(ncclBroadcast(send, recv, bc, ncclFloat, root, comm, NULL));
        for (size_t i = 0; i < bc; i++)
          MP_CHECK(recv[i] == val(it + k, root, 99, i), "call %d broadcast %d count %zu: element %zu is %g", it, k, bc,
                   i, recv[i]);
      }
      for (size_t i = 0; i < bc; i++) send[i] = val(it, rank, 98, i);
      MP_NCCL(ncclAllGather(send, recv, bc, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < bc; i++)
          MP_CHECK(recv[(size_t)p * bc + i] == val(it, p, 98, i), "call %d allgather count %zu: block %d element %zu",
                   it, bc, p, i);
    }
  }
  free(send);
  free(recv);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Where shm.c puts a payload of `hint` bytes (the most the sender said it
 * would commit) of slot position pos: the documented placement. */
static size_t rotate_place(size_t pos, size_t hint, int nslots, size_t slot_bytes, int rotate) {
  size_t step = (hint + 4095) & ~(size_t)4095, places = slot_bytes / step;
  if (!rotate || places < 2) return 0;
  return (pos / (size_t)nslots % places) * step;
}

/* Two ranks, a connector pair of their own (the last channel, which no
 * collective of 2 ranks opens, so its positions start at 0): rank 0 sends
 * groups of payloads (sizes below and above half a slot, not a multiple of
 * 4 KiB, and one group that commits less than it asked a slot for), three
 * laps of every place each; rank 1 checks every byte and that each payload's
 * address less its expected place is its slot's start: the same for every
 * lap, and slot_bytes apart from slot to slot. */
static int rank_rotate(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  MP_CHECK(nranks == 2, "rotate runs on 2 ranks");
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  const char* env = getenv("COLLIE_SLOT_ROTATE");
  int rotate = env && strcmp(env, "1") == 0 ? 1 : env && strcmp(env, "0") == 0 ? 0 : comm->oversub <= 1.0;
  if (rank == 0) fprintf(stderr, "rotate: payloads %s (%.1f ranks a CPU)\n", rotate ? "move" : "stay", comm->oversub);
  int peer = 1 - rank;
  struct conn *sc, *rc;
  MP_NCCL(transport_connect_ch(comm, MAX_CHANNELS - 1, &peer, 1, &peer, 1, &sc, &rc));
  MP_CHECK(sc->tp == &transport_shm && rc->tp == &transport_shm, "rank %d: the connectors are not shared memory", rank);
  MP_CHECK(sc->opseq == 0 && rc->opseq == 0, "rank %d: the last channel's connectors were used before", rank);
  int nslots = rc->nslots;
  size_t sb = rc->slot_bytes;
  struct prim_link s, r;
  prim_begin(&s, sc, 77);
  prim_begin(&r, rc, 77);
  /* {hint, bytes}: what the sender asks a slot for, what it commits. */
  size_t groups[][2] = {{32 << 10, 32 << 10}, {sb / 2, sb / 2}, {20000, 20000}, {sb / 2 + 4096, sb / 2 + 4096},
                        {40 << 10, 30 << 10}, {4096, 4096}, {sb, sb}};
  char* buf = malloc(sb);
  MP_CHECK(buf != NULL, "out of memory");
  size_t pos = 0;
  const char* base[16] = {0};
  for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
    size_t hint = groups[g][0], bytes = groups[g][1];
    size_t step = (hint + 4095) & ~(size_t)4095, places = sb / step ? sb / step : 1;
    size_t msgs = 3 * (size_t)nslots * places;
    for (size_t k = 0; k < msgs; k++, pos++) {
      if (rank == 0) {
        for (size_t i = 0; i < bytes; i++) buf[i] = (char)(pos * 7 + i * 13 + g);
        void* slot;
        MP_NCCL(prim_send_slot(&s, hint, &slot));
        memcpy(slot, buf, bytes);
        MP_NCCL(prim_send_commit(&s, bytes));
      } else {
        const void* p;
        MP_NCCL(prim_recv_slot(&r, bytes, &p));
        const char* got = p;
        for (size_t i = 0; i < bytes; i++)
          MP_CHECK(got[i] == (char)(pos * 7 + i * 13 + g), "payload %zu (%zu bytes): byte %zu is wrong", pos, bytes, i);
        const char* start = got - rotate_place(pos, hint, nslots, sb, rotate);
        int slot = (int)(pos % (size_t)nslots);
        if (!base[slot]) base[slot] = start;
        MP_CHECK(start == base[slot],
                 "payload %zu (%zu bytes, %zu asked for, COLLIE_SLOT_ROTATE=%d) at offset %td from where slot %d "
                 "held it before less its place",
                 pos, bytes, hint, rotate, start - base[slot], slot);
        if (slot > 0 && base[slot - 1])
          MP_CHECK(base[slot] - base[slot - 1] == (ptrdiff_t)sb, "slots %d and %d are %td bytes apart, not %zu",
                   slot - 1, slot, base[slot] - base[slot - 1], sb);
        MP_NCCL(prim_recv_release(&r));
      }
    }
  }
  free(buf);
  /* Rank 0 leaves only when rank 1 has everything. */
  MP_NCCL(ncclAllReduce(&pos, &pos, 1, ncclUint64, ncclMax, comm, NULL));
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Calls a writer (broadcast root, reduce non-root) must be able to make
 * while its readers make none, once they have made a few: NSLOTS -
 * DONE_EVERY + 1 in src/coll/direct_shm.c. */
#define RUNAHEAD 57
#define RUNAHEAD_WARM 13 /* calls before: the readers stop between two publications of their counter */

static float ra_val(int k, int from, size_t i) { return (float)((k * 29 + from * 5 + (int)i) % 200); }

/* Broadcasts from rank 0 (4 floats: in the slot's line), then reduces to
 * rank 0 (300 floats: the slot's small buffer), then gathers and scatters
 * (the writers: the non-roots, the root): after RUNAHEAD_WARM calls
 * together, the writers make RUNAHEAD more while the readers wait for them
 * outside collie (a shared counter), then the readers make theirs and check
 * every one. A writer that needed a reader's later progress would wait for
 * ever (the readers' wait gives up after 120 s: the test fails). */
static int rank_runahead(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  enum { BC = 4, RC = 300 };
  float send[RC], recv[RC];
  int total = RUNAHEAD_WARM + RUNAHEAD;
  /* Broadcasts: rank 0 writes. */
  for (int k = 0; k < total; k++) {
    if (k == RUNAHEAD_WARM && rank != 0)
      MP_CHECK(mp_await(0, 1, 120) == 0, "the broadcast root never got %d calls ahead", RUNAHEAD);
    for (size_t i = 0; i < BC; i++) send[i] = rank == 0 ? ra_val(k, 0, i) : -1.f;
    MP_NCCL(ncclBroadcast(send, recv, BC, ncclFloat, 0, comm, NULL));
    for (size_t i = 0; i < BC; i++)
      MP_CHECK(recv[i] == ra_val(k, 0, i), "broadcast %d: element %zu is %g", k, i, recv[i]);
    if (k == total - 1 && rank == 0) mp_arrive(0);
  }
  /* Reduces: every rank but 0 writes. */
  for (int k = 0; k < total; k++) {
    if (k == RUNAHEAD_WARM && rank == 0)
      MP_CHECK(mp_await(1, nranks - 1, 120) == 0, "the reduce non-roots never got %d calls ahead", RUNAHEAD);
    for (size_t i = 0; i < RC; i++) send[i] = ra_val(k, rank, i);
    MP_NCCL(ncclReduce(send, recv, RC, ncclFloat, ncclSum, 0, comm, NULL));
    if (rank == 0) {
      for (size_t i = 0; i < RC; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += ra_val(k, r, i);
        MP_CHECK(recv[i] == want, "reduce %d: element %zu is %g, want %g", k, i, recv[i], want);
      }
    }
    if (k == total - 1 && rank != 0) mp_arrive(1);
  }
  /* Gathers to the last rank (30 floats a rank): every other rank writes. */
  int last = nranks - 1;
  enum { GC = 30 };
  float* all = malloc(sizeof(float) * GC * (size_t)nranks);
  MP_CHECK(all != NULL, "out of memory");
  for (int k = 0; k < total; k++) {
    if (k == RUNAHEAD_WARM && rank == last)
      MP_CHECK(mp_await(2, nranks - 1, 120) == 0, "the gather non-roots never got %d calls ahead", RUNAHEAD);
    for (size_t i = 0; i < GC; i++) send[i] = ra_val(k, rank, i);
    MP_NCCL(ncclGather(send, all, GC, ncclFloat, last, comm, NULL));
    for (int r = 0; rank == last && r < nranks; r++)
      for (size_t i = 0; i < GC; i++)
        MP_CHECK(all[(size_t)r * GC + i] == ra_val(k, r, i), "gather %d: rank %d's element %zu is %g", k, r, i,
                 all[(size_t)r * GC + i]);
    if (k == total - 1 && rank != last) mp_arrive(2);
  }
  /* Scatters from the last rank (3 floats a rank: n blocks in the slot's
   * line up to 3 ranks, in its small buffer above): the root writes. */
  enum { SC = 3 };
  for (int k = 0; k < total; k++) {
    if (k == RUNAHEAD_WARM && rank != last)
      MP_CHECK(mp_await(3, 1, 120) == 0, "the scatter root never got %d calls ahead", RUNAHEAD);
    for (int r = 0; rank == last && r < nranks; r++)
      for (size_t i = 0; i < SC; i++) all[(size_t)r * SC + i] = ra_val(k, r, i);
    for (size_t i = 0; i < SC; i++) recv[i] = -1.f;
    MP_NCCL(ncclScatter(all, recv, SC, ncclFloat, last, comm, NULL));
    for (size_t i = 0; i < SC; i++)
      MP_CHECK(recv[i] == ra_val(k, rank, i), "scatter %d: element %zu is %g", k, i, recv[i]);
    if (k == total - 1 && rank == last) mp_arrive(3);
  }
  free(all);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Sockets between ranks of one machine: every peer's slot headers said
 * which CPU it sent from; a waiter whose peer last sent from its own CPU
 * stops polling (0 ns) and, when it may move and is the higher rank, moves
 * itself off that CPU and goes on polling, its mask put back. */
static int check_give_way(ncclComm_t comm, int rank, int nranks, int first, const cpu_set_t* all) {
  for (int p = 0; p < nranks; p++) {
    int cpu = comm->peer_cpu[p];
    MP_CHECK(p == rank ? cpu == -1 : cpu >= 0 && CPU_ISSET(cpu, all),
             "rank %d: peer %d's last CPU is %d (its slot headers carry none?)", rank, p, cpu);
    MP_CHECK(comm->machine[p] == comm->machine[rank], "rank %d: peer %d on another machine", rank, p);
  }
  MP_CHECK(comm->nhosts == nranks && comm->machine_size == nranks, "rank %d: %d hosts, %d ranks on this machine",
           rank, comm->nhosts, comm->machine_size);
  int peer = rank == 0 ? 1 : 0;
  cpu_set_t one, now;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "pin to CPU %d", first);
  comm->peer_cpu[peer] = first == 0 ? 1 : 0;
  MP_CHECK(prim_fd_poll_ns(comm, peer) > 0, "rank %d: gave way to a peer on another CPU", rank);
  comm->peer_cpu[peer] = first;
  /* Moves are allowed exactly when COLLIE_UNPAIR is on and both ranks can
   * have a CPU (the affinity at init was the whole mask): the move check
   * below must not be skipped by a flag that stayed off. */
  const char* u = getenv("COLLIE_UNPAIR");
  int want_unpair = (!u || strcmp(u, "0") != 0) && CPU_COUNT(all) >= nranks;
  MP_CHECK(comm->unpair == want_unpair, "rank %d: unpair %d, want %d", rank, comm->unpair, want_unpair);
  int unpair = comm->unpair;
  comm->unpair = 0;
  MP_CHECK(prim_fd_poll_ns(comm, peer) == 0, "rank %d: polled on although its peer shares its CPU", rank);
  comm->unpair = unpair;
  MP_CHECK(prim_fd_poll_ns(comm, rank) > 0 && prim_fd_poll_ns(comm, -1) > 0 && prim_fd_poll_ns(comm, nranks) > 0,
           "rank %d: gave way to itself or to no rank", rank);
  MP_CHECK(sched_setaffinity(0, sizeof(*all), all) == 0, "unpin");
  if (unpair && rank > peer) {
    comm->unpair_ns = 0;
    uint64_t moves = comm->unpair_moves;
    MP_CHECK(prim_fd_poll_ns(comm, peer) > 0, "rank %d: did not move off CPU %d", rank, first);
    /* A move counts only where the library saw this thread off CPU `first`
     * while its mask left that CPU out (bind_move_off_cpu); once the mask is
     * put back the scheduler may place it there again at any moment (it did
     * once under ASan with another test on the other CPU), so where it runs
     * now proves nothing. */
    MP_CHECK(comm->unpair_moves == moves + 1, "rank %d: still on CPU %d (no move counted)", rank, first);
    MP_CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, all), "rank %d: mask not put back",
             rank);
    /* 3 ms after a move (past UNPAIR_INTERVAL_NS, within
     * UNPAIR_LARGE_INTERVAL_NS): a waiter in a call of large messages stays
     * where it is (and sleeps at once: 0 ns), one in a call of small ones
     * moves again. A thread that migrates between reading its CPU and the
     * check sees no shared CPU (it polls, nothing to judge): try again until
     * both cases were judged. */
    int stayed = 0, moved = 0;
    for (int tries = 0; tries < 20 && !(stayed && moved); tries++) {
      comm->peer_cpu[peer] = sched_getcpu();
      comm->op_bytes = (size_t)64 << 20;
      comm->unpair_ns = time_ns() - 3000000;
      moves = comm->unpair_moves;
      int64_t poll_ns = prim_fd_poll_ns(comm, peer);
      MP_CHECK(comm->unpair_moves == moves, "rank %d: moved again 3 ms after a move, in a call of 64 MiB", rank);
      if (poll_ns == 0) stayed = 1;
      comm->peer_cpu[peer] = sched_getcpu();
      comm->op_bytes = 8;
      (void)prim_fd_poll_ns(comm, peer);
      if (comm->unpair_moves == moves + 1) moved = 1;
    }
    MP_CHECK(stayed, "rank %d: never saw its peer's CPU as its own in a call of 64 MiB", rank);
    MP_CHECK(moved, "rank %d: never moved 3 ms after a move, in a call of 8 bytes", rank);
  }
  return 0;
}

/* Every rank starts on one CPU (pinned to the first CPU it may use for a
 * few calls after init, then given its whole mask back) while a busy process holds the last
 * CPU (main), so the ranks wait for peers that sit on their own CPU: symmetric one-shot calls, run-ahead broadcasts, ring
 * allreduces and point-to-point alltoalls, all checked. With COLLIE_UNPAIR
 * on, waiters move themselves off the shared CPU: afterwards every rank's
 * mask must be exactly the one it had. Over sockets (COLLIE_TEST_SOCKETS)
 * the ranks learn each other's CPU from the slot headers: checked, and the
 * socket waiters' decision (prim_fd_poll_ns) is checked directly at the end. */
static int rank_paired(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  cpu_set_t all, one, now;
  MP_CHECK(sched_getaffinity(0, sizeof(all), &all) == 0, "sched_getaffinity");
  int first = 0;
  while (first < CPU_SETSIZE - 1 && !CPU_ISSET(first, &all)) first++;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  int sockets = getenv("COLLIE_TEST_SOCKETS") != NULL;
  if (sockets) own_host("pairhost", rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  /* Pinned only after init: at init every rank reports its whole mask, so
   * the communicator sees a CPU per local rank (spinning and moves allowed). */
  MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "pin to CPU %d", first);
  int one_val = 1;
  for (int k = 0; k < 20; k++) MP_NCCL(ncclAllReduce(&one_val, &one_val, 1, ncclInt32, ncclMax, comm, NULL));
  MP_CHECK(sched_setaffinity(0, sizeof(all), &all) == 0, "unpin");
  size_t big = 64 * 1024; /* elements: past the one-shot limit, a ring allreduce */
  float* buf = malloc(big * sizeof(float));
  float* out = malloc(big * sizeof(float) * (size_t)nranks);
  MP_CHECK(buf && out, "out of memory");
  for (int it = 0; it < 3000; it++) {
    int kind = it % 4;
    if (kind == 0) {
      buf[0] = (float)(rank + it);
      MP_NCCL(ncclAllReduce(buf, out, 1, ncclFloat, ncclSum, comm, NULL));
      float want = (float)(nranks * it + nranks * (nranks - 1) / 2);
      MP_CHECK(out[0] == want, "call %d allreduce gave %g, want %g", it, out[0], want);
    } else if (kind == 1) {
      int root = (it / 4) % nranks;
      for (int i = 0; i < 4; i++) buf[i] = val(it, rank, 5, (size_t)i);
      MP_NCCL(ncclBroadcast(buf, out, 4, ncclFloat, root, comm, NULL));
      for (int i = 0; i < 4; i++)
        MP_CHECK(out[i] == val(it, root, 5, (size_t)i), "call %d broadcast element %d is %g", it, i, out[i]);
    } else if (kind == 2 && it % 40 == 2) {
      for (size_t i = 0; i < big; i++) buf[i] = (float)((rank + (int)i + it) % 7);
      MP_NCCL(ncclAllReduce(buf, out, big, ncclFloat, ncclSum, comm, NULL));
      for (size_t i = 0; i < big; i += 997) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += (float)((r + (int)i + it) % 7);
        MP_CHECK(out[i] == want, "call %d large allreduce element %zu is %g, want %g", it, i, out[i], want);
      }
    } else if (kind == 3) {
      for (int p = 0; p < nranks; p++) buf[p] = val(it, rank, p, 0);
      MP_NCCL(ncclAlltoAll(buf, out, 1, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        MP_CHECK(out[p] == val(it, p, rank, 0), "call %d alltoall block %d is %g", it, p, out[p]);
    }
  }
  MP_CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &all),
           "rank %d: the thread's CPU mask changed (%d CPUs, had %d)", rank, CPU_COUNT(&now), CPU_COUNT(&all));
  if (sockets) MP_CHECK(check_give_way(comm, rank, nranks, first, &all) == 0, "rank %d: socket give-way", rank);
  free(buf);
  free(out);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* More ranks than CPUs (main gives the process its first two CPUs): in
 * each attempt every rank but the last is pinned to the first CPU and the
 * last to the second for a few one-shot calls (which publish those CPUs),
 * then every rank gets both CPUs back and runs checked one-shot calls. 3
 * and 1 leaves no CPU idle, so the kernel seldom moves anybody at once; with
 * COLLIE_SPREAD on, the highest rank of the first CPU moves to the second
 * (bind_spread_target), in some attempt of 50 (an attempt in which another
 * task wanted a CPU, or the kernel moved a rank first, moves nobody). With
 * it off nobody ever moves. If another task was seen in all 50, nothing
 * was judged: reported as a skip. Every result checked; masks as they were. */
#define SPREAD_UNJUDGED 0 /* shared counter: rank 0 found nothing to judge */
static int rank_spread(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  cpu_set_t two, one, now;
  MP_CHECK(sched_getaffinity(0, sizeof(two), &two) == 0 && CPU_COUNT(&two) == 2, "two CPUs");
  int cpu[2], k = 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &two)) cpu[k++] = c;
  const char* e = getenv("COLLIE_SPREAD");
  int want = !e || strcmp(e, "0") != 0;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->spread == want, "rank %d: spread %d, want %d (%d ranks, 2 CPUs)", rank, comm->spread, want, nranks);
  float in[64], out[64];
  uint64_t total = 0, chances = 0;
  int attempts = want ? 50 : 5;
  for (int a = 0; a < attempts && total == 0; a++) {
    CPU_ZERO(&one);
    CPU_SET(cpu[rank == nranks - 1], &one);
    MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "pin");
    int v = 1;
    for (int i = 0; i < 20; i++) MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclMax, comm, NULL));
    MP_CHECK(sched_setaffinity(0, sizeof(two), &two) == 0, "unpin");
    uint64_t before = comm->spread_moves, refused = comm->spread_refused;
    comm->spread_ns = 0;
    for (int it = 0; it < 200; it++) {
      for (int p = 0; p < nranks; p++) in[p] = val(it + a, rank, p, 0);
      MP_NCCL(ncclAlltoAll(in, out, 1, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        MP_CHECK(out[p] == val(it + a, p, rank, 0), "attempt %d call %d alltoall block %d is %g", a, it, p, out[p]);
      int s = rank + it;
      MP_NCCL(ncclAllReduce(&s, &s, 1, ncclInt32, ncclSum, comm, NULL));
      MP_CHECK(s == nranks * it + nranks * (nranks - 1) / 2, "attempt %d call %d allreduce gave %d", a, it, s);
    }
    MP_CHECK(comm->spread_moves >= before, "moves went back");
    uint64_t moved = comm->spread_moves - before;
    MP_NCCL(ncclAllReduce(&moved, &total, 1, ncclUint64, ncclSum, comm, NULL));
    /* An attempt in which no rank was refused for other tasks was a chance. */
    uint64_t r = comm->spread_refused - refused, any = 0;
    MP_NCCL(ncclAllReduce(&r, &any, 1, ncclUint64, ncclSum, comm, NULL));
    chances += any == 0;
  }
  /* Another task in every attempt: nothing was judged, main reports a skip. */
  if (want && total == 0 && chances == 0 && rank == 0) mp_arrive(SPREAD_UNJUDGED);
  MP_CHECK(want ? total > 0 || chances == 0 : total == 0, "rank %d: %llu move(s) in %d attempts (%llu without "
           "other tasks) with COLLIE_SPREAD=%d", rank, (unsigned long long)total, attempts,
           (unsigned long long)chances, want);
  MP_CHECK(sched_getaffinity(0, sizeof(now), &now) == 0 && CPU_EQUAL(&now, &two), "rank %d: mask changed", rank);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Socket receivers turn the kernel's per-segment acknowledgements off
 * (COLLIE_SOCKET_DELAYED_ACK, default 1) and on again after the kernel
 * dropped the mode. The kernel leaves it by itself when a delayed
 * acknowledgement times out (tens of ms without data), so a rank descheduled
 * that long between its last call and the check may see it off once: the
 * check retries after a pause, which makes the next call turn it on again.
 * Turned off, collie must never have asked for the mode (the kernel may still
 * enter it on its own, so its answer proves nothing there). */
static int rank_delack(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("ackhost", rank);
  const char* e = getenv("COLLIE_SOCKET_DELAYED_ACK");
  int want = !e || strcmp(e, "0") != 0;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks && nranks <= 64, "rank %d: %d hosts", rank, comm->nhosts);
  int state[64], armed[64];
  int ok = 0;
  for (int tries = 0; tries < 40 && !ok; tries++) {
    if (tries) usleep(25 * 1000); /* past the 20 ms re-arm limit */
    for (int k = 0; k < 50; k++) {
      int v = rank + k;
      MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
      MP_CHECK(v == nranks * k + nranks * (nranks - 1) / 2, "rank %d: allreduce %d gave %d", rank, k, v);
    }
    ok = 1;
    for (int p = 0; p < nranks; p++) {
      if (p == rank) continue;
      state[p] = sock_delayed_ack_on(comm->recv_conns[p], &armed[p]);
      MP_CHECK(state[p] >= 0, "rank %d: no socket receiver from rank %d (or the kernel does not say)", rank, p);
      if (want ? state[p] != 1 || armed[p] == 0 : armed[p] != 0) ok = 0;
    }
    if (!want) break; /* nothing to wait for */
    /* Another round only if some rank needs one, and then on every rank: a
     * rank that stopped alone left the others waiting in its allreduces. */
    MP_NCCL(ncclAllReduce(&ok, &ok, 1, ncclInt32, ncclMin, comm, NULL));
  }
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    MP_CHECK(want ? armed[p] > 0 : armed[p] == 0, "rank %d: asked for delayed acknowledgements from rank %d on %d "
             "connections, want %s", rank, p, armed[p], want ? "all" : "none");
    MP_CHECK(!want || state[p] == 1, "rank %d: the kernel has delayed acknowledgements from rank %d off", rank, p);
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Reads held back by rank's socket receivers from peer p, over every channel. */
/* Reads held back by this rank's socket receivers from peer p, over every
 * channel; -1 when no channel has a socket receiver from p. */
static int64_t lag_holds(ncclComm_t comm, int p) {
  int64_t sum = -1;
  for (int ch = 0; ch < MAX_CHANNELS; ch++) {
    int64_t h = sock_lag_holds(comm->recv_conns[(size_t)ch * (size_t)comm->nranks + (size_t)p]);
    if (h >= 0) sum = (sum < 0 ? 0 : sum) + h;
  }
  return sum;
}

/* A socket receiver of a one-way stream of small slots reads it in batches
 * (COLLIE_SOCKET_LAG_NS): the receivers of broadcast and reduce streams
 * whose slot sizes cross every case of the stage (a few bytes, slots that
 * fill it, payloads read past it) must get every value right, and must have
 * held reads back when the lag is on and the ranks run on CPUs of their own
 * (pinned here; a sender on the receiver's CPU turns the lag off), never when
 * it is 0. During allreduces, where each rank sends between its reads, no
 * read is held back. */
static int rank_lag(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("laghost", rank);
  const char* e = getenv("COLLIE_SOCKET_LAG_NS");
  int on = !e || atoll(e) > 0;
  cpu_set_t mask;
  int pinned = 0;
  if (nranks == 2 && sched_getaffinity(0, sizeof(mask), &mask) == 0 && CPU_COUNT(&mask) >= 2) {
    int seen = 0;
    for (int c = 0; c < CPU_SETSIZE && !pinned; c++)
      if (CPU_ISSET(c, &mask) && seen++ == rank) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        pinned = sched_setaffinity(0, sizeof(one), &one) == 0;
      }
  }
  MP_CHECK(pinned, "rank %d: could not pin itself to a CPU of its own", rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks && nranks == 2, "rank %d: %d hosts of %d ranks (the test wants 2)", rank,
           comm->nhosts, nranks);
  static const size_t counts[] = {1, 3, 17, 100, 600, 2500, 4000, 16384};
  const int ncounts = (int)(sizeof(counts) / sizeof(counts[0]));
  float* buf = malloc(16384 * sizeof(float));
  float* out = malloc(16384 * sizeof(float));
  MP_CHECK(buf && out, "out of memory");
  int peer = 1 - rank;
  for (int it = 0; it < 1500; it++) {
    /* The largest count (64 KiB, read past the stage) only now and then. */
    size_t n = counts[it % 20 == 19 ? ncounts - 1 : it % (ncounts - 1)];
    for (size_t i = 0; i < n; i++) buf[i] = rank == 0 ? val(it, 0, 1, i) : -1.0f;
    MP_NCCL(ncclBroadcast(buf, buf, n, ncclFloat32, 0, comm, NULL));
    for (size_t i = 0; i < n; i++)
      MP_CHECK(buf[i] == val(it, 0, 1, i), "rank %d: broadcast %d (%zu floats), element %zu is %g, want %g", rank,
               it, n, i, (double)buf[i], (double)val(it, 0, 1, i));
  }
  for (int it = 0; it < 1500; it++) {
    size_t n = counts[it % 20 == 19 ? ncounts - 1 : it % (ncounts - 1)];
    for (size_t i = 0; i < n; i++) buf[i] = val(it, rank, 0, i);
    MP_NCCL(ncclReduce(buf, out, n, ncclFloat32, ncclSum, 0, comm, NULL));
    for (size_t i = 0; rank == 0 && i < n; i++) {
      float want = val(it, 0, 0, i) + val(it, 1, 0, i);
      MP_CHECK(out[i] == want, "rank 0: reduce %d (%zu floats), element %zu is %g, want %g", it, n, i,
               (double)out[i], (double)want);
    }
  }
  /* The same, small and paced: the sender waits 20 us before each call, so
   * a receiver that has its CPU keeps up and its reads are small ones, which
   * the lag follows (a receiver that is behind, its reads filling the stage,
   * rightly never waits: beside a busy process the unpaced streams above
   * gave a reduce root none in 2 of 6 runs). */
  for (int phase = 0; phase < 2; phase++)
    for (int it = 0; it < 600; it++) {
      size_t n = counts[it % 4];
      int sender = phase == 0 ? 0 : 1;
      if (rank == sender) {
        double until = mp_now() + 20e-6;
        while (mp_now() < until) {
        }
      }
      for (size_t i = 0; i < n; i++) buf[i] = phase == 0 ? (rank == 0 ? val(it, 0, 1, i) : -1.0f) : val(it, rank, 0, i);
      if (phase == 0) {
        MP_NCCL(ncclBroadcast(buf, buf, n, ncclFloat32, 0, comm, NULL));
        for (size_t i = 0; i < n; i++)
          MP_CHECK(buf[i] == val(it, 0, 1, i), "rank %d: paced broadcast %d, element %zu is %g", rank, it, i,
                   (double)buf[i]);
      } else {
        MP_NCCL(ncclReduce(buf, out, n, ncclFloat32, ncclSum, 0, comm, NULL));
        for (size_t i = 0; rank == 0 && i < n; i++)
          MP_CHECK(out[i] == val(it, 0, 0, i) + val(it, 1, 0, i), "rank 0: paced reduce %d, element %zu is %g", it, i,
                   (double)out[i]);
      }
    }
  /* Rank 1 received the broadcasts, rank 0 the reduces. */
  int64_t streamed = lag_holds(comm, peer);
  MP_CHECK(streamed >= 0, "rank %d: no socket receiver from rank %d", rank, peer);
  if (!on) MP_CHECK(streamed == 0, "rank %d: held %lld reads back with COLLIE_SOCKET_LAG_NS=0", rank, (long long)streamed);
  else MP_CHECK(streamed > 0, "rank %d: received a one-way stream of 1500 small slots on its own CPU and "
                            "never held a read back", rank);
  int v = 1;
  MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL)); /* each rank has sent since the streams */
  MP_CHECK(v == 2, "rank %d: allreduce gave %d", rank, v);
  int64_t before = lag_holds(comm, peer);
  for (int it = 0; it < 1500; it++) {
    size_t n = counts[it % 4];
    for (size_t i = 0; i < n; i++) buf[i] = val(it, rank, 0, i);
    MP_NCCL(ncclAllReduce(buf, out, n, ncclFloat32, ncclSum, comm, NULL));
    for (size_t i = 0; i < n; i++) {
      float want = val(it, 0, 0, i) + val(it, 1, 0, i);
      MP_CHECK(out[i] == want, "rank %d: allreduce %d (%zu floats), element %zu is %g, want %g", rank, it, n, i,
               (double)out[i], (double)want);
    }
  }
  int64_t after = lag_holds(comm, peer);
  MP_CHECK(after == before, "rank %d: held %lld reads back during 1500 allreduces (an exchange never waits)", rank,
           (long long)(after - before));
  free(buf);
  free(out);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* A socket receiver leaves a large payload that comes before its consumer
 * posted a buffer for it in the kernel (COLLIE_SOCKET_HOLD): rank 1 sends
 * rank 0 two messages back to back while rank 0 receives the first one in a
 * group whose other receive (from rank 2, which sends 20 ms late) keeps it
 * waiting, so the second one's header and payload are there while rank 0
 * progresses its connector from rank 1 and has not posted for it. Held, no
 * payload of 16 KiB or more may ever go through rank 0's slot buffer; read
 * at once (0), the second messages of 20 such rounds must have gone through
 * it at least once. Every value is checked either way, at sizes below and
 * above the stage (4 KB, 64 KiB, 1 MiB: several slots). */
static int rank_hold(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("holdhost", rank);
  const char* e = getenv("COLLIE_SOCKET_HOLD");
  int hold = !e || atoi(e) != 0;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks && nranks == 3, "rank %d: %d hosts of %d ranks (the test wants 3)", rank,
           comm->nhosts, nranks);
  static const size_t counts[] = {1000, 16384, 262144};
  const size_t maxn = 262144;
  float* a = malloc(maxn * sizeof(float));
  float* b = malloc(maxn * sizeof(float));
  float* c = malloc(maxn * sizeof(float));
  MP_CHECK(a && b && c, "out of memory");
  const int rounds = 21; /* the first connects every connector on the way */
  for (int it = 0; it < rounds; it++) {
    size_t n = counts[it % 3];
    if (rank == 1) {
      for (size_t i = 0; i < n; i++) {
        a[i] = val(it, 1, 0, i);
        b[i] = val(it + 1000, 1, 0, i);
      }
      MP_NCCL(ncclSend(a, n, ncclFloat32, 0, comm, NULL));
      MP_NCCL(ncclSend(b, n, ncclFloat32, 0, comm, NULL));
    } else if (rank == 2) {
      for (size_t i = 0; i < n; i++) c[i] = val(it, 2, 0, i);
      if (it > 0) usleep(20000);
      MP_NCCL(ncclSend(c, n, ncclFloat32, 0, comm, NULL));
    } else {
      for (size_t i = 0; i < n; i++) a[i] = b[i] = c[i] = -1.0f;
      MP_NCCL(ncclGroupStart());
      MP_NCCL(ncclRecv(a, n, ncclFloat32, 1, comm, NULL));
      MP_NCCL(ncclRecv(c, n, ncclFloat32, 2, comm, NULL));
      MP_NCCL(ncclGroupEnd());
      MP_NCCL(ncclRecv(b, n, ncclFloat32, 1, comm, NULL));
      for (size_t i = 0; i < n; i++) {
        MP_CHECK(a[i] == val(it, 1, 0, i), "rank 0: round %d (%zu floats): first message from rank 1, element %zu is "
                 "%g, want %g", it, n, i, (double)a[i], (double)val(it, 1, 0, i));
        MP_CHECK(b[i] == val(it + 1000, 1, 0, i), "rank 0: round %d (%zu floats): second message from rank 1, element "
                 "%zu is %g, want %g", it, n, i, (double)b[i], (double)val(it + 1000, 1, 0, i));
        MP_CHECK(c[i] == val(it, 2, 0, i), "rank 0: round %d (%zu floats): message from rank 2, element %zu is %g, "
                 "want %g", it, n, i, (double)c[i], (double)val(it, 2, 0, i));
      }
    }
  }
  if (rank == 0) {
    int64_t staged = sock_staged_large(comm->recv_conns[1]);
    MP_CHECK(staged >= 0, "rank 0: its receiver from rank 1 is no socket connector");
    if (hold) MP_CHECK(staged == 0, "rank 0: %lld payloads of 16 KiB or more went through the slot buffer with "
                       "COLLIE_SOCKET_HOLD on", (long long)staged);
    else MP_CHECK(staged > 0, "rank 0: with COLLIE_SOCKET_HOLD=0, none of %d messages that came while it waited for "
                  "another peer went through the slot buffer", rounds - 1);
  }
  int v = 1; /* every rank is done with the rounds before any leaves */
  MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  MP_CHECK(v == nranks, "rank %d: allreduce gave %d", rank, v);
  free(a);
  free(b);
  free(c);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Hosts of several ranks sharing one machine (NCCL_HOSTID) whose ranks
 * outnumber its CPUs: every rank pinned to the same 2 CPUs, 2 hosts of
 * nranks / 2 (at 4 ranks each host alone has a CPU per rank, so the host's
 * own count does not decide it). Waiters must not poll shared memory
 * (COLLIE_SPIN's default 0 there): a rank polling holds the CPU a rank of
 * the other host needs. */
static int rank_spin(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "spinhost%d", rank % 2);
  setenv("NCCL_HOSTID", h, 1);
  const char* e = getenv("COLLIE_SPIN");
  cpu_set_t mask, two;
  MP_CHECK(sched_getaffinity(0, sizeof(mask), &mask) == 0, "rank %d: no affinity mask", rank);
  CPU_ZERO(&two);
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &mask)) {
      CPU_SET(c, &two);
      k++;
    }
  MP_CHECK(sched_setaffinity(0, sizeof(two), &two) == 0, "rank %d: could not pin itself", rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == 2 && comm->local_size == nranks / 2 && comm->machine_size == nranks,
           "rank %d: %d hosts, %d ranks on this host, %d on the machine; want 2, %d, %d", rank, comm->nhosts,
           comm->local_size, comm->machine_size, nranks / 2, nranks);
  MP_CHECK(comm->machine_cpus == 2, "rank %d: every rank on the same 2 CPUs, yet the machine counts %d", rank,
           comm->machine_cpus);
  int64_t want = e ? atoll(e) * 1000 : 0;
  MP_CHECK(comm->spin_ns == want, "rank %d: %d ranks of 2 hosts on 2 CPUs, COLLIE_SPIN=%s: waiters poll %lld ns, "
           "want %lld", rank, nranks, e ? e : "(unset)", (long long)comm->spin_ns, (long long)want);
  /* The ring crosses shared memory and sockets: results still right. */
  size_t count = (size_t)1 << 18;
  float* buf = malloc(count * sizeof(float));
  MP_CHECK(buf, "out of memory");
  for (int k = 0; k < 4; k++) {
    for (size_t i = 0; i < count; i++) buf[i] = (float)(rank + k + (int)(i % 7));
    MP_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
    for (size_t i = 0; i < count; i += 4099) {
      float want_v = (float)(nranks * (k + (int)(i % 7)) + nranks * (nranks - 1) / 2);
      MP_CHECK(buf[i] == want_v, "rank %d: allreduce %d [%zu] = %g, want %g", rank, k, i, buf[i], want_v);
    }
  }
  free(buf);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Socket waiters on a machine with more ranks than CPUs yield between
 * rounds (COLLIE_SOCKET_YIELD_US): with every rank pinned to one CPU each
 * waits for peers that cannot run until it gives the CPU up, so every
 * collective (all of them, 1 float to 64 Ki, values checked) must have made
 * waiters yield when the variable is unset, and none may have when it is 0. */
static int rank_yield(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("yieldhost", rank);
  const char* e = getenv("COLLIE_SOCKET_YIELD_US");
  int on = !e || atoll(e) > 0;
  cpu_set_t mask, one;
  MP_CHECK(sched_getaffinity(0, sizeof(mask), &mask) == 0, "rank %d: no affinity mask", rank);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &mask)) {
      CPU_SET(c, &one);
      break;
    }
  MP_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "rank %d: could not pin itself", rank);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks, "rank %d: %d hosts of %d ranks", rank, comm->nhosts, nranks);
  MP_CHECK((comm->sock_yield_ns > 0) == on, "rank %d: %d ranks on one CPU, COLLIE_SOCKET_YIELD_US=%s, yet socket "
           "waiters %s", rank, nranks, e ? e : "(unset)", on ? "do not yield" : "yield");
  /* Every rank a host on one CPU: the small one-way collectives never go by
   * the one-shot, whose root handles every message: broadcasts by the ring's
   * chain, reduces by the binomial tree (log2(n) messages at the root). */
  MP_CHECK(comm->sock_oversub >= nranks - 0.01, "rank %d: %d ranks, a host each, on one CPU, yet the tuner counts "
           "%.2f ranks per CPU", rank, nranks, comm->sock_oversub);
  for (int kind = 0; kind < 2; kind++)
    for (size_t bytes = 4; bytes <= 4096; bytes *= 4) {
      struct coll_args q = {.comm = comm, .kind = kind ? COLL_REDUCE : COLL_BROADCAST, .count = bytes / 4,
                            .dt = ncclFloat};
      struct plan p;
      MP_CHECK(tuning_plan(&q, &p) == ncclSuccess, "rank %d: no plan", rank);
      int want = kind ? ALGO_TREE : ALGO_RING;
      MP_CHECK(p.algo->name == want, "rank %d: %s of %zu bytes by %s, not the %s", rank, kind ? "reduce" : "broadcast",
               bytes, algo_name(p.algo->name), kind ? "binomial tree" : "ring's chain");
    }
  static const size_t counts[] = {1, 5, 64, 700, 4096, 65536};
  const size_t most = 65536;
  float* in = malloc(most * (size_t)nranks * sizeof(float));
  float* out = malloc(most * (size_t)nranks * sizeof(float));
  MP_CHECK(in && out, "out of memory");
  for (int it = 0; it < 6 * 6; it++) {
    size_t n = counts[it % 6];
    int kind = it / 6, root = it % nranks;
    for (size_t i = 0; i < n * (size_t)nranks; i++) in[i] = val(it, rank, (int)(i / n), i % n);
    const char* name = "";
    switch (kind) {
      case 0: name = "allreduce";
        MP_NCCL(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, NULL));
        break;
      case 1: name = "allgather";
        MP_NCCL(ncclAllGather(in, out, n, ncclFloat32, comm, NULL));
        break;
      case 2: name = "broadcast";
        MP_NCCL(ncclBroadcast(in, out, n, ncclFloat32, root, comm, NULL));
        break;
      case 3: name = "reduce";
        MP_NCCL(ncclReduce(in, out, n, ncclFloat32, ncclSum, root, comm, NULL));
        break;
      case 4: name = "reducescatter";
        MP_NCCL(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm, NULL));
        break;
      default: name = "alltoall";
        MP_NCCL(ncclAlltoAll(in, out, n, ncclFloat32, comm, NULL));
        break;
    }
    size_t blocks = kind == 1 || kind == 5 ? (size_t)nranks : 1;
    if (kind == 3 && rank != root) continue;
    for (size_t b = 0; b < blocks; b++)
      for (size_t i = 0; i < n; i++) {
        float want = 0;
        switch (kind) {
          case 0:
          case 3:
            for (int p = 0; p < nranks; p++) want += val(it, p, 0, i);
            break;
          case 1: want = val(it, (int)b, 0, i); break;
          case 2: want = val(it, root, 0, i); break;
          case 4:
            for (int p = 0; p < nranks; p++) want += val(it, p, rank, i);
            break;
          default: want = val(it, (int)b, rank, i); break;
        }
        MP_CHECK(out[b * n + i] == want, "rank %d: %s of %zu floats, block %zu element %zu is %g, want %g", rank, name,
                 n, b, i, (double)out[b * n + i], (double)want);
      }
  }
  int64_t yields = __atomic_load_n(&comm->sock_yields, __ATOMIC_RELAXED);
  if (on) MP_CHECK(yields > 0, "rank %d: %d ranks on one CPU over sockets, and no waiter ever yielded", rank, nranks);
  else MP_CHECK(yields == 0, "rank %d: waiters yielded %lld times with COLLIE_SOCKET_YIELD_US=0", rank, (long long)yields);
  free(in);
  free(out);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* The kernel's default congestion control, or "" when it does not say. */
static void system_cc(char* buf, size_t len) {
  buf[0] = 0;
  FILE* f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
  if (!f) return;
  if (fgets(buf, (int)len, f)) buf[strcspn(buf, "\n")] = 0;
  fclose(f);
}

static int rank_localcc(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("cchost", rank);
  const char* e = getenv("COLLIE_SOCKET_LOCAL_CC");
  char sys[64];
  system_cc(sys, sizeof(sys));
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks, "rank %d: %d hosts", rank, comm->nhosts);
  /* Small ones connect every pair (the one-shot row), large ones take the ring. */
  for (int k = 0; k < 20; k++) {
    int v = rank + k;
    MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
    MP_CHECK(v == nranks * k + nranks * (nranks - 1) / 2, "rank %d: allreduce %d gave %d", rank, k, v);
  }
  float* buf = malloc((1u << 20) * sizeof(float));
  MP_CHECK(buf != NULL, "out of memory");
  for (int k = 0; k < 4; k++) {
    for (int i = 0; i < 1 << 20; i++) buf[i] = (float)(rank + k);
    MP_NCCL(ncclAllReduce(buf, buf, 1u << 20, ncclFloat, ncclSum, comm, NULL));
    float want = (float)(nranks * k + nranks * (nranks - 1) / 2);
    MP_CHECK(buf[0] == want && buf[(1 << 20) - 1] == want, "rank %d: allreduce %d gave %g, want %g", rank, k, buf[0],
             want);
  }
  free(buf);
  /* Then 1 MiB to every peer and from it: each sending connection's last
   * slots are large. */
  size_t big = (size_t)1 << 18;
  float* out = malloc(big * sizeof(float));
  float* in = malloc(big * sizeof(float) * (size_t)nranks);
  MP_CHECK(out && in, "out of memory");
  for (size_t i = 0; i < big; i++) out[i] = (float)rank;
  MP_NCCL(ncclGroupStart());
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    MP_NCCL(ncclSend(out, big, ncclFloat, p, comm, NULL));
    MP_NCCL(ncclRecv(in + (size_t)p * big, big, ncclFloat, p, comm, NULL));
  }
  MP_NCCL(ncclGroupEnd());
  for (int p = 0; p < nranks; p++)
    if (p != rank)
      MP_CHECK(in[(size_t)p * big] == (float)p && in[(size_t)p * big + big - 1] == (float)p,
               "rank %d: from rank %d got %g", rank, p, in[(size_t)p * big]);
  free(out);
  free(in);
  int is_auto = !e || strcmp(e, "auto") == 0;
  /* auto switches small slots to bbr only where the machine's ranks outnumber its CPUs. */
  int crowded = comm->machine_size > comm->machine_cpus;
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    char cc[64], rcc[64];
    MP_CHECK(sock_congestion(comm->send_conns[p], cc, sizeof(cc)) == 0,
             "rank %d: no socket sender to rank %d (or its connections differ)", rank, p);
    /* What the receiver accepted has what its listener was given. */
    MP_CHECK(sock_congestion(comm->recv_conns[p], rcc, sizeof(rcc)) == 0,
             "rank %d: no socket receiver from rank %d (or its connections differ)", rank, p);
    if (e && strcmp(e, "system") == 0) {
      MP_CHECK(sys[0], "rank %d: the kernel's default congestion control is unreadable", rank);
      MP_CHECK(strcmp(cc, sys) == 0, "rank %d: to rank %d: %s, want the kernel's %s", rank, p, cc, sys);
    } else if (!is_auto) {
      MP_CHECK(strcmp(cc, e) == 0, "rank %d: to rank %d: %s, want %s", rank, p, cc, e);
    } else {
      /* The last slots on the sending connection were large (1 MiB sends). */
      MP_CHECK(strcmp(cc, "cubic") == 0 || strcmp(cc, "reno") == 0, "rank %d: to rank %d: %s, want cubic or reno", rank,
               p, cc);
    }
    /* Where nothing switches both ends match; in auto on a crowded machine the
     * receiving connection's end may have carried this rank's small slots
     * (duplex) and be on bbr. */
    if (!is_auto || !crowded) MP_CHECK(strcmp(cc, rcc) == 0, "rank %d: to rank %d %s, from it %s", rank, p, cc, rcc);
    else
      MP_CHECK(strcmp(rcc, cc) == 0 || strcmp(rcc, "bbr") == 0, "rank %d: from rank %d: %s, want %s or bbr", rank, p,
               rcc, cc);
    if (rank == 0 && p == 1) printf("rank 0 to rank 1: %s (kernel default %s)\n", cc, sys[0] ? sys : "?");
  }
  /* auto: small slots again, and each pair's small slots (on the sending
   * connection, or for the higher rank on the shared one) go with bbr where
   * this process may use it. */
  if (is_auto) {
    int bbr_ok = 0;
    int t = socket(AF_INET, SOCK_STREAM, 0);
    if (t >= 0) {
      bbr_ok = setsockopt(t, IPPROTO_TCP, TCP_CONGESTION, "bbr", 3) == 0;
      close(t);
    }
    for (int k = 0; k < 20; k++) {
      int v = rank + k;
      MP_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
      MP_CHECK(v == nranks * k + nranks * (nranks - 1) / 2, "rank %d: allreduce %d gave %d", rank, k, v);
    }
    for (int p = 0; p < nranks; p++) {
      if (p == rank) continue;
      char cc[64], rcc[64];
      MP_CHECK(sock_congestion(comm->send_conns[p], cc, sizeof(cc)) == 0 &&
                   sock_congestion(comm->recv_conns[p], rcc, sizeof(rcc)) == 0,
               "rank %d: no socket connectors with rank %d", rank, p);
      int small = strcmp(cc, "bbr") == 0 || strcmp(rcc, "bbr") == 0;
      MP_CHECK(small == (bbr_ok && crowded),
               "rank %d: small slots to rank %d went with %s / %s (bbr %s to this process; %d ranks, %d CPUs)", rank, p,
               cc, rcc, bbr_ok ? "allowed" : "refused", comm->machine_size, comm->machine_cpus);
    }
    if (rank == 0)
      printf("small slots: bbr %s, %d ranks on %d CPUs: %s\n", bbr_ok ? "allowed" : "refused", comm->machine_size,
             comm->machine_cpus, bbr_ok && crowded ? "used" : "not used");
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* Messages of a duplex group: small ones (shared connection) alternate with
 * ones past COLLIE_SOCKET_DUPLEX's default (the sender's own). */
#define DX_MSGS 7
static size_t dx_count(int k) { return k % 2 ? 300 : 1 + (size_t)k; }

/* One group: every peer's DX_MSGS messages, block p of sb sent to and
 * block p of rb received from peer p (either buffer NULL: that side not). */
static ncclResult_t dx_post(ncclComm_t comm, int rank, int nranks, float* sb, float* rb, size_t per) {
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < nranks && r == ncclSuccess; p++) {
    size_t off = (size_t)p * per;
    for (int k = 0; k < DX_MSGS && p != rank && r == ncclSuccess; k++) {
      if (sb) r = ncclSend(sb + off, dx_count(k), ncclFloat, p, comm, NULL);
      if (rb && r == ncclSuccess) r = ncclRecv(rb + off, dx_count(k), ncclFloat, p, comm, NULL);
      off += dx_count(k);
    }
  }
  ncclResult_t e = ncclGroupEnd();
  return r != ncclSuccess ? r : e;
}

static int rank_duplex(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("dxhost", rank);
  const char* e = getenv("COLLIE_SOCKET_DUPLEX");
  const char* ns = getenv("NCCL_NSOCKS_PERTHREAD");
  int want = (!e || atoi(e) > 0) && (!ns || atoi(ns) == 1);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks && nranks <= 8, "rank %d: %d hosts", rank, comm->nhosts);
  size_t per = 0;
  for (int k = 0; k < DX_MSGS; k++) per += dx_count(k);
  float* sb = malloc(per * (size_t)nranks * sizeof(float));
  float* rb = malloc(per * (size_t)nranks * sizeof(float));
  MP_CHECK(sb && rb, "out of memory");
  for (int it = 0; it < 6; it++) {
    for (int p = 0; p < nranks; p++)
      for (size_t i = 0; i < per; i++) sb[(size_t)p * per + i] = val(it, rank, p, i);
    memset(rb, 0, per * (size_t)nranks * sizeof(float));
    /* Odd rounds: the senders write everything before anyone reads, so a
     * receiver's first read on a connection brings markers and the slots past
     * them at once. */
    if (it % 2) {
      MP_NCCL(dx_post(comm, rank, nranks, sb, NULL, per));
      usleep(50 * 1000);
      MP_NCCL(dx_post(comm, rank, nranks, NULL, rb, per));
    } else {
      MP_NCCL(dx_post(comm, rank, nranks, sb, rb, per));
    }
    for (int p = 0; p < nranks; p++)
      for (size_t i = 0; i < per && p != rank; i++)
        MP_CHECK(rb[(size_t)p * per + i] == val(it, p, rank, i), "rank %d round %d: element %zu from rank %d is %g, "
                 "want %g", rank, it, i, p, rb[(size_t)p * per + i], val(it, p, rank, i));
    /* Collectives on the same connections: one-shot (small) and ring (large). */
    for (size_t count = 1; count <= per * (size_t)nranks; count *= 37) {
      for (size_t i = 0; i < count; i++) rb[i] = (float)(rank + (int)(i % 3));
      MP_NCCL(ncclAllReduce(rb, rb, count, ncclFloat, ncclSum, comm, NULL));
      for (size_t i = 0; i < count; i++) {
        float w = (float)(nranks * (nranks - 1) / 2 + nranks * (int)(i % 3));
        MP_CHECK(rb[i] == w, "rank %d: allreduce of %zu, element %zu is %g, want %g", rank, count, i, rb[i], w);
      }
    }
  }
  free(sb);
  free(rb);
  /* The higher rank of each pair sends on the shared connection (the lower
   * rank's) and the lower rank receives there; a lower rank's sender never
   * leaves its own. */
  for (int p = 0; p < nranks; p++) {
    if (p == rank) continue;
    int s = sock_duplex(comm->send_conns[p]), r = sock_duplex(comm->recv_conns[p]);
    MP_CHECK(s >= 0 && r >= 0, "rank %d: no socket connectors with rank %d", rank, p);
    if (rank > p) {
      MP_CHECK(s == want, "rank %d: its sender to rank %d %s the shared connection", rank, p, s ? "used" : "never used");
      MP_CHECK(r == 0, "rank %d: its receiver from rank %d left its own connection", rank, p);
    } else {
      MP_CHECK(r == want, "rank %d: its receiver from rank %d %s the shared connection", rank, p,
               r ? "used" : "never used");
      MP_CHECK(s == 0, "rank %d: its sender to rank %d left its own connection", rank, p);
    }
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* adapt N: large collectives on one host whose ranks have a CPU each are
 * weighed by measurement (coll/adapt.c): broadcasts, allgathers and
 * alltoalls between the tuner's row and single copy where single copy works
 * (COLLIE_CMA_ADAPT), else between plain and non-temporal stores into the
 * slots where their row fills slots; allreduces, reduces and reduce-scatters
 * between plain and non-temporal slot stores (COLLIE_SLOT_STREAM=auto). Every
 * such call counts in its bucket alike on every rank, both paths get
 * measured, every result is right whichever runs, and where single copy is
 * weighed the ranks end on the same choice (the slots' stores are each
 * writer's own: it reads the others' latest figures without waiting for
 * them, so the ranks may end on different stores). From 32 KiB to 256 KiB a
 * rank only the slots' stores are weighed, one pick for a window of
 * ADAPT_WINDOW calls: 40 calls make 3 picks (the tuner's row, the
 * alternative, the tuner's row: both measured, on every rank alike). With ranks sharing CPUs, or with both switched off, nothing is
 * weighed. Held (COLLIE_ADAPT_LOAD=1), the tuner's row runs in windows of
 * ADAPT_WINDOW calls at every size once both paths were tried. */
/* direct_shm_rates under key 0, one rank at a time (a barrier after each):
 * no read meets a post being written. */
static ncclResult_t rates_in_turn(ncclComm_t comm, int rank, int nranks, const float mine[4], float* all) {
  int32_t one = 1, sum = 0;
  for (int turn = 0; turn < nranks; turn++) {
    if (turn == rank) NCCLCHECK(direct_shm_rates(comm, 0, mine, all));
    NCCLCHECK(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, NULL));
  }
  return ncclSuccess;
}

static int rank_adapt(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  const char* env = getenv("COLLIE_CMA_ADAPT");
  int spread = comm->oversub <= 1.0;
  int on = comm->cma && spread && !(env && strcmp(env, "0") == 0);
  int slots = spread && comm->slot_stream < 0;
  /* COLLIE_ADAPT_LOAD: the suite pins it (0 or 1): with auto, tests that
   * run beside others would see the ranks wait for CPUs and hold. */
  int held = comm->adapt_load == 1;
  /* The suite's 2-rank case must weigh: single copy works on the test
   * machines (coll.cma_* need it) and 2 ranks have a CPU each there. */
  if (getenv("COLLIE_TEST_ADAPT_ON"))
    MP_CHECK(on && slots, "rank %d: not weighed (single copy %s, slot stores %d, %.1f ranks a CPU)", rank,
             comm->cma ? "works" : "off", comm->slot_stream, comm->oversub);
  enum { ITERS = 40 };
  size_t sizes[] = {(size_t)128 << 10, (size_t)256 << 10, ((size_t)1 << 20) + 12};
  int buckets[] = {17, 18, 20};
  for (int si = 0; si < 3; si++) {
    size_t per = sizes[si] / sizeof(float);
    float* sb = malloc(per * sizeof(float));
    float* rb = malloc(per * (size_t)nranks * sizeof(float));
    MP_CHECK(sb && rb, "out of memory");
    for (int it = 0; it < ITERS; it++) {
      for (size_t i = 0; i < per; i++) sb[i] = val(it, rank, 0, i);
      int root = it % nranks;
      memset(rb, 0, per * (size_t)nranks * sizeof(float));
      if (it % 2 == 0) {
        MP_NCCL(ncclBroadcast(sb, rb, per, ncclFloat, root, comm, NULL));
      } else {
        if (rank == root) memcpy(rb, sb, per * sizeof(float));
        MP_NCCL(ncclBroadcast(rb, rb, per, ncclFloat, root, comm, NULL));
      }
      for (size_t i = 0; i < per; i += 61)
        MP_CHECK(rb[i] == val(it, root, 0, i), "rank %d: broadcast %d of %zu bytes from rank %d, element %zu is %g",
                 rank, it, sizes[si], root, i, rb[i]);
      memset(rb, 0, per * (size_t)nranks * sizeof(float));
      MP_NCCL(ncclAllGather(sb, rb, per, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < per; i += 61)
          MP_CHECK(rb[(size_t)p * per + i] == val(it, p, 0, i), "rank %d: allgather %d of %zu bytes a rank, element "
                   "%zu from rank %d is %g", rank, it, sizes[si], i, p, rb[(size_t)p * per + i]);
      /* An alltoall sending sizes[si] bytes in all (in place every other call). */
      size_t c = per / (size_t)nranks;
      float* ab = it % 2 ? rb : sb;
      for (int q = 0; q < nranks; q++)
        for (size_t i = 0; i < c; i++) ab[(size_t)q * c + i] = val(it, rank, q + 1, i);
      if (it % 2 == 0) memset(rb, 0, c * (size_t)nranks * sizeof(float));
      MP_NCCL(ncclAlltoAll(ab, rb, c, ncclFloat, comm, NULL));
      for (int q = 0; q < nranks; q++)
        for (size_t i = 0; i < c; i += 61)
          MP_CHECK(rb[(size_t)q * c + i] == val(it, q, rank + 1, i), "rank %d: alltoall %d of %zu bytes a rank%s, "
                   "element %zu from rank %d is %g", rank, it, c * sizeof(float) * (size_t)nranks,
                   it % 2 ? " in place" : "", i, q, rb[(size_t)q * c + i]);
      /* An allreduce (in place every other call), a reduce to a rotating
       * root and a reduce-scatter of the whole buffer: sums of small
       * integers, exact in float. */
      for (size_t i = 0; i < per; i++) sb[i] = val(it, rank, 0, i);
      float* in = it % 2 ? rb : sb;
      if (it % 2) memcpy(rb, sb, per * sizeof(float));
      MP_NCCL(ncclAllReduce(in, rb, per, ncclFloat, ncclSum, comm, NULL));
      for (size_t i = 0; i < per; i += 61) {
        float want = 0;
        for (int q = 0; q < nranks; q++) want += val(it, q, 0, i);
        MP_CHECK(rb[i] == want, "rank %d: allreduce %d of %zu bytes%s, element %zu is %g, want %g", rank, it,
                 sizes[si], it % 2 ? " in place" : "", i, rb[i], want);
      }
      memset(rb, 0, per * sizeof(float));
      MP_NCCL(ncclReduce(sb, rb, per, ncclFloat, ncclSum, root, comm, NULL));
      if (rank == root)
        for (size_t i = 0; i < per; i += 61) {
          float want = 0;
          for (int q = 0; q < nranks; q++) want += val(it, q, 0, i);
          MP_CHECK(rb[i] == want, "rank %d: reduce %d of %zu bytes, element %zu is %g, want %g", rank, it, sizes[si],
                   i, rb[i], want);
        }
      memset(rb, 0, c * sizeof(float));
      MP_NCCL(ncclReduceScatter(sb, rb, c, ncclFloat, ncclSum, comm, NULL));
      for (size_t i = 0; i < c; i += 61) {
        float want = 0;
        for (int q = 0; q < nranks; q++) want += val(it, q, 0, (size_t)rank * c + i);
        MP_CHECK(rb[i] == want, "rank %d: reduce-scatter %d of %zu bytes, element %zu is %g, want %g", rank, it,
                 sizes[si], i, rb[i], want);
      }
    }
    free(sb);
    free(rb);
    static const char* const kinds[] = {"broadcast", "allgather", "alltoall", "allreduce", "reduce", "reduce-scatter"};
    static const int kind_of[] = {COLL_BROADCAST, COLL_ALLGATHER, COLL_ALLTOALL, COLL_ALLREDUCE, COLL_REDUCE,
                                  COLL_REDUCESCATTER};
    for (int k = 0; k < ADAPT_KINDS; k++) {
      const struct adapt_bucket* b = &comm->adapt[k][buckets[si]];
      /* The row the tuner picks for these calls: a single-copy row is not
       * weighed, and the one-shot's mailboxes are no slots. */
      size_t count = kind_of[k] == COLL_ALLTOALL || kind_of[k] == COLL_REDUCESCATTER ? per / (size_t)nranks : per;
      struct coll_args q = {.comm = comm, .kind = kind_of[k], .count = count, .dt = ncclFloat};
      struct plan p;
      MP_CHECK(tuning_plan(&q, &p) == ncclSuccess, "rank %d: no plan for the %s of %zu bytes", rank, kinds[k],
               sizes[si]);
      int row = p.algo->name;
      /* Broadcast, allgather and alltoall weigh single copy where it is
       * weighed (from 256 KiB), else (as the reductions always do) the
       * slots' stores. */
      int large = sizes[si] >= ((size_t)256 << 10);
      int weighed = row != ALGO_CMA && ((large && k < 3 && on) || (slots && row != ALGO_DIRECT));
      size_t wbytes = count * sizeof(float) * (kind_of[k] == COLL_ALLTOALL || kind_of[k] == COLL_REDUCESCATTER
                                                   ? (size_t)nranks : 1u);
      /* Single copy and both slot stores (adapt_pick3): four first trials;
       * a reduction that fits a core's cache weighs both slot stores and
       * plain ones with its reads ahead (COLLIE_READ_AHEAD=auto) alike. */
      int ahead = weighed && k >= 3 && slots && row != ALGO_DIRECT && comm->read_ahead_param < 0 &&
                  (double)wbytes <= comm->tune.near_bytes;
      int three = (weighed && large && k < 3 && on && slots && row != ALGO_DIRECT) || ahead;
      unsigned tries = three ? ADAPT_TRIES3 : ADAPT_TRIES;
      static const int first2[ADAPT_TRIES] = {0, 1, 0}, first3[ADAPT_TRIES3] = {0, 1, 2, 0};
      /* The picks, as every rank counts them: a window of ADAPT_WINDOW calls
       * below 256 KiB; from there one call for each of the first three picks
       * (four where three paths are weighed), then windows of about 8 MiB a
       * rank (256 KiB: 16 calls, 1 MiB: 7); held (COLLIE_ADAPT_LOAD=1: as if
       * a rank waited for a CPU), windows of ADAPT_WINDOW after the first
       * picks everywhere. At 128 KiB 40 = 2 x 16 + 8 calls: 3 picks, 8 calls
       * run and 8 left; at 256 KiB 3 + 3 picks (calls 3-18, 19-34, 35-39 with
       * 11 left; three paths: 4 + 3, 36-39 with 12 left); at 1 MiB 3 + 6
       * (the last window 2 of 7 calls run; three paths 4 + 6, 1 run). The alltoall and the
       * reduce-scatter are weighed by all a rank sends. */
      unsigned picks = 0, left = 0, nwin = 0;
      for (int it = 0; weighed && it < ITERS; it++) {
        if (left == 0) {
          left = held && picks >= tries ? ADAPT_WINDOW : adapt_window(wbytes, picks, tries);
          picks++;
          nwin = 0;
        }
        left--;
        nwin++;
      }
      MP_CHECK(b->calls == picks, "rank %d: %s of %zu bytes: %u picks, expected %u", rank, kinds[k], sizes[si],
               b->calls, picks);
      if (!weighed) continue;
      MP_CHECK(b->left == left && b->nwin == nwin,
               "rank %d: %s of %zu bytes: window with %u calls left and %u timed, expected %u and %u", rank, kinds[k],
               sizes[si], b->left, b->nwin, left, nwin);
      /* The path of the current window while the first picks try each; held
       * after them, the tuner's row (a reduction that may read ahead: plain
       * stores read ahead, path 2). */
      int trying = picks <= tries ? (three ? first3 : first2)[picks - 1] : -1, hold = ahead ? 2 : 0;
      MP_CHECK(!held || (trying >= 0 ? b->cur == trying && b->last == 0 : b->cur == hold && b->last == hold),
               "rank %d: %s of %zu bytes: held, but on path %d (last %d)", rank, kinds[k], sizes[si], b->cur, b->last);
      if (!large) {
        int64_t cur = b->cur, clo = cur, chi = cur;
        MP_NCCL(ncclAllReduce(&cur, &clo, 1, ncclInt64, ncclMin, comm, NULL));
        MP_NCCL(ncclAllReduce(&cur, &chi, 1, ncclInt64, ncclMax, comm, NULL));
        MP_CHECK(clo == chi && cur == trying, "rank %d: %s of %zu bytes: the ranks' windows on paths %lld-%lld (the "
                 "third pick tries path %d)", rank, kinds[k], sizes[si], (long long)clo, (long long)chi, trying);
      }
      /* Every path a finished window ran has its rate. */
      for (unsigned j = 0; j < (picks > tries ? tries : picks - 1); j++)
        MP_CHECK(b->rate[(three ? first3 : first2)[j]] > 0,
                 "rank %d: %s of %zu bytes: rates %g / %g / %g, path %d not measured", rank, kinds[k], sizes[si],
                 b->rate[0], b->rate[1], b->rate[2], (three ? first3 : first2)[j]);
      MP_CHECK(b->last >= 0 && b->last < (three ? 3 : 2), "rank %d: %s of %zu bytes: last path %d", rank, kinds[k],
               sizes[si], b->last);
      /* Single copy or not is agreed (the same on every rank: `on` is); the
       * slots' stores alone are each rank's own. */
      if (!(large && k < 3 && on)) continue;
      int64_t last = b->last, lo = last, hi = last;
      MP_NCCL(ncclAllReduce(&last, &lo, 1, ncclInt64, ncclMin, comm, NULL));
      MP_NCCL(ncclAllReduce(&last, &hi, 1, ncclInt64, ncclMax, comm, NULL));
      MP_CHECK(lo == hi, "rank %d: %s of %zu bytes: the ranks ended on different paths", rank,
               kinds[k], sizes[si]);
    }
  }
  /* Nothing of a weighed call's choice outlives it: the second call of a
   * new size always runs the alternative (adapt_pick), here non-temporal
   * slot stores where they are weighed. */
  {
    size_t per = ((size_t)512 << 10) / sizeof(float);
    float* buf = calloc(per, sizeof(float));
    MP_CHECK(buf, "out of memory");
    for (int it = 0; it < 2; it++) {
      MP_NCCL(ncclAllReduce(buf, buf, per, ncclFloat, ncclSum, comm, NULL));
      MP_CHECK(comm->slot_far == (comm->slot_stream == 1), "rank %d: slot stores left at %d after allreduce %d",
               rank, comm->slot_far, it);
    }
    MP_CHECK(comm->adapt[3][19].calls == (slots ? 2u : 0u), "rank %d: %u of the 2 allreduces of 512 KiB weighed",
             rank, comm->adapt[3][19].calls);
    free(buf);
  }
  /* The figures behind the slots' stores travel without waiting
   * (direct_shm_rates): after a barrier every rank reads every other's post
   * exactly, and a rank's later post replaces its earlier one. Key 0 (broadcasts
   * under 2 bytes) is never weighed. Each read posts this rank's figures
   * again, so the ranks read in turn: a read that meets a post being written
   * (its writer taken off the CPU in the middle) may count it as none. */
  if (nranks <= 8) {
    float mine[4] = {(float)rank + 1.0f, 2.0f, 3.0f, 4.0f}, all[4 * 8];
    int32_t one = 1, sum = 0;
    MP_NCCL(direct_shm_rates(comm, 0, mine, all));
    MP_NCCL(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, NULL)); /* every rank has posted */
    MP_NCCL(rates_in_turn(comm, rank, nranks, mine, all));
    for (int r = 0; r < nranks; r++)
      MP_CHECK(all[4 * r] == (float)r + 1.0f && all[4 * r + 1] == 2.0f && all[4 * r + 2] == 3.0f &&
                   all[4 * r + 3] == 4.0f,
               "rank %d: rank %d's first figures read as %g %g %g %g", rank, r, all[4 * r], all[4 * r + 1],
               all[4 * r + 2], all[4 * r + 3]);
    MP_NCCL(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, NULL)); /* every rank has read them */
    mine[1] = 5.0f;
    MP_NCCL(direct_shm_rates(comm, 0, mine, all));
    MP_NCCL(ncclAllReduce(&one, &sum, 1, ncclInt32, ncclSum, comm, NULL)); /* every rank has posted again */
    MP_NCCL(rates_in_turn(comm, rank, nranks, mine, all));
    for (int r = 0; r < nranks; r++)
      MP_CHECK(all[4 * r] == (float)r + 1.0f && all[4 * r + 1] == 5.0f && all[4 * r + 2] == 3.0f &&
                   all[4 * r + 3] == 4.0f,
               "rank %d: rank %d's later figures read as %g %g %g %g", rank, r, all[4 * r], all[4 * r + 1],
               all[4 * r + 2], all[4 * r + 3]);
    MP_CHECK(direct_shm_rates(comm, ADAPT_KINDS * ADAPT_BUCKETS, mine, all) == ncclInternalError,
             "rank %d: a key out of range was taken", rank);
  }
  if (rank == 0)
    printf("weighed by measurement: single copy %s, slot stores %s%s (single copy %s, %.1f ranks a CPU)\n",
           on ? "yes" : "no", slots ? "yes" : "no", held ? ", held" : "", comm->cma ? "works" : "off", comm->oversub);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

static int rank_cmaauto(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  size_t th = comm->cma_min_bytes;
  if (comm->cma)
    MP_CHECK(th == SIZE_MAX || (th >= ((size_t)4 << 10) && th <= ((size_t)256 << 20) && (th & (th - 1)) == 0),
             "rank %d: single-copy threshold %zu", rank, th);
  else
    MP_CHECK(th == SIZE_MAX, "rank %d: single copy off but threshold %zu", rank, th);
  /* Every rank agrees on the threshold. */
  uint64_t mine = th, lo = th, hi = th;
  MP_NCCL(ncclAllReduce(&mine, &lo, 1, ncclUint64, ncclMin, comm, NULL));
  MP_NCCL(ncclAllReduce(&mine, &hi, 1, ncclUint64, ncclMax, comm, NULL));
  MP_CHECK(lo == hi, "rank %d: thresholds differ across ranks (%llu .. %llu)", rank, (unsigned long long)lo,
           (unsigned long long)hi);
  /* The threshold of an alltoall or scatter whose buffers leave the
   * cache: never above the lone message's, agreed, and what p2p_cma applies
   * (a message of that size in a call whose footprint exceeds the cache; a
   * lone message of it, or one in a call that fits, by the lone threshold). */
  size_t ts = comm->cma_min_stream;
  MP_CHECK(comm->cma ? ts <= th && (ts == SIZE_MAX || (ts >= ((size_t)4 << 10) && (ts & (ts - 1)) == 0))
                     : ts == SIZE_MAX,
           "rank %d: streaming single-copy threshold %zu (lone messages %zu, single copy %s)", rank, ts, th,
           comm->cma ? "on" : "off");
  mine = lo = hi = ts;
  MP_NCCL(ncclAllReduce(&mine, &lo, 1, ncclUint64, ncclMin, comm, NULL));
  MP_NCCL(ncclAllReduce(&mine, &hi, 1, ncclUint64, ncclMax, comm, NULL));
  MP_CHECK(lo == hi, "rank %d: streaming thresholds differ across ranks (%llu .. %llu)", rank, (unsigned long long)lo,
           (unsigned long long)hi);
  if (comm->cma && ts != SIZE_MAX) {
    size_t huge = 2 * (size_t)comm->tune.cache_bytes; /* a footprint beyond the cache */
    MP_CHECK(p2p_cma(comm, ts, huge) && !p2p_cma(comm, ts / 2, huge) && (th == SIZE_MAX || p2p_cma(comm, th, 0)) &&
                 (ts == th || (!p2p_cma(comm, ts, 0) && !p2p_cma(comm, ts, 1))), /* 1: a footprint that fits */
             "rank %d: p2p_cma disagrees with the thresholds %zu (streaming) and %zu", rank, ts, th);
    /* Where ranks take turns on a CPU the footprint counts oversub times. */
    double share = comm->tune.cache_bytes / comm->oversub;
    MP_CHECK(p2p_cma(comm, ts, (size_t)share + 4096) && (ts == th || !p2p_cma(comm, ts, (size_t)share - 4096)),
             "rank %d: p2p_cma does not count a footprint %.1f times (cache %.0f bytes, streaming threshold %zu)",
             rank, comm->oversub, comm->tune.cache_bytes, ts);
  }
  if (rank == 0)
    printf("single copy %s, threshold %s%zu KiB, %s%zu KiB where the call's buffers leave the cache\n",
           comm->cma ? "on" : "off", th == SIZE_MAX ? "none: " : "", th == SIZE_MAX ? 0 : th >> 10,
           ts == SIZE_MAX ? "none: " : "", ts == SIZE_MAX ? 0 : ts >> 10);
  /* Messages below, at and above the threshold (or 64 KiB-1 MiB when off). */
  size_t base = comm->cma && th != SIZE_MAX ? th : (size_t)64 << 10;
  size_t sizes[] = {base / 2 - 4, base, base * 2 + 4, 0};
  int nsizes = 3;
  /* And an alltoall whose buffers leave the cache, of messages from the
   * streaming threshold on that a lone message would move by the FIFO. */
  if (comm->cma && ts < th) {
    size_t m = (size_t)(comm->tune.cache_bytes / (3.0 * nranks * comm->max_local * comm->oversub)) + 64;
    sizes[nsizes++] = (m < ts ? ts : m) & ~(size_t)3;
  }
  /* The single-copy rows may run from the threshold on (per rank), never
   * below it, and never when single copy is off or has no threshold. */
  for (int si = 0; si < 3; si++) /* (the rows judge a call by its own messages) */
    for (int i = 0; i < algo_table_len; i++) {
      const struct algo* al = algo_table[i];
      if (al->name != ALGO_CMA) continue;
      struct coll_args a;
      memset(&a, 0, sizeof(a));
      a.comm = comm;
      a.kind = al->coll;
      a.count = sizes[si] / sizeof(float);
      a.dt = ncclFloat;
      /* (The single-copy reduce is a 2-rank algorithm.) */
      int want = comm->cma && th != SIZE_MAX && a.count * sizeof(float) >= th && (al->coll != COLL_REDUCE || nranks == 2);
      MP_CHECK(al->eligible(&a) == want, "rank %d: single-copy %s row of %zu bytes %s (threshold %zu)", rank,
               coll_name(al->coll), sizes[si], want ? "not eligible" : "eligible", th);
    }
  for (int si = 0; si < nsizes; si++) {
    size_t per = sizes[si] / sizeof(float);
    float* sb = malloc(per * (size_t)nranks * sizeof(float));
    float* rb = malloc(per * (size_t)nranks * sizeof(float));
    MP_CHECK(sb && rb, "out of memory");
    for (int it = 0; it < 3; it++) {
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < per; i++) sb[(size_t)p * per + i] = val(it, rank, p, i);
      memset(rb, 0, per * (size_t)nranks * sizeof(float));
      MP_NCCL(ncclAlltoAll(sb, rb, per, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < per; i += 97)
          MP_CHECK(rb[(size_t)p * per + i] == val(it, p, rank, i), "rank %d: alltoall of %zu bytes, element %zu from "
                   "rank %d is %g", rank, sizes[si], i, p, rb[(size_t)p * per + i]);
      /* A ring of send/recv pairs. */
      int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
      memset(rb, 0, per * sizeof(float));
      MP_NCCL(ncclGroupStart());
      MP_NCCL(ncclSend(sb + (size_t)next * per, per, ncclFloat, next, comm, NULL));
      MP_NCCL(ncclRecv(rb, per, ncclFloat, prev, comm, NULL));
      MP_NCCL(ncclGroupEnd());
      for (size_t i = 0; i < per; i += 97)
        MP_CHECK(rb[i] == val(it, prev, rank, i), "rank %d: send/recv of %zu bytes, element %zu is %g", rank,
                 sizes[si], i, rb[i]);
      /* The single-copy rows, weighed by the tuner from the threshold on:
       * a broadcast (in place and not) and an allgather. */
      int root = it % nranks;
      memset(rb, 0, per * (size_t)nranks * sizeof(float));
      MP_NCCL(ncclBroadcast(sb, rb, per, ncclFloat, root, comm, NULL));
      if (rank == root) memcpy(rb + per, sb, per * sizeof(float));
      MP_NCCL(ncclBroadcast(rb + per, rb + per, per, ncclFloat, root, comm, NULL));
      for (size_t i = 0; i < per; i += 89)
        MP_CHECK(rb[i] == val(it, root, 0, i) && rb[per + i] == val(it, root, 0, i),
                 "rank %d: broadcast of %zu bytes from rank %d, element %zu is %g / %g", rank, sizes[si], root, i,
                 rb[i], rb[per + i]);
      memset(rb, 0, per * (size_t)nranks * sizeof(float));
      MP_NCCL(ncclAllGather(sb, rb, per, ncclFloat, comm, NULL));
      for (int p = 0; p < nranks; p++)
        for (size_t i = 0; i < per; i += 89)
          MP_CHECK(rb[(size_t)p * per + i] == val(it, p, 0, i), "rank %d: allgather of %zu bytes per rank, element "
                   "%zu from rank %d is %g", rank, sizes[si], i, p, rb[(size_t)p * per + i]);
    }
    free(sb);
    free(rb);
  }
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

/* The CPU the one thread of this process pinned to a single CPU sits on (a
 * channel helper: the main thread keeps its mask), from
 * /proc/self/task/ID/status; -1 when none, -2 when several. */
static int pinned_helper_cpu(void) {
  char path[320], line[256];
  int found = -1;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  struct dirent* e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    while (fgets(line, sizeof(line), f)) {
      int a, b;
      if (strncmp(line, "Cpus_allowed_list:", 18) != 0) continue;
      /* One CPU: "N" alone (a range "N-M" or a list "N,M" reads past it). */
      int n = sscanf(line + 18, "%d%*[-,]%d", &a, &b);
      if (n == 1) found = found == -1 ? a : -2;
    }
    fclose(f);
  }
  closedir(d);
  return found;
}

/* Ranks of one machine that NCCL_HOSTID makes hosts of their own (local
 * rank 0 each) pin their channel helpers by their place among the machine's
 * ranks: with as many CPUs as helpers, no two share a CPU. With more ranks
 * than CPUs no helper is pinned (channels.c, pin_fits). */
static int rank_helpers(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids;
  (void)arg;
  own_host("helperhost", rank);
  setenv("NCCL_MIN_CTAS", "2", 1);
  setenv("NCCL_MAX_CTAS", "2", 1);
  setenv("NCCL_ALGO", "Ring", 1);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  MP_CHECK(comm->nhosts == nranks && comm->local_rank == 0 && comm->machine_size == nranks &&
               comm->machine_rank == rank,
           "rank %d: %d hosts, local rank %d, %d ranks on the machine, place %d among them", rank, comm->nhosts,
           comm->local_rank, comm->machine_size, comm->machine_rank);
  size_t count = 4u << 20; /* 16 MiB of floats: a ring in two channels */
  float* buf = malloc(count * sizeof(float));
  MP_CHECK(buf != NULL, "out of memory");
  for (size_t i = 0; i < count; i++) buf[i] = (float)((rank + (int)i) % 5);
  MP_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i += 4099) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += (float)((r + (int)i) % 5);
    MP_CHECK(buf[i] == want, "rank %d: element %zu is %g, want %g", rank, i, buf[i], want);
  }
  free(buf);
  int cpu = pinned_helper_cpu();
  cpu_set_t mask;
  int ncpu = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
  if (ncpu < nranks) {
    /* More ranks than CPUs: a helper pinned to one would sit beside another
     * rank's for good; each keeps the process's mask instead. */
    MP_CHECK(cpu == -1, "rank %d: %d ranks on %d CPUs, yet %s", rank, nranks, ncpu,
             cpu == -2 ? "several threads are pinned" : "a channel helper is pinned to one CPU");
    MP_NCCL(ncclCommDestroy(comm));
    return 0;
  }
  MP_CHECK(cpu >= 0, "rank %d: %s", rank, cpu == -1 ? "no channel helper pinned to one CPU" : "several threads pinned");
  /* Every rank learns every helper's CPU. */
  int32_t* cpus = calloc((size_t)nranks, sizeof(int32_t));
  MP_CHECK(cpus != NULL, "out of memory");
  cpus[rank] = cpu;
  MP_NCCL(ncclAllReduce(cpus, cpus, (size_t)nranks, ncclInt32, ncclSum, comm, NULL));
  for (int p = 0; p < nranks; p++)
    MP_CHECK(p == rank || cpus[p] != cpu, "rank %d: its channel helper and rank %d's both sit on CPU %d", rank, p, cpu);
  free(cpus);
  MP_NCCL(ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s zero|a2a|paired|delack|lag|helpers|localcc|duplex|cmaauto|adapt|runahead|rotate|spread|yield|spin|hold NRANKS\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  double t0 = mp_now();
  int zero = strcmp(argv[1], "zero") == 0, paired = strcmp(argv[1], "paired") == 0;
  int delack = strcmp(argv[1], "delack") == 0, helpers = strcmp(argv[1], "helpers") == 0;
  int localcc = strcmp(argv[1], "localcc") == 0, duplex = strcmp(argv[1], "duplex") == 0;
  int cmaauto = strcmp(argv[1], "cmaauto") == 0, runahead = strcmp(argv[1], "runahead") == 0;
  int spread = strcmp(argv[1], "spread") == 0, adapt = strcmp(argv[1], "adapt") == 0;
  int rotate = strcmp(argv[1], "rotate") == 0, lag = strcmp(argv[1], "lag") == 0;
  int yield = strcmp(argv[1], "yield") == 0, holdp = strcmp(argv[1], "hold") == 0;
  int spin = strcmp(argv[1], "spin") == 0;
  if (lag) {
    /* Each rank pins itself to a CPU of its own (a sender on the receiver's
     * CPU turns the lag off): with fewer CPUs nothing can be judged. */
    cpu_set_t mask;
    if (n != 2 || sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2) {
      printf("SKIPPED: lag needs 2 ranks and 2 CPUs\n");
      return 77;
    }
  }
  if (spread) {
    /* Two CPUs for more ranks than that; not beside the suite's hogs (moves
     * wait for a machine where only the ranks want a CPU). */
    cpu_set_t mask, two;
    if (getenv("COLLIE_TEST_HOG")) {
      printf("SKIPPED: spread: COLLIE_TEST_HOG is set (ranks never move beside busy processes)\n");
      return 77;
    }
    if (sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2 || n < 4) {
      printf("SKIPPED: spread needs 2 CPUs and at least 4 ranks\n");
      return 77;
    }
    CPU_ZERO(&two);
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
      if (CPU_ISSET(c, &mask)) {
        CPU_SET(c, &two);
        k++;
      }
    if (sched_setaffinity(0, sizeof(two), &two) != 0) {
      perror("sched_setaffinity");
      return 1;
    }
  }
  /* paired: a busy process on the last CPU, as a job beside the ranks, so the
   * scheduler has no idle CPU to spread them to by itself. */
  pid_t hog = -1;
  cpu_set_t all;
  if (paired && sched_getaffinity(0, sizeof(all), &all) == 0 && CPU_COUNT(&all) >= 2) {
    int last = CPU_SETSIZE - 1;
    while (last > 0 && !CPU_ISSET(last, &all)) last--;
    hog = fork();
    if (hog == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(last, &one);
      sched_setaffinity(0, sizeof(one), &one);
      alarm(300); /* never outlives a lost parent for long */
      for (volatile unsigned long k = 0;; k++) {
      }
    }
  }
  if (spin) {
    cpu_set_t mask;
    if (n != 4 || sched_getaffinity(0, sizeof(mask), &mask) != 0 || CPU_COUNT(&mask) < 2) {
      printf("SKIPPED: spin needs 4 ranks and 2 CPUs\n");
      return 77;
    }
  }
  if (helpers) {
    /* With one CPU the main thread is pinned too: nothing to tell apart
     * (ctest: skipped). */
    cpu_set_t mask;
    int ncpu = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
    if (ncpu < 2) {
      printf("SKIPPED: helpers needs at least 2 CPUs (%d)\n", ncpu);
      return 77;
    }
  }
  int rc = mp_run(n, zero ? rank_zero : paired ? rank_paired : delack ? rank_delack : lag ? rank_lag : helpers ? rank_helpers : localcc ? rank_localcc : duplex ? rank_duplex : cmaauto ? rank_cmaauto : adapt ? rank_adapt : runahead ? rank_runahead : rotate ? rank_rotate : spread ? rank_spread : yield ? rank_yield : spin ? rank_spin : holdp ? rank_hold : rank_a2a, NULL, 600);
  if (spread && rc == 0 && __atomic_load_n(&mp_counters[SPREAD_UNJUDGED], __ATOMIC_ACQUIRE) > 0) {
    printf("SKIPPED: spread: in each of 50 attempts another task wanted a CPU (nothing to judge)\n");
    return 77;
  }
  if (hog > 0) {
    kill(hog, SIGKILL);
    waitpid(hog, NULL, 0);
  }
  fprintf(stderr, "%s %s, %d ranks, in %.1f s\n", rc ? "FAILED" : "passed", argv[1], n, mp_now() - t0);
  return rc;
}
