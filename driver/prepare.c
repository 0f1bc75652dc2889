/* driver/prepare.c — a run spec and its overrides to a module ready to run: the spec loaded,
 * the backend chosen, the training pipeline (and for cpu and cuda the lowering pipeline) run.
 * The settings a run records in checkpoints and executables come from here too. */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/lower_common.h"
#include "driver/driver.h"

TrainSettings spec_train_settings(const RunSpec *s) {
  TrainSettings ts = train_defaults;
  ts.grad_accum = s->grad_accum, ts.beta1 = s->beta1, ts.beta2 = s->beta2, ts.eps = s->eps;
  ts.weight_decay = s->weight_decay, ts.grad_clip = s->grad_clip, ts.bf16 = !strcmp(s->precision, "bf16");
  ts.zero = s->zero, ts.sp = s->sequence_parallel, ts.bucket_mb = s->bucket_mb;
  ts.overlap = s->overlap, ts.cp_contiguous = s->cp_contiguous, ts.cp_allgather = s->cp_allgather;
  ts.pp_schedule = s->pp_schedule, ts.pp_virtual = (int)s->pp_virtual, ts.n_pp_split = s->n_pp_split;
  memcpy(ts.pp_split, s->pp_split, sizeof ts.pp_split);
  ts.recompute = s->recompute, ts.recompute_classes = s->recompute_classes, ts.memory_budget = s->memory_budget;
  return ts;
}

/* The settings a checkpoint records, to tell runs apart. */
char *spec_settings_json(const RunSpec *s) {
  json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:f, s:f, s:f, s:f, s:f, s:s, s:I}",
                        "spec", s->path, "batch", (json_int_t)s->batch, "seq", (json_int_t)s->seq, "grad_accum",
                        (json_int_t)s->grad_accum, "steps", (json_int_t)s->steps, "lr", s->lr, "min_lr", s->min_lr,
                        "warmup", (json_int_t)s->warmup, "weight_decay", s->weight_decay, "beta1", s->beta1, "beta2",
                        s->beta2, "eps", s->eps, "grad_clip", s->grad_clip, "precision", s->precision, "seed",
                        (json_int_t)s->seed);
  /* the model's config itself: a checkpoint carries what `loom export` needs, and nothing
     sends loom back to read the spec's path later */
  json_t *cfg = NULL;
  char ignored[256];
  if (!hf_model_config(s->path, &cfg, ignored, sizeof ignored)) json_object_set_new(o, "model", cfg);
  char *text = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(o);
  return text;
}


int train_prepare(TrainArgs *t, const char *spec, Input *in, Backend *backend, char *err, size_t errlen) {
  memset(in, 0, sizeof *in);
  if (t->data_json[0]) {
    if (t->n_ov == 64) return EXIT_USAGE;
    snprintf(t->ovbuf[t->n_ov], sizeof t->ovbuf[0], "data=%s", t->data_json);
    t->ov[t->n_ov] = t->ovbuf[t->n_ov];
    t->n_ov++;
  }
  double t0 = seconds_now();
  int rc = input_load(spec, t->ov, t->n_ov, in, err, errlen);
  if (rc) return rc;
  RunSpec *s = &in->spec;
  int64_t world = 1;
  for (int a = 0; a < MESH_AXES; a++) world *= s->mesh[a];
  /* One rank: cuda when a GPU is here, else cpu.  A mesh runs its ranks as threads of this
     process, on the cpu backend unless --backend ref or cuda (one process per GPU) is asked for. */
  char why[256];
  if (t->backend)
    *backend = !strcmp(t->backend, "cpu") ? BACKEND_CPU : !strcmp(t->backend, "cuda") ? BACKEND_CUDA : BACKEND_REF;
  else
    *backend = world > 1 ? BACKEND_CPU : cuda_backend_available(why, sizeof why) ? BACKEND_CUDA : BACKEND_CPU;
  TrainSettings ts = spec_train_settings(s);
  PassOptions popt = t->hooks;   /* the command's --print-ir-after, --dump-dir, ... */
  popt.train = &ts;
  popt.target = *backend == BACKEND_CUDA ? TARGET_CUDA : TARGET_CPU;
  char repro[4096];
  repro_command(spec, t->argc, t->argv, popt.target == TARGET_CUDA ? "--target=cuda" : NULL, repro, sizeof repro);
  popt.repro_cmd = repro;
  if ((rc = pipeline_run(in->m, *backend == BACKEND_REF ? TRAIN_PIPELINE : TRAIN_PIPELINE "," LOWER_PIPELINE, &popt, err,
                         errlen)))
    return rc;
  if (!t->quiet)
    /* "built": the passes; lowering, kernel compilation and the parameters follow, each with
       its own line and time */
    printf("built the training step of %s: %lld parameters, batch %lld x seq %lld x grad_accum %lld, %s, %s backend, in "
           "%.2f s\n", spec,
           (long long)config_param_count(&s->model), (long long)s->batch, (long long)s->seq, (long long)s->grad_accum,
           s->precision, *backend == BACKEND_CPU ? "cpu" : *backend == BACKEND_CUDA ? "cuda" : "reference", seconds_now() - t0);
  return 0;
}

