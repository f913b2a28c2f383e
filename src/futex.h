/* The one futex wrapper: sleep on a 32-bit word while it holds a value, wake
 * sleepers. Used by the shared-memory connectors (transport/shm.c), the direct
 * mailboxes (coll/direct_shm.c) and the idle wait of async.c. `shared`: the
 * word may live in memory mapped by other processes (no FUTEX_PRIVATE). */
#ifndef COLLIE_FUTEX_H
#define COLLIE_FUTEX_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleeps while *word == val, at most timeout_ms (< 0: no limit); returns at
 * once if the word already differs. Spurious returns are possible: callers
 * re-check their condition. */
static inline void futex_wait(uint32_t* word, uint32_t val, int timeout_ms, int shared) {
  struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, word, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, val, timeout_ms < 0 ? NULL : &ts, NULL, 0);
}

/* Wakes up to n sleepers on word. */
static inline void futex_wake(uint32_t* word, int n, int shared) {
  syscall(SYS_futex, word, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

#endif
