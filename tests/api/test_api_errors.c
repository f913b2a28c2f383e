/* Argument and usage errors of the public API, seen the way an application
 * sees them: only nccl.h and collie.h, linked against the shared libcollie.
 * Every failing call must return the documented code and leave a message in
 * ncclGetLastError that names the culprit. Single process, 1-rank comms,
 * on which the collectives' results (copies, premul-sum) are checked too. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "collie.h"
#include "nccl.h"

/* Leaves a known message in the last-error record, one that does not
 * contain `word`, so that a check can tell the message of the call under
 * test from a stale one. */
static const char* prime_last_error(const char* word) {
  for (int i = 0; i < 3; i++) {
    ncclResult_t r = i == 0 ? ncclGetVersion(NULL) : i == 1 ? ncclGetUniqueId(NULL) : ncclCommFinalize(NULL);
    assert_int_equal(r, ncclInvalidArgument);
    const char* msg = ncclGetLastError(NULL);
    if (strstr(msg, word) == NULL) return msg;
  }
  fail_msg("no sentinel message avoids \"%s\"", word);
  return NULL;
}

static void check_error(ncclResult_t got, ncclResult_t want, const char* word, const char* sentinel,
                        const char* call, int line) {
  if (got != want)
    fail_msg("line %d: %s returned %d (%s), expected %d (%s); last error: %s", line, call, (int)got,
             ncclGetErrorString(got), (int)want, ncclGetErrorString(want), ncclGetLastError(NULL));
  const char* msg = ncclGetLastError(NULL);
  if (msg == NULL) fail_msg("line %d: %s: ncclGetLastError(NULL) is NULL", line, call);
  if (msg[0] == '\0') fail_msg("line %d: %s: ncclGetLastError(NULL) is empty", line, call);
  if (strcmp(msg, sentinel) == 0) fail_msg("line %d: %s left no message of its own (still \"%s\")", line, call, msg);
  if (strstr(msg, word) == NULL)
    fail_msg("line %d: %s: last error \"%s\" does not mention \"%s\"", line, call, msg, word);
}

/* EXPECT_ERR(call, code, word): `call` returns `code` and records a new
 * message containing `word`. The sentinel copy outlives the next API call. */
#define EXPECT_ERR(call, code, word)                                        \
  do {                                                                      \
    char sentinel_[1024];                                                   \
    snprintf(sentinel_, sizeof(sentinel_), "%s", prime_last_error(word));   \
    ncclResult_t r_ = (call);                                               \
    check_error(r_, (code), (word), sentinel_, #call, __LINE__);            \
  } while (0)

#define EXPECT_OK(call)                                                                          \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess)                                                                       \
      fail_msg("line %d: %s returned %d (%s): %s", __LINE__, #call, (int)r_, ncclGetErrorString(r_), \
               ncclGetLastError(NULL));                                                          \
  } while (0)

/* The host entry points of NVIDIA's nccl_device/core.h (not in nccl.h);
 * their structures are opaque here, only pointers cross. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);

/* A live 1-rank communicator; each one needs an ID of its own. */
static ncclComm_t one_rank_comm(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&c, 1, id, 0));
  assert_non_null(c);
  return c;
}

/* Tuning variables with values the tuner cannot read: init fails with
 * ncclInvalidArgument naming the variable, and a good value afterwards works. */
static void test_bad_tuning_env(void** state) {
  (void)state;
  static const char* const bad[][3] = {
      {"NCCL_ALGO", "Bogus", "NCCL_ALGO"},
      {"NCCL_PROTO", "Fast", "NCCL_PROTO"},
      {"COLLIE_STREAM_STORES", "2", "COLLIE_STREAM_STORES"},
      {"COLLIE_STREAM_STORES", "yes", "COLLIE_STREAM_STORES"},
      {"COLLIE_SLOT_STREAM", "split", "COLLIE_SLOT_STREAM"},
      {"COLLIE_SLOT_ROTATE", "2", "COLLIE_SLOT_ROTATE"},
      {"COLLIE_SLOT_ROTATE", "on", "COLLIE_SLOT_ROTATE"},
      {"COLLIE_ADAPT_LOAD", "sometimes", "COLLIE_ADAPT_LOAD"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ncclUniqueId id;
    ncclComm_t c = NULL;
    EXPECT_OK(ncclGetUniqueId(&id));
    assert_int_equal(setenv(bad[i][0], bad[i][1], 1), 0);
    EXPECT_ERR(ncclCommInitRank(&c, 1, id, 0), ncclInvalidArgument, bad[i][2]);
    assert_int_equal(unsetenv(bad[i][0]), 0);
  }
  assert_int_equal(setenv("COLLIE_STREAM_STORES", "1", 1), 0);
  ncclComm_t c = one_rank_comm();
  assert_int_equal(unsetenv("COLLIE_STREAM_STORES"), 0);
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  EXPECT_OK(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, c, NULL));
  assert_true(y[0] == 1 && y[3] == 4);
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- version, IDs */

static void test_get_version(void** state) {
  (void)state;
  EXPECT_ERR(ncclGetVersion(NULL), ncclInvalidArgument, "ncclGetVersion");
  int v = 0;
  EXPECT_OK(ncclGetVersion(&v));
  assert_int_equal(v, NCCL_VERSION_CODE);
  assert_int_equal(collie_version(), COLLIE_VERSION_CODE);
}

static void test_get_unique_id(void** state) {
  (void)state;
  EXPECT_ERR(ncclGetUniqueId(NULL), ncclInvalidArgument, "ncclGetUniqueId");
}

static void test_comm_id_garbage(void** state) {
  (void)state;
  static const char* bad[] = {"nonsense", "1.2.3.4:0", "::1:5", "127.0.0.1:65536", "127.0.0.1:", ":80",
                              "[::1]5", "127.0.0.1:12x"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(setenv("NCCL_COMM_ID", bad[i], 1), 0);
    ncclUniqueId id;
    EXPECT_ERR(ncclGetUniqueId(&id), ncclInvalidArgument, "NCCL_COMM_ID");
  }
  assert_int_equal(unsetenv("NCCL_COMM_ID"), 0);
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id));
}

/* --------------------------------------------------------------- init */

static void test_init_rank_args(void** state) {
  (void)state;
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id));
  ncclComm_t c = (ncclComm_t)(uintptr_t)0x1;

  EXPECT_ERR(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument, "newcomm");
  EXPECT_ERR(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks");
  assert_null(c);
  c = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommInitRank(&c, -1, id, 0), ncclInvalidArgument, "nranks");
  assert_null(c);
  EXPECT_ERR(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument, "rank -1");
  EXPECT_ERR(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument, "rank 2");
  EXPECT_ERR(ncclCommInitRank(&c, 1, id, 1), ncclInvalidArgument, "rank 1");

  /* An ID that no ncclGetUniqueId made: refused before any network traffic. */
  ncclUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  c = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommInitRank(&c, 1, zero, 0), ncclInvalidArgument, "ncclUniqueId");
  assert_null(c);
  ncclUniqueId junk;
  memset(&junk, 0x5a, sizeof(junk));
  c = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommInitRank(&c, 1, junk, 0), ncclInvalidArgument, "ncclUniqueId");
  assert_null(c);
}

