/*
 * collie: the NCCL 2.28 C API.
 *
 * This header is collie's own, written from scratch, and is a drop-in for the
 * nccl.h that ships with NCCL 2.28.9: the same functions with the same
 * signatures, the same type layouts, enumerator values and macro values, so a
 * program built against either header runs against libcollie.so (or its
 * libnccl.so.2 name) unchanged. tests/abi/ checks that claim against the
 * vendor header. collie-only extensions live in collie.h, never here.
 *
 * Unlike the vendor header it compiles on machines without a CUDA toolkit;
 * see "CUDA stream type" below.
 */

/* The same include guard as the vendor header on purpose: whichever of the
 * two a translation unit reaches first wins, and the other is skipped rather
 * than redefining every type. */
#ifndef NCCL_H_
#define NCCL_H_

/* Lets tools and tests tell this header apart from the vendor's. */
#define COLLIE_NCCL_H 1

/* ------------------------------------------------------------------------- */
/* CUDA stream type                                                          */
/* ------------------------------------------------------------------------- */

/*
 * Collective and point-to-point calls take a cudaStream_t. When the CUDA
 * runtime header is reachable it is included, as the vendor header does, so
 * CUDA programs see exactly the declarations they expect. Otherwise the
 * stream type is declared here as a pointer to the same incomplete struct the
 * CUDA runtime uses, which makes the two spellings one type in C and C++ and
 * leaves the ABI untouched.
 *
 * Define COLLIE_NO_CUDA before including this header to skip the CUDA
 * runtime header even when it is present; collie's own C sources are built
 * that way, so only src/device sees CUDA headers.
 *
 * The vendor header also pulls in cuda_fp16.h, cuda_bf16.h and, for C++,
 * cuda_fp8.h. No declaration below needs them, so this header leaves them
 * out: code that uses __half or __nv_bfloat16 should include those headers
 * itself.
 */
#if !defined(COLLIE_NO_CUDA) && defined(__has_include)
#  if __has_include(<cuda_runtime.h>)
#    include <cuda_runtime.h>
#  endif
#endif

#if !defined(CUDART_VERSION)
typedef struct CUstream_st* cudaStream_t;
#endif

#include <limits.h> /* INT_MIN */
#include <stddef.h> /* size_t, NULL */

/* ------------------------------------------------------------------------- */
/* Version                                                                   */
/* ------------------------------------------------------------------------- */

/* The NCCL release whose API and ABI this header reproduces. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

/*
 * NCCL_VERSION(major, minor, patch) builds the integer that ncclGetVersion
 * reports and that NCCL_VERSION_CODE holds. Releases up to 2.8 used one
 * decimal digit for the minor number (2.8.4 -> 2804); later ones use two
 * (2.28.9 -> 22809). Both encodings are kept so version comparisons written
 * against old releases still work.
 */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#define NCCL_VERSION_CODE 22809

