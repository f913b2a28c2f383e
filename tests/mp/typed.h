/* Typed element access for the multi-process tests: store a double into
 * element i of a buffer of any NCCL datatype (rounding as the library does)
 * and read it back as a double. Shared by tests/mp/test_coll.c and
 * tests/engine/test_engine.c. */
#ifndef COLLIE_MP_TYPED_H
#define COLLIE_MP_TYPED_H

#include <stddef.h>
#include <stdint.h>

#include "device/reduce.h"
#include "nccl.h"

static inline void store(ncclDataType_t dt, void* buf, size_t i, double v) {
  switch (dt) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)(int64_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)(int64_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)(int64_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)(int64_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)(int64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = red_float_to_half((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = red_float_to_bf16((float)v); break;
    case ncclFloat8e4m3: ((uint8_t*)buf)[i] = red_float_to_e4m3((float)v); break;
    case ncclFloat8e5m2: ((uint8_t*)buf)[i] = red_float_to_e5m2((float)v); break;
    default: break;
  }
}

static inline double load(ncclDataType_t dt, const void* buf, size_t i) {
  switch (dt) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return red_half_to_float(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclBfloat16: return red_bf16_to_float(((const uint16_t*)buf)[i]);
    case ncclFloat8e4m3: return red_e4m3_to_float(((const uint8_t*)buf)[i]);
    case ncclFloat8e5m2: return red_e5m2_to_float(((const uint8_t*)buf)[i]);
    default: return 0;
  }
}

#endif
