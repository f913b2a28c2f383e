/* Records collie's nccl.h layout facts (see layout_entries.inc) for
 * abi_layout_test.c. Compile with -I<collie>/include ahead of any CUDA
 * include directory, which also holds a nccl.h. */
#include <nccl.h>

#ifndef COLLIE_NCCL_H
#error "layout_ours.c found NVIDIA's nccl.h; put collie's include directory first"
#endif

#define ABI_LAYOUT_FN abi_layout_ours
#include "layout_entries.inc"
