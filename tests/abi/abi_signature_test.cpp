// ABI signature test: every nccl*/pnccl* declaration in collie's nccl.h must
// have exactly the type NVIDIA's declares (return and parameter types, with
// typedefs resolved). Tables come from signature_ours.cpp and
// signature_nvidia.cpp; the function list from api_functions.inc.
#include <cstdio>

#include "abi_table.h"

int main() {
  static struct abi_entry ours[ABI_MAX_ENTRIES];
  static struct abi_entry nv[ABI_MAX_ENTRIES];
  int n_ours = abi_signature_ours(ours, ABI_MAX_ENTRIES);
  int n_nv = abi_signature_nvidia(nv, ABI_MAX_ENTRIES);
  if (n_ours < 0 || n_nv < 0) {
    std::printf("abi_signature_test: table overflow, raise ABI_MAX_ENTRIES\n");
    return 1;
  }
  int bad = abi_compare(ours, n_ours, nv, n_nv);
  if (bad != 0) {
    std::printf("abi_signature_test: %d of %d checks failed\n", bad, n_nv);
    return 1;
  }
  std::printf("abi_signature_test: %d checks passed\n", n_nv);
  return 0;
}
