/* runtime/comm/comm_nccl.h — runtime/comm/comm.h's Comm over NCCL: one process per GPU.
 *
 * Start-up (nccl_world_new), every rank of the world in the same order:
 *   1. the bootstrap: RANK, WORLD_SIZE, LOCAL_RANK (the CUDA device; else rank % devices),
 *      MASTER_ADDR, MASTER_PORT as torchrun and Slurm scripts set them (SLURM_PROCID /
 *      SLURM_NTASKS / SLURM_LOCALID and OMPI_COMM_WORLD_* are read when RANK is absent);
 *   2. the ncclUniqueId: rank 0 makes it and serves it over TCP on MASTER_PORT (all
 *      interfaces); the others connect to MASTER_ADDR:MASTER_PORT, retrying until rank 0 is
 *      up, and read it (nccl_rendezvous).  With NCCL_COMM_ID=host:port set, NCCL's own
 *      bootstrap is used instead and no port is opened here;
 *   3. a world communicator (ncclCommInitRankConfig), then one per mesh axis of size > 1
 *      (ncclCommSplit of the world: color = the rank's other coordinates linearised, key =
 *      its coordinate on the axis, so a communicator's ranks are in coordinate order as
 *      comm.h requires).  An axis as large as the world uses the world communicator.
 * Every communicator is non-blocking (config.blocking = 0): each NCCL call is followed by
 * polling ncclCommGetAsyncError until it leaves ncclInProgress, and a collective by polling
 * its stream, both within LOOM_NCCL_TIMEOUT seconds (default 600, `loom train --nccl-timeout`; the rendezvous and the
 * communicators' creation use it too).  On an error or a timeout every communicator is
 * aborted (ncclCommAbort), the message (naming the rank, the collective and the axis) is
 * kept for nccl_last_error, and this and every later collective returns 1.
 *
 * The buffers of every collective are DEVICE addresses (float, on this rank's GPU), not host
 * memory: a Comm made here cannot serve the CPU backends (use comm_local.c).  Collectives
 * run on the Comm's stream (its own, or the one given to nccl_set_stream, e.g. the
 * program's, so that they are ordered with its kernels).  By default a collective returns
 * once it has completed; nccl_set_stream(.., wait = false) makes them return once enqueued,
 * and nccl_wait then waits for all of them.
 *
 * Without a driver, a device or libnccl.so.2 (LOOM_LIBNCCL names another file)
 * nccl_world_new fails with a message; nothing is linked at build time.
 */
#ifndef LOOM_RUNTIME_COMM_NCCL_H
#define LOOM_RUNTIME_COMM_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/comm.h"

#define NCCL_ID_BYTES 128

typedef struct {
  int rank, world;
  int device;              /* CUDA device; -1: rank % the number of devices */
  char addr[256];          /* MASTER_ADDR (rank 0's host) */
  int port;                /* MASTER_PORT */
  double timeout_s;        /* LOOM_NCCL_TIMEOUT, default 600 */
  bool use_comm_id;        /* NCCL_COMM_ID is set: NCCL bootstraps itself */
} NcclBootstrap;

/* Reads the variables above.  A world of 1 needs none of them. */
int nccl_bootstrap_from_env(NcclBootstrap *b, char *err, size_t errlen);

/* The ncclUniqueId exchange (no NCCL needed): rank 0 serves id (input) to the world - 1
   others on port; they connect to addr:port and receive it (output).  Each side checks the
   other's world size and rank; rank 0 fails naming the ranks that did not arrive within
   timeout_s, the others when rank 0 cannot be reached within it. */
int nccl_rendezvous(const char *addr, int port, int rank, int world, unsigned char id[NCCL_ID_BYTES], double timeout_s,
                    char *err, size_t errlen);

/* The world of this process's rank (b NULL: nccl_bootstrap_from_env).  mesh: the sizes of
   dp, tp, cp, pp, ep; their product must be the world size. */
int nccl_world_new(const int64_t mesh[COMM_AXES], const NcclBootstrap *b, Comm **out, char *err, size_t errlen);
/* Finalizes and destroys the communicators (aborts them if that fails or the world was
   aborted) and releases the device.  NULL is fine. */
