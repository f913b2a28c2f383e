/* Entry points of the NCCL API that collie 0.1 does not implement yet. Each
 * one exists so that programs link and load, and fails loudly with
 * ncclInvalidUsage and a message for ncclGetLastError naming the milestone
 * that brings it (never a silent no-op). A function moves out of this file
 * when its module implements it. Uses err_set from core.h (errors.c). */
#include "core.h"

/* `why` says what is missing; the text ends up in ncclGetLastError and in
 * the WARN log line. */
static ncclResult_t not_yet(const char* fn, const char* why) {
  return err_set(ncclInvalidUsage, "%s: not implemented yet in collie %d.%d (%s)", fn,
                 COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR, why);
}

/* ---- The device API (nccl_device/core.h, NCCL 2.28) --------------------- */
/* Declared in NVIDIA's nccl_device/core.h, not nccl.h; clients built against
 * it (nccl-tests, PyTorch 2.11) import these two. Their types are opaque
 * here: only pointers cross the ABI. Without them a client's call would bind
 * to whichever other libnccl is loaded and get a collie communicator. */
#define WHY_DEVAPI "the device-side API (ncclDevComm, symmetric kernels) is not implemented by collie"

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  (void)comm;
  (void)reqs;
  (void)outDevComm;
  return not_yet(__func__, WHY_DEVAPI);
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const void* devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  (void)comm;
  (void)devComm;
  return not_yet(__func__, WHY_DEVAPI);
}

/* ---- Logging ------------------------------------------------------------ */

/* Not a stub: the deprecated hook only asks for the logging environment to
 * be read again, which debug.c already provides. It returns nothing, so it
 * could not report "not implemented" anyway. */
NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) { log_reset(); }

