/* The tuning table's numbers (graph/calib.h): built-in constants, a short
 * calibration of this machine's copy rates, and the per-machine cache file
 * ($XDG_CACHE_HOME/collie/tuning-<host>.txt, version + host + CPU model +
 * checksum). Read by graph/tuning.c at communicator init and by collie-info. */
#include "calib.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../device/reduce.h"
#include "../param.h"

const char* tune_source_name(int source) {
  switch (source) {
    case TUNE_SRC_CACHE: return "cache file";
    case TUNE_SRC_CALIBRATED: return "calibrated now";
    default: return "built-in";
  }
}

/* The constants collie used before calibration (fitted on a 2-core
 * development machine): shm 0.3 us per step at 12 GB/s, sockets 10 us at 2 GB/s. */
void tune_table_builtin(struct tune_table* t) {
  memset(t, 0, sizeof(*t));
  t->shm_alpha_us = 0.3;
  t->oversub_alpha_us = 1.5;
  t->net_alpha_us = 10.0;
  t->net_bw = 2.0e3;
  t->copy_cache_bw = 12.0e3;
  t->copy_stream_bw = 12.0e3;
  t->cma_bw = 24.0e3; /* the CMA rows' old model: one copy instead of two at the shm rate */
  t->cma_cache_bw = 24.0e3;
  t->cma_near_bw = 24.0e3;
  t->cma_call_us = 2.0; /* the handshake's old constant besides its two steps */
  t->cache_bytes = 8.0 * (1 << 20);
  t->near_bytes = 1.0 * (1 << 20);
  /* One pass ahead: 1.16-1.25x in the 2-rank allreduce out of place on the
   * machine (a Sapphire Rapids guest) where the pass was written. */
  t->fuse_gain = 1.2;
  t->source = TUNE_SRC_BUILTIN;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Best of `reps` copies of `bytes` (best, not mean: another process taking
 * the CPU for a moment must not make the machine look slow), in bytes/us;
 * 0 if it could not be measured. cma: process_vm_readv of this process. */
static double copy_rate(char* src, char* dst, size_t bytes, int reps, int cma) {
  double best = 0;
  for (int i = 0; i < reps; i++) {
    double t0 = now_us();
    if (cma) {
      struct iovec l = {dst, bytes}, r = {src, bytes};
      if (process_vm_readv(getpid(), &l, 1, &r, 1, 0) != (ssize_t)bytes) return 0;
    } else {
      memcpy(dst, src, bytes);
    }
    /* The copy must happen: dst is read by nobody else. */
    __asm__ volatile("" : : "r"(dst) : "memory");
    double dt = now_us() - t0;
    if (dt > 0 && (best == 0 || dt < best)) best = dt;
  }
  return best > 0 ? (double)bytes / best : 0;
}

/* A measured rate outside 100 MB/s .. 1 TB/s is a broken clock or a
 * descheduled run, not the machine: keep the built-in value. */
static int plausible(double bw) { return isfinite(bw) && bw >= 100.0 && bw <= 1.0e6; }

/* A ring allreduce's reduction step out of place (coll/prims.c,
 * prim_recv_reduce_copy), over `bytes` of the caller's data beyond the cache:
 * each chunk of a received slot (`in`) and of `local` reduced into `dst` and
 * into the next send slot (`out`). fused: one pass, non-temporal stores to dst
 * (red_reduce_out); else plain stores to dst, then the slot copied from it.
 * Single-threaded: on a Zen 5 guest the fused pass ran at 0.6-0.7x of the
 * other here and 0.75-0.8x in 2-rank allreduces of 32-256 MiB; on the Sapphire
 * Rapids guest where it was written, 1.16-1.25x in those allreduces. One
 * pass (the caller keeps the best), bytes/us; 0 if not measured. */
static double reduce_step_rate(char* local, char* dst, size_t bytes, char* in, char* out, size_t chunk, int fused) {
  struct red_op op;
  if (red_op_init(&op, ncclSum, ncclFloat32) != 0) return 0;
  size_t count = chunk / sizeof(float);
  double t0 = now_us();
  for (size_t off = 0; off + chunk <= bytes; off += chunk) {
    if (fused) {
      red_reduce_out(&op, dst + off, out, in, local + off, count, 0, 0);
    } else {
      red_reduce(&op, dst + off, in, local + off, count);
      memcpy(out, dst + off, chunk);
    }
  }
  __asm__ volatile("" : : "r"(dst), "r"(out) : "memory");
  double dt = now_us() - t0;
  return dt > 0 ? (double)(bytes - bytes % chunk) / dt : 0;
}

void tune_calibrate(struct tune_table* t) {
  tune_table_builtin(t);
  t->source = TUNE_SRC_CALIBRATED;
  long llc = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  /* Streaming: as big as the LLC, 8..32 MiB (a copy touches twice that). In cache: a block past every L2
   * but well inside the LLC (copies between ranks meet in the shared cache,
   * not in one core's private ones), 1..4 MiB. */
  size_t big = llc > 0 ? (size_t)llc : (size_t)32 << 20;
  if (big < ((size_t)8 << 20)) big = (size_t)8 << 20;
  if (big > ((size_t)32 << 20)) big = (size_t)32 << 20;
  size_t small = llc > 0 ? (size_t)llc / 4 : (size_t)1 << 20;
  if (small < ((size_t)1 << 20)) small = (size_t)1 << 20;
  if (small > ((size_t)4 << 20)) small = (size_t)4 << 20;
  long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
  l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  /* Private cache: a block of an eighth of it (source and destination
   * together a quarter), 64 KiB .. 1 MiB. */
  size_t near = l2 > 0 ? (size_t)l2 / 8 : (size_t)128 << 10;
  if (near < ((size_t)64 << 10)) near = (size_t)64 << 10;
  if (near > ((size_t)1 << 20)) near = (size_t)1 << 20;
  if (l2 > 0) t->near_bytes = (double)l2, t->measured |= 128;
  /* Some VMs report the L3 of every socket: the size counts only up to half
   * the block measured as streaming. */
  if (llc > 0) {
    t->cache_bytes = (double)llc < (double)big / 2 ? (double)llc : (double)big / 2;
    t->measured |= 8;
  }
  /* Pre-faulted in one go (MAP_POPULATE): page faults were most of the time. */
  char* src = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  char* dst = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (src == MAP_FAILED || dst == MAP_FAILED) goto out;
  memset(src, 1, small);
  double bw = copy_rate(src, dst, small, 8, 0);
  if (plausible(bw)) t->copy_cache_bw = bw, t->measured |= 1;
  bw = copy_rate(src, dst, big, 3, 0);
  if (plausible(bw)) t->copy_stream_bw = bw, t->measured |= 2;
  bw = copy_rate(src, dst, big, 2, 1);
  if (plausible(bw)) t->cma_bw = bw, t->measured |= 4;
  bw = copy_rate(src, dst, small, 8, 1);
  if (plausible(bw)) t->cma_cache_bw = bw, t->measured |= 16;
  bw = copy_rate(src, dst, near, 16, 1); /* near <= small: written above */
  if (plausible(bw)) t->cma_near_bw = bw, t->measured |= 32;
  /* The call itself: 64 bytes, best of 64 (0.4 us on the development machine). */
  bw = copy_rate(src, dst, 64, 64, 1);
  if (isfinite(bw) && bw > 0 && 64.0 / bw < 100.0) t->cma_call_us = 64.0 / bw, t->measured |= 64;
  /* The fused reduction step against the plain one, interleaved; a ring step's
   * 128 KiB slots (zeros: float sums at the common speed). */
  {
    const size_t chunk = (size_t)128 << 10;
    char* slots = mmap(NULL, 2 * chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (slots != MAP_FAILED) {
      double fused = 0, plain = 0;
      for (int i = 0; i < 3; i++) {
        double f = reduce_step_rate(src, dst, big, slots, slots + chunk, chunk, 1);
        double p = reduce_step_rate(src, dst, big, slots, slots + chunk, chunk, 0);
        fused = f > fused ? f : fused;
        plain = p > plain ? p : plain;
      }
      if (plausible(fused) && plausible(plain)) t->fuse_gain = fused / plain, t->measured |= 256;
      munmap(slots, 2 * chunk);
    }
  }
out:
  if (src != MAP_FAILED) munmap(src, big);
  if (dst != MAP_FAILED) munmap(dst, big);
}

void tune_cpu_model(char* buf, size_t size) {
  snprintf(buf, size, "unknown");
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof(line), f)) {
    /* x86 "model name"; arm64 has no name, "CPU part" identifies the core. */
    if (strncmp(line, "model name", 10) == 0 || strncmp(line, "CPU part", 8) == 0) {
      char* v = strchr(line, ':');
      if (!v) continue;
      for (v++; *v == ' ' || *v == '\t'; v++) {
      }
      v[strcspn(v, "\r\n")] = '\0';
      snprintf(buf, size, "%s", v);
      break;
    }
  }
  fclose(f);
}

