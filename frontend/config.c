/* frontend/config.c: Hugging Face config.json (gpt2, llama, mixtral, qwen3_moe) -> ModelConfig, plus the JSON
 * helpers spec.c shares. Messages name the file, the key path, what was found and a fix. */
#include "frontend/config.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int config_errorf(char *err, size_t errlen, int rc, const char *fmt, ...) {
  if (err && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

const char *arch_name(ModelArch arch) {
  switch (arch) {
  case ARCH_GPT2: return "gpt2";
  case ARCH_LLAMA: return "llama";
  case ARCH_MIXTRAL: return "mixtral";
  case ARCH_QWEN3_MOE: return "qwen3_moe";
  case ARCH_QWEN2: return "qwen2";
  case ARCH_QWEN3: return "qwen3";
  case ARCH_MISTRAL: return "mistral";
  }
  return "unknown";
}

void config_describe_value(const json_t *v, char *buf, size_t n) {
  if (n == 0) return;
  if (!v) {
    snprintf(buf, n, "nothing");
  } else if (json_is_object(v)) {
    snprintf(buf, n, "an object");
  } else if (json_is_array(v)) {
    snprintf(buf, n, "an array");
  } else if (json_is_real(v)) {
    /* %.15g keeps 0.1 as "0.1"; keep a ".0" so 768.0 reads as the float it is. */
    char num[64];
    snprintf(num, sizeof num, "%.15g", json_real_value(v));
    if (!strpbrk(num, ".eEni")) strncat(num, ".0", sizeof num - strlen(num) - 1);
    snprintf(buf, n, "%s", num);
  } else {
    char *text = json_dumps(v, JSON_ENCODE_ANY);
    if (!text) {
      snprintf(buf, n, "a value");
      return;
    }
    const size_t max = 60;
    if (strlen(text) > max && n > max + 4)
      snprintf(buf, n, "%.*s...", (int)max, text);
    else
      snprintf(buf, n, "%s", text);
    free(text);
  }
}

size_t config_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return (size_t)-1; /* not a typo of anything we know */
  size_t row[65];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      char ca = a[i - 1], cb = b[j - 1];
      if (ca >= 'A' && ca <= 'Z') ca = (char)(ca - 'A' + 'a');
      if (cb >= 'A' && cb <= 'Z') cb = (char)(cb - 'A' + 'a');
      size_t best = diag + (ca != cb);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = row[j];
      row[j] = best;
    }
  }
  return row[lb];
}

int config_read_json_file(const char *path, json_t **out, char *err, size_t errlen) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0) {
    int e = errno;
    int rc = (e == ENOENT || e == ENOTDIR || e == EACCES || e == ENAMETOOLONG || e == ELOOP) ? 2 : 1;
    return config_errorf(err, errlen, rc, "%s: cannot open: %s; check the path", path, strerror(e));
  }
  if (S_ISDIR(st.st_mode))
    return config_errorf(err, errlen, 2, "%s: is a folder, expected a JSON file; name the file itself",
                         path);
  if (!S_ISREG(st.st_mode))   /* a FIFO or a device would block or never end */
    return config_errorf(err, errlen, 2, "%s: not a regular file, expected a JSON file; name the file itself", path);
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return config_errorf(err, errlen, e == EACCES ? 2 : 1, "%s: cannot open: %s; check the path",
                         path, strerror(e));
  }
  json_error_t je;
  json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
  int read_failed = ferror(f);
  fclose(f);
  if (!root) {
    if (read_failed) return config_errorf(err, errlen, 1, "%s: read error; check the file", path);
    if (json_error_code(&je) == json_error_out_of_memory)
      return config_errorf(err, errlen, 1, "%s: out of memory while reading JSON", path);
    if (je.line > 0)
      return config_errorf(err, errlen, 2,
                           "%s:%d:%d: invalid JSON: %s; fix the JSON there (no comments, no "
                           "trailing commas, no duplicate keys)",
                           path, je.line, je.column, je.text);
    return config_errorf(err, errlen, 2, "%s: invalid JSON: %s; fix the JSON", path, je.text);
  }
  *out = root;
  return 0;
}

/* ---- reading one HF config object ---- */

typedef struct {
  json_t *obj;
  const char *file;
  char prefix[256]; /* "" or "model." */
  char *err;
  size_t errlen;
} Reader;

/* The JSON path of a key for messages: prefix + name. */
static const char *key_path(const Reader *r, const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s%s", r->prefix, name);
  return buf;
}

