/* The elastic layer's state in an etcd cluster (backend.h): each worker runs
 * the rendezvous rules of store.c itself against etcd's v3 JSON gateway,
 * answering elastic.c's requests (proto.h) with the payloads the embedded
 * store would send. libcurl and json-c are opened at run time (dlopen), so
 * libcollie builds and loads without them; etcd:// then fails clearly.
 *
 * Keys under the job prefix P (every value is text):
 *   P/config        min max expect settle_ms rdzv_ms reset_limit slot_fail_limit
 *                   (written once, by the first worker: later ones use it)
 *   P/next          the next worker id (compare-and-swap on its revision)
 *   P/info/<id>     slot, host, pid of a worker (kept after it dies)
 *   P/w/<id>        the worker's lease id, on its lease: gone <= TTL after it dies
 *   P/arrive/<id>   on its lease: the worker waits at the rendezvous
 *   P/left/<id>     the worker left cleanly (not a failure)
 *   P/state         epoch, resets, plan, failure; changed only by a transaction
 *                   that compares its mod revision, so one epoch bump wins
 *   P/uid/<epoch>   that epoch's unique ID, from its rank 0
 *   P/slotfail/<s>  failures of slot s */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "elastic/backend.h"
#include "elastic/proto.h"

int etcd_url(const char* url) { return strncmp(url, "etcd://", 7) == 0 || strncmp(url, "etcds://", 8) == 0; }

#ifndef COLLIE_HAVE_ETCD

ncclResult_t etcd_open(struct etcd_store** out, const char* url, const char* secret_hex) {
  (void)secret_hex;
  *out = NULL;
  return err_set(ncclInvalidArgument,
                 "elastic: COLLIE_RENDEZVOUS=%s needs etcd support, and this libcollie was built without libcurl and "
                 "json-c headers (apt-get install libcurl4-openssl-dev libjson-c-dev, then rebuild)",
                 url);
}
ncclResult_t etcd_call(struct etcd_store* e, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                       size_t* rep_len) {
  (void)e, (void)type, (void)req, (void)len, (void)rep, (void)cap, (void)rep_len;
  return err_set(ncclInternalError, "elastic: etcd support is not built in");
}
ncclResult_t etcd_peek(struct etcd_store* e, int* failed, char* msg, size_t n, uint32_t* epoch, uint32_t* resets) {
  (void)e, (void)msg, (void)n, (void)epoch, (void)resets;
  *failed = 0;
  return err_set(ncclInternalError, "elastic: etcd support is not built in");
}
void etcd_close(struct etcd_store* e) { (void)e; }

#else

#include <curl/curl.h>
#include <json-c/json.h>

#define ETCD_MAX_ENDPOINTS 16
#define ETCD_ATTEMPT_MS 5000 /* one HTTP request to one member */
#define ETCD_MAX_BODY (16 << 20)
#define ETCD_SCAN_GAP_MS 50 /* waiting workers poll etcd at most this often */
#define ETCD_CAS_TRIES 64

/* ---- libcurl and json-c, opened at run time --------------------------------- */

#define DLFN(f) static __typeof__(f)* p_##f
DLFN(curl_global_init);
DLFN(curl_easy_init);
DLFN(curl_easy_setopt);
DLFN(curl_easy_perform);
DLFN(curl_easy_getinfo);
DLFN(curl_easy_cleanup);
DLFN(curl_easy_strerror);
DLFN(curl_slist_append);
DLFN(curl_slist_free_all);
DLFN(json_tokener_parse);
DLFN(json_object_object_get_ex);
DLFN(json_object_get_string);
DLFN(json_object_get_boolean);
DLFN(json_object_array_length);
DLFN(json_object_array_get_idx);
DLFN(json_object_put);

static pthread_once_t dl_once = PTHREAD_ONCE_INIT;
static char dl_err[256];

static void dl_load(void) {
  const char* curl_names[] = {"libcurl.so.4", "libcurl-gnutls.so.4", "libcurl.so"};
  const char* json_names[] = {"libjson-c.so.5", "libjson-c.so"};
  void* hc = NULL;
  void* hj = NULL;
  for (size_t i = 0; i < sizeof(curl_names) / sizeof(*curl_names) && !hc; i++) hc = dlopen(curl_names[i], RTLD_NOW);
  for (size_t i = 0; i < sizeof(json_names) / sizeof(*json_names) && !hj; i++) hj = dlopen(json_names[i], RTLD_NOW);
  if (!hc || !hj) {
    snprintf(dl_err, sizeof(dl_err), "cannot load %s (apt-get install %s)", !hc ? "libcurl.so.4" : "libjson-c.so.5",
             !hc ? "libcurl4" : "libjson-c5");
    return;
  }
  int miss = 0;
#define SYM(h, f)                                            \
  do {                                                       \
    *(void**)&p_##f = dlsym(h, #f);                          \
    if (!p_##f && !miss) {                                   \
      miss = 1;                                              \
      snprintf(dl_err, sizeof(dl_err), "%s is missing", #f); \
    }                                                        \
  } while (0)
  SYM(hc, curl_global_init);
  SYM(hc, curl_easy_init);
  SYM(hc, curl_easy_setopt);
  SYM(hc, curl_easy_perform);
  SYM(hc, curl_easy_getinfo);
  SYM(hc, curl_easy_cleanup);
  SYM(hc, curl_easy_strerror);
  SYM(hc, curl_slist_append);
  SYM(hc, curl_slist_free_all);
  SYM(hj, json_tokener_parse);
  SYM(hj, json_object_object_get_ex);
  SYM(hj, json_object_get_string);
  SYM(hj, json_object_get_boolean);
  SYM(hj, json_object_array_length);
  SYM(hj, json_object_array_get_idx);
  SYM(hj, json_object_put);
#undef SYM
  /* The handles stay open for the life of the process: the symbols do. */
  if (!miss && p_curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    snprintf(dl_err, sizeof(dl_err), "curl_global_init failed");
    miss = 1;
  }
  if (!miss) dl_err[0] = '\0';
}

/* ---- small helpers ------------------------------------------------------------ */

struct sbuf {
  char* p;
  size_t len, cap;
  int bad;
};

static void sb_add(struct sbuf* b, const char* s, size_t n) {
  if (b->bad) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    if (cap > ETCD_MAX_BODY) {
      b->bad = 1;
      return;
    }
    char* q = realloc(b->p, cap);
    if (!q) {
      b->bad = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf* b, const char* fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(tmp)) {
    b->bad = 1;
    return;
  }
  sb_add(b, tmp, (size_t)n);
}

static void sb_str(struct sbuf* b, const char* s) { sb_add(b, s, strlen(s)); }

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void sb_b64(struct sbuf* b, const void* data, size_t n) {
  const uint8_t* p = data;
  char q[4];
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    q[0] = B64[v >> 18 & 63];
    q[1] = B64[v >> 12 & 63];
    q[2] = i + 1 < n ? B64[v >> 6 & 63] : '=';
    q[3] = i + 2 < n ? B64[v & 63] : '=';
    sb_add(b, q, 4);
  }
}

/* Decodes into a NUL-terminated malloc'd buffer; NULL on bad input. */
static uint8_t* b64_decode(const char* s, size_t* out_len) {
  size_t n = strlen(s);
  uint8_t* out = malloc(n / 4 * 3 + 4);
  if (!out) return NULL;
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '=') break;
    const char* k = strchr(B64, c);
    if (!k || !c) {
      free(out);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)(k - B64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (uint8_t)(acc >> bits);
    }
  }
  out[o] = '\0';
  *out_len = o;
  return out;
}