#ifdef __cplusplus
extern "C" {
#endif

/* Marks entry points kept only for source compatibility. */
#if defined(__GNUC__) || defined(__clang__)
#  define COLLIE_NCCL_DEPRECATED_(msg) __attribute__((deprecated(msg)))
#else
#  define COLLIE_NCCL_DEPRECATED_(msg)
#endif

/* ------------------------------------------------------------------------- */
/* Handles and identifiers                                                   */
/* ------------------------------------------------------------------------- */

/* A communicator: one rank's membership in a group of ranks. Opaque. */
typedef struct ncclComm* ncclComm_t;

/* A registered memory window (see ncclCommWindowRegister). Opaque. */
typedef struct ncclWindow_vidmem* ncclWindow_t;

/* The value of a communicator handle that refers to no communicator. */
#define NCCL_COMM_NULL NULL

/*
 * The rendezvous token that ranks share to build one communicator. It is
 * produced by ncclGetUniqueId on one process and copied, as plain bytes, to
 * every other rank by whatever means the application has (MPI_Bcast, a file,
 * a socket, fork). Its content is private to the library.
 */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ------------------------------------------------------------------------- */
/* Result codes                                                              */
/* ------------------------------------------------------------------------- */

/*
 * Every entry point returns one of these, except the two string getters and
 * the deprecated ncclResetDebugInit.
 * ncclGetErrorString names a code; ncclGetLastError gives the message that
 * describes the most recent failure.
 */
typedef enum {
  ncclSuccess = 0,            /* the call did what it was asked */
  ncclUnhandledCudaError = 1, /* a CUDA runtime or driver call failed */
  ncclSystemError = 2,        /* a system call or a system resource failed */
  ncclInternalError = 3,      /* the library reached a state it should not */
  ncclInvalidArgument = 4,    /* an argument is out of range or NULL */
  ncclInvalidUsage = 5,       /* the call is not allowed now, or not supported */
  ncclRemoteError = 6,        /* a peer rank or the network to it failed */
  ncclInProgress = 7,         /* nonblocking: started, not finished yet */
  ncclNumResults = 8          /* count of the codes above */
} ncclResult_t;

/* ------------------------------------------------------------------------- */
/* Constants                                                                 */
/* ------------------------------------------------------------------------- */

/* "Not set" markers for ncclConfig_t fields: the library picks the value. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

/* "Not set" marker for float outputs such as ncclSimInfo_t.estimatedTime. */
#define NCCL_UNDEF_FLOAT -1.0f

/* Color for ncclCommSplit: the caller joins no new communicator. */
#define NCCL_SPLIT_NOCOLOR -1

/* winFlags for ncclCommWindowRegister. */
#define NCCL_WIN_DEFAULT 0x00        /* an ordinary window */
#define NCCL_WIN_COLL_SYMMETRIC 0x01 /* every rank registers a same-size buffer */

/* Alignment, in bytes, expected of buffers registered as windows. */
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* Values for ncclConfig_t.CTAPolicy. */
#define NCCL_CTA_POLICY_DEFAULT 0x00    /* let the library choose */
#define NCCL_CTA_POLICY_EFFICIENCY 0x01 /* favour fewer resources over peak speed */
#define NCCL_CTA_POLICY_ZERO 0x02       /* no GPU blocks where the operation allows */

/* shrinkFlags for ncclCommShrink. */
#define NCCL_SHRINK_DEFAULT 0x00 /* the parent is healthy; shrink it as is */
#define NCCL_SHRINK_ABORT 0x01   /* abort the parent's pending work, then shrink */

/* revokeFlags for ncclCommRevoke. No flag is defined yet; pass this. */
#define NCCL_REVOKE_DEFAULT 0x00

/* ------------------------------------------------------------------------- */
/* Communicator configuration                                                */
/* ------------------------------------------------------------------------- */

/*
 * Options for ncclCommInitRankConfig, ncclCommInitRankScalable,
 * ncclCommSplit and ncclCommShrink.
 *
 * The struct grows with new releases. The first three fields say which
 * release's layout the caller compiled against, so the library reads only
 * the fields that caller knows about. They must come from
 * NCCL_CONFIG_INITIALIZER; a struct that was not initialised with it is
 * rejected with ncclInvalidArgument. After initialisation, set only the
 * fields you care about; every other field stays "not set" and the library
 * (or the matching NCCL_* environment variable) decides.
 *
 * Field order and types are part of the ABI: do not reorder.
 */
typedef struct ncclConfig_v22800 {
  /* Set by NCCL_CONFIG_INITIALIZER; not to be changed by the caller. */
  size_t size;          /* sizeof(ncclConfig_t) as the caller compiled it */
  unsigned int magic;   /* constant that marks an initialised struct */
  unsigned int version; /* NCCL_VERSION_CODE the caller compiled against */

  /* Caller-settable options. */
  int blocking;            /* 1: calls wait for completion; 0: they may return
                              ncclInProgress (poll ncclCommGetAsyncError) */
  int cgaClusterSize;      /* GPU thread-block cluster size for kernels */
  int minCTAs;             /* lower bound on GPU blocks per collective */
  int maxCTAs;             /* upper bound on GPU blocks per collective */
  const char* netName;     /* network transport to use, by name */
  int splitShare;          /* 1: children of ncclCommSplit share resources */
  int trafficClass;        /* network traffic class / QoS value */
  const char* commName;    /* label used in logs */
  int collnetEnable;       /* 1: allow in-network reduction (CollNet) */
  int CTAPolicy;           /* one of NCCL_CTA_POLICY_* */
  int shrinkShare;         /* 1: children of ncclCommShrink share resources */
  int nvlsCTAs;            /* GPU blocks for NVLink SHARP algorithms */
  int nChannelsPerNetPeer; /* channels used per remote network peer */
  int nvlinkCentricSched;  /* 1: schedule with NVLink topology first */
} ncclConfig_t;

/*
 * The only correct way to create an ncclConfig_t:
 *     ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
 * Values, in field order: the struct size, the magic 0xcafebeef, the version
 * code of this header, then "not set" for every option.
 */
#define NCCL_CONFIG_INITIALIZER                                                \
  {                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef,                                          \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                          \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,       \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,       \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,       \
    NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                              \
  }

/* ------------------------------------------------------------------------- */
/* Group simulation result                                                   */
/* ------------------------------------------------------------------------- */

/*
 * Filled by ncclGroupSimulateEnd. Versioned like ncclConfig_t: create it with
 * NCCL_SIM_INFO_INITIALIZER, or the call fails with ncclInvalidArgument.
 */
typedef struct ncclSimInfo_v22200 {
  size_t size;          /* sizeof(ncclSimInfo_t) as the caller compiled it */
  unsigned int magic;   /* constant that marks an initialised struct */
  unsigned int version; /* NCCL_VERSION_CODE the caller compiled against */
  float estimatedTime;  /* [out] predicted time of the group, microseconds */
} ncclSimInfo_t;

/* Values, in field order: the size, the magic 0x74685283, the version code,
 * and NCCL_UNDEF_FLOAT for the estimate. */
#define NCCL_SIM_INFO_INITIALIZER                                              \
  {                                                                            \
    sizeof(ncclSimInfo_t), 0x74685283,                                         \
    NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT         \
  }

/* ------------------------------------------------------------------------- */
/* Reduction operators, data types                                           */
/* ------------------------------------------------------------------------- */

/*
 * ncclRedOp_t holds the built-in operators below plus handles created at run
 * time by ncclRedOpCreatePreMulSum, which take values from ncclNumOps up to
 * ncclMaxRedOp. ncclMaxRedOp is the largest value an enum of this
 * compiler's enum width can hold as a signed number (0x7fffffff for the usual
 * 4-byte enum). The helper enum below exists only so that width can be
 * measured inside the ncclRedOp_t definition; it has no other use.
 */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;

typedef enum {
  ncclSum = 0,    /* x + y */
  ncclProd = 1,   /* x * y */
  ncclMax = 2,    /* larger of x, y */
  ncclMin = 3,    /* smaller of x, y */
  ncclAvg = 4,    /* sum divided by the number of ranks */
  ncclNumOps = 5, /* count of built-in operators; first run-time handle */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* Element types. Several names share a value; they are aliases. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, /* IEEE binary16 */
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,    /* bfloat16: float32 with a 7-bit mantissa */
  ncclFloat8e4m3 = 10, /* 8-bit float, 4 exponent / 3 mantissa bits */
  ncclFloat8e5m2 = 11, /* 8-bit float, 5 exponent / 2 mantissa bits */
  ncclNumTypes = 12    /* count of distinct types */
} ncclDataType_t;

/* Where the scalar given to ncclRedOpCreatePreMulSum lives, which decides
 * when it is read. */
typedef enum {
  ncclScalarDevice = 0,       /* device-visible memory, read by each collective
                                 that uses the operator, while it runs */
  ncclScalarHostImmediate = 1 /* host memory, read once before the creating
                                 call returns */
} ncclScalarResidence_t;

/* ========================================================================= */
/* Entry points                                                              */
/* ========================================================================= */

/*
 * Conventions for everything below.
 *
 * Profiling names. Each entry point nccl<Name> has a twin pnccl<Name> with
 * the same signature. The nccl* symbol is weak, so a profiling or tracing
 * library may define its own and forward to pnccl*, which always reaches
 * collie.
 *
 * Errors. On failure the call returns a code other than ncclSuccess and
 * records a message that ncclGetLastError returns. Codes that any call may
 * return and that the per-function lists below do not repeat:
 *   ncclSystemError    - memory, a socket, a thread or shared memory could
 *                        not be obtained;
 *   ncclInternalError  - a bug in collie;
 *   ncclUnhandledCudaError - a CUDA call made on the caller's behalf failed
 *                        (only on calls that touch device memory or streams).
 * A communicator that has seen an asynchronous error (see
 * ncclCommGetAsyncError) makes later calls on it fail with that error.
 *
 * Nonblocking communicators. If a communicator was created with
 * config.blocking = 0, calls on it may return ncclInProgress: the work was
 * accepted and continues in the background. Poll ncclCommGetAsyncError until
 * it reports something other than ncclInProgress before the next call on
 * that communicator.
 *
 * Threads. A communicator is not thread-safe: calls on one communicator must
 * not overlap. Different communicators may be used from different threads at
 * the same time. Group state (ncclGroupStart/End) belongs to the calling
 * thread. Exceptions are stated per function.
 */

/* ------------------------------------------------------------------------- */
/* Library information and errors                                            */
/* ------------------------------------------------------------------------- */

/**
 * @brief Report the version of the library that is running.
 *
 * The value has the NCCL_VERSION(major, minor, patch) encoding, so it can be
 * compared with NCCL_VERSION_CODE to detect a header/library mismatch.
 * collie reports the NCCL release whose API it implements (22809).
 *
 * @param [out] version  Receives the version code.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if version is NULL.
 *
 * @remark Thread-safe. Needs no communicator and no prior initialisation.
 */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/**
 * @brief Name a result code.
 *
 * @param [in] result  Any value; codes outside ncclResult_t get a generic
 *                     "unknown" string.
 *
 * @return A static, NUL-terminated string describing result. Never NULL.
 *
 * @remark Thread-safe.
 */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/**
 * @brief Describe the most recent failure in words.
 *
 * The text names the call and the reason ("ncclSend: peer 7 out of range
 * for a communicator of 4 ranks"), which the result code alone cannot do.
 *
 * Messages are kept per thread, not per communicator: the result is the
 * calling thread's latest failure, or the process's latest when this thread
 * has seen none (for example a watchdog thread asking about a failure in a
 * worker thread).
 *
 * @param [in] comm  The communicator of the failing call, or NULL; accepted
 *                   for compatibility, it does not select the message.
 *
 * @return A NUL-terminated string, empty if nothing has failed. Never NULL.
 *         The storage belongs to the library; it stays valid on the calling
 *         thread until that thread's next call into the library.
 *
 * @remark Thread-safe.
 */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/**
 * @brief Re-read the logging environment variables (NCCL_DEBUG,
 *        NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE).
 *
 * Deprecated: it was never meant to be part of the public API and NCCL
 * plans to drop it. Kept so existing programs still link.
 *
 * @remark Not thread-safe with respect to concurrent logging.
 */
COLLIE_NCCL_DEPRECATED_("ncclResetDebugInit is deprecated and not part of the supported NCCL API")
void ncclResetDebugInit(void);
COLLIE_NCCL_DEPRECATED_("pncclResetDebugInit is deprecated and not part of the supported NCCL API")
void pncclResetDebugInit(void);

/* ------------------------------------------------------------------------- */
/* Communicator creation                                                     */
/* ------------------------------------------------------------------------- */

/**
 * @brief Create the rendezvous token for one new communicator.
 *
 * Call it once, on one process, per communicator to be built, and give the
 * resulting bytes to every rank before they call ncclCommInitRank (or a
 * sibling). The call may start a listener in the calling process that the
 * other ranks contact during initialisation; that process must stay alive
 * until they have done so. With NCCL_COMM_ID=host:port set, the listener
 * address is taken from the environment instead.
 *
 * A token builds one communicator: use a fresh one for each.
 *
 * @param [out] uniqueId  Receives the token.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if uniqueId is NULL or NCCL_COMM_ID is
 *                              malformed;
 *         ncclSystemError      if no network interface or listening socket
 *                              could be set up.
 *
 * @remark Thread-safe.
 */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/**
 * @brief Join a new communicator as one of its ranks.
 *
 * Collective over the nranks participants: each calls it with the same
 * nranks and commId and a distinct rank, from its own process or thread (or
 * inside one ncclGroupStart/ncclGroupEnd section when one thread initialises
 * several ranks). It returns once every rank has arrived and the connections
 * are ready. The communicator is bound to the CUDA device that is current on
 * the calling thread, if there is one.
 *
 * Equivalent to ncclCommInitRankConfig with a NULL config.
 *
 * @param [out] comm    Receives the new communicator handle.
 * @param [in]  nranks  Number of ranks in the communicator, >= 1.
 * @param [in]  commId  Token from ncclGetUniqueId, identical on all ranks.
 * @param [in]  rank    This caller's rank, in [0, nranks).
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm is NULL, nranks < 1, rank out of
 *                              range, or commId is not a valid token;
 *         ncclInvalidUsage     if two callers claim the same rank;
 *         ncclRemoteError      if a peer failed or could not be reached
 *                              before the bootstrap timeout.
 *
 * @remark Thread-safe with respect to other initialisations; each caller
 *         gets its own handle.
 */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/**
 * @brief Join a new communicator, with options.
 *
 * As ncclCommInitRank, with the options in config. With config->blocking set
 * to 0 the call may return ncclInProgress while initialisation continues in
 * the background; the handle is written at once and its state is read with
 * ncclCommGetAsyncError.
 *
 * @param [out] comm    Receives the new communicator handle.
 * @param [in]  nranks  Number of ranks in the communicator, >= 1.
 * @param [in]  commId  Token from ncclGetUniqueId, identical on all ranks.
 * @param [in]  rank    This caller's rank, in [0, nranks).
 * @param [in]  config  Options created with NCCL_CONFIG_INITIALIZER, or NULL
 *                      for defaults. Not kept after the call returns.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       nonblocking: initialisation is under way;
 *         ncclInvalidArgument  as ncclCommInitRank, or if config was not
 *                              made with NCCL_CONFIG_INITIALIZER or holds
 *                              an out-of-range option;
 *         ncclInvalidUsage     if two callers claim the same rank;
 *         ncclRemoteError      if a peer failed or could not be reached.
 *
 * @remark As ncclCommInitRank.
 */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/**
 * @brief Join a new communicator, spreading the rendezvous over several
 *        tokens.
 *
 * As ncclCommInitRankConfig, but ranks rendezvous through nId tokens instead
 * of one, which shortens initialisation at large scale. Each token comes
 * from its own ncclGetUniqueId call (typically on different processes); all
 * ranks pass the same tokens in the same order.
 *
 * @param [out] newcomm  Receives the new communicator handle.
 * @param [in]  nranks   Number of ranks in the communicator, >= 1.
 * @param [in]  myrank   This caller's rank, in [0, nranks).
 * @param [in]  nId      Number of tokens in commIds, in [1, nranks].
 * @param [in]  commIds  Array of nId tokens, identical on all ranks.
 * @param [in]  config   Options created with NCCL_CONFIG_INITIALIZER, or
 *                       NULL for defaults.
 *
 * @return As ncclCommInitRankConfig; also ncclInvalidArgument if commIds is
 *         NULL or nId is out of range.
 *
 * @remark As ncclCommInitRank.
 */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/**
 * @brief Create a whole communicator inside one process, one rank per
 *        device.
 *
 * No token is needed. Rank i is bound to devlist[i], or to device i when
 * devlist is NULL; the order of devlist is the rank order.
 *
 * @param [out] comm     Array of at least ndev handles; receives rank i's
 *                       handle in comm[i].
 * @param [in]  ndev     Number of ranks to create, >= 1.
 * @param [in]  devlist  ndev device numbers, or NULL for 0 .. ndev-1.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm is NULL, ndev < 1, or a device number
 *                              is invalid;
 *         ncclUnhandledCudaError if a device could not be used.
 *
 * @remark Thread-safe with respect to other initialisations.
 */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/**
 * @brief Build new communicators from subsets of an existing one.
 *
 * Collective over all ranks of comm. Ranks passing the same color form one
 * new communicator, ordered by key (ties broken by their rank in comm).
 * Ranks passing NCCL_SPLIT_NOCOLOR join none and receive NULL.
 *
 * @param [in]  comm     The parent communicator; unchanged by the call.
 * @param [in]  color    Non-negative group selector, or NCCL_SPLIT_NOCOLOR.
 * @param [in]  key      Ordering key within the new communicator.
 * @param [out] newcomm  Receives the new handle, or NULL for
 *                       NCCL_SPLIT_NOCOLOR.
 * @param [in]  config   Options for the new communicator, created with
 *                       NCCL_CONFIG_INITIALIZER; NULL inherits comm's.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       nonblocking: the split is under way;
 *         ncclInvalidArgument  if comm or newcomm is NULL, color is negative
 *                              and not NCCL_SPLIT_NOCOLOR, or config is
 *                              invalid;
 *         ncclInvalidUsage     if comm was finalized or revoked;
 *         ncclRemoteError      if a rank of comm failed during the split.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);

/**
 * @brief Build a communicator from an existing one minus some ranks.
 *
 * Collective over the ranks of comm that are not excluded; the excluded
 * ranks do not call it (typically they have failed). Surviving ranks keep
 * their relative order and are renumbered from 0 without gaps. This is the
 * recovery path after a rank failure: pass NCCL_SHRINK_ABORT so the parent's
 * unfinished work is cancelled first.
 *
 * @param [in]  comm               The parent communicator.
 * @param [in]  excludeRanksList   Ranks of comm to leave out; all callers
 *                                 pass the same set.
 * @param [in]  excludeRanksCount  Number of entries in excludeRanksList.
 * @param [out] newcomm            Receives the new handle.
 * @param [in]  config             Options for the new communicator, or NULL
 *                                 to inherit comm's.
 * @param [in]  shrinkFlags        NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       nonblocking: the shrink is under way;
 *         ncclInvalidArgument  if comm or newcomm is NULL, the list is NULL
 *                              with a positive count, holds an out-of-range
 *                              or repeated rank, excludes every rank, or
 *                              shrinkFlags is unknown;
 *         ncclInvalidUsage     if the caller is itself in the list;
 *         ncclRemoteError      if another rank failed during the shrink.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/* ------------------------------------------------------------------------- */
/* Communicator teardown                                                     */
/* ------------------------------------------------------------------------- */

/**
 * @brief Complete all work on a communicator and release its shared
 *        resources, in cooperation with the other ranks.
 *
 * Collective over the ranks of comm. After it, the only valid call on comm
 * is ncclCommDestroy (plus the query calls), which then releases the rest
 * locally without waiting on peers. On a nonblocking communicator it may
 * return ncclInProgress; ncclCommGetAsyncError reports ncclSuccess once the
 * communicator is quiescent.
 *
 * @param [in] comm  The communicator.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       nonblocking: finalisation is under way;
 *         ncclInvalidArgument  if comm is NULL;
 *         ncclInvalidUsage     if comm is already finalized or revoked;
 *         ncclRemoteError      if a peer failed while work was flushed.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/**
 * @brief Release a communicator.
 *
 * If comm was finalized this only frees local memory. If not, outstanding
 * work is completed first, as ncclCommFinalize would. The handle is invalid
 * afterwards. Use ncclCommAbort instead when peers may have failed.
 *
 * @param [in] comm  The communicator; NULL is accepted and ignored.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidUsage     if called inside a group section that still
 *                              holds work for comm;
 *         ncclRemoteError      if pending work could not complete because a
 *                              peer failed (resources are freed anyway).
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/**
 * @brief Cancel everything on a communicator and release it, without
 *        waiting for the other ranks.
 *
 * Stops in-flight operations (host and device), closes connections and
 * frees all resources. Returns promptly even if peers are dead or hung. The
 * handle is invalid afterwards. Buffers of cancelled operations hold
 * undefined data.
 *
 * @param [in] comm  The communicator; NULL is accepted and ignored.
 *
 * @return ncclSuccess  on success (failure to reach peers is not an error
 *                      here).
 *
 * @remark May be called from another thread while a call on comm is blocked
 *         (that is its purpose); that blocked call then returns an error.
 *         Not safe against a concurrent ncclCommDestroy/ncclCommAbort on the
 *         same comm.
 */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/**
 * @brief Stop all in-flight work on a communicator but keep it for
 *        management calls.
 *
 * After a revoke, comm can be destroyed, split or shrunk safely; no new
 * communication may be posted on it and ncclCommFinalize is no longer
 * allowed. Resource sharing with children (splitShare, shrinkShare) is off
 * while revoked. The state reads ncclInProgress until comm is quiescent,
 * then ncclSuccess.
 *
 * @param [in] comm         The communicator.
 * @param [in] revokeFlags  Must be NCCL_REVOKE_DEFAULT.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       quiescence not yet reached;
 *         ncclInvalidArgument  if comm is NULL or revokeFlags is not 0;
 *         ncclInvalidUsage     if comm is already revoked or finalized.
 *
 * @remark May be called from another thread while a call on comm is blocked.
 */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* ------------------------------------------------------------------------- */
/* Communicator queries                                                      */
/* ------------------------------------------------------------------------- */

/**
 * @brief Read a communicator's state: ncclSuccess, ncclInProgress while
 *        nonblocking work is under way, or the error that broke it.
 *
 * This is how nonblocking calls are completed and how failures detected in
 * the background (a dead peer, a network error) are learned. Once it reports
 * an error the communicator cannot be used for communication any more; abort
 * it.
 *
 * @param [in]  comm        The communicator.
 * @param [out] asyncError  Receives the state.
 *
 * @return ncclSuccess          if the state was read (the state itself is in
 *                              *asyncError);
 *         ncclInvalidArgument  if comm or asyncError is NULL.
 *
 * @remark Thread-safe: may be polled from any thread, also while another
 *         thread is inside a call on comm.
 */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/**
 * @brief Number of ranks in a communicator.
 *
 * @param [in]  comm   The communicator.
 * @param [out] count  Receives the number of ranks.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm or count is NULL.
 *
 * @remark Thread-safe.
 */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/**
 * @brief CUDA device a communicator is bound to.
 *
 * @param [in]  comm    The communicator.
 * @param [out] device  Receives the CUDA device number; -1 for a
 *                      communicator that has no device (collie on a host
 *                      without a usable GPU).
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm or device is NULL.
 *
 * @remark Thread-safe.
 */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

/**
 * @brief The caller's rank in a communicator.
 *
 * @param [in]  comm  The communicator.
 * @param [out] rank  Receives the rank, in [0, count).
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm or rank is NULL.
 *
 * @remark Thread-safe.
 */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/* ------------------------------------------------------------------------- */
/* Memory: allocation, registration, windows                                 */
/* ------------------------------------------------------------------------- */

/**
 * @brief Allocate device memory suited to every transport and to buffer
 *        registration.
 *
 * The allocation may be rounded up to the device's granularity. Release it
 * with ncclMemFree, never with cudaFree.
 *
 * @param [out] ptr   Receives the address.
 * @param [in]  size  Bytes wanted, > 0.
 *
 * @return ncclSuccess            on success;
 *         ncclInvalidArgument    if ptr is NULL or size is 0;
 *         ncclUnhandledCudaError if the device could not provide it.
 *
 * @remark Thread-safe.
 */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);

