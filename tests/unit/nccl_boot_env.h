/* tests/unit/nccl_boot_env.h — the environment variables a rank's NCCL bootstrap reads
 * (runtime/comm/comm_nccl.h: torchrun, Slurm, MPI, NCCL_COMM_ID), and clear_boot_env to unset
 * them all: test_nccl_boot.c sets them case by case, test_cuda_runtime.c's one-rank world
 * (--gpu) starts from none. */
#ifndef LOOM_TESTS_UNIT_NCCL_BOOT_ENV_H
#define LOOM_TESTS_UNIT_NCCL_BOOT_ENV_H

#include <stdlib.h>

static const char *const boot_vars[] = {"RANK",         "WORLD_SIZE",           "LOCAL_RANK",          "MASTER_ADDR",
                                        "MASTER_PORT",  "NCCL_COMM_ID",         "LOOM_NCCL_TIMEOUT",   "SLURM_PROCID",
                                        "SLURM_NTASKS", "SLURM_LOCALID",        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                        "PMI_RANK",     "PMI_SIZE",             "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"};
static inline void clear_boot_env(void) {
  for (size_t k = 0; k < sizeof boot_vars / sizeof boot_vars[0]; k++) unsetenv(boot_vars[k]);
}

#endif
