/* passes/pipeline_internal.h — what the files of the pipeline pass share (not for other
 * passes).  From the bottom up, each calling only those above it (tests/lint/file_cycles.sh):
 *
 *   pipeline_units.c      each op's phase, unit and chunk; tied accumulates; B/W parts
 *   pipeline_chunks.c     the cut at the chunks' boundaries; @fwd.cK, @bwd.cK (@bwd_b, @bwd_w)
 *   pipeline_optimizer.c  each pp rank's @optimizer_step.sR
 *   pipeline.c            the pass: the steps above in order; its opening comment says what
 *                         the pass makes and how each op finds its chunk
 */
#ifndef LOOM_PIPELINE_INTERNAL_H
#define LOOM_PIPELINE_INTERNAL_H

#include "passes/passes.h"
#include "ir/schedule.h"

/* An op's phase (floating: of parameters and constants only, cloned where used; dead: split
   away), and its part of a backward split into B and W. */
enum { PH_FLOAT, PH_F, PH_B, PH_DEAD };
enum { PART_F, PART_B, PART_W };

/* The pass's state: one walk of @grad_step.  pipeline_units.c fills the per-op and per-value
   tables, pipeline_chunks.c the cuts; the optimizer steps read param and used. */
/* A value's crossing bits at a chunk further than one from its own (pipeline_chunks.c: relays). */
typedef struct {
  int id, c;
  unsigned char bits;
} PipeRelay;

typedef struct {
  Module *m;
  Func *g;
  int n_vals;
  int n_units;        /* layers + 2 */
  int *unit_chunk;    /* [n_units] */
  int C, p, v, kind;
  bool split;         /* B/W split */
  /* per op of @grad_step */
  int *phase, *unit, *part;
  /* per value id */
  int *vphase, *vunit, *reach, *vpart;
  Op **def;
  Value **vval;       /* id -> the value */
  int *vidx;          /* id -> index of its op in @grad_step */
  /* the cuts (cut_all): per value id its chunk and its crossing bits (build_chunk's) for the
     chunks vchunk - 1, vchunk, vchunk + 1; each chunk's values with bits (ids ascending:
     cv_ids[cv_start[c] ..]); each chunk's F, B and W ops (first_op[3c + part], next_op[i]) */
  unsigned char *need3;
  int *vchunk, *cv_start, *cv_ids, *first_op, *next_op;
  PipeRelay *relays;   /* relays' bits beyond vchunk +- 1 */
  int n_relays, cap_relays;
  Value **map_pool;   /* Out's maps (build_chunk): zero between functions */
  const Global **param;   /* global index -> the parameter it is about (param_of), or NULL */
  int *touched, n_touched;
  bool *used;         /* [rank x global]: a chunk function of that rank reads the parameter the
                         global is about (set as build_chunk emits: global_users' answer) */
  int rank, used_ng;  /* the rank of the chunk being built; globals.n when used was made */
  char *err;
  size_t errlen;
} PP;

/* A function being built: a copy of ops of @grad_step (the chunks) or @optimizer_step. */
typedef struct {
  Func *f;
  Value **map;     /* old value id -> value in f */
  PP *pp;
  bool clone;      /* values of @grad_step: floating ops are cloned on use (and map is pp's pool) */
} Out;

/* What every rank's optimizer step shares, from one walk of @optimizer_step: per op the
   parameter it is about (`ab`: its index, -1 none, -2 the gradient norm's chain, -3 an op
   outside the norm that mixes parameters: an error when a rank reaches it), per value the
   same (`about`), and which ops the norm's sqrt depends on (`in_norm`).  The chain: the ops
   the norm depends on that combine several parameters' terms. */
typedef struct {
  int *about, *ab;
  bool *in_norm;
  Value **map;       /* a rank's copies (cleared after each rank) */
  int *dropped_on;   /* value id -> 1 + the rank that dropped it */
} OptPlan;


static inline bool is_arg(const Value *v) { return v->kind == VAL_ARG; }
/* The parameter global gl is about (itself, or X of grad.X / adam_m.X / adam_v.X), or NULL. */
static inline const Global *param_of(const PP *pp, const Global *gl) { return pp->param[gl->index]; }
/* The chunk of op i of @grad_step, and of value v. */
static inline int op_chunk(PP *pp, int i) { return pp->unit_chunk[pp->unit[i]]; }
static inline int val_chunk(PP *pp, const Value *v) { return pp->unit_chunk[pp->vunit[v->id]]; }
/* The pp rank that holds chunk c. */
static inline int chunk_rank(PP *pp, int c) { return schedule_chunk_rank(pp->kind, pp->p, pp->v, c); }

/* pipeline_units.c */
int pipeline_fail(PP *pp, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Phase and unit of every op (the forward's units, reaches, the backward's units). */
int pipeline_classify(PP *pp);
/* The units' FLOPs (forward and backward) and the split: unit_chunk[]. */
int pipeline_split_units(PP *pp, const TrainSettings *ts);
/* Tied parameters: an accumulate of a sum whose terms come from different chunks becomes one
   accumulate per term, each in its term's chunk. */
void pipeline_split_tied_accumulates(PP *pp);
/* id -> value and op index, after every renumbering of @grad_step. */
void pipeline_index_values(PP *pp);
/* Zero-bubble split: the backward's ops into B and W (pp->part). */
void pipeline_split_parts(PP *pp);

/* pipeline_chunks.c */
/* The values each chunk needs from elsewhere, checked for every chunk at once; and its free. */
int pipeline_cut_all(PP *pp);
void pipeline_cut_free(PP *pp);
/* Chunk c's functions: @fwd.cK, then @bwd.cK (or @bwd_b.cK and @bwd_w.cK). */
int pipeline_build_chunk(PP *pp, int c);
/* Value v of the source function in o->f (floating ops cloned on use), or NULL; op copied into o->f. */
Value *pipeline_get(Out *o, Value *v);
void pipeline_emit(Out *o, Op *op);

/* pipeline_optimizer.c */
const Global *pipeline_find_param(Module *m, const Global *gl);
/* used[rank x global]: does a chunk function of that rank read or write the global? */
void pipeline_global_users(PP *pp, bool *used);
int pipeline_opt_plan(PP *pp, Func *opt, OptPlan *pl);
void pipeline_opt_plan_free(OptPlan *op);
/* Rank r's @optimizer_step.sR from its ops of @optimizer_step (mine[0..n_mine)). */
int pipeline_build_optimizer(PP *pp, Func *opt, const OptPlan *pl, const bool *used, int r, const int *mine, int n_mine);

#endif
