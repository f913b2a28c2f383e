/* Engine internals shared by the src/engine sources: named requests, the wire format
 * of requests and responses, string maps, the response cache, the timeline
 * and autotune. api.c is the public face (handles, submission); engine.c runs
 * the background thread, whose rounds negotiate.c (with coordinator.c) agrees
 * on and execute.c runs. */
#ifndef COLLIE_ENGINE_H
#define COLLIE_ENGINE_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "comm.h"
#include "core.h"

enum ekind {
  EK_ALLREDUCE,
  EK_ALLGATHER,
  EK_BROADCAST,
  EK_ALLTOALL,
  EK_REDUCESCATTER,
  EK_BARRIER,
  EK_ADD_SET,
  EK_REMOVE_SET,
  EK_JOIN, /* never negotiated: a flag in the cycle's bit vector */
  EK_COUNT
};
const char* engine_kind_name(int kind);

/* What the ranks of a set must agree on for one named operation. Requests
 * carry it to the coordinator; responses carry it back (plus status, error
 * text and per-rank counts). */
struct meta {
  char* name;
  int32_t kind, dtype, op, root, status;
  double prescale, postscale;
  uint64_t count;
  int32_t nshape; /* allgather: dims; alltoall: sendcounts; add set: world ranks */
  int64_t* shape;
  int32_t ncounts; /* response: allgather n per-rank counts, alltoall n*n (row = sender) */
  uint64_t* counts;
  char* err; /* response with status != 0 */
  /* Grouped allreduce: the group's key (the first member's name; NULL when
   * not grouped) and its number of members. A response carries the group
   * as the coordinator agreed it. */
  char* group;
  int32_t gsize;
};
void meta_free(struct meta* m);
int meta_copy(struct meta* dst, const struct meta* src); /* 0 or -1 (out of memory) */

/* Growable byte buffer and a bounds-checked reader (peer data is untrusted). */
struct wbuf {
  uint8_t* p;
  size_t len, cap;
  int oom;
};
void wbuf_put(struct wbuf* b, const void* p, size_t n);
void meta_write(struct wbuf* b, const struct meta* m);
struct rbuf {
  const uint8_t* p;
  size_t len, off;
};
int rbuf_get(struct rbuf* b, void* out, size_t n); /* 0 or -1 past the end */
int meta_read(struct rbuf* b, struct meta* m);     /* 0, or -1 malformed (m left empty) */

/* Chained string -> pointer map; keys are copied. */
struct map_node;
struct map {
  struct map_node** b;
  size_t nb, n;
};
void* map_get(const struct map* m, const char* key);
int map_put(struct map* m, const char* key, void* val); /* 0, -1 out of memory */
void* map_del(struct map* m, const char* key);           /* returns the value or NULL */
void map_free(struct map* m);

/* One locally submitted operation, owned by the background thread once taken. */
enum { RQ_NEW, RQ_CACHED, RQ_REPORTED };
struct req {
  struct meta m;
  const void* sendbuf;
  void* recvbuf;
  int handle;
  int set;
  int state;
  int64_t t_enq; /* ns, when the background thread took it */
  struct req *next, *prev;
};
void req_free(struct req* r);

/* Response cache: identical on every member of a set, because entries are
 * inserted and evicted only while executing agreed responses (in agreed
 * order) or by agreed invalidation bits. Indexed by slot for the bit vector. */
struct centry {
  struct meta m;
  int slot;
  uint64_t last_use;
  int64_t partial_since; /* coordinator: ns since some but not all ranks had it ready; 0 none */
};
struct cache {
  int cap;
  int nslots; /* high-water mark of slots used: the bit vector covers these */
  struct centry** slots;
  struct map byname;
  uint64_t tick;
};
int cache_init(struct cache* c, int cap);
void cache_fini(struct cache* c);
struct centry* cache_find(struct cache* c, const char* name);
/* Inserts (replacing an entry of that name); may evict the least recently
 * used entry, whose name is copied to evicted (size evsz, "" if none). */
