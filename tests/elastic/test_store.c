/* Tests of the elastic rendezvous store (src/elastic/store.c) through its
 * client (client.c) and raw sockets, without communicators: epochs and rank
 * order, deaths and joins, unique-ID exchange, the reset limit, slot
 * exclusion, and hostile connections (garbage, wrong secret, huge lengths,
 * stalled headers) that must be dropped while the store keeps serving. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core.h"
#include "elastic/client.h"
#include "elastic/store.h"

static int failures;
#define CHECK(c)                                                       \
  do {                                                                 \
    if (!(c)) {                                                        \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      failures++;                                                      \
    }                                                                  \
  } while (0)

/* Bound of every wait for the store thread to act: generous, because the
 * machine may be loaded (ctest -j, other jobs); a wait ends as soon as its
 * condition holds, so this never slows a passing run. */
#define WAIT_MS 30000

static const uint8_t secret[EPROTO_SECRET_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static char addr[64];

struct w {
  struct eclient c;
  uint32_t id, epoch, rank, size;
  uint32_t plan[16];
};

struct rep {
  uint8_t buf[EPROTO_MAX_REPLY];
  size_t len;
  struct ebuf in;
  uint32_t status;
  char text[EPROTO_MAX_TEXT + 1];
};

static int req(struct w* w, int type, const uint8_t* m, size_t n, struct rep* r) {
  if (eclient_call(&w->c, type, m, n, r->buf, sizeof(r->buf), &r->len) != ncclSuccess) return -1;
  ebuf_reader(&r->in, r->buf, r->len);
  r->status = ebuf_get_u32(&r->in);
  r->text[0] = 0;
  if (r->status == ESTATUS_FAIL || r->status == ESTATUS_EXCLUDED || r->status == ESTATUS_REFUSED)
    ebuf_get_str(&r->in, r->text, sizeof(r->text), EPROTO_MAX_TEXT);
  return 0;
}

static int req_u32(struct w* w, int type, uint32_t v, struct rep* r) {
  uint8_t m[4];
  struct ebuf b;
  ebuf_writer(&b, m, 4);
  ebuf_put_u32(&b, v);
  return req(w, type, m, b.len, r);
}

/* Registers; returns the status. */
static uint32_t join(struct w* w, const char* key) {
  memset(w, 0, sizeof(*w));
  if (eclient_open(&w->c, addr, secret, 5000, 5000) != ncclSuccess) return 99;
  uint8_t m[600];
  struct ebuf b;
  ebuf_writer(&b, m, sizeof(m));
  ebuf_put_u32(&b, (uint32_t)getpid());
  ebuf_put_str(&b, key, EPROTO_MAX_KEY);
  ebuf_put_str(&b, "testhost", EPROTO_MAX_KEY);
  struct rep r;
  if (req(w, EREQ_REGISTER, m, b.len, &r) != 0) return 98;
  if (r.status == ESTATUS_OK) w->id = ebuf_get_u32(&r.in);
  return r.status;
}

/* One RDZV poll; fills the plan when READY. */
static uint32_t rdzv(struct w* w, struct rep* r) {
  if (req_u32(w, EREQ_RDZV, w->epoch, r) != 0) return 98;
  if (r->status == ESTATUS_OK) {
    w->epoch = ebuf_get_u32(&r->in);
    w->rank = ebuf_get_u32(&r->in);
    w->size = ebuf_get_u32(&r->in);
    (void)ebuf_get_u32(&r->in);
    for (uint32_t i = 0; i < w->size && i < 16; i++) w->plan[i] = ebuf_get_u32(&r->in);
  }
  return r->status;
}

/* Polls RDZV on all of ws[] until each is READY (or one gets another status). */
static int rdzv_all(struct w** ws, int n) {
  int ready[16] = {0}, left = n;
  struct rep r;
  for (int64_t end = time_ms() + WAIT_MS; left && time_ms() < end;) {
    for (int i = 0; i < n; i++) {
      if (ready[i]) continue;
      uint32_t st = rdzv(ws[i], &r);
      if (st == ESTATUS_OK) {
        ready[i] = 1;
        left--;
      } else if (st != ESTATUS_WAIT) {
        fprintf(stderr, "rdzv: worker %u got status %u (%s)\n", ws[i]->id, st, r.text);
        return -1;
      }
    }
    usleep(20000);
  }
  return left ? -1 : 0;
}

/* The third field of the last OK heartbeat: the epoch lost a member. */
static uint32_t hb_broken = 9;

static uint32_t heartbeat(struct w* w, uint32_t* epoch, uint32_t* pending) {
  struct rep r;
  if (req_u32(w, EREQ_HEARTBEAT, w->epoch, &r) != 0) return 98;
  if (r.status == ESTATUS_OK) {
    *epoch = ebuf_get_u32(&r.in);
    *pending = ebuf_get_u32(&r.in);
    hb_broken = ebuf_get_u32(&r.in);
    if (!ebuf_done(&r.in)) return 97;
  }
  return r.status;
}

static struct store* start(int min, int max, int expect, int reset_limit, int slot_fail) {
  struct store_opts o;
  memset(&o, 0, sizeof(o));
  o.min = min;
  o.max = max;
  o.expect = expect;
  o.reset_limit = reset_limit;
  o.slot_fail_limit = slot_fail;
  o.settle_ms = 200;
  o.rdzv_timeout_ms = 20000;
  o.hb_timeout_ms = 0;
  o.handshake_ms = 500;
  memcpy(o.secret, secret, sizeof(secret));
  o.bind.sin.sin_family = AF_INET;
  o.bind.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct store* s = NULL;
  if (store_start(&o, &s) != ncclSuccess) return NULL;
  union sock_addr a;
  store_address(s, &a);
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)ntohs(a.sin.sin_port));
  return s;
}