/* A key's value; JSON null counts as absent (HF writes null for "use the default"). */
static json_t *get(const Reader *r, const char *name) {
  json_t *v = json_object_get(r->obj, name);
  return (v && !json_is_null(v)) ? v : NULL;
}

static int bad_value(const Reader *r, const char *name, const char *expected, const json_t *v,
                     const char *fix) {
  char key[320], found[96];
  config_describe_value(v, found, sizeof found);
  return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": expected %s, found %s; %s", r->file,
                       key_path(r, name, key, sizeof key), expected, found, fix);
}

static int size_of(const Reader *r, const char *name, const json_t *v, const char *fix,
                   int64_t *out) {
  if (json_is_integer(v)) {
    json_int_t x = json_integer_value(v);
    if (x > 0 && x <= CONFIG_MAX_SIZE) {
      *out = (int64_t)x;
      return 0;
    }
  } else if (json_is_real(v)) {
    double d = json_real_value(v);
    if (isfinite(d) && d == floor(d) && d > 0 && d <= (double)CONFIG_MAX_SIZE) {
      *out = (int64_t)d;
      return 0;
    }
  }
  char set_fix[256];
  snprintf(set_fix, sizeof set_fix, "set it to %s", fix);
  if (json_is_number(v) && json_number_value(v) > (double)CONFIG_MAX_SIZE)
    return bad_value(r, name, "a positive integer at most 2147483647", v, set_fix);
  return bad_value(r, name, "a positive integer", v, set_fix);
}

/* A size under `name` or its alias. *present (if given) says whether either was there;
 * *used (if given) is the name the file used. Both names present must agree. */
static int get_size(const Reader *r, const char *name, const char *alias, bool required,
                    const char *fix, int64_t *out, bool *present, const char **used) {
  json_t *a = get(r, name), *b = alias ? get(r, alias) : NULL;
  if (present) *present = a || b;
  if (used) *used = (a || !b) ? name : alias;
  if (!a && !b) {
    if (!required) return 0;
    char key[320];
    if (alias)
      return config_errorf(r->err, r->errlen, 2,
                           "%s: key \"%s\": missing (also looked for \"%s\"); set it to %s", r->file,
                           key_path(r, name, key, sizeof key), alias, fix);
    return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": missing; set it to %s", r->file,
                         key_path(r, name, key, sizeof key), fix);
  }
  int64_t va = 0, vb = 0;
  int rc;
  if (a && (rc = size_of(r, name, a, fix, &va))) return rc;
  if (b && (rc = size_of(r, alias, b, fix, &vb))) return rc;
  if (a && b && va != vb) {
    char key[320];
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": %lld disagrees with its alias \"%s\" (%lld); remove one "
                         "of the two",
                         r->file, key_path(r, name, key, sizeof key), (long long)va, alias,
                         (long long)vb);
  }
  *out = a ? va : vb;
  return 0;
}

/* A positive finite number (epsilons, RoPE base); absent or null -> dflt. */
static int get_positive(const Reader *r, const char *name, double dflt, const char *fix,
                        double *out) {
  json_t *v = get(r, name);
  if (!v) {
    *out = dflt;
    return 0;
  }
  double d = json_is_number(v) ? json_number_value(v) : NAN;
  if (!(isfinite(d) && d > 0)) return bad_value(r, name, "a positive number", v, fix);
  *out = d;
  return 0;
}

static int get_bool(const Reader *r, const char *name, bool dflt, bool *out) {
  json_t *v = get(r, name);
  if (!v) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v)) return bad_value(r, name, "true or false", v, "write true or false");
  *out = json_is_true(v);
  return 0;
}

/* A string, or NULL when absent/null. */
static int get_string(const Reader *r, const char *name, const char *fix, const char **out) {
  json_t *v = get(r, name);
  *out = NULL;
  if (!v) return 0;
  if (!json_is_string(v)) return bad_value(r, name, "a string", v, fix);
  *out = json_string_value(v);
  return 0;
}

/* A setting loom does not implement yet: refuse it, since ignoring it would train a
 * different model than the file describes. */
static int refuse(const Reader *r, const char *name, const char *what, const char *fix) {
  char key[320];
  return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": %s is not yet supported; %s", r->file,
                       key_path(r, name, key, sizeof key), what, fix);
}

