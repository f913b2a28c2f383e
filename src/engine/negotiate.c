/* One round of negotiation for a process set: this rank's view of the
 * response cache and its flags go into one small vector allreduce; cache
 * entries every rank has ready are released, and when some rank has an
 * uncached request the requests go to the coordinator (coordinator.c) and its
 * response list comes back. The result is a job list for execute.c. The
 * cache changes only in agreed ways, so it stays identical on every member. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Layout of the cycle's uint8 vector, reduced with ncclMin: a byte that is
 * 1 unless some rank says otherwise. "OR" bits are stored inverted. */
enum { V_EXCHANGE = 0, V_SHUTDOWN = 1, V_JOINED = 2 };
#define V_SLOT(n, i) (2 + (size_t)(n) + 3 * (size_t)(i))

void engine_joblist_free(struct joblist* jl) {
  for (int i = 0; i < jl->n; i++) meta_free(&jl->metas[i]);
  free(jl->metas);
  free(jl->jobs);
  memset(jl, 0, sizeof(*jl));
}

/* Room for want jobs (their metas' addresses may move: jobs are re-pointed). */
static int joblist_reserve(struct joblist* jl, int want) {
  if (want <= jl->cap) return 0;
  struct job* j = realloc(jl->jobs, sizeof(*j) * (size_t)want);
  if (j) jl->jobs = j;
  struct meta* m = realloc(jl->metas, sizeof(*m) * (size_t)want);
  if (m) jl->metas = m;
  if (!j || !m) return -1;
  jl->cap = want;
  for (int i = 0; i < jl->n; i++) jl->jobs[i].m = &jl->metas[i];
  return 0;
}

/* Appends the job whose meta (metas[n]) the caller has just filled. */
static void joblist_push(struct joblist* jl, int from_cache) {
  struct job* j = &jl->jobs[jl->n];
  memset(j, 0, sizeof(*j));
  j->m = &jl->metas[jl->n];
  j->from_cache = from_cache;
  jl->n++;
}

/* Moves a rank's requests that waited on an evicted cache entry back to the coordinator path. */
void engine_uncache_name(struct pset* s, const char* name) {
  struct req* r = map_get(&s->pend, name);
  if (r && r->state == RQ_CACHED) r->state = RQ_NEW;
}

/* A rank's grouped request uses the cache only when every member of its
 * group does: otherwise all of them go to the coordinator, which then sees
 * the whole group (no member runs from the cache while another is renegotiated). */
static void group_uncache(struct pset* s) {
  struct map open = {0};
  int oom = 0;
  for (struct req* r = s->head; r; r = r->next)
    if (r->m.group && r->state != RQ_CACHED && map_put(&open, r->m.group, r) != 0) oom = 1;
  for (struct req* r = s->head; r; r = r->next)
    if (r->m.group && r->state == RQ_CACHED && (oom || map_get(&open, r->m.group))) r->state = RQ_NEW;
  map_free(&open);
}

/* Clears rel[] for cached group members whose group is not entirely ready. */
static int cache_hold_groups(struct cache* c, uint8_t* rel) {
  struct map ready = {0};
  for (int i = 0; i < c->nslots; i++) {
    struct centry* ce = c->slots[i];
    if (!rel[i] || !ce->m.group) continue;
    intptr_t k = (intptr_t)map_get(&ready, ce->m.group);
    if (map_put(&ready, ce->m.group, (void*)(k + 1)) != 0) {
      map_free(&ready);
      return -1;
    }
  }
  for (int i = 0; i < c->nslots; i++) {
    struct centry* ce = c->slots[i];
    if (rel[i] && ce->m.group && (intptr_t)map_get(&ready, ce->m.group) < ce->m.gsize) rel[i] = 0;
  }
  map_free(&ready);
  return 0;
}

/* ------------------------------------------------------------ the vector */

/* Marks requests that a matching cache entry answers and sets their "ready"
 * bits; a cache entry that no longer matches is voted stale. Returns whether
 * some request must go to the coordinator. */
