/* Execution of a round's agreed responses, identically on every member of
 * the set: allreduces fused through the fusion buffer (or reduced in place
 * when large), the other collectives, and adding or removing process sets.
 * negotiate.c produces the job list; handles complete through engine.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "engine/engine.h"

#define NCCLRUN(comm, call) NCCLCHECK(engine_settle((comm), (call)))

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
    case COLLIE_AVERAGE: return ncclAvg;
    case COLLIE_MIN: return ncclMin;
    case COLLIE_MAX: return ncclMax;
    case COLLIE_PRODUCT: return ncclProd;
    default: return ncclSum;
  }
}

static int ensure_fusion(struct engine* e, size_t bytes) {
  if (bytes <= e->fusion_cap) return 0;
  void* p = realloc(e->fusion_buf, bytes);
  if (!p) return -1;
  e->fusion_buf = p;
  e->fusion_cap = bytes;
  return 0;
}

/* What a joined rank contributes: the identity of the reduction. */
static void fill_identity(ncclDataType_t dt, int op, void* buf, size_t n) {
  size_t esz = dtype_size(dt);
  if (op == COLLIE_SUM || op == COLLIE_AVERAGE) {
    memset(buf, 0, n * esz);
    return;
  }
  uint8_t one[8];
  memset(one, 0, sizeof(one));
  double v = op == COLLIE_PRODUCT ? 1.0 : op == COLLIE_MIN ? INFINITY : -INFINITY;
  switch (dt) {
    case ncclInt8: *(int8_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? INT8_MAX : INT8_MIN; break;
    case ncclUint8: *(uint8_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? UINT8_MAX : 0; break;
    case ncclInt32: *(int32_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? INT32_MAX : INT32_MIN; break;
    case ncclUint32: *(uint32_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? UINT32_MAX : 0; break;
    case ncclInt64: *(int64_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? INT64_MAX : INT64_MIN; break;
    case ncclUint64: *(uint64_t*)one = op == COLLIE_PRODUCT ? 1 : op == COLLIE_MIN ? UINT64_MAX : 0; break;
    case ncclFloat32: *(float*)one = (float)v; break;
    case ncclFloat64: *(double*)one = v; break;
    case ncclFloat16: *(uint16_t*)one = red_float_to_half((float)v); break;
    case ncclBfloat16: *(uint16_t*)one = red_float_to_bf16((float)v); break;
    case ncclFloat8e4m3: *(uint8_t*)one = red_float_to_e4m3((float)v); break;
    case ncclFloat8e5m2: *(uint8_t*)one = red_float_to_e5m2((float)v); break;
    default: break;
  }
  for (size_t i = 0; i < n; i++) memcpy((char*)buf + i * esz, one, esz);
}

static const char* phase_name(int kind) {
  switch (kind) {
    case EK_ALLREDUCE: return "ALLREDUCE";
    case EK_ALLGATHER: return "ALLGATHER";
    case EK_BROADCAST: return "BROADCAST";
    case EK_ALLTOALL: return "ALLTOALL";
    case EK_REDUCESCATTER: return "REDUCESCATTER";
    case EK_BARRIER: return "BARRIER";
    default: return "PROCESS_SET";
  }
}

static void tl_negotiated(struct engine* e, struct job* j, int64_t agreed, int64_t start) {
  if (!j->r || !timeline_active(&e->tl)) return;
  timeline_span(&e->tl, j->m->name, "NEGOTIATE", j->r->t_enq, agreed);
  timeline_span(&e->tl, j->m->name, "QUEUE", agreed, start);
}

/* Allreduces one tensor where it is: in the request's buffers, or (joined
 * rank, r NULL) as identity values in scratch, which holds m->count elements. */
static ncclResult_t reduce_own(struct engine* e, struct pset* s, const struct meta* m, struct req* r, void* scratch) {
  ncclDataType_t dt = (ncclDataType_t)m->dtype;
  int64_t t0 = time_ns();
  void* dst = r ? r->recvbuf : scratch;
  const void* src = r ? r->sendbuf : dst;
  if (!r) fill_identity(dt, m->op, dst, m->count);
  else if (m->prescale != 1.0) {
    engine_scale(dt, dst, src, m->count, m->prescale);
    src = dst;
  }
  if (m->count) NCCLRUN(s->comm, ncclAllReduce(src, dst, m->count, dt, nccl_op(m->op), s->comm, NULL));
  if (r && m->postscale != 1.0) engine_scale(dt, dst, dst, m->count, m->postscale);
  if (r) timeline_span(&e->tl, m->name, "ALLREDUCE", t0, time_ns());
  return ncclSuccess;
}

static ncclResult_t run_allreduce(struct engine* e, struct pset* s, struct job** g, int k, int64_t agreed) {
  struct meta* m = g[0]->m;
  ncclDataType_t dt = (ncclDataType_t)m->dtype;
  size_t esz = dtype_size(dt);
  size_t total = 0;
  for (int i = 0; i < k; i++) total += g[i]->m->count;
  int64_t t0 = time_ns();
  for (int i = 0; i < k; i++) tl_negotiated(e, g[i], agreed, t0);
  e->stats.collectives++;
  e->stats.bytes_reduced += total * esz;
  e->cycle_bytes += (int64_t)(total * esz);
  if (k == 1) {
    if (!g[0]->r && ensure_fusion(e, total * esz) != 0)
      return err_set(ncclSystemError, "collie engine: out of memory");
    return reduce_own(e, s, m, g[0]->r, e->fusion_buf);
  }
  /* Small tensors are packed into the fusion buffer and reduced with one
   * call; tensors of at least fusion_inplace bytes are reduced in their own
   * buffers, one call each in the same batch: on host memory, copying them in
   * and out costs more than the calls it saves. The split depends only on
   * agreed sizes, so every rank issues the same calls. A joined rank reduces
   * identity values from a scratch region after the packed ones. */
  size_t inplace_min = e->fusion_inplace > 0 ? (size_t)e->fusion_inplace : SIZE_MAX;
  size_t packed_bytes = 0, scratch = 0;
  for (int i = 0; i < k; i++) {
    size_t bytes = g[i]->m->count * esz;
    if (bytes < inplace_min) packed_bytes += bytes;
    else if (!g[i]->r && bytes > scratch) scratch = bytes;
  }
  if (ensure_fusion(e, packed_bytes + scratch) != 0) return err_set(ncclSystemError, "collie engine: out of memory");
  char* fb = e->fusion_buf;
  size_t off = 0;
  for (int i = 0; i < k; i++) {
    struct meta* mi = g[i]->m;
    struct req* ri = g[i]->r;
    size_t bytes = mi->count * esz;
    if (bytes >= inplace_min) {
      NCCLCHECK(reduce_own(e, s, mi, ri, fb + packed_bytes));
      continue;
    }
    int64_t a = time_ns();
    if (ri) engine_scale(dt, fb + off, ri->sendbuf, mi->count, mi->prescale);
    else fill_identity(dt, mi->op, fb + off, mi->count);
    if (ri) timeline_span(&e->tl, mi->name, "MEMCPY_IN_FUSION_BUFFER", a, time_ns());
    off += bytes;
  }
  e->stats.fused_tensors += (uint64_t)k;
  if (packed_bytes == 0) return ncclSuccess;
  int64_t t1 = time_ns();
  NCCLRUN(s->comm, ncclAllReduce(fb, fb, packed_bytes / esz, dt, nccl_op(m->op), s->comm, NULL));
  int64_t t2 = time_ns();
  off = 0;
  for (int i = 0; i < k; i++) {
    struct meta* mi = g[i]->m;
    size_t bytes = mi->count * esz;
    if (bytes >= inplace_min) continue;
    if (g[i]->r) {
      timeline_span(&e->tl, mi->name, "ALLREDUCE", t1, t2);
      int64_t a = time_ns();
      engine_scale(dt, g[i]->r->recvbuf, fb + off, mi->count, mi->postscale);
      timeline_span(&e->tl, mi->name, "MEMCPY_OUT_FUSION_BUFFER", a, time_ns());
    }
    off += bytes;
  }
  return ncclSuccess;
}

/* Runs a non-allreduce operation; on success *result etc. are set for the handle. */
static ncclResult_t run_other(struct engine* e, struct pset* s, struct job* j, void** result, size_t* rcount,
                              size_t** counts, int* ncounts, int64_t* value) {
  struct meta* m = j->m;
  struct req* r = j->r;
  ncclDataType_t dt = (ncclDataType_t)m->dtype;
  size_t esz = dtype_size(dt);
  int n = s->size, me = s->rank;
  ncclResult_t res = ncclSuccess;
  void* tmp = NULL;
  void* tmp2 = NULL;
  switch (m->kind) {
    case EK_BARRIER: break; /* negotiation itself proved every rank got here */
    case EK_BROADCAST: {
      void* buf = r ? r->recvbuf : NULL;
      if (!buf && m->count) {
        if (ensure_fusion(e, m->count * esz) != 0) return err_set(ncclSystemError, "collie engine: out of memory");
        buf = e->fusion_buf;
      }
      if (m->count) NCCLRUN(s->comm, ncclBroadcast(buf, buf, m->count, dt, m->root, s->comm, NULL));
      break;
    }
    case EK_ALLGATHER: {
      if (m->ncounts != n) return err_set(ncclInternalError, "collie engine: allgather response without counts");
      size_t total = 0, maxc = 0, mine = m->counts[me];
      int equal = 1;
      for (int q = 0; q < n; q++) {
        total += m->counts[q];
        maxc = COLLIE_MAX(maxc, m->counts[q]);
        if (m->counts[q] != m->counts[0]) equal = 0;
      }
      *result = malloc(total ? total * esz : 1);
      *counts = calloc((size_t)n, sizeof(size_t));
      if (!*result || !*counts) goto oom;
      for (int q = 0; q < n; q++) (*counts)[q] = m->counts[q];
      *ncounts = n;
      *rcount = total;
      if (maxc == 0) break;
      if (equal) {
        NCCLCHECKGOTO(engine_settle(s->comm, ncclAllGather(r->sendbuf, *result, maxc, dt, s->comm, NULL)), res, fail);
        break;
      }
      /* Unequal counts: pad every rank to the largest, gather, then close the gaps. */
      tmp = calloc(maxc * (size_t)n, esz);
      tmp2 = calloc(maxc, esz);
      if (!tmp || !tmp2) goto oom;
      if (mine) memcpy(tmp2, r->sendbuf, mine * esz);
      NCCLCHECKGOTO(engine_settle(s->comm, ncclAllGather(tmp2, tmp, maxc, dt, s->comm, NULL)), res, fail);
      size_t off = 0;
      for (int q = 0; q < n; q++) {
        memcpy((char*)*result + off * esz, (char*)tmp + (size_t)q * maxc * esz, m->counts[q] * esz);
        off += m->counts[q];
      }
      break;
    }
    case EK_ALLTOALL: {
      if (m->ncounts != n * n) return err_set(ncclInternalError, "collie engine: alltoall response without counts");
      const uint64_t* row = m->counts + (size_t)me * n;
      /* A joined rank (no request) sends nothing and receives what the
       * others address to it into a result that is then dropped. */
      const char* sendbuf = r ? r->sendbuf : NULL;
      for (int q = 0; q < n && !r; q++)
        if (row[q]) return err_set(ncclInternalError, "collie engine: alltoall '%s' asks a joined rank to send", m->name);
      size_t total = 0;
      for (int q = 0; q < n; q++) total += m->counts[(size_t)q * n + me];
      *result = malloc(total ? total * esz : 1);
      *counts = calloc((size_t)n, sizeof(size_t));
      if (!*result || !*counts) goto oom;
      *ncounts = n;
      *rcount = total;
      size_t soff = 0, roff = 0;
      NCCLCHECKGOTO(engine_settle(s->comm, ncclGroupStart()), res, fail);
      for (int q = 0; q < n; q++) {
        size_t in = m->counts[(size_t)q * n + me];
        (*counts)[q] = in;
        if (q == me) {
          if (in) memcpy((char*)*result + roff * esz, sendbuf + soff * esz, in * esz);
        } else {
          if (row[q]) ncclSend(sendbuf + soff * esz, row[q], dt, q, s->comm, NULL);
          if (in) ncclRecv((char*)*result + roff * esz, in, dt, q, s->comm, NULL);
        }
        soff += row[q];
        roff += in;
      }
      NCCLCHECKGOTO(engine_settle(s->comm, ncclGroupEnd()), res, fail);
      break;
    }
    case EK_REDUCESCATTER: {
      size_t base = m->count / (size_t)n, rem = m->count % (size_t)n;
      size_t maxc = base + (rem ? 1 : 0);
      size_t mine = base + ((size_t)me < rem ? 1 : 0);
      const void* send = r ? r->sendbuf : NULL;
      if (!r) {
        tmp2 = malloc(m->count ? m->count * esz : 1);
        if (!tmp2) goto oom;
        fill_identity(dt, m->op, tmp2, m->count);
        send = tmp2;
      }
      *result = malloc(maxc ? maxc * esz : 1);
      *counts = calloc((size_t)n, sizeof(size_t));
      if (!*result || !*counts) goto oom;
      for (int q = 0; q < n; q++) (*counts)[q] = base + ((size_t)q < rem ? 1 : 0);
      *ncounts = n;
      *rcount = mine;
      e->stats.bytes_reduced += m->count * esz;
      if (maxc == 0) break;
      if (rem == 0) {
        NCCLCHECKGOTO(engine_settle(s->comm, ncclReduceScatter(send, *result, base, dt, nccl_op(m->op), s->comm, NULL)), res,
                      fail);
        break;
      }
      /* Horovod's split is uneven: pad each rank's block to the largest. */
      tmp = malloc(maxc * (size_t)n * esz);
      if (!tmp) goto oom;
      size_t off = 0;
      for (int q = 0; q < n; q++) {
        size_t c = (*counts)[q];
        memcpy((char*)tmp + (size_t)q * maxc * esz, (const char*)send + off * esz, c * esz);
        if (c < maxc) fill_identity(dt, m->op, (char*)tmp + ((size_t)q * maxc + c) * esz, maxc - c);
        off += c;
      }
      NCCLCHECKGOTO(engine_settle(s->comm, ncclReduceScatter(tmp, *result, maxc, dt, nccl_op(m->op), s->comm, NULL)), res,
                    fail);
      break;
    }
    case EK_ADD_SET: {
      int member = -1;
      for (int i = 0; i < m->nshape; i++)
        if (m->shape[i] == e->rank) member = i;
      struct pset* ns = calloc(1, sizeof(*ns));
      if (!ns) goto oom;
      ns->ranks = malloc(sizeof(int) * (size_t)m->nshape);
      if (!ns->ranks || cache_init(&ns->cache, e->cache_cap) != 0) {
        free(ns->ranks);
        free(ns);
        goto oom;
      }
      for (int i = 0; i < m->nshape; i++) ns->ranks[i] = (int)m->shape[i];
      ns->size = m->nshape;
      ns->rank = member;
      ncclComm_t c = NULL;
      res = engine_settle(e->world, ncclCommSplit(e->world, member >= 0 ? 0 : NCCL_SPLIT_NOCOLOR, e->rank, &c, NULL));
      if (res != ncclSuccess) {
        engine_pset_free(ns);
        goto fail;
      }
      ns->comm = c;
      pthread_mutex_lock(&e->lock);
      ns->id = e->next_set_id++;
      struct pset** pp = &e->sets;
      while (*pp) pp = &(*pp)->next;
      *pp = ns;
      pthread_mutex_unlock(&e->lock);
      *value = ns->id;
      INFO(LOG_INIT, "collie engine: process set %d of %d ranks (this rank %d in it)", ns->id, ns->size, member);
      break;
    }
    case EK_REMOVE_SET: {
      int id = m->nshape == 1 ? (int)m->shape[0] : -1;
      pthread_mutex_lock(&e->lock);
      struct pset** pp = &e->sets;
      while (*pp && (*pp)->id != id) pp = &(*pp)->next;
      struct pset* victim = id > 0 ? *pp : NULL;
      if (victim) *pp = victim->next;
      pthread_mutex_unlock(&e->lock);
      if (!victim) break;
      while (victim->head)
        engine_finish(e, victim, victim->head, COLLIE_ERR_INVALID_ARGUMENT, "collie: the process set was removed",
                      NULL, 0, NULL, 0, 0);
      if (victim->comm) ncclCommDestroy(victim->comm);
      engine_pset_free(victim);
      break;
    }
    default: break;
  }
  free(tmp);
  free(tmp2);
  return ncclSuccess;
oom:
  res = err_set(ncclSystemError, "collie engine: out of memory running %s '%s'", engine_kind_name(m->kind), m->name);
fail:
  free(tmp);
  free(tmp2);
  free(*result);
  free(*counts);
  *result = NULL;
  *counts = NULL;
  return res;
}

static int fusable(const struct meta* a, const struct meta* b) {
  return b->kind == EK_ALLREDUCE && b->status == 0 && a->dtype == b->dtype && a->op == b->op &&
         a->prescale == b->prescale && a->postscale == b->postscale;
}

ncclResult_t engine_execute(struct engine* e, struct pset* s, struct job* jobs, int nj, int64_t agreed) {
  struct job** group = NULL;
  if (nj > 0) {
    group = malloc(sizeof(*group) * (size_t)nj);
    if (!group) return err_set(ncclSystemError, "collie engine: out of memory");
  }
  ncclResult_t res = ncclSuccess;
  /* Counted before any handle completes, so a waiter sees them. */
  for (int i = 0; i < nj; i++) {
    if (!jobs[i].r || jobs[i].m->status != 0) continue;
    if (jobs[i].from_cache) e->stats.cache_hits++;
    else e->stats.cache_misses++;
  }
  for (int i = 0; i < nj && res == ncclSuccess; i++) {
    struct job* j = &jobs[i];
    if (j->done) continue;
    struct meta* m = j->m;
    if (m->status != 0) {
      if (j->r) engine_finish(e, s, j->r, m->status, m->err ? m->err : "collie: failed", NULL, 0, NULL, 0, 0);
      j->done = 1;
      continue;
    }
    if (!j->r && !(s->joined && s->joined[s->rank])) {
      res = err_set(ncclInternalError, "collie engine: response for '%s' that this rank never submitted", m->name);
      break;
    }
    if (m->kind == EK_ALLREDUCE) {
      int k = 0;
      size_t esz = dtype_size((ncclDataType_t)m->dtype), bytes = 0;
      group[k++] = j;
      bytes = m->count * esz;
      if (e->fusion > 0) {
        for (int q = i + 1; q < nj; q++) {
          struct job* o = &jobs[q];
          if (o->done || !fusable(m, o->m)) continue;
          if (!o->r && !(s->joined && s->joined[s->rank])) continue;
          size_t b = o->m->count * esz;
          if (bytes + b > (size_t)e->fusion) continue;
          bytes += b;
          group[k++] = o;
        }
      }
      res = run_allreduce(e, s, group, k, agreed);
      if (res != ncclSuccess) break;
      for (int q = 0; q < k; q++) {
        group[q]->done = 1;
        if (group[q]->r) engine_finish(e, s, group[q]->r, 0, NULL, NULL, 0, NULL, 0, 0);
      }
    } else {
      void* result = NULL;
      size_t rcount = 0;
      size_t* counts = NULL;
      int ncounts = 0;
      int64_t value = 0;
      int64_t t0 = time_ns();
      tl_negotiated(e, j, agreed, t0);
      res = run_other(e, s, j, &result, &rcount, &counts, &ncounts, &value);
      if (res != ncclSuccess) break;
      if (j->r) {
        timeline_span(&e->tl, m->name, phase_name(m->kind), t0, time_ns());
        engine_finish(e, s, j->r, 0, NULL, result, rcount, counts, ncounts, value);
      } else {
        free(result);
        free(counts);
      }
      j->done = 1;
    }
  }
  free(group);
  if (res != ncclSuccess) return res;
  /* The cache learns in the agreed order, on every member alike. */
  for (int i = 0; i < nj; i++) {
    struct job* j = &jobs[i];
    if (j->from_cache) continue;
    if (j->m->status != 0 || !cache_kind_cacheable(j->m->kind) || s->cache.cap <= 0) continue;
    char evicted[4096];
    if (cache_insert(&s->cache, j->m, evicted, sizeof(evicted)) != 0)
      return err_set(ncclSystemError, "collie engine: out of memory in the response cache");
    if (evicted[0]) engine_uncache_name(s, evicted);
  }
  return ncclSuccess;
}
