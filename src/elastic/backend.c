/* Picks the elastic state's home from COLLIE_RENDEZVOUS (see backend.h):
 * etcd:// and etcds:// go to etcd.c, anything else is host:port of the
 * embedded store (client.c). Used by elastic.c only. */
#include "elastic/backend.h"

#include <string.h>

#include "core.h"

ncclResult_t estore_open(struct estore* s, const char* url, const char* secret_hex, int64_t connect_ms, int64_t io_ms) {
  memset(s, 0, sizeof(*s));
  if (etcd_url(url)) {
    s->kind = 2;
    return etcd_open(&s->etcd, url, secret_hex);
  }
  uint8_t secret[EPROTO_SECRET_BYTES];
  if (!secret_hex)
    return err_set(ncclInvalidArgument,
                   "COLLIE_RENDEZVOUS_SECRET must be set with the embedded store (start the job "
                   "with collie-run --elastic, or start collie-rendezvous and pass on what it prints)");
  if (eproto_parse_secret(secret_hex, secret) != 0)
    return err_set(ncclInvalidArgument, "COLLIE_RENDEZVOUS_SECRET must be %d hex digits", 2 * EPROTO_SECRET_BYTES);
  s->kind = 1;
  return eclient_open(&s->tcp, url, secret, connect_ms, io_ms);
}

ncclResult_t estore_call(struct estore* s, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                         size_t* rep_len) {
  if (s->kind == 1) return eclient_call(&s->tcp, type, req, len, rep, cap, rep_len);
  if (s->kind == 2 && s->etcd) return etcd_call(s->etcd, type, req, len, rep, cap, rep_len);
  return err_set(ncclInternalError, "elastic: no rendezvous store is open");
}

void estore_close(struct estore* s) {
  if (s->kind == 1) eclient_close(&s->tcp);
  if (s->kind == 2) etcd_close(s->etcd);
  s->kind = 0;
  s->etcd = NULL;
}
