/* Unit tests for the bootstrap wire format (src/bootstrap/frame.c): header
 * round trip, every rejection verdict, check-in payload validation, and a
 * fixed-seed garbage/mutation fuzz that ASan builds also check for overreads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "bootstrap/frame.h"

static const uint8_t secret_a[FRAME_SECRET_BYTES] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
                                                     0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10};

/* Deterministic xorshift64 so every run (and every failure) is reproducible. */
static uint64_t rng_state;
static uint64_t rng_next(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  rng_state = x;
  return x;
}

/* A valid encoded header: FRAME_MSG, len 100, rank 3, tag 0xdeadbeef. */
static void make_valid(uint8_t buf[FRAME_HDR_BYTES]) {
  struct frame_hdr h;
  frame_init(&h, FRAME_MSG, 100, 3, 0xdeadbeefu, secret_a);
  frame_encode(&h, buf);
}

static int decode_default(const uint8_t* buf, size_t n, struct frame_hdr* out) {
  return frame_decode(buf, n, secret_a, 1u << 20, 8, out);
}

/* ---- header ---------------------------------------------------------------- */

static void test_round_trip_all_fields(void** state) {
  (void)state;
  struct frame_hdr h, d;
  frame_init(&h, FRAME_HELLO, 12345, 7, 0xa1b2c3d4u, secret_a);
  h.reserved = 0x5566u;
  uint8_t buf[FRAME_HDR_BYTES];
  frame_encode(&h, buf);
  memset(&d, 0xee, sizeof(d));
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 1u << 20, 8, &d), FRAME_OK);
  assert_int_equal(d.magic, FRAME_MAGIC);
  assert_int_equal(d.version, FRAME_VERSION);
  assert_int_equal(d.type, FRAME_HELLO);
  assert_int_equal(d.len, 12345);
  assert_int_equal(d.rank, 7);
  assert_int_equal(d.tag, 0xa1b2c3d4u);
  assert_int_equal(d.reserved, 0x5566u);
  assert_memory_equal(d.secret, secret_a, FRAME_SECRET_BYTES);
}

static void test_encoding_is_little_endian(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  make_valid(buf);
  /* "COLC" as a little-endian 0x434c4f43 */
  assert_int_equal(buf[0], 0x43);
  assert_int_equal(buf[1], 0x4f);
  assert_int_equal(buf[2], 0x4c);
  assert_int_equal(buf[3], 0x43);
  assert_int_equal(buf[4], FRAME_VERSION);
  assert_int_equal(buf[5], 0);
  assert_int_equal(buf[6], FRAME_MSG);
  assert_int_equal(buf[8], 100);
  assert_int_equal(buf[12], 3);
  assert_int_equal(buf[16], 0xef);
  assert_int_equal(buf[19], 0xde);
  assert_memory_equal(buf + 24, secret_a, FRAME_SECRET_BYTES);
}

static void test_round_trip_every_type_and_edge_ranks(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr h, d;
  for (int type = FRAME_CHECKIN; type <= FRAME_TYPE_MAX; type++) {
    int32_t ranks[] = {-1, 0, 7};
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
      frame_init(&h, type, 0, ranks[i], 0, secret_a);
      frame_encode(&h, buf);
      assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 0, 8, &d), FRAME_OK);
      assert_int_equal(d.type, type);
      assert_int_equal(d.rank, ranks[i]);
      assert_int_equal(d.len, 0);
    }
  }
}

static void test_len_at_limits_accepted(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr h, d;
  frame_init(&h, FRAME_MSG, 4096, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 4096, 1, &d), FRAME_OK);
  frame_init(&h, FRAME_MSG, FRAME_MAX_PAYLOAD, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, UINT32_MAX, 1, &d), FRAME_OK);
  assert_int_equal(d.len, FRAME_MAX_PAYLOAD);
}

static void test_bad_magic(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  for (int i = 0; i < 4; i++) {
    make_valid(buf);
    buf[i] ^= 0x01;
    assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_MAGIC);
  }
  memset(buf, 0, sizeof(buf));
  assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_MAGIC);
  /* An HTTP request hitting the port. */
  memcpy(buf, "GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789ab", FRAME_HDR_BYTES);
  assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_MAGIC);
}

