/* Records NVIDIA's nccl.h layout facts (see layout_entries.inc) for
 * abi_layout_test.c. Compile with -I/usr/local/cuda/include only: NVIDIA's
 * header includes cuda_runtime.h from there. */
#include <nccl.h>

#ifdef COLLIE_NCCL_H
#error "layout_nvidia.c found collie's nccl.h; it must see only NVIDIA's"
#endif

#define ABI_LAYOUT_FN abi_layout_nvidia
#include "layout_entries.inc"
