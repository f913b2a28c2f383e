/* Cross-memory attach (process_vm_readv) between the ranks of one host: the
 * probe that decides, once per communicator and alike on every rank, whether
 * single copy is used (COLLIE_CMA), and the copy itself for the shm
 * transport's read_peer op (shm.c). Talks to the bootstrap (two allgathers at
 * init) and the error record; nothing above. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../comm.h"
#include "../comm_err.h"
#include "transport.h"

/* COLLIE_CMA=auto probes on hosts of at most CMA_AUTO_MAX_RANKS ranks and
 * uses single copy for point-to-point messages (alltoall, gather, scatter,
 * send/recv) from the size where the tuner's cost model, with this machine's
 * calibrated copy and single-copy rates, has one copy plus a handshake
 * beating the FIFO's two copies (graph/tuning.c, tuning_cma_thresholds); until
 * then for none. The single-copy broadcast and allgather rows are weighed by
 * the tuner from the same size on. An earlier development machine
 * measured the FIFO as fast or faster everywhere (cache-resident slots at ~20
 * GB/s against process_vm_readv's page pinning at 5-9 GB/s); the current one
 * (2 ranks, alltoall 128 KiB-32 MiB) 1.3-2.1x slower than single copy. */
#define CMA_MIN_BYTES_AUTO SIZE_MAX

#define CMA_PROBE_MAGIC 0x636f6c6c69654d41ULL /* "collieMA" */
/* Always mapped and never written: what peers read to prove they can. */
static volatile const uint64_t cma_probe_word = CMA_PROBE_MAGIC;

struct cma_probe {
  int32_t pid;
  int32_t pad;
  uint64_t addr;
};

/* Copies bytes between local and addr in process pid, in calls of at most
 * 1 GiB (partial transfers come back as shorter counts). */
static ncclResult_t cma_copy(int pid, char* local, uint64_t addr, size_t bytes, int write, int* err) {
  size_t done = 0;
  while (done < bytes) {
    size_t len = COLLIE_MIN(bytes - done, (size_t)1 << 30);
    struct iovec l = {local + done, len};
    struct iovec r = {(void*)(uintptr_t)(addr + done), len};
    ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *err = n < 0 ? errno : EFAULT;
      return ncclSystemError;
    }
    done += (size_t)n;
  }
  return ncclSuccess;
}

ncclResult_t cma_read(int pid, void* dst, uint64_t addr, size_t bytes, int* err) {
  return cma_copy(pid, dst, addr, bytes, 0, err);
}

ncclResult_t cma_write(int pid, uint64_t addr, const void* src, size_t bytes, int* err) {
  return cma_copy(pid, (char*)src, addr, bytes, 1, err); /* process_vm_writev only reads the local side */
}

int cma_mode(void) {
  const char* s = param_str(P_COLLIE_CMA);
  if (!s || !*s || strcasecmp(s, "auto") == 0) return CMA_AUTO;
  if (strcmp(s, "0") == 0 || strcasecmp(s, "off") == 0) return CMA_OFF;
  if (strcmp(s, "1") == 0 || strcasecmp(s, "on") == 0) return CMA_ON;
  return -1;
}

ncclResult_t transport_cma_init(struct ncclComm* comm) {
  comm->cma = 0;
  comm->cma_min_bytes = comm->cma_min_stream = CMA_MIN_BYTES_AUTO;
  int mode = cma_mode();
  if (mode < 0)
    return err_set(ncclInvalidArgument, "COLLIE_CMA=\"%s\": expected auto, 0 or 1", param_str(P_COLLIE_CMA));
  if (mode == CMA_OFF) return ncclSuccess;
  int forced = mode == CMA_ON;
  /* One host whose ranks share memory: every rank knows this alike. */
  if (comm->nranks == 1 || comm->nhosts != 1 || comm->shm_disable) {
    if (forced && comm->nranks > 1)
      INFO(LOG_INIT | LOG_SHM, "COLLIE_CMA=1: ranks span hosts or shared memory is off; single copy is not used");
    return ncclSuccess;
  }
  if (!forced && comm->nranks > CMA_AUTO_MAX_RANKS) {
    INFO(LOG_INIT | LOG_SHM, "single copy (cross-memory attach): not used (COLLIE_CMA=auto probes hosts of up to %d "
         "ranks; COLLIE_CMA=1 forces it)", CMA_AUTO_MAX_RANKS);
    return ncclSuccess;
  }
  int n = comm->nranks;
  struct cma_probe* all = calloc((size_t)n, sizeof(*all));
  int32_t* ok = calloc((size_t)n, sizeof(*ok));
  ncclResult_t res = ncclSuccess;
  if (!all || !ok) {
    res = err_set(ncclSystemError, "out of memory probing cross-memory attach");
    goto out;
  }
  all[comm->rank] = (struct cma_probe){(int32_t)getpid(), 0, (uint64_t)(uintptr_t)&cma_probe_word};
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, all, sizeof(*all)), res, out);
  /* A real read from every peer: a different pid namespace reads the wrong
   * process (or none), ptrace rules or seccomp refuse it. */
  int mine = 1, why = 0, whom = -1;
  for (int i = 0; i < n && mine; i++) {
    if (i == comm->rank) continue;
    uint64_t v = 0;
    int err = 0;
    if (cma_read(all[i].pid, &v, all[i].addr, sizeof(v), &err) != ncclSuccess || v != CMA_PROBE_MAGIC) {
      mine = 0;
      why = err;
      whom = i;
    }
  }
  ok[comm->rank] = mine;
  NCCLCHECKGOTO(bootstrap_allgather(comm->bs, ok, sizeof(*ok)), res, out);
  int agreed = 1;
  for (int i = 0; i < n; i++) agreed &= ok[i] != 0;
  if (!agreed) {
    char reason[160];
    if (mine) snprintf(reason, sizeof(reason), "rank %d can read its peers; another rank cannot", comm->rank);
    else
      snprintf(reason, sizeof(reason), "rank %d cannot read rank %s%s", comm->rank, whom >= 0 ? "a peer: " : "",
               why ? strerror(why) : "wrong data");
    if (forced)
      res = err_set(ncclSystemError, "COLLIE_CMA=1 but cross-memory attach does not work between this host's ranks "
                    "(%s); set COLLIE_CMA=auto or 0", reason);
    else
      INFO(LOG_INIT | LOG_SHM, "single copy (cross-memory attach): not used, %s (COLLIE_CMA=auto)", reason);
    goto out;
  }
  comm->cma = 1;
  if (forced) {
    comm->cma_min_bytes = comm->cma_min_stream = 1;
    INFO(LOG_INIT | LOG_SHM, "single copy (cross-memory attach) between this host's %d ranks: on for every message", n);
  }
  /* auto: the tuner sets the threshold (CMA_MIN_BYTES_AUTO until then) once
   * the tuning table is agreed. */
out:
  free(all);
  free(ok);
  return res;
}