/**
 * @brief Free memory from ncclMemAlloc.
 *
 * @param [in] ptr  Address returned by ncclMemAlloc; NULL is ignored.
 *
 * @return ncclSuccess            on success;
 *         ncclInvalidArgument    if ptr did not come from ncclMemAlloc;
 *         ncclUnhandledCudaError if the device refused the release.
 *
 * @remark Thread-safe, but ptr must no longer be in use by any operation.
 */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/**
 * @brief Register a buffer with a communicator so operations on it can
 *        avoid intermediate copies.
 *
 * Local: no other rank takes part. Registration is an optimisation only;
 * operations on unregistered buffers work too.
 *
 * @param [in]  comm    The communicator.
 * @param [in]  buff    Start of the buffer.
 * @param [in]  size    Length in bytes.
 * @param [out] handle  Receives the registration, for ncclCommDeregister.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm, buff or handle is NULL or size is 0.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);

/**
 * @brief Undo ncclCommRegister.
 *
 * @param [in] comm    The communicator the buffer was registered with.
 * @param [in] handle  The registration.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm is NULL or handle is unknown to comm.
 *
 * @remark Not thread-safe on comm. No pending operation may use the buffer.
 */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/**
 * @brief Register a buffer as a window that the other ranks may address
 *        directly.
 *
 * Collective over the ranks of comm. With NCCL_WIN_COLL_SYMMETRIC every rank
 * registers a buffer of the same size (memory from ncclMemAlloc, aligned to
 * NCCL_WIN_REQUIRED_ALIGNMENT), which lets collectives on those buffers use
 * algorithms that read and write peers' memory directly.
 *
 * @param [in]  comm      The communicator.
 * @param [in]  buff      Start of the local buffer.
 * @param [in]  size      Length in bytes.
 * @param [out] win       Receives the window handle.
 * @param [in]  winFlags  NCCL_WIN_DEFAULT or NCCL_WIN_COLL_SYMMETRIC.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       nonblocking: registration is under way;
 *         ncclInvalidArgument  if comm, buff or win is NULL, size is 0,
 *                              winFlags is unknown, or a symmetric buffer is
 *                              misaligned;
 *         ncclRemoteError      if a peer failed during the exchange.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int winFlags);

/**
 * @brief Undo ncclCommWindowRegister.
 *
 * Collective over the ranks of comm, like the registration.
 *
 * @param [in] comm  The communicator the window belongs to.
 * @param [in] win   The window.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm is NULL or win is unknown to comm.
 *
 * @remark Not thread-safe on comm. No pending operation may use the window.
 */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* ------------------------------------------------------------------------- */
