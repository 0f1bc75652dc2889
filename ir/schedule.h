/* ir/schedule.h — pipeline schedules as data.
 *
 * A schedule gives every pp rank its ordered list of actions: F (a chunk's forward of one
 * micro-batch), B (its backward; for the zero-bubble schedules only the input gradient)
 * and W (zero-bubble schedules: the weight gradient).  The model is cut into `chunks`
 * pieces (pp x virtual); a micro-batch's forward runs chunk 0, 1, ..., chunks-1 and its
 * backward the other way.  Transfers follow from the actions: F(mb, c) receives chunk
 * c-1's output from the rank that holds chunk c-1 and sends its own to the holder of c+1;
 * B the other way.
 *
 *   afab         all forwards, then all backwards (GPipe): every micro-batch's
 *                activations are held at once
 *   1f1b         pp-1-r warm-up forwards on rank r, then one forward one backward: at most
 *                pp-r micro-batches in flight
 *   interleaved  Megatron's schedule with v chunks per rank (chunk c on rank c mod pp);
 *                needs grad_accum a multiple of pp
 *   zb-h1        1f1b's memory bound with the backward split into B and W; W fills the
 *                bubbles (Qi et al., "Zero Bubble Pipeline Parallelism", ZB-H1)
 *   dualpipev    two chunks per rank in a V (rank r holds chunks r and 2pp-1-r, so the
 *                first and last chunk share rank 0), B/W split, built by the same
 *                greedy list scheduler as zb-h1
 *
 * schedule_simulate runs the lists against unit costs (F, B, W per chunk): the timeline,
 * the idle time (bubble) of every rank, and the peak count of held activations.  It is also
 * a proof: when no rank can start its next action and some are left, the lists deadlock,
 * and it says which rank waits for what.
 */
#ifndef LOOM_IR_SCHEDULE_H
#define LOOM_IR_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"

typedef enum { ACT_F, ACT_B, ACT_W } ActKind;
typedef struct {
  int kind;    /* ActKind */
  int mb;      /* micro-batch */
  int chunk;   /* model chunk, 0 .. chunks-1 */
} Action;

typedef struct {
  int kind;          /* PipeKind */
  int p, v, m;       /* pp ranks, chunks per rank, micro-batches */
  int chunks;        /* p * v */
  bool split_bw;     /* B and W are separate actions (zb-h1, dualpipev) */
  int *n;            /* [p] actions per rank */
  Action **acts;     /* [p][n[r]] */
} Schedule;

/* Builds the action lists.  Refuses (IR_EINPUT, with the fix) what the schedule cannot
   run: interleaved with grad_accum not a multiple of pp or virtual < 2, a virtual count
   other than 1 for afab/1f1b/zb-h1 or 2 for dualpipev, fewer than 2 ranks. */
int schedule_build(int kind, int p, int v, int m, Schedule *s, char *err, size_t errlen);
void schedule_free(Schedule *s);
/* The pp rank that holds model chunk c. */
int schedule_chunk_rank(int kind, int p, int v, int c);
/* How many virtual chunks the schedule uses when the user gives none. */
int schedule_default_virtual(int kind);

typedef struct {
  double *start[64], *end[64];   /* [rank][action] (at most 64 pp ranks) */
  double makespan;
  double busy[64];               /* compute time of each rank */
  double idle[64];               /* makespan - busy */
  double bubble;                 /* mean over ranks of idle / busy: the playbook's bubble fraction */
  int peak_f[64];                /* most micro-batch chunks whose forward ran and backward (B) did not */
  int peak_w[64];                /* zero-bubble: most whose B ran and W did not */
} SimResult;

/* cost[c][k]: the time of action kind k (ActKind) on chunk c; for a schedule without the
   B/W split, B's cost is B + W.  Returns IR_EINPUT with the blocked ranks on a deadlock
   (or an order that breaks a dependency within a rank). */
int schedule_simulate(const Schedule *s, const double (*cost)[3], SimResult *r, char *err, size_t errlen);
void sim_result_free(SimResult *r, int p);

/* The playbook's bubble fraction for the schedule with equal stages and F = B = W:
   (p-1)/m for afab and 1f1b, (p-1)/(v m) interleaved, (p-1)/(3m) zb-h1 ((p-1)(F+B-W) over
   m(F+B+W)); dualpipev: -1 (no closed form here; the simulation gives it). */
double schedule_bubble_formula(int kind, int p, int v, int m);

/* The lists as a table, one row per rank ("F0.0" = forward of micro-batch 0 on chunk 0). */
void schedule_print(FILE *out, const Schedule *s, const SimResult *sim);
/* A Chrome/Perfetto trace ("traceEvents"): one track (tid) per pp rank, one complete
   ("ph":"X") event per action, named like the table, with args mb, chunk and kind.
   Times in microseconds. `what` names the source ("predicted: ..." / "measured"). */
int schedule_write_trace(const char *path, const Schedule *s, double *const *start, double *const *end,
                         const char *what, char *err, size_t errlen);

/* Predicted stash of a pipelined module (the pipeline pass's functions): bytes one
   micro-batch of chunk c holds from F to B (f_bytes[c]: @fwd.cK's results but the loss)
   and from B to W (w_bytes[c]: @bwd_b.cK's), 4 bytes an element, and each pp rank's peak
   under the schedule's order (peak[q]). */
int pipe_stash_peaks(const Module *m, const Schedule *s, int64_t *peak, int64_t *f_bytes, int64_t *w_bytes);
/* The peaks alone, from each chunk's f_bytes and w_bytes (a lowered program's, which has no
   module: runtime/exec/pipe_walk.c). */
void pipe_stash_walk(const Schedule *s, const int64_t *f_bytes, const int64_t *w_bytes, int64_t *peak);
/* The pp coordinate whose optimizer step (@optimizer_step.sR) assigns the global's parameter
   (its owner; the first when tied copies are kept on two), or -1.  The lowering writes it
   into the program (RtGlobal.owner). */
int pipe_owner_of(const Module *m, const Global *gl);
/* The pp rank that runs a pipelined module's function (@fwd.cK, @bwd.cK, @bwd_b.cK, @bwd_w.cK,
   @optimizer_step.sR), or -1 for any other. */
int pipe_func_rank(const Schedule *s, const char *name);

#endif