static int vec_mark_cached(struct pset* s, uint8_t* v) {
  int n = s->size, any_new = 0, any_group = 0;
  struct cache* c = &s->cache;
  for (struct req* r = s->head; r; r = r->next) {
    struct centry* ce = cache_find(c, r->m.name);
    if (r->state == RQ_NEW && ce) {
      if (cache_matches(&ce->m, &r->m)) r->state = RQ_CACHED;
      else v[V_SLOT(n, ce->slot) + 2] = 0; /* stale entry: everyone drops it, then it renegotiates */
    }
    if (r->m.group) any_group = 1;
  }
  if (any_group) group_uncache(s);
  for (struct req* r = s->head; r; r = r->next) {
    struct centry* ce = r->state == RQ_CACHED ? cache_find(c, r->m.name) : NULL;
    if (r->state == RQ_NEW) any_new = 1;
    if (r->state == RQ_CACHED && ce) {
      v[V_SLOT(n, ce->slot)] = 1;
      v[V_SLOT(n, ce->slot) + 1] = 0;
    }
  }
  return any_new;
}

/* Coordinator only: votes stale the cached tensors some ranks have waited on
 * too long (renegotiated, the coordinator can name the missing ranks);
 * returns whether it needs an exchange (stalled tensors to fail, autotuned
 * values to announce). */
static int vec_coordinator_votes(struct engine* e, struct pset* s, uint8_t* v, int64_t now) {
  struct cache* c = &s->cache;
  int n = s->size, world = s->id == 0;
  int wants = engine_stall_scan(e, s, now);
  int64_t limit = e->stall_check_ns > 0 ? e->stall_check_ns : e->stall_shutdown_ns;
  for (int i = 0; i < c->nslots; i++) {
    struct centry* ce = c->slots[i];
    if (ce && ce->partial_since && limit > 0 && now - ce->partial_since > limit) v[V_SLOT(n, i) + 2] = 0;
  }
  if (world && e->at.on && e->at.fusion != e->fusion) wants = 1;
  if (world && e->at.on && e->at.cycle_us != e->cycle_us) wants = 1;
  return wants;
}

/* Fills e->vec with this rank's view; *vlen is its length. */
static ncclResult_t vec_fill(struct engine* e, struct pset* s, int64_t now, size_t* vlen) {
  int n = s->size, me = s->rank, world = s->id == 0;
  int nsl = s->cache.nslots;
  int joined_me = world && e->joined_me;
  *vlen = V_SLOT(n, nsl);
  if (*vlen > e->vec_cap) {
    uint8_t* v = realloc(e->vec, *vlen);
    if (!v) return err_set(ncclSystemError, "collie engine: out of memory");
    e->vec = v;
    e->vec_cap = *vlen;
  }
  uint8_t* v = e->vec;
  memset(v, 1, *vlen);
  for (int i = 0; i < nsl; i++) v[V_SLOT(n, i)] = (uint8_t)joined_me;
  int any_new = vec_mark_cached(s, v);
  int coord_wants = me == 0 ? vec_coordinator_votes(e, s, v, now) : 0;
  if (any_new || coord_wants) v[V_EXCHANGE] = 0;
  if (world && e->stop_requested) v[V_SHUTDOWN] = 0;
  if (joined_me) v[V_JOINED + me] = 0;
  return ncclSuccess;
}

/* Reads the reduced vector's flags; records ranks that joined this round. */
static void vec_read_flags(struct pset* s, const uint8_t* v, struct agreement* ag) {
  int n = s->size, world = s->id == 0;
  ag->exchange = v[V_EXCHANGE] == 0;
  ag->shutdown = world && v[V_SHUTDOWN] == 0;
  ag->all_joined = world;
  if (!world) return;
  for (int r = 0; r < n; r++) {
    int j = v[V_JOINED + r] == 0;
    if (j && !s->joined[r]) {
      s->joined[r] = 1;
      s->joined_round[r] = s->round;
      ag->exchange = 1; /* the coordinator may now complete tensors the joined rank will not send */
    }
    if (!j) ag->all_joined = 0;
  }
}

/* ------------------------------------------------------------ the cache's part */

/* Drops the entries voted stale and queues, in slot order, the cached
 * responses every rank has ready (the members of a group together). */