static void test_init_rank_config(void** state) {
  (void)state;
  ncclUniqueId id;
  EXPECT_OK(ncclGetUniqueId(&id));
  ncclComm_t c = (ncclComm_t)(uintptr_t)0x1;
  ncclConfig_t cfg;

  ncclConfig_t init = NCCL_CONFIG_INITIALIZER;
  cfg = init;
  cfg.magic = 0x12345678u;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "magic");
  assert_null(c);

  cfg = init;
  cfg.size = 0;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "size");
  cfg = init;
  cfg.size = sizeof(ncclConfig_t) + 8;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "size");

  cfg = init;
  cfg.version = 0;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "version");
  cfg = init;
  cfg.version = NCCL_VERSION_CODE + 1;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "version");

  cfg = init;
  cfg.blocking = 2;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "blocking");

  cfg = init;
  cfg.minCTAs = 8;
  cfg.maxCTAs = 4;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "minCTAs");
  cfg = init;
  cfg.minCTAs = 0;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "minCTAs");
  cfg = init;
  cfg.maxCTAs = -3;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "maxCTAs");
  cfg = init;
  cfg.cgaClusterSize = 9;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "cgaClusterSize");
  cfg = init;
  cfg.splitShare = 7;
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "splitShare");
  assert_null(c);

  /* The ID was never consumed by the failures above; a valid config uses it. */
  cfg = init;
  EXPECT_OK(ncclCommInitRankConfig(&c, 1, id, 0, &cfg));
  assert_non_null(c);
  int n = 0, r = -1;
  EXPECT_OK(ncclCommCount(c, &n));
  EXPECT_OK(ncclCommUserRank(c, &r));
  assert_int_equal(n, 1);
  assert_int_equal(r, 0);
  EXPECT_OK(ncclCommDestroy(c));

  /* A NULL config means the defaults. */
  EXPECT_OK(ncclGetUniqueId(&id));
  c = NULL;
  EXPECT_OK(ncclCommInitRankConfig(&c, 1, id, 0, NULL));
  assert_non_null(c);
  EXPECT_OK(ncclCommDestroy(c));

  /* Non-blocking: may answer ncclInProgress, then the async error settles. */
  EXPECT_OK(ncclGetUniqueId(&id));
  cfg = init;
  cfg.blocking = 0;
  c = NULL;
  ncclResult_t r0 = ncclCommInitRankConfig(&c, 1, id, 0, &cfg);
  if (r0 != ncclSuccess && r0 != ncclInProgress)
    fail_msg("non-blocking init returned %d: %s", (int)r0, ncclGetLastError(NULL));
  assert_non_null(c);
  ncclResult_t async = ncclInProgress;
  for (int i = 0; i < 10000 && async == ncclInProgress; i++) {
    EXPECT_OK(ncclCommGetAsyncError(c, &async));
    if (async == ncclInProgress) usleep(1000);
  }
  assert_int_equal(async, ncclSuccess);
  EXPECT_OK(ncclCommDestroy(c));

  /* A config from an older header (NCCL 2.14 layout, up to netName): the
   * library must read no byte past its size. The block is exactly that big,
   * so valgrind sees any over-read. */
  size_t old_size = offsetof(ncclConfig_t, netName);
  cfg = init;
  cfg.size = old_size;
  cfg.version = NCCL_VERSION(2, 14, 0);
  unsigned char* old = malloc(old_size);
  assert_non_null(old);
  memcpy(old, &cfg, old_size);
  EXPECT_OK(ncclGetUniqueId(&id));
  c = NULL;
  EXPECT_OK(ncclCommInitRankConfig(&c, 1, id, 0, (ncclConfig_t*)(void*)old));
  assert_non_null(c);
  EXPECT_OK(ncclCommDestroy(c));
  cfg.version = NCCL_VERSION(2, 13, 0);
  memcpy(old, &cfg, old_size);
  EXPECT_ERR(ncclCommInitRankConfig(&c, 1, id, 0, (ncclConfig_t*)(void*)old), ncclInvalidArgument, "version");
  free(old);
}

static void test_init_rank_scalable(void** state) {
  (void)state;
  ncclUniqueId ids[3];
  for (int i = 0; i < 3; i++) EXPECT_OK(ncclGetUniqueId(&ids[i]));
  ncclComm_t c = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommInitRankScalable(&c, 2, 0, 0, ids, NULL), ncclInvalidArgument, "nId");
  assert_null(c);
  EXPECT_ERR(ncclCommInitRankScalable(&c, 2, 0, 3, ids, NULL), ncclInvalidArgument, "nId");
  EXPECT_ERR(ncclCommInitRankScalable(&c, 2, 0, -1, ids, NULL), ncclInvalidArgument, "nId");
  EXPECT_ERR(ncclCommInitRankScalable(&c, 2, 0, 1, NULL, NULL), ncclInvalidArgument, "ID");
  EXPECT_ERR(ncclCommInitRankScalable(NULL, 2, 0, 1, ids, NULL), ncclInvalidArgument, "newcomm");
  EXPECT_ERR(ncclCommInitRankScalable(&c, 2, 2, 1, ids, NULL), ncclInvalidArgument, "rank 2");
  EXPECT_ERR(ncclCommInitRankScalable(&c, 0, 0, 1, ids, NULL), ncclInvalidArgument, "nranks");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  EXPECT_ERR(ncclCommInitRankScalable(&c, 1, 0, 1, ids, &cfg), ncclInvalidArgument, "magic");
  assert_null(c);
  /* One root for one rank works through the scalable entry point too. */
  EXPECT_OK(ncclCommInitRankScalable(&c, 1, 0, 1, ids, NULL));
  assert_non_null(c);
  EXPECT_OK(ncclCommDestroy(c));
}

static void test_init_all_args(void** state) {
  (void)state;
  ncclComm_t comms[2];
  EXPECT_ERR(ncclCommInitAll(NULL, 2, NULL), ncclInvalidArgument, "comms");
  EXPECT_ERR(ncclCommInitAll(comms, 0, NULL), ncclInvalidArgument, "ndev");
  EXPECT_ERR(ncclCommInitAll(comms, -2, NULL), ncclInvalidArgument, "ndev");
  int devs[2] = {0, -1};
  EXPECT_ERR(ncclCommInitAll(comms, 2, devs), ncclInvalidArgument, "devlist");
  /* Valid: one thread per rank in this process. */
  EXPECT_OK(ncclCommInitAll(comms, 2, NULL));
  for (int i = 0; i < 2; i++) {
    int n = 0, r = -1;
    EXPECT_OK(ncclCommCount(comms[i], &n));
    EXPECT_OK(ncclCommUserRank(comms[i], &r));
    assert_int_equal(n, 2);
    assert_int_equal(r, i);
  }
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
}

