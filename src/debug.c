/* Logging implementation: parses NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE
 * once (again after log_reset) and writes lines prefixed "host:pid:tid [rank]".
 * errno is preserved across every call so callers may log before reporting it. */
#include "debug.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

#include "param.h"

int log_level_cur = -1;
uint64_t log_subsys_mask = 0;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() in a threaded process: never let a child inherit this lock held. */
static void log_lock_prepare(void) { pthread_mutex_lock(&log_lock); }
static void log_lock_release(void) { pthread_mutex_unlock(&log_lock); }
__attribute__((constructor)) static void log_lock_atfork(void) {
  pthread_atfork(log_lock_prepare, log_lock_release, log_lock_release);
}
static FILE* log_file;  /* NULL: stderr */
static char log_host[64];
/* Default TLS model, not initial-exec: an initial-exec variable puts the whole
 * TLS block in static TLS, and dlopen (Python ctypes, plugin loaders) then
 * fails with "cannot allocate memory in static TLS block". */
static __thread int log_rank = -1;

void log_set_rank(int rank) { log_rank = rank; }
int log_get_rank(void) { return log_rank; }

int log_parse_level(const char* s) {
  static const struct { const char* name; int level; } levels[] = {
      {"NONE", LOG_NONE}, {"VERSION", LOG_VERSION}, {"WARN", LOG_WARN},
      {"INFO", LOG_INFO}, {"ABORT", LOG_ABORT},     {"TRACE", LOG_TRACE},
  };
  if (!s) return -1;
  for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
    if (strcasecmp(s, levels[i].name) == 0) return levels[i].level;
  return -1;
}

static const struct { const char* name; uint64_t bit; } subsys_names[] = {
    {"INIT", LOG_INIT},       {"COLL", LOG_COLL},   {"P2P", LOG_P2P},       {"SHM", LOG_SHM},
    {"NET", LOG_NET},         {"GRAPH", LOG_GRAPH}, {"TUNING", LOG_TUNING}, {"ENV", LOG_ENV},
    {"ALLOC", LOG_ALLOC},     {"CALL", LOG_CALL},   {"PROXY", LOG_PROXY},   {"NVLS", LOG_NVLS},
    {"BOOTSTRAP", LOG_BOOTSTRAP}, {"REG", LOG_REG}, {"PROFILE", LOG_PROFILE}, {"RAS", LOG_RAS},
    {"ALL", (uint64_t)LOG_ALL},
};

uint64_t log_parse_subsys(const char* s) {
  if (!s) return 0;
  int invert = 0;
  if (*s == '^') { invert = 1; s++; }
  uint64_t mask = 0;
  char buf[256];
  snprintf(buf, sizeof(buf), "%s", s);
  char* save = NULL;
  for (char* tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    for (char* e = tok + strlen(tok); e > tok && e[-1] == ' ';) *--e = '\0';
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
      if (strcasecmp(tok, subsys_names[i].name) == 0) mask |= subsys_names[i].bit;
  }
  return invert ? ~mask : mask;
}

/* Expands %h (host) and %p (pid) in NCCL_DEBUG_FILE. */
static void expand_path(const char* in, char* out, size_t n) {
  size_t o = 0;
  for (const char* p = in; *p && o + 1 < n; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      char tmp[64];
      if (p[1] == 'h') snprintf(tmp, sizeof(tmp), "%s", log_host);
      else snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
      o += (size_t)snprintf(out + o, n - o, "%s", tmp);
      if (o >= n) o = n - 1;
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

/* (Re)reads the environment. Other threads test the level and mask without
 * the lock (log_enabled), so both are only ever stored atomically, and the
 * host name, which log_msg reads unlocked, is written once. */
static void log_load_locked(void) {
  int saved = errno;
  if (log_host[0] == '\0') {
    gethostname(log_host, sizeof(log_host) - 1);
    char* dot = strchr(log_host, '.');
    if (dot) *dot = '\0';
  }
  int level = log_parse_level(param_str(P_NCCL_DEBUG));
  if (level < 0) level = LOG_WARN;
  uint64_t mask = log_parse_subsys(param_str(P_NCCL_DEBUG_SUBSYS));
  const char* file = param_str(P_NCCL_DEBUG_FILE);
  if (file && level > LOG_NONE) {
    char path[4096];
    expand_path(file, path, sizeof(path));
    FILE* f = fopen(path, "a");
    if (f) {
      setvbuf(f, NULL, _IOLBF, 0);
      log_file = f;
    }
  }
  __atomic_store_n(&log_subsys_mask, mask, __ATOMIC_RELAXED);
  __atomic_store_n(&log_level_cur, level, __ATOMIC_RELEASE);
  errno = saved;
}

static void log_init_locked(void) {
  if (log_level_cur >= 0) return;
  log_load_locked();
}

void log_init(void) {
  pthread_mutex_lock(&log_lock);
  log_init_locked();
  pthread_mutex_unlock(&log_lock);
}

void log_reset(void) {
  pthread_mutex_lock(&log_lock);
  if (log_file) fclose(log_file);
  log_file = NULL;
  /* Reload in place: the level never goes back to "unread" (-1), so threads
   * logging meanwhile keep the old settings instead of racing to re-init. */
  log_load_locked();
  pthread_mutex_unlock(&log_lock);
}

void log_msg(int level, uint64_t subsys, const char* file, int line, const char* fmt, ...) {
  int saved = errno;
  static const char* names[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  char msg[2048];
  int n;
  char rank[16] = "";
  if (log_rank >= 0) snprintf(rank, sizeof(rank), " [%d]", log_rank);
  pid_t tid = (pid_t)syscall(SYS_gettid);
  if (level == LOG_TRACE) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    const char* base = strrchr(file, '/');
    n = snprintf(msg, sizeof(msg), "%s:%d:%d%s %ld.%06ld collie TRACE %s:%d ", log_host, (int)getpid(),
                 (int)tid, rank, (long)tv.tv_sec, (long)tv.tv_usec, base ? base + 1 : file, line);
  } else {
    n = snprintf(msg, sizeof(msg), "%s:%d:%d%s collie %s ", log_host, (int)getpid(), (int)tid, rank,
                 names[level]);
  }
  (void)subsys;
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof(msg)) n = sizeof(msg) - 1;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg + n, sizeof(msg) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
  if (len > sizeof(msg) - 2) len = sizeof(msg) - 2;
  msg[len++] = '\n';
  msg[len] = '\0';
  pthread_mutex_lock(&log_lock);
  FILE* out = log_file ? log_file : stderr;
  fwrite(msg, 1, len, out);
  fflush(out);
  pthread_mutex_unlock(&log_lock);
  errno = saved;
}

__attribute__((destructor)) static void log_fini(void) {
  if (log_file) fclose(log_file);
  log_file = NULL;
}
