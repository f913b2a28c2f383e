/* Engine timeline: Chrome-trace JSON ("traceEvents" array of complete "X"
 * events, one thread row per tensor) written by world rank 0. The file is a
 * valid JSON document after every stop, including after engine errors,
 * because events are written with a leading separator and the closing
 * bracket is written by timeline_stop (called by collie_shutdown). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

void timeline_init(struct timeline* t) {
  memset(t, 0, sizeof(*t));
  pthread_mutex_init(&t->lock, NULL);
}

void timeline_fini(struct timeline* t) {
  timeline_stop(t);
  pthread_mutex_destroy(&t->lock);
}

int timeline_active(struct timeline* t) { return __atomic_load_n(&t->f, __ATOMIC_RELAXED) != NULL; }

static void json_str(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void sep(struct timeline* t) { fputs(t->nevents++ ? ",\n" : "\n", t->f); }

int timeline_start(struct timeline* t, const char* path, int mark_cycles) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  pthread_mutex_lock(&t->lock);
  if (t->f) {
    fputs("\n]}\n", t->f);
    fclose(t->f);
  }
  map_free(&t->tids);
  t->ntids = 0;
  t->f = f;
  t->mark_cycles = mark_cycles;
  t->nevents = 0;
  t->t0 = time_ns();
  fputs("{\"displayTimeUnit\": \"us\", \"traceEvents\": [", f);
  sep(t);
  fputs("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"collie engine (rank 0)\"}}", f);
  fflush(f);
  pthread_mutex_unlock(&t->lock);
  return 0;
}

void timeline_stop(struct timeline* t) {
  pthread_mutex_lock(&t->lock);
  if (t->f) {
    fputs("\n]}\n", t->f);
    fclose(t->f);
    t->f = NULL;
  }
  map_free(&t->tids);
  t->ntids = 0;
  pthread_mutex_unlock(&t->lock);
}

/* Row of a tensor; a new row gets a thread_name metadata event. */
static int tid_of(struct timeline* t, const char* tensor) {
  void* v = map_get(&t->tids, tensor);
  if (v) return (int)(intptr_t)v;
  int tid = ++t->ntids;
  if (map_put(&t->tids, tensor, (void*)(intptr_t)tid) != 0) return 0;
  sep(t);
  fprintf(t->f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": ", tid);
  json_str(t->f, tensor);
  fputs("}}", t->f);
  return tid;
}

void timeline_span(struct timeline* t, const char* tensor, const char* phase, int64_t t0_ns, int64_t t1_ns) {
  if (!timeline_active(t)) return;
  pthread_mutex_lock(&t->lock);
  if (t->f) {
    int tid = tid_of(t, tensor);
    if (t1_ns < t0_ns) t1_ns = t0_ns;
    sep(t);
    fprintf(t->f, "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}", phase, tid,
            (double)(t0_ns - t->t0) / 1e3, (double)(t1_ns - t0_ns) / 1e3);
  }
  pthread_mutex_unlock(&t->lock);
}

void timeline_cycle(struct timeline* t, int64_t when_ns) {
  if (!timeline_active(t) || !t->mark_cycles) return;
  pthread_mutex_lock(&t->lock);
  if (t->f) {
    sep(t);
    fprintf(t->f, "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": 0, \"ts\": %.3f}",
            (double)(when_ns - t->t0) / 1e3);
  }
  pthread_mutex_unlock(&t->lock);
}
