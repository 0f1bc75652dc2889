/* passes/lower_memo.h — lowering each distinct function once: `loom plan` compiles
 * thousands of layouts, and many of their functions are equal (an optimizer step does not
 * change with the micro-batch or the recomputation; a forward chunk is 1f1b's and zb-h1's).
 * The lowering passes (canonicalize .. memory-plan) work function by function and the time
 * model times each function on its own, so a function equal to one lowered before (ir/hash.c)
 * has the figures that one had: a call's time, its arena, the globals it reads once lowered.
 */
#ifndef LOOM_PASSES_LOWER_MEMO_H
#define LOOM_PASSES_LOWER_MEMO_H

#include "passes/passes.h"
#include "passes/timing.h"

typedef struct LowerMemo LowerMemo;

/* One memo serves one hardware description and one set of pass options (target, overlap). */
LowerMemo *lower_memo_new(void);
void lower_memo_free(LowerMemo *memo);

/* m: a training program after its training passes (pipeline and bucket included).  Lowers
   (the pipeline `lowering`, with opt) the functions the memo does not know, then gives
   *step_s and *mem as timing_predict's step_s and memory_rank_peak would for m lowered
   whole.  Threads may share the memo.  m is freed. */
int lower_memo_predict(LowerMemo *memo, Module *m, const char *lowering, const PassOptions *opt, const Hardware *hw,
                       int64_t grad_accum, double *step_s, int64_t *mem, char *err, size_t errlen);

#endif
