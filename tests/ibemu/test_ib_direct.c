/* Large sends straight from user memory over the IB transport (through the
 * emulator): two ranks, each its own host. `test_ib_direct direct` runs with
 * COLLIE_IB_DIRECT_BYTES low (slots written from the user's buffer,
 * registered through the connector's registration cache), `copy` with it 0
 * (every slot copied into a bounce slot). Both check the data of send/recv
 * both ways at several sizes, in- and out-of-place allreduce, one buffer
 * reused with new contents each time, and a buffer unmapped and mapped again
 * at the same address with new contents (a stale registration would send the
 * old pages on a real HCA; here it must be registered afresh). The emulator's
 * registration counter (ibemu_get_counts: same library instance the transport
 * dlopens) tells whether user memory was registered: per big send in
 * `direct` (one registration covering the whole buffer: later slots reuse
 * it), never in `copy`; for a buffer registered with ncclCommRegister once
 * for all operations until ncclCommDeregister. Uses tests/mp/harness.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../mp/harness.h"
#include "ibemu.h"

#define BIG (8u << 20) /* bytes: many slots */

static int g_direct;

static unsigned char pat(int from, int round, size_t i) { return (unsigned char)(from * 31 + round * 7 + i * 13 + (i >> 12)); }

static long regs(void) {
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  return k.mr_regs;
}

/* Both ranks send `bytes` of `sb` to each other and check what came into rb. */
static int swap_check(ncclComm_t comm, int rank, unsigned char* sb, unsigned char* rb, size_t bytes, int round,
                      const char* what) {
  int peer = 1 - rank;
  for (size_t i = 0; i < bytes; i++) sb[i] = pat(rank, round, i);
  memset(rb, 0xee, bytes);
  MP_NCCL(ncclGroupStart());
  MP_NCCL(ncclSend(sb, bytes, ncclUint8, peer, comm, NULL));
  MP_NCCL(ncclRecv(rb, bytes, ncclUint8, peer, comm, NULL));
  MP_NCCL(ncclGroupEnd());
  for (size_t i = 0; i < bytes; i++)
    MP_CHECK(rb[i] == pat(peer, round, i), "%s (%zu bytes, round %d): byte %zu is %u, want %u", what, bytes, round, i,
             rb[i], pat(peer, round, i));
  return 0;
}

