/* One rank of the init benchmark: times collie_comm_init_from_env
 * (bootstrap + peer-info exchange) and prints "init_ms <rank> <ms>".
 * Run under collie-run by bench/init_scaling.sh. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>

#include "collie.h"

int main(void) {
  struct timespec a, b;
  ncclComm_t comm;
  clock_gettime(CLOCK_MONOTONIC, &a);
  ncclResult_t r = collie_comm_init_from_env(&comm);
  clock_gettime(CLOCK_MONOTONIC, &b);
  if (r != ncclSuccess) {
    fprintf(stderr, "init failed: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  int rank;
  ncclCommUserRank(comm, &rank);
  printf("init_ms %d %.3f\n", rank, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
  ncclCommDestroy(comm);
  return 0;
}
