/* runtime/comm/comm.h — collectives among the ranks of a device mesh.
 *
 * Ranks and coordinates: the mesh has axes dp, tp, cp, pp, ep (index 0..4, as in the IR).
 * A rank's coordinates are its digits in the mixed radix with, from outermost to
 * innermost, pp, dp, ep, cp, tp:
 *     rank = (((pp * DP + dp) * EP + ep) * CP + cp) * TP + tp
 * so the ranks of one tensor-parallel group are consecutive (the same node), as in
 * Megatron-LM.  A collective on axis a runs among the ranks that share every coordinate
 * but a's, ordered by their coordinate on a.
 *
 * comm_local.c implements it for N threads of one process (the CPU backends and the
 * equivalence tests); comm_nccl.c over NCCL for one process per GPU.
 */
#ifndef LOOM_RUNTIME_COMM_H
#define LOOM_RUNTIME_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { COMM_DP, COMM_TP, COMM_CP, COMM_PP, COMM_EP, COMM_AXES };

int mesh_rank_of(const int64_t mesh[COMM_AXES], const int coord[COMM_AXES]);
void mesh_coords_of(const int64_t mesh[COMM_AXES], int rank, int coord[COMM_AXES]);

typedef struct Comm Comm;   /* one rank's handle */
struct Comm {
  int rank, world;
  int coord[COMM_AXES];
  int64_t mesh[COMM_AXES];
  void *impl;
  /* Flat f32 collectives over one axis; 0 on success, 1 when the world was aborted. */
  int (*all_reduce)(Comm *c, int axis, float *buf, int64_t n, bool max);
  int (*all_gather)(Comm *c, int axis, const float *in, float *out, int64_t n);
  int (*reduce_scatter)(Comm *c, int axis, const float *in, float *out, int64_t n_out);
  int (*all_to_all)(Comm *c, int axis, const float *in, float *out, int64_t n_chunk);
  int (*barrier)(Comm *c);   /* all ranks of the world */
  /* Point-to-point with the rank at coordinate `peer` on `axis` (the others the same).
     send copies and returns (buffered); recv waits for the message of that sender and tag
     (tags tell messages apart, so they may arrive in any order).  NULL where unsupported. */
  int (*send)(Comm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n);
  int (*recv)(Comm *c, int axis, int peer, int64_t tag, float *buf, int64_t n);
};

/* ---- comm_engine.c: a rank's communication thread ----
   Jobs (a rank's collectives) run one at a time on the engine's thread, in the order they
   were submitted: every rank submits its collectives in the same order (verify-collectives),
   so the groups match as they do when the rank's own thread runs them.  A job's ticket is
   its position in that order; waiting for ticket t returns when job t (and so every job
   before it) is done.  After a job fails, the later ones are not run, and the waits for it
   and for every later job return its failure. */
typedef struct CommEngine CommEngine;
typedef int (*CommJobFn)(void *arg, char *err, size_t errlen);
CommEngine *comm_engine_new(char *err, size_t errlen);
/* Queues fn(arg); arg must live until the job is waited for.  Returns its ticket, or -1
   when the engine has stopped. */
int64_t comm_engine_submit(CommEngine *e, CommJobFn fn, void *arg);
/* Blocks until job `ticket` is done; 0, or the first failure's code and message. */
int comm_engine_wait(CommEngine *e, int64_t ticket, char *err, size_t errlen);
/* When job `ticket` ran on the engine's thread (CLOCK_MONOTONIC seconds); the last 4096 jobs
   are kept.  0 when unknown. */
void comm_engine_job_times(const CommEngine *e, int64_t ticket, double *begin, double *end);
/* Stops the thread (after the queued jobs) and frees the engine. */
void comm_engine_free(CommEngine *e);

/* ---- comm_local.c: N ranks as N threads of this process ---- */
typedef struct LocalWorld LocalWorld;
LocalWorld *local_world_new(const int64_t mesh[COMM_AXES], char *err, size_t errlen);
Comm *local_world_rank(LocalWorld *w, int rank);
/* Wakes every rank waiting in a collective; they and all later collectives return 1.
   A rank that fails calls this so the others do not wait forever. */
void local_world_abort(LocalWorld *w);
/* What stopped the world first, naming the rank and the collective (LOOM_MESH_FAULT, the
   LOOM_MESH_TIMEOUT watchdog), or NULL: a failing rank's own error says it. */
const char *local_world_fault(LocalWorld *w);
void local_world_free(LocalWorld *w);

#endif