static void test_epochs(void) {
  struct store* s = start(2, 3, 3, -1, 0);
  CHECK(s != NULL);
  if (!s) return;
  struct w a, b, c, d;
  CHECK(join(&a, "s0") == ESTATUS_OK);
  CHECK(join(&b, "s1") == ESTATUS_OK);
  CHECK(join(&c, "s2") == ESTATUS_OK);
  CHECK(a.id == 1 && b.id == 2 && c.id == 3);
  struct w* all[] = {&c, &a, &b};
  CHECK(rdzv_all(all, 3) == 0);
  CHECK(a.epoch == 1 && a.rank == 0 && b.rank == 1 && c.rank == 2 && c.size == 3);
  CHECK(a.plan[0] == 1 && a.plan[1] == 2 && a.plan[2] == 3);

  /* Unique ID: only rank 0 publishes; the others get exactly its bytes. */
  struct rep r;
  CHECK(req_u32(&b, EREQ_GET_UID, 1, &r) == 0 && r.status == ESTATUS_WAIT);
  uint8_t m[4 + EPROTO_UID_BYTES];
  struct ebuf eb;
  ebuf_writer(&eb, m, sizeof(m));
  ebuf_put_u32(&eb, 1);
  for (int i = 0; i < EPROTO_UID_BYTES; i++) {
    uint8_t v = (uint8_t)(i * 7);
    ebuf_put_bytes(&eb, &v, 1);
  }
  CHECK(req(&b, EREQ_PUBLISH, m, eb.len, &r) == 0 && r.status == ESTATUS_REFUSED);
  CHECK(req(&a, EREQ_PUBLISH, m, eb.len, &r) == 0 && r.status == ESTATUS_OK);
  CHECK(req_u32(&c, EREQ_GET_UID, 1, &r) == 0 && r.status == ESTATUS_OK && r.len == 4 + EPROTO_UID_BYTES &&
        memcmp(r.buf + 4, m + 4, EPROTO_UID_BYTES) == 0);

  uint32_t ep = 0, pend = 9;
  CHECK(heartbeat(&a, &ep, &pend) == ESTATUS_OK && ep == 1 && pend == 0 && hb_broken == 0);

  /* b dies: the others see a pending change, re-rendezvous, and form epoch 2
   * with the oldest survivor first. */
  eclient_close(&b.c);
  int seen = 0;
  for (int64_t end = time_ms() + WAIT_MS; !seen && time_ms() < end;) {
    usleep(10000);
    seen = heartbeat(&c, &ep, &pend) == ESTATUS_OK && pend == 1;
  }
  CHECK(seen);
  CHECK(hb_broken == 1); /* a member died: the epoch cannot go on */
  struct w* two[] = {&c, &a};
  CHECK(rdzv_all(two, 2) == 0);
  CHECK(a.epoch == 2 && a.rank == 0 && c.rank == 1 && c.size == 2);
  /* Epoch 1's ID is stale now. */
  CHECK(req_u32(&c, EREQ_GET_UID, 1, &r) == 0 && r.status == ESTATUS_STALE);

  /* d joins: no epoch without the members; they see the change, and epoch 3
   * puts d last. */
  CHECK(join(&d, "s1") == ESTATUS_OK && d.id == 4);
  CHECK(rdzv(&d, &r) == ESTATUS_WAIT);
  usleep(300000);
  CHECK(rdzv(&d, &r) == ESTATUS_WAIT);
  /* A newcomer is a pending change, but epoch 2 itself is intact. */
  CHECK(heartbeat(&a, &ep, &pend) == ESTATUS_OK && ep == 2 && pend == 1 && hb_broken == 0);
  struct w* three[] = {&d, &c, &a};
  CHECK(rdzv_all(three, 3) == 0);
  CHECK(d.epoch == 3 && a.rank == 0 && c.rank == 1 && d.rank == 2);
  uint32_t resets = 0;
  store_progress(s, &ep, &resets);
  CHECK(ep == 3 && resets == 2);

  /* Rank 0 goes back to the rendezvous before publishing: GET_UID says stale. */
  CHECK(heartbeat(&c, &ep, &pend) == ESTATUS_OK && ep == 3 && hb_broken == 0);
  CHECK(rdzv(&a, &r) == ESTATUS_WAIT);
  CHECK(req_u32(&c, EREQ_GET_UID, 3, &r) == 0 && r.status == ESTATUS_STALE);
  /* ... and the epoch is broken for those still building its communicator. */
  CHECK(heartbeat(&c, &ep, &pend) == ESTATUS_OK && ep == 3 && hb_broken == 1);

  /* Clean exits are not failures. */
  int reg, live;
  CHECK(req(&a, EREQ_LEAVE, NULL, 0, &r) == 0 && r.status == ESTATUS_OK);
  store_counts(s, &reg, &live);
  CHECK(reg == 4 && live == 2);
  eclient_close(&a.c);
  eclient_close(&c.c);
  eclient_close(&d.c);
  store_stop(s);
}

