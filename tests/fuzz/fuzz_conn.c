/* Fuzz target: the incremental framed reader (src/bootstrap/conn.c) that
 * every bootstrap listener uses. Input: 3 bytes of settings (payload cap,
 * rank bound, write chunk size), then the byte stream a peer sends, written
 * into a socketpair chunk by chunk with the reader run after each chunk, then
 * closed. Properties: a message is handed over only with its whole payload,
 * and nothing is read beyond the caps. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/conn.h"
#include "fuzz_common.h"

int fuzz_reached;

static int drain(struct conn_reader* c, const uint8_t* secret, uint32_t max_len, int32_t max_rank, int* msgs) {
  char why[256];
  for (;;) {
    int ev = conn_progress(c, secret, max_len, max_rank, why, sizeof(why));
    if (ev == CONN_AGAIN) return 0;
    if (ev != CONN_MSG) return 1;
    FUZZ_ASSERT(c->have_hdr && c->hdr.len <= max_len && c->payload_got == c->hdr.len);
    FUZZ_ASSERT(c->hdr.rank >= -1 && c->hdr.rank < max_rank);
    FUZZ_ASSERT(memcmp(c->hdr.secret, secret, FRAME_SECRET_BYTES) == 0);
    uint8_t* p = conn_take(c);
    FUZZ_ASSERT((p != NULL) == (c->hdr.len > 0));
    if (p && c->hdr.len) FUZZ_ASSERT(p[c->hdr.len - 1] == p[c->hdr.len - 1]); /* readable to the end (ASan) */
    free(p);
    (*msgs)++;
    fuzz_reached++;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) {
  fuzz_quiet();
  if (n < 3) return 0;
  uint32_t max_len = 1u << (d[0] % 17);      /* 1 B .. 64 KiB */
  int32_t max_rank = d[1] == 255 ? INT32_MAX : (int32_t)d[1] + 1;
  size_t chunk = 1 + (size_t)d[2] % 97;
  d += 3;
  n -= 3;
  if (n > (1u << 16)) n = 1u << 16; /* stays within the socket buffer */
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  uint8_t secret[FRAME_SECRET_BYTES];
  fuzz_secret(secret);
  union sock_addr from = fuzz_addr(1);
  struct conn_reader c;
  conn_reader_init(&c, sv[0], &from, -1);
  int msgs = 0, done = 0;
  for (size_t off = 0; off < n && !done; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    if (write(sv[1], d + off, k) != (ssize_t)k) break;
    done = drain(&c, secret, max_len, max_rank, &msgs);
  }
  close(sv[1]);
  if (!done) done = drain(&c, secret, max_len, max_rank, &msgs);
  FUZZ_ASSERT(done); /* the writer is gone: the reader must say closed or bad */
  FUZZ_ASSERT((size_t)msgs * FRAME_HDR_BYTES <= n);
  conn_close(&c);
  return 0;
}