static void test_bad_version(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  uint16_t versions[] = {0, 2, 0x0100, 0xffff};
  for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
    make_valid(buf);
    buf[4] = (uint8_t)versions[i];
    buf[5] = (uint8_t)(versions[i] >> 8);
    assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_VERSION);
  }
}

static void test_bad_type(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  uint16_t types[] = {0, FRAME_TYPE_MAX + 1, 6, 7, 0x0101, 0xffff};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    make_valid(buf);
    buf[6] = (uint8_t)types[i];
    buf[7] = (uint8_t)(types[i] >> 8);
    assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_TYPE);
  }
}

static void test_bad_secret_first_and_last_byte(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  uint8_t other[FRAME_SECRET_BYTES];

  make_valid(buf);
  memcpy(other, secret_a, sizeof(other));
  other[0] ^= 0x80;
  assert_int_equal(frame_decode(buf, sizeof(buf), other, 1u << 20, 8, &d), FRAME_BAD_SECRET);

  memcpy(other, secret_a, sizeof(other));
  other[FRAME_SECRET_BYTES - 1] ^= 0x01;
  assert_int_equal(frame_decode(buf, sizeof(buf), other, 1u << 20, 8, &d), FRAME_BAD_SECRET);

  /* Same thing on the wire side. */
  make_valid(buf);
  buf[24] ^= 0x01;
  assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_SECRET);
  make_valid(buf);
  buf[FRAME_HDR_BYTES - 1] ^= 0x01;
  assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_BAD_SECRET);

  /* An all-zero secret is not a wildcard. */
  memset(other, 0, sizeof(other));
  make_valid(buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), other, 1u << 20, 8, &d), FRAME_BAD_SECRET);
}

static void test_too_long(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr h, d;

  frame_init(&h, FRAME_MSG, 4097, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 4096, 1, &d), FRAME_TOO_LONG);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 0, 1, &d), FRAME_TOO_LONG);

  /* FRAME_MAX_PAYLOAD is a hard cap even when the caller passes more. */
  frame_init(&h, FRAME_MSG, FRAME_MAX_PAYLOAD + 1, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, UINT32_MAX, 1, &d), FRAME_TOO_LONG);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, FRAME_MAX_PAYLOAD + 1, 1, &d), FRAME_TOO_LONG);

  frame_init(&h, FRAME_MSG, UINT32_MAX, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, UINT32_MAX, 1, &d), FRAME_TOO_LONG);
}

static void test_bad_rank(void** state) {
  (void)state;
  uint8_t buf[FRAME_HDR_BYTES];
  struct frame_hdr h, d;
  int32_t bad[] = {-2, INT32_MIN, 8, 9, INT32_MAX};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    frame_init(&h, FRAME_MSG, 0, bad[i], 0, secret_a);
    frame_encode(&h, buf);
    assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 0, 8, &d), FRAME_BAD_RANK);
  }
  /* max_rank 0: only the root (-1) may speak. */
  frame_init(&h, FRAME_ROOT_REPLY, 0, 0, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 0, 0, &d), FRAME_BAD_RANK);
  frame_init(&h, FRAME_ROOT_REPLY, 0, -1, 0, secret_a);
  frame_encode(&h, buf);
  assert_int_equal(frame_decode(buf, sizeof(buf), secret_a, 0, 0, &d), FRAME_OK);
}

static void test_short_buffer(void** state) {
  (void)state;
  uint8_t full[FRAME_HDR_BYTES];
  struct frame_hdr d;
  make_valid(full);
  /* Heap copies of exact size so ASan flags any read past n. */
  for (size_t n = 0; n < FRAME_HDR_BYTES; n++) {
    uint8_t* p = malloc(n ? n : 1);
    assert_non_null(p);
    memcpy(p, full, n);
    assert_int_not_equal(decode_default(p, n, &d), FRAME_OK);
    free(p);
  }
  assert_int_equal(decode_default(NULL, 0, &d), FRAME_BAD_MAGIC);
  /* Trailing bytes beyond the header are not the decoder's business. */
  uint8_t longer[FRAME_HDR_BYTES + 8];
  memcpy(longer, full, FRAME_HDR_BYTES);
  memset(longer + FRAME_HDR_BYTES, 0xaa, 8);
  assert_int_equal(decode_default(longer, sizeof(longer), &d), FRAME_OK);
}