/* Several ranks' communicators created by one thread inside a group (as
 * nccl-tests does for the ranks it drives): each init is deferred to
 * ncclGroupEnd, which runs them side by side; without that the first would
 * wait forever for the others. Then one group of allreduces over all of them. */
static void test_init_in_group(void** state) {
  (void)state;
  enum { N = 3, COUNT = 1001 };
  ncclUniqueId id;
  ncclComm_t comms[N] = {NULL};
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < N; i++) EXPECT_OK(ncclCommInitRank(&comms[i], N, id, i));
  EXPECT_OK(ncclGroupEnd());
  float* bufs[N];
  for (int i = 0; i < N; i++) {
    int n = 0, r = -1;
    ncclResult_t async = ncclInProgress;
    assert_non_null(comms[i]);
    EXPECT_OK(ncclCommGetAsyncError(comms[i], &async));
    assert_int_equal(async, ncclSuccess);
    EXPECT_OK(ncclCommCount(comms[i], &n));
    EXPECT_OK(ncclCommUserRank(comms[i], &r));
    assert_int_equal(n, N);
    assert_int_equal(r, i);
    bufs[i] = malloc(COUNT * sizeof(float));
    assert_non_null(bufs[i]);
    for (int k = 0; k < COUNT; k++) bufs[i][k] = (float)(i + 1 + k % 5);
  }
  EXPECT_OK(ncclGroupStart());
  for (int i = 0; i < N; i++) EXPECT_OK(ncclAllReduce(bufs[i], bufs[i], COUNT, ncclFloat, ncclSum, comms[i], NULL));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < COUNT; k++) assert_true(bufs[i][k] == (float)(N * (N + 1) / 2 + N * (k % 5)));
    free(bufs[i]);
  }
  /* The same with ncclCommInitRankConfig, and a nested group. */
  ncclComm_t more[2] = {NULL, NULL};
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclCommInitRankConfig(&more[0], 2, id, 0, &cfg));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_OK(ncclCommInitRankConfig(&more[1], 2, id, 1, &cfg));
  EXPECT_OK(ncclGroupEnd());
  for (int i = 0; i < 2; i++) EXPECT_OK(ncclCommDestroy(more[i]));
  for (int i = 0; i < N; i++) EXPECT_OK(ncclCommDestroy(comms[i]));
}

/* --------------------------------------------------------------- queries, teardown */

static void test_null_comm_queries(void** state) {
  (void)state;
  int v;
  ncclResult_t a;
  EXPECT_ERR(ncclCommCount(NULL, &v), ncclInvalidArgument, "ncclCommCount");
  EXPECT_ERR(ncclCommUserRank(NULL, &v), ncclInvalidArgument, "ncclCommUserRank");
  EXPECT_ERR(ncclCommCuDevice(NULL, &v), ncclInvalidArgument, "ncclCommCuDevice");
  EXPECT_ERR(ncclCommGetAsyncError(NULL, &a), ncclInvalidArgument, "ncclCommGetAsyncError");
  EXPECT_ERR(ncclCommFinalize(NULL), ncclInvalidArgument, "ncclCommFinalize");
  collie_peer_info_t info = {.size = sizeof(info)};
  EXPECT_ERR(collie_comm_peer_info(NULL, 0, &info), ncclInvalidArgument, "collie_comm_peer_info");
  EXPECT_OK(ncclCommDestroy(NULL));
  EXPECT_OK(ncclCommAbort(NULL));
}

static void test_null_out_pointers(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  EXPECT_ERR(ncclCommCount(c, NULL), ncclInvalidArgument, "count");
  EXPECT_ERR(ncclCommUserRank(c, NULL), ncclInvalidArgument, "ncclCommUserRank: rank");
  EXPECT_ERR(ncclCommCuDevice(c, NULL), ncclInvalidArgument, "device");
  EXPECT_ERR(ncclCommGetAsyncError(c, NULL), ncclInvalidArgument, "asyncError");
  /* The failed queries left the comm intact. */
  int n = 0, dev = -2;
  ncclResult_t a = ncclInternalError;
  EXPECT_OK(ncclCommCount(c, &n));
  EXPECT_OK(ncclCommCuDevice(c, &dev));
  EXPECT_OK(ncclCommGetAsyncError(c, &a));
  assert_int_equal(n, 1);
  assert_true(dev >= -1);
  assert_int_equal(a, ncclSuccess);
  EXPECT_OK(ncclCommDestroy(c));
}

static void test_finalize_twice(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  EXPECT_OK(ncclCommFinalize(c));
  EXPECT_ERR(ncclCommFinalize(c), ncclInvalidUsage, "finalized");
  EXPECT_OK(ncclCommDestroy(c));
  /* Abort of a live comm releases it as well. */
  c = one_rank_comm();
  EXPECT_OK(ncclCommAbort(c));
}