/* Custom reduction operators                                                */
/* ------------------------------------------------------------------------- */

/**
 * @brief Create an operator that multiplies each input by a scalar, then
 *        sums across ranks: result = sum over ranks r of (scalar_r * x_r).
 *
 * The operator is valid only with comm and only for datatype. A typical
 * use is an average with a custom divisor: pass 1/divisor as the scalar.
 *
 * @param [out] op         Receives the new operator handle.
 * @param [in]  scalar     Address of one element of type datatype.
 * @param [in]  datatype   Element type of the collectives that will use op.
 * @param [in]  residence  ncclScalarHostImmediate: *scalar is host memory,
 *                         copied before return. ncclScalarDevice: *scalar is
 *                         device memory, read by each collective as it runs.
 * @param [in]  comm       The communicator the operator belongs to.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if op, scalar or comm is NULL, or datatype or
 *                              residence is out of range.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);

/**
 * @brief Release an operator made by ncclRedOpCreatePreMulSum.
 *
 * Allowed as soon as the last call that was given op has returned, even if
 * the work it enqueued has not finished.
 *
 * @param [in] op    The operator.
 * @param [in] comm  The communicator it was created with.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if comm is NULL, op is a built-in operator,
 *                              or op was not created on comm.
 *
 * @remark Not thread-safe on comm.
 */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ------------------------------------------------------------------------- */
