/* Writes the seed corpus of the fuzz targets: valid frames and check-in
 * sequences built with the library's own encoders, and their broken
 * variants (truncated, bad magic, huge lengths, wrong secret, bad check-in
 * payloads). Usage: make_corpus DIR  (creates DIR/frame, DIR/conn, DIR/root).
 * The output is committed under tests/fuzz/corpus; rerun it after a wire
 * format change. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

struct buf {
  uint8_t b[8192];
  size_t n;
};

static const char* outdir;

static void put(struct buf* o, const void* p, size_t n) {
  if (o->n + n > sizeof(o->b)) n = sizeof(o->b) - o->n;
  memcpy(o->b + o->n, p, n);
  o->n += n;
}

static void save(const char* target, const char* name, const struct buf* o) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s/%s", outdir, target, name);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(o->b, 1, o->n, f) != o->n) {
    fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
  fclose(f);
}

static void hdr(struct buf* o, int type, uint32_t len, int32_t rank, uint32_t tag) {
  uint8_t secret[FRAME_SECRET_BYTES], b[FRAME_HDR_BYTES];
  fuzz_secret(secret);
  struct frame_hdr h;
  frame_init(&h, type, len, rank, tag, secret);
  frame_encode(&h, b);
  put(o, b, sizeof(b));
}

static struct checkin ci(int rank, int nranks, int nroots, int root_index, int neighbor) {
  struct checkin c;
  memset(&c, 0, sizeof(c));
  c.rank = rank;
  c.nranks = nranks;
  c.nroots = nroots;
  c.root_index = root_index;
  c.neighbor = neighbor;
  union sock_addr a = fuzz_addr((uint16_t)(30000 + rank));
  memcpy(c.addr, &a, sizeof(c.addr));
  c.nonce = FUZZ_NONCE;
  return c;
}

/* A check-in frame: header + payload. */
static void checkin_frame(struct buf* o, const struct checkin* c) {
  uint8_t p[CHECKIN_BYTES];
  checkin_encode(c, p);
  hdr(o, FRAME_CHECKIN, CHECKIN_BYTES, c->rank, 0);
  put(o, p, sizeof(p));
}

/* One root connection: 2-byte length, then the bytes. */
static void conn_of(struct buf* o, const struct buf* body) {
  uint8_t len[2] = {(uint8_t)body->n, (uint8_t)(body->n >> 8)};
  put(o, len, 2);
  put(o, body->b, body->n);
}

static void root_seq(const char* name, const struct checkin* cs, int n) {
  struct buf o = {.n = 0};
  for (int i = 0; i < n; i++) {
    struct buf one = {.n = 0};
    checkin_frame(&one, &cs[i]);
    conn_of(&o, &one);
  }
  save("root", name, &o);
}

