/* A worker that joins a running elastic job by speaking the store protocol
 * itself and dies (SIGKILL) as soon as its epoch's unique ID is published:
 * the real members are then building that epoch's communicator and wait in
 * the bootstrap for a rank that will never come. Used by test_elastic.sh
 * (scenario die_during_init); reads COLLIE_RENDEZVOUS and
 * COLLIE_RENDEZVOUS_SECRET like a worker. Exits 1 if it never got a plan. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "elastic/client.h"

static struct eclient c;
static uint8_t buf[EPROTO_MAX_REPLY];
static struct ebuf in;

static uint32_t call(int type, const uint8_t* m, size_t n) {
  size_t len = 0;
  if (eclient_call(&c, type, m, n, buf, sizeof(buf), &len) != ncclSuccess) {
    fprintf(stderr, "die_in_init: %s\n", ncclGetLastError(NULL));
    exit(1);
  }
  ebuf_reader(&in, buf, len);
  return ebuf_get_u32(&in);
}

static uint32_t call_u32(int type, uint32_t v) {
  uint8_t m[4];
  struct ebuf b;
  ebuf_writer(&b, m, sizeof(m));
  ebuf_put_u32(&b, v);
  return call(type, m, b.len);
}

int main(void) {
  const char* addr = getenv("COLLIE_RENDEZVOUS");
  const char* hex = getenv("COLLIE_RENDEZVOUS_SECRET");
  uint8_t secret[EPROTO_SECRET_BYTES];
  if (!addr || !hex || eproto_parse_secret(hex, secret) != 0) {
    fprintf(stderr, "die_in_init: COLLIE_RENDEZVOUS and COLLIE_RENDEZVOUS_SECRET must be set\n");
    return 1;
  }
  if (eclient_open(&c, addr, secret, 10000, 10000) != ncclSuccess) {
    fprintf(stderr, "die_in_init: %s\n", ncclGetLastError(NULL));
    eclient_close(&c);
    return 1;
  }
  uint8_t m[64];
  struct ebuf b;
  ebuf_writer(&b, m, sizeof(m));
  ebuf_put_u32(&b, (uint32_t)getpid());
  ebuf_put_str(&b, "doomed", EPROTO_MAX_KEY);
  ebuf_put_str(&b, "testhost", EPROTO_MAX_KEY);
  if (call(EREQ_REGISTER, m, b.len) != ESTATUS_OK) {
    fprintf(stderr, "die_in_init: the store refused the registration\n");
    return 1;
  }
  uint32_t last = 0;
  for (int64_t end = time_ms() + 60000; time_ms() < end; usleep(10000)) {
    uint32_t st = call_u32(EREQ_RDZV, last);
    if (st == ESTATUS_WAIT) continue;
    if (st != ESTATUS_OK) break;
    uint32_t epoch = ebuf_get_u32(&in), rank = ebuf_get_u32(&in), size = ebuf_get_u32(&in);
    last = epoch;
    /* Wait until rank 0 published the ID: the others are in their init then. */
    for (;;) {
      st = call_u32(EREQ_GET_UID, epoch);
      if (st != ESTATUS_WAIT) break;
      usleep(2000);
    }
    if (st != ESTATUS_OK) continue; /* stale: rendezvous again */
    printf("die_in_init: rank %u of %u in epoch %u; dying while the others build its communicator\n", rank, size,
           epoch);
    fflush(stdout);
    raise(SIGKILL);
  }
  fprintf(stderr, "die_in_init: no epoch took this worker in\n");
  eclient_close(&c);
  return 1;
}