/* Collective operations                                                     */
/* ------------------------------------------------------------------------- */

/*
 * Common rules for the collectives and for send/receive:
 *
 * - Every rank of comm makes the matching call, with the same count,
 *   datatype, op and root, and all ranks issue their collectives on a
 *   communicator in the same order.
 * - Buffers are device memory, or (collie) host memory. With device
 *   buffers the call enqueues the work on stream and returns; the results
 *   are ready when the stream reaches that point. With host buffers and a
 *   NULL stream the call has finished when it returns. Mixing host and
 *   device buffers in one call is ncclInvalidArgument.
 * - Counts are in elements of datatype, not bytes. A count of 0 is valid and
 *   moves nothing.
 * - Inside ncclGroupStart/ncclGroupEnd the call only records the work; it
 *   starts at ncclGroupEnd.
 * - "In place" means the layout given for each call; any other overlap of
 *   send and receive buffers is undefined.
 *
 * Return codes shared by all of them:
 *   ncclSuccess          the work was issued (or, host path, done);
 *   ncclInProgress       nonblocking comm: accepted, still being issued;
 *   ncclInvalidArgument  NULL comm or required buffer, datatype or op out of
 *                        range, root or peer outside [0, nranks), a count
 *                        whose byte size overflows, mixed host/device
 *                        buffers;
 *   ncclInvalidUsage     comm finalized, revoked or broken;
 *   ncclRemoteError      a peer failed (host path, or seen while issuing).
 *
 * Thread safety: not thread-safe on comm.
 */

