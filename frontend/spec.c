/* frontend/spec.c: loom run specs -> RunSpec. A spec is a JSON object naming the model
 * (an embedded HF config or a path to one) and the training settings; a bare HF
 * config.json is a spec with every setting at its default. Unknown keys are errors with a
 * "did you mean", since a silently ignored typo trains with the wrong settings. */
#include "frontend/config.h"
#include "ir/ir.h"

#include <errno.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static const char *const SPEC_KEYS[] = {
    "model", "batch",        "seq",   "steps",     "grad_accum", "lr",   "min_lr", "warmup",
    "weight_decay", "beta1", "beta2", "eps",       "grad_clip",  "precision", "mesh", "zero",
    "seed",  "save_every",   "data",  "init",      "out",        "save_dir", "sequence_parallel",
    "bucket_mb", "vocab_multiple", "pp_schedule", "pp_virtual", "pp_split", "overlap",
    "recompute", "memory_budget", "cp_balance", "cp_attn", "capacity_factor",
};
#define N_SPEC_KEYS (sizeof SPEC_KEYS / sizeof SPEC_KEYS[0])

/* Names other tools use for the same settings, for better suggestions than edit distance. */
static const struct {
  const char *other, *ours;
} SYNONYMS[] = {
    {"learning_rate", "lr"},     {"batch_size", "batch"},        {"micro_batch_size", "batch"},
    {"seq_len", "seq"},          {"sequence_length", "seq"},     {"block_size", "seq"},
    {"seq_length", "seq"},       {"max_steps", "steps"},         {"num_steps", "steps"},
    {"train_steps", "steps"},    {"gradient_accumulation_steps", "grad_accum"},
    {"warmup_steps", "warmup"},  {"adam_beta1", "beta1"},        {"adam_beta2", "beta2"},
    {"adam_epsilon", "eps"},     {"adam_eps", "eps"},            {"max_grad_norm", "grad_clip"},
    {"clip_grad", "grad_clip"},  {"dtype", "precision"},         {"zero_stage", "zero"},
    {"checkpoint_every", "save_every"}, {"output_dir", "save_dir"}, {"checkpoint_dir", "save_dir"},
    {"config", "model"},         {"train_data", "data"},         {"dp", "mesh"},
    {"tp", "mesh"},              {"cp", "mesh"},                 {"pp", "mesh"},
    {"ep", "mesh"},              {"bucket_cap_mb", "bucket_mb"}, {"bucket_size", "bucket_mb"},
    {"make_vocab_size_divisible_by", "vocab_multiple"}, {"pipeline_schedule", "pp_schedule"},
    {"virtual_pipeline_model_parallel_size", "pp_virtual"}, {"num_virtual_stages", "pp_virtual"},
    {"pipeline_split", "pp_split"}, {"activation_checkpointing", "recompute"},
    {"recompute_granularity", "recompute"}, {"context_parallel_balance", "cp_balance"},
    {"cp_comm_type", "cp_attn"}, {"moe_capacity_factor", "capacity_factor"}, {"expert_capacity", "capacity_factor"}, {"context_parallel_attention", "cp_attn"}, {"memory_limit", "memory_budget"}, {"pad_vocab_size_to_multiple_of", "vocab_multiple"},
};

static const char *const AXES[MESH_AXES] = {"dp", "tp", "cp", "pp", "ep"};

typedef struct {
  RunSpec *s;
  const char *file;        /* names the source in messages */
  char dir[SPEC_PATH_MAX]; /* relative paths are resolved against it ("" = as given) */
  char *err;
  size_t errlen;
} SpecReader;

void spec_defaults(RunSpec *s) {
  memset(s, 0, sizeof *s);
  s->batch = 4;
  s->seq = 0; /* filled from the model once it is known */
  s->steps = 10;
  s->grad_accum = 1;
  s->warmup = 0;
  s->save_every = 0;
  s->seed = 1337;
  s->lr = 3e-4;
  s->min_lr = 0.0;
  s->weight_decay = 0.1;
  s->beta1 = 0.9;
  s->beta2 = 0.95;
  s->eps = 1e-8;
  s->grad_clip = 1.0;
  snprintf(s->precision, sizeof s->precision, "fp32");
  for (int i = 0; i < MESH_AXES; i++) s->mesh[i] = 1;
  s->zero = 0;
  s->bucket_mb = 25.0;
  s->vocab_multiple = 1;
  s->overlap = true;
}

static void default_seq(RunSpec *s) {
  if (!(s->set_mask & SPEC_SET_SEQ)) s->seq = s->model.max_pos < 1024 ? s->model.max_pos : 1024;
}

static int bad(const SpecReader *r, const char *key, const char *expected, const json_t *v,
               const char *fix) {
  char found[96];
  config_describe_value(v, found, sizeof found);
  return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": expected %s, found %s; %s", r->file,
                       key, expected, found, fix);
}

