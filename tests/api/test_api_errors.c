/* Argument and usage errors of the public API, seen the way an application
 * sees them: only nccl.h and collie.h, linked against the shared libcollie.
 * Every failing call must return the documented code and leave a message in
 * ncclGetLastError that names the culprit. Single process, 1-rank comms. */
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

/* A live 1-rank communicator; each one needs an ID of its own. */
static ncclComm_t one_rank_comm(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  EXPECT_OK(ncclGetUniqueId(&id));
  EXPECT_OK(ncclCommInitRank(&c, 1, id, 0));
  assert_non_null(c);
  return c;
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

static void test_stubs(void** state) {
  (void)state;
  ncclComm_t c = one_rank_comm();
  float buf[4] = {0};
  void* p = NULL;
  void* handle = NULL;
  ncclWindow_t win = NULL;
  ncclRedOp_t op = ncclSum;
  float scalar = 2.0f;
  ncclComm_t nc = (ncclComm_t)(uintptr_t)0x1;
  int exclude[1] = {0};
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;

  EXPECT_ERR(ncclMemAlloc(&p, 64), ncclInvalidUsage, "ncclMemAlloc");
  EXPECT_ERR(ncclMemFree(buf), ncclInvalidUsage, "ncclMemFree");
  EXPECT_ERR(ncclCommRegister(c, buf, sizeof(buf), &handle), ncclInvalidUsage, "ncclCommRegister");
  EXPECT_ERR(ncclCommDeregister(c, handle), ncclInvalidUsage, "ncclCommDeregister");
  EXPECT_ERR(ncclCommWindowRegister(c, buf, sizeof(buf), &win, 0), ncclInvalidUsage, "ncclCommWindowRegister");
  EXPECT_ERR(ncclCommWindowDeregister(c, win), ncclInvalidUsage, "ncclCommWindowDeregister");
  EXPECT_ERR(ncclCommRevoke(c, 0), ncclInvalidUsage, "ncclCommRevoke");
  EXPECT_ERR(ncclCommSplit(c, 0, 0, &nc, NULL), ncclInvalidUsage, "ncclCommSplit");
  assert_null(nc);
  nc = (ncclComm_t)(uintptr_t)0x1;
  EXPECT_ERR(ncclCommShrink(c, exclude, 1, &nc, NULL, 0), ncclInvalidUsage, "ncclCommShrink");
  assert_null(nc);
  EXPECT_ERR(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c), ncclInvalidUsage,
             "ncclRedOpCreatePreMulSum");
  EXPECT_ERR(ncclRedOpDestroy(ncclNumOps, c), ncclInvalidUsage, "ncclRedOpDestroy");
  EXPECT_ERR(ncclReduce(buf, buf, 4, ncclFloat, ncclSum, 0, c, NULL), ncclInvalidUsage, "ncclReduce");
  EXPECT_ERR(ncclBcast(buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclBcast");
  EXPECT_ERR(ncclBroadcast(buf, buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclBroadcast");
  EXPECT_ERR(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, c, NULL), ncclInvalidUsage, "ncclAllReduce");
  EXPECT_ERR(ncclReduceScatter(buf, buf, 4, ncclFloat, ncclSum, c, NULL), ncclInvalidUsage, "ncclReduceScatter");
  EXPECT_ERR(ncclAllGather(buf, buf, 4, ncclFloat, c, NULL), ncclInvalidUsage, "ncclAllGather");
  EXPECT_ERR(ncclAlltoAll(buf, buf, 4, ncclFloat, c, NULL), ncclInvalidUsage, "ncclAlltoAll");
  EXPECT_ERR(ncclGather(buf, buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclGather");
  EXPECT_ERR(ncclScatter(buf, buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclScatter");
  EXPECT_ERR(ncclSend(buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclSend");
  EXPECT_ERR(ncclRecv(buf, 4, ncclFloat, 0, c, NULL), ncclInvalidUsage, "ncclRecv");
  EXPECT_ERR(ncclGroupStart(), ncclInvalidUsage, "ncclGroupStart");
  EXPECT_ERR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupEnd");
  EXPECT_ERR(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "ncclGroupSimulateEnd");
  /* The profiling twins reach the same code. */
  EXPECT_ERR(pncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, c, NULL), ncclInvalidUsage, "ncclAllReduce");
  EXPECT_ERR(pncclCommCount(NULL, NULL), ncclInvalidArgument, "ncclCommCount");

  /* The communicator is still usable after all that. */
  int n = 0;
  EXPECT_OK(ncclCommCount(c, &n));
  assert_int_equal(n, 1);
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
      cmocka_unit_test_teardown(test_init_from_env, clear_env_fixture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