static void sb_json_str(struct sbuf* b, const char* s) {
  sb_str(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_add(b, e, 2);
    } else if (c < 0x20) {
      sb_printf(b, "\\u%04x", c);
    } else {
      sb_add(b, (const char*)&c, 1);
    }
  }
  sb_str(b, "\"");
}

static struct json_object* jget(struct json_object* o, const char* k) {
  struct json_object* v = NULL;
  if (!o || !p_json_object_object_get_ex(o, k, &v)) return NULL;
  return v;
}

static int64_t jint(struct json_object* o, const char* k) {
  struct json_object* v = jget(o, k);
  const char* s = v ? p_json_object_get_string(v) : NULL;
  return s ? strtoll(s, NULL, 10) : 0;
}

static void sleep_ms(int64_t ms) {
  if (ms > 0) usleep((useconds_t)(ms * 1000));
}

/* ---- the store ---------------------------------------------------------------- */

struct econfig {
  int min, max, expect, reset_limit, slot_fail_limit;
  int64_t settle_ms, rdzv_ms;
};

/* One HTTP connection with its reply buffer and last error. The heartbeat
 * thread's lease keepalives have their own, so that a request of the
 * training thread that is slow (retrying members while etcd elects a
 * leader) never holds them up past the lease's TTL. */
struct chan {
  CURL* curl;
  struct sbuf resp;
  char err[512];
};

struct etcd_store {
  pthread_mutex_t mu;     /* the training thread's requests (main) */
  pthread_mutex_t ka_mu;  /* keepalives (ka) */
  pthread_mutex_t tok_mu; /* the auth token, shared by both */
  struct chan main, ka;
  char endpoints[ETCD_MAX_ENDPOINTS][256];
  int nep, cur;
  int tls;
  char user[128], password[128];
  char token[512];
  char prefix[256];
  int64_t timeout_ms;
  int ttl_s;
  int64_t lease;
  uint32_t me;
  char slot[EPROTO_MAX_KEY + 1];
  struct econfig cfg;
  /* Local view of the rendezvous clock (whichever worker forms an epoch
   * first wins the transaction, so local clocks are enough). */
  uint32_t seen_next;
  int64_t last_register_ms, round_start_ms, last_scan_ms;
  unsigned seed; /* registration retries back off by different amounts */
};

static size_t on_body(char* data, size_t size, size_t n, void* arg) {
  struct sbuf* b = arg;
  sb_add(b, data, size * n);
  return b->bad ? 0 : size * n;
}

/* One POST to one member. 0: JSON in *out; 1: try another member; -1: a
 * reply that another member would give too (ch->err says why); 2: the auth
 * token expired. */
static int post_one(struct etcd_store* e, struct chan* ch, const char* ep, const char* path, const char* body,
                    int64_t ms, struct json_object** out) {
  char url[512];
  snprintf(url, sizeof(url), "%s://%s%s", e->tls ? "https" : "http", ep, path);
  CURL* c = ch->curl;
  struct curl_slist* hdr = p_curl_slist_append(NULL, "Content-Type: application/json");
  char auth[600], token[512];
  pthread_mutex_lock(&e->tok_mu);
  memcpy(token, e->token, sizeof(token));
  pthread_mutex_unlock(&e->tok_mu);
  if (token[0]) {
    snprintf(auth, sizeof(auth), "Authorization: %s", token);
    struct curl_slist* h2 = p_curl_slist_append(hdr, auth);
    if (h2) hdr = h2;
  }
  ch->resp.len = 0;
  ch->resp.bad = 0;
  p_curl_easy_setopt(c, CURLOPT_URL, url);
  p_curl_easy_setopt(c, CURLOPT_POST, 1L);
  p_curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  p_curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  p_curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
  p_curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  p_curl_easy_setopt(c, CURLOPT_WRITEDATA, &ch->resp);
  p_curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)ms);
  p_curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(ms < 2000 ? ms : 2000));
  p_curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  p_curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  CURLcode cc = p_curl_easy_perform(c);
  p_curl_easy_setopt(c, CURLOPT_HTTPHEADER, NULL);
  p_curl_slist_free_all(hdr);
  if (cc != CURLE_OK) {
    snprintf(ch->err, sizeof(ch->err), "%s: %s", ep, p_curl_easy_strerror(cc));
    return 1;
  }
  long code = 0;
  p_curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  struct json_object* j = ch->resp.len && !ch->resp.bad ? p_json_tokener_parse(ch->resp.p) : NULL;
  struct json_object* jerr = jget(j, "error");
  if (code != 200 || jerr) {
    const char* msg = jerr ? p_json_object_get_string(jerr) : "";
    int64_t gcode = jint(j, "code");
    snprintf(ch->err, sizeof(ch->err), "%s: HTTP %ld%s%s", ep, code, msg[0] ? ": " : "", msg);
    if (j) p_json_object_put(j);
    if (code == 401 || gcode == 16 || strstr(ch->err, "invalid auth token")) return 2;
    /* Unavailable, deadline exceeded, no leader, leader changed, server
     * errors: this member cannot answer now, another may. */
    if (code >= 500 || gcode == 14 || gcode == 4 || strstr(ch->err, "leader") || strstr(ch->err, "timed out")) return 1;
    return -1;
  }
  if (!j) {
    snprintf(ch->err, sizeof(ch->err), "%s: reply is not JSON", ep);
    return 1;
  }
  *out = j;
  return 0;
}

static void token_set(struct etcd_store* e, const char* t) {
  pthread_mutex_lock(&e->tok_mu);
  snprintf(e->token, sizeof(e->token), "%s", t);
  pthread_mutex_unlock(&e->tok_mu);
}

static int token_empty(struct etcd_store* e) {
  pthread_mutex_lock(&e->tok_mu);
  int empty = e->token[0] == '\0';
  pthread_mutex_unlock(&e->tok_mu);
  return empty;
}

/* A token for the user: 0; 1: this member cannot answer now; -1: refused
 * (wrong user or password: no other member will say otherwise). */
static int authenticate(struct etcd_store* e, struct chan* ch, const char* ep, int64_t ms) {
  struct sbuf b = {0};
  sb_str(&b, "{\"name\":");
  sb_json_str(&b, e->user);
  sb_str(&b, ",\"password\":");
  sb_json_str(&b, e->password);
  sb_str(&b, "}");
  token_set(e, "");
  struct json_object* j = NULL;
  int rc = b.bad ? -1 : post_one(e, ch, ep, "/v3/auth/authenticate", b.p, ms, &j);
  free(b.p);
  if (rc != 0) {
    if (rc != 1) {
      char why[256];
      size_t n = strnlen(ch->err, sizeof(why) - 1);
      memcpy(why, ch->err, n);
      why[n] = '\0';
      snprintf(ch->err, sizeof(ch->err), "authenticating as etcd user '%s': %s", e->user, why);
    }
    return rc == 1 ? 1 : -1;
  }
  struct json_object* t = jget(j, "token");
  const char* s = t ? p_json_object_get_string(t) : NULL;
  int got = s && s[0] && strlen(s) < sizeof(e->token);
  if (got) token_set(e, s);
  p_json_object_put(j);
  if (!got) {
    snprintf(ch->err, sizeof(ch->err), "%s: authentication gave no token (is auth enabled in etcd?)", ep);
    return -1;
  }
  return 0;
}

