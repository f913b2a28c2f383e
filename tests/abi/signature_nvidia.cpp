/* Records the entry-point signatures of NVIDIA's nccl.h (see
 * signature_entries.inc) for abi_signature_test.cpp. Compile with
 * -I/usr/local/cuda/include only. */
#include <nccl.h>

#ifdef COLLIE_NCCL_H
#error "signature_nvidia.cpp found collie's nccl.h; it must see only NVIDIA's"
#endif

#define ABI_SIGNATURE_FN abi_signature_nvidia
#include "signature_entries.inc"
