/* driver/plan_fast.c — the fast screening of `loom plan` (driver/plan.h): its cost grows with
 * the distinct layer programs, not with the candidates.
 *
 * A candidate's step is a sum over a few kinds of program: its layers (one kind per tp, cp,
 * sequence parallelism and ep), the embedding and head, the optimizer step and the dp
 * collectives.  Each layer program is compiled once (a reference: dp = 2, whatever the
 * candidate's; pp = 1, ZeRO 0, one and two sequences a rank, nothing recomputed, 1 and 2
 * layers, lowered whole) and every candidate estimated from its reference:
 *   - a layer's forward and backward per micro-batch: the reference's time a layer x the
 *     micro-batch, x 4/3 with full recomputation (the forward again), x 1.1 selective;
 *   - pp: the schedule (ir/schedule.c) simulated with those chunk costs (forward a third,
 *     backward two, split 0.6 : 0.4 into B and W for zb-h1 and dualpipev; the head on the last
 *     chunk; dualpipev's chunks split as the pipeline pass splits the screening's 1 and 2
 *     layers a chunk, extrapolated as the screening does): its makespan holds the bubble, no
 *     compile needed; each chunk's forward and backward also send a micro-batch's
 *     activations to the next pp rank;
 *   - dp and ZeRO: each program profiled once per ZeRO stage the candidates use (compiled at
 *     dp = 2 with two micro-batches): the dp collectives of its @grad_step and @optimizer_step
 *     (how many, their bytes), re-timed at the candidate's dp over the link dp spans as the
 *     time model times them (a ring, every collective paying its steps' latency: ZeRO's one
 *     collective a tensor makes the latencies most of the optimizer step at hundreds of dp
 *     ranks), and the update split over dp with ZeRO;
 *   - memory: the reference's state a layer (split as ZeRO splits it) and its activations a
 *     layer x the micro-batch x the micro-batches pp holds in flight.
 * The estimates order the candidates; they are never printed.  The candidates are then
 * screened (compiled with 1 and 2 layers a chunk, the exhaustive search's figures, and
 * stopped after the first where the exhaustive search's pruning would stop them, bounded
 * then by the larger of its bound and the estimate's) in one pass in the order of their
 * estimates (a recomputing candidate after its layout without recomputation, whose outcome
 * it waits for), until the next one's estimate, less a margin (10%), is above the 2 x
 * top-th best screened step that fits; the rest stay "pruned" at that bound (and the exact
 * phase screens one if it reaches it after all, as the exhaustive search does, several at
 * once on the threads).
 * Recomputation where the layout fits without it, and a micro-batch twice one screened far
 * out of memory, are skipped as the exhaustive search skips them.  So the table is the
 * exhaustive search's wherever the estimates are within the margin of the screened figures;
 * LOOM_PLAN_CHECK=1 runs both searches and compares their tables.
 * Memory, bounded: a pipelined candidate about to be screened is set aside without a compile
 * where a lower bound on its screened memory is past "far" (1.5 x the device, where the
 * exact phase never takes one): the stash its schedule holds (pipe_stash_peaks' walk) with
 * each chunk's stash as the screening compiles (or a small reference) showed it for its
 * layer program, recomputation, split backward and micro-batch (plan_stash.c); after
 * its first compile, m1 + k (that bound on m2 - m1); and in the exact phase, before a
 * pruned candidate is screened in full.  Every such bound is a true lower bound
 * (LOOM_PLAN_CHECK screens each candidate so set aside and aborts if one is over).
 *
 * Where it stands (2026-11-28, fifth session).  The stash bounds above: Llama-3.1-405B on
 * 16,384 at 16M tokens (--top 1) was 1,454 compiles, 401 of its 425 screened candidates far
 * out of memory; now about 280 are set aside at their stash bound without a compile (about
 * 75 references of 2 small compiles each: a 3-rank pipeline of 3 and 6 layers, made only
 * where the candidate's memory estimate does not fit), many more after their first compile
 * or before the exact phase screens them: 1,142 compiles, 9.1-9.9 s of CPU against the code
 * before's 28.6-28.8 s, run alternately on the loaded 2-core machine (load 4-6; quiet it was
 * 24.15 s of CPU, 13.84 s wall), the same best layout.  Measured at 405B: the stash is most
 * of a far candidate's memory (dp=64 tp=8+sp cp=2 pp=16 zb-h1 mbs=1: state 5 and 8 GiB,
 * arena 2.5 and 3.6, stash 42 and 76 of the 1- and 2-layer compiles, 311 screened); the
 * screening compiles of dualpipev and zb-h1, ZeRO 0 and 1, dp 64 and 128, pp 8 and 16 showed
 * the same stash bytes a chunk for the same key.  The dp = 1 references first made showed
 * another (1.45 GiB an interior chunk at 2 layers with sp, against 3.64: dp = 1 with sp is
 * another program, as figures_at says), a lower figure there, but so the stash is keyed by
 * dp = 1 or not and references are made at dp = 2.  LOOM_PLAN_CHECK at 405B (its fast half)
 * held all 286 bounds it met under their screened memory.  Also: dp = 1's layer figures
 * with sequence parallelism came out with a negative part a sequence, so about 480
 * candidates at Llama-3-70B had chunks costing less than nothing and an infinite estimate,
 * never screened though one might win; dp = 2's figures stand in for them (none below 0 left
 * at 70B; a chunk is held at 0 at least).  Llama-3-70B on 4,096 at 4M: --top 1 986 compiles
 * and 5.9 s of CPU (before: 1,033, 8.5 s), --top 3 1,273 (1,361), the same top 3.  What is
 * left: compile cost (the pipeline pass, func_number, module_clone) is now most of the plan;
 * the 2-layer-a-chunk compiles of far candidates whose stash is not most of their memory
 * (zb-h1 with selective recomputation) are still made.  Quiet, after merging
 * (bench/plan_speed.sh, --top 3, median of 3): 405B 5.60 s wall, 70B 2.80 s, Llama-1B 0.17 s:
 * issue 34's targets (10, 5, 0.5 s) met.  The stash bounds (stash_*) are in plan_stash.c
 * since (the same day), with their callers here and in plan.c as they were.
 * Then (sixth session): dp = 1 with sp was another program because the shard pass kept a
 * batch of one's [1,T,D] -> [T,D] flattening sequence-split, so the weight gradients were
 * partial sums of whole weights (docs/planning.md); fixed there (shard_tp.c), dp = 1's
 * figures and stash are dp = 2's, both workarounds above are gone, and dp = 1's references
 * are no longer compiled (70B --top 3: 1,273 -> 1,197 compiles, the same table).
 *
 * The sessions before (2026-11-28, second to fourth): docs/planning.md, "The fast
 * search's history".
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/plan_internal.h"
#include "driver/plan_stash.h"
#include "ir/schedule.h"

/* The margins: a candidate is screened when its estimated step x (1 - STEP_MARGIN) is not
   above the threshold (the estimates at scale are at most 8% over the screened steps), and set aside as far out of memory only when its estimated memory x
   MEM_MARGIN is above 1.5 x the device (as the exact phase judges "far"). */
