/* passes/flops.c — the matmul work of each function, counted from the IR: what `loom ir
   --flops` prints and what MFU is measured against (bench/).
 *
 *   matmul          2 * batch * M * N * K
 *   attention       2 products (q·kᵀ, p·v) over every (query, key) pair: 4 * B * H * T * S * Dh
 *   attention_grad  4 products (dp = dout·vᵀ, dv = pᵀ·dout, dq = ds·k, dk = dsᵀ·q): 8 * B*H*T*S*Dh
 *   grouped_matmul(_wgrad)  2 * rows * N * K over the rows routed to experts: a mixture of
 *                   experts' active-parameter FLOPs (each token through its k experts).  Under
 *                   expert parallelism a rank's buffer holds ep x its own rows (the worst case:
 *                   every rank sends it all; with a capacity, E x capacity); balanced routing
 *                   brings it its own count, which the shard pass writes into the op
 *                   (`routed`).  Without it (an IR file from before) the rows are the buffer
 *                   over ep (G groups / the rank's E experts): right when dropless, too few
 *                   with a capacity below ep.
 *
 * Causal attention is counted over the whole T×S square, as the usual model-FLOPs formula
 * does (6N + 12·L·T·D per token, PaLM appendix B), so a training step's count equals that
 * formula when nothing is recomputed; what kernels skip under the mask is their gain.  The
 * recomputation a backward kernel does itself (attention's scores) is not counted: model
 * FLOPs, not hardware FLOPs.  Elementwise work, norms, softmax and the optimizer are not
 * counted either (O(N) or O(tokens·V), about 1% of a step).  Calls are followed into kernel
 * funcs (which hold no matmul today).  On a partitioned module the counts are per rank. */
#include <stdio.h>

#include "passes/passes.h"

static void count(const Func *f, double *mm, double *attn);

static void count_op(const Op *op, double *mm, double *attn) {
  {
    if (op->kind == OP_MATMUL) {
      const Type *a = &op->operands[0]->type, *c = &op->results[0]->type;
      int64_t M = c->dims[c->rank - 2], N = c->dims[c->rank - 1];
      int64_t K = a->dims[a->rank - (op_bool(op, "ta") ? 2 : 1)];
      double batch = M * N != 0 ? (double)type_numel(c) / (double)(M * N) : 0;
      *mm += 2.0 * batch * (double)M * (double)N * (double)K;
    } else if (op->kind == OP_GROUPED_MATMUL || op->kind == OP_GROUPED_MATMUL_WGRAD) {
      bool wg = op->kind == OP_GROUPED_MATMUL_WGRAD;
      const Type *x = &op->operands[0]->type, *b = &op->operands[1]->type, *y = &op->results[0]->type;
      double E = wg ? (double)op_int(op, "experts") : (double)b->dims[0], G = (double)op->operands[2]->type.dims[0];
      int64_t routed = op_int(op, "routed");
      double rows = routed > 0 ? (double)routed : (double)x->dims[0] * (G > 0 ? E / G : 1);
      double N = wg ? (double)x->dims[1] : (double)y->dims[1], K = wg ? (double)b->dims[1] : (double)x->dims[1];
      *mm += 2.0 * rows * N * K;
    } else if (op->kind == OP_ATTENTION_BLOCK || op->kind == OP_ATTENTION_BLOCK_GRAD) {
      /* a ring's block: its Tq x Tk square (over the blocks of every rank, the T x T of
         the whole attention, as attention counts it) */
      bool grad = op->kind == OP_ATTENTION_BLOCK_GRAD;
      const Type *q = &op->operands[grad ? 1 : 0]->type, *k = &op->operands[grad ? 2 : 1]->type;
      double pairs = (double)q->dims[0] * (double)q->dims[2] * (double)q->dims[1] * (double)k->dims[1];
      *attn += (grad ? 8.0 : 4.0) * pairs * (double)q->dims[3];
    } else if (op->kind == OP_ATTENTION || op->kind == OP_ATTENTION_GRAD) {
      bool grad = op->kind == OP_ATTENTION_GRAD;
      const Type *q = &op->operands[grad ? 1 : 0]->type, *k = &op->operands[grad ? 2 : 1]->type;
      double pairs = (double)q->dims[0] * (double)q->dims[2] * (double)q->dims[1] * (double)k->dims[1];
      *attn += (grad ? 8.0 : 4.0) * pairs * (double)q->dims[3];
    } else if (op->kind == OP_CALL && op->callee) {
      count(op->callee, mm, attn);
    }
  }
}

static void count(const Func *f, double *mm, double *attn) {
  for (int i = 0; i < f->ops.n; i++) count_op(f->ops.items[i], mm, attn);
}

double flops_op(const Op *op) {
  double mm = 0, at = 0;
  count_op(op, &mm, &at);
  return mm + at;
}

void flops_of(const Func *f, double *matmul, double *attention) {
  *matmul = *attention = 0;
  count(f, matmul, attention);
}

void flops_report(FILE *out, const Module *m) {
  int64_t world = mesh_world(&m->mesh);
  fprintf(out, "model FLOPs per call%s (matmuls 2·M·N·K; attention over the full T×S square; "
          "elementwise work not counted):\n", world > 1 ? ", per rank" : "");
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    double mm, at;
    flops_of(f, &mm, &at);
    if (mm + at == 0) continue;
    fprintf(out, "  @%-16s %18.0f FLOP  (%.4g TFLOP: matmul %.4g, attention %.4g)\n", f->name, mm + at,
            (mm + at) * 1e-12, mm * 1e-12, at * 1e-12);
  }
}