static void test_reset_limit_and_exclusion(void) {
  struct store* s = start(1, 2, 2, 1, 2);
  CHECK(s != NULL);
  if (!s) return;
  struct w a, b;
  CHECK(join(&a, "good") == ESTATUS_OK);
  CHECK(join(&b, "bad") == ESTATUS_OK);
  struct w* both[] = {&a, &b};
  CHECK(rdzv_all(both, 2) == 0);
  eclient_close(&b.c); /* failure 1 of slot "bad" */
  struct w* one[] = {&a};
  CHECK(rdzv_all(one, 1) == 0 && a.epoch == 2 && a.size == 1); /* reset 1: within the limit */
  CHECK(join(&b, "bad") == ESTATUS_OK);
  eclient_close(&b.c); /* failure 2: excluded */
  /* Once the store has seen the close (only a is live), the slot is excluded. */
  int reg = 0, live = 2;
  for (int64_t end = time_ms() + WAIT_MS; live != 1 && time_ms() < end; usleep(10000)) store_counts(s, &reg, &live);
  CHECK(live == 1);
  CHECK(join(&b, "bad") == ESTATUS_EXCLUDED);
  eclient_close(&b.c);
  CHECK(!store_failed(s, NULL, 0));
  /* A new good worker joins: reset 2 exceeds the limit of 1. */
  struct w c;
  CHECK(join(&c, "good2") == ESTATUS_OK);
  struct rep r;
  CHECK(rdzv(&c, &r) == ESTATUS_WAIT);
  uint32_t ep, pend;
  CHECK(heartbeat(&a, &ep, &pend) == ESTATUS_OK && pend == 1);
  CHECK(rdzv(&a, &r) == ESTATUS_FAIL && strstr(r.text, "reset limit") != NULL);
  char msg[512];
  CHECK(store_failed(s, msg, sizeof(msg)) && strstr(msg, "reset limit"));
  CHECK(heartbeat(&c, &ep, &pend) == ESTATUS_FAIL);
  eclient_close(&a.c);
  eclient_close(&c.c);
  store_stop(s);
}

