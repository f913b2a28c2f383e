/* The first main job: brings up the ranks started by a launcher
 * (collie-run -n 4 collie-hello), prints what each rank learned about the
 * others, and the time ncclCommInitRank took (max over ranks). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "collie.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
  ncclComm_t comm;
  double t0 = now_s();
  ncclResult_t res = collie_comm_init_from_env(&comm);
  double init_s = now_s() - t0;
  if (res != ncclSuccess) {
    fprintf(stderr, "collie-hello: init failed: %s: %s\n", ncclGetErrorString(res), ncclGetLastError(NULL));
    return 1;
  }
  int rank, n;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  if (rank == 0) {
    int v = collie_version();
    printf("collie %d.%d.%d (NCCL API %d): %d ranks\n", v / 10000, v / 100 % 100, v % 100, NCCL_VERSION_CODE, n);
    printf("%4s %8s %-20s %5s %-12s %6s %5s %s\n", "rank", "pid", "host", "numa", "cpus", "local", "cuda", "pci");
    for (int r = 0; r < n; r++) {
      collie_peer_info_t info = {.size = sizeof(info)};
      if (collie_comm_peer_info(comm, r, &info) != ncclSuccess) return 1;
      printf("%4d %8d %-20s %5d %-12s %3d/%-2d %5d %s\n", info.rank, info.pid, info.hostname, info.numa_node,
             info.cpuset, info.local_rank, info.local_size, info.cuda_dev, info.pci_bus_id[0] ? info.pci_bus_id : "-");
    }
  }
  printf("rank %d: init %.3f ms\n", rank, init_s * 1e3);
  fflush(stdout);
  ncclCommDestroy(comm);
  return 0;
}