static void test_verdict_strings(void** state) {
  (void)state;
  for (int v = FRAME_OK; v <= FRAME_BAD_RANK; v++) {
    const char* s = frame_verdict_str(v);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    for (int w = FRAME_OK; w < v; w++) assert_string_not_equal(s, frame_verdict_str(w));
  }
  assert_non_null(frame_verdict_str(-1));
  assert_non_null(frame_verdict_str(1000));
}

/* ---- fuzz ---------------------------------------------------------------- */

static void test_random_garbage_never_ok(void** state) {
  (void)state;
  rng_state = 0x9e3779b97f4a7c15ull;
  struct frame_hdr d;
  for (int iter = 0; iter < 100000; iter++) {
    /* Lengths 0..47 so short buffers are fuzzed too; exact-size heap
     * allocation lets ASan catch a read past n. */
    size_t n = (size_t)(rng_next() % (FRAME_HDR_BYTES + 8));
    uint8_t* p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_next();
    /* Every fourth buffer gets a valid magic/version/type so the secret
     * check is the one under test, not just the magic. */
    if ((iter & 3) == 0 && n >= 8) {
      p[0] = 0x43; p[1] = 0x4f; p[2] = 0x4c; p[3] = 0x43;
      p[4] = FRAME_VERSION; p[5] = 0;
      p[6] = (uint8_t)(1 + rng_next() % FRAME_TYPE_MAX); p[7] = 0;
    }
    int v = frame_decode(p, n, secret_a, UINT32_MAX, INT32_MAX, &d);
    if (v == FRAME_OK) {
      /* Only acceptable if the random bytes happen to carry our secret. */
      assert_true(n >= FRAME_HDR_BYTES);
      assert_memory_equal(p + 24, secret_a, FRAME_SECRET_BYTES);
    }
    assert_true(v >= FRAME_OK && v <= FRAME_BAD_RANK);
    free(p);
  }
}

static void test_mutation_of_guarded_bytes_rejected(void** state) {
  (void)state;
  uint8_t valid[FRAME_HDR_BYTES], buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  make_valid(valid);
  assert_int_equal(decode_default(valid, sizeof(valid), &d), FRAME_OK);
  for (int pos = 0; pos < FRAME_HDR_BYTES; pos++) {
    int guarded = pos < 6 || pos >= 24; /* magic, version, secret */
    if (!guarded) continue;
    for (int x = 1; x < 256; x++) {
      memcpy(buf, valid, sizeof(buf));
      buf[pos] ^= (uint8_t)x;
      int v = decode_default(buf, sizeof(buf), &d);
      if (v == FRAME_OK) fail_msg("byte %d xor 0x%02x accepted", pos, x);
      if (pos < 4) assert_int_equal(v, FRAME_BAD_MAGIC);
      else if (pos < 6) assert_int_equal(v, FRAME_BAD_VERSION);
      else assert_int_equal(v, FRAME_BAD_SECRET);
    }
  }
}

static void test_mutation_of_tag_reserved_passes_through(void** state) {
  (void)state;
  uint8_t valid[FRAME_HDR_BYTES], buf[FRAME_HDR_BYTES];
  struct frame_hdr d;
  make_valid(valid);
  rng_state = 12345;
  for (int iter = 0; iter < 1000; iter++) {
    memcpy(buf, valid, sizeof(buf));
    int pos = 16 + (int)(rng_next() % 8);
    buf[pos] = (uint8_t)rng_next();
    assert_int_equal(decode_default(buf, sizeof(buf), &d), FRAME_OK);
    uint32_t tag = (uint32_t)buf[16] | (uint32_t)buf[17] << 8 | (uint32_t)buf[18] << 16 | (uint32_t)buf[19] << 24;
    uint32_t res = (uint32_t)buf[20] | (uint32_t)buf[21] << 8 | (uint32_t)buf[22] << 16 | (uint32_t)buf[23] << 24;
    assert_int_equal(d.tag, tag);
    assert_int_equal(d.reserved, res);
  }
}

/* ---- check-in payload ------------------------------------------------------ */

static void make_checkin(struct checkin* c) {
  memset(c, 0, sizeof(*c));
  c->rank = 5;
  c->nranks = 16;
  c->nroots = 4;
  c->root_index = 1;
  c->neighbor = 1;
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_port = htons(4242);
  sin.sin_addr.s_addr = htonl(0x0a000001u);
  memcpy(c->addr, &sin, sizeof(sin));
  c->nonce = 0x0123456789abcdefull;
}

