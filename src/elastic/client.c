/* Elastic store client; see client.h. Replies are validated like requests on
 * the store: header (secret, type, bounded length) first, then the payload. */
#include "elastic/client.h"

#include <string.h>
#include <unistd.h>

#include "bootstrap/socket.h"
#include "core.h"

ncclResult_t eclient_open(struct eclient* c, const char* addr, const uint8_t secret[EPROTO_SECRET_BYTES],
                          int64_t connect_ms, int64_t io_ms) {
  memset(c, 0, sizeof(*c));
  c->fd = -1;
  pthread_mutex_init(&c->mu, NULL);
  union sock_addr a;
  NCCLCHECK(sock_parse_addr(addr, "COLLIE_RENDEZVOUS", &a));
  snprintf(c->addr, sizeof(c->addr), "%s", addr);
  memcpy(c->secret, secret, EPROTO_SECRET_BYTES);
  c->io_ms = io_ms;
  int st = sock_connect(&a, time_ms() + connect_ms, NULL, &c->fd);
  if (st != SOCK_OK)
    return err_set(ncclSystemError, "elastic: cannot reach the rendezvous store at %s: %s", addr,
                   sock_status_str(st));
  return ncclSuccess;
}

ncclResult_t eclient_call(struct eclient* c, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                          size_t* rep_len) {
  uint8_t hdr[EPROTO_HDR_BYTES];
  uint8_t msg[EPROTO_HDR_BYTES + EPROTO_MAX_REQUEST];
  if (len > EPROTO_MAX_REQUEST) return err_set(ncclInternalError, "elastic: request too long");
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&c->mu);
  if (c->fd < 0) {
    res = err_set(ncclSystemError, "elastic: the connection to the rendezvous store at %s is lost", c->addr);
    goto out;
  }
  uint32_t seq = ++c->seq;
  eproto_encode_hdr(msg, type, (uint32_t)len, seq, c->secret);
  if (len) memcpy(msg + EPROTO_HDR_BYTES, req, len);
  int64_t deadline = time_ms() + c->io_ms;
  int st = sock_send_all(c->fd, msg, EPROTO_HDR_BYTES + len, deadline, NULL);
  if (st == SOCK_OK) st = sock_recv_all(c->fd, hdr, sizeof(hdr), deadline, NULL);
  struct eproto_hdr h;
  int v = EPROTO_OK;
  if (st == SOCK_OK) {
    v = eproto_decode_hdr(hdr, c->secret, (uint32_t)(cap < EPROTO_MAX_REPLY ? cap : EPROTO_MAX_REPLY), 1, &h);
    if (v == EPROTO_OK && h.seq != seq) v = EPROTO_BAD_TYPE;
    if (v == EPROTO_OK && h.len) st = sock_recv_all(c->fd, rep, h.len, deadline, NULL);
  }
  if (st != SOCK_OK || v != EPROTO_OK) {
    res = err_set(ncclSystemError, "elastic: rendezvous store at %s: %s", c->addr,
                  st != SOCK_OK ? sock_status_str(st) : eproto_verdict_str(v));
    /* A half-read reply leaves the stream out of step: never reuse it. */
    close(c->fd);
    c->fd = -1;
    goto out;
  }
  *rep_len = h.len;
out:
  pthread_mutex_unlock(&c->mu);
  return res;
}

void eclient_close(struct eclient* c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  pthread_mutex_destroy(&c->mu);
}