/**
 * @brief Reduce: combine count elements from every rank with op; only root
 *        receives the result.
 *
 * @param [in]  sendbuff  This rank's count input elements.
 * @param [out] recvbuff  On root: count result elements. Ignored elsewhere
 *                        and may be NULL there.
 * @param [in]  count     Elements per rank.
 * @param [in]  datatype  Element type.
 * @param [in]  op        Built-in or created reduction operator.
 * @param [in]  root      Rank that receives the result.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when sendbuff == recvbuff.
 */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);

/**
 * @brief Broadcast, single-buffer form: root's buff is copied into buff on
 *        every other rank.
 *
 * Older spelling of ncclBroadcast with sendbuff == recvbuff, kept for
 * existing programs.
 *
 * @param [in,out] buff      On root: the data. Elsewhere: receives it.
 * @param [in]     count     Elements.
 * @param [in]     datatype  Element type.
 * @param [in]     root      Rank that holds the data.
 * @param [in]     comm      The communicator.
 * @param [in]     stream    Stream to enqueue on.
 *
 * @return See "Common rules" above.
 */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);

/**
 * @brief Broadcast: count elements of root's sendbuff land in recvbuff on
 *        every rank (root included).
 *
 * @param [in]  sendbuff  On root: the data. Ignored elsewhere.
 * @param [out] recvbuff  Receives count elements, on every rank.
 * @param [in]  count     Elements.
 * @param [in]  datatype  Element type.
 * @param [in]  root      Rank that holds the data.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when sendbuff == recvbuff.
 */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/**
 * @brief All-reduce: combine count elements from every rank with op; every
 *        rank receives the full result.
 *
 * @param [in]  sendbuff  This rank's count input elements.
 * @param [out] recvbuff  Receives count result elements.
 * @param [in]  count     Elements per rank.
 * @param [in]  datatype  Element type.
 * @param [in]  op        Built-in or created reduction operator.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when sendbuff == recvbuff.
 */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);