/* `key` (shown as prefix + key) is not one of `valid`: suggest the closest. */
static int unknown_key(const SpecReader *r, const char *prefix, const char *key,
                       const char *const *valid, size_t n, const char *what) {
  const char *best = NULL;
  if (!prefix[0])
    for (size_t i = 0; i < sizeof SYNONYMS / sizeof SYNONYMS[0]; i++)
      if (strcasecmp(key, SYNONYMS[i].other) == 0) best = SYNONYMS[i].ours;
  if (!best) {
    size_t best_d = (size_t)-1, len = strlen(key);
    for (size_t i = 0; i < n; i++) {
      size_t d = config_edit_distance(key, valid[i]);
      if (d < best_d) best_d = d, best = valid[i];
    }
    size_t vlen = best ? strlen(best) : 0;
    /* A typo changes a few letters, never most of the name. */
    if (!best || best_d >= (len > vlen ? len : vlen) || (best_d > 2 && best_d * 3 > len)) best = NULL;
  }
  if (best && strcmp(best, "mesh") == 0 && strcmp(key, "mesh") != 0)
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s%.100s\": unknown %s; mesh axes go inside \"mesh\": write "
                         "\"mesh\": {\"%.100s\": ...}",
                         r->file, prefix, key, what, key);
  if (best)
    return config_errorf(r->err, r->errlen, 2, "%s: key \"%s%.100s\": unknown %s; did you mean \"%s\"?",
                         r->file, prefix, key, what, best);
  char list[512] = "";
  for (size_t i = 0; i < n; i++) {
    strncat(list, valid[i], sizeof list - strlen(list) - 1);
    if (i + 1 < n) strncat(list, ", ", sizeof list - strlen(list) - 1);
  }
  return config_errorf(r->err, r->errlen, 2, "%s: key \"%s%.100s\": unknown %s; valid: %s", r->file,
                       prefix, key, what, list);
}

/* An integer in [lo, hi]; a float with an integral value is accepted. */
static int int_setting(const SpecReader *r, const char *key, const json_t *v, int64_t lo,
                       int64_t hi, const char *expected, const char *fix, int64_t *out) {
  if (json_is_integer(v)) {
    json_int_t x = json_integer_value(v);
    if (x >= lo && x <= hi) {
      *out = (int64_t)x;
      return 0;
    }
  } else if (json_is_real(v)) {
    double d = json_real_value(v);
    /* 2^63 itself is out of range: compare strictly so the cast cannot overflow. */
    if (isfinite(d) && d == floor(d) && d >= (double)lo && d <= (double)hi &&
        d < 9223372036854775808.0) {
      *out = (int64_t)d;
      return 0;
    }
  }
  return bad(r, key, expected, v, fix);
}

typedef enum { NONNEG, POSITIVE, UNIT } Range; /* >= 0, > 0, [0, 1) */

static int num_setting(const SpecReader *r, const char *key, const json_t *v, Range range,
                       const char *fix, double *out) {
  static const char *const expected[] = {"a number >= 0", "a number > 0", "a number in [0, 1)"};
  double d = json_is_number(v) ? json_number_value(v) : NAN;
  bool ok = isfinite(d) && (range == POSITIVE ? d > 0 : d >= 0) && (range != UNIT || d < 1);
  if (!ok) {
    if (json_is_string(v))
      return bad(r, key, expected[range], v, "write the number without quotes");
    return bad(r, key, expected[range], v, fix);
  }
  *out = d;
  return 0;
}

/* Joins the reader's folder and a relative path. */
static int resolve_path(const SpecReader *r, const char *key, const char *p, char *out) {
  const char *dir = (p[0] == '/') ? "" : r->dir;
  int w = snprintf(out, SPEC_PATH_MAX, "%s%s", dir, p);
  if (w < 0 || w >= SPEC_PATH_MAX)
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": the path is longer than %d bytes once joined to \"%s\"; "
                         "use a shorter path",
                         r->file, key, SPEC_PATH_MAX - 1, dir);
  return 0;
}

static int path_setting(const SpecReader *r, const char *key, const json_t *v, const char *fix,
                        char *out) {
  if (!json_is_string(v) || json_string_length(v) == 0)
    return bad(r, key, "a non-empty path string", v, fix);
  if (strlen(json_string_value(v)) != json_string_length(v))
    return bad(r, key, "a path without NUL characters", v, fix);
  return resolve_path(r, key, json_string_value(v), out);
}

