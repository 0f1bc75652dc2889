/* runtime/exec/hf_export.c — a folder that Hugging Face transformers loads as it is
 * (`from_pretrained(DIR)`), from `loom train --out DIR/` or `loom export CHECKPOINT -o DIR`:
 *
 *   config.json              the model's Hugging Face config (the spec's "model", or the spec
 *                            itself when it is a config.json), with torch_dtype set
 *   model.safetensors        the model's tensors only, under the hub's names, f32 or bf16
 *                            (--dtype; round to nearest even), metadata {"format": "pt"}
 *   generation_config.json   bos/eos token ids from the config
 *   tokenizer.json           a copy of --tokenizer, when given
 *   metrics.json             losses, grad_norms, lrs (and val_losses) per step, when known:
 *                            kept apart from the weights, so transformers loads no stray tensor
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "runtime/io/safetensors.h"
#include "runtime/exec/exec.h"

/* Reads a JSON file (the runner of compiled executables links no frontend, so not
   config_read_json_file); errors name the file, line and column. */
static int read_json(const char *path, json_t **out, char *err, size_t errlen) {
  json_error_t je;
  *out = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (*out) return 0;
  snprintf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
  return EXIT_USAGE;
}

/* The model's HF config object (a new reference) from a run spec or a config.json. */
int hf_model_config(const char *spec_path, json_t **out, char *err, size_t errlen) {
  json_t *root;
  int rc = read_json(spec_path, &root, err, errlen);
  if (rc) return rc;
  json_t *m = json_object_get(root, "model");
  if (!m) {   /* the spec is a config.json */
    *out = root;
    return 0;
  }
  if (json_is_object(m)) {
    *out = json_deep_copy(m);
    json_decref(root);
    return *out ? 0 : EXIT_RUN;
  }
  if (!json_is_string(m)) {
    json_decref(root);
    snprintf(err, errlen, "%s: \"model\" is neither a config object nor a path", spec_path);
    return EXIT_USAGE;
  }
  /* a path, relative to the spec's folder; a folder holds config.json */
  char path[8192];
  const char *slash = strrchr(spec_path, '/');
  const char *mp = json_string_value(m);
  if (mp[0] == '/' || !slash) snprintf(path, sizeof path, "%s", mp);
  else snprintf(path, sizeof path, "%.*s/%s", (int)(slash - spec_path), spec_path, mp);
  struct stat sb;
  if (!stat(path, &sb) && S_ISDIR(sb.st_mode)) strncat(path, "/config.json", sizeof path - strlen(path) - 1);
  json_decref(root);
  return read_json(path, out, err, errlen);
}

static int write_json(const char *dir, const char *name, json_t *j, char *err, size_t errlen) {
  char path[8192];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS)) {
    snprintf(err, errlen, "cannot write %s", path);
    return EXIT_RUN;
  }
  return 0;
}

static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1);   /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static json_t *series(const float *x, int64_t n) {
  json_t *a = json_array();
  for (int64_t i = 0; i < n; i++) json_array_append_new(a, isfinite(x[i]) ? json_real(x[i]) : json_null());
  return a;
}

int hf_export_dir(const char *dir, const char *spec_path, const StTensor *params, int n, bool bf16,
                  const char *tokenizer, const HfMetrics *metrics, FILE *log, char *err, size_t errlen) {
  if (!spec_path) {
    snprintf(err, errlen, "--out %s: a Hugging Face folder needs the model's config; write a .safetensors file here, "
             "or use 'loom export CHECKPOINT -o DIR --spec SPEC'", dir);
    return EXIT_USAGE;
  }
  json_t *cfg;
  int rc = hf_model_config(spec_path, &cfg, err, errlen);
  if (rc) return rc;
  rc = hf_export_dir_config(dir, cfg, params, n, bf16, tokenizer, metrics, log, err, errlen);
  json_decref(cfg);
  return rc;
}

int hf_export_dir_config(const char *dir, const json_t *model, const StTensor *params, int n, bool bf16,
                         const char *tokenizer, const HfMetrics *metrics, FILE *log, char *err, size_t errlen) {
  json_t *cfg = json_deep_copy(model);
  int rc = 0;
  if (!cfg) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  if (mkdir(dir, 0777) && errno != EEXIST) {
    snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
    json_decref(cfg);
    return EXIT_RUN;
  }
  json_object_set_new(cfg, "torch_dtype", json_string(bf16 ? "bfloat16" : "float32"));
  json_t *gen = json_object();
  json_object_set_new(gen, "_from_model_config", json_true());
  const char *ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
  for (int k = 0; k < 3; k++)
    if (json_object_get(cfg, ids[k])) json_object_set(gen, ids[k], json_object_get(cfg, ids[k]));
  rc = write_json(dir, "config.json", cfg, err, errlen);
  if (!rc) rc = write_json(dir, "generation_config.json", gen, err, errlen);
  json_decref(cfg);
  json_decref(gen);
  if (rc) return rc;

  /* model.safetensors */
  StTensor *st = calloc((size_t)n + 1, sizeof *st);
  uint16_t **half = calloc((size_t)n + 1, sizeof *half);
  if (!st || !half) {
    free(st), free(half);
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  for (int i = 0; i < n && !rc; i++) {
    st[i] = params[i];
    if (params[i].dtype != ST_F32) {
      snprintf(err, errlen, "internal error: %s is not f32", params[i].name);
      rc = EXIT_RUN;
      break;
    }
    if (!bf16) continue;
    int64_t count = (int64_t)(params[i].nbytes / 4);
    half[i] = malloc(sizeof(uint16_t) * (size_t)(count ? count : 1));
    if (!half[i]) {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
      break;
    }
    const float *x = params[i].data;
    for (int64_t e = 0; e < count; e++) half[i][e] = to_bf16(x[e]);
    st[i].dtype = ST_BF16, st[i].nbytes = (uint64_t)count * 2, st[i].data = half[i];
  }
  char path[8192];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  const char *mk[] = {"format"}, *mv[] = {"pt"};
  if (!rc) rc = st_write(path, st, n, mk, mv, 1, err, errlen);
  for (int i = 0; i < n; i++) free(half[i]);
  free(half), free(st);
  if (rc) return rc;

  if (tokenizer) {   /* a copy, checked to be JSON first */
    json_t *tok;
    if ((rc = read_json(tokenizer, &tok, err, errlen))) return rc;
    rc = write_json(dir, "tokenizer.json", tok, err, errlen);
    json_decref(tok);
    if (rc) return rc;
  }
  if (metrics && metrics->n > 0) {
    json_t *mj = json_object();
    json_object_set_new(mj, "losses", series(metrics->losses, metrics->n));
    json_object_set_new(mj, "grad_norms", series(metrics->grad_norms, metrics->n));
    json_object_set_new(mj, "lrs", series(metrics->lrs, metrics->n));
    if (metrics->val_losses) json_object_set_new(mj, "val_losses", series(metrics->val_losses, metrics->n));
    rc = write_json(dir, "metrics.json", mj, err, errlen);
    json_decref(mj);
    if (rc) return rc;
  }
  if (log)
    fprintf(log, "wrote %s/ for transformers: config.json, model.safetensors (%d tensors, %s)%s%s, generation_config.json\n",
            dir, n, bf16 ? "bf16" : "f32", tokenizer ? ", tokenizer.json" : "", metrics && metrics->n ? ", metrics.json" : "");
  return 0;
}

bool hf_export_wanted(const char *out) {
  size_t n = strlen(out);
  struct stat sb;
  return (n && out[n - 1] == '/') || (!stat(out, &sb) && S_ISDIR(sb.st_mode));
}
