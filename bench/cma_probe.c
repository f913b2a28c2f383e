/* A probe, not part of the library: how fast can two processes allreduce
 * malloc'd float buffers by cross-memory attach (process_vm_readv)? Phase 1:
 * each rank pulls the peer's half of the peer's send buffer, one block at a
 * time, into a block that stays in cache, and adds its own half into its
 * receive buffer; phase 2: each rank pulls the peer's reduced half straight
 * into its own receive buffer. Every byte crosses once by the kernel's copy
 * and the reduction reads the pulled block from cache. bench/mapped.sh runs
 * it beside collie's rows (issue 10: can malloc'd buffers reach 8 GB/s?).
 *
 *   cma_probe [-b 32M] [-e 256M] [-f 2] [-n 10] [-w 2] [-k BLOCK_KiB]
 *
 * Prints one line per size in collie-perf's column layout (out of place
 * only: the in-place columns are "-"); busbw = bytes / time at 2 ranks.
 * Checks the result of every size (exit 1 if wrong). Linux only. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
  int pid[2];
  char* send[2];
  char* recv[2];
  int bar[2];
  int failed;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void barrier(struct shared* s, int r, int* gen) {
  ++*gen;
  __atomic_store_n(&s->bar[r], *gen, __ATOMIC_RELEASE);
  while (__atomic_load_n(&s->bar[1 - r], __ATOMIC_ACQUIRE) < *gen) sched_yield();
}

static size_t size_arg(const char* a) {
  char* end;
  double v = strtod(a, &end);
  switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return (size_t)v;
}

static void add(float* restrict out, const float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* Pulls len bytes at the peer's `remote` into `local`; 0 or -1. */
static int pull(int pid, void* local, const void* remote, size_t len) {
  while (len) {
    struct iovec lv = {local, len}, rv = {(void*)remote, len};
    ssize_t got = process_vm_readv(pid, &lv, 1, &rv, 1, 0);
    if (got <= 0) return -1;
    local = (char*)local + got;
    remote = (const char*)remote + got;
    len -= (size_t)got;
  }
  return 0;
}

int main(int argc, char** argv) {
  size_t lo = 32u << 20, hi = 256u << 20, block = 1024u << 10;
  int factor = 2, iters = 10, warm = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) lo = size_arg(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) hi = size_arg(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warm = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-k")) block = (size_t)atol(argv[i + 1]) << 10;
    else {
      fprintf(stderr, "usage: %s [-b 32M] [-e 256M] [-f 2] [-n 10] [-w 2] [-k BLOCK_KiB]\n", argv[0]);
      return 2;
    }
  }
  if (lo < 64 || factor < 2 || iters < 1 || block < 64 || block % 64) {
    fprintf(stderr, "cma_probe: bad arguments\n");
    return 2;
  }
  struct shared* s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) return 1;
  memset(s, 0, sizeof(*s));
  pid_t child = fork();
  if (child < 0) return 1;
  int r = child == 0, gen = 0;
  float* snd = aligned_alloc(64, (hi + 63) & ~(size_t)63);
  float* rcv = aligned_alloc(64, (hi + 63) & ~(size_t)63);
  float* tmp = aligned_alloc(64, block);
  if (!snd || !rcv || !tmp) return 1;
  memset(rcv, 0, hi);
  for (size_t i = 0; i < hi / 4; i++) snd[i] = (float)(r + 1) * (float)(i % 1000);
  s->pid[r] = getpid();
  s->send[r] = (char*)snd;
  s->recv[r] = (char*)rcv;
  barrier(s, r, &gen);
  int peer = s->pid[1 - r];
  const char* psend = s->send[1 - r];
  const char* precv = s->recv[1 - r];
  if (r == 0) printf("# allreduce float sum, 2 ranks, cross-memory attach, %zu KiB blocks\n", block >> 10);
  for (size_t bytes = lo; bytes <= hi; bytes *= (size_t)factor) {
    size_t n = bytes / 4 / 32 * 32; /* whole 128-byte lines a rank */
    size_t half = n / 2 * 4, mine = (size_t)r * half, theirs = (size_t)(1 - r) * half;
    double total = 0;
    for (int it = 0; it < warm + iters; it++) {
      barrier(s, r, &gen);
      double t0 = now();
      for (size_t o = 0; o < half; o += block) {
        size_t l = half - o < block ? half - o : block;
        if (pull(peer, tmp, psend + mine + o, l)) s->failed = 1;
        add((float*)((char*)rcv + mine + o), (const float*)((const char*)snd + mine + o), tmp, l / 4);
      }
      barrier(s, r, &gen);
      if (pull(peer, (char*)rcv + theirs, precv + theirs, half)) s->failed = 1;
      barrier(s, r, &gen);
      if (it >= warm) total += now() - t0;
    }
    for (size_t i = 0; i < n; i++)
      if (rcv[i] != 3.0f * (float)(i % 1000)) {
        s->failed = 1;
        break;
      }
    double t = total / iters, b = (double)n * 4;
    if (r == 0)
      printf("%12.0f %12zu %9s %6s %6d %10.1f %7.2f %7.2f %6d %10s %7s %7s %6s\n", b, n, "float", "sum", -1, t * 1e6,
             b / t / 1e9, b / t / 1e9, s->failed, "-", "-", "-", "-");
  }
  barrier(s, r, &gen);
  if (r == 1) return 0;
  int st = 0;
  waitpid(child, &st, 0);
  if (s->failed) fprintf(stderr, "cma_probe: a pull failed or a result was wrong\n");
  return s->failed || !WIFEXITED(st) || WEXITSTATUS(st) ? 1 : 0;
}