static int set_model(const SpecReader *r, const json_t *v) {
  RunSpec *s = r->s;
  if (json_is_object(v)) {
    s->model_path[0] = '\0';
    int rc = config_from_json((json_t *)v, r->file, "model", &s->model, r->err, r->errlen);
    return rc ? rc : config_check_bounds(&s->model, r->file, "model", r->err, r->errlen);
  }
  if (!json_is_string(v) || json_string_length(v) == 0)
    return bad(r, "model", "a Hugging Face config object or the path of a config.json", v,
               "write \"model\": {\"model_type\": ...} or \"model\": \"path/to/config.json\"");
  char path[SPEC_PATH_MAX];
  int rc = resolve_path(r, "model", json_string_value(v), path);
  if (rc) return rc;
  struct stat st;
  if (stat(path, &st) != 0)
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"model\": cannot open \"%s\": %s; give the path of a "
                         "config.json (relative paths are taken from %s)",
                         r->file, path, strerror(errno),
                         r->dir[0] ? "the spec's folder" : "the current folder");
  if ((rc = config_load(path, &s->model, r->err, r->errlen))) {
    /* a run spec named as the model (each of models/ is a run spec itself): say which
       file named it, and what to name instead */
    if (strstr(r->err, "(this looks like a loom run spec: load it as one)"))
      return config_errorf(r->err, r->errlen, 2,
                           "%s: key \"model\": \"%s\" is a loom run spec, not a Hugging Face config; name a "
                           "config.json (or write the model's keys inline), or give \"%s\" to loom itself",
                           r->file, path, path);
    return rc;
  }
  if ((rc = config_check_bounds(&s->model, path, "", r->err, r->errlen))) return rc;
  if (S_ISDIR(st.st_mode)) {
    size_t n = strlen(path);
    if (n + sizeof "/config.json" > SPEC_PATH_MAX) return 0;
    snprintf(path + n, SPEC_PATH_MAX - n, "%sconfig.json", (n && path[n - 1] == '/') ? "" : "/");
  }
  snprintf(s->model_path, sizeof s->model_path, "%s", path);
  return 0;
}

static int set_mesh(const SpecReader *r, const json_t *v) {
  if (!json_is_object(v))
    return bad(r, "mesh", "an object like {\"dp\": 2, \"tp\": 2}", v,
               "name each axis you use (dp, tp, cp, pp, ep) with its size");
  const char *name;
  json_t *size;
  json_object_foreach((json_t *)v, name, size) {
    int axis = -1;
    for (int i = 0; i < MESH_AXES; i++)
      if (strcmp(name, AXES[i]) == 0) axis = i;
    if (axis < 0) return unknown_key(r, "mesh.", name, AXES, MESH_AXES, "mesh axis");
    char key[32];
    snprintf(key, sizeof key, "mesh.%s", AXES[axis]);
    int rc = int_setting(r, key, size, 1, 1 << 20, "a positive integer", "set it to the number of ranks along this axis (1 = not split)",
                         &r->s->mesh[axis]);
    if (rc) return rc;
  }
  return 0;
}

static int set_data(const SpecReader *r, const json_t *v) {
  RunSpec *s = r->s;
  const char *fix = "give a token shard path or an array of them";
  if (json_is_string(v)) {
    int rc = path_setting(r, "data", v, fix, s->data[0]);
    if (rc) return rc;
    s->n_data = 1;
    return 0;
  }
  if (!json_is_array(v) || json_array_size(v) == 0)
    return bad(r, "data", "a path or a non-empty array of paths", v, fix);
  if (json_array_size(v) > SPEC_MAX_DATA)
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"data\": expected at most %d paths, found %zu; merge shards or "
                         "list fewer",
                         r->file, SPEC_MAX_DATA, json_array_size(v));
  for (size_t i = 0; i < json_array_size(v); i++) {
    char key[32];
    snprintf(key, sizeof key, "data[%zu]", i);
    int rc = path_setting(r, key, json_array_get(v, i), fix, s->data[i]);
    if (rc) return rc;
  }
  s->n_data = (int)json_array_size(v);
  return 0;
}

static int set_precision(const SpecReader *r, const json_t *v) {
  const char *p = json_is_string(v) ? json_string_value(v) : NULL;
  if (p && (strcmp(p, "fp32") == 0 || strcmp(p, "bf16") == 0)) {
    snprintf(r->s->precision, sizeof r->s->precision, "%s", p);
    return 0;
  }
  const char *fix = "write \"fp32\" or \"bf16\"";
  if (p && (strcasecmp(p, "bfloat16") == 0 || strcasecmp(p, "bf16") == 0)) fix = "write \"bf16\"";
  if (p && (strcasecmp(p, "float32") == 0 || strcasecmp(p, "fp32") == 0 || strcasecmp(p, "f32") == 0))
    fix = "write \"fp32\"";
  if (p && (strcasecmp(p, "fp16") == 0 || strcasecmp(p, "float16") == 0 || strcasecmp(p, "f16") == 0))
    fix = "fp16 training (it needs loss scaling) is not yet supported: use \"bf16\"";
  return bad(r, "precision", "\"fp32\" or \"bf16\"", v, fix);
}

