/* Reading /proc/<pid>/stat (procstat.h). */
#include "procstat.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char* procstat_fields(int pid, int tid, char* buf, size_t n) {
  char path[96];
  if (pid <= 0) snprintf(path, sizeof(path), "/proc/self/stat");
  else if (tid <= 0) snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  else snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || n < 2) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  ssize_t got = read(fd, buf, n - 1);
  close(fd);
  if (got <= 0) return NULL;
  buf[got] = '\0';
  char* p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' && p[2] != '\0' ? p + 2 : NULL;
}

const char* procstat_field(const char* fields, int k) {
  const char* p = fields;
  for (int field = 3; field < k; field++) {
    p = strchr(p, ' ');
    if (p == NULL) return NULL;
    p++;
  }
  return *p != '\0' && *p != '\n' ? p : NULL;
}

uint64_t proc_start_ticks(int pid) {
  char buf[1024];
  const char* f = procstat_fields(pid, 0, buf, sizeof(buf));
  const char* s = f ? procstat_field(f, 22) : NULL;
  return s ? strtoull(s, NULL, 10) : 0;
}

int proc_running(int pid, uint64_t start) {
  if (pid <= 0 || start == 0) return 0;
  char buf[1024];
  const char* f = procstat_fields(pid, 0, buf, sizeof(buf));
  const char* s = f ? procstat_field(f, 22) : NULL;
  if (s == NULL || strtoull(s, NULL, 10) != start) return 0;
  /* R running, S sleeping, D in the kernel; not T stopped (SIGSTOP: a
   * frozen rank is a failure), t traced, Z or X dead. */
  return *f == 'R' || *f == 'S' || *f == 'D';
}
