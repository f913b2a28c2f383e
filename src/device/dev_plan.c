/* The CUDA-free logic of the device path (see dev_plan.h): buffer roles per
 * collective, staging layout, registration cache. */
#include "device/dev_plan.h"

#include <stdlib.h>

#include "coll/coll.h"

void dev_roles(int kind, int rank, int nranks, int root, size_t count, size_t esz, struct dev_roles* r) {
  size_t b = count * esz, all = b * (size_t)nranks;
  int is_root = rank == root;
  r->send_bytes = r->recv_bytes = 0;
  switch (kind) {
    case COLL_ALLREDUCE: r->send_bytes = b; r->recv_bytes = b; break;
    case COLL_BROADCAST: r->send_bytes = is_root ? b : 0; r->recv_bytes = b; break;
    case COLL_REDUCE: r->send_bytes = b; r->recv_bytes = is_root ? b : 0; break;
    case COLL_ALLGATHER: r->send_bytes = b; r->recv_bytes = all; break;
    case COLL_REDUCESCATTER: r->send_bytes = all; r->recv_bytes = b; break;
    case COLL_ALLTOALL: r->send_bytes = all; r->recv_bytes = all; break;
    case COLL_GATHER: r->send_bytes = b; r->recv_bytes = is_root ? all : 0; break;
    case COLL_SCATTER: r->send_bytes = is_root ? all : 0; r->recv_bytes = b; break;
    case COLL_SEND: r->send_bytes = b; break;
    case COLL_RECV: r->recv_bytes = b; break;
    default: break;
  }
}

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

void dev_stage_plan(struct dev_stage* s, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                    size_t* off) {
  s->send_lo = (uintptr_t)send;
  s->send_hi = s->send_lo + send_bytes;
  s->recv_lo = (uintptr_t)recv;
  s->recv_hi = s->recv_lo + recv_bytes;
  s->shared = 0;
  size_t o = align64(*off);
  int has_s = send_bytes > 0, has_r = recv_bytes > 0;
  if (has_s && has_r && s->send_lo < s->recv_hi && s->recv_lo < s->send_hi) {
    uintptr_t lo = COLLIE_MIN(s->send_lo, s->recv_lo), hi = COLLIE_MAX(s->send_hi, s->recv_hi);
    s->shared = 1;
    s->send_off = o + (s->send_lo - lo);
    s->recv_off = o + (s->recv_lo - lo);
    *off = o + (hi - lo);
    return;
  }
  s->send_off = s->recv_off = o;
  if (has_s) o = align64(o + send_bytes);
  if (has_r) {
    s->recv_off = o;
    o += recv_bytes;
  }
  *off = o;
}

void* dev_stage_map(const struct dev_stage* s, char* base, const void* p) {
  uintptr_t a = (uintptr_t)p;
  if (s->send_hi > s->send_lo && a >= s->send_lo && a <= s->send_hi) return base + s->send_off + (a - s->send_lo);
  if (s->recv_hi > s->recv_lo && a >= s->recv_lo && a <= s->recv_hi) return base + s->recv_off + (a - s->recv_lo);
  return NULL;
}

uint32_t dev_reg_add(struct dev_regcache* c, const void* p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  for (int i = 0; i < c->n; i++)
    if (c->r[i].lo == lo && c->r[i].hi == hi) {
      c->r[i].refs++;
      return c->r[i].id;
    }
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 8;
    struct dev_reg* n = realloc(c->r, sizeof(*n) * (size_t)cap);
    if (!n) return 0;
    c->r = n;
    c->cap = cap;
  }
  if (++c->next_id == 0) c->next_id = 1;
  c->r[c->n++] = (struct dev_reg){lo, hi, 1, c->next_id};
  return c->next_id;
}

int dev_reg_remove(struct dev_regcache* c, uint32_t handle) {
  for (int i = 0; i < c->n; i++)
    if (c->r[i].id == handle && handle != 0) {
      if (--c->r[i].refs == 0) c->r[i] = c->r[--c->n];
      return 0;
    }
  return -1;
}

int dev_reg_find(const struct dev_regcache* c, const void* p, size_t bytes, uintptr_t* rlo, uintptr_t* rhi) {
  uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
  for (int i = 0; i < c->n; i++)
    if (lo >= c->r[i].lo && hi <= c->r[i].hi) {
      *rlo = c->r[i].lo;
      *rhi = c->r[i].hi;
      return 1;
    }
  return 0;
}

int dev_reg_covers(const struct dev_regcache* c, const void* p, size_t bytes) {
  uintptr_t lo, hi;
  return dev_reg_find(c, p, bytes, &lo, &hi);
}

void dev_reg_free(struct dev_regcache* c) {
  free(c->r);
  c->r = NULL;
  c->n = c->cap = 0;
}
