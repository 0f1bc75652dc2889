/* runtime/comm/launch.c — see launch.h. */
#include "runtime/comm/launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_get(const char *name) { return getenv(name); }

/* A whole number in [lo, hi] from variable `name` (absent: *out untouched, returns 1). */
static int number(const char *(*get)(const char *), const char *name, int64_t lo, int64_t hi, int64_t *out, char *err,
                  size_t errlen) {
  const char *v = get(name);
  if (!v) return 1;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || errno || x < lo || x > hi) {
    snprintf(err, errlen, "the environment variable %s is '%.60s', not a whole number from %lld to %lld; fix or unset it",
             name, v, (long long)lo, (long long)hi);
    return 2;
  }
  *out = x;
  return 0;
}

int launch_env_read(LaunchEnv *e, const char *(*get)(const char *name), char *err, size_t errlen) {
  static const struct { const char *launcher, *rank, *size, *local; } L[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
  };
  if (!get) get = env_get;
  memset(e, 0, sizeof *e);
  e->launcher = e->rank_var = "";
  e->world = 1;
  e->local_rank = -1;
  for (size_t k = 0; k < sizeof L / sizeof L[0]; k++) {
    bool has_rank = get(L[k].rank) != NULL, has_size = get(L[k].size) != NULL;
    if (!has_rank && !has_size) continue;
    if (has_rank != has_size) {
      snprintf(err, errlen, "the environment sets %s but not %s (a %s launch sets both); set the other or unset it",
               has_rank ? L[k].rank : L[k].size, has_rank ? L[k].size : L[k].rank, L[k].launcher);
      return 2;
    }
    int64_t world = 0, rank = 0;
    int rc;
    if ((rc = number(get, L[k].size, 1, 1 << 24, &world, err, errlen)) == 2) return 2;
    if ((rc = number(get, L[k].rank, 0, world - 1, &rank, err, errlen)) == 2) return 2;
    e->launcher = L[k].launcher;
    e->rank_var = L[k].rank;
    e->world = world;
    e->rank = rank;
    if (number(get, L[k].local, 0, world - 1, &e->local_rank, err, errlen) == 2) return 2;
    if (k == 0) {
      const char *addr = get("MASTER_ADDR");
      if (addr) snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
      if (number(get, "MASTER_PORT", 1, 65535, &e->master_port, err, errlen) == 2) return 2;
    }
    return 0;
  }
  return 0;
}

int launch_env_single(const LaunchEnv *e, const char *what, char *err, size_t errlen) {
  if (e->world <= 1) return 0;
  snprintf(err, errlen, "this process is rank %lld of %lld started by %s (%s=%lld), but %s runs as one process here: on "
           "the cpu backend a mesh's ranks are threads of it (--mesh dp=N,...), and one process per GPU over NCCL is "
           "'loom train --backend cuda --mesh ...'; start a single process, without the launcher, so that %lld "
           "processes do not each train the whole model and write the same outputs", (long long)e->rank,
           (long long)e->world, e->launcher, e->rank_var, (long long)e->rank, what, (long long)e->world);
  return 2;
}