void nccl_world_free(Comm *c);
/* Aborts every communicator: collectives in flight on any rank fail instead of hanging. */
void nccl_world_abort(Comm *c);
/* Why the last collective failed ("" if none did). */
const char *nccl_last_error(const Comm *c);
/* stream: a CUstream of this rank's device (NULL: the Comm's own).  wait: as above. */
int nccl_set_stream(Comm *c, void *stream, bool wait, char *err, size_t errlen);
/* Waits for every collective enqueued on the Comm's stream (with the timeout). */
int nccl_wait(Comm *c, char *err, size_t errlen);
/* One collective step of a lowered CUDA program (runtime/program.h's RT_B_ALL_REDUCE ..
   RT_B_ALL_TO_ALL and their i[]) on device buffers x -> y of RtStorage `storage` (f32, bf16,
   f16, i32), enqueued on `stream` (its axis's communication stream): a size-1 axis copies;
   all_gather and reduce_scatter along a dim with outer rows are one NCCL call per row, and
   all_to_all grouped sends and receives, in one group.  Returns once enqueued (on the
   emulated device: done).  label names the step in reports.  The flight recorder keeps the
   last 32 collectives; a watchdog thread of the world aborts every communicator when the
   rank has been inside one NCCL call longer than the timeout, printing them (which did not
   finish, which were the last to finish) to stderr, and ends the process 10 s later if the
   call still does not return.  0, or 1 (the world aborted) / 2 (a malformed step) with the
   message and the flight record in err. */
int nccl_step(Comm *c, int builtin, const int64_t *i, int storage, const void *x, void *y, void *stream, const char *label,
              char *err, size_t errlen);
/* One point-to-point transfer of a group (nccl_p2p_group). */
typedef struct NcclP2p {
  bool send;           /* ncclSend of buf, else ncclRecv into it */
  int peer;            /* the peer's coordinate on the axis (its rank in the axis's communicator) */
  void *buf;           /* device address */
  int64_t count;       /* elements */
  int storage;         /* RtStorage: f32, bf16, f16 or i32 */
} NcclP2p;
/* The transfers ops[0..n) on the communicator of mesh axis `axis` as ONE NCCL group
   (ncclGroupStart, each op's ncclSend / ncclRecv in the given order, ncclGroupEnd), enqueued
   on `stream`.  NCCL pairs a rank's sends to a peer with that peer's receives from it in
   issue order (no tags), and a send completes only once the peer posts its receive: the
   caller issues, on every rank, groups that hold both ends of each message (a ring's send
   to +p and receive from -p), in the same order (runtime/cuda/cuda_mesh.c plans them).  A
   peer that is the rank itself, or a size-1 axis, is refused (2).  One flight-recorder
   entry for the group ("send/recv group of N on cp, B bytes each way (label)"), the
   watchdog and the errors as nccl_step (B: the bytes sent, which a planned group also
   receives; "S bytes out, R in" when they differ).  0, or 1 (the world aborted) / 2 with the message. */
int nccl_p2p_group(Comm *c, int axis, int n, const NcclP2p *ops, void *stream, const char *label, char *err,
                   size_t errlen);
/* Waits for `stream` (a CUstream of this rank's device) within the timeout, watching every
   communicator for asynchronous errors; then the enqueued collectives count as finished.
   On a timeout or an error, aborts the world: 1 with the message and the flight record. */
int nccl_sync(Comm *c, void *stream, const char *what, char *err, size_t errlen);
/* All-gather of host floats over the whole world (gathering a checkpoint's pieces):
   all[r*n .. (r+1)*n) = rank r's mine[0..n), through this rank's GPU; waits.  0 or 1. */
int nccl_all_gather_host(Comm *c, const float *mine, float *all, int64_t n, char *err, size_t errlen);
/* The CUDA device this rank uses (LOOM_LOCAL_RANK's, or rank % devices); -1 without a world. */
int nccl_device(const Comm *c);
/* NCCL's version code (e.g. 22809), or 0 with a message when it cannot be loaded. */
int nccl_version(char *err, size_t errlen);

#endif