/**
 * @brief Reduce-scatter: combine nranks*recvcount elements from every rank
 *        with op; rank i receives block i (recvcount elements) of the result.
 *
 * @param [in]  sendbuff   This rank's nranks*recvcount input elements.
 * @param [out] recvbuff   Receives recvcount elements.
 * @param [in]  recvcount  Elements per block.
 * @param [in]  datatype   Element type.
 * @param [in]  op         Built-in or created reduction operator.
 * @param [in]  comm       The communicator.
 * @param [in]  stream     Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when
 *         recvbuff == sendbuff + rank * recvcount (in elements).
 */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/**
 * @brief All-gather: every rank contributes sendcount elements; every rank
 *        receives all contributions, rank i's at offset i*sendcount.
 *
 * @param [in]  sendbuff   This rank's sendcount elements.
 * @param [out] recvbuff   Receives nranks*sendcount elements.
 * @param [in]  sendcount  Elements contributed per rank.
 * @param [in]  datatype   Element type.
 * @param [in]  comm       The communicator.
 * @param [in]  stream     Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when
 *         sendbuff == recvbuff + rank * sendcount (in elements).
 */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/**
 * @brief All-to-all: block j (count elements at sendbuff + j*count) goes to
 *        rank j; the block from rank i lands at recvbuff + i*count.
 *
 * @param [in]  sendbuff  nranks*count elements, one block per destination.
 * @param [out] recvbuff  Receives nranks*count elements, one block per
 *                        source.
 * @param [in]  count     Elements per block.
 * @param [in]  datatype  Element type.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. Not defined in place.
 */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/**
 * @brief Gather: every rank sends count elements to root, which stores rank
 *        i's block at recvbuff + i*count.
 *
 * @param [in]  sendbuff  This rank's count elements.
 * @param [out] recvbuff  On root: receives nranks*count elements. Ignored
 *                        elsewhere.
 * @param [in]  count     Elements per rank.
 * @param [in]  datatype  Element type.
 * @param [in]  root      Rank that collects the data.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when
 *         sendbuff == recvbuff + root * count (in elements).
 */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/**
 * @brief Scatter: root sends block i (count elements at sendbuff + i*count)
 *        to rank i.
 *
 * @param [in]  sendbuff  On root: nranks*count elements. Ignored elsewhere.
 * @param [out] recvbuff  Receives count elements, on every rank.
 * @param [in]  count     Elements per rank.
 * @param [in]  datatype  Element type.
 * @param [in]  root      Rank that distributes the data.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above. In place when
 *         recvbuff == sendbuff + root * count (in elements).
 */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);