/* The flags `loom ir` takes that change the module its pipeline starts from or what the
   passes do (tools/cmd_ir.c's list, and --target). */
static const char *const ir_flags[] = {"--batch", "--seq", "--precision", "--grad-accum", "--mesh", "--zero",
                                       "--sequence-parallel", "--bucket-mb", "--vocab-multiple", "--pp-schedule",
                                       "--pp-virtual", "--pp-split", "--overlap", "--cp-balance", "--cp-attn",
                                       "--recompute", "--memory-budget", "--capacity-factor", "--target"};

static void put_quoted(char *out, size_t n, const char *s) {
  size_t k = strlen(out);
  if (k + 1 >= n) return;
  bool plain = *s && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:+@%") == strlen(s);
  if (plain) {
    snprintf(out + k, n - k, " %s", s);
    return;
  }
  snprintf(out + k, n - k, " '");
  for (const char *p = s; *p; p++) {
    k = strlen(out);
    if (*p == '\'') snprintf(out + k, n - k, "'\\''");
    else snprintf(out + k, n - k, "%c", *p);
  }
  k = strlen(out);
  snprintf(out + k, n - k, "'");
}

void repro_command(const char *input, int argc, char **argv, const char *extra, char *out, size_t n) {
  snprintf(out, n, "loom ir");
  put_quoted(out, n, input);
  for (int i = 1; i < argc; i++)
    for (size_t k = 0; k < sizeof ir_flags / sizeof ir_flags[0]; k++) {
      size_t len = strlen(ir_flags[k]);
      if (strncmp(argv[i], ir_flags[k], len)) continue;
      if (argv[i][len] == '=') put_quoted(out, n, argv[i]);
      else if (!argv[i][len] && i + 1 < argc) {
        put_quoted(out, n, argv[i]);
        put_quoted(out, n, argv[++i]);
      }
      break;
    }
  if (extra) put_quoted(out, n, extra);
}

/* The training entry point of a prepared module: the backend's, and for a CUDA mesh this
   process's rank (the command started or joined the processes).  The cpu backend runs a mesh
   as threads itself (run_training_cpu). */
int driver_train(Module *m, Backend backend, const RunPlan *plan, char *err, size_t errlen) {
  bool mesh = mesh_world(&m->mesh) > 1;
  switch (backend) {
  case BACKEND_CUDA: return mesh ? run_training_cuda_rank(m, plan, err, errlen) : run_training_cuda(m, plan, err, errlen);
  case BACKEND_CPU: return run_training_cpu(m, plan, err, errlen);
  default: {   /* the reference interpreter: the module described as a program (no steps) */
    RtProgram desc;
    int rc = cg_describe_module(m, &desc, err, errlen);
    return rc ? rc : run_training_ref(m, &desc, plan, err, errlen);
  }
  }
}

/* MFU's numerator: the model FLOPs of one rank's step (passes/flops.c): its @grad_step per
   micro-batch; in a pipeline, every chunk's forward and backward functions per micro-batch,
   over the pp ranks (the bubble is then lost time, as MFU counts it). */
double driver_step_flops(const Module *m, int64_t grad_accum) {
  Func *gs = module_find_func(m, "grad_step");
  if (gs) {
    double mm = 0, at = 0;
    flops_of(gs, &mm, &at);
    return (mm + at) * (double)grad_accum;
  }
  if (m->pipe.chunks <= 0) return 0;
  double total = 0;
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (strncmp(f->name, "fwd.c", 5) && strncmp(f->name, "bwd.c", 5) && strncmp(f->name, "bwd_b.c", 7) &&
        strncmp(f->name, "bwd_w.c", 7))
      continue;
    double mm = 0, at = 0;
    flops_of(f, &mm, &at);
    total += mm + at;
  }
  return total * (double)m->pipe.micro / (double)m->mesh.size[AX_PP];
}