/* POSTs to the members in turn, starting with the one that last answered,
 * until one answers or COLLIE_ETCD_TIMEOUT passes. */
static ncclResult_t post_on(struct etcd_store* e, struct chan* ch, const char* path, const struct sbuf* body,
                            struct json_object** out) {
  *out = NULL;
  if (body->bad) return err_set(ncclInternalError, "elastic: etcd request too large");
  int64_t deadline = time_ms() + e->timeout_ms;
  char errs[1024] = "";
  for (int round = 0;; round++) {
    for (int k = 0; k < e->nep; k++) {
      int i = (__atomic_load_n(&e->cur, __ATOMIC_RELAXED) + k) % e->nep;
      int64_t left = deadline - time_ms();
      if (left <= 0) break;
      int64_t ms = left < ETCD_ATTEMPT_MS ? left : ETCD_ATTEMPT_MS;
      int rc = e->user[0] && token_empty(e) ? authenticate(e, ch, e->endpoints[i], ms) : 0;
      if (rc == 0) rc = post_one(e, ch, e->endpoints[i], path, body->p, ms, out);
      if (rc == 2 && e->user[0]) { /* the token expired: once more with a new one */
        rc = authenticate(e, ch, e->endpoints[i], ms);
        if (rc == 0) rc = post_one(e, ch, e->endpoints[i], path, body->p, ms, out);
      }
      if (rc == 0) {
        __atomic_store_n(&e->cur, i, __ATOMIC_RELAXED);
        return ncclSuccess;
      }
      if (rc == -1 || rc == 2) return err_set(ncclSystemError, "elastic: etcd refused %s: %s", path, ch->err);
      snprintf(errs, sizeof(errs), "%s", ch->err);
    }
    if (time_ms() >= deadline) break;
    sleep_ms(round < 10 ? 50 : 200);
  }
  return err_set(ncclSystemError,
                 "elastic: no etcd endpoint answered %s within %lld s (COLLIE_ETCD_TIMEOUT; %d endpoint(s), last "
                 "error: %s)",
                 path, (long long)(e->timeout_ms / 1000), e->nep, errs[0] ? errs : "none");
}

/* Requests of the training thread (and of a launcher's etcd_peek). */
static ncclResult_t post(struct etcd_store* e, const char* path, const struct sbuf* body, struct json_object** out) {
  return post_on(e, &e->main, path, body, out);
}

static void sb_key(struct sbuf* b, const struct etcd_store* e, const char* suffix) {
  char k[600];
  snprintf(k, sizeof(k), "%s/%s", e->prefix, suffix);
  sb_b64(b, k, strlen(k));
}

/* ---- a snapshot of the job ---------------------------------------------------- */

struct idset {
  uint32_t* v;
  int n, cap;
};

static void ids_add(struct idset* s, uint32_t id) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    uint32_t* q = realloc(s->v, (size_t)cap * sizeof(*q));
    if (!q) return; /* a missing id reads as absent: the worker waits */
    s->v = q;
    s->cap = cap;
  }
  s->v[s->n++] = id;
}

static int ids_has(const struct idset* s, uint32_t id) {
  for (int i = 0; i < s->n; i++)
    if (s->v[i] == id) return 1;
  return 0;
}

struct slotfail {
  char slot[EPROTO_MAX_KEY + 1];
  int n;
};

struct snap {
  int have_state;
  int64_t state_mod;
  uint32_t epoch, resets, failed;
  char fail_msg[EPROTO_MAX_TEXT + 1];
  uint32_t* plan;
  int plan_n;
  struct idset alive, arrived, left;
  uint32_t next;
  int64_t next_mod;
  int have_next;
  int have_uid;
  uint8_t uid[EPROTO_UID_BYTES];
  struct slotfail* sf;
  int nsf;
  struct idset info_id;
  char** info_slot;
  int have_cfg;
  struct econfig cfg;
  uint32_t my_lease_id; /* the worker id whose w key holds this worker's lease, 0: none */
};

static void snap_free(struct snap* s) {
  free(s->plan);
  free(s->alive.v);
  free(s->arrived.v);
  free(s->left.v);
  free(s->sf);
  for (int i = 0; i < s->info_id.n; i++) free(s->info_slot[i]);
  free(s->info_slot);
  free(s->info_id.v);
  memset(s, 0, sizeof(*s));
}

static const char* info_slot_of(const struct snap* s, uint32_t id) {
  for (int i = 0; i < s->info_id.n; i++)
    if (s->info_id.v[i] == id) return s->info_slot[i];
  return NULL;
}

static int slot_failures(const struct snap* s, const char* slot) {
  for (int i = 0; i < s->nsf; i++)
    if (strcmp(s->sf[i].slot, slot) == 0) return s->sf[i].n;
  return 0;
}

static int parse_state(struct snap* s, const char* v) {
  /* "epoch E resets R failed F plan N id... \n<failure message>" */
  int pos = 0, n = 0;
  if (sscanf(v, "epoch %" SCNu32 " resets %" SCNu32 " failed %" SCNu32 " plan %d%n", &s->epoch, &s->resets, &s->failed,
             &n, &pos) != 4 ||
      n < 0 || n > EPROTO_MAX_WORKERS)
    return -1;
  s->plan = calloc((size_t)(n ? n : 1), sizeof(uint32_t));
  if (!s->plan) return -1;
  const char* p = v + pos;
  for (int i = 0; i < n; i++) {
    int used = 0;
    if (sscanf(p, " %" SCNu32 "%n", &s->plan[i], &used) != 1) return -1;
    p += used;
  }
  s->plan_n = n;
  if (*p == '\n') snprintf(s->fail_msg, sizeof(s->fail_msg), "%s", p + 1);
  s->have_state = 1;
  return 0;
}

