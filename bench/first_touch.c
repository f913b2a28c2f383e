/* What a page's first access costs on this machine, after the kernel has
 * already mapped it: one process, two shared mappings of one fresh memfd
 * (as a shm connector's two ends have, src/transport/shm.c), then passes
 * that write 4 KiB through the first mapping and read it back through the
 * second, page after page. Prints the cost per page of each pass.
 *   cc -O2 -o first_touch bench/first_touch.c && ./first_touch MODE [MiB]
 *   MODE 0: nothing beforehand; 1: MADV_POPULATE_WRITE on the first
 *   mapping; 2: on both; 3: both, then one write a page through the
 *   first; 4: through both (what shmseg_prefault does with touch on every
 *   mapping); MiB: 1 by default.
 * On a guest whose first accesses go to the host, pass 0 costs far more
 * than the later ones in modes 0-3 (docs/BENCHMARKS.md). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODE(0-4) [MiB]\n", argv[0]);
    return 2;
  }
  int mode = atoi(argv[1]);
  int mib = argc > 2 ? atoi(argv[2]) : 1;
  if (mode < 0 || mode > 4 || mib < 1) {
    fprintf(stderr, "usage: %s MODE(0-4) [MiB >= 1]\n", argv[0]);
    return 2;
  }
  size_t len = (size_t)mib << 20;
  const size_t page = 4096;
  int fd = memfd_create("first-touch", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
    perror("memfd");
    return 1;
  }
  char* a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  char* b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (a == MAP_FAILED || b == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
#ifdef MADV_POPULATE_WRITE
  if (mode >= 1 && madvise(a, len, MADV_POPULATE_WRITE) != 0) perror("madvise");
  if (mode >= 2 && madvise(b, len, MADV_POPULATE_WRITE) != 0) perror("madvise");
#endif
  for (size_t off = 0; off < len; off += page) {
    if (mode >= 3) __atomic_fetch_add((volatile char*)a + off, 0, __ATOMIC_RELAXED);
    if (mode >= 4) __atomic_fetch_add((volatile char*)b + off, 0, __ATOMIC_RELAXED);
  }
  char src[4096], dst[4096];
  memset(src, 1, sizeof(src));
  for (int pass = 0; pass < 3; pass++) {
    double t = now_us();
    for (size_t off = 0; off < len; off += page) {
      memcpy(a + off, src, page);
      memcpy(dst, b + off, page);
      __asm__ volatile("" : : "r"(dst) : "memory"); /* the compiler must keep every read */
    }
    printf("mode %d pass %d: %.2f us a page\n", mode, pass, (now_us() - t) / (double)(len / page));
  }
  munmap(a, len);
  munmap(b, len);
  close(fd);
  return 0;
}