#define STEP_MARGIN 0.10
#define MEM_MARGIN 0.4
/* The part of a layer's activations (as held without recomputation) that a chunk holds
   from its B to its W with full recomputation (zb-h1, dualpipev).  Measured (Llama-3-70B on
   4,096, 405B on 16,384): without it these estimates were 0.09-0.78 of the screened memory;
   with 1 they are 0.42-2.04 at 70B but 0.52-6.96 at 405B (dp=16 tp=8 cp=8 pp=16 dualpipev
   mbs=2 ga=64: 780 GiB estimated, 112 screened, where the schedule defers 64 chunks' W), past
   MEM_MARGIN's 2.5; with a quarter every measured one is within it (the estimate is convex
   in this: at most 0.98 at 70B, 2.15 at 405B).  Selective recomputation is left out: its estimates are already
   0.3-3.5 of the screened memory at 405B. */
#define W_HOLD 0.25

/* A layer program's figures at one dp, each linear in the layers (per layer "l", the rest
   "b") and in the sequences a micro-batch holds (a fixed part a, a part b a sequence). */
typedef struct {
  bool ok;
  double g_la, g_lb, g_ba, g_bb;   /* @grad_step, one micro-batch */
  double o_l, o_b;                 /* @optimizer_step */
  double s_l, s_b;                 /* state bytes */
  double a_la, a_lb, a_ba, a_bb;   /* the largest arena */
} Figures;

/* The dp collectives of a program at one ZeRO stage (compiled at dp = 2 with 2 micro-batches,
   so that ZeRO-0/1 reduce in @optimizer_step as they do with pp or gradient accumulation):
   per function (@grad_step, @optimizer_step) and kind (all_reduce, reduce_scatter,
   all_gather), how many and their bytes (a rank's buffer, as the time model counts it: the
   same at every dp), a layer's ("l") and the rest ("b"); and @optimizer_step's own time
   without them (the update, at dp = 2).  The time model runs them one after another, each
   a ring whose steps cost the link's latency: with ZeRO's one collective a tensor, at
   hundreds of dp ranks the latencies are most of the step, so they are counted, not
   guessed. */
enum { DPC_AR, DPC_RS, DPC_AG, DPC_KINDS };
typedef struct {
  bool ok;
  double n_l[2][DPC_KINDS], n_b[2][DPC_KINDS], by_l[2][DPC_KINDS], by_b[2][DPC_KINDS];   /* [grad_step, optimizer_step] */
  double u_l, u_b;   /* the update at dp = 2 */
} DpComm;

typedef struct {
  int64_t tp, cp, ep;
  bool sp;
  Figures f;       /* at dp = 2, for every dp (figures_at) */
  bool need_z[4];  /* ZeRO stages the candidates use (dp > 1) */
  DpComm z[4];
} LayerProg;

typedef struct {
  LayerProg *p;
  int n, cap;
} Programs;

static LayerProg *program_of(Programs *ps, const Cand *c) {
  for (int i = 0; i < ps->n; i++) {
    LayerProg *p = &ps->p[i];
    if (p->tp == c->tp && p->cp == c->cp && p->ep == c->ep && p->sp == c->sp) return p;
  }
  return NULL;
}

/* The reference compiles of p at dp = 2: ZeRO 0, nothing recomputed, no pp, one
   micro-batch of 1 and of 2 sequences a rank, 1 and 2 layers, lowered whole. */
static void compile_figures(Ctx *x, const LayerProg *p, Figures *f, int64_t L) {
  int64_t dp = 2;
  int nl = L >= 2 ? 2 : 1;
  double g[2][2], o[2][2], st[2][2], ar[2][2];   /* [layers - 1][sequences - 1] */
  f->ok = true;
  for (int n = 0; n < nl && f->ok; n++)
    for (int q = 0; q < 2 && f->ok; q++) {
      Cand ref = {.dp = dp, .tp = p->tp, .cp = p->cp, .pp = 1, .v = 1, .ep = p->ep, .zero = 0, .sched = PIPE_NONE,
                  .rc = RECOMPUTE_NONE, .sp = p->sp, .batch = (q + 1) * dp * p->ep, .ga = 1};
      StepTime t;
      int64_t mem, s = 0, a = 0;
      Module *m = NULL;
      bool counted = false;
      char err[IR_ERR_LEN];
      f->ok = !compile_one(x, &ref, n + 1, &t, &mem, &m, err, sizeof err, &counted);
      if (counted) count_compile(x);
      if (f->ok) memory_planned_peak(m, x->target, &s, &a);
      module_free(m);
      /* @grad_step's busy time (its ops' own, no waits: affine in the layers, the sequences and
         dp) and its tp, cp and ep collectives (blocking: waited for in full); dp's gradient
         reduction, which the backward hides in part, is added by estimate() */
      double waits = t.exposed_comm_s, own = t.comm_s[AX_TP] + t.comm_s[AX_CP] + t.comm_s[AX_EP];
      g[n][q] = t.step_s - t.optimizer_s - waits + own, o[n][q] = t.optimizer_s;
      st[n][q] = (double)s, ar[n][q] = (double)a;
    }
  if (!f->ok) return;
  if (nl == 1)   /* one layer: all of it "per layer" */
    for (int q = 0; q < 2; q++) g[1][q] = 2 * g[0][q], o[1][q] = 2 * o[0][q], st[1][q] = 2 * st[0][q], ar[1][q] = 2 * ar[0][q];
  /* per layer and the rest, each as a fixed part and a part a sequence */
  double gl1 = g[1][0] - g[0][0], gl2 = g[1][1] - g[0][1], gb1 = g[0][0] - gl1, gb2 = g[0][1] - gl2;
  f->g_lb = gl2 - gl1, f->g_la = gl1 - f->g_lb, f->g_bb = gb2 - gb1, f->g_ba = gb1 - f->g_bb;
  f->o_l = o[1][0] - o[0][0], f->o_b = o[0][0] - f->o_l;
  f->s_l = st[1][0] - st[0][0], f->s_b = st[0][0] - f->s_l;
  double al1 = ar[1][0] - ar[0][0], al2 = ar[1][1] - ar[0][1], ab1 = ar[0][0] - al1, ab2 = ar[0][1] - al2;
  f->a_lb = al2 - al1, f->a_la = al1 - f->a_lb, f->a_bb = ab2 - ab1, f->a_ba = ab1 - f->a_bb;
}

