/* Shared by the fuzz targets (fuzz_*.c), the corpus replayer (replay_main.c)
 * and the seed generator (make_corpus.c): the job identity every target
 * assumes, so seeds written by make_corpus carry the right secret and nonce. */
#ifndef COLLIE_FUZZ_COMMON_H
#define COLLIE_FUZZ_COMMON_H

#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"

#define FUZZ_NONCE 0x0123456789abcdefULL

static inline void fuzz_secret(uint8_t s[FRAME_SECRET_BYTES]) {
  for (int i = 0; i < FRAME_SECRET_BYTES; i++) s[i] = (uint8_t)(0xa0 + i);
}

/* A 127.0.0.1 address, as a rank would report its listener. */
static inline union sock_addr fuzz_addr(uint16_t port) {
  union sock_addr a;
  memset(&a, 0, sizeof(a));
  a.sin.sin_family = AF_INET;
  a.sin.sin_addr.s_addr = htonl(0x7f000001u);
  a.sin.sin_port = htons(port);
  return a;
}

/* The unique ID of the job the root target serves (and make_corpus writes). */
static inline struct bootstrap_id fuzz_id(void) {
  struct bootstrap_id id;
  memset(&id, 0, sizeof(id));
  id.magic = BOOTSTRAP_ID_MAGIC;
  id.version = BOOTSTRAP_ID_VERSION;
  fuzz_secret(id.secret);
  id.nonce = FUZZ_NONCE;
  id.root = fuzz_addr(29500);
  return id;
}

/* Logging would dominate the run time and the output; the library reads
 * NCCL_DEBUG when it first logs. */
static inline void fuzz_quiet(void) { setenv("NCCL_DEBUG", "NONE", 0); }

/* A property the target checks failed: crash so the fuzzer keeps the input. */
#define FUZZ_ASSERT(c)                                                     \
  do {                                                                     \
    if (!(c)) {                                                            \
      fprintf(stderr, "fuzz: %s:%d: property failed: %s\n", __FILE__, __LINE__, #c); \
      abort();                                                             \
    }                                                                      \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/* Inputs that got all the way through the accepting path (a frame header
 * that decodes, a complete message, a root that finished its
 * bootstrap). Each target defines it; the replay fails when the corpus
 * reaches it no more (seeds gone stale after a wire or secret change would
 * otherwise only exercise the reject paths and still pass). */
extern int fuzz_reached;

#endif
