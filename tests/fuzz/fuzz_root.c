/* Fuzz target: the bootstrap root's handling of check-ins (src/bootstrap/
 * root.c) through the same code as its poll loop, without a listener or a
 * thread. Input: a sequence of connections, each a 2-byte little-endian
 * length and that many bytes (what one client sent before closing). The root
 * reads each, takes or rejects it, and finally replies to everyone (successor
 * addresses, or the list of missing ranks). Secret and nonce: fuzz_common.h. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"

#define MAX_CONNECTIONS 64

int fuzz_reached;

int LLVMFuzzerTestOneInput(const uint8_t* d, size_t n) {
  fuzz_quiet();
  struct bootstrap_id id = fuzz_id();
  struct root* r = root_test_new(&id);
  if (!r) return 0;
  size_t off = 0;
  for (int k = 0; k < MAX_CONNECTIONS && off + 2 <= n; k++) {
    size_t len = (size_t)d[off] | (size_t)d[off + 1] << 8;
    off += 2;
    if (len > n - off) len = n - off;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) break;
    if (len && write(sv[1], d + off, len) != (ssize_t)len) {
      close(sv[0]);
      close(sv[1]);
      break;
    }
    off += len;
    /* Closed by the client: the root sees all of it now, then the end. */
    close(sv[1]);
    union sock_addr from = fuzz_addr((uint16_t)(40000 + k));
    int st = root_test_connection(r, sv[0], &from);
    FUZZ_ASSERT(st >= 0 && st <= 2);
  }
  if (root_test_finish(r)) fuzz_reached++;
  return 0;
}