static int not_divisible(const Reader *r, const char *a, int64_t va, const char *b, int64_t vb,
                         const char *why) {
  char key[320];
  return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": %s (%lld) is not divisible by %s (%lld); %s",
                       r->file, key_path(r, a, key, sizeof key), a, (long long)va, b,
                       (long long)vb, why);
}

static int read_gpt2(const Reader *r, ModelConfig *m) {
  int rc;
  const char *embd_name, *head_name;
  m->arch = ARCH_GPT2;
  if ((rc = get_size(r, "vocab_size", NULL, true, "the tokenizer's vocabulary size (e.g. 50257)",
                     &m->vocab_size, NULL, NULL)) ||
      (rc = get_size(r, "n_positions", "max_position_embeddings", true,
                     "the longest sequence the model has positions for (e.g. 1024)", &m->max_pos,
                     NULL, NULL)) ||
      (rc = get_size(r, "n_embd", "hidden_size", true, "the model width (e.g. 768)", &m->hidden,
                     NULL, &embd_name)) ||
      (rc = get_size(r, "n_layer", "num_hidden_layers", true, "the number of layers (e.g. 12)",
                     &m->n_layer, NULL, NULL)) ||
      (rc = get_size(r, "n_head", "num_attention_heads", true,
                     "the number of attention heads (e.g. 12)", &m->n_head, NULL, &head_name)))
    return rc;
  bool has_inner;
  if ((rc = get_size(r, "n_inner", NULL, false, "the MLP width, or null for 4 * n_embd",
                     &m->intermediate, &has_inner, NULL)))
    return rc;
  if (!has_inner) m->intermediate = 4 * m->hidden;
  if ((rc = get_positive(r, "layer_norm_epsilon", 1e-5, "set it to e.g. 1e-05", &m->norm_eps)))
    return rc;

  const char *act;
  if ((rc = get_string(r, "activation_function", "set it to \"gelu_new\"", &act))) return rc;
  if (act && strcmp(act, "gelu_new") != 0 && strcmp(act, "gelu_pytorch_tanh") != 0) {
    char what[128];
    snprintf(what, sizeof what, "activation_function \"%.60s\"", act);
    return refuse(r, "activation_function", what,
                  "loom's GPT-2 uses the tanh approximation of GELU: \"gelu_new\" or "
                  "\"gelu_pytorch_tanh\"");
  }
  bool flag;
  if ((rc = get_bool(r, "tie_word_embeddings", true, &flag))) return rc;
  if (!flag)
    return refuse(r, "tie_word_embeddings", "an untied GPT-2 (tie_word_embeddings false)",
                  "GPT-2 shares its token embedding with the output layer: remove the key or set "
                  "it to true");
  if ((rc = get_bool(r, "scale_attn_weights", true, &flag))) return rc;
  if (!flag)
    return refuse(r, "scale_attn_weights", "attention without 1/sqrt(head_dim) scaling",
                  "remove the key or set it to true");
  if ((rc = get_bool(r, "scale_attn_by_inverse_layer_idx", false, &flag))) return rc;
  if (flag)
    return refuse(r, "scale_attn_by_inverse_layer_idx", "scaling attention by 1/layer index",
                  "remove the key or set it to false");

  if (m->hidden % m->n_head != 0)
    return not_divisible(r, embd_name, m->hidden, head_name, m->n_head,
                         "the head size must be a whole number: choose a head count that divides "
                         "the width");
  m->n_kv_head = m->n_head;
  m->head_dim = m->hidden / m->n_head;
  m->rope_theta = 0;
  m->tied = true;
  m->attention_bias = m->mlp_bias = false;
  return 0;
}

/* One number of a RoPE scaling object: obj.name, a positive finite number (an integer when
   `whole`); `where` is the object's key ("rope_scaling" or "rope_parameters"). */
static int rope_number(const Reader *r, json_t *obj, const char *where, const char *name, bool whole, double *out) {
  char sub[64], key[320], found[96];
  snprintf(sub, sizeof sub, "%s.%s", where, name);
  json_t *v = json_object_get(obj, name);
  if (!v || json_is_null(v))
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": missing; rope_type \"llama3\" needs factor, low_freq_factor, "
                         "high_freq_factor and original_max_position_embeddings (Llama 3.1: 8.0, 1.0, 4.0, 8192)",
                         r->file, key_path(r, sub, key, sizeof key));
  double d = json_is_number(v) ? json_number_value(v) : NAN;
  if (!(isfinite(d) && d > 0) || (whole && (d != floor(d) || d > (double)CONFIG_MAX_SIZE))) {
    config_describe_value(v, found, sizeof found);
    return config_errorf(r->err, r->errlen, 2, "%s: key \"%s\": expected a positive %s, found %s; set it as the "
                         "model's published config has it", r->file, key_path(r, sub, key, sizeof key),
                         whole ? "whole number" : "number", found);
  }
  *out = d;
  return 0;
}

