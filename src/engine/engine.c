/* The engine's background thread: every cycle it takes new requests, agrees
 * with the other members of each process set on which named operations all
 * of them have submitted (one small bit-vector allreduce, plus a
 * gather-to-coordinator / broadcast exchange only when something is not in
 * the response cache) and executes them in the agreed order, fusing
 * allreduces. Only this thread uses the engine's communicators. See
 * docs/ARCHITECTURE.md, section Engine. api.c submits; util.c, timeline.c
 * and autotune.c are its parts. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "engine/engine.h"

/* Layout of the cycle's uint8 vector, reduced with ncclMin: a byte that is
 * 1 unless some rank says otherwise. "OR" bits are stored inverted. */
enum { V_EXCHANGE = 0, V_SHUTDOWN = 1, V_JOINED = 2 };
#define V_SLOT(n, i) (2 + (size_t)(n) + 3 * (size_t)(i))

static ncclRedOp_t nccl_op(int op) {
  switch (op) {
    case COLLIE_AVERAGE: return ncclAvg;
    case COLLIE_MIN: return ncclMin;
    case COLLIE_MAX: return ncclMax;
    case COLLIE_PRODUCT: return ncclProd;
    default: return ncclSum;
  }
}

static const char* op_name(int op) {
  switch (op) {
    case COLLIE_AVERAGE: return "average";
    case COLLIE_SUM: return "sum";
    case COLLIE_MIN: return "min";
    case COLLIE_MAX: return "max";
    case COLLIE_PRODUCT: return "product";
    default: return "?";
  }
}

/* Nonblocking communicators may answer ncclInProgress: wait for the outcome
 * (sleeping between polls). */
