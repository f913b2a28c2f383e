/* The coordinator of a process set (its rank 0): collects every member's
 * requests by name, checks that the members agree on each operation and
 * answers with the response list, in an order that keeps grouped allreduces
 * together; warns about and fails stalled tensors. negotiate.c feeds it the
 * gathered requests and broadcasts its answer; engine.h has the structures. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "device/reduce.h"
#include "engine/engine.h"

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

void engine_pentry_free(struct pentry* p, int n) {
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
ncclResult_t engine_coordinate(struct engine* e, struct pset* s, uint8_t* const* bufs, const uint64_t* lens,
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
      engine_pentry_free(p, n);
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
int engine_stall_scan(struct engine* e, struct pset* s, int64_t now) {
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
