/* The elastic rendezvous store: a small authenticated TCP server, run on its
 * own thread, holding the workers of a job (in registration order), the
 * current epoch's plan (ordered worker list) and that epoch's unique ID.
 * Embedded in collie-run --elastic and in collie-rendezvous; workers talk to
 * it through client.c. Protocol in proto.h; behaviour in docs/ARCHITECTURE.md. */
#ifndef COLLIE_ELASTIC_STORE_H
#define COLLIE_ELASTIC_STORE_H

#include <stdint.h>

#include "bootstrap/socket.h"
#include "elastic/proto.h"
#include "nccl.h"

struct store_opts {
  int min, max;            /* 1 <= min <= max <= EPROTO_MAX_WORKERS */
  int expect;              /* workers expected at the first epoch (0: unknown, wait settle_ms) */
  int reset_limit;         /* epochs after the first before the job fails; -1: no limit */
  int slot_fail_limit;     /* failures of one slot key before it is excluded; 0: never */
  int64_t settle_ms;       /* quiet time after a registration before an epoch forms below max */
  int64_t rdzv_timeout_ms; /* a rendezvous round may wait this long for stragglers */
  int64_t hb_timeout_ms;   /* a silent worker is dead after this; 0: only a closed connection */
  int64_t handshake_ms;    /* an unregistered connection / a partial message has this long */
  uint8_t secret[EPROTO_SECRET_BYTES];
  union sock_addr bind;    /* port 0: ephemeral; the chosen port is in store_address */
  const char* log_prefix;  /* non-NULL: membership events go to stderr with this prefix */
};

struct store;

/* Binds, then serves on a new thread. */
ncclResult_t store_start(const struct store_opts* o, struct store** out);
void store_address(struct store* s, union sock_addr* out);
/* 1 when the job failed (reset limit, too few workers): msg says why. */
int store_failed(struct store* s, char* msg, size_t n);
/* Current epoch and number of resets so far. */
void store_progress(struct store* s, uint32_t* epoch, uint32_t* resets);
/* Workers ever registered, and those still connected and not gone. */
void store_counts(struct store* s, int* registered, int* live);
/* Stops the thread and frees everything; safe with NULL. */
void store_stop(struct store* s);

#endif
