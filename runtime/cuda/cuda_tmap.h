/* runtime/cuda/cuda_tmap.h — the tensor maps (sm_90's TMA) of a CudaProgram's kernels
 * (cuda_tmap.c), for the files of cuda_exec_internal.h only: they share the program's private state
 * (LOOM_CUDA_INTERNAL).  A step whose tmaps > 0 (program.h's RT_TMAP_INT) launches its kernel with
 * a second parameter, LoomTmaps: RT_TMAP_MAX CUtensorMaps that cuda_tmaps_build encodes once,
 * after the program's memory is allocated (its addresses never change after: the graphs
 * replay the same bytes). */
#ifndef LOOM_RUNTIME_CUDA_TMAP_H
#define LOOM_RUNTIME_CUDA_TMAP_H

#include "runtime/cuda/cuda_exec.h"

/* A step's tensor-map fields against its buffers (no GPU needed): 0, or 2 with a message. */
int cuda_tmap_check(const RtStep *st, char *msg, size_t n);

#if defined(LOOM_CUDA_INTERNAL) && defined(LOOM_HAVE_CUDA_HEADERS)
/* Encodes every step's maps into cp->tmaps (cuTensorMapEncodeTiled, through the driver
   table: an optional symbol; a driver without it fails here, naming the fix). */
int cuda_tmaps_build(CudaProgram *cp, char *err, size_t errlen);
void cuda_tmaps_free(CudaProgram *cp);
/* The step's LoomTmaps bytes, or NULL when it takes none. */
const void *cuda_tmaps_of(const CudaProgram *cp, int f, int s);
#endif

#endif