ncclResult_t engine_settle(ncclComm_t comm, ncclResult_t r) {
  while (r == ncclInProgress) {
    ncclResult_t a;
    if (ncclCommGetAsyncError(comm, &a) != ncclSuccess) return ncclInternalError;
    if (a != ncclInProgress) return a;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  return r;
}
#define NCCLRUN(comm, call) NCCLCHECK(engine_settle((comm), (call)))

/* ------------------------------------------------------------ request lists */

static void pend_unlink(struct pset* s, struct req* r) {
  if (r->prev) r->prev->next = r->next;
  else s->head = r->next;
  if (r->next) r->next->prev = r->prev;
  else s->tail = r->prev;
  r->next = r->prev = NULL;
  map_del(&s->pend, r->m.name);
}

static void pend_append(struct pset* s, struct req* r) {
  r->next = NULL;
  r->prev = s->tail;
  if (s->tail) s->tail->next = r;
  else s->head = r;
  s->tail = r;
}

/* Completes a request with a status and frees it. */
static void finish(struct engine* e, struct pset* s, struct req* r, int status, const char* err, void* result,
                   size_t result_count, size_t* counts, int ncounts, int64_t value) {
  pend_unlink(s, r);
  engine_inflight_del(e, r->set, r->m.name);
  e->stats.tensors++;
  engine_complete(e, r->handle, status, err, result, result_count, counts, ncounts, value);
  req_free(r);
}

static struct pset* find_set(struct engine* e, int id) {
  for (struct pset* s = e->sets; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

static void pentry_free(struct pentry* p, int n) {
  if (!p) return;
  for (int r = 0; r < n; r++) {
    if (!p->per[r]) continue;
    meta_free(p->per[r]);
    free(p->per[r]);
  }
  free(p->per);
  free(p);
}

static void table_unlink(struct pset* s, struct pentry* p, const char* name) {
  if (p->prev) p->prev->next = p->next;
  else s->fhead = p->next;
  if (p->next) p->next->prev = p->prev;
  else s->ftail = p->prev;
  map_del(&s->table, name);
}

/* Frees a process set's engine state (not the list link). */
void engine_pset_free(struct pset* s) {
  while (s->head) {
    struct req* r = s->head;
    pend_unlink(s, r);
    req_free(r);
  }
  map_free(&s->pend);
  while (s->fhead) {
    struct pentry* p = s->fhead;
    s->fhead = p->next;
    pentry_free(p, s->size);
  }
  map_free(&s->table);
  cache_fini(&s->cache);
  free(s->ranks);
  free(s->joined);
  free(s->joined_round);
  free(s);
}

/* ------------------------------------------------------------ coordinator */

/* Appends to a bounded message. */
static void msg_add(char* buf, size_t cap, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void msg_add(char* buf, size_t cap, const char* fmt, ...) {
  size_t len = strlen(buf);
  if (len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + len, cap - len, fmt, ap);
  va_end(ap);
}

static void fmt_value(char* out, size_t cap, const struct meta* m, int field) {
  switch (field) {
    case 0: snprintf(out, cap, "%s", engine_kind_name(m->kind)); break;
    case 1: snprintf(out, cap, "%s", dtype_name((ncclDataType_t)m->dtype)); break;
    case 2: snprintf(out, cap, "%s", op_name(m->op)); break;
    case 3: snprintf(out, cap, "%d", m->root); break;
    case 4: snprintf(out, cap, "%g", m->prescale); break;
    case 5: snprintf(out, cap, "%g", m->postscale); break;
    case 6: snprintf(out, cap, "%llu", (unsigned long long)m->count); break;
    default: {
      /* shape (all but the first dimension for allgather) / rank list */
      int from = m->kind == EK_ALLGATHER ? 1 : 0;
      size_t len = 0;
      out[0] = '\0';
      len += (size_t)snprintf(out + len, cap - len, "[");
      for (int i = from; i < m->nshape && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%lld", i > from ? ", " : "", (long long)m->shape[i]);
      if (len < cap) snprintf(out + len, cap - len, "]");
    }
  }
}

static int field_differs(const struct meta* a, const struct meta* b, int field) {
  switch (field) {
    case 0: return a->kind != b->kind;
    case 1: return a->dtype != b->dtype;
    case 2: return a->op != b->op;
    case 3: return a->root != b->root;
    case 4: return a->prescale != b->prescale;
    case 5: return a->postscale != b->postscale;
    case 6: return a->count != b->count;
    default: {
      int from = a->kind == EK_ALLGATHER ? 1 : 0;
      if (a->nshape != b->nshape) return 1;
      for (int i = from; i < a->nshape; i++)
        if (a->shape[i] != b->shape[i]) return 1;
      return 0;
    }
  }
}

static const char* const field_names[8] = {"operation", "dtype", "reduction op", "root rank", "prescale factor",
                                            "postscale factor", "element count", "shape"};

/* Which fields must agree for a kind (bit per field of field_differs). */
static unsigned fields_for(int kind) {
  switch (kind) {
    case EK_ALLREDUCE: return 1u | 2u | 4u | 16u | 32u | 64u;
    case EK_ALLGATHER: return 1u | 2u | 128u;
    case EK_BROADCAST: return 1u | 2u | 8u | 64u;
    case EK_ALLTOALL: return 1u | 2u;
    case EK_REDUCESCATTER: return 1u | 2u | 4u | 64u;
    case EK_ADD_SET:
    case EK_REMOVE_SET: return 1u | 128u;
    default: return 1u;
  }
}

/* Builds the response for a complete entry into resp (checks agreement). */
static int build_response(struct pset* s, const char* name, struct pentry* p, struct meta* resp) {
  int n = s->size, first = -1;
  for (int r = 0; r < n && first < 0; r++)
    if (p->per[r]) first = r;
  const struct meta* f = p->per[first];
  if (meta_copy(resp, f) != 0) return -1;
  free(resp->err);
  resp->err = NULL;
  char msg[2048] = "";
  unsigned fields = fields_for(f->kind);
  for (int field = 0; field < 8 && !msg[0]; field++) {
    if (!(fields & (1u << field))) continue;
    int differ = 0;
    for (int r = 0; r < n; r++)
      if (p->per[r] && field_differs(f, p->per[r], field)) differ = 1;
    if (!differ) continue;
    msg_add(msg, sizeof(msg), "collie: tensor '%s': ranks disagree on the %s:", name, field_names[field]);
    for (int r = 0; r < n; r++) {
      char v[256];
      if (!p->per[r]) continue;
      fmt_value(v, sizeof(v), p->per[r], field);
      msg_add(msg, sizeof(msg), " rank %d: %s%s", r, v, r + 1 < n ? "," : "");
    }
    if (s->id != 0) msg_add(msg, sizeof(msg), " (ranks in process set %d)", s->id);
  }
  if (!msg[0] && f->kind == EK_BROADCAST && !p->per[f->root])
    snprintf(msg, sizeof(msg), "collie: tensor '%s': broadcast root rank %d has joined and cannot send", name,
             f->root);
  if (msg[0]) {
    resp->status = COLLIE_ERR_MISMATCH;
    resp->err = strdup(msg);
    return resp->err ? 0 : -1;
  }
  if (f->kind == EK_ALLGATHER || f->kind == EK_ALLTOALL) {
    int nc = f->kind == EK_ALLGATHER ? n : n * n;
    resp->counts = calloc((size_t)nc, sizeof(uint64_t));
    if (!resp->counts) return -1;
    resp->ncounts = nc;
    for (int r = 0; r < n; r++) {
      if (!p->per[r]) continue;
      if (f->kind == EK_ALLGATHER) resp->counts[r] = p->per[r]->count;
      else
        for (int j = 0; j < n && j < p->per[r]->nshape; j++) resp->counts[(size_t)r * n + j] = (uint64_t)p->per[r]->shape[j];
    }
    /* A joined rank's row stays zero: it sends nothing (its column keeps
     * what the others send it, received and dropped). */
  }
  return 0;
}

static void ranks_list(char* out, size_t cap, struct pentry* p, int n, int want_present, const uint8_t* joined) {
  out[0] = '\0';
  int k = 0;
  for (int r = 0; r < n; r++) {
    int present = p->per[r] != NULL || (joined && joined[r]);
    if (present != want_present) continue;
    msg_add(out, cap, "%s%d", k++ ? ", " : "", r);
  }
}

static const char* pentry_name(const struct pentry* p, int n) {
  for (int r = 0; r < n; r++)
    if (p->per[r]) return p->per[r]->name;
  return "";
}

/* Every member has submitted it, or has joined. */
static int pentry_complete(const struct pset* s, const struct pentry* p) {
  for (int r = 0; r < s->size; r++)
    if (!p->per[r] && !(s->joined && s->joined[r])) return 0;
  return 1;
}

/* What the coordinator answers this cycle, in order. Grouped allreduce: a
 * tensor that any rank submitted as a member of group K belongs to K;
 * groups sharing a tensor merge (union-find over the table). A group is
 * answered when all its tensors are complete and there are at least as many
 * as any rank's group size, its members consecutively, so every rank runs
 * them in one batch; or, past the stall shutdown time of one member, failed
 * as a whole. */
struct plan {
  struct pentry** order; /* entries to answer */
  int* comp;             /* per order entry: its group (index into key), -1 none */
  uint8_t* stalled;      /* per order entry: answer with COLLIE_ERR_STALLED */
  int no;
  const char** key; /* per table index: group key of the group rooted there */
};

static void plan_free(struct plan* pl) {
  free(pl->order);
  free(pl->comp);
  free(pl->stalled);
  free(pl->key);
  memset(pl, 0, sizeof(*pl));
}

static int uf_find(int* parent, int i) {
  while (parent[i] != i) {
    parent[i] = parent[parent[i]];
    i = parent[i];
  }
  return i;
}

static int plan_build(struct engine* e, struct pset* s, struct plan* pl, int64_t now) {
  int n = s->size, np = 0, any_group = 0, rc = -1;
  memset(pl, 0, sizeof(*pl));
  for (struct pentry* p = s->fhead; p; p = p->next) {
    p->idx = np++;
    for (int r = 0; r < n && !any_group; r++)
      if (p->per[r] && p->per[r]->group) any_group = 1;
  }
  if (np == 0) return 0;
  int *parent = NULL, *need = NULL, *cnt = NULL, *state = NULL;
  uint8_t* grouped = NULL;
  struct pentry** byidx = NULL;
  struct map keys = {0};
  pl->order = malloc(sizeof(*pl->order) * (size_t)np);
  pl->comp = malloc(sizeof(int) * (size_t)np);
  pl->stalled = calloc((size_t)np, 1);
  if (!pl->order || !pl->comp || !pl->stalled) goto out;
  if (any_group) {
    parent = malloc(sizeof(int) * (size_t)np);
    need = calloc((size_t)np, sizeof(int));
    cnt = calloc((size_t)np, sizeof(int));
    state = calloc((size_t)np, sizeof(int)); /* per root: bit 1 incomplete, 2 stalled, 4 answered */
    grouped = calloc((size_t)np, 1);
    byidx = malloc(sizeof(*byidx) * (size_t)np);
    pl->key = calloc((size_t)np, sizeof(*pl->key));
    if (!parent || !need || !cnt || !state || !grouped || !byidx || !pl->key) goto out;
    for (struct pentry* p = s->fhead; p; p = p->next) {
      parent[p->idx] = p->idx;
      byidx[p->idx] = p;
    }
    for (struct pentry* p = s->fhead; p; p = p->next) {
      for (int r = 0; r < n; r++) {
        const struct meta* m = p->per[r];
        if (!m || !m->group) continue;
        grouped[p->idx] = 1;
        intptr_t j = (intptr_t)map_get(&keys, m->group);
        if (!j) {
          if (map_put(&keys, m->group, (void*)(intptr_t)(p->idx + 1)) != 0) goto out;
          continue;
        }
        int a = uf_find(parent, p->idx), b = uf_find(parent, (int)j - 1);
        if (a != b) parent[a < b ? b : a] = a < b ? a : b; /* the root is the earliest entry */
      }
    }
    for (struct pentry* p = s->fhead; p; p = p->next) {
      if (!grouped[p->idx]) continue;
      int root = uf_find(parent, p->idx);
      cnt[root]++;
      for (int r = 0; r < n; r++) {
        const struct meta* m = p->per[r];
        if (!m || !m->group) continue;
        if (m->gsize > need[root]) need[root] = m->gsize;
        if (!pl->key[root]) pl->key[root] = m->group;
      }
      if (!pentry_complete(s, p)) state[root] |= 1;
      if (e->stall_shutdown_ns > 0 && now - p->first_seen > e->stall_shutdown_ns) state[root] |= 2;
    }
  }
  for (struct pentry* p = s->fhead; p; p = p->next) {
    if (grouped && grouped[p->idx]) {
      int root = uf_find(parent, p->idx);
      if (state[root] & 4) continue;
      int ready = !(state[root] & 1) && cnt[root] >= need[root];
      if (!ready && !(state[root] & 2)) continue;
      state[root] |= 4;
      for (int i = p->idx; i < np; i++) {
        if (!grouped[i] || uf_find(parent, i) != root) continue;
        pl->order[pl->no] = byidx[i];
        pl->comp[pl->no] = root;
        pl->stalled[pl->no] = !ready;
        pl->no++;
      }
      continue;
    }
    int complete = p->nrep > 0 && pentry_complete(s, p);
    int stalled = !complete && e->stall_shutdown_ns > 0 && now - p->first_seen > e->stall_shutdown_ns;
    if (!complete && !stalled) continue;
    pl->order[pl->no] = p;
    pl->comp[pl->no] = -1;
    pl->stalled[pl->no] = (uint8_t)stalled;
    pl->no++;
  }
  rc = 0;
out:
  /* Keys point into the table's requests, which live until answered. */
  free(parent);
  free(need);
  free(cnt);
  free(state);
  free(grouped);
  free(byidx);
  map_free(&keys);
  if (rc != 0) plan_free(pl);
  return rc;
}

/* Coordinator: takes every rank's new requests, answers what is complete. */
static ncclResult_t coordinate(struct engine* e, struct pset* s, uint8_t* const* bufs, const uint64_t* lens,
                               struct wbuf* out, int64_t announce_fusion, int64_t announce_cycle) {
  int n = s->size;
  int64_t now = time_ns();
  for (int r = 0; r < n; r++) {
    struct rbuf rb = {bufs[r], lens[r], 0};
    while (rb.off < rb.len) {
      struct meta* m = malloc(sizeof(*m));
      if (!m) return err_set(ncclSystemError, "collie engine: out of memory");
      if (meta_read(&rb, m) != 0) {
        free(m);
        return err_set(ncclInternalError, "collie engine: malformed request list from rank %d of set %d", r, s->id);
      }
      struct pentry* p = map_get(&s->table, m->name);
      if (!p) {
        p = calloc(1, sizeof(*p));
        if (p) p->per = calloc((size_t)n, sizeof(*p->per));
        if (!p || !p->per || map_put(&s->table, m->name, p) != 0) {
          if (p) free(p->per);
          free(p);
          meta_free(m);
          free(m);
          return err_set(ncclSystemError, "collie engine: out of memory");
        }
        p->first_seen = now;
        p->prev = s->ftail;
        if (s->ftail) s->ftail->next = p;
        else s->fhead = p;
        s->ftail = p;
      }
      if (p->per[r]) { /* cannot happen: names are unique among a rank's pending requests */
        meta_free(m);
        free(m);
        continue;
      }
      p->per[r] = m;
      p->nrep++;
    }
  }
  uint32_t nresp = 0;
  int64_t hdr[2] = {announce_fusion, announce_cycle};
  wbuf_put(out, &nresp, sizeof(nresp));
  wbuf_put(out, hdr, sizeof(hdr));
  struct plan pl;
  if (plan_build(e, s, &pl, now) != 0) return err_set(ncclSystemError, "collie engine: out of memory");
  ncclResult_t res = ncclSuccess;
  for (int a = 0; a < pl.no && res == ncclSuccess;) {
    /* One unit: a tensor, or every member of a group (consecutive in order). */
    int b = a + 1;
    while (b < pl.no && pl.comp[b] >= 0 && pl.comp[b] == pl.comp[a]) b++;
    int unit = b - a, stalled = pl.stalled[a], fail_at = -1;
    struct meta* resp = calloc((size_t)unit, sizeof(*resp));
    if (!resp) {
      res = err_set(ncclSystemError, "collie engine: out of memory");
      break;
    }
    char gmsg[1400] = "";
    for (int k = 0; k < unit && res == ncclSuccess; k++) {
      struct pentry* p = pl.order[a + k];
      const char* name = pentry_name(p, n);
      if (!stalled && p->nrep > 0 && pentry_complete(s, p)) {
        if (build_response(s, name, p, &resp[k]) != 0) res = err_set(ncclSystemError, "collie engine: out of memory");
        else if (resp[k].status != 0 && fail_at < 0) fail_at = k;
        continue;
      }
      /* Stalled (the tensor itself, or a member of its group). */
      char msg[1400];
      if (!pentry_complete(s, p)) {
        char have[512], missing[512];
        ranks_list(have, sizeof(have), p, n, 1, s->joined);
        ranks_list(missing, sizeof(missing), p, n, 0, s->joined);
        snprintf(msg, sizeof(msg),
                 "collie: tensor '%s' stalled for %.1f s in process set %d: ranks [%s] did not submit it "
                 "(submitted by ranks [%s]); failed after COLLIE_STALL_SHUTDOWN_TIME_SECONDS",
                 name, (double)(now - p->first_seen) / 1e9, s->id, missing, have);
        WARN("%s", msg);
      } else {
        snprintf(msg, sizeof(msg), "collie: tensor '%s' fails with its group, in which a tensor stalled", name);
      }
      const struct meta* f = NULL;
      for (int r = 0; r < n && !f; r++) f = p->per[r];
      if (meta_copy(&resp[k], f) != 0) {
        res = err_set(ncclSystemError, "collie engine: out of memory");
        break;
      }
      free(resp[k].err);
      resp[k].status = COLLIE_ERR_STALLED;
      resp[k].err = strdup(msg);
      if (!gmsg[0] && !pentry_complete(s, p)) snprintf(gmsg, sizeof(gmsg), "%s", msg);
    }
    if (res == ncclSuccess && pl.comp[a] >= 0) {
      /* A group runs whole or not at all: one member's failure fails every member. */
      int status = stalled ? COLLIE_ERR_STALLED : fail_at >= 0 ? resp[fail_at].status : 0;
      if (!stalled && fail_at >= 0) snprintf(gmsg, sizeof(gmsg), "%s", resp[fail_at].err ? resp[fail_at].err : "");
      for (int k = 0; k < unit; k++) {
        free(resp[k].group);
        resp[k].group = strdup(pl.key[pl.comp[a]]);
        resp[k].gsize = unit;
        if (status == 0) continue;
        char msg[1800];
        snprintf(msg, sizeof(msg), "collie: grouped allreduce of %d tensors (with '%s') failed as a whole: %s", unit,
                 pentry_name(pl.order[a + k], n), gmsg);
        free(resp[k].err);
        resp[k].status = status;
        resp[k].err = strdup(msg);
      }
    }
    for (int k = 0; k < unit; k++) {
      if (res == ncclSuccess) {
        meta_write(out, &resp[k]);
        nresp++;
      }
      meta_free(&resp[k]);
    }
    free(resp);
    if (res != ncclSuccess) break;
    for (int k = a; k < b; k++) {
      /* The name lives in p until pentry_free, after the unlink has used it. */
      struct pentry* p = pl.order[k];
      table_unlink(s, p, pentry_name(p, n));
      pentry_free(p, n);
    }
    a = b;
  }
  plan_free(&pl);
  if (res != ncclSuccess) return res;
  if (out->oom) return err_set(ncclSystemError, "collie engine: out of memory");
  memcpy(out->p, &nresp, sizeof(nresp));
  return ncclSuccess;
}

/* Coordinator, every cycle: warns about entries that wait too long; says
 * whether some must be failed (which needs an exchange). */
static int stall_scan(struct engine* e, struct pset* s, int64_t now) {
  int want = 0;
  for (struct pentry* p = s->fhead; p; p = p->next) {
    int64_t age = now - p->first_seen;
    if (e->stall_shutdown_ns > 0 && age > e->stall_shutdown_ns) want = 1;
    if (e->stall_check_ns > 0 && age > e->stall_check_ns && now - p->last_warn > e->stall_check_ns) {
      p->last_warn = now;
      char have[512], missing[512];
      const char* name = pentry_name(p, s->size);
      ranks_list(have, sizeof(have), p, s->size, 1, s->joined);
      ranks_list(missing, sizeof(missing), p, s->size, 0, s->joined);
      WARN("collie: stall: tensor '%s' (process set %d) has waited %.1f s: submitted by ranks [%s], "
           "not yet by ranks [%s]",
           name, s->id, (double)age / 1e9, have, missing);
    }
  }
  return want;
}

/* ------------------------------------------------------------ execution */

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

/* One response to run, with the local request (NULL on a joined rank). */
struct job {
  struct meta* m;
  struct req* r;
  int from_cache;
  int done;
};

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
        finish(e, victim, victim->head, COLLIE_ERR_INVALID_ARGUMENT, "collie: the process set was removed", NULL, 0,
               NULL, 0, 0);
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

/* Moves a rank's requests that waited on an evicted cache entry back to the coordinator path. */
static void uncache_name(struct pset* s, const char* name) {
  struct req* r = map_get(&s->pend, name);
  if (r && r->state == RQ_CACHED) r->state = RQ_NEW;
}

static ncclResult_t execute(struct engine* e, struct pset* s, struct job* jobs, int nj, int64_t agreed) {
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
      if (j->r) finish(e, s, j->r, m->status, m->err ? m->err : "collie: failed", NULL, 0, NULL, 0, 0);
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
        if (group[q]->r) finish(e, s, group[q]->r, 0, NULL, NULL, 0, NULL, 0, 0);
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
        finish(e, s, j->r, 0, NULL, result, rcount, counts, ncounts, value);
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
    if (evicted[0]) uncache_name(s, evicted);
  }
  return ncclSuccess;
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

/* ------------------------------------------------------------ one round of a set */

static ncclResult_t set_round(struct engine* e, struct pset* s, int* shutdown) {
  int n = s->size, me = s->rank, coord = me == 0, world = s->id == 0;
  struct cache* c = &s->cache;
  int nsl = c->nslots;
  size_t vlen = V_SLOT(n, nsl);
  int joined_me = world && e->joined_me;
  int64_t now = time_ns();
  ncclResult_t res = ncclSuccess;
  struct job* jobs = NULL;
  struct meta* metas = NULL;
  int nj = 0, cap = 0;
  struct wbuf mine = {0}, out = {0};
  uint64_t* lens = NULL;
  uint8_t** bufs = NULL;
  uint8_t* rbytes = NULL;
  uint8_t* rel = NULL; /* per cache slot: released this cycle */

  if (vlen > e->vec_cap) {
    uint8_t* v = realloc(e->vec, vlen);
    if (!v) return err_set(ncclSystemError, "collie engine: out of memory");
    e->vec = v;
    e->vec_cap = vlen;
  }
  uint8_t* v = e->vec;
  memset(v, 1, vlen);
  for (int i = 0; i < nsl; i++) v[V_SLOT(n, i)] = (uint8_t)joined_me;
  int any_new = 0, any_group = 0;
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
  int coord_wants = 0;
  if (coord) {
    coord_wants = stall_scan(e, s, now);
    /* A cached tensor some ranks wait on for too long goes back to the
     * coordinator, which can then name the missing ranks. */
    int64_t limit = e->stall_check_ns > 0 ? e->stall_check_ns : e->stall_shutdown_ns;
    for (int i = 0; i < nsl; i++) {
      struct centry* ce = c->slots[i];
      if (ce && ce->partial_since && limit > 0 && now - ce->partial_since > limit) v[V_SLOT(n, i) + 2] = 0;
    }
    if (world && e->at.on && e->at.fusion != e->fusion) coord_wants = 1;
    if (world && e->at.on && e->at.cycle_us != e->cycle_us) coord_wants = 1;
  }
  if (any_new || coord_wants) v[V_EXCHANGE] = 0;
  if (world && e->stop_requested) v[V_SHUTDOWN] = 0;
  if (joined_me) v[V_JOINED + me] = 0;

  NCCLCHECK(engine_settle(s->comm, ncclAllReduce(v, v, vlen, ncclUint8, ncclMin, s->comm, NULL)));
  s->round++;

  int exchange = v[V_EXCHANGE] == 0;
  *shutdown = world && v[V_SHUTDOWN] == 0;
  int all_joined = world;
  if (world) {
    for (int r = 0; r < n; r++) {
      int j = v[V_JOINED + r] == 0;
      if (j && !s->joined[r]) {
        s->joined[r] = 1;
        s->joined_round[r] = s->round;
        exchange = 1; /* the coordinator may now complete tensors the joined rank will not send */
      }
      if (!j) all_joined = 0;
    }
  }

  /* Cached responses everyone has ready, in slot order. */
  cap = nsl + 16;
  jobs = calloc((size_t)cap, sizeof(*jobs));
  metas = calloc((size_t)cap, sizeof(*metas));
  if (!jobs || !metas) {
    res = err_set(ncclSystemError, "collie engine: out of memory");
    goto out;
  }
  if (nsl > 0) {
    rel = calloc((size_t)nsl, 1);
    if (!rel) {
      res = err_set(ncclSystemError, "collie engine: out of memory");
      goto out;
    }
  }
  int cached_groups = 0;
  for (int i = 0; i < nsl; i++) {
    struct centry* ce = c->slots[i];
    uint8_t* b = &v[V_SLOT(n, i)];
    if (b[2] == 0) {
      if (ce) {
        uncache_name(s, ce->m.name);
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
      if (meta_copy(&metas[nj], &o->m) != 0) {
        res = err_set(ncclSystemError, "collie engine: out of memory");
        goto out;
      }
      jobs[nj].m = &metas[nj];
      jobs[nj].from_cache = 1;
      nj++;
      cache_touch(c, o);
      if (!ce->m.group) break;
    }
  }

  if (exchange) {
    e->stats.exchanges++;
    for (struct req* r = s->head; r; r = r->next) {
      if (r->state != RQ_NEW) continue;
      meta_write(&mine, &r->m);
      r->state = RQ_REPORTED;
    }
    if (mine.oom) {
      res = err_set(ncclSystemError, "collie engine: out of memory");
      goto out;
    }
    lens = calloc((size_t)n, sizeof(uint64_t));
    bufs = calloc((size_t)n, sizeof(uint8_t*));
    if (!lens || !bufs) {
      res = err_set(ncclSystemError, "collie engine: out of memory");
      goto out;
    }
    uint64_t mylen = mine.len;
    NCCLCHECKGOTO(engine_settle(s->comm, ncclAllGather(&mylen, lens, 1, ncclUint64, s->comm, NULL)), res, out);
    uint64_t rlen = 0;
    if (coord) {
      bufs[0] = mine.p;
      NCCLCHECKGOTO(engine_settle(s->comm, ncclGroupStart()), res, out);
      for (int r = 1; r < n; r++) {
        if (!lens[r]) continue;
        bufs[r] = malloc(lens[r]);
        if (!bufs[r]) {
          ncclGroupEnd();
          res = err_set(ncclSystemError, "collie engine: out of memory");
          goto out;
        }
        ncclRecv(bufs[r], lens[r], ncclUint8, r, s->comm, NULL);
      }
      NCCLCHECKGOTO(engine_settle(s->comm, ncclGroupEnd()), res, out);
      int64_t af = -1, ac = -1;
      if (world && e->at.on) {
        af = e->at.fusion;
        ac = e->at.cycle_us;
      }
      NCCLCHECKGOTO(coordinate(e, s, bufs, lens, &out, af, ac), res, out);
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
    } else {
      rbytes = malloc(rlen);
      if (!rbytes) {
        res = err_set(ncclSystemError, "collie engine: out of memory");
        goto out;
      }
    }
    NCCLCHECKGOTO(engine_settle(s->comm, ncclBroadcast(rbytes, rbytes, rlen, ncclUint8, 0, s->comm, NULL)), res, out);
    struct rbuf rb = {rbytes, rlen, 0};
    uint32_t nresp;
    int64_t hdr[2];
    rbuf_get(&rb, &nresp, sizeof(nresp));
    rbuf_get(&rb, hdr, sizeof(hdr));
    if (hdr[0] >= 0) e->fusion = hdr[0];
    if (hdr[1] > 0) e->cycle_us = hdr[1];
    if (nresp > (1u << 24)) {
      res = err_set(ncclInternalError, "collie engine: bad response count %u", nresp);
      goto out;
    }
    if (nj + (int)nresp > cap) {
      int ncap = nj + (int)nresp;
      struct job* nj2 = realloc(jobs, sizeof(*jobs) * (size_t)ncap);
      if (nj2) jobs = nj2;
      struct meta* nm = realloc(metas, sizeof(*metas) * (size_t)ncap);
      if (nm) metas = nm;
      if (!nj2 || !nm) {
        res = err_set(ncclSystemError, "collie engine: out of memory");
        goto out;
      }
      cap = ncap;
      for (int i = 0; i < nj; i++) jobs[i].m = &metas[i];
    }
    for (uint32_t i = 0; i < nresp; i++) {
      if (meta_read(&rb, &metas[nj]) != 0) {
        res = err_set(ncclInternalError, "collie engine: malformed response list in set %d", s->id);
        goto out;
      }
      memset(&jobs[nj], 0, sizeof(jobs[nj]));
      jobs[nj].m = &metas[nj];
      nj++;
    }
  }
  for (int i = 0; i < nj; i++) jobs[i].r = map_get(&s->pend, jobs[i].m->name);
  int64_t agreed = time_ns();
  e->stats.negotiate_ns += (uint64_t)(agreed - now);
  res = execute(e, s, jobs, nj, agreed);
  if (res != ncclSuccess) goto out;

  if (world && all_joined) {
    int last = 0;
    for (int r = 1; r < n; r++)
      if (s->joined_round[r] >= s->joined_round[last]) last = r;
    for (int r = 0; r < n; r++) s->joined[r] = 0;
    e->joined_me = 0;
    pthread_mutex_lock(&e->lock);
    int h = e->join_handle;
    e->join_handle = -1;
    pthread_mutex_unlock(&e->lock);
    if (h >= 0) engine_complete(e, h, 0, NULL, NULL, 0, NULL, 0, last);
  }
out:
  free(rel);
  for (int i = 0; i < nj; i++) meta_free(&metas[i]);
  free(metas);
  free(jobs);
  if (bufs)
    for (int r = 1; r < n; r++) free(bufs[r]);
  free(bufs);
  free(lens);
  free(mine.p);
  free(out.p);
  free(rbytes);
  return res;
}

/* ------------------------------------------------------------ the thread */

/* Moves submitted requests to their sets (requests of removed sets fail). */
static void take_incoming(struct engine* e) {
  pthread_mutex_lock(&e->lock);
  struct req* list = e->in_head;
  e->in_head = e->in_tail = NULL;
  if (e->join_handle >= 0) e->joined_me = 1;
  pthread_mutex_unlock(&e->lock);
  int64_t now = time_ns();
  while (list) {
    struct req* r = list;
    list = r->next;
    r->next = r->prev = NULL;
    r->t_enq = now;
    struct pset* s = find_set(e, r->set);
    if (!s || s->rank < 0 || map_put(&s->pend, r->m.name, r) != 0) {
      engine_inflight_del(e, r->set, r->m.name);
      engine_complete(e, r->handle, COLLIE_ERR_INVALID_ARGUMENT,
                      s ? "collie: out of memory" : "collie: the process set was removed", NULL, 0, NULL, 0, 0);
      req_free(r);
      continue;
    }
    pend_append(s, r);
  }
}

static void fail_all(struct engine* e, int status, const char* why) {
  take_incoming(e);
  for (struct pset* s = e->sets; s; s = s->next)
    while (s->head) finish(e, s, s->head, status, why, NULL, 0, NULL, 0, 0);
  pthread_mutex_lock(&e->lock);
  int h = e->join_handle;
  e->join_handle = -1;
  pthread_mutex_unlock(&e->lock);
  if (h >= 0) engine_complete(e, h, status, why, NULL, 0, NULL, 0, -1);
}

static void* engine_main(void* arg) {
  struct engine* e = arg;
  log_set_rank(e->rank);
  int64_t next = time_ns();
  ncclResult_t res = ncclSuccess;
  int shutdown = 0;
  while (!shutdown) {
    pthread_mutex_lock(&e->lock);
    while (!e->stop_requested && time_ns() < next) {
      struct timespec ts = {(time_t)(next / 1000000000LL), (long)(next % 1000000000LL)};
      pthread_cond_timedwait(&e->wake, &e->lock, &ts);
    }
    pthread_mutex_unlock(&e->lock);
    int64_t start = time_ns();
    next = start + e->cycle_us * 1000;
    e->stats.cycles++;
    timeline_cycle(&e->tl, start);
    take_incoming(e);
    e->cycle_bytes = 0;
    for (struct pset* s = e->sets; s && res == ncclSuccess; s = s->next) {
      if (s->rank < 0) continue;
      int sd = 0;
      res = set_round(e, s, &sd);
      if (s->id == 0 && sd) {
        shutdown = 1;
        break; /* every rank saw the same world vector: all stop here */
      }
    }
    if (res != ncclSuccess) break;
    if (e->rank == 0 && e->at.on) autotune_cycle(&e->at, time_ns(), e->cycle_bytes);
  }
  char why[1200];
  int status;
  if (res != ncclSuccess) {
    status = COLLIE_ERR_COMMUNICATION;
    snprintf(why, sizeof(why), "collie: the engine stopped after a communication failure: %s", err_last_thread());
  } else {
    status = COLLIE_ERR_SHUTDOWN;
    snprintf(why, sizeof(why), "collie: the engine was shut down (collie_shutdown on some rank)");
  }
  pthread_mutex_lock(&e->lock);
  e->running = 0;
  e->failed_status = status;
  snprintf(e->stop_reason, sizeof(e->stop_reason), "%s", why);
  pthread_mutex_unlock(&e->lock);
  fail_all(e, status, why);
  pthread_mutex_lock(&e->lock);
  pthread_cond_broadcast(&e->done_cond);
  pthread_mutex_unlock(&e->lock);
  return NULL;
}

int engine_start_thread(struct engine* e) {
  e->running = 1;
  if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
    e->running = 0;
    return -1;
  }
  return 0;
}