static void test_checkin_round_trip_ipv4(void** state) {
  (void)state;
  struct checkin c, d;
  uint8_t buf[CHECKIN_BYTES];
  char why[128] = "";
  make_checkin(&c);
  checkin_encode(&c, buf);
  memset(&d, 0xee, sizeof(d));
  assert_int_equal(checkin_decode(buf, sizeof(buf), &d, why, sizeof(why)), 0);
  assert_int_equal(d.rank, 5);
  assert_int_equal(d.nranks, 16);
  assert_int_equal(d.nroots, 4);
  assert_int_equal(d.root_index, 1);
  assert_int_equal(d.neighbor, 1);
  assert_memory_equal(d.addr, c.addr, sizeof(c.addr));
  assert_true(d.nonce == 0x0123456789abcdefull);
  /* nonce is little-endian at offset 48 */
  assert_int_equal(buf[48], 0xef);
  assert_int_equal(buf[55], 0x01);
}

static void test_checkin_round_trip_ipv6(void** state) {
  (void)state;
  struct checkin c, d;
  uint8_t buf[CHECKIN_BYTES];
  char why[128] = "";
  make_checkin(&c);
  c.rank = 0;
  c.nranks = 1;
  c.nroots = 1;
  c.root_index = 0;
  c.neighbor = 0;
  c.nonce = UINT64_MAX;
  struct sockaddr_in6 sin6;
  assert_true(sizeof(sin6) <= sizeof(c.addr));
  memset(&sin6, 0, sizeof(sin6));
  sin6.sin6_family = AF_INET6;
  sin6.sin6_port = htons(65535);
  assert_int_equal(inet_pton(AF_INET6, "fe80::1:2:3:4", &sin6.sin6_addr), 1);
  sin6.sin6_scope_id = 7;
  memcpy(c.addr, &sin6, sizeof(sin6));
  checkin_encode(&c, buf);
  assert_int_equal(checkin_decode(buf, sizeof(buf), &d, why, sizeof(why)), 0);
  assert_int_equal(d.nranks, 1);
  assert_int_equal(d.neighbor, 0);
  assert_true(d.nonce == UINT64_MAX);
  assert_memory_equal(d.addr, c.addr, sizeof(c.addr));
}

/* Encodes `c`, expects checkin_decode to fail with a non-empty reason. */
static void expect_checkin_reject(const struct checkin* c, const char* what) {
  uint8_t buf[CHECKIN_BYTES];
  struct checkin d;
  char why[128];
  why[0] = '\0';
  checkin_encode(c, buf);
  if (checkin_decode(buf, sizeof(buf), &d, why, sizeof(why)) != -1) fail_msg("accepted: %s", what);
  if (why[0] == '\0') fail_msg("no reason given for: %s", what);
}

static void test_checkin_wrong_length(void** state) {
  (void)state;
  struct checkin c, d;
  uint8_t buf[CHECKIN_BYTES + 1];
  char why[128];
  make_checkin(&c);
  checkin_encode(&c, buf);
  size_t lens[] = {0, 1, CHECKIN_BYTES - 1, CHECKIN_BYTES + 1};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    why[0] = '\0';
    assert_int_equal(checkin_decode(buf, lens[i], &d, why, sizeof(why)), -1);
    assert_true(strlen(why) > 0);
  }
  /* A tiny `why` buffer is truncated, never overrun. */
  char tiny[4] = {'x', 'x', 'x', 'x'};
  assert_int_equal(checkin_decode(buf, 3, &d, tiny, 2), -1);
  assert_int_equal(tiny[1], '\0');
  assert_int_equal(tiny[2], 'x');
}

static void test_checkin_bad_nranks(void** state) {
  (void)state;
  struct checkin c;
  make_checkin(&c);
  c.nranks = 0;
  c.rank = 0;
  c.nroots = 0;
  c.root_index = 0;
  expect_checkin_reject(&c, "nranks 0");
  make_checkin(&c);
  c.nranks = -3;
  expect_checkin_reject(&c, "nranks -3");
  make_checkin(&c);
  c.nranks = INT32_MIN;
  expect_checkin_reject(&c, "nranks INT32_MIN");
}

