/* Entry points of the NCCL API that collie 0.1 does not implement yet. Each
 * one exists so that programs link and load, and fails loudly with
 * ncclInvalidUsage and a message for ncclGetLastError naming the milestone
 * that brings it (never a silent no-op). A function moves out of this file
 * when its module implements it. Uses err_set from core.h (errors.c). */
#include "core.h"

/* Why each group of functions is missing; the text ends up in
 * ncclGetLastError and in the WARN log line. */
#define WHY_REG "window registration (symmetric memory) is not implemented by collie's device path yet"

static ncclResult_t not_yet(const char* fn, const char* why) {
  return err_set(ncclInvalidUsage, "%s: not implemented yet in collie %d.%d (%s)", fn,
                 COLLIE_VERSION_MAJOR, COLLIE_VERSION_MINOR, why);
}

/* ---- Registration windows (symmetric memory) ---------------------------- */
/* ncclMemAlloc/ncclMemFree and ncclCommRegister/ncclCommDeregister live in
 * src/device/dev_api.c. */

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
         ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  (void)comm;
  (void)buff;
  (void)size;
  (void)win;
  (void)winFlags;
  return not_yet(__func__, WHY_REG);
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm;
  (void)win;
  return not_yet(__func__, WHY_REG);
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