/* Reads everything under the prefix in one range request (one revision). */
static ncclResult_t scan(struct etcd_store* e, struct snap* s) {
  memset(s, 0, sizeof(*s));
  struct sbuf b = {0};
  char start[600], end[600];
  snprintf(start, sizeof(start), "%s/", e->prefix);
  snprintf(end, sizeof(end), "%s0", e->prefix); /* '0' follows '/' */
  sb_str(&b, "{\"key\":\"");
  sb_b64(&b, start, strlen(start));
  sb_str(&b, "\",\"range_end\":\"");
  sb_b64(&b, end, strlen(end));
  sb_str(&b, "\"}");
  struct json_object* j = NULL;
  ncclResult_t res = post(e, "/v3/kv/range", &b, &j);
  free(b.p);
  if (res != ncclSuccess) return res;
  struct json_object* kvs = jget(j, "kvs");
  size_t n = kvs ? p_json_object_array_length(kvs) : 0;
  size_t plen = strlen(start);
  char lease_str[32];
  snprintf(lease_str, sizeof(lease_str), "%" PRId64, e->lease);
  for (size_t i = 0; i < n && res == ncclSuccess; i++) {
    struct json_object* kv = p_json_object_array_get_idx(kvs, i);
    struct json_object* jk = jget(kv, "key");
    struct json_object* jv = jget(kv, "value");
    size_t klen = 0, vlen = 0;
    uint8_t* key = jk ? b64_decode(p_json_object_get_string(jk), &klen) : NULL;
    uint8_t* val = jv ? b64_decode(p_json_object_get_string(jv), &vlen) : (uint8_t*)strdup("");
    if (!key || !val || klen < plen) {
      free(key);
      free(val);
      continue;
    }
    const char* k = (const char*)key + plen;
    const char* v = (const char*)val;
    uint32_t id = 0;
    if (strcmp(k, "state") == 0) {
      s->state_mod = jint(kv, "mod_revision");
      if (parse_state(s, v) != 0)
        res =
            err_set(ncclSystemError, "elastic: etcd key %sstate holds no collie state (another program's key?)", start);
    } else if (strcmp(k, "next") == 0) {
      s->next = (uint32_t)strtoul(v, NULL, 10);
      s->next_mod = jint(kv, "mod_revision");
      s->have_next = 1;
    } else if (strcmp(k, "config") == 0) {
      struct econfig* c = &s->cfg;
      long long settle, rdzv;
      if (sscanf(v, "%d %d %d %lld %lld %d %d", &c->min, &c->max, &c->expect, &settle, &rdzv, &c->reset_limit,
                 &c->slot_fail_limit) == 7) {
        c->settle_ms = settle;
        c->rdzv_ms = rdzv;
        s->have_cfg = 1;
      }
    } else if (sscanf(k, "w/%" SCNu32, &id) == 1) {
      ids_add(&s->alive, id);
      if (e->lease && strcmp(v, lease_str) == 0) s->my_lease_id = id;
    } else if (sscanf(k, "arrive/%" SCNu32, &id) == 1) {
      ids_add(&s->arrived, id);
    } else if (sscanf(k, "left/%" SCNu32, &id) == 1) {
      ids_add(&s->left, id);
    } else if (sscanf(k, "info/%" SCNu32, &id) == 1) {
      char** q = realloc(s->info_slot, (size_t)(s->info_id.n + 1) * sizeof(char*));
      if (q) {
        s->info_slot = q;
        char* nl = strchr(v, '\n');
        if (nl) *nl = '\0';
        q[s->info_id.n] = strdup(v);
        if (q[s->info_id.n]) ids_add(&s->info_id, id);
      }
    } else if (strncmp(k, "slotfail/", 9) == 0) {
      struct slotfail* q = realloc(s->sf, (size_t)(s->nsf + 1) * sizeof(*q));
      if (q) {
        s->sf = q;
        snprintf(q[s->nsf].slot, sizeof(q[s->nsf].slot), "%s", k + 9);
        q[s->nsf].n = atoi(v);
        s->nsf++;
      }
    } else if (sscanf(k, "uid/%" SCNu32, &id) == 1) {
      /* Kept only for the current epoch: the state may come later in the scan. */
      if (vlen == EPROTO_UID_BYTES * 2) {
        for (int x = 0; x < EPROTO_UID_BYTES; x++) {
          unsigned byte;
          if (sscanf(v + 2 * x, "%2x", &byte) != 1) break;
          s->uid[x] = (uint8_t)byte;
        }
        s->have_uid = (int)id; /* checked against the epoch below */
      }
    }
    free(key);
    free(val);
  }
  p_json_object_put(j);
  if (s->have_uid && (!s->have_state || (uint32_t)s->have_uid != s->epoch)) s->have_uid = 0;
  if (res != ncclSuccess) snap_free(s);
  return res;
}

/* ---- transactions --------------------------------------------------------------- */

struct txn {
  struct sbuf b;
  int nops;
};

static void txn_begin_cmp_mod(struct txn* t, struct etcd_store* e, const char* key, int64_t mod) {
  memset(t, 0, sizeof(*t));
  sb_str(&t->b, "{\"compare\":[{\"key\":\"");
  sb_key(&t->b, e, key);
  if (mod > 0)
    sb_printf(&t->b, "\",\"target\":\"MOD\",\"result\":\"EQUAL\",\"mod_revision\":\"%" PRId64 "\"}],\"success\":[",
              mod);
  else /* the key must not exist yet */
    sb_str(&t->b, "\",\"target\":\"CREATE\",\"result\":\"EQUAL\",\"create_revision\":\"0\"}],\"success\":[");
}

static void txn_put(struct txn* t, struct etcd_store* e, const char* key, const char* val, int with_lease) {
  sb_str(&t->b, t->nops++ ? ",{\"request_put\":{\"key\":\"" : "{\"request_put\":{\"key\":\"");
  sb_key(&t->b, e, key);
  sb_str(&t->b, "\",\"value\":\"");
  sb_b64(&t->b, val, strlen(val));
  if (with_lease) sb_printf(&t->b, "\",\"lease\":\"%" PRId64 "\"}}", e->lease);
  else sb_str(&t->b, "\"}}");
}

/* Deletes `key`, or every key under it when `subtree`. */
static void txn_del(struct txn* t, struct etcd_store* e, const char* key, int subtree) {
  sb_str(&t->b, t->nops++ ? ",{\"request_delete_range\":{\"key\":\"" : "{\"request_delete_range\":{\"key\":\"");
  sb_key(&t->b, e, key);
  if (subtree) {
    char end[600];
    snprintf(end, sizeof(end), "%s/%s", e->prefix, key);
    size_t n = strlen(end);
    end[n - 1]++; /* key ends with '/': the range ends before '0' */
    sb_str(&t->b, "\",\"range_end\":\"");
    sb_b64(&t->b, end, n);
  }
  sb_str(&t->b, "\"}}");
}

/* 1: the comparison held and the operations ran; 0: it did not; <0: error. */
static int txn_commit(struct etcd_store* e, struct txn* t) {
  sb_str(&t->b, "]}");
  struct json_object* j = NULL;
  ncclResult_t res = post(e, "/v3/kv/txn", &t->b, &j);
  free(t->b.p);
  if (res != ncclSuccess) return -1;
  struct json_object* ok = jget(j, "succeeded");
  int won = ok && p_json_object_get_boolean(ok);
  p_json_object_put(j);
  return won;
}

static int put_plain(struct etcd_store* e, const char* key, const char* val, int with_lease) {
  struct sbuf b = {0};
  sb_str(&b, "{\"key\":\"");
  sb_key(&b, e, key);
  sb_str(&b, "\",\"value\":\"");
  sb_b64(&b, val, strlen(val));
  if (with_lease) sb_printf(&b, "\",\"lease\":\"%" PRId64 "\"}", e->lease);
  else sb_str(&b, "\"}");
  struct json_object* j = NULL;
  ncclResult_t res = post(e, "/v3/kv/put", &b, &j);
  free(b.p);
  if (j) p_json_object_put(j);
  return res == ncclSuccess ? 0 : -1;
}

static void format_state(struct sbuf* b, uint32_t epoch, uint32_t resets, int failed, const uint32_t* plan, int n,
                         const char* msg) {
  sb_printf(b, "epoch %" PRIu32 " resets %" PRIu32 " failed %d plan %d", epoch, resets, failed, n);
  for (int i = 0; i < n; i++) sb_printf(b, " %" PRIu32, plan[i]);
  if (msg) {
    sb_str(b, "\n");
    sb_add(b, msg, strnlen(msg, EPROTO_MAX_TEXT));
  }
}

/* Marks the job failed, unless the state changed meanwhile. */
static int write_failure(struct etcd_store* e, const struct snap* s, const char* msg) {
  struct txn t;
  struct sbuf v = {0};
  format_state(&v, s->epoch, s->resets, 1, s->plan, s->plan_n, msg);
  txn_begin_cmp_mod(&t, e, "state", s->have_state ? s->state_mod : 0);
  txn_put(&t, e, "state", v.bad ? "" : v.p, 0);
  free(v.p);
  WARN("elastic (etcd %s): job failed: %s", e->prefix, msg);
  return txn_commit(e, &t);
}