/* The RoPE type of a rope_scaling (the hub's configs) or rope_parameters (transformers 5)
   object: "default" (or none) is plain RoPE; "llama3" is Llama 3.1's scaling of the
   frequencies (read here); any other type is refused by name, since ignoring it would
   compute different positions than the model was trained with. */
static int read_rope_type(const Reader *r, json_t *obj, const char *where, ModelConfig *m) {
  char sub[64], key[320];
  json_t *type = json_object_get(obj, "rope_type");
  const char *tname = "rope_type";
  if (!type || json_is_null(type)) {
    type = json_object_get(obj, "type");   /* the older spelling */
    tname = "type";
  }
  snprintf(sub, sizeof sub, "%s.%s", where, tname);
  if (!type || json_is_null(type)) {
    if (!strcmp(where, "rope_parameters")) return 0;   /* plain RoPE with a base */
    return bad_value(r, where, "an object with a rope_type (\"llama3\") or null", obj,
                     "set rope_type, or set rope_scaling to null for plain RoPE");
  }
  if (!json_is_string(type)) return bad_value(r, sub, "a string", type, "set it to \"default\" or \"llama3\"");
  const char *t = json_string_value(type);
  if (!strcmp(t, "default")) return 0;
  if (strcmp(t, "llama3") != 0)
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": RoPE scaling rope_type \"%.60s\" is not yet supported (loom implements "
                         "\"default\" and \"llama3\"), and ignoring it would compute different positions than the "
                         "model was trained with; use a model with rope_type \"default\" or \"llama3\"",
                         r->file, key_path(r, sub, key, sizeof key), t);
  double orig;
  int rc;
  if ((rc = rope_number(r, obj, where, "factor", false, &m->rope_factor)) ||
      (rc = rope_number(r, obj, where, "low_freq_factor", false, &m->rope_low_freq)) ||
      (rc = rope_number(r, obj, where, "high_freq_factor", false, &m->rope_high_freq)) ||
      (rc = rope_number(r, obj, where, "original_max_position_embeddings", true, &orig)))
    return rc;
  m->rope_orig_max = (int64_t)orig;
  if (!(m->rope_high_freq > m->rope_low_freq)) {
    snprintf(sub, sizeof sub, "%s.high_freq_factor", where);
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": %g is not above low_freq_factor (%g): the llama3 scaling blends the "
                         "frequencies between the two; set it as the model's published config has it (Llama 3.1: 4.0 "
                         "over 1.0)", r->file, key_path(r, sub, key, sizeof key), m->rope_high_freq, m->rope_low_freq);
  }
  return 0;
}

/* RoPE: the base from rope_parameters.rope_theta (transformers 5), else rope_theta, else
 * 10000; the scaling from rope_parameters' rope_type when it has one, else rope_scaling's. */
static int read_rope(const Reader *r, ModelConfig *m) {
  int rc;
  json_t *scaling = get(r, "rope_scaling");
  json_t *params = get(r, "rope_parameters");
  if (scaling && !json_is_object(scaling))
    return bad_value(r, "rope_scaling", "an object like {\"rope_type\": \"llama3\", \"factor\": 32.0, ...} or "
                     "null", scaling, "fix it, or set it to null for plain RoPE");
  json_t *theta = NULL;
  const char *theta_name = "rope_theta";
  if (params) {
    if (!json_is_object(params))
      return bad_value(r, "rope_parameters", "an object like {\"rope_type\": \"default\", "
                       "\"rope_theta\": 10000.0}", params, "fix it or remove it");
    json_t *type = json_object_get(params, "rope_type");
    bool typed = (type && !json_is_null(type)) || json_object_get(params, "type");
    if ((typed || !scaling) && (rc = read_rope_type(r, params, "rope_parameters", m))) return rc;
    if (!typed && scaling && (rc = read_rope_type(r, scaling, "rope_scaling", m))) return rc;
    theta = json_object_get(params, "rope_theta");
    if (theta && json_is_null(theta)) theta = NULL;
    theta_name = "rope_parameters.rope_theta";
  } else if (scaling && (rc = read_rope_type(r, scaling, "rope_scaling", m))) {
    return rc;
  }
  if (!theta) {
    theta = get(r, "rope_theta");
    theta_name = "rope_theta";
  }
  if (!theta) {
    m->rope_theta = 10000.0;
    return 0;
  }
  double d = json_is_number(theta) ? json_number_value(theta) : NAN;
  if (!(isfinite(d) && d > 0))
    return bad_value(r, theta_name, "a positive number", theta,
                     "set it to the RoPE base the model was trained with (e.g. 10000.0 or 500000.0)");
  m->rope_theta = d;
  return 0;
}