/* Applies one top-level key; returns -1 when the key is not a spec key. */
static int apply(const SpecReader *r, const char *key, const json_t *v) {
  RunSpec *s = r->s;
  int rc;
  const int64_t max = INT64_MAX;
#define INT(name, field, lo, hi, expected, fix, bit)                                              \
  if (strcmp(key, name) == 0) {                                                                   \
    if ((rc = int_setting(r, name, v, lo, hi, expected, fix, &s->field))) return rc;              \
    s->set_mask |= bit;                                                                           \
    return 0;                                                                                     \
  }
#define NUM(name, field, range, fix, bit)                                                         \
  if (strcmp(key, name) == 0) {                                                                   \
    if ((rc = num_setting(r, name, v, range, fix, &s->field))) return rc;                         \
    s->set_mask |= bit;                                                                           \
    return 0;                                                                                     \
  }
#define PATH(name, field, fix, bit)                                                               \
  if (strcmp(key, name) == 0) {                                                                   \
    if ((rc = path_setting(r, name, v, fix, s->field))) return rc;                                \
    s->set_mask |= bit;                                                                           \
    return 0;                                                                                     \
  }
  INT("batch", batch, 1, CONFIG_MAX_SIZE, "a positive integer",
      "set it to the number of sequences per micro-batch (e.g. 4)", SPEC_SET_BATCH)
  INT("seq", seq, 1, CONFIG_MAX_SIZE, "a positive integer",
      "set it to the sequence length in tokens (e.g. 1024)", SPEC_SET_SEQ)
  INT("steps", steps, 0, max, "an integer >= 0", "set it to the number of optimizer steps (e.g. 10)",
      SPEC_SET_STEPS)
  INT("grad_accum", grad_accum, 1, CONFIG_MAX_SIZE, "a positive integer",
      "set it to the micro-batches per optimizer step (1 = no accumulation)", SPEC_SET_GRAD_ACCUM)
  INT("warmup", warmup, 0, max, "an integer >= 0",
      "set it to the number of learning-rate warmup steps (0 = none)", SPEC_SET_WARMUP)
  INT("save_every", save_every, 0, max, "an integer >= 0",
      "set it to the steps between checkpoints (0 = never)", SPEC_SET_SAVE_EVERY)
  INT("seed", seed, 0, max, "an integer >= 0", "set it to any non-negative integer (e.g. 1337)",
      SPEC_SET_SEED)
  NUM("lr", lr, NONNEG, "set it to the peak learning rate (e.g. 3e-4)", SPEC_SET_LR)
  NUM("min_lr", min_lr, NONNEG, "set it to the final learning rate of the decay (e.g. 0)",
      SPEC_SET_MIN_LR)
  NUM("weight_decay", weight_decay, NONNEG, "set it to the AdamW weight decay (e.g. 0.1)",
      SPEC_SET_WEIGHT_DECAY)
  NUM("beta1", beta1, UNIT, "set it to Adam's first-moment decay (e.g. 0.9)", SPEC_SET_BETA1)
  NUM("beta2", beta2, UNIT, "set it to Adam's second-moment decay (e.g. 0.95)", SPEC_SET_BETA2)
  NUM("eps", eps, POSITIVE, "set it to Adam's epsilon (e.g. 1e-8)", SPEC_SET_EPS)
  NUM("grad_clip", grad_clip, NONNEG, "set it to the global gradient-norm limit (0 = no clipping)",
      SPEC_SET_GRAD_CLIP)
  INT("vocab_multiple", vocab_multiple, 1, 1 << 20, "a positive integer",
      "set it to round the vocabulary up to a multiple of it (e.g. 128: GPT-2's 50257 becomes 50304; "
      "the padded logits are masked, so results do not change)", SPEC_SET_VOCAB_MULTIPLE)
  NUM("bucket_mb", bucket_mb, NONNEG,
      "set it to the size in MB of the data-parallel gradient all-reduce buckets (e.g. 25; 0 = one per gradient)",
      SPEC_SET_BUCKET_MB)
  NUM("capacity_factor", capacity_factor, NONNEG,
      "set it to the experts' capacity as a multiple of an even share of the tokens (e.g. 1.25), or 0 for dropless "
      "routing (the default, as Hugging Face trains)", 0)
  PATH("init", init, "give the path of a safetensors file to start from", SPEC_SET_INIT)
  PATH("out", out, "give the path to write the trained weights to", SPEC_SET_OUT)
  PATH("save_dir", save_dir, "give the folder for checkpoints", SPEC_SET_SAVE_DIR)
#undef INT
#undef NUM
#undef PATH
  if (strcmp(key, "pp_schedule") == 0) {
    const char *p = json_is_string(v) ? json_string_value(v) : NULL;
    int k = p ? pipe_kind_parse(p) : -1;
    if (k < 0)
      return bad(r, key, "\"afab\", \"1f1b\", \"interleaved\", \"zb-h1\" or \"dualpipev\"", v,
                 "name a pipeline schedule (1f1b is the default)");
    s->pp_schedule = k;
    return 0;
  }
  if (strcmp(key, "recompute") == 0) {
    char why[300];
    const char *p = json_is_string(v) ? json_string_value(v) : NULL;
    int mode;
    if (!p || recompute_parse(p, &mode, &s->recompute_classes, why, sizeof why))
      return bad(r, key, "\"none\", \"selective\", \"selective:norm,act,...\", \"full\" or \"auto\"", v,
                 p ? why : "name a recomputation policy (none is the default)");
    s->recompute = mode;
    return 0;
  }
  if (strcmp(key, "memory_budget") == 0) {
    char buf[64] = "";
    if (json_is_string(v)) snprintf(buf, sizeof buf, "%s", json_string_value(v));
    else if (json_is_number(v)) snprintf(buf, sizeof buf, "%.17g", json_number_value(v));
    if (!buf[0] || bytes_parse(buf, &s->memory_budget))
      return bad(r, key, "a size per rank such as \"40GiB\" or \"512MB\"", v,
                 "give the memory one rank may use, with a unit: B, KB, MB, GB, KiB, MiB or GiB");
    return 0;
  }
  if (strcmp(key, "pp_virtual") == 0)
    return int_setting(r, key, v, 1, 64, "an integer from 1 to 64",
                       "set it to the model chunks per pipeline rank (2 or more needs \"pp_schedule\": \"interleaved\")",
                       &s->pp_virtual);
  if (strcmp(key, "pp_split") == 0) {
    /* [0, 6, 12, 18] or "0,6,12,18": the first layer of every chunk */
    const char *fix = "give the first layer of every pipeline chunk, starting at 0, e.g. [0, 6, 12, 18]";
    int n = 0;
    if (json_is_array(v)) {
      if (json_array_size(v) < 1 || json_array_size(v) > 256) return bad(r, key, "1 to 256 layer numbers", v, fix);
      for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0) return bad(r, key, "non-negative integers", v, fix);
        s->pp_split[n++] = json_integer_value(e);
      }
    } else if (json_is_string(v) || json_is_integer(v)) {
      char buf[2048];
      if (json_is_integer(v)) snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
      else snprintf(buf, sizeof buf, "%s", json_string_value(v));
      for (char *p = buf, *end; *p; p = *end ? end + 1 : end) {
        long long x = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || x < 0 || n == 256) return bad(r, key, "comma-separated layer numbers", v, fix);
        s->pp_split[n++] = x;
      }
    } else {
      return bad(r, key, "an array of layer numbers", v, fix);
    }
    s->n_pp_split = n;
    return 0;
  }
  if (strcmp(key, "cp_balance") == 0 || strcmp(key, "cp_attn") == 0) {
    bool bal = key[3] == 'b';
    const char *p = json_is_string(v) ? json_string_value(v) : NULL;
    const char *a = bal ? "zigzag" : "ring", *b = bal ? "contiguous" : "allgather";
    if (!p || (strcmp(p, a) && strcmp(p, b)))
      return bad(r, key, bal ? "\"zigzag\" or \"contiguous\"" : "\"ring\" or \"allgather\"", v,
                 bal ? "choose how the sequence is split over cp (zigzag, the default, evens out causal work)"
                     : "choose how attention sees the other cp ranks' keys (ring, the default, or allgather)");
    if (bal) s->cp_contiguous = !strcmp(p, b);
    else s->cp_allgather = !strcmp(p, b);
    return 0;
  }
  if (strcmp(key, "overlap") == 0) {
    if (!json_is_boolean(v))
      return bad(r, key, "true or false", v, "set it to false to run every collective where it is (no overlap pass)");
    s->overlap = json_is_true(v);
    return 0;
  }
  if (strcmp(key, "sequence_parallel") == 0) {
    if (!json_is_boolean(v))
      return bad(r, key, "true or false", v, "set it to true to split norms and residuals along the sequence over tp");
    s->sequence_parallel = json_is_true(v);
    return 0;
  }
  if (strcmp(key, "zero") == 0) {
    int64_t z;
    if ((rc = int_setting(r, "zero", v, 0, 3, "an integer from 0 to 3", "set the ZeRO stage: 0 (off), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)", &z)))
      return rc;
    s->zero = (int)z;
    s->set_mask |= SPEC_SET_ZERO;
    return 0;
  }
  struct {
    const char *name;
    int (*set)(const SpecReader *, const json_t *);
    uint32_t bit;
  } const others[] = {{"model", set_model, SPEC_SET_MODEL},
                      {"mesh", set_mesh, SPEC_SET_MESH},
                      {"data", set_data, SPEC_SET_DATA},
                      {"precision", set_precision, SPEC_SET_PRECISION}};
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
    if (strcmp(key, others[i].name) == 0) {
      if ((rc = others[i].set(r, v))) return rc;
      s->set_mask |= others[i].bit;
      return 0;
    }
  return -1;
}