static void frames(void) {
  struct buf o;
  struct checkin c = ci(1, 4, 1, 0, 0);
  o.n = 0; checkin_frame(&o, &c); save("frame", "checkin_valid", &o);
  struct buf full = o;
  o.n = 0; hdr(&o, FRAME_HELLO, 0, 3, 5); save("frame", "hello", &o);
  o.n = 0; hdr(&o, FRAME_MSG, 12, 2, 0x80000000u); put(&o, "hello world", 12); save("frame", "msg", &o);
  o.n = 0; hdr(&o, FRAME_ROOT_REPLY, 28, -1, 0); save("frame", "root_reply_hdr", &o);
  o.n = 0; hdr(&o, FRAME_ROOT_ERROR, 6, -1, 5); put(&o, "oops", 5); save("frame", "root_error", &o);
  o = full; o.n = 20; save("frame", "truncated_hdr", &o);
  o = full; o.n = FRAME_HDR_BYTES + 30; save("frame", "truncated_payload", &o);
  o = full; o.b[0] ^= 0xff; save("frame", "bad_magic", &o);
  o = full; o.b[4] = 2; save("frame", "bad_version", &o);
  o = full; o.b[6] = 0; save("frame", "bad_type_0", &o);
  o = full; o.b[6] = FRAME_TYPE_MAX + 1; save("frame", "bad_type_max", &o);
  o = full; o.b[24 + 7] ^= 1; save("frame", "wrong_secret", &o);
  o = full; memset(o.b + 8, 0xff, 4); save("frame", "huge_len", &o);
  o.n = 0; hdr(&o, FRAME_MSG, FRAME_MAX_PAYLOAD + 1, 0, 0); save("frame", "len_over_cap", &o);
  o.n = 0; hdr(&o, FRAME_MSG, 4097, 0, 0); save("frame", "len_4097", &o);
  o.n = 0; hdr(&o, FRAME_MSG, 1, -2, 0); save("frame", "rank_minus2", &o);
  o.n = 0; hdr(&o, FRAME_MSG, 1, INT32_MAX, 0); save("frame", "rank_max", &o);
  o.n = 0; hdr(&o, FRAME_MSG, 0, 8, 0); save("frame", "rank_8", &o);
  /* Check-in payloads with one field out of range each. */
  struct { const char* name; struct checkin c; } bad[] = {
      {"checkin_nranks0", ci(0, 0, 1, 0, 0)},         {"checkin_rank_ge_n", ci(4, 4, 1, 0, 0)},
      {"checkin_rank_neg", ci(-1, 4, 1, 0, 0)},       {"checkin_nroots_gt_n", ci(0, 2, 3, 0, 0)},
      {"checkin_root_index", ci(0, 4, 2, 2, 0)},      {"checkin_neighbor2", ci(0, 4, 2, 0, 2)},
      {"checkin_nranks_max", ci(0, INT32_MAX, 1, 0, 0)}, {"checkin_valid_2roots", ci(2, 4, 2, 1, 1)},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    o.n = 0;
    checkin_frame(&o, &bad[i].c);
    save("frame", bad[i].name, &o);
  }
  c = ci(0, 2, 1, 0, 0);
  memset(c.addr, 0, sizeof(c.addr)); /* family 0 */
  o.n = 0; checkin_frame(&o, &c); save("frame", "checkin_family0", &o);
  c = ci(0, 2, 1, 0, 0);
  union sock_addr a6;
  memset(&a6, 0, sizeof(a6));
  a6.sin6.sin6_family = AF_INET6;
  a6.sin6.sin6_port = htons(4000);
  a6.sin6.sin6_addr.s6_addr[15] = 1;
  memcpy(c.addr, &a6, sizeof(c.addr));
  o.n = 0; checkin_frame(&o, &c); save("frame", "checkin_ipv6", &o);
  /* A unique ID's bytes (also read as a frame: bad magic). */
  struct bootstrap_id id = fuzz_id();
  o.n = 0; put(&o, &id, sizeof(id)); save("frame", "unique_id", &o);
  o.b[4] = 9; save("frame", "unique_id_bad_version", &o);
  o.n = 0; save("frame", "empty", &o);
}

static void conns(void) {
  /* Settings bytes: payload cap 2^d0, rank bound d1+1 (255: any), chunk 1 + d2 % 97. */
  const uint8_t any[3] = {16, 255, 96}, bytewise[3] = {16, 255, 0}, tight[3] = {5, 3, 6};
  struct buf o, m;
  struct checkin c = ci(1, 4, 1, 0, 0);
  m.n = 0; checkin_frame(&m, &c);
  o.n = 0; put(&o, any, 3); put(&o, m.b, m.n); save("conn", "one_checkin", &o);
  o.n = 0; put(&o, bytewise, 3); put(&o, m.b, m.n); save("conn", "one_checkin_bytewise", &o);
  o.n = 0; put(&o, tight, 3); put(&o, m.b, m.n); save("conn", "checkin_over_cap", &o);
  o.n = 0; put(&o, any, 3);
  hdr(&o, FRAME_HELLO, 0, 2, 1);
  hdr(&o, FRAME_MSG, 5, 2, 7); put(&o, "abcde", 5);
  hdr(&o, FRAME_MSG, 0, 2, 8);
  save("conn", "hello_then_msgs", &o);
  struct buf two = o;
  o = two; o.n -= 20; save("conn", "msgs_truncated_hdr", &o);
  o = two; o.n = 3 + FRAME_HDR_BYTES * 2 + 2; save("conn", "msgs_truncated_payload", &o);
  o.n = 0; put(&o, any, 3); hdr(&o, FRAME_MSG, 0xffffffffu, 0, 0); save("conn", "huge_len", &o);
  o.n = 0; put(&o, any, 3); hdr(&o, FRAME_MSG, 4, 0, 0); o.b[3 + 30] ^= 0x55; put(&o, "abcd", 4);
  save("conn", "wrong_secret", &o);
  o.n = 0; put(&o, any, 3); put(&o, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27); save("conn", "http", &o);
  o.n = 0; put(&o, tight, 3); hdr(&o, FRAME_MSG, 1, 3, 0); put(&o, "x", 1); save("conn", "rank_over_bound", &o);
  o.n = 0; put(&o, any, 3); save("conn", "nothing", &o);
}