int cache_insert(struct cache* c, const struct meta* m, char* evicted, size_t evsz);
void cache_remove(struct cache* c, int slot);
void cache_touch(struct cache* c, struct centry* e);
/* Whether a request can use a cached response (same op, dtype, count ...). */
int cache_matches(const struct meta* cached, const struct meta* req);
int cache_kind_cacheable(int kind);

/* Chrome-trace timeline, written by world rank 0. Thread-safe. */
struct timeline {
  pthread_mutex_t lock;
  FILE* f;
  int mark_cycles;
  int nevents;
  int64_t t0;
  struct map tids;
  int ntids;
};
void timeline_init(struct timeline* t);
int timeline_start(struct timeline* t, const char* path, int mark_cycles); /* 0 or -1 (errno) */
void timeline_stop(struct timeline* t);
void timeline_fini(struct timeline* t);
int timeline_active(struct timeline* t);
void timeline_span(struct timeline* t, const char* tensor, const char* phase, int64_t t0_ns, int64_t t1_ns);
void timeline_cycle(struct timeline* t, int64_t when_ns);

/* Autotune, on world rank 0 only: scores (fusion threshold, cycle time)
 * pairs by bytes allreduced per second and walks a grid one parameter at a
 * time; explicitly set parameters stay fixed. */
struct autotune {
  int on, tune_fusion, tune_cycle, done;
  int phase;  /* 0: fusion threshold, 1: cycle time */
  int idx;    /* candidate under test */
  int sample; /* samples taken of the candidate (the first is a warm-up) */
  int64_t sample_start, bytes;
  int cycles_with_work;
  double best_score[16];
  int64_t fusion, cycle_us; /* current values */
  int64_t best_fusion, best_cycle_us;
  FILE* log;
  int nsamples;
};
void autotune_init(struct autotune* a, int on, int tune_fusion, int tune_cycle, int64_t fusion, int64_t cycle_us,
                   const char* log_path);
/* Records a cycle; returns 1 when the values changed (to be announced). */
int autotune_cycle(struct autotune* a, int64_t now_ns, int64_t bytes_reduced);
void autotune_fini(struct autotune* a);

/* Scales count elements of a floating-point dtype: dst = src * f. */
void engine_scale(ncclDataType_t dt, void* dst, const void* src, size_t count, double f);
int engine_dtype_is_float(ncclDataType_t dt);

/* ------------------------------------------------------------ engine state */

struct handle {
  int used, id, done, status, parts;
  char* err;
  void* result;
  size_t result_count;
  size_t* counts;
  int ncounts;
  int64_t value;
};

/* A request waiting on the coordinator for the other ranks (coordinator only). */
struct pentry {
  struct meta** per; /* by set rank; NULL: not reported yet */
  int nrep;
  int64_t first_seen, last_warn;
  int idx; /* position in the table while a cycle plans its responses */
  struct pentry *next, *prev;
};

struct pset {
  int id, size, rank; /* rank -1: this process is not a member */
  int* ranks;         /* world ranks, sorted */
  ncclComm_t comm; /* the world set's is engine.world; the others' are the engine's own */
  /* Background thread only: */
  struct req *head, *tail; /* taken, not yet executed, in take order */
  struct map pend;         /* name -> req */
  struct cache cache;
  struct map table; /* coordinator: name -> pentry */
  struct pentry *fhead, *ftail;
  int64_t round;
  uint8_t* joined; /* world set: per rank, joined this epoch */
  int64_t* joined_round;
  uint64_t barrier_seq, noname_seq; /* api.c, under the lock: names of unnamed operations */
  struct pset* next;
};