/* Adds m's dp collectives in @grad_step and @optimizer_step to n[func][kind], by[func][kind]. */
static void dp_collectives(const Module *m, double n[2][DPC_KINDS], double by[2][DPC_KINDS]) {
  static const char *const kinds[DPC_KINDS] = {"all_reduce", "reduce_scatter", "all_gather"};
  for (int fi = 0; fi < 2; fi++) {
    const Func *f = module_find_func(m, fi ? "optimizer_step" : "grad_step");
    for (int i = 0; f && i < f->ops.n; i++) {
      const Op *op = f->ops.items[i];
      const Attr *ax = op_attr(op, "axis");
      if (op_info(op->kind)->cls != CLASS_COLLECTIVE || !ax || mesh_axis_parse(ax->s) != AX_DP) continue;
      const char *name = op_info(op->kind)->name;
      int k = 0;
      while (k < DPC_KINDS && strncmp(name, kinds[k], strlen(kinds[k]))) k++;
      if (k == DPC_KINDS || strstr(name, "wait")) continue;
      double b = 0;   /* the larger of its operands and results, as timing.c counts it */
      for (int j = 0; j < op->n_operands; j++) {
        const Value *v = op->operands[j];
        double vb = (double)type_numel(&v->type) * (double)dtype_size(v->type.dtype);
        b = vb > b ? vb : b;
      }
      for (int j = 0; j < op->n_results; j++) {
        const Value *v = op->results[j];
        double vb = (double)type_numel(&v->type) * (double)dtype_size(v->type.dtype);
        b = vb > b ? vb : b;
      }
      n[fi][k] += 1, by[fi][k] += b;
    }
  }
}

/* The dp time of n collectives of kind k holding `bytes` in all, over dp ranks (ring, as
   timing_collective: every collective pays its steps' latency). */
static double dp_time(int k, double n, double bytes, int64_t dp, double beta, double alpha) {
  if (dp <= 1 || n <= 0) return 0;
  double steps = (double)(dp - 1) * (k == DPC_AR ? 2 : 1);
  return steps * (n * alpha + bytes / (double)dp / beta);
}

/* p's dp collectives at ZeRO stage z (see DpComm): compiled with 1 and 2 layers at dp = 2. */
static void compile_dp_comm(Ctx *x, const LayerProg *p, int z, DpComm *d, int64_t L) {
  int nl = L >= 2 ? 2 : 1;
  double n[2][2][DPC_KINDS] = {{{0}}}, by[2][2][DPC_KINDS] = {{{0}}}, u[2] = {0, 0};
  d->ok = true;
  for (int l = 0; l < nl && d->ok; l++) {
    Cand ref = {.dp = 2, .tp = p->tp, .cp = p->cp, .pp = 1, .v = 1, .ep = p->ep, .zero = z, .sched = PIPE_NONE,
                .rc = RECOMPUTE_NONE, .sp = p->sp, .batch = 2 * p->ep, .ga = 2};
    StepTime t;
    int64_t mem;
    Module *m = NULL;
    bool counted = false;
    char err[IR_ERR_LEN];
    d->ok = !compile_one(x, &ref, l + 1, &t, &mem, &m, err, sizeof err, &counted);
    if (counted) count_compile(x);
    if (d->ok) {
      dp_collectives(m, n[l], by[l]);
      Mesh mesh = m->mesh;
      const Hardware *hw = x->hw;
      int link = timing_axis_link(hw, &mesh, AX_DP);
      double comm = 0;
      for (int k = 0; k < DPC_KINDS; k++) comm += dp_time(k, n[l][1][k], by[l][1][k], 2, hw->link_bw[link] * hw->eff_link, hw->link_lat[link]);
      u[l] = t.optimizer_s - comm > 0 ? t.optimizer_s - comm : 0;
    }
    module_free(m);
  }
  if (!d->ok) return;
  if (nl == 1) {   /* one layer: all of it "per layer" */
    for (int f = 0; f < 2; f++)
      for (int k = 0; k < DPC_KINDS; k++) n[1][f][k] = 2 * n[0][f][k], by[1][f][k] = 2 * by[0][f][k];
    u[1] = 2 * u[0];
  }
  for (int f = 0; f < 2; f++)
    for (int k = 0; k < DPC_KINDS; k++) {
      d->n_l[f][k] = n[1][f][k] - n[0][f][k], d->n_b[f][k] = n[0][f][k] - d->n_l[f][k];
      d->by_l[f][k] = by[1][f][k] - by[0][f][k], d->by_b[f][k] = by[0][f][k] - d->by_l[f][k];
    }
  d->u_l = u[1] - u[0], d->u_b = u[0] - d->u_l;
}

typedef struct {
  Ctx *x;
  Programs *ps;
  int64_t L;
  int n, next;
  pthread_mutex_t lock;
  PlanProgress progress;   /* reference jobs started of n (plan_internal.h) */
} RefJobs;

static void *ref_worker(void *arg) {
  RefJobs *r = arg;
  for (;;) {
    pthread_mutex_lock(&r->lock);
    int j = r->next++;
    if (j < r->n)
      plan_progress_say(&r->progress, now_s(), "loom plan: compiling the layer programs' references: %d of %d (%d compiles)",
                        j, r->n, r->x->compiles);
    pthread_mutex_unlock(&r->lock);
    if (j >= r->n) break;
    LayerProg *p = &r->ps->p[j / 5];
    int k = j % 5;
    if (k == 0) compile_figures(r->x, p, &p->f, r->L);
    if (k >= 1 && p->need_z[k - 1]) compile_dp_comm(r->x, p, k - 1, &p->z[k - 1], r->L);
  }
  return NULL;
}

/* The figures at any dp: dp = 2's.  A layer's ops no longer grow with dp (canonicalize
   rewrites shard_slice(broadcast(x)) into a broadcast to the rank's part): at Llama-3-70B
   the references at dp = 4 gave dp = 2's figures to 0.01%, so they are not compiled.
   dp = 1's were, until its references with sequence parallelism turned out another
   program: a negative part a sequence (Llama-3-70B on 4,096, tp=8+sp cp=16: -0.0027 s a
   layer against dp = 2's 0.0010), the reference of one sequence having its weight
   gradients contracted over the tokens, whole and all-reduced.  The shard pass now
   partitions a batch of one as any batch (shard_tp.c's reshape rule), and at 70B dp = 1's
   figures came out dp = 2's (state and arenas to the byte, the step's rest within 1-2 us),
   so they are no longer compiled either (70B: 76 compiles fewer, the same table). */
static bool figures_at(const LayerProg *p, int64_t dp, Figures *out) {
  (void)dp;
  *out = p->f;
  return out->ok;
}

/* The layers of each of C chunks when the pipeline pass splits Lm layers (its split,
   pipeline_chunk_starts: the largest chunk's FLOPs made least, the head, of `head` layers' FLOPs, on
   the last chunk, the later start on ties), in n[0..C).  The screening compiles 1 and 2
   layers a chunk and extrapolates: where the head weighs more than a layer, those splits are
   uneven, and the screened step with them; the estimate mirrors it. */
static void chunk_split(int C, int Lm, double head, int *n) {
  double *one = malloc(sizeof(double) * (size_t)(Lm > 0 ? Lm : 1));
  int *start = malloc(sizeof(int) * (size_t)(C > 0 ? C : 1));
  for (int l = 0; one && l < Lm; l++) one[l] = 1;
  if (one && start && !pipeline_chunk_starts(C, Lm, one, 0, head, start))
    for (int c = 0; c < C; c++) n[c] = (c + 1 < C ? start[c + 1] : Lm) - start[c];
  else   /* out of memory: even */
    for (int c = 0; c < C; c++) n[c] = Lm / C + (c < Lm % C);
  free(one), free(start);
}

