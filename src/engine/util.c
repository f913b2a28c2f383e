/* Engine building blocks without threads or communication: request/response
 * metadata and its wire format, the string map, the response cache, and the
 * float scaling used for prescale/postscale. Used by engine.c and api.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "engine/engine.h"

static const char* const kind_names[EK_COUNT] = {"allreduce", "allgather",      "broadcast",         "alltoall",
                                                 "reducescatter", "barrier", "add_process_set", "remove_process_set",
                                                 "join"};

const char* engine_kind_name(int kind) { return kind >= 0 && kind < EK_COUNT ? kind_names[kind] : "unknown"; }

/* ------------------------------------------------------------ metadata */

void meta_free(struct meta* m) {
  free(m->name);
  free(m->shape);
  free(m->counts);
  free(m->err);
  free(m->group);
  memset(m, 0, sizeof(*m));
}

static char* dup_or_null(const char* s, int* oom) {
  if (!s) return NULL;
  char* d = strdup(s);
  if (!d) *oom = 1;
  return d;
}

int meta_copy(struct meta* dst, const struct meta* src) {
  int oom = 0;
  *dst = *src;
  dst->name = dup_or_null(src->name, &oom);
  dst->err = dup_or_null(src->err, &oom);
  dst->group = dup_or_null(src->group, &oom);
  dst->shape = NULL;
  dst->counts = NULL;
  if (src->nshape > 0) {
    dst->shape = malloc(sizeof(int64_t) * (size_t)src->nshape);
    if (dst->shape) memcpy(dst->shape, src->shape, sizeof(int64_t) * (size_t)src->nshape);
    else oom = 1;
  }
  if (src->ncounts > 0) {
    dst->counts = malloc(sizeof(uint64_t) * (size_t)src->ncounts);
    if (dst->counts) memcpy(dst->counts, src->counts, sizeof(uint64_t) * (size_t)src->ncounts);
    else oom = 1;
  }
  if (oom) {
    meta_free(dst);
    return -1;
  }
  return 0;
}

void wbuf_put(struct wbuf* b, const void* p, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    uint8_t* q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
}

static void put_str(struct wbuf* b, const char* s) {
  uint32_t n = s ? (uint32_t)strlen(s) : 0;
  wbuf_put(b, &n, sizeof(n));
  wbuf_put(b, s, n);
}

/* Little-endian hosts only (x86-64, arm64): fields go as they are in memory. */
void meta_write(struct wbuf* b, const struct meta* m) {
  put_str(b, m->name);
  int32_t ints[6] = {m->kind, m->dtype, m->op, m->root, m->status, m->nshape};
  wbuf_put(b, ints, sizeof(ints));
  wbuf_put(b, &m->prescale, sizeof(double));
  wbuf_put(b, &m->postscale, sizeof(double));
  wbuf_put(b, &m->count, sizeof(uint64_t));
  if (m->nshape > 0) wbuf_put(b, m->shape, sizeof(int64_t) * (size_t)m->nshape);
  wbuf_put(b, &m->ncounts, sizeof(int32_t));
  if (m->ncounts > 0) wbuf_put(b, m->counts, sizeof(uint64_t) * (size_t)m->ncounts);
  put_str(b, m->err);
  put_str(b, m->group);
  wbuf_put(b, &m->gsize, sizeof(int32_t));
}

int rbuf_get(struct rbuf* b, void* out, size_t n) {
  if (n > b->len - b->off) return -1;
  memcpy(out, b->p + b->off, n);
  b->off += n;
  return 0;
}

#define META_MAX_STR (1u << 20)
#define META_MAX_ARRAY (1 << 24)

static int get_str(struct rbuf* b, char** out, int allow_null) {
  uint32_t n;
  *out = NULL;
  if (rbuf_get(b, &n, sizeof(n)) != 0 || n > META_MAX_STR || n > b->len - b->off) return -1;
  if (n == 0 && allow_null) return 0;
  char* s = malloc((size_t)n + 1);
  if (!s) return -1;
  memcpy(s, b->p + b->off, n);
  s[n] = '\0';
  b->off += n;
  *out = s;
  return 0;
}