/* Llama and the families that are Llama with a difference (mixtral, qwen3_moe: read_moe
   after this; qwen2, qwen3, mistral: read_variant after this).  `arch` decides what
   attention_bias means: qwen2 has q/k/v biases whatever it says (its config has no such key). */
static int read_llama(const Reader *r, ModelConfig *m, ModelArch arch) {
  int rc;
  bool has_kv, has_head_dim;
  m->arch = arch;
  if ((rc = get_size(r, "vocab_size", NULL, true, "the tokenizer's vocabulary size (e.g. 128256)",
                     &m->vocab_size, NULL, NULL)) ||
      (rc = get_size(r, "hidden_size", NULL, true, "the model width (e.g. 2048)", &m->hidden, NULL,
                     NULL)) ||
      (rc = get_size(r, "intermediate_size", NULL, true, "the MLP width (e.g. 8192)",
                     &m->intermediate, NULL, NULL)) ||
      (rc = get_size(r, "num_hidden_layers", NULL, true, "the number of layers (e.g. 16)",
                     &m->n_layer, NULL, NULL)) ||
      (rc = get_size(r, "num_attention_heads", NULL, true,
                     "the number of attention heads (e.g. 32)", &m->n_head, NULL, NULL)) ||
      (rc = get_size(r, "num_key_value_heads", NULL, false,
                     "the number of key/value heads (e.g. 8), or null for one per attention head",
                     &m->n_kv_head, &has_kv, NULL)) ||
      (rc = get_size(r, "head_dim", NULL, false,
                     "the size of one head (e.g. 64), or null for hidden_size / num_attention_heads",
                     &m->head_dim, &has_head_dim, NULL)))
    return rc;
  bool has_pos;
  if ((rc = get_size(r, "max_position_embeddings", NULL, false,
                     "the longest sequence the model was trained on (e.g. 2048)", &m->max_pos,
                     &has_pos, NULL)))
    return rc;
  if (!has_pos) m->max_pos = 2048;
  if ((rc = get_positive(r, "rms_norm_eps", 1e-6, "set it to e.g. 1e-05", &m->norm_eps)) ||
      (rc = get_bool(r, "tie_word_embeddings", false, &m->tied)) ||
      (rc = get_bool(r, "attention_bias", false, &m->attention_bias)) ||
      (rc = get_bool(r, "mlp_bias", false, &m->mlp_bias)))
    return rc;
  if (m->attention_bias && arch != ARCH_QWEN2)
    return refuse(r, "attention_bias", "attention_bias true (biases on q/k/v/o projections)",
                  "use a model without attention biases (false or absent)");
  m->attention_bias = false;
  if (m->mlp_bias)
    return refuse(r, "mlp_bias", "mlp_bias true (biases on the MLP projections)",
                  "use a model without MLP biases (false or absent)");
  const char *act;
  if ((rc = get_string(r, "hidden_act", "set it to \"silu\"", &act))) return rc;
  if (act && strcmp(act, "silu") != 0) {
    char what[128];
    snprintf(what, sizeof what, "hidden_act \"%.60s\"", act);
    return refuse(r, "hidden_act", what, "loom's Llama uses SwiGLU: set it to \"silu\"");
  }
  if ((rc = read_rope(r, m))) return rc;

  if (!has_kv) m->n_kv_head = m->n_head;
  if (m->n_head % m->n_kv_head != 0)
    return not_divisible(r, "num_attention_heads", m->n_head, "num_key_value_heads", m->n_kv_head,
                         "each key/value head must serve a whole number of query heads");
  if (!has_head_dim) {
    if (m->hidden % m->n_head != 0)
      return not_divisible(r, "hidden_size", m->hidden, "num_attention_heads", m->n_head,
                           "the head size must be a whole number: choose a head count that "
                           "divides hidden_size, or set head_dim");
    m->head_dim = m->hidden / m->n_head;
  }
  if (m->head_dim % 2 != 0) {
    char key[320];
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": the head size (%lld) is odd, but RoPE rotates pairs of "
                         "dimensions; use an even head_dim",
                         r->file, key_path(r, "head_dim", key, sizeof key), (long long)m->head_dim);
  }
  return 0;
}