/* The splits chunk_split gives, kept: few distinct (chunks, layers) pairs, many candidates. */
typedef struct {
  int C, Lm;
  int *n;
} Split;
static Split splits[64];
static int n_splits;
static pthread_mutex_t splits_lock = PTHREAD_MUTEX_INITIALIZER;
static const int *split_of(int C, int Lm, double head) {
  pthread_mutex_lock(&splits_lock);
  const int *r = NULL;
  for (int i = 0; i < n_splits && !r; i++)
    if (splits[i].C == C && splits[i].Lm == Lm) r = splits[i].n;
  if (!r && n_splits < 64 && (splits[n_splits].n = malloc(sizeof(int) * (size_t)C))) {
    chunk_split(C, Lm, head, splits[n_splits].n);
    splits[n_splits].C = C, splits[n_splits].Lm = Lm;
    r = splits[n_splits++].n;
  }
  pthread_mutex_unlock(&splits_lock);
  return r;
}

/* The activations a pp rank holds at its peak, in chunks' worth of a micro-batch's
   activations without recomputation, walking each rank's actions in order as
   schedule_simulate runs them (plan_sim.c keeps it per schedule, SimPlan.held): a chunk
   whose forward ran and backward (B) did not holds RCM of them; with the backward split
   (zb-h1, dualpipev) and recomputation, one whose B ran and W did not holds W of them (B
   recomputes the forward, and W needs the recomputed inputs of the layers' matmuls).
   Without the split (or W = 0) this is RCM x the simulation's peak_f.  Per RecomputeMode: */
static const double RCM[3] = {1.0, 0.7, 0.15}, WH[3] = {0, 0, W_HOLD};

