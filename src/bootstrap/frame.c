/* Bootstrap wire format; see frame.h. */
#include "frame.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static void put32(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static void put16(uint8_t* p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static uint32_t get32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t get16(const uint8_t* p) { return (uint16_t)(p[0] | p[1] << 8); }

const char* frame_verdict_str(int v) {
  switch (v) {
    case FRAME_OK: return "ok";
    case FRAME_BAD_MAGIC: return "not a collie bootstrap frame (bad magic)";
    case FRAME_BAD_VERSION: return "unsupported bootstrap protocol version";
    case FRAME_BAD_TYPE: return "unknown frame type";
    case FRAME_BAD_SECRET: return "wrong job secret";
    case FRAME_TOO_LONG: return "payload length too large";
    case FRAME_BAD_RANK: return "rank out of range";
    default: return "malformed frame";
  }
}

void frame_init(struct frame_hdr* h, int type, uint32_t len, int32_t rank, uint32_t tag,
                const uint8_t secret[FRAME_SECRET_BYTES]) {
  memset(h, 0, sizeof(*h));
  h->magic = FRAME_MAGIC;
  h->version = FRAME_VERSION;
  h->type = (uint16_t)type;
  h->len = len;
  h->rank = rank;
  h->tag = tag;
  memcpy(h->secret, secret, FRAME_SECRET_BYTES);
}

void frame_encode(const struct frame_hdr* h, uint8_t out[FRAME_HDR_BYTES]) {
  put32(out, h->magic);
  put16(out + 4, h->version);
  put16(out + 6, h->type);
  put32(out + 8, h->len);
  put32(out + 12, (uint32_t)h->rank);
  put32(out + 16, h->tag);
  put32(out + 20, h->reserved);
  memcpy(out + 24, h->secret, FRAME_SECRET_BYTES);
}

int frame_decode(const uint8_t* in, size_t n, const uint8_t secret[FRAME_SECRET_BYTES], uint32_t max_len,
                 int32_t max_rank, struct frame_hdr* out) {
  if (n < FRAME_HDR_BYTES) return FRAME_BAD_MAGIC;
  out->magic = get32(in);
  if (out->magic != FRAME_MAGIC) return FRAME_BAD_MAGIC;
  out->version = get16(in + 4);
  if (out->version != FRAME_VERSION) return FRAME_BAD_VERSION;
  out->type = get16(in + 6);
  if (out->type < FRAME_CHECKIN || out->type > FRAME_TYPE_MAX) return FRAME_BAD_TYPE;
  memcpy(out->secret, in + 24, FRAME_SECRET_BYTES);
  /* Compare the whole secret regardless of where it differs. */
  uint8_t diff = 0;
  for (int i = 0; i < FRAME_SECRET_BYTES; i++) diff |= (uint8_t)(out->secret[i] ^ secret[i]);
  if (diff) return FRAME_BAD_SECRET;
  out->len = get32(in + 8);
  if (max_len > FRAME_MAX_PAYLOAD) max_len = FRAME_MAX_PAYLOAD;
  if (out->len > max_len) return FRAME_TOO_LONG;
  out->rank = (int32_t)get32(in + 12);
  if (out->rank < -1 || out->rank >= max_rank) return FRAME_BAD_RANK;
  out->tag = get32(in + 16);
  out->reserved = get32(in + 20);
  return FRAME_OK;
}

void checkin_encode(const struct checkin* c, uint8_t out[CHECKIN_BYTES]) {
  put32(out, (uint32_t)c->rank);
  put32(out + 4, (uint32_t)c->nranks);
  put32(out + 8, (uint32_t)c->nroots);
  put32(out + 12, (uint32_t)c->root_index);
  put32(out + 16, (uint32_t)c->neighbor);
  memcpy(out + 20, c->addr, sizeof(c->addr));
  put32(out + 48, (uint32_t)c->nonce);
  put32(out + 52, (uint32_t)(c->nonce >> 32));
}

int checkin_decode(const uint8_t* in, size_t n, struct checkin* c, char* why, size_t why_len) {
  if (n != CHECKIN_BYTES) {
    snprintf(why, why_len, "check-in payload of %zu bytes (expected %d)", n, CHECKIN_BYTES);
    return -1;
  }
  c->rank = (int32_t)get32(in);
  c->nranks = (int32_t)get32(in + 4);
  c->nroots = (int32_t)get32(in + 8);
  c->root_index = (int32_t)get32(in + 12);
  c->neighbor = (int32_t)get32(in + 16);
  memcpy(c->addr, in + 20, sizeof(c->addr));
  c->nonce = (uint64_t)get32(in + 48) | (uint64_t)get32(in + 52) << 32;
  if (c->nranks < 1 || c->nranks > CHECKIN_MAX_RANKS) {
    snprintf(why, why_len, "nranks %d outside [1, %d]", c->nranks, CHECKIN_MAX_RANKS);
    return -1;
  }
  if (c->rank < 0 || c->rank >= c->nranks) {
    snprintf(why, why_len, "rank %d outside [0, %d)", c->rank, c->nranks);
    return -1;
  }
  if (c->nroots < 1 || c->nroots > c->nranks || c->root_index < 0 || c->root_index >= c->nroots) {
    snprintf(why, why_len, "root %d of %d invalid for %d ranks", c->root_index, c->nroots, c->nranks);
    return -1;
  }
  if (c->neighbor != 0 && c->neighbor != 1) {
    snprintf(why, why_len, "neighbor flag %d", c->neighbor);
    return -1;
  }
  uint16_t fam;
  memcpy(&fam, c->addr, sizeof(fam));
  if (fam != AF_INET && fam != AF_INET6) {
    snprintf(why, why_len, "address family %u", fam);
    return -1;
  }
  return 0;
}
