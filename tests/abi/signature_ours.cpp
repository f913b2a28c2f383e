/* Records the entry-point signatures of collie's nccl.h (see
 * signature_entries.inc) for abi_signature_test.cpp. Compile with
 * -I<collie>/include ahead of any CUDA include directory. */
#include <nccl.h>

#ifndef COLLIE_NCCL_H
#error "signature_ours.cpp found NVIDIA's nccl.h; put collie's include directory first"
#endif

#define ABI_SIGNATURE_FN abi_signature_ours
#include "signature_entries.inc"