/* Sliding-window attention of qwen2, qwen3, qwen3_moe and mixtral (read_moe): the window
   when use_sliding_window (qwen) or any layer_types entry says so, else 0.  spec_validate
   refuses a window shorter than the sequence for these: transformers applies Qwen's to the
   layers from max_window_layers on only, which loom does not implement (Mistral's, on every
   layer, it does: read_variant). */
static int read_window(const Reader *r, ModelConfig *m, bool qwen) {
  int rc;
  bool use_window = !qwen, has_window;
  if (qwen && (rc = get_bool(r, "use_sliding_window", false, &use_window))) return rc;
  json_t *types = get(r, "layer_types");
  if (types) {
    size_t i;
    json_t *e;
    if (!json_is_array(types))
      return bad_value(r, "layer_types", "an array of \"full_attention\" or \"sliding_attention\"", types,
                       "fix it or remove it");
    json_array_foreach(types, i, e) {
      if (!json_is_string(e) || (strcmp(json_string_value(e), "full_attention") &&
                                 strcmp(json_string_value(e), "sliding_attention")))
        return bad_value(r, "layer_types", "an array of \"full_attention\" or \"sliding_attention\"", types,
                         "fix it or remove it");
      if (!strcmp(json_string_value(e), "sliding_attention")) use_window = true;
    }
  }
  if ((rc = get_size(r, "sliding_window", NULL, false, "null (full attention) or the window in tokens",
                     &m->sliding_window, &has_window, NULL)))
    return rc;
  if (!has_window || !use_window) m->sliding_window = 0;
  return 0;
}

/* qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm, explicit head_dim) and mistral
   (sliding-window attention on every layer), after read_llama. */
static int read_variant(const Reader *r, ModelConfig *m) {
  if (m->arch == ARCH_QWEN2) m->qkv_bias = true;
  if (m->arch == ARCH_QWEN3) m->qk_norm = true;
  int rc = read_window(r, m, m->arch != ARCH_MISTRAL);
  if (rc || m->arch != ARCH_MISTRAL || !m->sliding_window) return rc;
  json_t *types = get(r, "layer_types");
  size_t i;
  json_t *e;
  if (types) json_array_foreach(types, i, e) if (strcmp(json_string_value(e), "sliding_attention") != 0)
    return refuse(r, "layer_types", "a window on some layers only (layer_types with \"full_attention\")",
                  "loom's Mistral has the sliding window on every layer: remove layer_types or make every entry "
                  "\"sliding_attention\"");
  return 0;
}

bool config_layer_is_moe(const ModelConfig *c, int64_t l) {
  if (c->n_experts <= 0) return false;
  for (int i = 0; i < c->n_mlp_only; i++)
    if (c->mlp_only[i] == l) return false;
  return c->sparse_step <= 1 || (l + 1) % c->sparse_step == 0;
}

/* A router setting loom does not implement, when present with anything but its neutral value. */
static int refuse_router(const Reader *r, const char *name, const char *neutral_str, double neutral_num) {
  json_t *v = get(r, name);
  if (!v) return 0;
  bool ok = neutral_str ? json_is_string(v) && !strcmp(json_string_value(v), neutral_str)
                        : json_is_number(v) && json_number_value(v) == neutral_num;
  if (ok) return 0;
  char what[160], found[96], fix[160];
  config_describe_value(v, found, sizeof found);
  snprintf(what, sizeof what, "the router setting %s = %s", name, found);
  if (neutral_str) snprintf(fix, sizeof fix, "loom's router is a softmax over experts then top-k: set it to \"%s\" or remove it", neutral_str);
  else snprintf(fix, sizeof fix, "loom's router is a softmax over experts then top-k: set it to %g or remove it", neutral_num);
  return refuse(r, name, what, fix);
}