/* ---- the rendezvous rules of store.c, over a snapshot ----------------------------- */

static int in_plan(const struct snap* s, uint32_t id) {
  for (int i = 0; i < s->plan_n; i++)
    if (s->plan[i] == id) return 1;
  return 0;
}
static int w_alive(const struct snap* s, uint32_t id) { return ids_has(&s->alive, id) && !ids_has(&s->left, id); }
static int w_dead(const struct snap* s, uint32_t id) { return !ids_has(&s->alive, id) && !ids_has(&s->left, id); }

static int epoch_broken(const struct snap* s) {
  if (s->epoch == 0) return 0;
  for (int i = 0; i < s->plan_n; i++)
    if (w_dead(s, s->plan[i]) || ids_has(&s->arrived, s->plan[i])) return 1;
  return 0;
}

static int change_pending(const struct etcd_store* e, const struct snap* s) {
  if (epoch_broken(s)) return 1;
  if (s->epoch == 0) return 0;
  for (int i = 0; i < s->arrived.n; i++) {
    uint32_t id = s->arrived.v[i];
    if (!in_plan(s, id) && w_alive(s, id) && s->plan_n < e->cfg.max) return 1;
  }
  return 0;
}

static int cmp_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a, y = *(const uint32_t*)b;
  return x < y ? -1 : x > y;
}

/* The next epoch, when the waiting workers make it now (store.c try_form). */
static void try_form(struct etcd_store* e, const struct snap* s, int64_t now) {
  if (s->failed) return;
  const struct econfig* c = &e->cfg;
  int cand = 0, stragglers = 0, real = 0, members = 0;
  for (int i = 0; i < s->plan_n; i++) {
    uint32_t id = s->plan[i];
    if (w_alive(s, id)) members++;
    if (ids_has(&s->arrived, id) || w_dead(s, id)) real = 1;
  }
  uint32_t* cands = calloc((size_t)(s->alive.n ? s->alive.n : 1), sizeof(uint32_t));
  if (!cands) return;
  for (int i = 0; i < s->alive.n; i++) {
    uint32_t id = s->alive.v[i];
    if (ids_has(&s->left, id)) continue;
    if (ids_has(&s->arrived, id)) cands[cand++] = id;
    else stragglers++;
  }
  if (s->epoch == 0 || members == 0) real = real || cand > 0;
  if (!real) {
    e->round_start_ms = 0;
    goto out;
  }
  if (e->round_start_ms == 0) e->round_start_ms = now;
  int timed_out = now - e->round_start_ms >= c->rdzv_ms;
  if (stragglers > 0 && !timed_out) goto out;
  int form = 0;
  if (cand >= c->max) {
    form = 1;
  } else if (cand >= c->min) {
    int settled = now - e->last_register_ms >= c->settle_ms;
    form = (s->epoch == 0 && c->expect > 0 && cand >= c->expect) || settled || timed_out;
  } else if (timed_out) {
    char msg[256];
    snprintf(msg, sizeof(msg),
             "rendezvous timed out after %lld s with %d live worker(s) ready; at least %d needed "
             "(COLLIE_ELASTIC_MIN)",
             (long long)(c->rdzv_ms / 1000), cand, c->min);
    write_failure(e, s, msg);
    goto out;
  }
  if (!form) goto out;
  qsort(cands, (size_t)cand, sizeof(*cands), cmp_u32); /* registration order */
  int n = cand < c->max ? cand : c->max;
  uint32_t epoch = s->epoch + 1, resets = s->resets + (s->epoch > 0);
  char msg[256] = "";
  int failed = 0;
  if (c->reset_limit >= 0 && resets > (uint32_t)c->reset_limit) {
    snprintf(msg, sizeof(msg),
             "reset limit reached: the membership changed %" PRIu32
             " times, more than the limit of %d "
             "(--reset-limit / COLLIE_ELASTIC_RESET_LIMIT)",
             resets, c->reset_limit);
    failed = 1;
  }
  struct sbuf v = {0};
  format_state(&v, epoch, resets, failed, cands, n, failed ? msg : NULL);
  struct txn t;
  txn_begin_cmp_mod(&t, e, "state", s->have_state ? s->state_mod : 0);
  txn_put(&t, e, "state", v.bad ? "" : v.p, 0);
  free(v.p);
  char key[64];
  for (int r = 0; r < n; r++) {
    snprintf(key, sizeof(key), "arrive/%" PRIu32, cands[r]);
    txn_del(&t, e, key, 0);
  }
  txn_del(&t, e, "uid/", 1);
  /* Members of the old epoch that died count against their slots. */
  for (int i = 0; i < s->plan_n; i++) {
    const char* slot = w_dead(s, s->plan[i]) ? info_slot_of(s, s->plan[i]) : NULL;
    if (!slot) continue;
    char k[EPROTO_MAX_KEY + 16], val[16];
    snprintf(k, sizeof(k), "slotfail/%s", slot);
    snprintf(val, sizeof(val), "%d", slot_failures(s, slot) + 1);
    txn_put(&t, e, k, val, 0);
  }
  if (txn_commit(e, &t) == 1) {
    char ids[512];
    size_t off = 0;
    ids[0] = '\0';
    for (int r = 0; r < n && off < sizeof(ids) - 16; r++)
      off += (size_t)snprintf(ids + off, sizeof(ids) - off, "%s%" PRIu32, r ? "," : "", cands[r]);
    INFO(LOG_INIT,
         "elastic (etcd %s): worker %" PRIu32 " formed epoch %" PRIu32 ": %d workers [%s] (reset %" PRIu32 ")",
         e->prefix, e->me, epoch, n, ids, resets);
    if (failed) WARN("elastic (etcd %s): job failed: %s", e->prefix, msg);
    e->round_start_ms = 0;
  }
out:
  free(cands);
}

/* ---- requests ------------------------------------------------------------------- */

static void put_text(struct ebuf* b, uint32_t status, const char* text) {
  ebuf_put_u32(b, status);
  ebuf_put_str(b, text, EPROTO_MAX_TEXT);
}

/* Scans, noting new registrations (the settle clock) and a lost lease. */
static ncclResult_t scan_job(struct etcd_store* e, struct snap* s, int throttle) {
  if (throttle) {
    int64_t gap = e->last_scan_ms + ETCD_SCAN_GAP_MS - time_ms();
    sleep_ms(gap);
  }
  NCCLCHECK(scan(e, s));
  e->last_scan_ms = time_ms();
  if (s->next > e->seen_next) {
    e->seen_next = s->next;
    e->last_register_ms = e->last_scan_ms;
  }
  return ncclSuccess;
}

/* A worker whose liveness key is gone counts as dead to the others. */
static int lost_self(struct etcd_store* e, const struct snap* s, struct ebuf* b) {
  if (ids_has(&s->alive, e->me)) return 0;
  char msg[256];
  snprintf(msg, sizeof(msg),
           "worker %" PRIu32
           "'s lease in etcd expired (no keepalive within COLLIE_ETCD_TTL=%d s); the job counts "
           "it as dead",
           e->me, e->ttl_s);
  put_text(b, ESTATUS_FAIL, msg);
  return 1;
}