struct engine {
  pthread_mutex_t lock;
  pthread_cond_t done_cond; /* a handle completed, or the thread exited */
  pthread_cond_t wake;      /* wakes the background thread early (shutdown) */
  int initialized;          /* collie_init* returned and collie_shutdown not yet called */
  int running;              /* the background thread still runs cycles */
  int stop_requested;
  int failed_status; /* set when the thread stopped: status of later submissions */
  char stop_reason[1400];
  pthread_t thread;
  ncclComm_t world;
  int owns_world;
  int rank, size, local_rank, local_size, cross_rank, cross_size;
  struct handle* handles; /* slots, reused */
  int nhandles, handle_hint;
  int* hidx; /* handle id -> slot (open addressing, -1 empty), hidx_cap a power of two */
  size_t hidx_cap;
  int next_handle_id; /* ids only grow (wrapping at INT_MAX): a released id stays invalid */
  struct req *in_head, *in_tail; /* submitted, not yet taken */
  struct map inflight;           /* "set/name" of every pending request */
  struct pset* sets;             /* ordered by id; world first */
  int next_set_id;
  uint64_t setop_seq;
  int64_t peer_timeout_s;
  int join_handle; /* -1: none; the thread picks it up */
  int joined_me;   /* background thread: this rank has joined */
  /* Agreed configuration (world rank 0's values). */
  int64_t cycle_us, fusion, stall_check_ns, stall_shutdown_ns;
  int64_t fusion_inplace; /* fused tensors of at least this many bytes are reduced where they are */
  int cache_cap;
  /* Background thread scratch. */
  uint8_t* vec;
  size_t vec_cap;
  void* fusion_buf;
  size_t fusion_cap;
  struct timeline tl;
  struct autotune at;
  int64_t cycle_bytes;
  collie_engine_stats_t stats;
};

extern struct engine engine_g;

/* engine.c: the thread loop and the request lists of the sets. */
int engine_start_thread(struct engine* e);
/* Waits out ncclInProgress from a call on a nonblocking communicator; returns its outcome. */
ncclResult_t engine_settle(ncclComm_t comm, ncclResult_t r);
void engine_pset_free(struct pset* s);
/* Unlinks a taken request from its set, completes its handle and frees it. */
void engine_finish(struct engine* e, struct pset* s, struct req* r, int status, const char* err, void* result,
                   size_t result_count, size_t* counts, int ncounts, int64_t value);

/* One response to run in a round, with the local request (NULL on a joined rank). */
struct job {
  struct meta* m;
  struct req* r;
  int from_cache;
  int done;
};
/* A round's responses in the agreed order: cached ones in slot order, then
 * the coordinator's. jobs[i].m points at metas[i]. */
struct joblist {
  struct job* jobs;
  struct meta* metas;
  int n, cap;
};
void engine_joblist_free(struct joblist* jl);

/* What one round's vector allreduce decided besides the responses. */
struct agreement {
  int exchange;   /* the requests went to the coordinator this round */
  int shutdown;   /* world set: some rank asked to shut down; every rank stops */
  int all_joined; /* world set: every rank has joined */
};

/* negotiate.c: one round's agreement for a set (vector allreduce, released
 * cache entries, the exchange when needed); fills jl, binding each response
 * to this rank's pending request of that name. */
ncclResult_t engine_negotiate(struct engine* e, struct pset* s, int64_t now, struct joblist* jl,
                              struct agreement* ag);
/* Sends a request that waited on an evicted cache entry back to the coordinator path. */
void engine_uncache_name(struct pset* s, const char* name);

/* coordinator.c (rank 0 of the set): reads every rank's request list
 * (bufs[r], lens[r] bytes), answers what is complete or stalled into out. */
ncclResult_t engine_coordinate(struct engine* e, struct pset* s, uint8_t* const* bufs, const uint64_t* lens,
                               struct wbuf* out, int64_t announce_fusion, int64_t announce_cycle);
/* Every round: warns about entries that wait too long; returns 1 when some
 * must be failed (which needs an exchange). */
int engine_stall_scan(struct engine* e, struct pset* s, int64_t now);
void engine_pentry_free(struct pentry* p, int n);

/* execute.c: runs the agreed jobs in order (fusing allreduces), completes
 * the local handles and teaches the cache the new responses. */
ncclResult_t engine_execute(struct engine* e, struct pset* s, struct job* jobs, int nj, int64_t agreed);

/* api.c: completes one part of a handle (takes the lock). result/counts are
 * handed over (freed with the handle). */
void engine_complete(struct engine* e, int handle, int status, const char* err, void* result, size_t result_count,
                     size_t* counts, int ncounts, int64_t value);
void engine_inflight_del(struct engine* e, int set, const char* name);

/* Sets the calling thread's collie_last_error() text (used by src/elastic). */
void engine_last_error_set(const char* msg);

#endif
