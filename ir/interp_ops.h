/* ir/interp_ops.h — the kernels of the reference executor (internal to ir/). */
#ifndef LOOM_INTERP_OPS_H
#define LOOM_INTERP_OPS_H
#include "ir.h"
/* Computes op on inputs `in` into preallocated, zeroed `out` tensors, for one rank: coord (its
   mesh coordinates, or NULL) places vocab-split ops. */
int interp_op_rank(const Op *op, Tensor **in, Tensor **out, const int *coord, char *err, size_t errlen);
/* interp_moe.c: the mixture-of-experts ops (topk .. grouped_matmul_wgrad in ops.def). */
int interp_moe_op(const Op *op, Tensor **in, Tensor **out, char *err, size_t errlen);
#endif