int spec_load(const char *path, RunSpec *out, char *err, size_t errlen) {
  spec_defaults(out);
  if (strlen(path) >= sizeof out->path)
    return config_errorf(err, errlen, 2, "%.200s...: path too long; use a shorter path", path);
  snprintf(out->path, sizeof out->path, "%s", path);
  SpecReader r = {.s = out, .file = out->path, .err = err, .errlen = errlen};
  const char *slash = strrchr(path, '/');
  if (slash) snprintf(r.dir, sizeof r.dir, "%.*s", (int)(slash - path + 1), path);

  json_t *root;
  int rc = config_read_json_file(path, &root, err, errlen);
  if (rc) return rc;
  if (!json_is_object(root)) {
    char found[96];
    config_describe_value(root, found, sizeof found);
    rc = config_errorf(err, errlen, 2,
                       "%s: expected a JSON object at the top level, found %s; write a run spec "
                       "{\"model\": ..., ...} or a Hugging Face config.json",
                       path, found);
  } else if (json_object_get(root, "model_type")) {
    /* A bare HF config.json: the model, every setting at its default. Run settings mixed
     * into it would be ignored, so they are refused (no HF config uses these names). */
    for (size_t i = 1; i < N_SPEC_KEYS && !rc; i++)
      if (json_object_get(root, SPEC_KEYS[i]))
        rc = config_errorf(err, errlen, 2,
                           "%s: key \"%s\": a Hugging Face config.json (it has \"model_type\") "
                           "cannot carry run settings; write a run spec instead: {\"model\": "
                           "{...the config...}, \"%s\": ...}",
                           path, SPEC_KEYS[i], SPEC_KEYS[i]);
    if (!rc) rc = config_from_json(root, path, "", &out->model, err, errlen);
    if (!rc) rc = config_check_bounds(&out->model, path, "", err, errlen);
    if (!rc) out->set_mask |= SPEC_SET_MODEL;
  } else if (!json_object_get(root, "model")) {
    rc = config_errorf(err, errlen, 2,
                       "%s: key \"model\": missing; a run spec names its model with \"model\": "
                       "{...config...} or \"model\": \"path/to/config.json\" (a Hugging Face "
                       "config.json has \"model_type\" at the top level instead)",
                       path);
  } else {
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
      if (key[0] == '_') continue; /* comments: "_note": "..." */
      rc = apply(&r, key, v);
      if (rc < 0) rc = unknown_key(&r, "", key, SPEC_KEYS, N_SPEC_KEYS, "key");
      if (rc) break;
    }
  }
  json_decref(root);
  if (!rc) default_seq(out);
  return rc;
}