static int raw_connect(void) {
  union sock_addr a;
  if (sock_parse_addr(addr, "test", &a) != ncclSuccess) return -1;
  int fd = -1;
  return sock_connect(&a, time_ms() + 5000, NULL, &fd) == SOCK_OK ? fd : -1;
}

/* 1 when the store closed the connection (within WAIT_MS). */
static int dropped(int fd) {
  uint8_t b[64];
  int64_t end = time_ms() + WAIT_MS;
  while (time_ms() < end) {
    ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return 1;
    usleep(10000);
  }
  return 0;
}

static void test_hostile(void) {
  struct store* s = start(2, 2, 2, -1, 0);
  CHECK(s != NULL);
  if (!s) return;
  uint8_t hdr[EPROTO_HDR_BYTES];
  uint8_t wrong[EPROTO_SECRET_BYTES] = {0};

  int g = raw_connect(); /* garbage */
  static const char garbage[] = "GET / HTTP/1.0\r\nHost: collie\r\nAccept: */*\r\n\r\n";
  CHECK(g >= 0 && send(g, garbage, sizeof(garbage) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(garbage) - 1);
  int ws = raw_connect(); /* wrong secret */
  eproto_encode_hdr(hdr, EREQ_REGISTER, 0, 1, wrong);
  CHECK(ws >= 0 && send(ws, hdr, sizeof(hdr), MSG_NOSIGNAL) == (ssize_t)sizeof(hdr));
  int big = raw_connect(); /* right secret, absurd length */
  eproto_encode_hdr(hdr, EREQ_REGISTER, 0x7fffffff, 1, secret);
  CHECK(big >= 0 && send(big, hdr, sizeof(hdr), MSG_NOSIGNAL) == (ssize_t)sizeof(hdr));
  int slow = raw_connect(); /* half a header, then nothing */
  CHECK(slow >= 0 && send(slow, hdr, 10, MSG_NOSIGNAL) == 10);
  int early = raw_connect(); /* a request before REGISTER */
  eproto_encode_hdr(hdr, EREQ_RDZV, 4, 1, secret);
  uint8_t m[EPROTO_HDR_BYTES + 4] = {0};
  memcpy(m, hdr, sizeof(hdr));
  CHECK(early >= 0 && send(early, m, sizeof(m), MSG_NOSIGNAL) == (ssize_t)sizeof(m));
  int idle = raw_connect(); /* says nothing at all */

  /* Meanwhile real workers form an epoch. */
  struct w a, b;
  CHECK(join(&a, "a") == ESTATUS_OK);
  CHECK(join(&b, "b") == ESTATUS_OK);
  struct w* both[] = {&a, &b};
  CHECK(rdzv_all(both, 2) == 0 && a.epoch == 1 && a.size == 2 && b.rank == 1);

  CHECK(dropped(g));
  CHECK(dropped(ws));
  CHECK(dropped(big));
  CHECK(dropped(slow));
  CHECK(dropped(early));
  CHECK(dropped(idle));
  int fds[] = {g, ws, big, slow, early, idle};
  for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
    if (fds[i] >= 0) close(fds[i]);

  /* A registered worker that sends garbage is dropped and counts as lost. */
  CHECK(send(b.c.fd, "garbage-garbage-garbage-garbage-garbage", 39, MSG_NOSIGNAL) == 39);
  uint32_t ep, pend = 0;
  int seen = 0;
  for (int64_t end = time_ms() + WAIT_MS; !seen && time_ms() < end;) {
    usleep(10000);
    seen = heartbeat(&a, &ep, &pend) == ESTATUS_OK && pend == 1;
  }
  CHECK(seen);
  eclient_close(&a.c);
  eclient_close(&b.c);
  store_stop(s);
}

int main(void) {
  test_epochs();
  test_reset_limit_and_exclusion();
  test_hostile();
  if (failures) {
    fprintf(stderr, "test_store: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_store: all checks passed\n");
  return 0;
}