static ncclResult_t cache_release(struct pset* s, const uint8_t* v, int64_t now, struct joblist* jl) {
  struct cache* c = &s->cache;
  int n = s->size, nsl = c->nslots, cached_groups = 0;
  ncclResult_t res = ncclSuccess;
  if (nsl == 0) return ncclSuccess;
  uint8_t* rel = calloc((size_t)nsl, 1); /* per cache slot: released this round */
  if (!rel || joblist_reserve(jl, jl->n + nsl) != 0) {
    free(rel);
    return err_set(ncclSystemError, "collie engine: out of memory");
  }
  for (int i = 0; i < nsl; i++) {
    struct centry* ce = c->slots[i];
    const uint8_t* b = &v[V_SLOT(n, i)];
    if (b[2] == 0) {
      if (ce) {
        engine_uncache_name(s, ce->m.name);
        cache_remove(c, i);
      }
      continue;
    }
    if (!ce) continue;
    int all = b[0] == 1, any = b[1] == 0;
    rel[i] = (uint8_t)(all && any);
    if (rel[i] && ce->m.group) cached_groups = 1;
    ce->partial_since = any && !all ? (ce->partial_since ? ce->partial_since : now) : 0;
  }
  /* A cached group runs only when every member is ready on every rank (the
   * cache and the vector are the same everywhere, so all ranks decide alike). */
  if (cached_groups && cache_hold_groups(c, rel) != 0) {
    res = err_set(ncclSystemError, "collie engine: out of memory");
    goto out;
  }
  for (int i = 0; i < nsl; i++) {
    if (!rel[i]) continue;
    struct centry* ce = c->slots[i];
    /* The members of a group are queued together so one batch fuses them. */
    for (int q = i; q < nsl; q++) {
      struct centry* o = c->slots[q];
      if (!rel[q] || (q != i && (!ce->m.group || !o->m.group || strcmp(o->m.group, ce->m.group) != 0))) continue;
      rel[q] = 0;
      if (meta_copy(&jl->metas[jl->n], &o->m) != 0) {
        res = err_set(ncclSystemError, "collie engine: out of memory");
        goto out;
      }
      joblist_push(jl, 1);
      cache_touch(c, o);
      if (!ce->m.group) break;
    }
  }
out:
  free(rel);
  return res;
}

/* ------------------------------------------------------------ the exchange */

/* Coordinator: receives the request lists of the ranks that have any. */
static ncclResult_t gather_requests(struct pset* s, const uint64_t* lens, uint8_t** bufs) {
  NCCLCHECK(engine_settle(s->comm, ncclGroupStart()));
  for (int r = 1; r < s->size; r++) {
    if (!lens[r]) continue;
    bufs[r] = malloc(lens[r]);
    if (!bufs[r]) {
      ncclGroupEnd();
      return err_set(ncclSystemError, "collie engine: out of memory");
    }
    ncclRecv(bufs[r], lens[r], ncclUint8, r, s->comm, NULL);
  }
  NCCLCHECK(engine_settle(s->comm, ncclGroupEnd()));
  return ncclSuccess;
}

/* Parses the coordinator's answer: announced configuration, then responses
 * appended to jl. */
static ncclResult_t read_responses(struct engine* e, struct pset* s, const uint8_t* bytes, uint64_t len,
                                   struct joblist* jl) {
  struct rbuf rb = {bytes, len, 0};
  uint32_t nresp;
  int64_t hdr[2];
  rbuf_get(&rb, &nresp, sizeof(nresp));
  rbuf_get(&rb, hdr, sizeof(hdr));
  if (hdr[0] >= 0) e->fusion = hdr[0];
  if (hdr[1] > 0) e->cycle_us = hdr[1];
  if (nresp > (1u << 24)) return err_set(ncclInternalError, "collie engine: bad response count %u", nresp);
  if (joblist_reserve(jl, jl->n + (int)nresp) != 0) return err_set(ncclSystemError, "collie engine: out of memory");
  for (uint32_t i = 0; i < nresp; i++) {
    if (meta_read(&rb, &jl->metas[jl->n]) != 0)
      return err_set(ncclInternalError, "collie engine: malformed response list in set %d", s->id);
    joblist_push(jl, 0);
  }
  return ncclSuccess;
}

