/* A user program built against an installed collie: one-rank communicator. */
#include <stdio.h>

#include <nccl.h>

int main(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  int n = 0, v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE) return 1;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return 3;
  if (ncclCommCount(comm, &n) != ncclSuccess || n != 1) return 4;
  if (ncclCommDestroy(comm) != ncclSuccess) return 5;
  printf("consumer: ok (NCCL API %d)\n", v);
  return 0;
}
