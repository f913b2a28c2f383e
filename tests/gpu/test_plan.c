/* Host test of the device path's CUDA-free logic (src/device/dev_plan.c):
 * buffer roles per collective, the host/device mix rule, the staging layout
 * (in-place calls keep their aliasing, regions never overlap, every byte
 * maps inside the staging buffer) and the registration cache. */
#include <stdio.h>
#include <stdlib.h>

#include "coll/coll.h"
#include "device/dev_plan.h"

static int fails;
#define CHECK(c, ...)                                     \
  do {                                                    \
    if (!(c)) {                                           \
      fails++;                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
    }                                                     \
  } while (0)

static void roles(void) {
  struct dev_roles r;
  /* kind, rank, nranks, root, count, esz -> send, recv */
  struct { int kind, rank, root; size_t s, r; } t[] = {
      {COLL_ALLREDUCE, 1, 0, 40, 40},     {COLL_BROADCAST, 0, 0, 40, 40},     {COLL_BROADCAST, 1, 0, 0, 40},
      {COLL_REDUCE, 2, 2, 40, 40},        {COLL_REDUCE, 1, 2, 40, 0},         {COLL_ALLGATHER, 1, 0, 40, 120},
      {COLL_REDUCESCATTER, 1, 0, 120, 40}, {COLL_ALLTOALL, 1, 0, 120, 120},   {COLL_GATHER, 1, 1, 40, 120},
      {COLL_GATHER, 0, 1, 40, 0},         {COLL_SCATTER, 1, 1, 120, 40},      {COLL_SCATTER, 2, 1, 0, 40},
      {COLL_SEND, 0, 0, 40, 0},           {COLL_RECV, 0, 0, 0, 40},
  };
  for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
    dev_roles(t[i].kind, t[i].rank, 3, t[i].root, 10, 4, &r);
    CHECK(r.send_bytes == t[i].s && r.recv_bytes == t[i].r, "%s rank %d root %d: %zu/%zu, want %zu/%zu",
          coll_name(t[i].kind), t[i].rank, t[i].root, r.send_bytes, r.recv_bytes, t[i].s, t[i].r);
  }
  CHECK(dev_mem_mixed(MEM_HOST | MEM_DEVICE) && !dev_mem_mixed(MEM_DEVICE) && !dev_mem_mixed(MEM_HOST) &&
            !dev_mem_mixed(0), "mix rule");
}

static void staging(void) {
  static char dev[1 << 16]; /* stands for device addresses */
  char* stage = malloc(1 << 18);
  size_t off = 0;
  struct dev_stage s[4];
  /* out of place */
  dev_stage_plan(&s[0], dev + 3, 100, dev + 1000, 100, &off);
  CHECK(!s[0].shared && s[0].send_off % 64 == 0 && s[0].recv_off >= s[0].send_off + 100, "separate regions");
  /* in place (allreduce) */
  dev_stage_plan(&s[1], dev + 2000, 400, dev + 2000, 400, &off);
  CHECK(s[1].shared && dev_stage_map(&s[1], stage, dev + 2000) == stage + s[1].send_off &&
            s[1].send_off == s[1].recv_off, "in place");
  /* in-place allgather: send inside recv, rank 2 of 4 */
  dev_stage_plan(&s[2], dev + 8000 + 2 * 256, 256, dev + 8000, 1024, &off);
  CHECK(s[2].shared && s[2].send_off == s[2].recv_off + 512, "allgather in place keeps the offset");
  CHECK((char*)dev_stage_map(&s[2], stage, dev + 8000 + 512) == stage + s[2].recv_off + 512, "map inside");
  /* unused send (broadcast non-root) */
  dev_stage_plan(&s[3], dev + 50000, 0, dev + 60000, 64, &off);
  CHECK(dev_stage_map(&s[3], stage, dev + 50000) == NULL, "unused buffer is not mapped");
  CHECK(off <= (1 << 18), "layout fits");
  /* regions of different calls never overlap */
  size_t lo[4], hi[4];
  for (int i = 0; i < 4; i++) {
    size_t a = s[i].send_hi > s[i].send_lo ? s[i].send_off : s[i].recv_off;
    size_t b = s[i].recv_hi > s[i].recv_lo ? s[i].recv_off + (s[i].recv_hi - s[i].recv_lo) : a;
    size_t e = s[i].send_hi > s[i].send_lo ? s[i].send_off + (s[i].send_hi - s[i].send_lo) : a;
    lo[i] = a < s[i].recv_off ? a : s[i].recv_off;
    hi[i] = b > e ? b : e;
  }
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++) CHECK(hi[i] <= lo[j] || hi[j] <= lo[i], "calls %d and %d overlap", i, j);
  free(stage);
}

static void regcache(void) {
  struct dev_regcache c = {0};
  static char buf[4096];
  uint32_t h1 = dev_reg_add(&c, buf, 1024), h2 = dev_reg_add(&c, buf + 2048, 1024), h3 = dev_reg_add(&c, buf, 1024);
  CHECK(h1 && h2 && h1 != h2 && h3 == h1, "handles %u %u %u", h1, h2, h3);
  CHECK(dev_reg_covers(&c, buf + 10, 100) && !dev_reg_covers(&c, buf + 1000, 100), "covers");
  CHECK(dev_reg_remove(&c, h1) == 0 && dev_reg_covers(&c, buf, 10), "one reference left");
  CHECK(dev_reg_remove(&c, h1) == 0 && !dev_reg_covers(&c, buf, 10), "gone");
  CHECK(dev_reg_remove(&c, h1) == -1 && dev_reg_remove(&c, 0) == -1 && dev_reg_remove(&c, 999) == -1, "unknown handles");
  for (int i = 0; i < 100; i++) CHECK(dev_reg_add(&c, buf + i, 1) != 0, "grow");
  dev_reg_free(&c);
}

int main(void) {
  roles();
  staging();
  regcache();
  printf("%s: device path plan (roles, staging, registration)\n", fails ? "FAILED" : "passed");
  return fails != 0;
}
