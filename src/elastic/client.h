/* Worker side of the elastic store protocol (proto.h): one authenticated
 * connection per worker, request/reply, shared by the training thread and
 * the heartbeat thread under a mutex. Used by elastic.c. */
#ifndef COLLIE_ELASTIC_CLIENT_H
#define COLLIE_ELASTIC_CLIENT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "elastic/proto.h"
#include "nccl.h"

struct eclient {
  int fd;
  uint8_t secret[EPROTO_SECRET_BYTES];
  uint32_t seq;
  int64_t io_ms; /* bound on one request's round trip */
  pthread_mutex_t mu;
  char addr[64];
};

/* Connects to "host:port", retrying until connect_ms passes. eclient_close
 * must follow, whatever the result. */
ncclResult_t eclient_open(struct eclient* c, const char* addr, const uint8_t secret[EPROTO_SECRET_BYTES],
                          int64_t connect_ms, int64_t io_ms);
/* Sends a request, waits for its reply payload (at most cap bytes) into rep. */
ncclResult_t eclient_call(struct eclient* c, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                          size_t* rep_len);
void eclient_close(struct eclient* c);

#endif
