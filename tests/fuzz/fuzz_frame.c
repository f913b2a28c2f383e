/* Fuzz target: the bootstrap wire format (src/bootstrap/frame.c) and the
 * unique-ID check. Input: any bytes, read as a frame header, a check-in
 * payload and a ncclUniqueId. Properties: decoding never reads past the
 * input, and whatever decodes re-encodes to the same bytes. */
#include <stdio.h>
#include <string.h>

#include "fuzz_common.h"

int fuzz_reached;

static void frame_case(const uint8_t* d, size_t n, uint32_t max_len, int32_t max_rank) {
  uint8_t secret[FRAME_SECRET_BYTES];
  fuzz_secret(secret);
  struct frame_hdr h;
  int v = frame_decode(d, n, secret, max_len, max_rank, &h);
  FUZZ_ASSERT(frame_verdict_str(v) != NULL);
  if (v != FRAME_OK) return;
  FUZZ_ASSERT(n >= FRAME_HDR_BYTES);
  FUZZ_ASSERT(h.len <= max_len && h.len <= FRAME_MAX_PAYLOAD);
  FUZZ_ASSERT(h.rank >= -1 && h.rank < max_rank);
  FUZZ_ASSERT(h.type >= FRAME_CHECKIN && h.type <= FRAME_TYPE_MAX);
  FUZZ_ASSERT(h.magic == FRAME_MAGIC && h.version == FRAME_VERSION);
  FUZZ_ASSERT(memcmp(h.secret, secret, FRAME_SECRET_BYTES) == 0);
  uint8_t again[FRAME_HDR_BYTES];
  frame_encode(&h, again);
  FUZZ_ASSERT(memcmp(again, d, FRAME_HDR_BYTES) == 0);
  fuzz_reached++;
}

static void checkin_case(const uint8_t* d, size_t n) {
  struct checkin c;
  char why[256];
  why[0] = '\0';
  if (checkin_decode(d, n, &c, why, sizeof(why)) != 0) {
    FUZZ_ASSERT(why[0] != '\0');
    return;
  }
  FUZZ_ASSERT(n == CHECKIN_BYTES);
  FUZZ_ASSERT(c.nranks >= 1 && c.nranks <= CHECKIN_MAX_RANKS && c.rank >= 0 && c.rank < c.nranks);
  FUZZ_ASSERT(c.root_index >= 0 && c.root_index < c.nroots && c.nroots <= c.nranks);
  uint8_t again[CHECKIN_BYTES];
  checkin_encode(&c, again);
  FUZZ_ASSERT(memcmp(again, d, CHECKIN_BYTES) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) {
  fuzz_quiet();
  frame_case(d, n, FRAME_MAX_PAYLOAD, INT32_MAX);
  frame_case(d, n, 4096, 8);
  checkin_case(d, n);
  if (n >= FRAME_HDR_BYTES) checkin_case(d + FRAME_HDR_BYTES, n - FRAME_HDR_BYTES);
  /* The same bytes as a ncclUniqueId (zero-padded), as a user could pass one. */
  ncclUniqueId uid;
  memset(&uid, 0, sizeof(uid));
  memcpy(&uid, d, n < sizeof(uid) ? n : sizeof(uid));
  struct bootstrap_id id;
  if (bootstrap_id_decode(&uid, &id) == ncclSuccess) FUZZ_ASSERT(sock_addr_valid(&id.root));
  return 0;
}