/* The mixture-of-experts keys of mixtral and qwen3_moe (after read_llama). */
static int read_moe(const Reader *r, ModelConfig *m, bool qwen) {
  int rc;
  const char *experts_key = qwen ? "num_experts" : "num_local_experts";
  m->arch = qwen ? ARCH_QWEN3_MOE : ARCH_MIXTRAL;
  if ((rc = get_size(r, experts_key, NULL, true, "the number of experts per layer (e.g. 8)", &m->n_experts, NULL,
                     NULL)) ||
      (rc = get_size(r, "num_experts_per_tok", NULL, true, "how many experts each token goes to (e.g. 2)", &m->top_k,
                     NULL, NULL)))
    return rc;
  m->moe_intermediate = m->intermediate;
  if (qwen && (rc = get_size(r, "moe_intermediate_size", NULL, true, "the width of one expert's MLP (e.g. 768)",
                             &m->moe_intermediate, NULL, NULL)))
    return rc;
  if (m->top_k > m->n_experts) {
    char key[320];
    return config_errorf(r->err, r->errlen, 2,
                         "%s: key \"%s\": each token goes to %lld experts but a layer has only %lld (%s); "
                         "set num_experts_per_tok to at most %lld",
                         r->file, key_path(r, "num_experts_per_tok", key, sizeof key), (long long)m->top_k,
                         (long long)m->n_experts, experts_key, (long long)m->n_experts);
  }
  m->norm_topk = true;
  if (qwen && (rc = get_bool(r, "norm_topk_prob", false, &m->norm_topk))) return rc;
  if ((rc = get_bool(r, "output_router_logits", false, &m->router_aux))) return rc;
  json_t *coef = get(r, "router_aux_loss_coef");
  m->aux_coef = 0.001;
  if (coef) {
    double d = json_is_number(coef) ? json_number_value(coef) : NAN;
    if (!(isfinite(d) && d >= 0))
      return bad_value(r, "router_aux_loss_coef", "a number >= 0", coef, "set it to e.g. 0.001");
    m->aux_coef = d;
  }
  if ((rc = refuse_router(r, "router_jitter_noise", NULL, 0)) || (rc = refuse_router(r, "scoring_func", "softmax", 0)) ||
      (rc = refuse_router(r, "topk_method", "greedy", 0)) || (rc = refuse_router(r, "n_shared_experts", NULL, 0)) ||
      (rc = refuse_router(r, "shared_expert_intermediate_size", NULL, 0)) ||
      (rc = refuse_router(r, "routed_scaling_factor", NULL, 1)) || (rc = refuse_router(r, "n_group", NULL, 1)) ||
      (rc = refuse_router(r, "topk_group", NULL, 1)))
    return rc;
  m->sparse_step = 1;
  if (qwen) {
    bool has;
    if ((rc = get_size(r, "decoder_sparse_step", NULL, false, "1 (every layer sparse) or the step between sparse layers",
                       &m->sparse_step, &has, NULL)))
      return rc;
    if (!has) m->sparse_step = 1;
    json_t *mlp_only = get(r, "mlp_only_layers");
    if (mlp_only) {
      if (!json_is_array(mlp_only) || json_array_size(mlp_only) > CONFIG_MAX_MLP_ONLY)
        return bad_value(r, "mlp_only_layers", "an array of layer indices (at most 256)", mlp_only,
                         "list the layers whose MLP is dense, e.g. [] or [0, 1]");
      size_t i;
      json_t *e;
      json_array_foreach(mlp_only, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= m->n_layer)
          return bad_value(r, "mlp_only_layers", "layer indices from 0 to num_hidden_layers - 1", mlp_only,
                           "list existing layers only");
        m->mlp_only[m->n_mlp_only++] = json_integer_value(e);
      }
    }
    m->qk_norm = true;
  }
  /* Sliding-window attention: spec_validate refuses a window shorter than the sequence. */
  return read_window(r, m, qwen);
}