int meta_read(struct rbuf* b, struct meta* m) {
  memset(m, 0, sizeof(*m));
  int32_t ints[6];
  if (get_str(b, &m->name, 0) != 0) goto bad;
  if (rbuf_get(b, ints, sizeof(ints)) != 0) goto bad;
  m->kind = ints[0];
  m->dtype = ints[1];
  m->op = ints[2];
  m->root = ints[3];
  m->status = ints[4];
  m->nshape = ints[5];
  if (m->kind < 0 || m->kind >= EK_COUNT || m->nshape < 0 || m->nshape > META_MAX_ARRAY) goto bad;
  if (rbuf_get(b, &m->prescale, sizeof(double)) || rbuf_get(b, &m->postscale, sizeof(double)) ||
      rbuf_get(b, &m->count, sizeof(uint64_t)))
    goto bad;
  if (m->nshape > 0) {
    if ((size_t)m->nshape * sizeof(int64_t) > b->len - b->off) goto bad;
    m->shape = malloc(sizeof(int64_t) * (size_t)m->nshape);
    if (!m->shape || rbuf_get(b, m->shape, sizeof(int64_t) * (size_t)m->nshape)) goto bad;
  }
  if (rbuf_get(b, &m->ncounts, sizeof(int32_t)) || m->ncounts < 0 || m->ncounts > META_MAX_ARRAY) goto bad;
  if (m->ncounts > 0) {
    if ((size_t)m->ncounts * sizeof(uint64_t) > b->len - b->off) goto bad;
    m->counts = malloc(sizeof(uint64_t) * (size_t)m->ncounts);
    if (!m->counts || rbuf_get(b, m->counts, sizeof(uint64_t) * (size_t)m->ncounts)) goto bad;
  }
  if (get_str(b, &m->err, 1) != 0) goto bad;
  if (get_str(b, &m->group, 1) != 0) goto bad;
  if (rbuf_get(b, &m->gsize, sizeof(int32_t)) || m->gsize < 0 || m->gsize > META_MAX_ARRAY) goto bad;
  return 0;
bad:
  meta_free(m);
  return -1;
}

void req_free(struct req* r) {
  if (!r) return;
  meta_free(&r->m);
  free(r);
}

/* ------------------------------------------------------------ map */

struct map_node {
  struct map_node* next;
  uint64_t hash;
  void* val;
  char key[];
};

static uint64_t str_hash(const char* s) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ULL;
  return h;
}

void* map_get(const struct map* m, const char* key) {
  if (!m->nb) return NULL;
  uint64_t h = str_hash(key);
  for (struct map_node* n = m->b[h % m->nb]; n; n = n->next)
    if (n->hash == h && strcmp(n->key, key) == 0) return n->val;
  return NULL;
}

static int map_grow(struct map* m) {
  size_t nb = m->nb ? m->nb * 2 : 64;
  struct map_node** b = calloc(nb, sizeof(*b));
  if (!b) return -1;
  for (size_t i = 0; i < m->nb; i++) {
    for (struct map_node* n = m->b[i]; n;) {
      struct map_node* next = n->next;
      n->next = b[n->hash % nb];
      b[n->hash % nb] = n;
      n = next;
    }
  }
  free(m->b);
  m->b = b;
  m->nb = nb;
  return 0;
}

int map_put(struct map* m, const char* key, void* val) {
  if (m->n + 1 > m->nb && map_grow(m) != 0) return -1;
  uint64_t h = str_hash(key);
  for (struct map_node* n = m->b[h % m->nb]; n; n = n->next) {
    if (n->hash == h && strcmp(n->key, key) == 0) {
      n->val = val;
      return 0;
    }
  }
  size_t len = strlen(key);
  struct map_node* n = malloc(sizeof(*n) + len + 1);
  if (!n) return -1;
  memcpy(n->key, key, len + 1);
  n->hash = h;
  n->val = val;
  n->next = m->b[h % m->nb];
  m->b[h % m->nb] = n;
  m->n++;
  return 0;
}

void* map_del(struct map* m, const char* key) {
  if (!m->nb) return NULL;
  uint64_t h = str_hash(key);
  for (struct map_node** p = &m->b[h % m->nb]; *p; p = &(*p)->next) {
    struct map_node* n = *p;
    if (n->hash == h && strcmp(n->key, key) == 0) {
      void* v = n->val;
      *p = n->next;
      free(n);
      m->n--;
      return v;
    }
  }
  return NULL;
}

