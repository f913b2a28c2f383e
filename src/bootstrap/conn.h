/* Incremental reader of framed messages on a nonblocking socket, shared by
 * the root (root.c) and rank listeners (bootstrap.c). The header is checked
 * by frame_decode before any payload memory is allocated. */
#ifndef COLLIE_CONN_H
#define COLLIE_CONN_H

#include <stdint.h>

#include "frame.h"
#include "socket.h"

struct conn_reader {
  int fd;
  int32_t rank;         /* authenticated sender; -1 until known */
  int64_t deadline_ms;  /* handshake deadline; -1 once authenticated */
  union sock_addr from;
  uint8_t hdr_buf[FRAME_HDR_BYTES];
  size_t hdr_got;
  int have_hdr;
  struct frame_hdr hdr;
  uint8_t* payload;
  size_t payload_got;
};

enum conn_event {
  CONN_AGAIN = 0, /* need more bytes */
  CONN_MSG,       /* hdr + payload complete; take payload with conn_take() */
  CONN_CLOSED,    /* peer closed (at a message boundary if hdr_got == 0) */
  CONN_BAD,       /* invalid frame or socket error; `why` says which */
};

void conn_reader_init(struct conn_reader* c, int fd, const union sock_addr* from, int64_t deadline_ms);
/* Reads what is available. */
int conn_progress(struct conn_reader* c, const uint8_t* secret, uint32_t max_len, int32_t max_rank,
                  char* why, size_t why_len);
/* Hands over the completed payload (may be NULL for len 0) and resets for the next message. */
uint8_t* conn_take(struct conn_reader* c);
/* Closes the fd and frees any partial payload. */
void conn_close(struct conn_reader* c);

#endif