static ncclResult_t do_register(struct etcd_store* e, struct ebuf* in, struct ebuf* b) {
  char key[EPROTO_MAX_KEY + 1], host[EPROTO_MAX_KEY + 1];
  uint32_t pid = ebuf_get_u32(in);
  ebuf_get_str(in, key, sizeof(key), EPROTO_MAX_KEY);
  ebuf_get_str(in, host, sizeof(host), EPROTO_MAX_KEY);
  if (!ebuf_done(in)) return err_set(ncclInternalError, "elastic: malformed REGISTER");
  snprintf(e->slot, sizeof(e->slot), "%s", key);
  /* This worker's liveness lease. */
  struct sbuf lb = {0};
  sb_printf(&lb, "{\"TTL\":%d}", e->ttl_s);
  struct json_object* j = NULL;
  ncclResult_t res = post(e, "/v3/lease/grant", &lb, &j);
  free(lb.p);
  if (res != ncclSuccess) return res;
  e->lease = jint(j, "ID");
  p_json_object_put(j);
  if (e->lease == 0) return err_set(ncclSystemError, "elastic: etcd granted no lease");
  /* The job's settings: the first worker's. */
  struct sbuf cv = {0};
  sb_printf(&cv, "%d %d %d %lld %lld %d %d", e->cfg.min, e->cfg.max, e->cfg.expect, (long long)e->cfg.settle_ms,
            (long long)e->cfg.rdzv_ms, e->cfg.reset_limit, e->cfg.slot_fail_limit);
  struct txn t;
  txn_begin_cmp_mod(&t, e, "config", 0);
  txn_put(&t, e, "config", cv.bad ? "" : cv.p, 0);
  free(cv.p);
  if (txn_commit(e, &t) < 0) return ncclSystemError;
  char info[2 * EPROTO_MAX_KEY + 32], lease_str[32];
  snprintf(info, sizeof(info), "%s\n%s\n%" PRIu32, key, host, pid);
  snprintf(lease_str, sizeof(lease_str), "%" PRId64, e->lease);
  for (int tries = 0; tries < ETCD_CAS_TRIES; tries++) {
    struct snap s;
    NCCLCHECK(scan_job(e, &s, 0));
    if (s.have_cfg) e->cfg = s.cfg;
    uint32_t id = s.my_lease_id;
    if (s.failed) {
      put_text(b, ESTATUS_FAIL, s.fail_msg);
    } else if (!id && e->cfg.slot_fail_limit > 0 && slot_failures(&s, key) >= e->cfg.slot_fail_limit) {
      char msg[EPROTO_MAX_KEY + 128];
      snprintf(msg, sizeof(msg), "slot %s is excluded: it failed %d times (limit %d)", key, slot_failures(&s, key),
               e->cfg.slot_fail_limit);
      put_text(b, ESTATUS_EXCLUDED, msg);
    } else if (!id) {
      /* A worker id: P/next compare-and-swapped, so no two workers share one. */
      id = s.have_next ? s.next : 1;
      char k[64], nv[16];
      snprintf(nv, sizeof(nv), "%" PRIu32, id + 1);
      txn_begin_cmp_mod(&t, e, "next", s.have_next ? s.next_mod : 0);
      txn_put(&t, e, "next", nv, 0);
      snprintf(k, sizeof(k), "info/%" PRIu32, id);
      txn_put(&t, e, k, info, 0);
      snprintf(k, sizeof(k), "w/%" PRIu32, id);
      txn_put(&t, e, k, lease_str, 1);
      int won = txn_commit(e, &t);
      /* A lost reply may hide a win: the next scan finds the lease's key. */
      if (won != 1) id = 0;
    }
    uint32_t epoch = s.epoch;
    int answered = s.failed || (b->len > 0);
    snap_free(&s);
    if (answered) return ncclSuccess;
    if (id) {
      e->me = id;
      e->seen_next = id + 1;
      e->last_register_ms = time_ms();
      INFO(LOG_INIT, "elastic (etcd %s): registered as worker %" PRIu32 " (slot %s, lease %" PRId64 ")", e->prefix, id,
           key, e->lease);
      ebuf_put_u32(b, ESTATUS_OK);
      ebuf_put_u32(b, id);
      ebuf_put_u32(b, epoch);
      return ncclSuccess;
    }
    sleep_ms(10 + (int64_t)(rand_r(&e->seed) % 40));
  }
  return err_set(ncclSystemError, "elastic: could not register in etcd: %d tries lost the race for a worker id",
                 ETCD_CAS_TRIES);
}

static ncclResult_t do_rdzv(struct etcd_store* e, uint32_t last, struct ebuf* b) {
  struct snap s;
  NCCLCHECK(scan_job(e, &s, 1));
  int arrived = ids_has(&s.arrived, e->me);
  if (s.failed) {
    put_text(b, ESTATUS_FAIL, s.fail_msg);
  } else if (lost_self(e, &s, b)) {
  } else if (in_plan(&s, e->me) && last < s.epoch && !arrived) {
    int rank = 0;
    while (s.plan[rank] != e->me) rank++;
    ebuf_put_u32(b, ESTATUS_OK);
    ebuf_put_u32(b, s.epoch);
    ebuf_put_u32(b, (uint32_t)rank);
    ebuf_put_u32(b, (uint32_t)s.plan_n);
    ebuf_put_u32(b, s.resets);
    for (int r = 0; r < s.plan_n; r++) ebuf_put_u32(b, s.plan[r]);
  } else {
    if (!arrived) {
      char k[64], v[16];
      snprintf(k, sizeof(k), "arrive/%" PRIu32, e->me);
      snprintf(v, sizeof(v), "%" PRIu32, last);
      if (put_plain(e, k, v, 1) != 0) {
        snap_free(&s);
        return ncclSystemError;
      }
      ids_add(&s.arrived, e->me);
    }
    try_form(e, &s, time_ms());
    ebuf_put_u32(b, ESTATUS_WAIT);
  }
  snap_free(&s);
  return ncclSuccess;
}

static ncclResult_t do_publish(struct etcd_store* e, struct ebuf* in, struct ebuf* b) {
  uint32_t ep = ebuf_get_u32(in);
  uint8_t uid[EPROTO_UID_BYTES];
  ebuf_get_bytes(in, uid, sizeof(uid));
  if (!ebuf_done(in)) return err_set(ncclInternalError, "elastic: malformed PUBLISH");
  char hex[2 * EPROTO_UID_BYTES + 1];
  for (int i = 0; i < EPROTO_UID_BYTES; i++) snprintf(hex + 2 * i, 3, "%02x", uid[i]);
  for (int tries = 0; tries < ETCD_CAS_TRIES; tries++) {
    struct snap s;
    NCCLCHECK(scan_job(e, &s, 0));
    int done = 1;
    if (s.failed) {
      put_text(b, ESTATUS_FAIL, s.fail_msg);
    } else if (ep != s.epoch || !in_plan(&s, e->me) || ids_has(&s.arrived, e->me)) {
      ebuf_put_u32(b, ESTATUS_STALE);
    } else if (s.plan_n == 0 || s.plan[0] != e->me) {
      put_text(b, ESTATUS_REFUSED, "only rank 0 of an epoch publishes its unique ID");
    } else {
      /* Only into the epoch it belongs to: a newer epoch makes it stale. */
      struct txn t;
      char k[64];
      snprintf(k, sizeof(k), "uid/%" PRIu32, ep);
      txn_begin_cmp_mod(&t, e, "state", s.state_mod);
      txn_put(&t, e, k, hex, 0);
      int won = txn_commit(e, &t);
      if (won < 0) {
        snap_free(&s);
        return ncclSystemError;
      }
      if (won) ebuf_put_u32(b, ESTATUS_OK);
      else done = 0; /* the state moved: look again */
    }
    snap_free(&s);
    if (done) return ncclSuccess;
  }
  ebuf_put_u32(b, ESTATUS_STALE);
  return ncclSuccess;
}