static bool is_path_key(const char *key) {
  return strcmp(key, "model") == 0 || strcmp(key, "init") == 0 || strcmp(key, "out") == 0 ||
         strcmp(key, "save_dir") == 0;
}

int spec_set(RunSpec *s, const char *key, const char *text, const char *origin, char *err,
             size_t errlen) {
  SpecReader r = {.s = s, .file = origin ? origin : "command line", .err = err, .errlen = errlen};
  json_t *v = NULL;
  if (is_path_key(key) || (strcmp(key, "data") == 0 && text[0] != '[')) {
    v = json_string_nocheck(text);
  } else {
    json_error_t je;
    v = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!v) v = json_string_nocheck(text); /* not JSON: a bare word such as bf16 */
  }
  if (!v) return config_errorf(err, errlen, 1, "%s: out of memory", r.file);
  int rc;
  if (strncmp(key, "mesh.", 5) == 0) {
    json_t *obj = json_object();
    if (!obj || json_object_set(obj, key + 5, v) != 0) {
      json_decref(obj);
      json_decref(v);
      return config_errorf(err, errlen, 1, "%s: out of memory", r.file);
    }
    rc = set_mesh(&r, obj);
    if (!rc) s->set_mask |= SPEC_SET_MESH;
    json_decref(obj);
  } else {
    rc = apply(&r, key, v);
    if (rc < 0) rc = unknown_key(&r, "", key, SPEC_KEYS, N_SPEC_KEYS, "key");
  }
  json_decref(v);
  if (!rc) default_seq(s);
  return rc;
}

