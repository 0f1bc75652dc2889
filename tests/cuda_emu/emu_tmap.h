/* tests/cuda_emu/emu_tmap.h — the emulated device's tensor maps (TMA), shared by the fake
 * driver (fake_cuda.c: cuTensorMapEncodeTiled) and the emulated tensor copy (emu_sm90.h:
 * cp.async.bulk.tensor), C and C++ alike.
 *
 * A CUtensorMap is 128 opaque bytes; the emulator's own encoding fills them (LoomEmuTmap).
 * loom_emu_tmap_encode checks cuTensorMapEncodeTiled's arguments as the driver API's
 * documentation (cuda.h, "Tensor Map Object Management") states them, and refuses with a
 * reason what the emulator does not model (interleaved layouts, packed sub-byte types, a
 * swizzled box whose inner dimension is narrower than the swizzle's span).  The enums are
 * cuda.h's values, as ints: this header does not include cuda.h (attention.cc builds maps
 * without it).
 */
#ifndef LOOM_CUDA_EMU_TMAP_H
#define LOOM_CUDA_EMU_TMAP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define LOOM_EMU_TMAP_MAGIC 0x4c544d41u   /* "LTMA" */

typedef struct {
  uint32_t magic;
  uint8_t elem, rank, swizzle_bytes, oob_nan;   /* element bytes; 1-5; 0/32/64/128; NaN fill */
  uint64_t addr;
  uint64_t dim[5];        /* elements, innermost first */
  uint64_t stride[4];     /* bytes, of dims 1.. */
  uint32_t box[5];        /* elements traversed per dim */
  uint8_t estride[5];     /* traversal steps (dim 0's ignored, as the driver does) */
} LoomEmuTmap;

/* 0, or 1 with the reason in why.  dtype, interleave, swizzle, l2, oob: cuda.h's enums. */
static inline int loom_emu_tmap_encode(void *map, int dtype, unsigned rank, const void *addr, const uint64_t *dim,
                                       const uint64_t *strides, const uint32_t *box, const uint32_t *estr,
                                       int interleave, int swizzle, int l2, int oob, char *why, size_t n) {
  /* CU_TENSOR_MAP_DATA_TYPE_*: UINT8 UINT16 UINT32 INT32 UINT64 INT64 FLOAT16 FLOAT32 FLOAT64
     BFLOAT16 FLOAT32_FTZ TFLOAT32 TFLOAT32_FTZ, then the packed 16U4/16U6 types */
  static const int size[13] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
  const int is_float = dtype >= 6;
  if (!map || (uintptr_t)map % 64) return snprintf(why, n, "tensorMap address not 64-byte aligned"), 1;
  if (dtype < 0 || dtype > 15) return snprintf(why, n, "tensorDataType %d is not a CUtensorMapDataType", dtype), 1;
  if (dtype > 12) return snprintf(why, n, "packed data type %d (not emulated)", dtype), 1;
  if (rank < 1 || rank > 5) return snprintf(why, n, "tensorRank %u not in [1, 5]", rank), 1;
  if (interleave < 0 || interleave > 2) return snprintf(why, n, "interleave %d is not a CUtensorMapInterleave", interleave), 1;
  if (interleave != 0) return snprintf(why, n, "interleaved layouts (not emulated)"), 1;
  if (!addr || (uintptr_t)addr % 16) return snprintf(why, n, "globalAddress %p not 16-byte aligned", addr), 1;
  if (!dim || !box || !estr || (rank > 1 && !strides)) return snprintf(why, n, "a NULL array"), 1;
  const unsigned es = (unsigned)size[dtype];
  for (unsigned i = 0; i < rank; i++) {
    if (dim[i] == 0 || dim[i] > (1ull << 32)) return snprintf(why, n, "globalDim[%u] = %llu not in [1, 2^32]", i, (unsigned long long)dim[i]), 1;
    if (box[i] == 0 || box[i] > 256) return snprintf(why, n, "boxDim[%u] = %u not in [1, 256]", i, box[i]), 1;
    if (estr[i] == 0 || estr[i] > 8) return snprintf(why, n, "elementStrides[%u] = %u not in [1, 8]", i, estr[i]), 1;
  }
  for (unsigned i = 0; i + 1 < rank; i++)
    if (strides[i] % 16 || strides[i] >= (1ull << 40))
      return snprintf(why, n, "globalStrides[%u] = %llu not a multiple of 16 below 2^40", i, (unsigned long long)strides[i]), 1;
  if (rank > 1 && strides[0] < dim[0] * es)
    return snprintf(why, n, "globalStrides[0] = %llu under globalDim[0] * element size (%llu)",
                    (unsigned long long)strides[0], (unsigned long long)(dim[0] * es)), 1;
  if (box[0] * es % 16) return snprintf(why, n, "boxDim[0] * element size = %u bytes, not a multiple of 16", box[0] * es), 1;
  if (swizzle < 0 || swizzle > 6) return snprintf(why, n, "swizzle %d is not a CUtensorMapSwizzle", swizzle), 1;
  if (swizzle > 3) return snprintf(why, n, "swizzle %d (the 128B atom variants: not emulated)", swizzle), 1;
  const unsigned span = swizzle ? 16u << swizzle : 0;
  if (span && box[0] * es > span)
    return snprintf(why, n, "the box's inner dimension (%u bytes) is over the swizzle's %u", box[0] * es, span), 1;
  if (span && box[0] * es != span)
    return snprintf(why, n, "a box inner dimension of %u bytes under the swizzle's %u (not emulated)", box[0] * es, span), 1;
  if (l2 < 0 || l2 > 3) return snprintf(why, n, "l2Promotion %d is not a CUtensorMapL2promotion", l2), 1;
  if (oob < 0 || oob > 1) return snprintf(why, n, "oobFill %d is not a CUtensorMapFloatOOBfill", oob), 1;
  if (oob && !is_float) return snprintf(why, n, "the NaN out-of-bounds fill for an integer data type"), 1;
  LoomEmuTmap t;
  memset(&t, 0, sizeof t);
  t.magic = LOOM_EMU_TMAP_MAGIC;
  t.elem = (uint8_t)es, t.rank = (uint8_t)rank, t.swizzle_bytes = (uint8_t)span, t.oob_nan = (uint8_t)oob;
  t.addr = (uint64_t)(uintptr_t)addr;
  for (unsigned i = 0; i < rank; i++) {
    t.dim[i] = dim[i], t.box[i] = box[i], t.estride[i] = (uint8_t)estr[i];
    if (i + 1 < rank) t.stride[i] = strides[i];
  }
  memset(map, 0, 128);
  memcpy(map, &t, sizeof t);
  return 0;
}

#ifdef __cplusplus
static_assert(sizeof(LoomEmuTmap) <= 128, "a tensor map is 128 bytes");
#else
_Static_assert(sizeof(LoomEmuTmap) <= 128, "a tensor map is 128 bytes");
#endif

#endif