static void test_peer_info(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  collie_peer_info_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  EXPECT_ERR(collie_comm_peer_info(c, 0, NULL), ncclInvalidArgument, "info");
  EXPECT_ERR(collie_comm_peer_info(c, -1, &info), ncclInvalidArgument, "rank -1");
  EXPECT_ERR(collie_comm_peer_info(c, 1, &info), ncclInvalidArgument, "rank 1");
  info.size = 0;
  EXPECT_ERR(collie_comm_peer_info(c, 0, &info), ncclInvalidArgument, "size");
  info.size = (size_t)1 << 30;
  EXPECT_ERR(collie_comm_peer_info(c, 0, &info), ncclInvalidArgument, "size");

  info.size = sizeof(info);
  EXPECT_OK(collie_comm_peer_info(c, 0, &info));
  assert_int_equal(info.size, sizeof(info));
  assert_int_equal(info.rank, 0);
  assert_int_equal(info.pid, (int)getpid());
  assert_int_equal(info.local_rank, 0);
  assert_int_equal(info.local_size, 1);

  /* An older, smaller struct: nothing past its size is written. */
  memset(&info, 0xab, sizeof(info));
  info.size = offsetof(collie_peer_info_t, hostname);
  EXPECT_OK(collie_comm_peer_info(c, 0, &info));
  assert_int_equal(info.size, offsetof(collie_peer_info_t, hostname));
  assert_int_equal(info.rank, 0);
  assert_int_equal((unsigned char)info.hostname[0], 0xab);
  assert_int_equal((unsigned char)info.pci_bus_id[31], 0xab);
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- error strings */

static void test_error_strings(void** state) {
  (void)state;
  const char* s[ncclNumResults];
  for (int i = 0; i < ncclNumResults; i++) {
    s[i] = ncclGetErrorString((ncclResult_t)i);
    assert_non_null(s[i]);
    assert_true(s[i][0] != '\0');
    for (int j = 0; j < i; j++)
      if (strcmp(s[i], s[j]) == 0) fail_msg("ncclGetErrorString(%d) == ncclGetErrorString(%d): \"%s\"", i, j, s[i]);
  }
  const char* u = ncclGetErrorString((ncclResult_t)99);
  assert_non_null(u);
  assert_true(u[0] != '\0');
  assert_non_null(ncclGetErrorString((ncclResult_t)-1));
}

/* --------------------------------------------------------------- stubs */

/* Exactly the entry points still in src/stubs.c: each fails with
 * ncclInvalidUsage and names itself. */
static void test_stubs(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  float buf[4] = {0};
  void* p = (void*)(uintptr_t)0x1;
  void* handle = NULL;
  ncclWindow_t win = NULL;
  ncclComm_t nc = (ncclComm_t)(uintptr_t)0x1;
  int exclude[1] = {0};

  /* Device path (src/device/dev_api.c): ncclMemAlloc is device memory, so
   * without a GPU it fails with ncclInvalidUsage and says why. */
  if (ncclMemAlloc(&p, 64) == ncclSuccess) {
    EXPECT_OK(ncclMemFree(p));
  } else {
    EXPECT_ERR(ncclMemAlloc(&p, 64), ncclInvalidUsage, "ncclMemAlloc");
    EXPECT_ERR(ncclMemFree(buf), ncclInvalidUsage, "ncclMemFree");
  }
  EXPECT_ERR(ncclCommRegister(c, buf, sizeof(buf), NULL), ncclInvalidArgument, "ncclCommRegister");
  EXPECT_OK(ncclCommRegister(c, buf, sizeof(buf), &handle));
  EXPECT_OK(ncclCommDeregister(c, handle));
  EXPECT_ERR(ncclCommDeregister(c, handle), ncclInvalidArgument, "ncclCommDeregister");
  /* Windows (src/window.c): host memory from ncclMemAlloc only; a stack buffer is refused, on every path. */
  EXPECT_ERR(ncclCommWindowRegister(c, buf, sizeof(buf), &win, 0), ncclInvalidUsage, "ncclCommWindowRegister");
  assert_null(win);
  EXPECT_ERR(ncclCommWindowRegister(c, buf, sizeof(buf), NULL, 0), ncclInvalidArgument, "ncclCommWindowRegister");
  EXPECT_ERR(ncclCommWindowRegister(c, buf, 0, &win, 0), ncclInvalidArgument, "ncclCommWindowRegister");
  EXPECT_ERR(ncclCommWindowRegister(c, NULL, 64, &win, 0), ncclInvalidArgument, "ncclCommWindowRegister");
  EXPECT_ERR(ncclCommWindowRegister(c, buf, sizeof(buf), &win, 7), ncclInvalidArgument, "winFlags");
  EXPECT_ERR(ncclCommWindowRegister(NULL, buf, sizeof(buf), &win, 0), ncclInvalidArgument, "ncclCommWindowRegister");
  EXPECT_ERR(ncclCommWindowDeregister(c, win), ncclInvalidArgument, "ncclCommWindowDeregister");
  EXPECT_ERR(ncclCommWindowDeregister(c, (ncclWindow_t)buf), ncclInvalidArgument, "ncclCommWindowDeregister");
  void* wmem = NULL;
  if (ncclMemAlloc(&wmem, 3 * 4096) == ncclSuccess) {
    /* Without a GPU that is host memory: a one-rank window works. */
    void* q = NULL;
    size_t qsize = 0;
    EXPECT_ERR(ncclCommWindowRegister(c, (char*)wmem + 8, 4096, &win, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidArgument,
               "multiple of 4096");
    EXPECT_ERR(ncclCommWindowRegister(c, (char*)wmem + 4096, 3 * 4096, &win, 0), ncclInvalidUsage,
               "does not lie within");
    EXPECT_OK(ncclCommWindowRegister(c, (char*)wmem + 4096, 8192, &win, NCCL_WIN_COLL_SYMMETRIC));
    assert_non_null(win);
    EXPECT_OK(collie_window_peer_ptr(c, win, 0, &q, &qsize));
    assert_ptr_equal(q, (char*)wmem + 4096);
    assert_int_equal(qsize, 8192);
    EXPECT_ERR(collie_window_peer_ptr(c, win, 1, &q, NULL), ncclInvalidArgument, "collie_window_peer_ptr");
    assert_null(q);
    EXPECT_ERR(collie_window_peer_ptr(c, win, 0, NULL, NULL), ncclInvalidArgument, "collie_window_peer_ptr");
    ncclWindow_t win2 = NULL;
    EXPECT_OK(ncclCommWindowRegister(c, (char*)wmem + 8, 100, &win2, 0)); /* default windows need no alignment */
    EXPECT_OK(ncclCommWindowDeregister(c, win));
    EXPECT_ERR(ncclCommWindowDeregister(c, win), ncclInvalidArgument, "ncclCommWindowDeregister");
    EXPECT_ERR(collie_window_peer_ptr(c, win, 0, &q, NULL), ncclInvalidArgument, "collie_window_peer_ptr");
    (void)win2; /* left registered: ncclCommDestroy frees it */
    win = NULL;
  }
  char devcomm[256] = {0};
  EXPECT_ERR(ncclDevCommCreate(c, devcomm, devcomm), ncclInvalidUsage, "ncclDevCommCreate");
  EXPECT_ERR(ncclDevCommDestroy(c, devcomm), ncclInvalidUsage, "ncclDevCommDestroy");
  EXPECT_ERR(ncclCommRevoke(c, 5), ncclInvalidArgument, "revokeFlags");
  /* ncclCommSplit exists: bad arguments are ncclInvalidArgument; a 1-rank split works. */
  EXPECT_ERR(ncclCommSplit(c, -5, 0, &nc, NULL), ncclInvalidArgument, "ncclCommSplit");
  assert_null(nc);
  EXPECT_ERR(ncclCommSplit(c, 0, 0, NULL, NULL), ncclInvalidArgument, "ncclCommSplit");
  EXPECT_OK(ncclCommSplit(c, 7, 0, &nc, NULL));
  assert_non_null(nc);
  EXPECT_OK(ncclCommDestroy(nc));
  EXPECT_OK(ncclCommSplit(c, NCCL_SPLIT_NOCOLOR, 0, &nc, NULL));
  assert_null(nc);
  nc = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommShrink(c, exclude, 1, &nc, NULL, 0), ncclInvalidUsage, "ncclCommShrink");
  assert_null(nc);
  /* The profiling twins reach the same code. */
  EXPECT_ERR(pncclCommRegister(c, NULL, 4, &handle), ncclInvalidArgument, "ncclCommRegister");
  EXPECT_ERR(pncclCommCount(NULL, NULL), ncclInvalidArgument, "ncclCommCount");

  /* The communicator is still usable after all that. */
  int n = 0;
  EXPECT_OK(ncclCommCount(c, &n));
  assert_int_equal(n, 1);
  float in[4] = {1, 2, 3, 4};
  EXPECT_OK(ncclAllReduce(in, buf, 4, ncclFloat, ncclSum, c, NULL));
  assert_memory_equal(buf, in, sizeof(in));
  EXPECT_OK(ncclCommDestroy(c));
  if (wmem) EXPECT_OK(ncclMemFree(wmem));
}

/* --------------------------------------------------------------- collectives: arguments */

/* EXPECT_ERR2: like EXPECT_ERR, and the message also contains `word2`. */
#define EXPECT_ERR2(call, code, word, word2)                                                        \
  do {                                                                                              \
    EXPECT_ERR(call, code, word);                                                                   \
    if (strstr(ncclGetLastError(NULL), (word2)) == NULL)                                            \
      fail_msg("line %d: %s: last error \"%s\" does not mention \"%s\"", __LINE__, #call,            \
               ncclGetLastError(NULL), (word2));                                                    \
  } while (0)

/* Every collective and p2p entry point, called with one argument made bad by
 * the caller: `dt`, `op`, `root` (the peer for send/receive), the two buffers
 * and the count. Calls the entry point `which` (0..NCALLS-1) and names it. */
enum { C_ALLREDUCE, C_REDUCE, C_BROADCAST, C_BCAST, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL, C_GATHER, C_SCATTER,
       C_SEND, C_RECV, NCALLS };

struct call_args {
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  ncclComm_t comm;
};

static ncclResult_t call_coll(int which, const struct call_args* a, const char** name) {
  switch (which) {
    case C_ALLREDUCE:
      *name = "ncclAllReduce";
      return ncclAllReduce(a->send, a->recv, a->count, a->dt, a->op, a->comm, NULL);
    case C_REDUCE:
      *name = "ncclReduce";
      return ncclReduce(a->send, a->recv, a->count, a->dt, a->op, a->root, a->comm, NULL);
    case C_BROADCAST:
      *name = "ncclBroadcast";
      return ncclBroadcast(a->send, a->recv, a->count, a->dt, a->root, a->comm, NULL);
    case C_BCAST:
      /* ncclBcast reports its errors under the name ncclBroadcast. */
      *name = "ncclB";
      return ncclBcast(a->recv, a->count, a->dt, a->root, a->comm, NULL);
    case C_ALLGATHER:
      *name = "ncclAllGather";
      return ncclAllGather(a->send, a->recv, a->count, a->dt, a->comm, NULL);
    case C_REDUCESCATTER:
      *name = "ncclReduceScatter";
      return ncclReduceScatter(a->send, a->recv, a->count, a->dt, a->op, a->comm, NULL);
    case C_ALLTOALL:
      *name = "ncclAlltoAll";
      return ncclAlltoAll(a->send, a->recv, a->count, a->dt, a->comm, NULL);
    case C_GATHER:
      *name = "ncclGather";
      return ncclGather(a->send, a->recv, a->count, a->dt, a->root, a->comm, NULL);
    case C_SCATTER:
      *name = "ncclScatter";
      return ncclScatter(a->send, a->recv, a->count, a->dt, a->root, a->comm, NULL);
    case C_SEND:
      *name = "ncclSend";
      return ncclSend(a->send, a->count, a->dt, a->root, a->comm, NULL);
    case C_RECV:
      *name = "ncclRecv";
      return ncclRecv(a->recv, a->count, a->dt, a->root, a->comm, NULL);
    default: fail_msg("no call %d", which); return ncclInternalError;
  }
}

static int call_has_op(int which) { return which == C_ALLREDUCE || which == C_REDUCE || which == C_REDUCESCATTER; }
static int call_has_root(int which) {
  return which == C_REDUCE || which == C_BROADCAST || which == C_BCAST || which == C_GATHER || which == C_SCATTER ||
         which == C_SEND || which == C_RECV;
}
static int call_reads_send(int which) { return which != C_BCAST && which != C_RECV; }
static int call_writes_recv(int which) { return which != C_SEND; }

/* One call through call_coll, checked like EXPECT_ERR: the code, a fresh
 * message naming the entry point and containing `word`. */
static void expect_coll_err(int which, const struct call_args* a, ncclResult_t code, const char* word, const char* why,
                            int line) {
  const char* name = "?";
  char sentinel[1024];
  snprintf(sentinel, sizeof(sentinel), "%s", prime_last_error(word));
  ncclResult_t r = call_coll(which, a, &name);
  char what[160];
  snprintf(what, sizeof(what), "%s (%s)", name, why);
  check_error(r, code, word, sentinel, what, line);
  if (strstr(ncclGetLastError(NULL), name) == NULL)
    fail_msg("line %d: %s: last error \"%s\" does not name the call", line, what, ncclGetLastError(NULL));
}

static void test_collective_args(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  float sbuf[8] = {0}, rbuf[8] = {0};
  const struct call_args good = {sbuf, rbuf, 4, ncclFloat, ncclSum, 0, c};

  for (int w = 0; w < NCALLS; w++) {
    struct call_args a = good;

    a.comm = NULL;
    expect_coll_err(w, &a, ncclInvalidArgument, "comm", "NULL comm", __LINE__);

    a = good;
    a.dt = (ncclDataType_t)-1;
    expect_coll_err(w, &a, ncclInvalidArgument, "datatype", "datatype -1", __LINE__);
    a.dt = ncclNumTypes;
    expect_coll_err(w, &a, ncclInvalidArgument, "datatype", "datatype ncclNumTypes", __LINE__);

    if (call_has_op(w)) {
      a = good;
      a.op = (ncclRedOp_t)-1;
      expect_coll_err(w, &a, ncclInvalidArgument, "operator", "op -1", __LINE__);
      a.op = (ncclRedOp_t)(ncclNumOps + 100);
      expect_coll_err(w, &a, ncclInvalidArgument, "operator", "op never created", __LINE__);
      a.op = ncclMaxRedOp;
      expect_coll_err(w, &a, ncclInvalidArgument, "operator", "op ncclMaxRedOp", __LINE__);
      a.op = ncclNumOps; /* the first run-time handle, none created yet */
      expect_coll_err(w, &a, ncclInvalidArgument, "operator", "op ncclNumOps", __LINE__);
    }

    if (call_has_root(w)) {
      const char* what = w == C_SEND || w == C_RECV ? "peer" : "root";
      a = good;
      a.root = -1;
      expect_coll_err(w, &a, ncclInvalidArgument, what, "root/peer -1", __LINE__);
      a.root = 1; /* nranks */
      expect_coll_err(w, &a, ncclInvalidArgument, what, "root/peer nranks", __LINE__);
    }

    /* NULL buffers with a count: refused (on 1 rank, rank 0 is the root). */
    if (call_reads_send(w)) {
      a = good;
      a.send = NULL;
      expect_coll_err(w, &a, ncclInvalidArgument, "sendbuff", "NULL sendbuff", __LINE__);
    }
    if (call_writes_recv(w)) {
      a = good;
      a.recv = NULL;
      expect_coll_err(w, &a, ncclInvalidArgument, w == C_BCAST ? "buff" : "recvbuff", "NULL recvbuff", __LINE__);
    }

    /* SIZE_MAX/2 floats is more bytes than an address space holds. */
    a = good;
    a.count = SIZE_MAX / 2;
    expect_coll_err(w, &a, ncclInvalidArgument, "overflow", "count SIZE_MAX/2", __LINE__);
    a.count = SIZE_MAX;
    expect_coll_err(w, &a, ncclInvalidArgument, "overflow", "count SIZE_MAX", __LINE__);
    a.count = SIZE_MAX / 4 + 1;
    expect_coll_err(w, &a, ncclInvalidArgument, "overflow", "count SIZE_MAX/4+1", __LINE__);

    /* A count of 0 with NULL buffers moves nothing and succeeds. A lone
     * send or receive needs its partner, so those two go as a pair below. */
    if (w != C_SEND && w != C_RECV) {
      a = good;
      a.send = NULL;
      a.recv = NULL;
      a.count = 0;
      const char* name = "?";
      ncclResult_t r = call_coll(w, &a, &name);
      if (r != ncclSuccess)
        fail_msg("%s with count 0 and NULL buffers returned %d: %s", name, (int)r, ncclGetLastError(NULL));
    }
  }
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(NULL, 0, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclRecv(NULL, 0, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupEnd());

  /* Alltoall runs in place too (as NCCL's does; nccl-tests checks it). */
  for (int i = 0; i < 4; i++) sbuf[i] = (float)(i + 1);
  EXPECT_OK(ncclAlltoAll(sbuf, sbuf, 4, ncclFloat, c, NULL));
  for (int i = 0; i < 4; i++) assert_true(sbuf[i] == (float)(i + 1));
  EXPECT_OK(ncclAlltoAll(sbuf, sbuf, 0, ncclFloat, c, NULL));

  /* The profiling twin checks the same way. */
  EXPECT_ERR2(pncclAllReduce(sbuf, rbuf, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, "ncclAllReduce",
              "comm");

  /* None of the failures above touched the output. */
  for (int i = 0; i < 8; i++) assert_true(rbuf[i] == 0.0f);

  /* A collective after ncclCommFinalize is a usage error, not an argument error. */
  EXPECT_OK(ncclCommFinalize(c));
  EXPECT_ERR2(ncclAllReduce(sbuf, rbuf, 4, ncclFloat, ncclSum, c, NULL), ncclInvalidUsage, "ncclAllReduce",
              "finalized");
  EXPECT_ERR2(ncclSend(sbuf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclSend", "finalized");
  EXPECT_ERR2(ncclBroadcast(sbuf, rbuf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclBroadcast", "finalized");
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- collectives: groups */

static void test_collective_groups(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  float in[5] = {1, 2, 3, 4, 5};
  float out[5] = {0};
  const float zero[5] = {0};
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;

  EXPECT_ERR2(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd", "ncclGroupStart");
  EXPECT_ERR2(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd", "ncclGroupStart");
  EXPECT_ERR2(ncclGroupSimulateEnd(NULL), ncclInvalidUsage, "ncclGroupSimulateEnd", "ncclGroupStart");

  /* An argument error inside a group: the call says so at once, the group's
   * end fails too, and nothing of the group runs (not even its valid calls). */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_ERR2(ncclAllReduce(in, out, 5, (ncclDataType_t)-1, ncclSum, c, NULL), ncclInvalidArgument, "ncclAllReduce",
              "datatype");
  EXPECT_ERR2(ncclGroupEnd(), ncclInvalidArgument, "ncclGroupEnd", "datatype");
  assert_memory_equal(out, zero, sizeof(zero));
  /* The failed group is over: the next group starts clean and runs. */
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  assert_memory_equal(out, in, sizeof(in));

  /* The same with a p2p error in a nested group. */
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(in, 5, ncclFloat, 0, c, NULL));
  EXPECT_ERR2(ncclRecv(out, 5, ncclFloat, 1, c, NULL), ncclInvalidArgument, "ncclRecv", "peer");
  EXPECT_OK(ncclRecv(out, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupEnd()); /* inner: nothing runs yet */
  EXPECT_ERR2(ncclGroupEnd(), ncclInvalidArgument, "ncclGroupEnd", "peer");
  assert_memory_equal(out, zero, sizeof(zero));

  /* Nested groups run at the outermost end only. */
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  assert_memory_equal(out, zero, sizeof(zero));
  EXPECT_OK(ncclGroupEnd());
  assert_memory_equal(out, in, sizeof(in));

  /* Simulation estimates the group and runs none of it. */
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_OK(ncclBroadcast(in, out, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupSimulateEnd(&sim));
  assert_true(sim.estimatedTime >= 0.0f);
  assert_memory_equal(out, zero, sizeof(zero));
  /* ... and closes the group. */
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  /* An empty group simulates to a time too, and a NULL simInfo is allowed. */
  sim.estimatedTime = -1.0f;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclGroupSimulateEnd(&sim));
  assert_true(sim.estimatedTime >= 0.0f);
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_OK(ncclGroupSimulateEnd(NULL));
  assert_memory_equal(out, zero, sizeof(zero));

  /* A group with a failed call simulates to that error, like ncclGroupEnd. */
  sim.estimatedTime = -1.0f;
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_ERR2(ncclAllReduce(in, out, 5, ncclFloat, (ncclRedOp_t)-1, c, NULL), ncclInvalidArgument, "ncclAllReduce",
              "operator");
  EXPECT_ERR2(ncclGroupSimulateEnd(&sim), ncclInvalidArgument, "ncclGroupSimulateEnd", "operator");
  assert_true(sim.estimatedTime == -1.0f);
  assert_memory_equal(out, zero, sizeof(zero));
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");

  /* A simInfo not made with the initializer is refused. Whether the group
   * stays open is not specified; either way one ncclGroupEnd leaves the
   * thread outside any group. */
  ncclSimInfo_t bad = NCCL_SIM_INFO_INITIALIZER;
  bad.magic = 0;
  EXPECT_OK(ncclGroupStart());
  EXPECT_ERR2(ncclGroupSimulateEnd(&bad), ncclInvalidArgument, "ncclGroupSimulateEnd", "simInfo");
  ncclResult_t r = ncclGroupEnd();
  assert_true(r == ncclSuccess || r == ncclInvalidUsage);
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");

  /* The communicator works after all of it. */
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  assert_memory_equal(out, in, sizeof(in));
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- collectives: reduction operators */

static void test_collective_redops(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  float scalar = 3.0f;
  ncclRedOp_t op = ncclSum;
  float in[5] = {1, 2, 3, 4, 5};
  float out[5] = {0};

  EXPECT_ERR2(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat, ncclScalarHostImmediate, c), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "op");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat, ncclScalarHostImmediate, c), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "scalar");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)-1, ncclScalarHostImmediate, c),
              ncclInvalidArgument, "ncclRedOpCreatePreMulSum", "datatype");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, &scalar, ncclNumTypes, ncclScalarHostImmediate, c), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "datatype");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)2, c), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "residence");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, (ncclScalarResidence_t)-1, c), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "residence");
  EXPECT_ERR2(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL), ncclInvalidArgument,
              "ncclRedOpCreatePreMulSum", "comm");
  assert_int_equal(op, ncclSum); /* untouched by the failures */

  EXPECT_ERR2(ncclRedOpDestroy(ncclSum, c), ncclInvalidArgument, "ncclRedOpDestroy", "built in");
  EXPECT_ERR2(ncclRedOpDestroy(ncclAvg, c), ncclInvalidArgument, "ncclRedOpDestroy", "built in");
  EXPECT_ERR2(ncclRedOpDestroy(ncclNumOps, c), ncclInvalidArgument, "ncclRedOpDestroy", "not created");
  EXPECT_ERR2(ncclRedOpDestroy((ncclRedOp_t)(ncclNumOps + 100), c), ncclInvalidArgument, "ncclRedOpDestroy",
              "not created");
  EXPECT_ERR2(ncclRedOpDestroy(ncclMaxRedOp, c), ncclInvalidArgument, "ncclRedOpDestroy", "not created");
  EXPECT_ERR2(ncclRedOpDestroy((ncclRedOp_t)-1, c), ncclInvalidArgument, "ncclRedOpDestroy", "not created");

  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c));
  assert_true((int)op >= ncclNumOps);
  EXPECT_ERR2(ncclRedOpDestroy(op, NULL), ncclInvalidArgument, "ncclRedOpDestroy", "comm");
  /* Created for float: any other type is refused. */
  int32_t iin[5] = {1, 2, 3, 4, 5}, iout[5] = {0};
  EXPECT_ERR2(ncclAllReduce(iin, iout, 5, ncclInt32, op, c, NULL), ncclInvalidArgument, "ncclAllReduce", "datatype");
  EXPECT_ERR2(ncclReduce(iin, iout, 5, ncclInt32, op, 0, c, NULL), ncclInvalidArgument, "ncclReduce", "datatype");
  EXPECT_ERR2(ncclReduceScatter(in, out, 5, ncclDouble, op, c, NULL), ncclInvalidArgument, "ncclReduceScatter",
              "datatype");
  /* Another handle next to it that was never created is still unknown. */
  EXPECT_ERR2(ncclRedOpDestroy((ncclRedOp_t)(op + 1), c), ncclInvalidArgument, "ncclRedOpDestroy", "not created");
  EXPECT_ERR2(ncclAllReduce(in, out, 5, ncclFloat, (ncclRedOp_t)(op + 1), c, NULL), ncclInvalidArgument,
              "ncclAllReduce", "operator");
  EXPECT_OK(ncclRedOpDestroy(op, c));
  EXPECT_ERR2(ncclRedOpDestroy(op, c), ncclInvalidArgument, "ncclRedOpDestroy", "not created");
  /* A destroyed operator is gone. */
  EXPECT_ERR2(ncclAllReduce(in, out, 5, ncclFloat, op, c, NULL), ncclInvalidArgument, "ncclAllReduce", "operator");
  EXPECT_ERR2(ncclReduce(in, out, 5, ncclFloat, op, 0, c, NULL), ncclInvalidArgument, "ncclReduce", "operator");
  for (int i = 0; i < 5; i++) assert_true(out[i] == 0.0f && iout[i] == 0);

  /* An operator belongs to the comm it was made on. */
  ncclComm_t c2 = one_rank_comm();
  EXPECT_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c));
  EXPECT_ERR2(ncclRedOpDestroy(op, c2), ncclInvalidArgument, "ncclRedOpDestroy", "not created");
  EXPECT_ERR2(ncclAllReduce(in, out, 5, ncclFloat, op, c2, NULL), ncclInvalidArgument, "ncclAllReduce", "operator");
  EXPECT_OK(ncclRedOpDestroy(op, c));
  EXPECT_OK(ncclCommDestroy(c2));

  /* Many operators at once, all destroyed: the table grows and is released
   * with the comm (valgrind checks). */
  ncclRedOp_t many[40];
  for (int i = 0; i < 40; i++) EXPECT_OK(ncclRedOpCreatePreMulSum(&many[i], &scalar, ncclFloat, ncclScalarDevice, c));
  for (int i = 0; i < 40; i++)
    for (int j = 0; j < i; j++) assert_true(many[i] != many[j]);
  for (int i = 0; i < 40; i += 2) EXPECT_OK(ncclRedOpDestroy(many[i], c));
  /* Left alive on purpose: ncclCommDestroy must free them. */
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- collectives: 1-rank results */

