/* driver/prepare.c — a run spec and its overrides to a module ready to run: the spec loaded,
 * the backend chosen, the training pipeline (and for cpu and cuda the lowering pipeline) run.
 * The settings a run records in checkpoints and executables come from here too. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
  PassOptions popt;
  memset(&popt, 0, sizeof popt);
  popt.train = &ts;
  popt.target = *backend == BACKEND_CUDA ? TARGET_CUDA : TARGET_CPU;
  if ((rc = pipeline_run(in->m, *backend == BACKEND_REF ? TRAIN_PIPELINE : TRAIN_PIPELINE "," LOWER_PIPELINE, &popt, err,
                         errlen)))
    return rc;
  if (!t->quiet)
    printf("compiled %s: %lld parameters, batch %lld x seq %lld x grad_accum %lld, %s, %s backend, in %.2f s\n", spec,
           (long long)config_param_count(&s->model), (long long)s->batch, (long long)s->seq, (long long)s->grad_accum,
           s->precision, *backend == BACKEND_CPU ? "cpu" : *backend == BACKEND_CUDA ? "cuda" : "reference", seconds_now() - t0);
  return 0;
}