/* The estimated step and memory of c from its layer program's figures at its dp. */
static void estimate(const Ctx *x, const PlanRequest *rq, const SimPlans *plans, const Figures *p, const DpComm *dc,
                     Cand *c) {
  const Hardware *hw = x->hw;
  int64_t L = rq->base->model.n_layer, mbs = c->batch / (c->dp * c->ep);
  double rcf = c->rc == RECOMPUTE_FULL ? 4.0 / 3.0 : c->rc == RECOMPUTE_SELECTIVE ? 1.1 : 1.0;
  double rcm = RCM[c->rc];
  double q = (double)mbs, dp = (double)c->dp;
  double layer = (p->g_la + p->g_lb * q) * rcf, base = p->g_ba + p->g_bb * q;
  double n_stage = (double)L / (double)c->pp;
  double zshare = c->zero == 0 ? 1 : 1 / dp;   /* the optimizer's update: over the rank's share with ZeRO */
  double opt = (p->o_b + n_stage * p->o_l) * zshare;
  /* dp's collectives, from the program's profile at this ZeRO stage (DpComm): those of
     @optimizer_step (once a step) and of @grad_step (every micro-batch), over the link dp
     spans; the slowest pp stage holds its layers and the embedding or the head (about half
     the rest) */
  bool counted = dc && dc->ok && c->dp > 1;
  double comm_g = 0, comm_o = 0, comm_ar = 0;
  if (counted) {
    Mesh mesh = {0};
    for (int a = 0; a < AX_COUNT; a++) mesh.size[a] = 1;
    mesh.size[AX_DP] = c->dp, mesh.size[AX_TP] = c->tp, mesh.size[AX_CP] = c->cp, mesh.size[AX_PP] = c->pp;
    mesh.size[AX_EP] = c->ep;
    int link = timing_axis_link(hw, &mesh, AX_DP);
    double beta = hw->link_bw[link] * hw->eff_link, alpha = hw->link_lat[link], sb = c->pp > 1 ? 0.5 : 1;
    for (int k = 0; k < DPC_KINDS; k++) {
      comm_g += dp_time(k, dc->n_b[0][k] * sb + n_stage * dc->n_l[0][k], dc->by_b[0][k] * sb + n_stage * dc->by_l[0][k],
                        c->dp, beta, alpha);
      double o = dp_time(k, dc->n_b[1][k] * sb + n_stage * dc->n_l[1][k], dc->by_b[1][k] * sb + n_stage * dc->by_l[1][k],
                         c->dp, beta, alpha);
      comm_o += o;
      if (k == DPC_AR) comm_ar = o;
    }
    opt = (dc->u_b * sb + n_stage * dc->u_l) * (c->zero ? 2 / dp : 1) + comm_o;
  }
  double step = INFINITY, inflight = 1;
  if (c->pp > 1) {
    int chunks = (int)(c->pp * c->v);
    /* a chunk's activations (its forward) and their gradients (its backward) go to the
       next pp rank: a micro-batch's tokens of this cp rank (sp: of this tp rank) x hidden */
    Mesh mesh = {0};
    for (int a = 0; a < AX_COUNT; a++) mesh.size[a] = 1;
    mesh.size[AX_DP] = c->dp, mesh.size[AX_TP] = c->tp, mesh.size[AX_CP] = c->cp, mesh.size[AX_PP] = c->pp;
    int link = timing_axis_link(hw, &mesh, AX_PP);
    double bytes = (double)mbs * (double)rq->base->seq / (double)c->cp / (c->sp ? (double)c->tp : 1) *
                   (double)rq->base->model.hidden * (strcmp(rq->base->precision, "bf16") ? 4 : 2);
    double p2p = timing_collective(OP_SEND, 2, bytes, hw->link_bw[link] * hw->eff_link, hw->link_lat[link]);
    /* the screening's layers a chunk (screen_layers): 1 and 2, extrapolated, or the model */
    int64_t ls[2];
    int nl = screen_layers(c, L, ls);
    double ms[2] = {0, 0};
    double head = x->layer_flops > 0 ? (x->seq_flops - (double)L * x->layer_flops) / x->layer_flops : 1;
    const SimPlan *s = chunks <= 256 ? sim_plan_find(plans, c->sched, (int)c->pp, (int)c->v, (int)c->ga) : NULL;
    bool ok = s && s->ok;
    double *end = ok ? malloc(sizeof(double) * ((size_t)s->n + 1)) : NULL;
    ok = ok && end;
    for (int j = 0; ok && j < nl; j++) {
      /* the split mirrored for dualpipev only: it brings dualpipev's estimates from 0.68-1.03
         to 0.82-1.07 of their screened steps at Llama-3-70B on 4,096, but takes 1f1b and
         zb-h1 from 0.96-1.02 and 0.81-1.05 down to 0.69-0.92 and 0.75-1.05, and interleaved
         over (1.07-1.09), where a candidate could be set aside wrongly */
      const int *split = c->sched == PIPE_DUALPIPEV ? split_of(chunks, (int)ls[j], head) : NULL;
      double (*cost)[3] = calloc((size_t)chunks, sizeof *cost);
      ok = cost && (split || c->sched != PIPE_DUALPIPEV);
      for (int k = 0; ok && k < chunks; k++) {
        double t = (split ? split[k] : (double)ls[j] / chunks) * layer + (k == chunks - 1 ? base + comm_g : 0);
        /* the figures are affine in the sequences and the layers, and their fixed parts
           can come out below 0 (2 sequences' time over twice 1's, 2 layers' over twice 1's):
           a chunk of few layers could then cost less than nothing, which the simulation
           refuses, and the candidate's estimate was infinite: set aside for good though it
           might win (about 480 at Llama-3-70B on 4,096).  No chunk costs less than 0 (an
           estimate under its step only screens it sooner) */
        if (t < 0) t = 0;
        double fw = t / 3 / rcf, bw = t - fw;   /* a forward is a third of a step's FLOPs */
        fw += k < chunks - 1 ? p2p : 0, bw += k > 0 ? p2p : 0;
        cost[k][ACT_F] = fw;
        /* zb-h1 and dualpipev split the backward: the input gradients (B) take more of it
           than the weights' (W) */
        cost[k][ACT_B] = s->split_bw ? bw * 0.6 : bw;
        cost[k][ACT_W] = s->split_bw ? bw * 0.4 : 0;
      }
      if (ok) {
        ms[j] = sim_plan_makespan(s, (const double (*)[3])cost, end);
        ok = ms[j] >= 0;   /* schedule_simulate would refuse it (a cost below 0) */
        if (ok) inflight = s->held[c->rc] / (double)c->v;   /* stages' worth */
      }
      free(cost);
    }
    free(end);
    if (ok) step = (nl == 1 ? ms[0] : ms[0] + ((double)L / (double)chunks - 1) * (ms[1] - ms[0])) + opt;
  } else {
    step = (double)c->ga * (base + (double)L * layer) + opt;
  }
  if (counted && c->pp == 1) {
    /* @grad_step's, every micro-batch: ZeRO-2/3's reduce-scatters (and ZeRO-3's gathers)
       run beside the backward, which hides up to about its two thirds; ZeRO-0 with one
       micro-batch reduces in the backward too (its profile, at two, in the step) */
    double hidden = (2.0 / 3.0) * (base + (double)L * layer);
    if (c->zero == 0 && c->ga == 1) step += comm_ar > hidden ? comm_ar - hidden : 0, step -= comm_ar, step += comm_g;
    else if (c->zero >= 2) step += (double)c->ga * (comm_g > hidden ? comm_g - hidden : 0);
    else step += (double)c->ga * comm_g;
  }
  /* dp without a profile: the gradients (4 bytes a parameter: the state's quarter) reduced
     over dp once a step, over the link dp spans; the last micro-batch's backward hides some */
  if (c->dp > 1 && !counted) {
    Mesh mesh = {0};
    for (int a = 0; a < AX_COUNT; a++) mesh.size[a] = 1;
    mesh.size[AX_DP] = c->dp, mesh.size[AX_TP] = c->tp, mesh.size[AX_CP] = c->cp, mesh.size[AX_PP] = c->pp;
    mesh.size[AX_EP] = c->ep;
    int link = timing_axis_link(hw, &mesh, AX_DP);
    double grads = (p->s_b + (double)L * p->s_l) / 4 / (double)c->pp;
    double comm = timing_collective(OP_ALL_REDUCE, c->dp, grads, hw->link_bw[link] * hw->eff_link, hw->link_lat[link]);
    /* without ZeRO or pp the reduction starts during the last backward; with them it is the
       optimizer step's (ZeRO: a reduce-scatter and an all-gather, as much traffic) */
    double hidden = c->zero == 0 && c->pp == 1 ? (2.0 / 3.0) * (base + n_stage * layer) : 0;
    step += comm > hidden ? comm - hidden : 0;
  }
  c->est_s = step;
  if (getenv("LOOM_PLAN_DEBUG") && atoi(getenv("LOOM_PLAN_DEBUG")) >= 2) {
    char lay[160];
    plan_layout_text(c, lay, sizeof lay);
    fprintf(stderr, "estimate %s: layer %.4g ms (g_la %.4g g_lb %.4g), base %.4g ms, opt %.4g ms, step %.4g ms\n", lay,
            layer * 1e3, p->g_la * 1e3, p->g_lb * 1e3, base * 1e3, opt * 1e3, step * 1e3);
  }
  /* memory: state split as ZeRO splits it (of 16 bytes a parameter: 4 the weights, 4 the
     gradients, 8 the optimizer's moments), a stage's activations for the micro-batches in
     flight, the rest of the arena once */
  double state = (p->s_b + (double)L * p->s_l) / (double)c->pp;
  double share = c->zero == 0 ? 1 : c->zero == 1 ? (8 + 8 / dp) / 16 : c->zero == 2 ? (4 + 12 / dp) / 16 : 1 / dp;
  double act = n_stage * (p->a_la + p->a_lb * q) * (c->pp > 1 ? 1 : rcm) * inflight + (p->a_ba + p->a_bb * q);
  c->est_mem = state * share + act;
  if (getenv("LOOM_PLAN_DEBUG") && atoi(getenv("LOOM_PLAN_DEBUG")) >= 2) {
    char lay[160];
    plan_layout_text(c, lay, sizeof lay);
    fprintf(stderr, "memory %s: state %.3g GiB x %.3g, a layer %.3g GiB (a_la %.3g a_lb %.3g) x %.3g layers x %.3g in flight, rest %.3g\n",
            lay, state / 1073741824.0, share, (p->a_la + p->a_lb * q) / 1073741824.0, p->a_la / 1073741824.0, p->a_lb / 1073741824.0, n_stage, inflight,
            (p->a_ba + p->a_bb * q) / 1073741824.0);
  }
}


/* ---- screening the candidates the estimates leave, in their order ----
   Deterministic, whatever the threads' timing: what a candidate's screening decides (set
   aside, skipped, pruned after its first compile) reads only candidates before it in the
   order whose outcome is final, waited for where needed:
   - the threshold for the candidate at position k is that of the first k - LAG positions'
     screened figures (thr_at[k - LAG]): the threads take positions in order and wait until
     those are final (LAG > the threads at work rarely waits);
   - its layout without recomputation (always before it) and its half micro-batch (when
     before it; ignored when after) are waited for. */
enum { LAG = 8 };
typedef struct {
  Ctx *x;
  const PlanRequest *rq;
  Cand *cs;
  const int *order;   /* by estimated step */
  int *pos;           /* pos[order[k]] = k */
  int n, next;
  const int *none;    /* the same layout without recomputation (plan_screen.c's siblings), or -1 */
  const int *half;    /* the same layout with half the micro-batch, or -1 */
  bool *bad, *skip, *far;
  bool *aside;        /* set aside at its stash bound (stash_aside) */
  bool *done;         /* screened (its figures final) */
  bool *final;        /* taken and finished, whatever came of it (later ones wait for it) */
  pthread_cond_t finished;
  char (*why)[IR_ERR_LEN];
  pthread_mutex_t lock;
  /* the keep best screened steps that fit among the first `prefix` positions (all final),
     ascending, and thr_at[k]: the threshold those of the first k positions give (the
     keep-th best, or infinity) */
  double *best, *thr_at;
  int keep, n_best, prefix, screened, pruned, skipped;
  PlanProgress progress;   /* candidates screened of n (plan_internal.h) */
  Stash *st;   /* the stash the screening compiles showed, for the memory bound (stash_bound) */
  int stash_aside;
} Fast;