static ncclResult_t do_get_uid(struct etcd_store* e, uint32_t ep, struct ebuf* b) {
  struct snap s;
  NCCLCHECK(scan_job(e, &s, 1));
  if (s.failed) {
    put_text(b, ESTATUS_FAIL, s.fail_msg);
  } else if (ep != s.epoch || !in_plan(&s, e->me) || ids_has(&s.arrived, e->me) || s.plan_n == 0 ||
             !w_alive(&s, s.plan[0]) || ids_has(&s.arrived, s.plan[0])) {
    /* Superseded, or rank 0 is gone or back at the rendezvous. */
    ebuf_put_u32(b, ESTATUS_STALE);
  } else if (!s.have_uid) {
    ebuf_put_u32(b, ESTATUS_WAIT);
  } else {
    ebuf_put_u32(b, ESTATUS_OK);
    ebuf_put_bytes(b, s.uid, EPROTO_UID_BYTES);
  }
  snap_free(&s);
  return ncclSuccess;
}

static ncclResult_t keepalive(struct etcd_store* e) {
  struct sbuf lb = {0};
  sb_printf(&lb, "{\"ID\":\"%" PRId64 "\"}", e->lease);
  struct json_object* j = NULL;
  ncclResult_t res = post_on(e, &e->ka, "/v3/lease/keepalive", &lb, &j);
  free(lb.p);
  if (res != ncclSuccess) return res;
  struct json_object* r = jget(j, "result");
  /* The job's keys, not this answer, decide (lost_self): the next scan
   * finds this worker's key gone if the lease really expired. */
  if (jint(r ? r : j, "TTL") <= 0)
    WARN("elastic (etcd %s): worker %" PRIu32 "'s lease %" PRId64 " expired", e->prefix, e->me, e->lease);
  p_json_object_put(j);
  return ncclSuccess;
}

static ncclResult_t do_heartbeat(struct etcd_store* e, uint32_t ep, struct ebuf* b) {
  if (ep == 0) { /* the heartbeat thread: liveness only */
    NCCLCHECK(keepalive(e));
    ebuf_put_u32(b, ESTATUS_OK);
    ebuf_put_u32(b, 0);
    ebuf_put_u32(b, 0);
    ebuf_put_u32(b, 0);
    return ncclSuccess;
  }
  struct snap s;
  NCCLCHECK(scan_job(e, &s, 0));
  if (s.failed) {
    put_text(b, ESTATUS_FAIL, s.fail_msg);
  } else if (!lost_self(e, &s, b)) {
    ebuf_put_u32(b, ESTATUS_OK);
    ebuf_put_u32(b, s.epoch);
    ebuf_put_u32(b, (uint32_t)change_pending(e, &s));
    ebuf_put_u32(b, (uint32_t)epoch_broken(&s));
  }
  snap_free(&s);
  return ncclSuccess;
}

static ncclResult_t do_leave(struct etcd_store* e, struct ebuf* b) {
  char k[64];
  struct txn t;
  snprintf(k, sizeof(k), "left/%" PRIu32, e->me);
  memset(&t, 0, sizeof(t));
  sb_str(&t.b, "{\"compare\":[],\"success\":[");
  txn_put(&t, e, k, "1", 0);
  snprintf(k, sizeof(k), "arrive/%" PRIu32, e->me);
  txn_del(&t, e, k, 0);
  if (txn_commit(e, &t) < 0) return ncclSystemError;
  ebuf_put_u32(b, ESTATUS_OK);
  return ncclSuccess;
}

ncclResult_t etcd_call(struct etcd_store* e, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                       size_t* rep_len) {
  struct ebuf in, b;
  ebuf_reader(&in, req, len);
  ebuf_writer(&b, rep, cap);
  ncclResult_t res = ncclSuccess;
  if (type == EREQ_HEARTBEAT && len == 4 && req[0] == 0 && req[1] == 0 && req[2] == 0 && req[3] == 0) {
    /* The heartbeat thread: keepalive only, on its own connection. */
    pthread_mutex_lock(&e->ka_mu);
    res = do_heartbeat(e, 0, &b);
    pthread_mutex_unlock(&e->ka_mu);
    goto done;
  }
  pthread_mutex_lock(&e->mu);
  switch (type) {
    case EREQ_REGISTER: res = do_register(e, &in, &b); break;
    case EREQ_RDZV: {
      uint32_t last = ebuf_get_u32(&in);
      res = do_rdzv(e, last, &b);
      break;
    }
    case EREQ_PUBLISH: res = do_publish(e, &in, &b); break;
    case EREQ_GET_UID: {
      uint32_t ep = ebuf_get_u32(&in);
      res = do_get_uid(e, ep, &b);
      break;
    }
    case EREQ_HEARTBEAT: {
      uint32_t ep = ebuf_get_u32(&in);
      res = do_heartbeat(e, ep, &b);
      break;
    }
    case EREQ_LEAVE: res = do_leave(e, &b); break;
    default: res = err_set(ncclInternalError, "elastic: request type %d unknown to the etcd store", type);
  }
  pthread_mutex_unlock(&e->mu);
done:
  if (res != ncclSuccess) return res;
  if (b.bad) return err_set(ncclInternalError, "elastic: etcd store reply too long");
  *rep_len = b.len;
  return ncclSuccess;
}

/* For a launcher that does not hold the store (collie-run --store): the
 * job's verdict and progress, from one scan. */
ncclResult_t etcd_peek(struct etcd_store* e, int* failed, char* msg, size_t n, uint32_t* epoch, uint32_t* resets) {
  struct snap s;
  pthread_mutex_lock(&e->mu);
  ncclResult_t res = scan(e, &s);
  pthread_mutex_unlock(&e->mu);
  if (res != ncclSuccess) return res;
  *failed = (int)s.failed;
  if (msg) snprintf(msg, n, "%s", s.fail_msg);
  if (epoch) *epoch = s.epoch;
  if (resets) *resets = s.resets;
  snap_free(&s);
  return ncclSuccess;
}

/* ---- open / close ----------------------------------------------------------------- */

static void url_unescape(char* s) {
  char* o = s;
  for (char* p = s; *p; p++) {
    unsigned v;
    if (*p == '%' && p[1] && p[2] && sscanf(p + 1, "%2x", &v) == 1) {
      *o++ = (char)v;
      p += 2;
    } else {
      *o++ = *p;
    }
  }
  *o = '\0';
}

/* Copies src whole, or returns -1 (a cut credential would fail obscurely). */
static int set_str(char* dst, size_t cap, const char* src) {
  size_t n = strlen(src);
  if (n >= cap) return -1;
  memcpy(dst, src, n + 1);
  return 0;
}

