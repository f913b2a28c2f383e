/* Where the elastic layer keeps its state: the embedded rendezvous store
 * (client.c, a TCP connection to store.c) or an etcd cluster (etcd.c). Both
 * answer the request types of proto.h with the same reply payloads, so
 * elastic.c runs one state machine whatever holds the state. */
#ifndef COLLIE_ELASTIC_BACKEND_H
#define COLLIE_ELASTIC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "elastic/client.h"
#include "nccl.h"

struct etcd_store;

struct estore {
  int kind; /* 0: none, 1: embedded store, 2: etcd */
  struct eclient tcp;
  struct etcd_store* etcd;
};

/* Opens `url` (COLLIE_RENDEZVOUS): "etcd://..." / "etcds://..." or host:port
 * of the embedded store, which needs the job secret (hex, may be NULL for
 * etcd). estore_close must follow, whatever the result. */
ncclResult_t estore_open(struct estore* s, const char* url, const char* secret_hex, int64_t connect_ms, int64_t io_ms);
/* One request of proto.h; rep gets the reply payload (status first). */
ncclResult_t estore_call(struct estore* s, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                         size_t* rep_len);
void estore_close(struct estore* s);

/* etcd.c: the same three over etcd's v3 JSON gateway. */
int etcd_url(const char* url);
ncclResult_t etcd_open(struct etcd_store** out, const char* url, const char* secret_hex);
ncclResult_t etcd_call(struct etcd_store* e, int type, const uint8_t* req, size_t len, uint8_t* rep, size_t cap,
                       size_t* rep_len);
void etcd_close(struct etcd_store* e);
/* Without registering (a launcher watching the job): whether the job failed
 * (msg says why), its epoch and resets. */
ncclResult_t etcd_peek(struct etcd_store* e, int* failed, char* msg, size_t n, uint32_t* epoch, uint32_t* resets);

#endif