static void expect_floats(const float* got, const float* want, int n, const char* what, int line) {
  for (int i = 0; i < n; i++)
    if (got[i] != want[i]) fail_msg("line %d: %s: element %d is %g, expected %g", line, what, i, got[i], want[i]);
}
#define EXPECT_FLOATS(got, want, n, what) expect_floats((got), (want), (n), (what), __LINE__)

static void test_collective_one_rank(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  const float in[5] = {1.5f, -2, 3, 4.25f, 5};
  float out[5], buf[5];

#define RESET() (memset(out, 0, sizeof(out)), memcpy(buf, in, sizeof(in)))
  /* Sum, avg, max, min, prod over one rank: the input itself. */
  const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax, ncclMin, ncclProd};
  for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
    RESET();
    EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ops[k], c, NULL));
    EXPECT_FLOATS(out, in, 5, "ncclAllReduce");
    EXPECT_OK(ncclAllReduce(buf, buf, 5, ncclFloat, ops[k], c, NULL));
    EXPECT_FLOATS(buf, in, 5, "ncclAllReduce in place");
    RESET();
    EXPECT_OK(ncclReduce(in, out, 5, ncclFloat, ops[k], 0, c, NULL));
    EXPECT_FLOATS(out, in, 5, "ncclReduce");
    RESET();
    EXPECT_OK(ncclReduceScatter(in, out, 5, ncclFloat, ops[k], c, NULL));
    EXPECT_FLOATS(out, in, 5, "ncclReduceScatter");
  }
  /* An integer average on one rank is the input too. */
  int32_t iin[3] = {7, -7, 100}, iout[3] = {0};
  EXPECT_OK(ncclAllReduce(iin, iout, 3, ncclInt32, ncclAvg, c, NULL));
  assert_memory_equal(iout, iin, sizeof(iin));

  RESET();
  EXPECT_OK(ncclBcast(buf, 5, ncclFloat, 0, c, NULL));
  EXPECT_FLOATS(buf, in, 5, "ncclBcast");
  EXPECT_OK(ncclBroadcast(in, out, 5, ncclFloat, 0, c, NULL));
  EXPECT_FLOATS(out, in, 5, "ncclBroadcast");
  RESET();
  EXPECT_OK(ncclAllGather(in, out, 5, ncclFloat, c, NULL));
  EXPECT_FLOATS(out, in, 5, "ncclAllGather");
  RESET();
  EXPECT_OK(ncclAllGather(buf, buf, 5, ncclFloat, c, NULL));
  EXPECT_FLOATS(buf, in, 5, "ncclAllGather in place");
  RESET();
  EXPECT_OK(ncclAlltoAll(in, out, 5, ncclFloat, c, NULL));
  EXPECT_FLOATS(out, in, 5, "ncclAlltoAll");
  RESET();
  EXPECT_OK(ncclGather(in, out, 5, ncclFloat, 0, c, NULL));
  EXPECT_FLOATS(out, in, 5, "ncclGather");
  RESET();
  EXPECT_OK(ncclScatter(in, out, 5, ncclFloat, 0, c, NULL));
  EXPECT_FLOATS(out, in, 5, "ncclScatter");

  /* Send and receive to self, paired in a group, in either order. */
  RESET();
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclSend(in, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclRecv(out, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_FLOATS(out, in, 5, "ncclSend/ncclRecv to self");
  RESET();
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclRecv(out, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclSend(in, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_FLOATS(out, in, 5, "ncclRecv/ncclSend to self");

  /* A group mixing collectives and p2p runs them all, in order. */
  RESET();
  float out2[5] = {0};
  EXPECT_OK(ncclGroupStart());
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, ncclSum, c, NULL));
  EXPECT_OK(ncclSend(out, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclRecv(out2, 5, ncclFloat, 0, c, NULL));
  EXPECT_OK(ncclGroupEnd());
  EXPECT_FLOATS(out2, in, 5, "ncclAllReduce then send/recv in a group");
#undef RESET
  EXPECT_OK(ncclCommDestroy(c));
}

static void test_collective_premulsum(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  const float in[5] = {1, 2, -3, 4.5f, 0.25f};
  float want3[5], want5[5], out[5];
  for (int i = 0; i < 5; i++) {
    want3[i] = in[i] * 3.0f;
    want5[i] = in[i] * 5.0f;
  }

  /* Host-immediate: the value is copied at creation. */
  float s = 3.0f;
  ncclRedOp_t imm;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&imm, &s, ncclFloat, ncclScalarHostImmediate, c));
  s = 7.0f;
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, imm, c, NULL));
  EXPECT_FLOATS(out, want3, 5, "premulsum (host immediate, variable changed afterwards)");
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclReduce(in, out, 5, ncclFloat, imm, 0, c, NULL));
  EXPECT_FLOATS(out, want3, 5, "ncclReduce premulsum");
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclReduceScatter(in, out, 5, ncclFloat, imm, c, NULL));
  EXPECT_FLOATS(out, want3, 5, "ncclReduceScatter premulsum");

  /* "Device" residence given a host pointer: read when the call is made. */
  float d = 3.0f;
  ncclRedOp_t dev;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&dev, &d, ncclFloat, ncclScalarDevice, c));
  assert_true(dev != imm);
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, dev, c, NULL));
  EXPECT_FLOATS(out, want3, 5, "premulsum (device residence)");
  d = 5.0f;
  memset(out, 0, sizeof(out));
  EXPECT_OK(ncclAllReduce(in, out, 5, ncclFloat, dev, c, NULL));
  EXPECT_FLOATS(out, want5, 5, "premulsum (device residence, variable changed)");
  EXPECT_OK(ncclRedOpDestroy(dev, c));
  EXPECT_OK(ncclRedOpDestroy(imm, c));

  /* Integers: scalar 3 for int32. */
  int32_t iin[4] = {1, -2, 30, 0}, iout[4] = {0}, iwant[4] = {3, -6, 90, 0};
  int32_t is = 3;
  ncclRedOp_t iop;
  EXPECT_OK(ncclRedOpCreatePreMulSum(&iop, &is, ncclInt32, ncclScalarHostImmediate, c));
  EXPECT_OK(ncclAllReduce(iin, iout, 4, ncclInt32, iop, c, NULL));
  assert_memory_equal(iout, iwant, sizeof(iwant));
  EXPECT_OK(ncclRedOpDestroy(iop, c));
  EXPECT_OK(ncclCommDestroy(c));
}

