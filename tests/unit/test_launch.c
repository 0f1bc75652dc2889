/* tests/unit/test_launch.c — reading a multi-process launch from the environment
   (runtime/comm/launch.h): torchrun's, Slurm's and Open MPI's variables, which wins when
   several are set, malformed and inconsistent values, and the refusal to be one of several
   processes. */
#include <stdio.h>
#include <string.h>

#include "runtime/comm/launch.h"
#include "tests/unit/check.h"

/* A fake environment: "NAME=value" pairs, NULL-terminated. */
static const char *const *env;
static const char *get(const char *name) {
  size_t n = strlen(name);
  for (int i = 0; env && env[i]; i++)
    if (!strncmp(env[i], name, n) && env[i][n] == '=') return env[i] + n + 1;
  return NULL;
}

static int read_env(const char *const *vars, LaunchEnv *e, char *err, size_t errlen) {
  env = vars;
  err[0] = 0;
  return launch_env_read(e, get, err, errlen);
}

int main(void) {
  LaunchEnv e;
  char err[1024];

  static const char *const none[] = {"HOME=/root", NULL};
  CHECK(read_env(none, &e, err, sizeof err) == 0 && e.world == 1 && e.rank == 0 && !e.launcher[0], "no launcher: one process");
  CHECK(launch_env_single(&e, "loom train", err, sizeof err) == 0, "one process is fine");

  static const char *const torchrun[] = {"RANK=3", "WORLD_SIZE=8", "LOCAL_RANK=3", "MASTER_ADDR=node0", "MASTER_PORT=29500",
                                         NULL};
  CHECK(read_env(torchrun, &e, err, sizeof err) == 0 && !strcmp(e.launcher, "torchrun") && e.rank == 3 && e.world == 8 &&
            e.local_rank == 3 && !strcmp(e.master_addr, "node0") && e.master_port == 29500,
        "torchrun: %s rank %lld of %lld local %lld %s:%lld (%s)", e.launcher, (long long)e.rank, (long long)e.world,
        (long long)e.local_rank, e.master_addr, (long long)e.master_port, err);
  CHECK(launch_env_single(&e, "loom train", err, sizeof err) == 2 && strstr(err, "rank 3 of 8 started by torchrun (RANK=3)") &&
            strstr(err, "one process"),
        "refused: %s", err);

  static const char *const slurm[] = {"SLURM_PROCID=5", "SLURM_NTASKS=16", "SLURM_LOCALID=1", "SLURM_JOB_ID=77", NULL};
  CHECK(read_env(slurm, &e, err, sizeof err) == 0 && !strcmp(e.launcher, "slurm") && e.rank == 5 && e.world == 16 &&
            e.local_rank == 1 && !strcmp(e.rank_var, "SLURM_PROCID"),
        "slurm (%s)", err);

  static const char *const mpi[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=0", NULL};
  CHECK(read_env(mpi, &e, err, sizeof err) == 0 && !strcmp(e.launcher, "mpirun") && e.rank == 0 && e.world == 2 &&
            e.local_rank == 0,
        "mpirun (%s)", err);
  CHECK(launch_env_single(&e, "a loom executable", err, sizeof err) == 2 && strstr(err, "rank 0 of 2 started by mpirun"),
        "rank 0 of a launch is refused too: %s", err);

  /* torchrun inside an srun allocation: torchrun's variables name the processes it started */
  static const char *const both[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "RANK=6", "WORLD_SIZE=16", NULL};
  CHECK(read_env(both, &e, err, sizeof err) == 0 && !strcmp(e.launcher, "torchrun") && e.rank == 6 && e.world == 16,
        "torchrun wins over slurm (%s)", err);

  /* a launch of one process is one process */
  static const char *const one[] = {"RANK=0", "WORLD_SIZE=1", NULL};
  CHECK(read_env(one, &e, err, sizeof err) == 0 && launch_env_single(&e, "loom train", err, sizeof err) == 0,
        "WORLD_SIZE=1 runs (%s)", err);

  /* malformed and inconsistent values, each named */
  static const struct { const char *vars[4], *want; } bad[] = {
    {{"RANK=2", NULL}, "sets RANK but not WORLD_SIZE"},
    {{"WORLD_SIZE=4", NULL}, "sets WORLD_SIZE but not RANK"},
    {{"RANK=4", "WORLD_SIZE=4", NULL}, "RANK is '4', not a whole number from 0 to 3"},
    {{"RANK=-1", "WORLD_SIZE=4", NULL}, "RANK is '-1'"},
    {{"RANK=one", "WORLD_SIZE=4", NULL}, "RANK is 'one'"},
    {{"RANK=1", "WORLD_SIZE=0", NULL}, "WORLD_SIZE is '0'"},
    {{"RANK=1", "WORLD_SIZE=4x", NULL}, "WORLD_SIZE is '4x'"},
    {{"RANK=1", "WORLD_SIZE=4", "MASTER_PORT=70000", NULL}, "MASTER_PORT is '70000'"},
    {{"SLURM_PROCID=3", "SLURM_NTASKS=2", NULL}, "SLURM_PROCID is '3', not a whole number from 0 to 1"},
    {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=9", NULL},
     "OMPI_COMM_WORLD_LOCAL_RANK is '9'"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    int rc = read_env(bad[k].vars, &e, err, sizeof err);
    CHECK(rc == 2 && strstr(err, bad[k].want), "bad case %zu: rc %d, '%s' (wanted '%s')", k, rc, err, bad[k].want);
  }
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