static void roots(void) {
  struct checkin s[24];
  s[0] = ci(0, 1, 1, 0, 0);
  root_seq("single_rank", s, 1);
  for (int i = 0; i < 3; i++) s[i] = ci(i, 3, 1, 0, 0);
  root_seq("three_in_order", s, 3);
  struct checkin t[3] = {s[2], s[0], s[1]};
  root_seq("three_out_of_order", t, 3);
  root_seq("one_missing", s, 2);
  struct checkin d[3] = {s[0], s[1], s[1]};
  root_seq("duplicate_rank", d, 3);
  struct checkin m[2] = {s[0], ci(1, 4, 1, 0, 0)};
  root_seq("nranks_mismatch", m, 2);
  /* Two roots over 4 ranks: root 0 serves ranks 0-1 and hears from rank 2 as neighbour. */
  struct checkin two[3] = {ci(0, 4, 2, 0, 0), ci(1, 4, 2, 0, 0), ci(2, 4, 2, 0, 1)};
  root_seq("two_roots_block0", two, 3);
  struct checkin wrong_nb[2] = {ci(0, 4, 2, 0, 0), ci(3, 4, 2, 0, 1)};
  root_seq("unexpected_neighbor", wrong_nb, 2);
  struct checkin outside[2] = {ci(0, 4, 2, 0, 0), ci(3, 4, 2, 0, 0)};
  root_seq("rank_outside_block", outside, 2);
  struct checkin nb_single[1] = {ci(0, 2, 1, 0, 1)};
  root_seq("neighbor_single_root", nb_single, 1);
  for (int i = 0; i < 2; i++) s[i] = ci(i * 7, 20, 1, 0, 0);
  root_seq("many_missing", s, 2);
  s[0] = ci(0, INT32_MAX, 1, 0, 0);
  root_seq("nranks_huge", s, 1);
  s[0] = ci(0, 1 << 24, 1 << 24, 5, 0);
  root_seq("many_roots", s, 1);
  /* Broken connections among good ones. */
  struct buf o = {.n = 0}, one;
  one.n = 0; checkin_frame(&one, &(struct checkin){0}); conn_of(&o, &one);
  struct checkin g = ci(0, 2, 1, 0, 0);
  one.n = 0; checkin_frame(&one, &g); one.b[30] ^= 1; conn_of(&o, &one);  /* wrong secret */
  one.n = 0; checkin_frame(&one, &g); one.n = 50; conn_of(&o, &one);      /* truncated */
  one.n = 0; conn_of(&o, &one);                                           /* empty */
  one.n = 0; hdr(&one, FRAME_HELLO, 0, 0, 0); conn_of(&o, &one);          /* not a check-in */
  g.nonce ^= 1;
  one.n = 0; checkin_frame(&one, &g); conn_of(&o, &one);                  /* other job */
  one.n = 0; hdr(&one, FRAME_CHECKIN, 5000, 0, 0); conn_of(&o, &one);     /* over the root's cap */
  one.n = 0; hdr(&one, FRAME_CHECKIN, 10, 0, 0); put(&one, "0123456789", 10); conn_of(&o, &one);
  g = ci(0, 2, 1, 0, 0);
  one.n = 0; checkin_frame(&one, &g); conn_of(&o, &one);
  g = ci(1, 2, 1, 0, 0);
  one.n = 0; checkin_frame(&one, &g); conn_of(&o, &one);
  save("root", "garbage_then_valid", &o);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  outdir = argv[1];
  const char* sub[] = {"frame", "conn", "root"};
  for (int i = 0; i < 3; i++) {
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", outdir, sub[i]);
    mkdir(outdir, 0755);
    mkdir(p, 0755);
  }
  frames();
  conns();
  roots();
  return 0;
}