/* ------------------------------------------------------------------------- */
/* Point-to-point                                                            */
/* ------------------------------------------------------------------------- */

/*
 * A send on rank A to peer B matches a receive on B from peer A with the
 * same count and datatype, in posting order. Both sides block (on the stream,
 * or the host call) until the transfer happens, so two ranks that exchange
 * data, or any cycle of sends, must put their sends and receives in one
 * ncclGroupStart/ncclGroupEnd section, which lets them progress together.
 * The common rules of the collectives apply.
 */

/**
 * @brief Send count elements to one peer.
 *
 * @param [in] sendbuff  The data.
 * @param [in] count     Elements.
 * @param [in] datatype  Element type.
 * @param [in] peer      Destination rank; may be the caller itself.
 * @param [in] comm      The communicator.
 * @param [in] stream    Stream to enqueue on.
 *
 * @return See "Common rules" above.
 */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/**
 * @brief Receive count elements from one peer.
 *
 * @param [out] recvbuff  Receives the data.
 * @param [in]  count     Elements; must equal the sender's count.
 * @param [in]  datatype  Element type; must equal the sender's.
 * @param [in]  peer      Source rank; may be the caller itself.
 * @param [in]  comm      The communicator.
 * @param [in]  stream    Stream to enqueue on.
 *
 * @return See "Common rules" above.
 */
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/* ------------------------------------------------------------------------- */
/* Groups                                                                    */
/* ------------------------------------------------------------------------- */

/*
 * A group section, ncclGroupStart() ... ncclGroupEnd(), collects the calls
 * made in between and issues them together at ncclGroupEnd. Uses:
 * - one thread driving several ranks (several communicators), where issuing
 *   each call on its own would deadlock waiting for the others;
 * - letting sends and receives to several peers progress together;
 * - merging several collectives into fewer launches.
 * Sections nest; only the outermost ncclGroupEnd issues the work.
 * Communicator creation calls may also be grouped, but not in the same
 * section as communication calls. Group state belongs to the calling thread.
 */

/**
 * @brief Open a group section (or a nested level of one).
 *
 * @return ncclSuccess on success.
 *
 * @remark Affects only the calling thread.
 */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);

/**
 * @brief Close a group section; at the outermost level, issue everything
 *        recorded since the matching ncclGroupStart.
 *
 * With device buffers, the work is enqueued on its streams when this
 * returns; it has not necessarily run. An error from any recorded call is
 * reported here.
 *
 * @return ncclSuccess          on success;
 *         ncclInProgress       a nonblocking communicator in the group is
 *                              still issuing; poll ncclCommGetAsyncError;
 *         ncclInvalidUsage     if no section is open on this thread, or the
 *                              section mixes creation and communication;
 *         any code a recorded call can return.
 *
 * @remark Affects only the calling thread.
 */
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);

/**
 * @brief Close a group section without issuing anything, and report what
 *        issuing it would have cost.
 *
 * The recorded calls are discarded after the estimate.
 *
 * @param [in,out] simInfo  Created with NCCL_SIM_INFO_INITIALIZER; receives
 *                          estimatedTime.
 *
 * @return ncclSuccess          on success;
 *         ncclInvalidArgument  if simInfo is NULL or was not initialised
 *                              with NCCL_SIM_INFO_INITIALIZER;
 *         ncclInvalidUsage     if no section is open on this thread.
 *
 * @remark Affects only the calling thread.
 */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#undef COLLIE_NCCL_DEPRECATED_

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
