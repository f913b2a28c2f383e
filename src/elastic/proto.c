/* Elastic store wire format: header codec, bounded payload cursors, secret
 * text form. See proto.h. */
#include "proto.h"

#include <string.h>

static void put32(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}
static uint32_t get32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

const char* eproto_verdict_str(int v) {
  switch (v) {
    case EPROTO_OK: return "ok";
    case EPROTO_BAD_MAGIC: return "not an elastic store message (bad magic)";
    case EPROTO_BAD_VERSION: return "unsupported protocol version";
    case EPROTO_BAD_TYPE: return "unknown message type";
    case EPROTO_BAD_SECRET: return "wrong job secret";
    case EPROTO_TOO_LONG: return "message too long";
  }
  return "?";
}

void eproto_encode_hdr(uint8_t out[EPROTO_HDR_BYTES], int type, uint32_t len, uint32_t seq,
                       const uint8_t secret[EPROTO_SECRET_BYTES]) {
  put32(out, EPROTO_MAGIC);
  out[4] = EPROTO_VERSION & 0xff;
  out[5] = EPROTO_VERSION >> 8;
  out[6] = (uint8_t)type;
  out[7] = (uint8_t)((unsigned)type >> 8);
  put32(out + 8, len);
  put32(out + 12, seq);
  memcpy(out + 16, secret, EPROTO_SECRET_BYTES);
}

int eproto_decode_hdr(const uint8_t* in, const uint8_t secret[EPROTO_SECRET_BYTES], uint32_t max_len,
                      int reply, struct eproto_hdr* out) {
  memset(out, 0, sizeof(*out));
  out->magic = get32(in);
  out->version = (uint16_t)(in[4] | in[5] << 8);
  out->type = (uint16_t)(in[6] | in[7] << 8);
  out->len = get32(in + 8);
  out->seq = get32(in + 12);
  memcpy(out->secret, in + 16, EPROTO_SECRET_BYTES);
  if (out->magic != EPROTO_MAGIC) return EPROTO_BAD_MAGIC;
  if (out->version != EPROTO_VERSION) return EPROTO_BAD_VERSION;
  /* Constant time: a wrong guess tells the sender nothing about how close it came. */
  uint8_t diff = 0;
  for (int i = 0; i < EPROTO_SECRET_BYTES; i++) diff |= (uint8_t)(out->secret[i] ^ secret[i]);
  if (diff != 0) return EPROTO_BAD_SECRET;
  if (reply ? out->type != EREPLY : (out->type < 1 || out->type > EREQ_MAX)) return EPROTO_BAD_TYPE;
  if (out->len > max_len) return EPROTO_TOO_LONG;
  return EPROTO_OK;
}

void ebuf_writer(struct ebuf* b, uint8_t* mem, size_t cap) {
  memset(b, 0, sizeof(*b));
  b->p = mem;
  b->cap = cap;
}
void ebuf_reader(struct ebuf* b, const uint8_t* mem, size_t len) {
  memset(b, 0, sizeof(*b));
  b->p = (uint8_t*)mem;
  b->len = len;
  b->cap = len;
}

void ebuf_put_bytes(struct ebuf* b, const void* v, size_t n) {
  if (b->bad || n > b->cap - b->len) {
    b->bad = 1;
    return;
  }
  if (n) memcpy(b->p + b->len, v, n);
  b->len += n;
}
void ebuf_put_u32(struct ebuf* b, uint32_t v) {
  uint8_t t[4];
  put32(t, v);
  ebuf_put_bytes(b, t, 4);
}
void ebuf_put_str(struct ebuf* b, const char* s, size_t max) {
  size_t n = s ? strnlen(s, max) : 0;
  ebuf_put_u32(b, (uint32_t)n);
  ebuf_put_bytes(b, s, n);
}

void ebuf_get_bytes(struct ebuf* b, void* out, size_t n) {
  if (b->bad || n > b->len - b->pos) {
    b->bad = 1;
    if (n) memset(out, 0, n);
    return;
  }
  if (n) memcpy(out, b->p + b->pos, n);
  b->pos += n;
}
uint32_t ebuf_get_u32(struct ebuf* b) {
  uint8_t t[4];
  ebuf_get_bytes(b, t, 4);
  return get32(t);
}
void ebuf_get_str(struct ebuf* b, char* out, size_t cap, size_t max) {
  out[0] = '\0';
  uint32_t n = ebuf_get_u32(b);
  if (b->bad || n > max || n >= cap) {
    b->bad = 1;
    return;
  }
  ebuf_get_bytes(b, out, n);
  if (b->bad) {
    out[0] = '\0';
    return;
  }
  out[n] = '\0';
  /* Names end up in log lines: printable ASCII only. */
  for (uint32_t i = 0; i < n; i++)
    if ((unsigned char)out[i] < 0x20 || (unsigned char)out[i] > 0x7e) {
      b->bad = 1;
      out[0] = '\0';
      return;
    }
}
int ebuf_done(const struct ebuf* b) { return !b->bad && b->pos == b->len; }

int eproto_parse_secret(const char* hex, uint8_t out[EPROTO_SECRET_BYTES]) {
  if (!hex || strlen(hex) != 2 * EPROTO_SECRET_BYTES) return -1;
  for (int i = 0; i < 2 * EPROTO_SECRET_BYTES; i++) {
    char c = hex[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) return -1;
    if (i % 2 == 0)
      out[i / 2] = (uint8_t)(v << 4);
    else
      out[i / 2] |= (uint8_t)v;
  }
  return 0;
}
void eproto_format_secret(const uint8_t s[EPROTO_SECRET_BYTES], char out[2 * EPROTO_SECRET_BYTES + 1]) {
  static const char d[] = "0123456789abcdef";
  for (int i = 0; i < EPROTO_SECRET_BYTES; i++) {
    out[2 * i] = d[s[i] >> 4];
    out[2 * i + 1] = d[s[i] & 15];
  }
  out[2 * EPROTO_SECRET_BYTES] = '\0';
}