static int allreduce_check(ncclComm_t comm, int rank, float* a, float* b, size_t n, int inplace) {
  for (size_t i = 0; i < n; i++) a[i] = (float)((rank + 1) * (int)(i % 1021));
  float* out = inplace ? a : b;
  MP_NCCL(ncclAllReduce(a, out, n, ncclFloat, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++)
    MP_CHECK(out[i] == (float)(3 * (int)(i % 1021)), "allreduce (%s, %zu floats): element %zu is %g, want %d",
             inplace ? "in place" : "out of place", n, i, (double)out[i], 3 * (int)(i % 1021));
  return 0;
}

/* A fresh mapping (registered with the communicator while in use when
 * `reg`) swapped, unmapped, mapped again at the same address with new
 * contents and swapped again: the new pages must arrive, and in direct mode
 * they must be registered afresh. */
static int remap_check(ncclComm_t comm, int rank, unsigned char* rb, int round, int reg) {
  size_t len = BIG;
  void* handle = NULL;
  unsigned char* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  MP_CHECK(m != MAP_FAILED, "mmap");
  if (reg) MP_NCCL(ncclCommRegister(comm, m, len, &handle));
  if (swap_check(comm, rank, m, rb, len, round, "mapped buffer")) return 1;
  if (reg && swap_check(comm, rank, m, rb, len, round + 1, "registered mapping, again")) return 1;
  if (reg) MP_NCCL(ncclCommDeregister(comm, handle));
  MP_CHECK(munmap(m, len) == 0, "munmap");
  unsigned char* m2 = mmap(m, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  MP_CHECK(m2 == m, "mapping again at %p gave %p", (void*)m, (void*)m2);
  long r0 = regs();
  if (swap_check(comm, rank, m2, rb, len, round + 2, "buffer mapped again at the same address")) return 1;
  if (g_direct) MP_CHECK(regs() > r0, "direct mode: the remapped buffer was not registered again");
  MP_CHECK(munmap(m2, len) == 0, "munmap");
  return 0;
}

static int rank_main(int rank, int nranks, const ncclUniqueId* ids, int nids, void* arg) {
  (void)nids, (void)arg;
  char h[32];
  snprintf(h, sizeof(h), "directhost%d", rank);
  setenv("NCCL_HOSTID", h, 1);
  ncclComm_t comm;
  MP_NCCL(ncclCommInitRank(&comm, nranks, ids[0], rank));
  unsigned char* sb = malloc(BIG + 64);
  unsigned char* rb = malloc(BIG + 64);
  MP_CHECK(sb && rb, "out of memory");
  /* Connectors (and their own registrations) exist after a first exchange. */
  if (swap_check(comm, rank, sb, rb, 1024, 0, "warm-up")) return 1;
  static const size_t sizes[] = {1, 4095, 65536 + 3, (1u << 20) + 5, BIG};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
    if (swap_check(comm, rank, sb + 1, rb + 3, sizes[k], (int)k + 1, "send/recv, unaligned")) return 1;
  for (int inplace = 0; inplace < 2; inplace++) {
    if (allreduce_check(comm, rank, (float*)sb, (float*)rb, BIG / sizeof(float), inplace)) return 1;
    if (allreduce_check(comm, rank, (float*)sb, (float*)rb, 1000, inplace)) return 1;
  }

  /* Reuse: the same buffer, new contents every time. One big send registers
   * at most a couple of ranges in direct mode (the first covers the rest of
   * the operation), none in copy mode. */
  for (int round = 10; round < 14; round++) {
    long r0 = regs();
    if (swap_check(comm, rank, sb, rb, BIG, round, "reused buffer")) return 1;
    long d = regs() - r0;
    if (g_direct) MP_CHECK(d >= 1 && d <= 2, "direct mode: %ld registrations for one %u-byte send (want 1-2)", d, BIG);
    else MP_CHECK(d == 0, "copy mode: %ld registrations of user memory", d);
  }

  /* Registered with the communicator: registered with the HCA once, kept
   * across operations until ncclCommDeregister; then registered afresh per
   * operation, and a registered mapping that is deregistered, unmapped and
   * mapped again sends its new pages. */
  void* handle = NULL;
  MP_NCCL(ncclCommRegister(comm, sb, BIG + 64, &handle));
  long before = regs();
  for (int round = 30; round < 35; round++) {
    long r1 = regs();
    if (swap_check(comm, rank, sb + 1, rb, BIG, round, "registered buffer")) return 1;
    long d = regs() - r1;
    if (!g_direct) MP_CHECK(d == 0, "copy mode: %ld registrations of user memory", d);
    else if (round == 30) MP_CHECK(d == 1, "registered buffer, first send: %ld registrations (want 1)", d);
    else MP_CHECK(d == 0, "registered buffer, send %d: %ld registrations (want 0: kept)", round - 30, d);
  }
  if (allreduce_check(comm, rank, (float*)(sb + 64), (float*)rb, BIG / sizeof(float) - 64, 1)) return 1;
  if (g_direct) MP_CHECK(regs() - before == 1, "registered buffer: %ld registrations in 6 operations (want 1)",
                         regs() - before);
  MP_NCCL(ncclCommDeregister(comm, handle));
  for (int round = 40; round < 42; round++) {
    long r1 = regs();
    if (swap_check(comm, rank, sb, rb, BIG, round, "deregistered buffer")) return 1;
    if (g_direct) MP_CHECK(regs() > r1, "direct mode: a deregistered buffer was not registered again");
  }
  if (remap_check(comm, rank, rb, 50, 1)) return 1;

  /* Unmapped and mapped again at the same address, new contents. */
  if (remap_check(comm, rank, rb, 20, 0)) return 1;

  MP_NCCL(ncclCommDestroy(comm));
  struct ibemu_counts k;
  ibemu_get_counts(&k);
  MP_CHECK(!k.mrs && !k.qps && !k.pds, "after destroy: %d MRs, %d QPs, %d PDs alive", k.mrs, k.qps, k.pds);
  free(sb);
  free(rb);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "direct") && strcmp(argv[1], "copy"))) {
    fprintf(stderr, "usage: test_ib_direct direct|copy\n");
    return 2;
  }
  g_direct = !strcmp(argv[1], "direct");
  int rc = mp_run(2, rank_main, NULL, 600);
  fprintf(stderr, "%s ib %s sends\n", rc ? "FAILED" : "passed", argv[1]);
  return rc;
}
