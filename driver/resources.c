/* driver/resources.c — will the run fit this machine?  Checked by `loom train` after the
 * program is compiled and before any buffer is allocated: what the memory plan says a rank
 * needs (passes/memory_rank.c: every global plus the largest arena of a training step),
 * times the ranks that share this machine's memory (the cpu mesh runs every rank in this
 * process; a CUDA rank has a GPU of its own), plus what the training loop keeps on the host
 * (each step's loss, norm and learning rate; the micro-batches' tokens), against what this
 * machine has: its physical memory, or less where a cgroup or `ulimit -v` says so, and for
 * CUDA the GPU's memory.  A run that does not fit is refused with both figures and the key
 * whose value makes it so large, instead of failing (or swapping) in the middle of
 * allocating.  The figures are the plan's, a lower bound of what the run takes: the check
 * refuses only what cannot fit. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "runtime/cuda/cuda_api.h"
#include "driver/driver.h"

static void human(double b, char *buf, size_t n) {
  const char *u[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int k = 0;
  while (b >= 1000 && k < 6) b /= 1000, k++;
  snprintf(buf, n, k ? "%.1f %s" : "%.0f %s", b, u[k]);
}

/* A limit from a cgroup file ("max" or a number of bytes); 0 when there is none. */
static double cgroup_limit(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[64] = "";
  double v = 0;
  if (fgets(line, sizeof line, f) && strncmp(line, "max", 3)) v = strtod(line, NULL);
  fclose(f);
  return v > 0 && v < 9e18 ? v : 0;   /* cgroup v1 writes "no limit" as 2^63 rounded to pages */
}

double machine_memory(const char **what) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  double mem = pages > 0 && page > 0 ? (double)pages * (double)page : INFINITY;
  *what = "physical memory";
  double cg = cgroup_limit("/sys/fs/cgroup/memory.max");
  if (!cg) cg = cgroup_limit("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (cg > 0 && cg < mem) mem = cg, *what = "the memory its cgroup allows";
  struct rlimit rl;
  if (!getrlimit(RLIMIT_AS, &rl) && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < mem)
    mem = (double)rl.rlim_cur, *what = "the address space ulimit -v allows";
  return mem;
}

/* The state (every global) and the largest arena of a training step of one rank. */
static void rank_needs(const Module *m, int target, double *state, double *arena) {
  *state = 0, *arena = 0;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    *state += (double)type_numel(&g->value->type) * (target == TARGET_CUDA ? dtype_size(g->value->type.dtype) : 4);
  }
  int64_t peak = memory_rank_peak(m, target);
  if (peak > 0 && (double)peak > *state) *arena = (double)peak - *state;
  if (peak > 0 && m->pipe.kind) *state = (double)peak, *arena = 0;   /* the pipelined peak is not split */
  /* The arena a rank allocates is the largest of every function's, @forward's included (the
     evaluation function, which memory_rank_peak leaves out of a step's peak): on a dp mesh
     it gathers the whole batch's logits on every rank, so at dp=4096 it, not the step, is
     what no machine holds. */
  int64_t largest = 0;
  memory_planned_peak(m, target, NULL, &largest);
  if (!m->pipe.kind && (double)largest > *arena) *arena = (double)largest;
}

int run_check_memory(const Module *m, const RunSpec *s, Backend backend, char *err, size_t errlen) {
  const char *f = s->path[0] ? s->path : "run spec";
  int target = backend == BACKEND_CUDA ? TARGET_CUDA : TARGET_CPU;
  double state, arena;
  rank_needs(m, target, &state, &arena);
  double world = (double)mesh_world(&m->mesh), per_rank = state + arena;
  /* the training loop's own: 3-4 floats per step, and each micro-batch's inputs and targets */
  double history = 16.0 * ((double)s->steps + 1), tokens = 8.0 * (double)s->batch * (double)s->seq *
                   (double)(m->pipe.kind ? s->grad_accum : 1) + 4.0 * (double)s->grad_accum;
  const char *what;
  double have = machine_memory(&what);
  double host = history + tokens + (backend == BACKEND_CUDA ? 0 : per_rank * world);
  char need_s[32], have_s[32], rank_s[32], state_s[32], arena_s[32];
  human(have, have_s, sizeof have_s);
  human(state, state_s, sizeof state_s);
  human(arena, arena_s, sizeof arena_s);
  human(per_rank, rank_s, sizeof rank_s);
  if (backend == BACKEND_CUDA) {
    CudaDeviceInfo info;
    char why[256];
    if (!cuda_device_query(0, &info, why, sizeof why) && info.total_mem > 0 && per_rank > (double)info.total_mem) {
      char gpu_s[32];
      human((double)info.total_mem, gpu_s, sizeof gpu_s);
      bool acts = arena >= state;
      return config_errorf(err, errlen, 2, "%s: key \"%s\" (%s): a rank needs %s of GPU memory (state %s, activations "
                           "and workspace %s, as planned) and the GPU (%s) has %s; %s", f, acts ? "batch" : "mesh",
                           acts ? "--batch" : "--mesh", rank_s, state_s, arena_s, info.name, gpu_s,
                           acts ? "lower batch (and raise grad_accum), or recompute activations (--recompute full)"
                                : "spread the model over more GPUs (--mesh tp=N or pp=N, --zero 3) or use a smaller one");
    }
  }
  if (host <= have) return 0;
  human(host, need_s, sizeof need_s);
  if (history > host / 2)
    return config_errorf(err, errlen, 2, "%s: key \"steps\" (--steps): %lld steps keep %.3g GB of per-step history and "
                         "the run needs %s in all, and this machine has %s (%s); set fewer steps", f,
                         (long long)s->steps, history / 1e9, need_s, have_s, what);
  if (tokens > host / 2)
    return config_errorf(err, errlen, 2, "%s: key \"grad_accum\" (--grad-accum): %lld micro-batches of batch %lld x seq "
                         "%lld need %s of tokens and the run %s in all, and this machine has %s (%s); lower grad_accum "
                         "or batch", f, (long long)s->grad_accum, (long long)s->batch, (long long)s->seq, need_s, need_s,
                         have_s, what);
  if (world > 1 && per_rank <= have / 2)
    return config_errorf(err, errlen, 2, "%s: key \"mesh\" (--mesh): %.0f ranks run in this process, each needing %s "
                         "(state %s, activations and workspace %s, as planned): %s in all, and this machine has %s (%s); "
                         "use fewer ranks or a smaller batch", f, world, rank_s, state_s, arena_s, need_s, have_s, what);
  if (arena >= state)
    return config_errorf(err, errlen, 2, "%s: key \"batch\" (--batch): %lld: batch %lld x seq %lld needs %s of "
                         "activations and workspace per rank (state %s, as planned): %s in all, and this machine has %s "
                         "(%s); lower batch (and raise grad_accum for the same tokens per step) or recompute "
                         "activations (--recompute full)", f, (long long)s->batch, (long long)s->batch,
                         (long long)s->seq, arena_s, state_s, need_s, have_s, what);
  int64_t value;
  const char *key = config_largest_key(&s->model, &value);
  return config_errorf(err, errlen, 2, "%s: key \"%s\" of the model: %lld: the model's %lld parameters need %s for weights, "
                       "gradients and optimizer state (activations %s more, as planned): %s in all, and this machine "
                       "has %s (%s); set a smaller %s", s->model_path[0] ? s->model_path : f, key, (long long)value,
                       (long long)config_param_count(&s->model), state_s, arena_s, need_s, have_s, what, key);
}
