/* passes/memory_rank.c — memory per rank of a partitioned, possibly pipelined, program:
 * what `loom plan` ranks layouts by and what `recompute auto` fits a budget with pp.
 *
 * Without pp every rank runs the same functions: its state (every global, as the shard pass
 * left it per rank) plus the largest arena of the functions a training step runs
 * (@grad_step, @optimizer_step; not @forward, the evaluation).  With pp a rank holds only
 * the globals its own functions touch, the largest arena among them, and the stash its
 * schedule keeps at most: what each micro-batch's forward hands to its backward (@fwd.cK's
 * results but the loss) and a zero-bubble B to its W (@bwd_b.cK's), summed in the order
 * the schedule runs them (pipe_stash_peaks, ir/schedule.c: the runner of compiled
 * executables reports it too, and links no passes). */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

static int64_t elem(const Value *v, int target) { return target == TARGET_CUDA ? dtype_size(v->type.dtype) : 4; }

int64_t memory_rank_peak(const Module *m, int target) {
  if (!m->pipe.kind) {
    int64_t state = 0, arena = 0;
    for (int i = 0; i < m->globals.n; i++) {
      const Global *g = m->globals.items[i];
      state += type_numel(&g->value->type) * elem(g->value, target);
    }
    for (int i = 0; i < m->funcs.n; i++) {   /* @forward (evaluation) is not part of a step */
      const Func *f = m->funcs.items[i];
      if (!f->is_kernel && strcmp(f->name, "forward") && f->arena_bytes > arena) arena = f->arena_bytes;
    }
    return state + arena;
  }
  Schedule s;
  char err[256];
  if (schedule_build(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, &s, err, sizeof err))
    return -1;
  int64_t peak[64], fb[256], wb[256], worst = 0;
  pipe_stash_peaks(m, &s, peak, fb, wb);
  /* each function's rank, and each global's bytes on every rank that reads or writes it */
  int np = s.p < 64 ? s.p : 64;
  int64_t state[64] = {0}, arena[64] = {0};
  char *seen = calloc((size_t)m->globals.n * (size_t)np + 1, 1);
  if (!seen) {
    schedule_free(&s);
    return -1;
  }
  for (int fi = 0; fi < m->funcs.n; fi++) {
    const Func *f = m->funcs.items[fi];
    int q = pipe_func_rank(&s, f->name);
    if (q < 0 || q >= np) continue;
    if (f->arena_bytes > arena[q]) arena[q] = f->arena_bytes;
    for (int i = 0; i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++) {
        const Value *v = op->operands[k];
        if (v->kind != VAL_GLOBAL || seen[(size_t)v->global->index * (size_t)np + (size_t)q]) continue;
        seen[(size_t)v->global->index * (size_t)np + (size_t)q] = 1;
        state[q] += type_numel(&v->type) * elem(v, target);
      }
    }
  }
  for (int q = 0; q < np; q++)
    if (state[q] + arena[q] + peak[q] > worst) worst = state[q] + arena[q] + peak[q];
  free(seen);
  schedule_free(&s);
  return worst;
}