static void host_name(char* buf, size_t size) {
  if (gethostname(buf, size) != 0) snprintf(buf, size, "localhost");
  buf[size - 1] = '\0';
}

static int cache_dir(char* dir, size_t size) {
  const char* x = getenv("XDG_CACHE_HOME");
  const char* home = getenv("HOME");
  int n;
  if (x && x[0] == '/') n = snprintf(dir, size, "%s/collie", x);
  else if (home && home[0]) n = snprintf(dir, size, "%s/.cache/collie", home);
  else return -1;
  return n > 0 && (size_t)n < size ? 0 : -1;
}

int tune_cache_path(char* path, size_t size) {
  char dir[4096], host[256];
  if (cache_dir(dir, sizeof(dir)) != 0) return -1;
  host_name(host, sizeof(host));
  /* The host name goes into a file name: keep it to a safe alphabet. */
  for (char* p = host; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
      *p = '_';
  int n = snprintf(path, size, "%s/tuning-%s.txt", dir, host);
  return n > 0 && (size_t)n < size ? 0 : -1;
}

/* Not err_set: a cache that cannot be written does not fail the call that
 * wanted it, so it must not become ncclGetLastError's text. */
static int store_fail(char* why, size_t size, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int store_fail(char* why, size_t size, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (why && size) vsnprintf(why, size, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t fnv1a(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h;
}

/* The file's body (everything the checksum covers). */
static int format_body(char* buf, size_t size, const struct tune_table* t, const char* host, const char* cpu) {
  return snprintf(buf, size,
                  "collie-tuning %d\nhost %s\ncpu %s\nshm_alpha_us %.17g\noversub_alpha_us %.17g\n"
                  "net_alpha_us %.17g\nnet_bw %.17g\ncopy_cache_bw %.17g\ncopy_stream_bw %.17g\ncma_bw %.17g\n"
                  "cma_cache_bw %.17g\ncma_near_bw %.17g\ncma_call_us %.17g\ncache_bytes %.17g\nnear_bytes %.17g\n"
                  "fuse_gain %.17g\nmeasured %d\n",
                  TUNE_TABLE_VERSION, host, cpu, t->shm_alpha_us, t->oversub_alpha_us, t->net_alpha_us, t->net_bw,
                  t->copy_cache_bw, t->copy_stream_bw, t->cma_bw, t->cma_cache_bw, t->cma_near_bw, t->cma_call_us, t->cache_bytes,
                  t->near_bytes, t->fuse_gain, t->measured);
}

int tune_cache_store(const struct tune_table* t, const char* host, const char* cpu, char* why, size_t why_size) {
  char dir[4096], path[4352], tmp[4400], myhost[256], mycpu[256], body[2048];
  if (cache_dir(dir, sizeof(dir)) != 0 || tune_cache_path(path, sizeof(path)) != 0)
    return store_fail(why, why_size, "tuning cache: neither XDG_CACHE_HOME nor HOME names a directory");
  if (!host) host_name(myhost, sizeof(myhost)), host = myhost;
  if (!cpu) tune_cpu_model(mycpu, sizeof(mycpu)), cpu = mycpu;
  /* mkdir -p of <base>/collie: the base may not exist yet either (~/.cache). */
  char* slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
      return store_fail(why, why_size, "tuning cache: mkdir %s: %s", dir, strerror(errno));
    *slash = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return store_fail(why, why_size, "tuning cache: mkdir %s: %s", dir, strerror(errno));
  int n = format_body(body, sizeof(body), t, host, cpu);
  if (n <= 0 || (size_t)n >= sizeof(body)) return store_fail(why, why_size, "tuning cache: table too long");
  /* Written under a private name and renamed: ranks of other jobs on this
   * host read either the old file or the new one, never half of one. */
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (!f) return store_fail(why, why_size, "tuning cache: cannot write %s: %s", tmp, strerror(errno));
  int ok = fprintf(f, "%schecksum %016llx\n", body, (unsigned long long)fnv1a(body, (size_t)n)) > 0;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return store_fail(why, why_size, "tuning cache: cannot write %s: %s", path, strerror(e));
  }
  return 0;
}

static int load_bad(const char* path, const char* why) {
  WARN("tuning cache %s %s: ignored, the table will be measured again and the file rewritten", path, why);
  return TUNE_LOAD_BAD;
}

int tune_cache_load(struct tune_table* t) {
  char path[4352], buf[4096], host[256], cpu[256];
  if (tune_cache_path(path, sizeof(path)) != 0) return TUNE_LOAD_MISSING;
  FILE* f = fopen(path, "r");
  if (!f) return TUNE_LOAD_MISSING;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  int big = !feof(f);
  fclose(f);
  buf[n] = '\0';
  if (big) return load_bad(path, "is corrupted (too long)");
  /* The checksum line covers everything before it. */
  char* ck = strstr(buf, "checksum ");
  unsigned long long want = 0;
  if (!ck || (ck != buf && ck[-1] != '\n') || sscanf(ck, "checksum %llx", &want) != 1 ||
      fnv1a(buf, (size_t)(ck - buf)) != (uint64_t)want)
    return load_bad(path, "is corrupted (checksum mismatch)");
  struct tune_table r;
  tune_table_builtin(&r);
  int version = -1;
  char fhost[256] = "", fcpu[256] = "";
  int fields = 0;
  for (char* line = buf; line < ck;) {
    char* end = strchr(line, '\n');
    if (!end) break;
    *end = '\0';
    double v;
    if (sscanf(line, "collie-tuning %d", &version) == 1) fields |= 1;
    else if (strncmp(line, "host ", 5) == 0) snprintf(fhost, sizeof(fhost), "%s", line + 5), fields |= 2;
    else if (strncmp(line, "cpu ", 4) == 0) snprintf(fcpu, sizeof(fcpu), "%s", line + 4), fields |= 4;
    else if (sscanf(line, "shm_alpha_us %lf", &v) == 1) r.shm_alpha_us = v, fields |= 8;
    else if (sscanf(line, "oversub_alpha_us %lf", &v) == 1) r.oversub_alpha_us = v, fields |= 16;
    else if (sscanf(line, "net_alpha_us %lf", &v) == 1) r.net_alpha_us = v, fields |= 32;
    else if (sscanf(line, "net_bw %lf", &v) == 1) r.net_bw = v, fields |= 64;
    else if (sscanf(line, "copy_cache_bw %lf", &v) == 1) r.copy_cache_bw = v, fields |= 128;
    else if (sscanf(line, "copy_stream_bw %lf", &v) == 1) r.copy_stream_bw = v, fields |= 256;
    else if (sscanf(line, "cma_bw %lf", &v) == 1) r.cma_bw = v, fields |= 512;
    else if (sscanf(line, "cache_bytes %lf", &v) == 1) r.cache_bytes = v, fields |= 1024;
    else if (sscanf(line, "measured %d", &r.measured) == 1) fields |= 2048;
    else if (sscanf(line, "cma_cache_bw %lf", &v) == 1) r.cma_cache_bw = v, fields |= 4096;
    else if (sscanf(line, "cma_near_bw %lf", &v) == 1) r.cma_near_bw = v, fields |= 8192;
    else if (sscanf(line, "cma_call_us %lf", &v) == 1) r.cma_call_us = v, fields |= 16384;
    else if (sscanf(line, "near_bytes %lf", &v) == 1) r.near_bytes = v, fields |= 32768;
    else if (sscanf(line, "fuse_gain %lf", &v) == 1) r.fuse_gain = v, fields |= 65536;
    line = end + 1;
  }
  if (version != TUNE_TABLE_VERSION) return load_bad(path, "has another format version");
  if (fields != 131071) return load_bad(path, "is corrupted (fields missing)");
  host_name(host, sizeof(host));
  tune_cpu_model(cpu, sizeof(cpu));
  if (strcmp(fhost, host) != 0 || strcmp(fcpu, cpu) != 0) {
    char why[700];
    snprintf(why, sizeof(why), "was measured on another machine (host %.64s, CPU \"%.96s\"; this is %.64s, \"%.96s\")",
             fhost, fcpu, host, cpu);
    return load_bad(path, why);
  }
  double pos[] = {r.shm_alpha_us, r.net_alpha_us, r.net_bw, r.copy_cache_bw, r.copy_stream_bw, r.cma_bw, r.cma_cache_bw,
                  r.cma_near_bw, r.cma_call_us, r.cache_bytes, r.near_bytes, r.fuse_gain};
  for (size_t i = 0; i < sizeof(pos) / sizeof(pos[0]); i++)
    if (!isfinite(pos[i]) || pos[i] <= 0) return load_bad(path, "is corrupted (a value is not positive)");
  if (!isfinite(r.oversub_alpha_us) || r.oversub_alpha_us < 0) return load_bad(path, "is corrupted (negative value)");
  r.source = TUNE_SRC_CACHE;
  *t = r;
  return TUNE_LOAD_OK;
}

static void local_fresh(struct tune_table* t, int may_calibrate) {
  if (param_int(P_COLLIE_TUNING_CACHE, 0, 1) == 0) {
    tune_table_builtin(t);
    return;
  }
  int st = tune_cache_load(t);
  if (st == TUNE_LOAD_OK) return;
  if (!may_calibrate) {
    tune_table_builtin(t);
    return;
  }
  double t0 = now_us();
  tune_calibrate(t);
  double ms = (now_us() - t0) / 1e3;
  char path[4352] = "?";
  tune_cache_path(path, sizeof(path));
  char why[512] = "";
  if (tune_cache_store(t, NULL, NULL, why, sizeof(why)) == 0)
    INFO(LOG_TUNING | LOG_INIT, "tuning table calibrated in %.0f ms and stored in %s", ms, path);
  else
    INFO(LOG_TUNING | LOG_INIT, "tuning table calibrated in %.0f ms, for this process only: %s", ms, why);
}

static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tune_table memo;
static int memo_state; /* 0 none, 1 built-in only (no calibration was allowed), 2 final */

void tune_table_local(struct tune_table* t, int may_calibrate, int fresh) {
  if (fresh) {
    local_fresh(t, may_calibrate);
    return;
  }
  pthread_mutex_lock(&memo_lock);
  if (memo_state == 0 || (memo_state == 1 && may_calibrate)) {
    local_fresh(&memo, may_calibrate);
    memo_state = memo.source != TUNE_SRC_BUILTIN || may_calibrate || param_int(P_COLLIE_TUNING_CACHE, 0, 1) == 0 ? 2 : 1;
  }
  *t = memo;
  pthread_mutex_unlock(&memo_lock);
}
