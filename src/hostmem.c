/* Host allocations peers can map (see hostmem.h). A short list under one
 * lock: programs allocate a handful of large buffers, and a collective looks
 * up its two buffers once per call. */
#include "hostmem.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "param.h"
#include "device/device.h"
#include "transport/shmseg.h"

struct hostmem_alloc {
  struct shm_seg seg;
  uint64_t ino;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct hostmem_alloc* list;
static int nlist, caplist;

int hostmem_wanted(void) {
  const char* s = param_str(P_COLLIE_MEMALLOC);
  if (strcmp(s, "host") == 0) return 1;
  if (strcmp(s, "device") == 0) return 0;
  if (strcmp(s, "auto") == 0) return device_count() == 0;
  err_set(ncclInvalidArgument, "COLLIE_MEMALLOC=\"%s\": expected auto, host or device", s);
  return -1;
}

ncclResult_t hostmem_alloc(void** p, size_t size) {
  *p = NULL;
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) page = 4096;
  if (size > SIZE_MAX - (size_t)page) return err_set(ncclInvalidArgument, "ncclMemAlloc: size %zu is too large", size);
  size_t len = (size + (size_t)page - 1) / (size_t)page * (size_t)page;
  struct hostmem_alloc a;
  NCCLCHECK(shmseg_create(len, "ncclMemAlloc (host memory)", &a.seg));
  struct stat st;
  if (fstat(a.seg.fd, &st) != 0) {
    shmseg_free(&a.seg);
    return err_set(ncclSystemError, "ncclMemAlloc: fstat of its memfd failed");
  }
  a.ino = (uint64_t)st.st_ino;
  pthread_mutex_lock(&mu);
  if (nlist == caplist) {
    int ncap = caplist ? 2 * caplist : 16;
    struct hostmem_alloc* nl = realloc(list, (size_t)ncap * sizeof(*nl));
    if (!nl) {
      pthread_mutex_unlock(&mu);
      shmseg_free(&a.seg);
      return err_set(ncclSystemError, "ncclMemAlloc: out of memory");
    }
    list = nl;
    caplist = ncap;
  }
  list[nlist++] = a;
  pthread_mutex_unlock(&mu);
  *p = a.seg.base;
  return ncclSuccess;
}

int hostmem_free(void* p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nlist; i++) {
    if (list[i].seg.base != p) continue;
    struct hostmem_alloc a = list[i];
    list[i] = list[--nlist];
    if (nlist == 0) {
      free(list);
      list = NULL;
      caplist = 0;
    }
    pthread_mutex_unlock(&mu);
    /* Peers that mapped it keep a mapping until they drop it: give its
     * pages back now (nobody may touch it after the owner frees it). */
    (void)!ftruncate(a.seg.fd, 0); /* failing, the pages go with the last mapping */
    shmseg_free(&a.seg);
    return 1;
  }
  pthread_mutex_unlock(&mu);
  return 0;
}

int hostmem_find(const void* p, size_t bytes, struct hostmem_ref* out) {
  uintptr_t a = (uintptr_t)p;
  int found = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nlist && !found; i++) {
    uintptr_t b = (uintptr_t)list[i].seg.base;
    size_t len = list[i].seg.len;
    if (a < b || a - b > len || bytes > len - (a - b) || (bytes == 0 && a - b == len)) continue;
    *out = (struct hostmem_ref){list[i].seg.fd, list[i].ino, len, a - b};
    found = 1;
  }
  pthread_mutex_unlock(&mu);
  return found;
}

int hostmem_count(void) {
  pthread_mutex_lock(&mu);
  int n = nlist;
  pthread_mutex_unlock(&mu);
  return n;
}