/* --------------------------------------------------------------- collie_comm_init_from_env */

static void clear_launcher_env(void) {
  static const char* vars[] = {"COLLIE_RANK",  "COLLIE_SIZE",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                               "PMI_RANK",     "PMI_SIZE",     "SLURM_PROCID",         "SLURM_NTASKS",
                               "RANK",         "WORLD_SIZE",   "NCCL_COMM_ID",         "MASTER_ADDR",
                               "MASTER_PORT"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) assert_int_equal(unsetenv(vars[i]), 0);
}

static int clear_env_fixture(void** state) {
  (void)state;
  clear_launcher_env();
  return 0;
}

static void test_init_from_env(void** state) {
  (void)state;
  ncclComm_t c = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(collie_comm_init_from_env(NULL), ncclInvalidArgument, "collie_comm_init_from_env");

  clear_launcher_env();
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "launcher");
  assert_null(c);

  /* A launcher found, but no root address. */
  setenv("COLLIE_RANK", "0", 1);
  setenv("COLLIE_SIZE", "1", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "NCCL_COMM_ID");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "MASTER_PORT");
  setenv("MASTER_PORT", "65535", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "MASTER_PORT");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");

  /* A root address that does not parse. */
  setenv("NCCL_COMM_ID", "nonsense", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidArgument, "NCCL_COMM_ID");
  unsetenv("NCCL_COMM_ID");
  assert_null(c);

  /* Rank and size that do not fit together, or do not parse. */
  setenv("COLLIE_RANK", "5", 1);
  setenv("COLLIE_SIZE", "2", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "rank 5 of 2");
  setenv("COLLIE_RANK", "-1", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "collie-run");
  setenv("COLLIE_RANK", "0", 1);
  setenv("COLLIE_SIZE", "0", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "collie-run");
  setenv("COLLIE_SIZE", "two", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "COLLIE_SIZE");
  unsetenv("COLLIE_SIZE");
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "COLLIE_SIZE");
  clear_launcher_env();

  /* The other launchers are recognised by name. */
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "Open MPI");
  clear_launcher_env();
  setenv("SLURM_PROCID", "0", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "SLURM_NTASKS");
  clear_launcher_env();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  EXPECT_ERR(collie_comm_init_from_env(&c), ncclInvalidUsage, "torchrun");
  clear_launcher_env();
  assert_null(c);
}

