/* The one futex wrapper: sleep on a 32-bit word while it holds a value, wake
 * sleepers. Used by the shared-memory connectors (transport/shm.c), the direct
 * mailboxes (coll/direct_shm.c) and the idle wait of async.c. `shared`: the
 * word may live in memory mapped by other processes (no FUTEX_PRIVATE). */
#ifndef COLLIE_FUTEX_H
#define COLLIE_FUTEX_H

#include <linux/futex.h>
#include <errno.h>
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

/* A word to sleep on and the value it must still hold. */
struct futex_word {
  uint32_t* word;
  uint32_t val;
};

/* Sleeps while every word of w[0..n) holds its value, at most timeout_ms
 * (futex_waitv, Linux 5.16): woken by a futex_wake on any of them. Returns
 * 0, or -1 where the kernel lacks it (ENOSYS) or n is outside 1..FUTEX_WAITV_MAX: the
 * caller then sleeps on one word. */
static inline int futex_wait_any(const struct futex_word* w, int n, int timeout_ms, int shared) {
#if defined(SYS_futex_waitv) && defined(FUTEX_32) && defined(FUTEX_WAITV_MAX)
  if (n < 1 || n > FUTEX_WAITV_MAX) return -1;
  struct futex_waitv v[FUTEX_WAITV_MAX];
  for (int i = 0; i < n; i++)
    v[i] = (struct futex_waitv){.val = w[i].val, .uaddr = (uint64_t)(uintptr_t)w[i].word,
                                .flags = FUTEX_32 | (shared ? 0 : FUTEX_PRIVATE_FLAG)};
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  if (syscall(SYS_futex_waitv, v, (unsigned)n, 0u, &ts, CLOCK_MONOTONIC) < 0 && errno == ENOSYS) return -1;
  return 0;
#else
  (void)w, (void)n, (void)timeout_ms, (void)shared;
  return -1;
#endif
}

#endif