/* Every rank's new requests to the coordinator (lengths by allgather, lists
 * by grouped send/recv), its response list back to all (length, then bytes,
 * by broadcast). */
static ncclResult_t exchange(struct engine* e, struct pset* s, struct joblist* jl) {
  int n = s->size, coord = s->rank == 0, world = s->id == 0;
  ncclResult_t res = ncclSuccess;
  struct wbuf mine = {0}, out = {0};
  uint64_t* lens = NULL;
  uint8_t** bufs = NULL;
  uint8_t* rbytes = NULL;
  uint64_t rlen = 0;
  e->stats.exchanges++;
  for (struct req* r = s->head; r; r = r->next) {
    if (r->state != RQ_NEW) continue;
    meta_write(&mine, &r->m);
    r->state = RQ_REPORTED;
  }
  lens = calloc((size_t)n, sizeof(uint64_t));
  bufs = calloc((size_t)n, sizeof(uint8_t*));
  if (mine.oom || !lens || !bufs) {
    res = err_set(ncclSystemError, "collie engine: out of memory");
    goto out;
  }
  uint64_t mylen = mine.len;
  NCCLCHECKGOTO(engine_settle(s->comm, ncclAllGather(&mylen, lens, 1, ncclUint64, s->comm, NULL)), res, out);
  if (coord) {
    bufs[0] = mine.p;
    NCCLCHECKGOTO(gather_requests(s, lens, bufs), res, out);
    int64_t af = -1, ac = -1;
    if (world && e->at.on) {
      af = e->at.fusion;
      ac = e->at.cycle_us;
    }
    NCCLCHECKGOTO(engine_coordinate(e, s, bufs, lens, &out, af, ac), res, out);
    rlen = out.len;
  } else if (mylen) {
    NCCLCHECKGOTO(engine_settle(s->comm, ncclSend(mine.p, mylen, ncclUint8, 0, s->comm, NULL)), res, out);
  }
  NCCLCHECKGOTO(engine_settle(s->comm, ncclBroadcast(&rlen, &rlen, 1, ncclUint64, 0, s->comm, NULL)), res, out);
  if (rlen < sizeof(uint32_t) + 2 * sizeof(int64_t) || rlen > ((uint64_t)1 << 34)) {
    res = err_set(ncclInternalError, "collie engine: bad response length %llu", (unsigned long long)rlen);
    goto out;
  }
  if (coord) {
    rbytes = out.p;
    out.p = NULL;
  } else if (!(rbytes = malloc(rlen))) {
    res = err_set(ncclSystemError, "collie engine: out of memory");
    goto out;
  }
  NCCLCHECKGOTO(engine_settle(s->comm, ncclBroadcast(rbytes, rbytes, rlen, ncclUint8, 0, s->comm, NULL)), res, out);
  res = read_responses(e, s, rbytes, rlen, jl);
out:
  if (bufs)
    for (int r = 1; r < n; r++) free(bufs[r]);
  free(bufs);
  free(lens);
  free(mine.p);
  free(out.p);
  free(rbytes);
  return res;
}

/* ------------------------------------------------------------ one round */

ncclResult_t engine_negotiate(struct engine* e, struct pset* s, int64_t now, struct joblist* jl,
                              struct agreement* ag) {
  size_t vlen;
  memset(ag, 0, sizeof(*ag));
  NCCLCHECK(vec_fill(e, s, now, &vlen));
  NCCLCHECK(engine_settle(s->comm, ncclAllReduce(e->vec, e->vec, vlen, ncclUint8, ncclMin, s->comm, NULL)));
  s->round++;
  vec_read_flags(s, e->vec, ag);
  NCCLCHECK(cache_release(s, e->vec, now, jl));
  if (ag->exchange) NCCLCHECK(exchange(e, s, jl));
  for (int i = 0; i < jl->n; i++) jl->jobs[i].r = map_get(&s->pend, jl->jobs[i].m->name);
  return ncclSuccess;
}
