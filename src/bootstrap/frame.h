/* Bootstrap wire format: every message starts with a fixed 40-byte header
 * (magic, version, type, length, sender rank, tag, job secret) encoded
 * little-endian. frame_decode is the single gate every incoming byte passes:
 * it rejects garbage, other versions, a wrong secret and oversized lengths
 * before anything is allocated. Pure functions; unit-tested and fuzzed. */
#ifndef COLLIE_FRAME_H
#define COLLIE_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_MAGIC 0x434c4f43u /* "COLC" */
#define FRAME_VERSION 1
#define FRAME_SECRET_BYTES 16
#define FRAME_HDR_BYTES 40
/* Largest payload any bootstrap message may carry. */
#define FRAME_MAX_PAYLOAD (256u << 20)

enum frame_type {
  FRAME_CHECKIN = 1,    /* rank -> root: who I am, where I listen */
  FRAME_ROOT_REPLY = 2, /* root -> rank: where my ring successor listens */
  FRAME_ROOT_ERROR = 3, /* root -> rank: init failed (text payload) */
  FRAME_HELLO = 4,      /* opens a rank -> rank connection; tag = destination rank */
  FRAME_MSG = 5,        /* rank -> rank message with a tag */
  FRAME_TYPE_MAX = 5,
};

struct frame_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t len;  /* payload bytes that follow */
  int32_t rank;  /* sender's rank, -1 for the root */
  uint32_t tag;
  uint32_t reserved;
  uint8_t secret[FRAME_SECRET_BYTES];
};

enum frame_verdict {
  FRAME_OK = 0,
  FRAME_BAD_MAGIC,
  FRAME_BAD_VERSION,
  FRAME_BAD_TYPE,
  FRAME_BAD_SECRET,
  FRAME_TOO_LONG,
  FRAME_BAD_RANK,
};
const char* frame_verdict_str(int v);

void frame_init(struct frame_hdr* h, int type, uint32_t len, int32_t rank, uint32_t tag,
                const uint8_t secret[FRAME_SECRET_BYTES]);
void frame_encode(const struct frame_hdr* h, uint8_t out[FRAME_HDR_BYTES]);
/* Decodes and validates `in`. `max_len` caps the payload (<= FRAME_MAX_PAYLOAD);
 * ranks must lie in [-1, max_rank). */
int frame_decode(const uint8_t* in, size_t n, const uint8_t secret[FRAME_SECRET_BYTES], uint32_t max_len,
                 int32_t max_rank, struct frame_hdr* out);

/* Payload of FRAME_CHECKIN, fixed size, little-endian. */
#define CHECKIN_BYTES 56
/* Most ranks a check-in may announce: the root sizes its table from the
 * first check-in, so this bounds what one frame can make it allocate. */
#define CHECKIN_MAX_RANKS (1 << 24)
struct checkin {
  int32_t rank;
  int32_t nranks;
  int32_t nroots;
  int32_t root_index;
  int32_t neighbor; /* 1: sent to the previous block's root as its last rank's successor */
  uint8_t addr[28]; /* sockaddr_in or sockaddr_in6, as stored */
  uint64_t nonce;   /* from the unique ID: which job this check-in belongs to */
};
/* A check-in frame's payload is the CHECKIN_BYTES above, then the rank's
 * card: up to CHECKIN_CARD_MAX bytes the root passes on, unread, with the
 * address table (bootstrap.h, bootstrap_init). */
#define CHECKIN_CARD_MAX 1024
void checkin_encode(const struct checkin* c, uint8_t out[CHECKIN_BYTES]);
/* Validates field ranges; returns 0 or -1 with `why` filled. */
int checkin_decode(const uint8_t* in, size_t n, struct checkin* out, char* why, size_t why_len);

#endif
