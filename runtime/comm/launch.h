/* runtime/comm/launch.h — which process of a multi-process launch this is, from the
 * environment the usual launchers set:
 *
 *   torchrun (torch.distributed.run)  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
 *   Slurm (srun)                      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 *   Open MPI (mpirun)                 OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 *                                     OMPI_COMM_WORLD_LOCAL_RANK
 *
 * The first launcher whose rank and size are both set wins, in that order (torchrun run
 * inside an srun allocation sets its own, which name the processes it started).  A value
 * that is not a whole number, a rank outside [0, size), or a rank set without its size is
 * an error naming the variable.  No launcher: one process (rank 0 of 1).
 *
 * On the CPU loom runs one process (a mesh's ranks are threads): `loom train` there and
 * compiled executables refuse to be one of several launched processes, rather than let each
 * train the whole model on its own and write the same outputs.  `loom train --backend cuda
 * --mesh ...` is one process per GPU: each reads its rank here (tools/cmd_train.c).
 */
#ifndef LOOM_RUNTIME_COMM_LAUNCH_H
#define LOOM_RUNTIME_COMM_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *launcher;      /* "torchrun", "slurm", "mpirun", or "" (none) */
  const char *rank_var;      /* the variable the rank came from ("RANK", ...), or "" */
  int64_t rank, world, local_rank;   /* local_rank -1: not given */
  char master_addr[256];     /* torchrun's MASTER_ADDR, or "" */
  int64_t master_port;       /* torchrun's MASTER_PORT, or 0 */
} LaunchEnv;

/* Reads the launch from getenv-like `get` (NULL: the process environment).  0, or 2 with
   the message in err when a variable is malformed or inconsistent. */
int launch_env_read(LaunchEnv *e, const char *(*get)(const char *name), char *err, size_t errlen);

/* 0 when this is the only process; else 2 with a message saying which launch this is and
   what to do instead (one process, --mesh). */
int launch_env_single(const LaunchEnv *e, const char *what, char *err, size_t errlen);

#endif