static ncclResult_t parse_url(struct etcd_store* e, const char* url, const char* secret_hex) {
  e->tls = strncmp(url, "etcds://", 8) == 0;
  const char* rest = url + (e->tls ? 8 : 7);
  char buf[1024];
  if (strlen(rest) >= sizeof(buf)) return err_set(ncclInvalidArgument, "elastic: COLLIE_RENDEZVOUS is too long");
  snprintf(buf, sizeof(buf), "%s", rest);
  char* path = strchr(buf, '/');
  if (path) *path++ = '\0';
  char* hosts = buf;
  char* at = strrchr(buf, '@');
  if (at) {
    *at = '\0';
    hosts = at + 1;
    char* colon = strchr(buf, ':');
    if (colon) *colon = '\0';
    if (set_str(e->user, sizeof(e->user), buf) || set_str(e->password, sizeof(e->password), colon ? colon + 1 : ""))
      return err_set(ncclInvalidArgument, "elastic: the user or password in COLLIE_RENDEZVOUS is too long");
    url_unescape(e->user);
    url_unescape(e->password);
  }
  const char* u = param_str(P_COLLIE_ETCD_USER);
  const char* pw = param_str(P_COLLIE_ETCD_PASSWORD);
  if ((!e->user[0] && u && set_str(e->user, sizeof(e->user), u)) ||
      (!e->password[0] && pw && set_str(e->password, sizeof(e->password), pw)))
    return err_set(ncclInvalidArgument, "elastic: COLLIE_ETCD_USER or COLLIE_ETCD_PASSWORD is too long");
  for (char *save = NULL, *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
    if (e->nep == ETCD_MAX_ENDPOINTS)
      return err_set(ncclInvalidArgument, "elastic: COLLIE_RENDEZVOUS names more than %d etcd endpoints",
                     ETCD_MAX_ENDPOINTS);
    if (!*h || !strchr(h, ':') || strlen(h) >= sizeof(e->endpoints[0]))
      return err_set(ncclInvalidArgument, "elastic: etcd endpoint '%s' in COLLIE_RENDEZVOUS is not host:port", h);
    snprintf(e->endpoints[e->nep++], sizeof(e->endpoints[0]), "%s", h);
  }
  if (e->nep == 0)
    return err_set(ncclInvalidArgument, "elastic: COLLIE_RENDEZVOUS=%s names no etcd endpoint (etcd://host:port,...)",
                   url);
  const char* pre = param_str(P_COLLIE_ETCD_PREFIX);
  if (pre && *pre) snprintf(e->prefix, sizeof(e->prefix), "%s", pre);
  else if (path && *path) snprintf(e->prefix, sizeof(e->prefix), "/collie/%s", path);
  else if (secret_hex && *secret_hex) snprintf(e->prefix, sizeof(e->prefix), "/collie/%s", secret_hex);
  else
    return err_set(ncclInvalidArgument,
                   "elastic: name the job's etcd keys: etcd://host:port/JOB, COLLIE_ETCD_PREFIX or "
                   "COLLIE_RENDEZVOUS_SECRET (each job needs its own)");
  size_t n = strlen(e->prefix);
  while (n > 1 && e->prefix[n - 1] == '/') e->prefix[--n] = '\0';
  return ncclSuccess;
}

ncclResult_t etcd_open(struct etcd_store** out, const char* url, const char* secret_hex) {
  *out = NULL;
  pthread_once(&dl_once, dl_load);
  if (dl_err[0])
    return err_set(ncclInvalidArgument, "elastic: COLLIE_RENDEZVOUS=etcd://... needs libcurl and json-c: %s", dl_err);
  struct etcd_store* e = calloc(1, sizeof(*e));
  if (!e) return err_set(ncclSystemError, "elastic: out of memory");
  pthread_mutex_init(&e->mu, NULL);
  pthread_mutex_init(&e->ka_mu, NULL);
  pthread_mutex_init(&e->tok_mu, NULL);
  *out = e;
  NCCLCHECK(parse_url(e, url, secret_hex));
  e->timeout_ms = param_int(P_COLLIE_ETCD_TIMEOUT, 1, 3600) * 1000;
  e->ttl_s = (int)param_int(P_COLLIE_ETCD_TTL, 2, 3600);
  e->cfg.min = (int)param_int(P_COLLIE_ELASTIC_MIN, 1, EPROTO_MAX_WORKERS);
  e->cfg.max = (int)param_int(P_COLLIE_ELASTIC_MAX, 1, EPROTO_MAX_WORKERS);
  if (e->cfg.max < e->cfg.min)
    return err_set(ncclInvalidArgument, "elastic: COLLIE_ELASTIC_MAX (%d) is below COLLIE_ELASTIC_MIN (%d)", e->cfg.max,
                   e->cfg.min);
  e->cfg.expect = (int)param_int(P_COLLIE_ELASTIC_EXPECT, 0, EPROTO_MAX_WORKERS);
  e->cfg.settle_ms = param_int(P_COLLIE_ELASTIC_SETTLE_MS, 0, 3600 * 1000);
  e->cfg.rdzv_ms = param_int(P_COLLIE_ELASTIC_RDZV_TIMEOUT, 1, 7 * 24 * 3600) * 1000;
  e->cfg.slot_fail_limit = (int)param_int(P_COLLIE_ELASTIC_SLOT_FAILURES, 0, 1000000);
  e->cfg.reset_limit =
      param_str(P_COLLIE_ELASTIC_RESET_LIMIT) ? (int)param_int(P_COLLIE_ELASTIC_RESET_LIMIT, 0, 1000000) : -1;
  e->seed = (unsigned)getpid() ^ (unsigned)time_ms();
  struct chan* chans[2] = {&e->main, &e->ka};
  for (int c = 0; c < 2; c++) {
    CURL* h = chans[c]->curl = p_curl_easy_init();
    if (!h) return err_set(ncclSystemError, "elastic: curl_easy_init failed");
    if (e->tls) {
      const char* ca = param_str(P_COLLIE_ETCD_CACERT);
      const char* cert = param_str(P_COLLIE_ETCD_CERT);
      const char* key = param_str(P_COLLIE_ETCD_KEY);
      if (ca) p_curl_easy_setopt(h, CURLOPT_CAINFO, ca);
      if (cert) p_curl_easy_setopt(h, CURLOPT_SSLCERT, cert);
      if (key) p_curl_easy_setopt(h, CURLOPT_SSLKEY, key);
    }
  }
  INFO(LOG_INIT, "elastic: state in etcd under %s (%d endpoint(s), %s%s)", e->prefix, e->nep, e->tls ? "TLS" : "plain",
       e->user[0] ? ", with a user" : "");
  return ncclSuccess;
}

void etcd_close(struct etcd_store* e) {
  if (!e) return;
  if (e->main.curl && e->lease) {
    /* Gone at once, not after the TTL (LEAVE already said it was no
     * failure). Best effort, one member, and no error record: the error
     * that made the worker close, if any, is the one to report. */
    struct sbuf lb = {0};
    sb_printf(&lb, "{\"ID\":\"%" PRId64 "\"}", e->lease);
    struct json_object* j = NULL;
    if (!lb.bad && post_one(e, &e->main, e->endpoints[e->cur], "/v3/lease/revoke", lb.p, 2000, &j) == 0)
      p_json_object_put(j);
    free(lb.p);
  }
  if (e->main.curl) p_curl_easy_cleanup(e->main.curl);
  if (e->ka.curl) p_curl_easy_cleanup(e->ka.curl);
  free(e->main.resp.p);
  free(e->ka.resp.p);
  pthread_mutex_destroy(&e->mu);
  pthread_mutex_destroy(&e->ka_mu);
  pthread_mutex_destroy(&e->tok_mu);
  free(e);
}

#endif
