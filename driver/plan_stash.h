/* driver/plan_stash.h — the fast search's stash bounds (driver/plan_stash.c): a lower bound
 * on a pipelined candidate's screened memory from the stash its schedule holds, learned from
 * the screening compiles (or a small reference compile) per layer program, recomputation,
 * split backward, layers a chunk and micro-batch.  The Stash also owns the estimates'
 * schedules (plan_sim.c), kept with it for the exact phase (Ctx.stash; stash_far_bound and
 * stash_free are in plan_internal.h, for plan.c). */
#ifndef LOOM_DRIVER_PLAN_STASH_H
#define LOOM_DRIVER_PLAN_STASH_H

#include "driver/plan_internal.h"

/* What one screening compile (or reference) showed of a chunk's stash, for one key. */
typedef struct Seen Seen;

/* An empty stash for a model of L layers; NULL when out of memory.  Freed by stash_free. */
Stash *stash_new(int64_t L);
/* The schedules the estimates simulate and the bounds walk (built by the caller). */
SimPlans *stash_plans(Stash *st);
void stash_counts(const Stash *st, int *n_seen, int *n_refs);

/* The callers hold one lock around these three (the fast search's): what c's screening
   compiles at position pos showed (st[0..nl): 1 and 2 layers a chunk); lower bounds on c's
   memory with 1 and 2 layers a chunk (out[0], out[1]) from what was screened before position
   lim and c's reference ref (or NULL), their larger returned (0 where nothing tells); and
   whether nothing screened before lim tells. */
void stash_learn(Stash *st, const Cand *c, int pos, const ChunkStash st2[2], int nl);
double stash_bound(const Stash *st, const Cand *c, int lim, const Seen *ref, double out[2]);
bool stash_lacks(const Stash *st, const Cand *c, int lim);
/* c's reference (2 small compiles, made once a key and micro-batch on the thread that first
   asks; the others wait): NULL when it cannot be made or the model has 6 layers or fewer.
   Takes the stash's own lock, never the caller's: call it without that. */
const Seen *stash_reference(Ctx *x, Stash *st, const Cand *c);

#endif
