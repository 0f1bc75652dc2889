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

int64_t memory_rank_peak(const Module *m, int target) { return memory_rank_peak_given(m, target, NULL, 0); }

/* Marks global gi as read by rank q (once), adding its bytes to state[q]. */
static void note_global(const Module *m, int gi, int q, int np, char *seen, int64_t *state, int target) {
  if (seen[(size_t)gi * (size_t)np + (size_t)q]) return;
  seen[(size_t)gi * (size_t)np + (size_t)q] = 1;
  const Value *v = ((const Global *)m->globals.items[gi])->value;
  state[q] += type_numel(&v->type) * elem(v, target);
}

int64_t memory_rank_peak_given(const Module *m, int target, const FuncFigures *given, int n_given) {
  if (!m->pipe.kind) {
    int64_t state = 0, arena = 0;
    for (int i = 0; i < m->globals.n; i++) {
      const Global *g = m->globals.items[i];
      state += type_numel(&g->value->type) * elem(g->value, target);
    }
    state += memory_weight_copies_given(m, target, given, n_given);   /* memo-figured functions are not lowered */
    for (int i = 0; i < m->funcs.n; i++) {   /* @forward (evaluation) is not part of a step */
      const Func *f = m->funcs.items[i];
      int64_t a = i < n_given && given[i].given ? given[i].arena_bytes : memory_func_arena(f, target);
      if (!f->is_kernel && strcmp(f->name, "forward") && a > arena) arena = a;
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
    if (f->is_kernel) continue;   /* no rank of its own (pipe_func_rank: -1); its caller reads what it reads */
    int q = pipe_func_rank(&s, f->name);
    if (q < 0 || q >= np) continue;
    if (fi < n_given && given[fi].given) {
      if (given[fi].arena_bytes > arena[q]) arena[q] = given[fi].arena_bytes;
      for (int k = 0; k < given[fi].n_globals; k++) note_global(m, given[fi].globals[k], q, np, seen, state, target);
      continue;
    }
    if (memory_func_arena(f, target) > arena[q]) arena[q] = memory_func_arena(f, target);
    for (int i = 0; i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      for (int k = 0; k < op->n_operands; k++)
        if (op->operands[k]->kind == VAL_GLOBAL) note_global(m, op->operands[k]->global->index, q, np, seen, state, target);
    }
  }
  for (int q = 0; q < np; q++)
    if (state[q] + arena[q] + peak[q] > worst) worst = state[q] + arena[q] + peak[q];
  free(seen);
  schedule_free(&s);
  return worst;
}