static void fast_finish(Fast *f, int i);

/* Under f->lock: c (candidate i) set aside at its stash bound sb, past "far". */
static void stash_aside(Fast *f, Cand *c, int i, double sb) {
  c->pruned = true, c->fits = false, c->has_first = false;
  c->step_s = c->est_s * (1 - STEP_MARGIN);   /* never taken: the exact phase skips it as far out of memory */
  c->mem = sb;
  f->far[i] = f->aside[i] = true;
  f->pruned++, f->stash_aside++;
  fast_finish(f, i);
}

/* Under f->lock: candidate i's outcome is final; the final prefix of the order grows. */
static void fast_finish(Fast *f, int i) {
  f->final[i] = true;
  while (f->prefix < f->n && f->final[f->order[f->prefix]]) {
    int j = f->order[f->prefix++];
    const Cand *c = &f->cs[j];
    if (f->done[j] && !f->bad[j] && c->fits && (f->n_best < f->keep || c->step_s < f->best[f->keep - 1])) {
      int at = f->n_best < f->keep ? f->n_best++ : f->keep - 1;
      while (at > 0 && f->best[at - 1] > c->step_s) f->best[at] = f->best[at - 1], at--;
      f->best[at] = c->step_s;
    }
    f->thr_at[f->prefix] = f->n_best < f->keep ? INFINITY : f->best[f->keep - 1];
  }
  pthread_cond_broadcast(&f->finished);
}

/* One candidate screened as the exhaustive search screens it: its compiles of 1 and 2
   layers a chunk (the memo's shared lowering), extrapolated. */
static int screen_one(Ctx *x, Cand *c, int64_t L, RunSpec *sp, double threshold, double m2_lb, double *after_first,
                      ChunkStash stash[2], char *err) {
  int64_t ls[2], m[2] = {0, 0};
  int nl = screen_layers(c, L, ls);
  stash[0].ok = stash[1].ok = false;
  double st[2] = {0, 0};
  for (int j = 0; j < nl; j++) {
    /* after the first compile, the exhaustive search's pruning (plan_screen.c): a lower bound
       on the step over the threshold, or far out of memory with 1 layer a chunk already */
    if (j == 1) {
      /* memory: m1 + k (m2 - m1) with m2 at least the stash bound (k >= 1: a larger m2
         only adds), and at least m1 (stash_bound) */
      double k = (double)L / (double)(c->pp * c->v) - 1, m1 = (double)m[0];
      *after_first = m2_lb > m1 ? m1 + k * (m2_lb - m1) : m1;
    }
    if (j == 1 && x->layer_s > 0 && !getenv("LOOM_PLAN_CHECK")) {
      double k = (double)L / (double)(c->pp * c->v) - 1;
      double seqs = (double)c->batch * (double)c->ga / (double)(c->dp * c->ep * c->tp * c->cp);
      double lb = st[0] + k * (double)c->v * seqs * x->layer_s;
      if (lb > threshold || *after_first > 1.5 * x->hw->mem_bytes) {
        /* its bound: the larger of that lower bound (at peak FLOP/s: far under at scale) and
           the one a candidate set aside at its estimate gets, so that the exact phase does
           not screen it in full where it would not screen a set-aside one */
        double eb = c->est_s * (1 - STEP_MARGIN);
        c->pruned = true, c->step_s = eb > lb ? eb : lb, c->mem = *after_first, c->fits = false;
        c->has_first = true, c->first_s = st[0], c->first_mem = (double)m[0];
        return 0;
      }
    }
    *sp = *x->base;
    int rc = cand_spec(x, c, ls[j], sp, err, IR_ERR_LEN);
    if (rc) return rc;
    Module *mod = NULL;
    int pin = -1;
    rc = front_middle(x, sp, &mod, &pin, err, IR_ERR_LEN);
    /* the stash of 1 and 2 layers a chunk (stash_bound), not of the model's own split */
    if (!rc) rc = back_screen(x, c, sp, mod, &st[j], &m[j], nl == 2 ? &stash[j] : NULL, err, IR_ERR_LEN);
    unpin(x, pin);
    count_compile(x);
    if (rc) return rc;
  }
  extrapolate(c, L, ls, nl, st, m);
  c->fits = c->mem <= x->hw->mem_bytes;
  return 0;
}