int spec_validate(const RunSpec *s, char *err, size_t errlen) {
  const char *f = s->path[0] ? s->path : "run spec";
  const ModelConfig *m = &s->model;
#define FAIL(...) return config_errorf(err, errlen, 2, __VA_ARGS__)
  if (m->hidden <= 0 || m->n_layer <= 0 || m->n_head <= 0 || m->n_kv_head <= 0 ||
      m->head_dim <= 0 || m->vocab_size <= 0 || m->intermediate <= 0 || m->max_pos <= 0)
    FAIL("%s: key \"model\": no complete model configuration; name a Hugging Face config with "
         "\"model\"", f);
  if (s->batch < 1)
    FAIL("%s: key \"batch\": expected a positive integer, found %lld; set it to the number of "
         "sequences per micro-batch (e.g. 4)", f, (long long)s->batch);
  if (s->seq < 1)
    FAIL("%s: key \"seq\": expected a positive integer, found %lld; set it to the sequence length "
         "(e.g. 1024)", f, (long long)s->seq);
  if (m->arch == ARCH_GPT2 && s->seq > m->max_pos)
    FAIL("%s: key \"seq\": %lld is longer than the model's %lld positions (n_positions); GPT-2 "
         "learns one embedding per position, so set seq to at most %lld", f, (long long)s->seq,
         (long long)m->max_pos, (long long)m->max_pos);
  if (s->steps < 0 || s->warmup < 0 || s->save_every < 0 || s->seed < 0)
    FAIL("%s: key \"%s\": must not be negative; set it to 0 or more", f,
         s->steps < 0 ? "steps" : s->warmup < 0 ? "warmup" : s->save_every < 0 ? "save_every" : "seed");
  if (s->grad_accum < 1)
    FAIL("%s: key \"grad_accum\": expected a positive integer, found %lld; use 1 for no "
         "accumulation", f, (long long)s->grad_accum);
  if (!(isfinite(s->lr) && s->lr >= 0))
    FAIL("%s: key \"lr\": expected a number >= 0, found %g; set the peak learning rate (e.g. 3e-4)",
         f, s->lr);
  if (!(isfinite(s->min_lr) && s->min_lr >= 0 && s->min_lr <= s->lr))
    FAIL("%s: key \"min_lr\": %g must be between 0 and lr (%g); the schedule decays from lr down "
         "to min_lr", f, s->min_lr, s->lr);
  if (!(isfinite(s->weight_decay) && s->weight_decay >= 0))
    FAIL("%s: key \"weight_decay\": expected a number >= 0, found %g; e.g. 0.1", f, s->weight_decay);
  if (!(s->beta1 >= 0 && s->beta1 < 1) || !(s->beta2 >= 0 && s->beta2 < 1))
    FAIL("%s: key \"%s\": expected a number in [0, 1), found %g; e.g. 0.9 and 0.95", f,
         !(s->beta1 >= 0 && s->beta1 < 1) ? "beta1" : "beta2",
         !(s->beta1 >= 0 && s->beta1 < 1) ? s->beta1 : s->beta2);
  if (!(isfinite(s->eps) && s->eps > 0))
    FAIL("%s: key \"eps\": expected a number > 0, found %g; e.g. 1e-8", f, s->eps);
  if (!(isfinite(s->grad_clip) && s->grad_clip >= 0))
    FAIL("%s: key \"grad_clip\": expected a number >= 0, found %g; use 0 for no clipping", f,
         s->grad_clip);
  if (strcmp(s->precision, "fp32") != 0 && strcmp(s->precision, "bf16") != 0)
    FAIL("%s: key \"precision\": expected \"fp32\" or \"bf16\", found \"%.8s\"", f, s->precision);
  if (s->zero < 0 || s->zero > 3)
    FAIL("%s: key \"zero\": expected 0 to 3, found %d; set the ZeRO stage", f, s->zero);
  if (s->n_data < 0 || s->n_data > SPEC_MAX_DATA)
    FAIL("%s: key \"data\": expected 0 to %d paths, found %d", f, SPEC_MAX_DATA, s->n_data);
  for (int i = 0; i < MESH_AXES; i++)
    if (s->mesh[i] < 1)
      FAIL("%s: key \"mesh.%s\": expected a positive integer, found %lld; use 1 for an axis you "
           "do not split", f, AXES[i], (long long)s->mesh[i]);

  /* The mesh against the model: each axis splits something that must split evenly. */
  int64_t tp = s->mesh[MESH_TP], cp = s->mesh[MESH_CP], pp = s->mesh[MESH_PP];
  if (m->n_head % tp != 0)
    FAIL("%s: key \"mesh.tp\": tensor parallelism splits the attention heads, but the model's "
         "%lld heads do not divide into tp = %lld groups; choose a tp that divides %lld", f,
         (long long)m->n_head, (long long)tp, (long long)m->n_head);
  if (m->n_kv_head % tp != 0 && tp % m->n_kv_head != 0)
    FAIL("%s: key \"mesh.tp\": the model's %lld key/value heads can be neither split across nor "
         "repeated on tp = %lld ranks; choose a tp that divides or is a multiple of %lld", f,
         (long long)m->n_kv_head, (long long)tp, (long long)m->n_kv_head);
  if (m->intermediate % tp != 0)
    FAIL("%s: key \"mesh.tp\": tensor parallelism splits the MLP width (%lld), which is not "
         "divisible by tp = %lld; choose a tp that divides it", f, (long long)m->intermediate,
         (long long)tp);
  if (s->seq % cp != 0)
    FAIL("%s: key \"mesh.cp\": context parallelism splits the sequence, but seq (%lld) is not "
         "divisible by cp = %lld; choose a seq that is a multiple of cp", f, (long long)s->seq,
         (long long)cp);
  if (cp > 1 && !s->cp_contiguous && s->seq % (2 * cp) != 0)
    FAIL("%s: key \"mesh.cp\": zig-zag context parallelism gives each rank two chunks of the sequence, "
         "but seq (%lld) is not divisible by 2 x cp = %lld; choose a seq that is a multiple of %lld, or "
         "set \"cp_balance\": \"contiguous\" (--cp-balance contiguous)", f, (long long)s->seq, (long long)(2 * cp),
         (long long)(2 * cp));
  if (pp > m->n_layer)
    FAIL("%s: key \"mesh.pp\": %lld pipeline stages for %lld layers leaves stages empty; set pp "
         "to at most %lld", f, (long long)pp, (long long)m->n_layer, (long long)m->n_layer);
  int64_t virt = s->pp_virtual ? s->pp_virtual : (s->pp_schedule == PIPE_INTERLEAVED || s->pp_schedule == PIPE_DUALPIPEV ? 2 : 1);
  if (pp > 1 && pp * virt > m->n_layer)
    FAIL("%s: key \"pp_virtual\": pp = %lld x %lld chunks per rank needs %lld layers, and the model has %lld; "
         "lower pp_virtual or pp", f, (long long)pp, (long long)virt, (long long)(pp * virt), (long long)m->n_layer);
  if (s->recompute == RECOMPUTE_AUTO && s->memory_budget <= 0)
    FAIL("%s: key \"recompute\": auto chooses what to recompute to fit a memory budget, and none is given; "
         "set \"memory_budget\" (--memory-budget 40GiB, per rank) or choose selective or full", f);
  if (s->memory_budget > 0 && s->recompute != RECOMPUTE_AUTO)
    FAIL("%s: key \"memory_budget\": the budget is what recompute auto fits, but recompute is %s; "
         "set \"recompute\": \"auto\" (--recompute auto) or drop the budget", f, recompute_mode_names[s->recompute]);
  int64_t ep = s->mesh[MESH_EP];
  if (ep != 1 && m->n_experts == 0)
    FAIL("%s: key \"mesh.ep\": expert parallelism (ep = %lld) splits a mixture-of-experts model's experts, "
         "and this %s model is dense; set ep to 1 (or use a mixtral or qwen3_moe model)", f,
         (long long)ep, arch_name(m->arch));
  if (m->n_experts > 0 && m->n_experts % ep != 0)
    FAIL("%s: key \"mesh.ep\": expert parallelism splits the %lld experts of a layer, which do not divide "
         "into ep = %lld groups; choose an ep that divides %lld", f, (long long)m->n_experts, (long long)ep,
         (long long)m->n_experts);
  if (m->sliding_window > 0 && m->sliding_window < s->seq && m->arch != ARCH_MISTRAL)
    FAIL("%s: key \"model.sliding_window\": the model attends within a window of %lld tokens, shorter than "
         "seq (%lld), and loom implements sliding windows for mistral only (every layer), not %s's (transformers "
         "applies it to some layers); set seq to at most %lld (or use_sliding_window to false)", f,
         (long long)m->sliding_window, (long long)s->seq, arch_name(m->arch), (long long)m->sliding_window);
  if (m->n_experts > 0 && m->moe_intermediate % tp != 0)
    FAIL("%s: key \"mesh.tp\": tensor parallelism splits each expert's MLP width (%lld), which is not "
         "divisible by tp = %lld; choose a tp that divides it", f, (long long)m->moe_intermediate, (long long)tp);
  /* The batch splits over dp x ep (the shard pass's dp and ep rules), the sequence of a cp rank
     over tp with sequence parallelism: refused here, where the key and the fix can be named,
     rather than as a shard_slice failure inside the pass. */
  int64_t dp_ep = s->mesh[MESH_DP] * s->mesh[MESH_EP];
  if (s->batch % dp_ep != 0)
    FAIL("%s: key \"batch\": the micro-batch of %lld sequences does not split over dp%s = %lld ranks; set "
         "batch (--batch) to a multiple of %lld", f, (long long)s->batch, s->mesh[MESH_EP] > 1 ? " x ep" : "",
         (long long)dp_ep, (long long)dp_ep);
  /* the multiple to name: cp x tp, and even per cp rank where zig-zag halves each rank's share */
  int64_t seq_multiple = cp * tp * (cp > 1 && !s->cp_contiguous && tp % 2 ? 2 : 1);
  if (s->sequence_parallel && tp > 1 && (s->seq / cp) % tp != 0)
    FAIL("%s: key \"seq\": sequence parallelism splits %s%lld positions over tp = %lld ranks, which do not "
         "divide them; set seq (--seq) to a multiple of %lld, or sequence_parallel to false", f,
         cp > 1 ? "each cp rank's " : "the ", (long long)(s->seq / cp), (long long)tp, (long long)seq_multiple);
#undef FAIL
  return spec_check_bounds(s, err, errlen);
}
