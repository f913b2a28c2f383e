/* Incremental framed-message reader; see conn.h. */
#include "conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void conn_reader_init(struct conn_reader* c, int fd, const union sock_addr* from, int64_t deadline_ms) {
  memset(c, 0, sizeof(*c));
  c->fd = fd;
  c->rank = -1;
  c->deadline_ms = deadline_ms;
  if (from) c->from = *from;
}

int conn_progress(struct conn_reader* c, const uint8_t* secret, uint32_t max_len, int32_t max_rank,
                  char* why, size_t why_len) {
  if (!c->have_hdr) {
    int st = sock_recv_some(c->fd, c->hdr_buf, FRAME_HDR_BYTES, &c->hdr_got);
    if (st == SOCK_AGAIN) return CONN_AGAIN;
    if (st == SOCK_CLOSED) {
      if (c->hdr_got == 0) return CONN_CLOSED;
      snprintf(why, why_len, "closed after %zu of %d header bytes", c->hdr_got, FRAME_HDR_BYTES);
      return CONN_BAD;
    }
    if (st != SOCK_OK) {
      snprintf(why, why_len, "socket error while reading a header");
      return CONN_BAD;
    }
    int v = frame_decode(c->hdr_buf, FRAME_HDR_BYTES, secret, max_len, max_rank, &c->hdr);
    if (v != FRAME_OK) {
      snprintf(why, why_len, "%s", frame_verdict_str(v));
      return CONN_BAD;
    }
    c->have_hdr = 1;
    c->payload_got = 0;
    c->payload = NULL;
    if (c->hdr.len > 0) {
      c->payload = malloc(c->hdr.len);
      if (!c->payload) {
        snprintf(why, why_len, "cannot allocate %u bytes", c->hdr.len);
        return CONN_BAD;
      }
    }
  }
  if (c->hdr.len > 0) {
    int st = sock_recv_some(c->fd, c->payload, c->hdr.len, &c->payload_got);
    if (st == SOCK_AGAIN) return CONN_AGAIN;
    if (st != SOCK_OK) {
      snprintf(why, why_len, "%s after %zu of %u payload bytes", sock_status_str(st), c->payload_got,
               c->hdr.len);
      return CONN_BAD;
    }
  }
  return CONN_MSG;
}

uint8_t* conn_take(struct conn_reader* c) {
  uint8_t* p = c->payload;
  c->payload = NULL;
  c->payload_got = 0;
  c->have_hdr = 0;
  c->hdr_got = 0;
  return p;
}

void conn_close(struct conn_reader* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  free(c->payload);
  c->payload = NULL;
}