void map_free(struct map* m) {
  for (size_t i = 0; i < m->nb; i++) {
    for (struct map_node* n = m->b[i]; n;) {
      struct map_node* next = n->next;
      free(n);
      n = next;
    }
  }
  free(m->b);
  memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------ cache */

int cache_init(struct cache* c, int cap) {
  memset(c, 0, sizeof(*c));
  c->cap = cap;
  if (cap > 0) {
    c->slots = calloc((size_t)cap, sizeof(*c->slots));
    if (!c->slots) return -1;
  }
  return 0;
}

void cache_fini(struct cache* c) {
  for (int i = 0; i < c->nslots; i++) {
    if (!c->slots[i]) continue;
    meta_free(&c->slots[i]->m);
    free(c->slots[i]);
  }
  free(c->slots);
  map_free(&c->byname);
  memset(c, 0, sizeof(*c));
}

struct centry* cache_find(struct cache* c, const char* name) { return c->cap ? map_get(&c->byname, name) : NULL; }

void cache_touch(struct cache* c, struct centry* e) { e->last_use = ++c->tick; }

void cache_remove(struct cache* c, int slot) {
  struct centry* e = c->slots[slot];
  if (!e) return;
  map_del(&c->byname, e->m.name);
  meta_free(&e->m);
  free(e);
  c->slots[slot] = NULL;
}

int cache_insert(struct cache* c, const struct meta* m, char* evicted, size_t evsz) {
  if (evsz) evicted[0] = '\0';
  if (c->cap <= 0) return 0;
  struct centry* old = cache_find(c, m->name);
  if (old) cache_remove(c, old->slot);
  int slot = -1;
  /* The lowest free slot keeps the bit vector short; otherwise evict the LRU entry. */
  for (int i = 0; i < c->nslots; i++)
    if (!c->slots[i]) {
      slot = i;
      break;
    }
  if (slot < 0 && c->nslots < c->cap) slot = c->nslots++;
  if (slot < 0) {
    slot = 0;
    for (int i = 1; i < c->nslots; i++)
      if (c->slots[i]->last_use < c->slots[slot]->last_use) slot = i;
    if (evsz) snprintf(evicted, evsz, "%s", c->slots[slot]->m.name);
    cache_remove(c, slot);
  }
  struct centry* e = calloc(1, sizeof(*e));
  if (!e) return -1;
  if (meta_copy(&e->m, m) != 0) {
    free(e);
    return -1;
  }
  /* Counts of a response are per call; the cached entry keeps only what must match. */
  free(e->m.counts);
  e->m.counts = NULL;
  e->m.ncounts = 0;
  e->slot = slot;
  if (map_put(&c->byname, e->m.name, e) != 0) {
    meta_free(&e->m);
    free(e);
    return -1;
  }
  c->slots[slot] = e;
  cache_touch(c, e);
  return 0;
}

int cache_kind_cacheable(int kind) {
  return kind == EK_ALLREDUCE || kind == EK_BROADCAST || kind == EK_REDUCESCATTER;
}

/* A request grouped differently from the cached response renegotiates, so
 * the coordinator decides the group again. */
int cache_matches(const struct meta* a, const struct meta* b) {
  int same_group = (!a->group && !b->group) || (a->group && b->group && strcmp(a->group, b->group) == 0);
  return a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
         a->count == b->count && a->prescale == b->prescale && a->postscale == b->postscale && same_group &&
         (!a->group || a->gsize == b->gsize);
}

/* ------------------------------------------------------------ scaling */

int engine_dtype_is_float(ncclDataType_t dt) {
  return dt == ncclFloat16 || dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16 ||
         dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
}

void engine_scale(ncclDataType_t dt, void* dst, const void* src, size_t n, double f) {
  if (f == 1.0) { /* the common case: a plain copy into / out of the fusion buffer */
    if (dst != src) memcpy(dst, src, n * dtype_size(dt));
    return;
  }
  switch (dt) {
    case ncclFloat32: {
      float* d = dst;
      const float* s = src;
      float ff = (float)f;
      for (size_t i = 0; i < n; i++) d[i] = s[i] * ff;
      break;
    }
    case ncclFloat64: {
      double* d = dst;
      const double* s = src;
      for (size_t i = 0; i < n; i++) d[i] = s[i] * f;
      break;
    }
    case ncclFloat16: {
      uint16_t* d = dst;
      const uint16_t* s = src;
      for (size_t i = 0; i < n; i++) d[i] = red_float_to_half((float)(red_half_to_float(s[i]) * f));
      break;
    }
    case ncclBfloat16: {
      uint16_t* d = dst;
      const uint16_t* s = src;
      for (size_t i = 0; i < n; i++) d[i] = red_float_to_bf16((float)(red_bf16_to_float(s[i]) * f));
      break;
    }
    case ncclFloat8e4m3: {
      uint8_t* d = dst;
      const uint8_t* s = src;
      for (size_t i = 0; i < n; i++) d[i] = red_float_to_e4m3((float)(red_e4m3_to_float(s[i]) * f));
      break;
    }
    case ncclFloat8e5m2: {
      uint8_t* d = dst;
      const uint8_t* s = src;
      for (size_t i = 0; i < n; i++) d[i] = red_float_to_e5m2((float)(red_e5m2_to_float(s[i]) * f));
      break;
    }
    default:
      if (dst != src) memcpy(dst, src, n * dtype_size(dt));
      break;
  }
}
