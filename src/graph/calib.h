/* The tuner's measured constants (the tuning table): built-in fallbacks, a
 * short calibration, and the per-machine cache file under $XDG_CACHE_HOME/collie.
 * Implemented in graph/calib.c; graph/tuning.c agrees on rank 0's table and
 * turns it into link costs; collie-info --tuning and tests/mp/test_tuning.c print and check it. */
#ifndef COLLIE_CALIB_H
#define COLLIE_CALIB_H

#include <stddef.h>

#include "../core.h"

#define TUNE_TABLE_VERSION 4

/* Where a table came from. */
enum { TUNE_SRC_BUILTIN, TUNE_SRC_CACHE, TUNE_SRC_CALIBRATED };

/* Rates are bytes per microsecond. Plain doubles and ints only: rank 0's copy
 * is broadcast byte for byte so every rank runs the same model. */
struct tune_table {
  double shm_alpha_us;     /* one shared-memory step, a CPU per rank (built-in) */
  double oversub_alpha_us; /* extra per step and per rank-per-CPU when oversubscribed (built-in) */
  double net_alpha_us;     /* one socket step (built-in) */
  double net_bw;           /* socket payload rate (built-in) */
  double copy_cache_bw;    /* memcpy of a block that stays in cache (measured) */
  double copy_stream_bw;   /* memcpy of a block larger than the last-level cache (measured) */
  double cma_bw;           /* process_vm_readv rate, single copy, of a block larger than the last-level cache (measured) */
  double cma_cache_bw;     /* the same of a block that stays in cache (measured) */
  double cma_near_bw;      /* the same of a block that stays in one core's private cache (measured) */
  double cma_call_us;      /* one process_vm_readv of a few bytes: the system call and its pinning (measured) */
  double near_bytes;       /* one core's private (L2) cache (sysconf) */
  double cache_bytes;      /* a host's calls whose data fit in this count as cache-resident (sysconf) */
  double fuse_gain;        /* a ring's reduction step into a buffer beyond the cache that also fills the next send
                            * slot: the rate of one pass with non-temporal stores to the buffer (red_reduce_out)
                            * over a reduction with plain stores and then a copy into the slot (measured) */
  int source;              /* TUNE_SRC_* */
  int measured;            /* bit per measured field: 1 copy_cache_bw, 2 copy_stream_bw, 4 cma_bw, 8 cache_bytes,
                            * 16 cma_cache_bw, 32 cma_near_bw, 64 cma_call_us, 128 near_bytes, 256 fuse_gain */
};

enum { TUNE_LOAD_OK, TUNE_LOAD_MISSING, TUNE_LOAD_BAD, TUNE_LOAD_OFF };

const char* tune_source_name(int source);
void tune_table_builtin(struct tune_table* t);
/* Measures the rates (well under 100 ms on an idle machine). */
void tune_calibrate(struct tune_table* t);
/* The cache file for this machine ($XDG_CACHE_HOME/collie, else
 * ~/.cache/collie); 0 on success. */
int tune_cache_path(char* path, size_t size);
/* TUNE_LOAD_*: a corrupted file or one written on another machine gives
 * TUNE_LOAD_BAD after one WARN naming the reason. */
int tune_cache_load(struct tune_table* t);
/* Writes the table for this host and CPU (host/cpu NULL: this machine's;
 * tests pass others). 0, or -1 with the reason in why (e.g. not writable). */
int tune_cache_store(const struct tune_table* t, const char* host, const char* cpu, char* why, size_t why_size);
/* This process's table: the cache file, else (may_calibrate) a calibration
 * that is then stored, else the built-in constants. COLLIE_TUNING_CACHE=0:
 * built-in. Memoised per process unless fresh. */
void tune_table_local(struct tune_table* t, int may_calibrate, int fresh);
/* This machine's CPU model as /proc/cpuinfo names it. */
void tune_cpu_model(char* buf, size_t size);

#endif