static void *fast_worker(void *arg) {
  Fast *f = arg;
  RunSpec *sp = malloc(sizeof *sp);   /* large (paths): not on the stack */
  int64_t L = f->rq->base->model.n_layer;
  double far = 1.5 * f->x->hw->mem_bytes;
  for (;;) {
    pthread_mutex_lock(&f->lock);
    int k = f->next++;
    if (k >= f->n) {
      pthread_mutex_unlock(&f->lock);
      break;
    }
    int i = f->order[k];
    Cand *c = &f->cs[i];
    /* recomputation, as the exhaustive search takes it: not where the layout fits without
       it, and set aside where that layout was (it is never faster there).  The layout
       without it comes before it (by_estimate); its outcome is waited for.  So is the half
       micro-batch's where it comes before; the threshold's positions too */
    int o = f->none[i], h = f->half[i];
    if (h >= 0 && f->pos[h] > k) h = -1;
    while ((o >= 0 && !f->final[o]) || (h >= 0 && !f->final[h]) || f->prefix < k - LAG)
      pthread_cond_wait(&f->finished, &f->lock);
    double th = f->thr_at[k > LAG ? k - LAG : 0];
    /* (o set aside at its stash bound counts as screened and not fitting: the exhaustive
       search screens i then, and so does this one unless i's own figures set it aside) */
    if (o >= 0 && !f->bad[o] && !f->skip[o] && (f->cs[o].fits || (f->cs[o].pruned && !f->aside[o]))) {
      if (f->cs[o].fits) f->skip[i] = true, f->skipped++;
      else {
        /* o's bound or its own estimate's (a set-aside candidate's: recomputing, its estimate
           is the higher), and its own memory estimate past the margin (the bound the exact
           phase judges "far" by, as for a candidate set aside at its estimate): so the exact
           phase does not screen in full one its own estimates put past where its walk ends
           (at Llama-3.1-405B most it screened were recomputing layouts at o's bound) */
        double own = c->est_s * (1 - STEP_MARGIN);
        c->pruned = true, c->step_s = f->cs[o].step_s, c->fits = false, f->pruned++;
        if (isfinite(own) && own > c->step_s) c->step_s = own;
        c->mem = c->est_mem * MEM_MARGIN > far ? c->est_mem * MEM_MARGIN : 0;
      }
      fast_finish(f, i);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    /* a micro-batch twice one screened far out of memory (more than 1.5 x the device, as
       the exact phase judges "far"): memory grows with the micro-batch, so it is never taken
       (the exhaustive search skips it too) */
    if (h >= 0 && (f->far[h] || (f->done[h] && !f->bad[h] && f->cs[h].mem > far))) {
      f->skip[i] = f->far[i] = true, f->skipped++;
      fast_finish(f, i);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    /* set aside: an estimate past the margins (its figures are bounds, as a pruned
       candidate's are in the exhaustive search) */
    if (c->est_mem * MEM_MARGIN > far || c->est_s * (1 - STEP_MARGIN) > th) {
      c->pruned = true, c->fits = false;
      /* the bound it sorts by in the exact phase (which screens it if it reaches it) */
      c->step_s = c->est_s * (1 - STEP_MARGIN);
      c->mem = c->est_mem * MEM_MARGIN;
      f->pruned++;
      fast_finish(f, i);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    if (!sp) {
      f->bad[i] = true, snprintf(f->why[i], IR_ERR_LEN, "out of memory");
      fast_finish(f, i);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    /* set aside: a lower bound on its screened memory from the stash past "far" (the exact
       phase never takes it; LOOM_PLAN_CHECK screens it all the same and holds the bound to
       its figures) */
    int lim = k > LAG ? k - LAG : 0;
    const Seen *ref = NULL;
    /* nothing screened to go by: c's reference (made once), where its estimate does not fit
       (a reference costs two small compiles; Llama-3-70B on 4,096 made 50 it had no use
       for) */
    if (stash_lacks(f->st, c, lim) && c->est_mem > f->x->hw->mem_bytes) {
      pthread_mutex_unlock(&f->lock);
      ref = stash_reference(f->x, f->st, c);
      pthread_mutex_lock(&f->lock);
    }
    double sbl[2], sb = stash_bound(f->st, c, lim, ref, sbl), after_first = 0;
    bool check = getenv("LOOM_PLAN_CHECK") != NULL;
    if (sb > far && !check) {
      stash_aside(f, c, i, sb);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    pthread_mutex_unlock(&f->lock);
    ChunkStash stash[2];
    bool bad = screen_one(f->x, c, L, sp, th, sbl[1], &after_first, stash, f->why[i]) != 0;
    pthread_mutex_lock(&f->lock);
    if (!bad) stash_learn(f->st, c, k, stash, 2);
    if (getenv("LOOM_PLAN_DEBUG") && atoi(getenv("LOOM_PLAN_DEBUG")) >= 4) {   /* the bounds against the figures */
      char lay[160];
      plan_layout_text(c, lay, sizeof lay);
      fprintf(stderr, "stash bound %s: %.4g GiB (%.4g after its first compile), screened %.4g GiB%s\n", lay,
              sb / 1073741824.0, after_first / 1073741824.0, c->mem / 1073741824.0, c->pruned ? " (pruned)" : "");
    }
    if (check && !bad && !c->pruned && (sb > c->mem * (1 + 1e-12) || after_first > c->mem * (1 + 1e-12))) {
      char lay[160];
      plan_layout_text(c, lay, sizeof lay);
      fprintf(stderr, "LOOM_PLAN_CHECK: %s: stash bounds %.17g, %.17g after the first compile, over its screened memory %.17g\n",
              lay, sb, after_first, c->mem);
      abort();
    }
    if (sb > far && !bad) {   /* LOOM_PLAN_CHECK: the bound held, set aside as without the check */
      f->screened++;
      stash_aside(f, c, i, sb);
      pthread_mutex_unlock(&f->lock);
      continue;
    }
    f->bad[i] = bad;
    f->screened++;
    if (c->pruned) f->pruned++, f->far[i] = c->mem > far;
    else f->done[i] = true;
    fast_finish(f, i);
    plan_progress_say(&f->progress, now_s(), "loom plan: screened %d of %d candidates, %d set aside (%d compiles)",
                      f->screened, f->n, f->skipped + f->pruned, f->x->compiles);
    pthread_mutex_unlock(&f->lock);
  }
  free(sp);
  return NULL;
}

/* The candidates' estimates, a block at a time; a candidate whose program could not be
   compiled is screened first (its own compile gives the reason, as the exhaustive search's
   does). */
typedef struct {
  Ctx *x;
  const PlanRequest *rq;
  Programs *ps;
  const SimPlans *plans;
  Cand *cs;
  int n, next;
  pthread_mutex_t lock;
} EstJobs;

static void *est_worker(void *arg) {
  EstJobs *e = arg;
  for (;;) {
    pthread_mutex_lock(&e->lock);
    int from = e->next;
    e->next += 256;
    pthread_mutex_unlock(&e->lock);
    if (from >= e->n) break;
    for (int i = from; i < e->n && i < from + 256; i++) {
      Cand *c = &e->cs[i];
      Figures f;
      LayerProg *p = program_of(e->ps, c);
      if (figures_at(p, c->dp, &f)) estimate(e->x, e->rq, e->plans, &f, &p->z[c->zero], c);
      else c->est_s = 0, c->est_mem = 0;
      c->pruned = false, c->has_first = false;
    }
  }
  return NULL;
}

/* By estimated step; a recomputing candidate after its layout without recomputation (which
   it waits for), whatever their estimates. */
static const Cand *sort_base;
static const int *sort_none;
static double sort_key(int i) {
  double k = sort_base[i].est_s;
  int o = sort_none[i];
  return o >= 0 && sort_base[o].est_s > k ? sort_base[o].est_s : k;
}
static int by_estimate(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  double ki = sort_key(i), kj = sort_key(j);
  if (ki != kj) return ki < kj ? -1 : 1;
  if (sort_base[i].rc != sort_base[j].rc) return sort_base[i].rc - sort_base[j].rc;
  return i - j;
}

int screen_fast(Ctx *x, const PlanRequest *rq, Cand *cs, int *n_io, int *refused_out, char *first_refusal,
                ScreenStats *st, int *programs, char *err, size_t errlen) {
  int n = *n_io;
  int64_t L = rq->base->model.n_layer;
  double t_start = now_s();
  Programs ps = {0};
  /* the layer programs, each compiled once */
  for (int i = 0; i < n; i++) {
    if (program_of(&ps, &cs[i])) continue;
    if (ps.n == ps.cap) {
      LayerProg *np = realloc(ps.p, sizeof *np * (size_t)(ps.cap = ps.cap ? 2 * ps.cap : 16));
      if (!np) {
        free(ps.p);
        snprintf(err, errlen, "out of memory");
        return IR_ERUN;
      }
      ps.p = np;
    }
    ps.p[ps.n++] = (LayerProg){.tp = cs[i].tp, .cp = cs[i].cp, .ep = cs[i].ep, .sp = cs[i].sp};
  }
  for (int i = 0; i < n; i++) {
    LayerProg *p = program_of(&ps, &cs[i]);
    if (cs[i].dp > 1) p->need_z[cs[i].zero] = true;
  }
  /* the references, on every thread: job j is program j / 5's figures (j % 5 = 0) or its dp
     collectives (ZeRO stage j % 5 - 1) */
  RefJobs rj = {.x = x, .ps = &ps, .L = L, .n = 5 * ps.n, .lock = PTHREAD_MUTEX_INITIALIZER};
  plan_progress_init(&rj.progress, rq->progress, isatty(STDERR_FILENO) == 1, t_start);
  {
    int nt = threads_to_use();
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt && t < 64; t++)
      if (!pthread_create(&th[started], NULL, ref_worker, &rj)) started++;
    ref_worker(&rj);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    plan_progress_end(&rj.progress);
  }
  if (getenv("LOOM_PLAN_DEBUG"))
    fprintf(stderr, "layer programs: %d, %d compiles in %.2f s\n", ps.n, x->compiles, now_s() - t_start);
  if (getenv("LOOM_PLAN_DEBUG") && atoi(getenv("LOOM_PLAN_DEBUG")) >= 3)
    for (int i = 0; i < ps.n; i++)
      if (ps.p[i].f.ok)
        fprintf(stderr, "program tp=%lld cp=%lld sp=%d: g_la %.6g g_lb %.6g g_ba %.6g g_bb %.6g o_l %.6g s_l %.6g a_la %.6g a_lb %.6g\n",
                (long long)ps.p[i].tp, (long long)ps.p[i].cp, ps.p[i].sp, ps.p[i].f.g_la, ps.p[i].f.g_lb, ps.p[i].f.g_ba,
                ps.p[i].f.g_bb, ps.p[i].f.o_l, ps.p[i].f.s_l, ps.p[i].f.a_la, ps.p[i].f.a_lb);
  /* estimates, on every thread (each simulates its pipeline schedule) */
  Stash *stash = stash_new(L);   /* the schedules, kept for the stash bounds (Ctx.stash) */
  if (!stash) {
    free(ps.p);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  SimPlans *const pl = stash_plans(stash);
  {
    double t0 = now_s();
    if (sim_plans_build(pl, cs, n, RCM, WH)) {
      stash_free(stash), free(ps.p);
      snprintf(err, errlen, "out of memory");
      return IR_ERUN;
    }
    if (getenv("LOOM_PLAN_DEBUG")) {
      long acts = 0;
      for (int i = 0; i < pl->n; i++) acts += pl->p[i].n;
      fprintf(stderr, "schedules: %d, %ld actions, built in %.2f s\n", pl->n, acts, now_s() - t0);
    }
    EstJobs ej = {.x = x, .rq = rq, .ps = &ps, .plans = pl, .cs = cs, .n = n, .lock = PTHREAD_MUTEX_INITIALIZER};
    int nt = threads_to_use();
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt && t < 64; t++)
      if (!pthread_create(&th[started], NULL, est_worker, &ej)) started++;
    est_worker(&ej);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  }
  *programs = ps.n;
  free(ps.p);
  int *order = malloc(sizeof(int) * ((size_t)n + 1));
  Fast f = {.x = x, .rq = rq, .cs = cs, .order = order, .n = n, .bad = calloc((size_t)n + 1, 1),
            .why = calloc((size_t)n + 1, IR_ERR_LEN), .keep = 2 * rq->top, .best = malloc(sizeof(double) * 2 * (size_t)rq->top),
            .thr_at = malloc(sizeof(double) * ((size_t)n + 1)), .pos = malloc(sizeof(int) * ((size_t)n + 1))};
  pthread_mutex_init(&f.lock, NULL);
  if (!order || !f.bad || !f.why || !f.best || !f.thr_at || !f.pos) {
    free(order), free(f.bad), free(f.why), free(f.best), free(f.thr_at), free(f.pos);
    stash_free(stash);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  f.st = stash;
  /* one pass in the order of the estimates: the candidates with recomputation look at their
     layout's screening without it (the exhaustive search's rounds), which comes first; the
     threshold falls as soon as any layout fits, recomputing or not */
  int *half = malloc(sizeof(int) * ((size_t)n + 1)), *none = malloc(sizeof(int) * ((size_t)n + 1));
  f.skip = calloc((size_t)n + 1, 1), f.none = none, f.half = half;
  f.far = calloc((size_t)n + 1, 1), f.done = calloc((size_t)n + 1, 1), f.final = calloc((size_t)n + 1, 1);
  f.aside = calloc((size_t)n + 1, 1);
  if (!half || !none || !f.skip || !f.far || !f.done || !f.final || !f.aside || siblings(cs, n, half, none)) {
    free(order), free(f.bad), free(f.why), free(f.best), free(f.thr_at), free(f.pos), free(half), free(none), free(f.skip);
    free(f.far), free(f.done), free(f.final), free(f.aside);
    stash_free(stash);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  pthread_cond_init(&f.finished, NULL);
  for (int i = 0; i < n; i++) order[i] = i;
  sort_base = cs, sort_none = none;
  qsort(order, (size_t)n, sizeof *order, by_estimate);
  for (int k = 0; k < n; k++) f.pos[order[k]] = k;
  f.thr_at[0] = INFINITY;
  int nt = threads_to_use();
  {
    f.next = 0, f.n = n;
    plan_progress_init(&f.progress, rq->progress, isatty(STDERR_FILENO) == 1, t_start);
    pthread_t th[64];
    int started = 0;
    for (int t = 1; t < nt && t < 64; t++)
      if (!pthread_create(&th[started], NULL, fast_worker, &f)) started++;
    fast_worker(&f);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  }
  pthread_cond_destroy(&f.finished);
  plan_progress_end(&f.progress);
  int kept = 0, refused = 0;
  for (int i = 0; i < n; i++) {
    if (f.skip[i]) continue;
    if (f.bad[i]) {
      if (!refused++) snprintf(first_refusal, IR_ERR_LEN, "%s", f.why[i]);
      if (getenv("LOOM_PLAN_DEBUG")) {
        char lay[160];
        plan_layout_text(&cs[i], lay, sizeof lay);
        fprintf(stderr, "not buildable: %s: %s\n", lay, f.why[i]);
      }
      continue;
    }
    if (getenv("LOOM_PLAN_DEBUG") && !cs[i].pruned) {
      char lay[160];
      plan_layout_text(&cs[i], lay, sizeof lay);
      fprintf(stderr, "screened %s: step %.4g ms (estimated %.4g), memory %.3g GiB (estimated %.3g)\n", lay,
              cs[i].step_s * 1e3, cs[i].est_s * 1e3, cs[i].mem / 1073741824.0, cs[i].est_mem / 1073741824.0);
    }
    cs[kept++] = cs[i];
  }
  if (getenv("LOOM_PLAN_DEBUG")) {
    int n_seen, n_refs;
    stash_counts(stash, &n_seen, &n_refs);
    fprintf(stderr, "set aside at their stash bound: %d (%d stash figures seen, %d references)\n", f.stash_aside, n_seen,
            n_refs);
  }
  *st = (ScreenStats){.skipped = f.skipped, .pruned = f.pruned, .threads = nt, .seconds = now_s() - t_start};
  stash_free(x->stash), x->stash = stash;
  free(order), free(f.bad), free(f.why), free(f.best), free(f.thr_at), free(f.pos), free(half), free(none), free(f.skip);
  free(f.far), free(f.done), free(f.final), free(f.aside);
  *n_io = kept, *refused_out += refused;
  return 0;
}