int main(void) {
  /* Keep WARN lines for the expected errors out of the test log unless asked. */
  setenv("NCCL_DEBUG", "NONE", 0);
  /* A root address from the caller's environment would change what
   * ncclGetUniqueId does; these tests want self-made IDs. */
  unsetenv("NCCL_COMM_ID");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_version),
      cmocka_unit_test(test_bad_tuning_env),
      cmocka_unit_test(test_get_unique_id),
      cmocka_unit_test(test_comm_id_garbage),
      cmocka_unit_test(test_init_rank_args),
      cmocka_unit_test(test_init_rank_config),
      cmocka_unit_test(test_init_rank_scalable),
      cmocka_unit_test(test_init_all_args),
      cmocka_unit_test(test_null_comm_queries),
      cmocka_unit_test(test_null_out_pointers),
      cmocka_unit_test(test_finalize_twice),
      cmocka_unit_test(test_peer_info),
      cmocka_unit_test(test_error_strings),
      cmocka_unit_test(test_stubs),
      cmocka_unit_test(test_collective_args),
      cmocka_unit_test(test_collective_groups),
      cmocka_unit_test(test_init_in_group),
      cmocka_unit_test(test_collective_redops),
      cmocka_unit_test(test_collective_one_rank),
      cmocka_unit_test(test_collective_premulsum),
      cmocka_unit_test_teardown(test_init_from_env, clear_env_fixture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
