/* ABI layout test: compares the facts recorded against collie's nccl.h
 * (layout_ours.c) with those recorded against NVIDIA's (layout_nvidia.c) and
 * fails on the first build where any size, offset or constant differs. */
#include <stdio.h>

#include "abi_table.h"

int main(void) {
  static struct abi_entry ours[ABI_MAX_ENTRIES];
  static struct abi_entry nv[ABI_MAX_ENTRIES];
  int n_ours = abi_layout_ours(ours, ABI_MAX_ENTRIES);
  int n_nv = abi_layout_nvidia(nv, ABI_MAX_ENTRIES);
  if (n_ours < 0 || n_nv < 0) {
    printf("abi_layout_test: table overflow, raise ABI_MAX_ENTRIES\n");
    return 1;
  }
  int bad = abi_compare(ours, n_ours, nv, n_nv);
  if (bad != 0) {
    printf("abi_layout_test: %d of %d checks failed\n", bad, n_nv);
    return 1;
  }
  printf("abi_layout_test: %d checks passed\n", n_nv);
  return 0;
}
