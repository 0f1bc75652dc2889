/* tools/cmd_export.c — `loom export CHECKPOINT -o DIR`: a training checkpoint as a folder that
 * Hugging Face transformers loads as it is (runtime/exec/hf_export.c writes it). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom export CHECKPOINT -o DIR [--spec SPEC.json] [--dtype f32|bf16] [--tokenizer T.json]\n"
  "\n"
  "Writes a checkpoint's weights as a folder transformers loads with from_pretrained(DIR):\n"
  "config.json, model.safetensors (the model's tensors only, under the hub's names),\n"
  "generation_config.json, tokenizer.json (with --tokenizer) and metrics.json (the losses,\n"
  "gradient norms and learning rates the checkpoint recorded).  CHECKPOINT is a --save-dir\n"
  "(its newest complete step) or one step folder.\n"
  "\n"
  "options:\n"
  "  -o DIR               the folder to write (created if needed)\n"
  "  --spec SPEC.json     the run spec or config.json of the model (default: the model config\n"
  "                       the checkpoint carries in its state.json; the spec path it records is\n"
  "                       never opened)\n"
  "  --dtype f32|bf16     the weights' dtype (default f32; bf16 rounds to nearest even)\n"
  "  --tokenizer T.json   copied into DIR as tokenizer.json\n"
  "  -h, --help           show this help\n";

/* A float array of state.json (NULL if absent or not an array of numbers / nulls). */
static float *series(json_t *state, const char *key, int64_t *n) {
  json_t *a = json_object_get(state, key);
  if (!json_is_array(a)) return NULL;
  size_t len = json_array_size(a);
  float *x = malloc(sizeof(float) * (len ? len : 1));
  if (!x) return NULL;
  for (size_t i = 0; i < len; i++) {
    json_t *v = json_array_get(a, i);
    x[i] = json_is_number(v) ? (float)json_number_value(v) : NAN;
  }
  *n = (int64_t)len;
  return x;
}

int cmd_export(int argc, char **argv) {
  const char *ckpt = NULL, *out = NULL, *spec = NULL, *tokenizer = NULL, *v;
  bool bf16 = false;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      fputs(help, stdout);
      return EXIT_OK;
    }
    if ((r = arg_value(argc, argv, &i, "-o", &v))) {
      if (r < 0) return usage_error("export", "-o needs a folder");
      out = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--spec", &v))) {
      if (r < 0) return usage_error("export", "--spec needs a run spec or config.json");
      spec = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--tokenizer", &v))) {
      if (r < 0) return usage_error("export", "--tokenizer needs a tokenizer.json");
      tokenizer = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--dtype", &v))) {
      if (r < 0 || (strcmp(v, "f32") && strcmp(v, "bf16"))) return usage_error("export", "--dtype takes f32 or bf16");
      bf16 = !strcmp(v, "bf16");
      continue;
    }
    if (argv[i][0] == '-') return unknown_option("export", argv[i], help);
    if (ckpt) return usage_error("export", "more than one checkpoint ('%s' and '%s')", ckpt, argv[i]);
    ckpt = argv[i];
  }
  if (!ckpt || !out) return usage_error("export", "give a checkpoint and -o DIR (loom export CHECKPOINT -o DIR)");
  char err[12288] = "", stepdir[4096];
  int64_t step = 0;
  int rc = ckpt_latest(ckpt, stepdir, sizeof stepdir, &step, err, sizeof err);
  if (rc) {
    /* the checkpoint reader's advice is a resuming run's: say export's */
    char *tail = strstr(err, "; train from the start or pass another --resume folder");
    if (tail)
      snprintf(tail, sizeof err - (size_t)(tail - err), "; give a --save-dir folder of loom train or one of its step_* folders");
    return report(rc, err);
  }
  if (err[0]) fprintf(stderr, "loom: warning: %s\n", err);
  Checkpoint ck;
  if ((rc = ckpt_load(stepdir, &ck, err, sizeof err))) return report(rc, err);
  json_error_t je;
  json_t *state = json_loads(ck.state_json, 0, &je);
  /* the model's config: --spec, else the one the checkpoint carries (settings.model); the path
     settings.spec names is never opened (it may point anywhere) */
  json_t *model = json_object_get(json_object_get(state, "settings"), "model");
  if (!spec && !json_is_object(model)) {
    snprintf(err, sizeof err, "%s/state.json carries no model config (a checkpoint of an older loom); give --spec "
             "SPEC.json (the run spec or config.json the model was trained from)", stepdir);
    json_decref(state);
    ckpt_free(&ck);
    return report(EXIT_USAGE, err);
  }
  StTensor *params = calloc((size_t)ck.params.n + 1, sizeof *params);
  if (!params) {
    json_decref(state);
    ckpt_free(&ck);
    return report(EXIT_RUN, "out of memory");
  }
  for (int i = 0; i < ck.params.n && !rc; i++) {
    params[i] = ck.params.tensors[i];
    if (params[i].dtype != ST_F32) {
      snprintf(err, sizeof err, "%s/model.safetensors: %s is %s, not F32 (not a loom checkpoint?)", stepdir,
               params[i].name, st_dtype_name(params[i].dtype));
      rc = EXIT_USAGE;
    }
  }
  HfMetrics hm = {0};
  int64_t n1 = 0, n2 = 0, n3 = 0, n4 = 0;
  float *l = series(state, "losses", &n1), *g = series(state, "grad_norms", &n2), *lr = series(state, "lrs", &n3),
        *vl = series(state, "val_losses", &n4);
  if (l && g && lr && n1 == n2 && n1 == n3) hm = (HfMetrics){n1, l, g, lr, vl && n4 == n1 ? vl : NULL};
  if (!rc && spec) rc = hf_export_dir(out, spec, params, ck.params.n, bf16, tokenizer, hm.n ? &hm : NULL, stdout, err, sizeof err);
  else if (!rc) rc = hf_export_dir_config(out, model, params, ck.params.n, bf16, tokenizer, hm.n ? &hm : NULL, stdout, err,
                                          sizeof err);
  free(l), free(g), free(lr), free(vl), free(params);
  json_decref(state);
  ckpt_free(&ck);
  return report(rc, err);
}
