/* Wire format of the elastic rendezvous store (store.c serves it, client.c
 * speaks it): a 32-byte little-endian header carrying the job secret, then a
 * bounded payload read with bounds-checked cursors. Pure functions, so the
 * unit tests and the store share one validation gate. */
#ifndef COLLIE_ELASTIC_PROTO_H
#define COLLIE_ELASTIC_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define EPROTO_MAGIC 0x454c4f43u /* "COLE" */
#define EPROTO_VERSION 1
#define EPROTO_SECRET_BYTES 16
#define EPROTO_HDR_BYTES 32
/* Requests are tiny; anything longer is hostile or broken. */
#define EPROTO_MAX_REQUEST 1024
/* Replies carry at most a plan of EPROTO_MAX_WORKERS ids or an error text. */
#define EPROTO_MAX_WORKERS 4096
#define EPROTO_MAX_REPLY (64 * 1024)
#define EPROTO_MAX_TEXT 1024
#define EPROTO_MAX_KEY 255
#define EPROTO_UID_BYTES 128

enum eproto_type {
  EREQ_REGISTER = 1,  /* pid, slot key, host -> worker id */
  EREQ_RDZV = 2,      /* last epoch this worker was a member of -> WAIT | READY plan | FAIL */
  EREQ_PUBLISH = 3,   /* epoch, unique id (rank 0 of that epoch only) -> OK | STALE */
  EREQ_GET_UID = 4,   /* epoch -> WAIT | READY uid | STALE */
  EREQ_HEARTBEAT = 5, /* epoch -> current epoch, change pending, epoch broken (a member died or left it) | FAIL */
  EREQ_LEAVE = 6,     /* clean exit: not a failure */
  EREQ_MAX = 6,
  EREPLY = 64,
};

enum eproto_status {
  ESTATUS_OK = 0,
  ESTATUS_WAIT = 1,
  ESTATUS_STALE = 2,
  ESTATUS_FAIL = 3,     /* the job failed; text says why */
  ESTATUS_EXCLUDED = 4, /* this worker's slot is excluded; text says why */
  ESTATUS_REFUSED = 5,  /* the request made no sense (wrong state, not a member) */
};

struct eproto_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t len;
  uint32_t seq; /* echoed in the reply */
  uint8_t secret[EPROTO_SECRET_BYTES];
};

enum eproto_verdict {
  EPROTO_OK = 0,
  EPROTO_BAD_MAGIC,
  EPROTO_BAD_VERSION,
  EPROTO_BAD_TYPE,
  EPROTO_BAD_SECRET,
  EPROTO_TOO_LONG,
};
const char* eproto_verdict_str(int v);

void eproto_encode_hdr(uint8_t out[EPROTO_HDR_BYTES], int type, uint32_t len, uint32_t seq,
                       const uint8_t secret[EPROTO_SECRET_BYTES]);
/* Validates magic, version, type (request types, or EREPLY when `reply`), the
 * secret (constant time) and len <= max_len before anything is allocated. */
int eproto_decode_hdr(const uint8_t* in, const uint8_t secret[EPROTO_SECRET_BYTES], uint32_t max_len,
                      int reply, struct eproto_hdr* out);

/* Bounds-checked cursors: a read past the end or a write past the capacity
 * sets `bad` and yields zeros; callers check `bad` once at the end. */
struct ebuf {
  uint8_t* p;
  size_t len; /* writer: bytes written; reader: bytes available */
  size_t cap;
  size_t pos; /* reader position */
  int bad;
};
void ebuf_writer(struct ebuf* b, uint8_t* mem, size_t cap);
void ebuf_reader(struct ebuf* b, const uint8_t* mem, size_t len);
void ebuf_put_u32(struct ebuf* b, uint32_t v);
void ebuf_put_bytes(struct ebuf* b, const void* v, size_t n);
/* u32 length + bytes; strings longer than max are cut. */
void ebuf_put_str(struct ebuf* b, const char* s, size_t max);
uint32_t ebuf_get_u32(struct ebuf* b);
void ebuf_get_bytes(struct ebuf* b, void* out, size_t n);
/* Reads a u32-length string of at most `max` bytes into out[cap] (cap > max),
 * NUL-terminated; longer or non-printable input sets bad. */
void ebuf_get_str(struct ebuf* b, char* out, size_t cap, size_t max);
/* 1 when everything was consumed and nothing went wrong. */
int ebuf_done(const struct ebuf* b);

/* "32 hex digits" <-> secret. */
int eproto_parse_secret(const char* hex, uint8_t out[EPROTO_SECRET_BYTES]);
void eproto_format_secret(const uint8_t s[EPROTO_SECRET_BYTES], char out[2 * EPROTO_SECRET_BYTES + 1]);

#endif
