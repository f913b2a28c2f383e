/* Logging: NCCL_DEBUG level and NCCL_DEBUG_SUBSYS filter, NCCL_DEBUG_FILE output.
 * The level/subsystem check happens before any formatting, so disabled logging
 * costs one load and a branch. Used by every module; implemented in debug.c. */
#ifndef COLLIE_DEBUG_H
#define COLLIE_DEBUG_H

#include <stdint.h>

/* Same numbering as NCCL's ncclDebugLogLevel (net plugins rely on it). */
enum log_level {
  LOG_NONE = 0,
  LOG_VERSION = 1,
  LOG_WARN = 2,
  LOG_INFO = 3,
  LOG_ABORT = 4,
  LOG_TRACE = 5,
};

/* Subsystem bits, NCCL's values for the names NCCL_DEBUG_SUBSYS accepts. */
enum log_subsys {
  LOG_INIT = 0x1,
  LOG_COLL = 0x2,
  LOG_P2P = 0x4,
  LOG_SHM = 0x8,
  LOG_NET = 0x10,
  LOG_GRAPH = 0x20,
  LOG_TUNING = 0x40,
  LOG_ENV = 0x80,
  LOG_ALLOC = 0x100,
  LOG_CALL = 0x200,
  LOG_PROXY = 0x400,
  LOG_NVLS = 0x800,
  LOG_BOOTSTRAP = 0x1000,
  LOG_REG = 0x2000,
  LOG_PROFILE = 0x4000,
  LOG_RAS = 0x8000,
  LOG_ALL = ~0,
};

/* Current settings; log_level_cur is -1 until the environment has been read. */
extern int log_level_cur;
extern uint64_t log_subsys_mask;

void log_init(void);
void log_msg(int level, uint64_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The rank shown in the line prefix of the calling thread (-1: none). */
void log_set_rank(int rank);
int log_get_rank(void);

/* Re-read NCCL_DEBUG* (tests change the environment between communicators). */
void log_reset(void);

/* Parsers, exposed for unit tests. Return -1 on an unknown name. */
int log_parse_level(const char* s);
uint64_t log_parse_subsys(const char* s);

/* The loads are atomic because log_reset may change the settings while other
 * threads log; on x86 and arm64 they are still plain loads. */
static inline int log_enabled(int level, uint64_t subsys) {
  int cur = __atomic_load_n(&log_level_cur, __ATOMIC_ACQUIRE);
  if (__builtin_expect(cur < 0, 0)) {
    log_init();
    cur = __atomic_load_n(&log_level_cur, __ATOMIC_ACQUIRE);
  }
  return level <= cur && (subsys & __atomic_load_n(&log_subsys_mask, __ATOMIC_RELAXED));
}

#define WARN(...) \
  do { if (log_enabled(LOG_WARN, LOG_ALL)) log_msg(LOG_WARN, LOG_ALL, __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define INFO(sub, ...) \
  do { if (log_enabled(LOG_INFO, (sub))) log_msg(LOG_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define TRACE(sub, ...) \
  do { if (log_enabled(LOG_TRACE, (sub))) log_msg(LOG_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* Once per process, whatever the level (e.g. "device path off"). */
#define INFO_ONCE(sub, ...)                    \
  do {                                         \
    static int once_;                          \
    if (!__atomic_exchange_n(&once_, 1, __ATOMIC_RELAXED)) INFO(sub, __VA_ARGS__); \
  } while (0)

#endif
