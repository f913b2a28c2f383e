/* Engine autotune (COLLIE_AUTOTUNE=1), run by world rank 0 only: scores each
 * (fusion threshold, cycle time) pair by bytes allreduced per second of wall
 * time, tuning one parameter at a time over a fixed grid (coordinate
 * descent), then keeps the best pair. engine.c announces every change to the
 * other ranks with the next responses, so all ranks fuse alike. */
#include <string.h>

#include "engine/engine.h"

static const int64_t fusion_grid[] = {1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20};
static const int64_t cycle_grid_us[] = {500, 1000, 2500, 5000, 10000};
#define NFUSION ((int)(sizeof(fusion_grid) / sizeof(fusion_grid[0])))
#define NCYCLE ((int)(sizeof(cycle_grid_us) / sizeof(cycle_grid_us[0])))
/* A sample lasts this long and covers at least this many cycles that moved data. */
#define SAMPLE_NS 200000000LL
#define SAMPLE_MIN_CYCLES 5

void autotune_init(struct autotune* a, int on, int tune_fusion, int tune_cycle, int64_t fusion, int64_t cycle_us,
                   const char* log_path) {
  memset(a, 0, sizeof(*a));
  a->on = on && (tune_fusion || tune_cycle);
  a->tune_fusion = tune_fusion;
  a->tune_cycle = tune_cycle;
  a->fusion = a->best_fusion = fusion;
  a->cycle_us = a->best_cycle_us = cycle_us;
  a->phase = tune_fusion ? 0 : 1;
  if (!a->on) return;
  if (log_path) {
    a->log = fopen(log_path, "w");
    if (a->log) fprintf(a->log, "sample,fusion_threshold_bytes,cycle_time_ms,score_bytes_per_s,best\n");
    else WARN("COLLIE_AUTOTUNE_LOG=%s: cannot open it; autotune goes on without a log", log_path);
  }
  if (a->phase == 0) a->fusion = fusion_grid[0];
  else a->cycle_us = cycle_grid_us[0];
}

void autotune_fini(struct autotune* a) {
  if (a->log) fclose(a->log);
  a->log = NULL;
}

static void apply_candidate(struct autotune* a) {
  if (a->phase == 0) a->fusion = fusion_grid[a->idx];
  else a->cycle_us = cycle_grid_us[a->idx];
}

int autotune_cycle(struct autotune* a, int64_t now, int64_t bytes) {
  if (!a->on || a->done) return 0;
  if (a->sample_start == 0) a->sample_start = now;
  a->bytes += bytes;
  if (bytes > 0) a->cycles_with_work++;
  if (now - a->sample_start < SAMPLE_NS || a->cycles_with_work < SAMPLE_MIN_CYCLES) return 0;
  double score = (double)a->bytes * 1e9 / (double)(now - a->sample_start);
  a->sample_start = now;
  a->bytes = 0;
  a->cycles_with_work = 0;
  a->nsamples++;
  /* The first sample after a change mixes two settings: it only warms up. */
  if (a->sample++ == 0) return 0;
  a->best_score[a->idx] = score;
  if (a->log) {
    fprintf(a->log, "%d,%lld,%.3f,%.0f,0\n", a->nsamples, (long long)a->fusion, (double)a->cycle_us / 1000.0, score);
    fflush(a->log);
  }
  a->sample = 0;
  int n = a->phase == 0 ? NFUSION : NCYCLE;
  if (++a->idx < n) {
    apply_candidate(a);
    return 1;
  }
  int best = 0;
  for (int i = 1; i < n; i++)
    if (a->best_score[i] > a->best_score[best]) best = i;
  if (a->phase == 0) {
    a->fusion = a->best_fusion = fusion_grid[best];
    if (a->tune_cycle) {
      a->phase = 1;
      a->idx = 0;
      memset(a->best_score, 0, sizeof(a->best_score));
      apply_candidate(a);
      return 1;
    }
  } else {
    a->cycle_us = a->best_cycle_us = cycle_grid_us[best];
  }
  a->done = 1;
  INFO(LOG_TUNING, "engine autotune: fusion threshold %lld bytes, cycle time %.3f ms", (long long)a->fusion,
       (double)a->cycle_us / 1000.0);
  if (a->log) {
    fprintf(a->log, "%d,%lld,%.3f,%.0f,1\n", a->nsamples, (long long)a->fusion, (double)a->cycle_us / 1000.0,
            a->best_score[best]);
    fflush(a->log);
  }
  return 1;
}