int config_from_json(json_t *obj, const char *file, const char *keyprefix, ModelConfig *out,
                     char *err, size_t errlen) {
  Reader r = {.obj = obj, .file = file ? file : "config", .err = err, .errlen = errlen};
  if (keyprefix && keyprefix[0]) {
    size_t n = strlen(keyprefix);
    snprintf(r.prefix, sizeof r.prefix, "%s%s", keyprefix, keyprefix[n - 1] == '.' ? "" : ".");
  }
  char key[320], found[96];
  if (!json_is_object(obj)) {
    config_describe_value(obj, found, sizeof found);
    if (r.prefix[0]) {
      snprintf(key, sizeof key, "%.*s", (int)strlen(r.prefix) - 1, r.prefix);
      return config_errorf(err, errlen, 2,
                           "%s: key \"%s\": expected a Hugging Face config object, found %s; give "
                           "the contents of a config.json",
                           r.file, key, found);
    }
    return config_errorf(err, errlen, 2,
                         "%s: expected a JSON object (a Hugging Face config.json) at the top level, "
                         "found %s",
                         r.file, found);
  }
  memset(out, 0, sizeof *out);
  json_t *mt = json_object_get(obj, "model_type");
  if (!mt || json_is_null(mt)) {
    const char *hint = (!r.prefix[0] && json_object_get(obj, "model"))
                           ? " (this looks like a loom run spec: load it as one)"
                           : "";
    return config_errorf(err, errlen, 2,
                         "%s: key \"%s\": missing; set it to \"gpt2\" or \"llama\"%s", r.file,
                         key_path(&r, "model_type", key, sizeof key), hint);
  }
  if (!json_is_string(mt)) return bad_value(&r, "model_type", "a string", mt, "set it to \"gpt2\" or \"llama\"");
  const char *type = json_string_value(mt);
  if (strcmp(type, "gpt2") == 0) return read_gpt2(&r, out);
  if (strcmp(type, "llama") == 0) return read_llama(&r, out, ARCH_LLAMA);
  if (strcmp(type, "mixtral") == 0 || strcmp(type, "qwen3_moe") == 0) {
    int rc = read_llama(&r, out, type[0] == 'q' ? ARCH_QWEN3_MOE : ARCH_MIXTRAL);
    return rc ? rc : read_moe(&r, out, type[0] == 'q');
  }
  static const ModelArch variants[] = {ARCH_QWEN2, ARCH_QWEN3, ARCH_MISTRAL};
  for (int i = 0; i < 3; i++)
    if (strcmp(type, arch_name(variants[i])) == 0) {
      int rc = read_llama(&r, out, variants[i]);
      return rc ? rc : read_variant(&r, out);
    }
  return config_errorf(err, errlen, 2,
                       "%s: key \"%s\": model_type \"%.60s\" is not supported; supported: gpt2, "
                       "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe",
                       r.file, key_path(&r, "model_type", key, sizeof key), type);
}

int config_load(const char *path, ModelConfig *out, char *err, size_t errlen) {
  char file[SPEC_PATH_MAX];
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    /* A model folder (as downloaded from the Hub): read its config.json. */
    size_t n = strlen(path);
    int w = snprintf(file, sizeof file, "%s%sconfig.json", path,
                     (n > 0 && path[n - 1] == '/') ? "" : "/");
    if (w < 0 || (size_t)w >= sizeof file)
      return config_errorf(err, errlen, 2, "%s: path too long; use a shorter path", path);
  } else {
    if (strlen(path) >= sizeof file)
      return config_errorf(err, errlen, 2, "%.200s...: path too long; use a shorter path", path);
    snprintf(file, sizeof file, "%s", path);
  }
  json_t *root;
  int rc = config_read_json_file(file, &root, err, errlen);
  if (rc) return rc;
  rc = config_from_json(root, file, "", out, err, errlen);
  json_decref(root);
  return rc;
}

int64_t config_param_count(const ModelConfig *c) {
  int64_t V = c->vocab_size, C = c->hidden, L = c->n_layer, I = c->intermediate;
  int64_t H = c->n_head, KV = c->n_kv_head, D = c->head_dim;
  if (c->arch == ARCH_GPT2) {
    int64_t per_layer = 2 * C                /* ln_1 */
                        + C * 3 * C + 3 * C  /* attn.c_attn */
                        + C * C + C          /* attn.c_proj */
                        + 2 * C              /* ln_2 */
                        + C * I + I          /* mlp.c_fc */
                        + I * C + C;         /* mlp.c_proj */
    return V * C + c->max_pos * C + L * per_layer + 2 * C;
  }
  int64_t per_layer = C                                  /* input_layernorm */
                      + C * H * D + 2 * C * KV * D       /* q, k, v */
                      + H * D * C                        /* o */
                      + 3 * C * I                        /* gate, up, down */
                      + C;                               /* post_attention_layernorm */
  int64_t total = V * C + L * per_layer + C + (c->tied ? 0 : V * C);
  for (int64_t l = 0; l < L; l++)   /* a sparse layer: the router and E experts for the dense MLP */
    if (config_layer_is_moe(c, l)) total += c->n_experts * C + c->n_experts * 3 * C * c->moe_intermediate - 3 * C * I;
  if (c->qk_norm) total += L * 2 * D;
  if (c->qkv_bias) total += L * (H + 2 * KV) * D;
  return total;
}
