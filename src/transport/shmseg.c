/* Shared-memory segments (memfd, 0600, mmap, open through /proc): the one
 * copy of that sequence, see shmseg.h. Talks to nothing but the kernel and
 * the error helpers of core.h. */
#include "shmseg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core.h"
#include "../procstat.h"

ncclResult_t shmseg_create(size_t len, const char* what, struct shm_seg* s) {
  s->base = NULL;
  s->len = len;
  s->fd = memfd_create("collie-shm", MFD_CLOEXEC); /* the name /proc/PID/maps shows (security.shm) */
  if (s->fd < 0) return err_set(ncclSystemError, "%s: memfd_create failed: %s", what, strerror(errno));
  /* memfds start 0777; only this user's processes (the peers) may open it. */
  if (fchmod(s->fd, 0600) != 0 || ftruncate(s->fd, (off_t)len) != 0) {
    int e = errno;
    shmseg_free(s);
    return err_set(ncclSystemError, "%s: cannot create a %zu-byte segment: %s", what, len, strerror(e));
  }
  void* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    shmseg_free(s);
    return err_set(ncclSystemError, "%s: mmap of %zu bytes failed: %s", what, len, strerror(e));
  }
  s->base = m;
  return ncclSuccess;
}

/* Whether process pid has exited: gone altogether, or a zombie (killed and
 * not yet reaped by its parent: kill(pid, 0) still succeeds, but its fds
 * are closed already, which is why its segment could not be opened). */
static int pid_gone(int32_t pid) {
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
  char buf[256];
  const char* state = procstat_fields((int)pid, 0, buf, sizeof(buf));
  if (!state) return 1;
  return *state == 'Z' || *state == 'X' || *state == 'x';
}

ncclResult_t shmseg_open(int32_t pid, int32_t fd, size_t len, int peer, const char* what, struct shm_seg* s) {
  s->base = NULL;
  s->len = len;
  s->fd = -1;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
  int f = open(path, O_RDWR | O_CLOEXEC);
  int gone = 0;
  if (f < 0 && errno == ENOENT) {
    /* A process that is exiting closes its fds before it becomes a zombie:
     * give a peer whose fd vanished a moment to show that it is gone (a
     * survivor of a rank killed during connector setup saw the fd missing
     * and the process still running, and blamed containers). */
    for (int i = 0; i < 200 && !(gone = pid_gone(pid)); i++) {
      struct timespec ts = {0, 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    errno = ENOENT;
  }
  if (f < 0 && gone)
    /* The peer's process is gone (killed while we connected to it): say so,
     * naming it, as the other failure paths do. */
    return err_set(ncclRemoteError, "%s: rank %d (pid %d) failed or exited before its segment could be opened", what,
                   peer, (int)pid);
  if (f < 0)
    return err_set(ncclSystemError,
                   "%s: cannot open rank %d's segment %s: %s (processes in different containers or users? "
                   "set NCCL_SHM_DISABLE=1 to use sockets)",
                   what, peer, path, strerror(errno));
  /* The peer says how big it is; a smaller file would fault on access. */
  struct stat st;
  if (fstat(f, &st) != 0 || (uint64_t)st.st_size < (uint64_t)len) {
    close(f);
    return err_set(ncclSystemError, "%s: rank %d's segment %s is smaller than the %zu bytes it announced", what, peer,
                   path, len);
  }
  void* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  int e = errno;
  close(f);
  if (m == MAP_FAILED) return err_set(ncclSystemError, "%s: mmap of rank %d's segment failed: %s", what, peer, strerror(e));
  s->base = m;
  return ncclSuccess;
}

void shmseg_drop_fd(struct shm_seg* s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

void shmseg_free(struct shm_seg* s) {
  if (s->base) munmap(s->base, s->len);
  s->base = NULL;
  shmseg_drop_fd(s);
}

void shmseg_prefault(void* base, size_t len) {
#ifdef MADV_POPULATE_WRITE
  (void)madvise(base, len, MADV_POPULATE_WRITE); /* else the writes below fault them in */
#endif
  long page = sysconf(_SC_PAGESIZE);
  for (size_t off = 0; off < len; off += (size_t)(page > 0 ? page : 4096))
    __atomic_fetch_add((volatile char*)base + off, 0, __ATOMIC_RELAXED);
}