static void test_checkin_bad_rank(void** state) {
  (void)state;
  struct checkin c;
  int32_t bad[] = {-1, INT32_MIN, 16, 17, INT32_MAX};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    make_checkin(&c);
    c.rank = bad[i];
    expect_checkin_reject(&c, "rank out of range");
  }
  make_checkin(&c);
  c.rank = 15;
  uint8_t buf[CHECKIN_BYTES];
  struct checkin d;
  char why[128];
  checkin_encode(&c, buf);
  assert_int_equal(checkin_decode(buf, sizeof(buf), &d, why, sizeof(why)), 0);
}

static void test_checkin_bad_roots(void** state) {
  (void)state;
  struct checkin c;
  make_checkin(&c);
  c.nroots = 0;
  c.root_index = 0;
  expect_checkin_reject(&c, "nroots 0");
  make_checkin(&c);
  c.nroots = -1;
  expect_checkin_reject(&c, "nroots -1");
  make_checkin(&c);
  c.nroots = 17; /* more roots than ranks */
  expect_checkin_reject(&c, "nroots > nranks");
  make_checkin(&c);
  c.root_index = -1;
  expect_checkin_reject(&c, "root_index -1");
  make_checkin(&c);
  c.root_index = 4; /* == nroots */
  expect_checkin_reject(&c, "root_index == nroots");
  make_checkin(&c);
  c.root_index = INT32_MAX;
  expect_checkin_reject(&c, "root_index INT32_MAX");
}

static void test_checkin_bad_neighbor(void** state) {
  (void)state;
  struct checkin c;
  int32_t bad[] = {2, -1, 256, INT32_MIN};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    make_checkin(&c);
    c.neighbor = bad[i];
    expect_checkin_reject(&c, "neighbor flag");
  }
}

static void test_checkin_bad_family(void** state) {
  (void)state;
  struct checkin c;
  uint16_t fams[] = {AF_UNSPEC, AF_UNIX, AF_PACKET, 0xffff};
  for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
    make_checkin(&c);
    memcpy(c.addr, &fams[i], sizeof(fams[i]));
    expect_checkin_reject(&c, "address family");
  }
}

static void test_checkin_random_garbage(void** state) {
  (void)state;
  rng_state = 0xc0ffee;
  struct checkin d;
  char why[128];
  for (int iter = 0; iter < 20000; iter++) {
    size_t n = (size_t)(rng_next() % (CHECKIN_BYTES + 8));
    uint8_t* p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng_next();
    why[0] = '\0';
    int rc = checkin_decode(p, n, &d, why, sizeof(why));
    if (rc == 0) {
      assert_true(d.nranks >= 1 && d.rank >= 0 && d.rank < d.nranks);
      assert_true(d.nroots >= 1 && d.nroots <= d.nranks && d.root_index >= 0 && d.root_index < d.nroots);
      assert_true(d.neighbor == 0 || d.neighbor == 1);
    } else {
      assert_int_equal(rc, -1);
      assert_true(strlen(why) > 0);
    }
    free(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_all_fields),
      cmocka_unit_test(test_encoding_is_little_endian),
      cmocka_unit_test(test_round_trip_every_type_and_edge_ranks),
      cmocka_unit_test(test_len_at_limits_accepted),
      cmocka_unit_test(test_bad_magic),
      cmocka_unit_test(test_bad_version),
      cmocka_unit_test(test_bad_type),
      cmocka_unit_test(test_bad_secret_first_and_last_byte),
      cmocka_unit_test(test_too_long),
      cmocka_unit_test(test_bad_rank),
      cmocka_unit_test(test_short_buffer),
      cmocka_unit_test(test_verdict_strings),
      cmocka_unit_test(test_random_garbage_never_ok),
      cmocka_unit_test(test_mutation_of_guarded_bytes_rejected),
      cmocka_unit_test(test_mutation_of_tag_reserved_passes_through),
      cmocka_unit_test(test_checkin_round_trip_ipv4),
      cmocka_unit_test(test_checkin_round_trip_ipv6),
      cmocka_unit_test(test_checkin_wrong_length),
      cmocka_unit_test(test_checkin_bad_nranks),
      cmocka_unit_test(test_checkin_bad_rank),
      cmocka_unit_test(test_checkin_bad_roots),
      cmocka_unit_test(test_checkin_bad_neighbor),
      cmocka_unit_test(test_checkin_bad_family),
      cmocka_unit_test(test_checkin_random_garbage),
  };
  return cmocka_run_group_tests_name("frame", tests, NULL, NULL);
}
