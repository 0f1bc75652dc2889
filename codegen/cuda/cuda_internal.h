/* codegen/cuda/cuda_internal.h — what kernel.c and lower.c share (private to codegen/cuda). */
#ifndef LOOM_CODEGEN_CUDA_INTERNAL_H
#define LOOM_CODEGEN_CUDA_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "codegen/text.h"


/* How a fused kernel walks its iteration space. */
typedef enum {
  CK_ELEMENTWISE,   /* no reductions: grid-stride loop over N, 256 threads */
  CK_SERIAL,        /* reductions of <= 32 elements: one thread per output, sequential */
  CK_ROW,           /* innermost dims reduced: one block per output, block reduction */
  CK_COLUMN,        /* innermost dims kept: blocks of 32 x BY threads, 32 outputs each */
} CudaKernelMode;

typedef struct {
  CudaKernelMode mode;
  int64_t N;          /* elements of the space */
  int64_t out_n;      /* reduction outputs (modes with reductions) */
  int64_t count;      /* elements per output */
  uint32_t block[3];
  int64_t work;       /* grid-stride units: elements, outputs or groups of 32 outputs */
  int64_t per_block;  /* units one block covers in one pass */
  /* Split reductions (ROW and COLUMN with few outputs and long reductions): each output's
     reduced range is cut into `split` parts, one block each; the kernel writes the parts'
     results to scratch (after its results: buffer n_args + n_rets), and a second kernel
     (the "finish" body, one thread per output) combines them in order and stores the
     reduction results (its buffers: the scratch, then the reduction results in order). */
  int64_t split;          /* 1: not split */
  int64_t scratch_bytes;  /* of the parts */
  int n_red;              /* reduction results */
  uint32_t fin_block;
  int64_t fin_work;       /* outputs */
} CudaKernelInfo;

/* The body of a fused kernel: the text after "extern \"C\" __global__ void NAME(LoomArgs a)"
   (starting with "{"), and how to launch it; with info->split > 1 also the body of its finish
   kernel in *fin.  Fails naming the op on what is unsupported. */
int cuda_kernel_body(const Func *k, Str *out, Str *fin, CudaKernelInfo *info, char *err, size_t errlen);

/* A float constant as CUDA C text that reads back as the same float. */
void cuda_float_literal(float f, char *buf, size_t n);

#endif
