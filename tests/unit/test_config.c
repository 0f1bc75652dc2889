/* tests/unit/test_config.c: HF config.json and run-spec reading (frontend/config.c, spec.c).
 * Runs from the repository root. Fixtures live in tests/unit/configs/; error cases are
 * written into a fresh temporary folder, one file per case, so each message can be
 * checked to name its file. */
#include "frontend/config.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/unit/check.h"

/* Like CHECK, and shows the last error message on failure. */
#define CHECK_E(cond, err)                                                          \
  do {                                                                              \
    if (cond) {                                                                     \
      n_pass++;                                                                     \
    } else {                                                                        \
      n_fail++;                                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  message: %s\n", __FILE__, __LINE__, \
              #cond, err);                                                          \
    }                                                                               \
  } while (0)

#define CHECK_NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) <= 1e-12 * fabs((double)(b)))

/* ---- temporary files ---- */

typedef struct {
  char dir[64];
  char made[256][512]; /* files and folders, removed in reverse order */
  int n_made;
} Tmp;

static void tmp_track(Tmp *t, const char *path) {
  if (t->n_made < 256) snprintf(t->made[t->n_made++], sizeof t->made[0], "%s", path);
}

/* Writes `text` to dir/name, turning ' into " so that JSON reads well in C strings. */
static void tmp_write(Tmp *t, const char *name, const char *text, char *path, size_t n) {
  snprintf(path, n, "%s/%s", t->dir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path);
    n_fail++;
    return;
  }
  for (const char *p = text; *p; p++) fputc(*p == '\'' ? '"' : *p, f);
  fclose(f);
  tmp_track(t, path);
}

static void tmp_mkdir(Tmp *t, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", t->dir, name);
  if (mkdir(path, 0700) == 0) tmp_track(t, path);
}

static void tmp_cleanup(Tmp *t) {
  for (int i = t->n_made - 1; i >= 0; i--) remove(t->made[i]);
  rmdir(t->dir);
}

/* ---- building variants of a base spec ---- */

static json_t *parse_q(const char *text) { /* JSON with ' for " */
  char *copy = strdup(text);
  for (char *p = copy; *p; p++)
    if (*p == '\'') *p = '"';
  json_error_t je;
  json_t *v = json_loads(copy, JSON_DECODE_ANY, &je);
  if (!v) fprintf(stderr, "test bug: bad JSON %s: %s\n", text, je.text);
  free(copy);
  return v;
}

#define GPT2_SPEC                                                                           \
  "{'model': {'model_type': 'gpt2', 'vocab_size': 50257, 'n_positions': 1024, 'n_embd': 768, " \
  "'n_layer': 12, 'n_head': 12}, 'batch': 4, 'seq': 64}"
#define LLAMA_SPEC                                                                          \
  "{'model': {'model_type': 'llama', 'vocab_size': 256, 'hidden_size': 64, "                \
  "'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4, "            \
  "'num_key_value_heads': 2}, 'batch': 2, 'seq': 32}"

#define MIXTRAL_SPEC                                                                        \
  "{'model': {'model_type': 'mixtral', 'vocab_size': 256, 'hidden_size': 64, "              \
  "'intermediate_size': 96, 'num_hidden_layers': 2, 'num_attention_heads': 4, "             \
  "'num_key_value_heads': 2, 'num_local_experts': 4, 'num_experts_per_tok': 2}, "           \
  "'batch': 2, 'seq': 32}"

/* Base spec with `key` ("lr" or "model.n_head") set to `value` (JSON text, ' for ") or
 * removed (value NULL), written to case_<line>.json. */
static void write_variant(Tmp *t, int line, const char *base, const char *key, const char *value,
                          char *path, size_t n) {
  json_t *root = parse_q(base);
  json_t *obj = root;
  const char *dot = strchr(key, '.');
  char name[128];
  snprintf(name, sizeof name, "%s", key);
  if (dot && strncmp(key, "model.", 6) == 0) {
    obj = json_object_get(root, "model");
    snprintf(name, sizeof name, "%s", dot + 1);
  }
  if (value)
    json_object_set_new(obj, name, parse_q(value));
  else
    json_object_del(obj, name);
  char *text = json_dumps(root, JSON_INDENT(2));
  char file[64];
  snprintf(file, sizeof file, "case_%d.json", line);
  tmp_write(t, file, text, path, n);
  free(text);
  json_decref(root);
}

static bool has(const char *msg, const char *sub) { return !sub || strstr(msg, sub) != NULL; }

/* spec_load of the variant must fail with rc 2 and a message naming the file and holding
 * both substrings. */
static void expect_load_error(Tmp *t, int line, const char *base, const char *key,
                              const char *value, const char *sub1, const char *sub2) {
  char path[512], err[1024] = "";
  RunSpec *s = malloc(sizeof *s);
  write_variant(t, line, base, key, value, path, sizeof path);
  int rc = spec_load(path, s, err, sizeof err);
  if (getenv("LOOM_TEST_VERBOSE")) printf("%s\n", err); /* to read the messages */
  if (rc == 2 && has(err, path) && has(err, sub1) && has(err, sub2) && !strchr(err, '\n')) {
    n_pass++;
  } else {
    n_fail++;
    fprintf(stderr, "%s:%d: expected load error rc 2 with \"%s\", \"%s\", \"%s\"; got rc %d: %s\n",
            __FILE__, line, path, sub1 ? sub1 : "", sub2 ? sub2 : "", rc, err);
  }
  free(s);
}

/* spec_load must succeed and spec_validate fail with rc 2 and the substrings. */
static void expect_invalid(Tmp *t, int line, const char *base, const char *key, const char *value,
                           const char *sub1, const char *sub2) {
  char path[512], err[1024] = "";
  RunSpec *s = malloc(sizeof *s);
  write_variant(t, line, base, key, value, path, sizeof path);
  int rc = spec_load(path, s, err, sizeof err);
  int vrc = rc ? -1 : spec_validate(s, err, sizeof err);
  if (getenv("LOOM_TEST_VERBOSE")) printf("%s\n", err);
  if (rc == 0 && vrc == 2 && has(err, path) && has(err, sub1) && has(err, sub2)) {
    n_pass++;
  } else {
    n_fail++;
    fprintf(stderr, "%s:%d: expected validate error with \"%s\", \"%s\"; got load rc %d, validate rc %d: %s\n",
            __FILE__, line, sub1 ? sub1 : "", sub2 ? sub2 : "", rc, vrc, err);
  }
  free(s);
}

/* The variant must load and validate; returns the spec (caller frees). */
static RunSpec *expect_ok(Tmp *t, int line, const char *base, const char *key, const char *value) {
  char path[512], err[1024] = "";
  RunSpec *s = malloc(sizeof *s);
  write_variant(t, line, base, key, value, path, sizeof path);
  int rc = spec_load(path, s, err, sizeof err);
  if (!rc) rc = spec_validate(s, err, sizeof err);
  if (rc == 0) {
    n_pass++;
  } else {
    n_fail++;
    fprintf(stderr, "%s:%d: expected %s = %s to be accepted; got rc %d: %s\n", __FILE__, line, key,
            value ? value : "(removed)", rc, err);
  }
  return s;
}

#define LOAD_ERROR(base, key, value, sub1, sub2) expect_load_error(t, __LINE__, base, key, value, sub1, sub2)
#define INVALID(base, key, value, sub1, sub2) expect_invalid(t, __LINE__, base, key, value, sub1, sub2)
#define OK(base, key, value) free(expect_ok(t, __LINE__, base, key, value))

/* ---- the good cases ---- */

static void test_bare_gpt2_config(void) {
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "";
  int rc = spec_load("tests/unit/configs/gpt2_config.json", s, err, sizeof err);
  CHECK_E(rc == 0, err);
  CHECK_E(spec_validate(s, err, sizeof err) == 0, err);
  const ModelConfig *m = &s->model;
  CHECK(m->arch == ARCH_GPT2);
  CHECK(strcmp(arch_name(m->arch), "gpt2") == 0);
  CHECK(m->vocab_size == 50257 && m->hidden == 768 && m->n_layer == 12 && m->n_head == 12);
  CHECK(m->n_kv_head == 12 && m->head_dim == 64 && m->intermediate == 3072 && m->max_pos == 1024);
  CHECK_NEAR(m->norm_eps, 1e-5);
  CHECK(m->tied && !m->attention_bias && !m->mlp_bias);
  CHECK(config_param_count(m) == 124439808);
  /* Everything else at its defaults. */
  CHECK(s->batch == 4 && s->seq == 1024 && s->steps == 10 && s->grad_accum == 1);
  CHECK(s->warmup == 0 && s->save_every == 0 && s->seed == 1337);
  CHECK_NEAR(s->lr, 3e-4);
  CHECK(s->min_lr == 0.0);
  CHECK_NEAR(s->weight_decay, 0.1);
  CHECK_NEAR(s->beta1, 0.9);
  CHECK_NEAR(s->beta2, 0.95);
  CHECK_NEAR(s->eps, 1e-8);
  CHECK_NEAR(s->grad_clip, 1.0);
  CHECK(strcmp(s->precision, "fp32") == 0 && s->zero == 0 && s->n_data == 0);
  for (int i = 0; i < MESH_AXES; i++) CHECK(s->mesh[i] == 1);
  CHECK(s->init[0] == 0 && s->out[0] == 0 && s->save_dir[0] == 0 && s->model_path[0] == 0);
  CHECK(s->set_mask == SPEC_SET_MODEL);
  CHECK(strcmp(s->path, "tests/unit/configs/gpt2_config.json") == 0);

  /* config_load reads the same file on its own. */
  ModelConfig c;
  CHECK_E(config_load("tests/unit/configs/gpt2_config.json", &c, err, sizeof err) == 0, err);
  CHECK(c.hidden == 768 && c.tied);
  free(s);
}

static void test_spec_with_relative_model_path(void) {
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "";
  int rc = spec_load("tests/unit/configs/spec_relpath.json", s, err, sizeof err);
  CHECK_E(rc == 0, err);
  CHECK_E(spec_validate(s, err, sizeof err) == 0, err);
  const ModelConfig *m = &s->model;
  CHECK(m->arch == ARCH_LLAMA);
  CHECK(strcmp(s->model_path, "tests/unit/configs/hf/llama-small/config.json") == 0);
  CHECK(m->vocab_size == 512 && m->hidden == 128 && m->intermediate == 344 && m->n_layer == 2);
  CHECK(m->n_head == 4 && m->n_kv_head == 2 && m->head_dim == 32 && m->max_pos == 256);
  CHECK_NEAR(m->norm_eps, 1e-5);
  CHECK_NEAR(m->rope_theta, 500000.0);
  CHECK(!m->tied);
  /* embed 512*128 + 2 layers * (128 + 128*128 + 2*128*64 + 128*128 + 3*128*344 + 128) + 128 + head */
  CHECK(config_param_count(m) == 512 * 128 + 2 * (128 + 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 344 + 128) + 128 + 512 * 128);
  CHECK(s->batch == 2 && s->seq == 128 && s->steps == 50 && s->grad_accum == 4);
  CHECK_NEAR(s->lr, 1e-3);
  CHECK_NEAR(s->min_lr, 1e-4);
  CHECK(s->warmup == 5 && s->weight_decay == 0.0);
  CHECK_NEAR(s->beta1, 0.8);
  CHECK_NEAR(s->beta2, 0.99);
  CHECK_NEAR(s->eps, 1e-6);
  CHECK_NEAR(s->grad_clip, 0.5);
  CHECK(strcmp(s->precision, "bf16") == 0);
  CHECK(s->mesh[MESH_DP] == 2 && s->mesh[MESH_TP] == 2 && s->mesh[MESH_CP] == 1 &&
        s->mesh[MESH_PP] == 1 && s->mesh[MESH_EP] == 1);
  CHECK(s->zero == 1 && s->seed == 42 && s->save_every == 10);
  CHECK(s->n_data == 2);
  CHECK(strcmp(s->data[0], "tests/unit/configs/shards/train_000.bin") == 0);
  CHECK(strcmp(s->data[1], "/abs/train_001.bin") == 0);
  CHECK(strcmp(s->init, "tests/unit/configs/hf/llama-small/model.safetensors") == 0);
  CHECK(strcmp(s->out, "tests/unit/configs/out/final.safetensors") == 0);
  CHECK(strcmp(s->save_dir, "tests/unit/configs/ckpt") == 0);
  CHECK((s->set_mask & (SPEC_SET_LR | SPEC_SET_MESH | SPEC_SET_DATA | SPEC_SET_SEQ)) ==
        (SPEC_SET_LR | SPEC_SET_MESH | SPEC_SET_DATA | SPEC_SET_SEQ));

  /* A model folder (as downloaded from the Hub) works too; seq defaults to min(1024, 256). */
  rc = spec_load("tests/unit/configs/spec_model_folder.json", s, err, sizeof err);
  CHECK_E(rc == 0, err);
  CHECK(s->model.hidden == 128 && s->seq == 256 && s->batch == 4);
  CHECK(strcmp(s->model_path, "tests/unit/configs/hf/llama-small/config.json") == 0);
  CHECK(s->n_data == 1 && strcmp(s->data[0], "tests/unit/configs/shards/train_000.bin") == 0);
  free(s);
}

static void test_real_llama32(Tmp *t) {
  /* The real Llama-3.2-1B config carries llama3 RoPE scaling: read as it is. */
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "", path[512];
  int rc = spec_load("tests/unit/configs/llama32_1b_config.json", s, err, sizeof err);
  CHECK_E(rc == 0, err);
  const ModelConfig *m = &s->model;
  CHECK(m->arch == ARCH_LLAMA && m->hidden == 2048 && m->n_layer == 16 && m->n_head == 32 && m->n_kv_head == 8);
  CHECK(m->head_dim == 64 && m->intermediate == 8192 && m->vocab_size == 128256 && m->tied);
  CHECK(m->max_pos == 131072 && s->seq == 1024);
  CHECK_NEAR(m->rope_theta, 500000.0);
  CHECK_NEAR(m->rope_factor, 32.0);
  CHECK_NEAR(m->rope_low_freq, 1.0);
  CHECK_NEAR(m->rope_high_freq, 4.0);
  CHECK(m->rope_orig_max == 8192);
  CHECK(config_param_count(m) == 1235814400);
  /* transformers 5's form: the same scaling inside rope_parameters, with the base */
  json_error_t je;
  json_t *root = json_load_file("tests/unit/configs/llama32_1b_config.json", 0, &je);
  CHECK(root != NULL);
  json_t *params = json_deep_copy(json_object_get(root, "rope_scaling"));
  json_object_set_new(params, "rope_theta", json_real(500000.0));
  json_object_set_new(root, "rope_parameters", params);
  json_object_del(root, "rope_scaling");
  json_object_del(root, "rope_theta");
  char *text = json_dumps(root, 0);
  tmp_write(t, "llama32_params.json", text, path, sizeof path);
  free(text);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 0, err);
  CHECK(m->rope_factor == 32.0 && m->rope_low_freq == 1.0 && m->rope_high_freq == 4.0 && m->rope_orig_max == 8192);
  CHECK_NEAR(m->rope_theta, 500000.0);
  /* without rope_scaling: plain RoPE */
  json_object_del(root, "rope_parameters");
  text = json_dumps(root, 0);
  tmp_write(t, "llama32_noscaling.json", text, path, sizeof path);
  free(text);
  json_decref(root);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 0 && m->rope_factor == 0, err);
  free(s);
}

/* The hub's own config.json of Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B and Mistral-7B-v0.1
   (tests/hub_configs/, written from the published files) read without an edit. */
static void test_hub_configs(void) {
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "";
  int rc = spec_load("tests/hub_configs/Llama-3.2-1B.json", s, err, sizeof err);
  CHECK_E(rc == 0 && spec_validate(s, err, sizeof err) == 0, err);
  CHECK(s->model.arch == ARCH_LLAMA && s->model.rope_factor == 32.0 && config_param_count(&s->model) == 1235814400);
  rc = spec_load("tests/hub_configs/Qwen2.5-0.5B.json", s, err, sizeof err);
  CHECK_E(rc == 0 && spec_validate(s, err, sizeof err) == 0, err);
  /* 494,032,768 parameters (the published count), q/k/v biases included */
  CHECK(s->model.arch == ARCH_QWEN2 && s->model.qkv_bias && !s->model.qk_norm && s->model.sliding_window == 0);
  CHECK(s->model.tied && s->model.n_kv_head == 2 && s->model.head_dim == 64 && config_param_count(&s->model) == 494032768);
  rc = spec_load("tests/hub_configs/Qwen3-0.6B.json", s, err, sizeof err);
  CHECK_E(rc == 0 && spec_validate(s, err, sizeof err) == 0, err);
  /* 596,049,920 parameters: Qwen3-0.6B's 0.6B with the tied embedding counted once */
  CHECK(s->model.arch == ARCH_QWEN3 && s->model.qk_norm && !s->model.qkv_bias && s->model.head_dim == 128);
  CHECK(s->model.hidden == 1024 && s->model.n_head == 16 && config_param_count(&s->model) == 596049920);
  rc = spec_load("tests/hub_configs/Mistral-7B-v0.1.json", s, err, sizeof err);
  CHECK_E(rc == 0 && spec_validate(s, err, sizeof err) == 0, err);
  /* 7,241,732,096 parameters (Mistral 7B) and its 4096-token window */
  CHECK(s->model.arch == ARCH_MISTRAL && s->model.sliding_window == 4096 && !s->model.tied);
  CHECK(config_param_count(&s->model) == 7241732096LL);
  free(s);
}

static void test_accepted_variants(Tmp *t) {
  RunSpec *s;
  s = expect_ok(t, __LINE__, GPT2_SPEC, "model.n_embd", "768.0"); /* integral float */
  CHECK(s->model.hidden == 768);
  free(s);
  s = expect_ok(t, __LINE__, GPT2_SPEC, "model.hidden_size", "768"); /* alias agreeing */
  free(s);
  s = expect_ok(t, __LINE__, GPT2_SPEC, "model.n_inner", "null");
  CHECK(s->model.intermediate == 3072);
  free(s);
  s = expect_ok(t, __LINE__, GPT2_SPEC, "model.n_inner", "1000");
  CHECK(s->model.intermediate == 1000);
  free(s);
  OK(GPT2_SPEC, "model.activation_function", "'gelu_pytorch_tanh'");
  s = expect_ok(t, __LINE__, GPT2_SPEC, "seq", NULL); /* default min(1024, n_positions) */
  CHECK(s->seq == 1024 && !(s->set_mask & SPEC_SET_SEQ));
  free(s);
  s = expect_ok(t, __LINE__, GPT2_SPEC, "_comment", "'keys starting with _ are notes'");
  free(s);
  /* GPT-2 written with the HF generic names only. */
  s = expect_ok(t, __LINE__,
                "{'model': {'model_type': 'gpt2', 'vocab_size': 100, 'max_position_embeddings': 64,"
                " 'hidden_size': 32, 'num_hidden_layers': 2, 'num_attention_heads': 4}}",
                "batch", "1");
  CHECK(s->model.max_pos == 64 && s->model.hidden == 32 && s->model.n_layer == 2 &&
        s->model.n_head == 4 && s->model.head_dim == 8 && s->seq == 64);
  free(s);

  s = expect_ok(t, __LINE__, LLAMA_SPEC, "model.rope_scaling", "null");
  CHECK(s->model.rope_theta == 10000.0 && s->model.n_kv_head == 2 && s->model.head_dim == 16);
  CHECK_NEAR(s->model.norm_eps, 1e-6);
  CHECK(!s->model.tied && s->model.max_pos == 2048 && s->seq == 32);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "model.rope_theta", "123.0");
  CHECK(s->model.rope_theta == 123.0);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "model.rope_parameters", "{'rope_type': 'default', 'rope_theta': 7.0}");
  CHECK(s->model.rope_theta == 7.0);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "model.num_key_value_heads", "null");
  CHECK(s->model.n_kv_head == 4);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "model.head_dim", "10"); /* explicit: no divisibility */
  CHECK(s->model.head_dim == 10);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "seq", "4096"); /* RoPE: longer than max_pos is allowed */
  CHECK(s->seq == 4096);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "mesh", "{'tp': 4}"); /* 2 kv heads repeated on 4 ranks */
  CHECK(s->mesh[MESH_TP] == 4);
  free(s);
  s = expect_ok(t, __LINE__, LLAMA_SPEC, "data", "'one.bin'");
  CHECK(s->n_data == 1 && strcmp(s->data[0] + strlen(s->data[0]) - 8, "/one.bin") == 0);
  free(s);
}

static void test_spec_set(void) {
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "";
  CHECK_E(spec_load("tests/unit/configs/gpt2_config.json", s, err, sizeof err) == 0, err);
  CHECK_E(spec_set(s, "lr", "1e-3", "--lr", err, sizeof err) == 0, err);
  CHECK_NEAR(s->lr, 1e-3);
  CHECK(s->set_mask & SPEC_SET_LR);
  CHECK_E(spec_set(s, "precision", "bf16", "--precision", err, sizeof err) == 0, err);
  CHECK(strcmp(s->precision, "bf16") == 0);
  CHECK_E(spec_set(s, "mesh.tp", "4", "--tp", err, sizeof err) == 0, err);
  CHECK_E(spec_set(s, "mesh", "{\"dp\": 2}", "--mesh", err, sizeof err) == 0, err);
  CHECK(s->mesh[MESH_TP] == 4 && s->mesh[MESH_DP] == 2);
  CHECK_E(spec_set(s, "data", "a/b.bin", "--data", err, sizeof err) == 0, err);
  CHECK(s->n_data == 1 && strcmp(s->data[0], "a/b.bin") == 0); /* relative to the current folder */
  CHECK_E(spec_set(s, "out", "123", "--out", err, sizeof err) == 0, err); /* a path, not a number */
  CHECK(strcmp(s->out, "123") == 0);
  CHECK_E(spec_set(s, "seq", "512", "--seq", err, sizeof err) == 0, err);
  CHECK(s->seq == 512);
  CHECK_E(spec_validate(s, err, sizeof err) == 0, err);

  CHECK(spec_set(s, "lr", "fast", "--lr", err, sizeof err) == 2);
  CHECK_E(has(err, "--lr") && has(err, "key \"lr\"") && has(err, "\"fast\""), err);
  CHECK(spec_set(s, "setps", "5", "--set", err, sizeof err) == 2);
  CHECK_E(has(err, "did you mean \"steps\""), err);
  CHECK(spec_set(s, "mesh.xp", "2", "--set", err, sizeof err) == 2);
  CHECK_E(has(err, "key \"mesh.xp\"") && has(err, "mesh axis"), err);
  CHECK(spec_set(s, "seq", "4096", "--seq", err, sizeof err) == 0);
  CHECK(spec_validate(s, err, sizeof err) == 2);
  CHECK_E(has(err, "key \"seq\"") && has(err, "1024"), err);

  /* Switching the model re-derives seq unless seq was set. */
  spec_defaults(s);
  CHECK_E(spec_set(s, "model", "tests/unit/configs/hf/llama-small", "--model", err, sizeof err) == 0, err);
  CHECK(s->model.arch == ARCH_LLAMA && s->seq == 256);
  CHECK_E(spec_validate(s, err, sizeof err) == 0, err);
  CHECK(spec_set(s, "model", "tests/unit/configs/nope.json", "--model", err, sizeof err) == 2);
  CHECK_E(has(err, "--model") && has(err, "nope.json"), err);
  free(s);
}

/* ---- every error, one case each ---- */

static void test_file_errors(Tmp *t) {
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "", path[512];

  int rc = spec_load("tests/unit/configs/bad_trailing_comma.json", s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "tests/unit/configs/bad_trailing_comma.json:4:") &&
              has(err, "invalid JSON"),
          err);

  tmp_write(t, "dup.json", "{'model': 'x.json',\n 'batch': 1,\n 'batch': 2}", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "dup.json:3:") && has(err, "duplicate"), err);

  rc = spec_load("tests/unit/configs/does_not_exist.json", s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "does_not_exist.json") && has(err, "No such file"), err);

  rc = spec_load("tests/unit/configs", s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "is a folder"), err);

  tmp_write(t, "array.json", "[1, 2]", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "array.json") && has(err, "top level") && has(err, "an array"), err);

  tmp_write(t, "empty.json", "", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "empty.json") && has(err, "invalid JSON"), err);

  tmp_write(t, "nomodel.json", "{'batch': 4}", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "nomodel.json") && has(err, "key \"model\": missing"), err);

  /* Run settings mixed into a bare HF config would be ignored: refused. */
  tmp_write(t, "flat.json", "{'model_type': 'gpt2', 'vocab_size': 10, 'n_positions': 8, "
            "'n_embd': 8, 'n_layer': 1, 'n_head': 2, 'batch': 8}", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "flat.json: key \"batch\"") && has(err, "run spec"), err);

  /* Mixtral-8x7B's published config.json loads as it is. */
  rc = spec_load("tests/unit/configs/mixtral_config.json", s, err, sizeof err);
  CHECK_E(rc == 0, err);
  CHECK(s->model.arch == ARCH_MIXTRAL && s->model.n_experts == 8 && s->model.top_k == 2 &&
        s->model.moe_intermediate == 14336 && s->model.norm_topk && !s->model.router_aux &&
        s->model.aux_coef == 0.02 && s->model.sliding_window == 0 && config_layer_is_moe(&s->model, 31));

  /* A spec whose model path points at a missing file, and at a broken config. */
  tmp_write(t, "missing_model.json", "{'model': 'sub/none.json'}", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "missing_model.json: key \"model\"") && has(err, "sub/none.json"), err);
  tmp_mkdir(t, "sub");
  char cfg[512];
  tmp_write(t, "sub/broken.json", "{'model_type': 'gpt2', 'vocab_size': 10, 'n_positions': 8, "
            "'n_embd': 8, 'n_layer': 1, 'n_head': 'two'}", cfg, sizeof cfg);
  tmp_write(t, "broken_model.json", "{'model': 'sub/broken.json'}", path, sizeof path);
  rc = spec_load(path, s, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "sub/broken.json: key \"n_head\"") && has(err, "\"two\""), err);

  /* config_load on a run spec hints at what it is. */
  ModelConfig c;
  rc = config_load("tests/unit/configs/spec_relpath.json", &c, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "model_type") && has(err, "run spec"), err);

  /* config_from_json names the embedded path. */
  json_t *num = json_integer(3);
  rc = config_from_json(num, "x.json", "model", &c, err, sizeof err);
  CHECK_E(rc == 2 && has(err, "x.json: key \"model\"") && has(err, "found 3"), err);
  json_decref(num);
  free(s);
}

static void test_model_errors(Tmp *t) {
  const char *g = GPT2_SPEC, *l = LLAMA_SPEC;
  /* model_type */
  LOAD_ERROR(g, "model.model_type", NULL, "key \"model.model_type\": missing", "\"gpt2\" or \"llama\"");
  LOAD_ERROR(g, "model.model_type", "3", "key \"model.model_type\"", "expected a string");
  LOAD_ERROR(g, "model.model_type", "'mixtral'", "key \"model.hidden_size\": missing", "model width");
  LOAD_ERROR(g, "model.model_type", "'bert'", "model_type \"bert\" is not supported", "supported: gpt2, llama, mistral, mixtral, qwen2, qwen3, qwen3_moe");
  /* mixture of experts: bad and unknown router settings, checked against the model */
  const char *x = MIXTRAL_SPEC;
  LOAD_ERROR(x, "model.num_experts_per_tok", "5", "each token goes to 5 experts but a layer has only 4", "at most 4");
  LOAD_ERROR(x, "model.num_local_experts", NULL, "key \"model.num_local_experts\": missing", "number of experts");
  LOAD_ERROR(x, "model.router_jitter_noise", "0.01", "router_jitter_noise", "not yet supported");
  LOAD_ERROR(x, "model.scoring_func", "'sigmoid'", "scoring_func = \"sigmoid\"", "softmax over experts");
  LOAD_ERROR(x, "model.n_shared_experts", "2", "n_shared_experts", "not yet supported");
  LOAD_ERROR(x, "model.router_aux_loss_coef", "-1", "router_aux_loss_coef", "a number >= 0");
  OK(x, "model.router_jitter_noise", "0.0");
  OK(x, "model.scoring_func", "'softmax'");
  INVALID(x, "mesh", "{'ep': 3}", "4 experts of a layer, which do not divide into ep = 3", "choose an ep that divides 4");
  INVALID(x, "mesh", "{'ep': 8}", "do not divide into ep = 8", "choose an ep that divides 4");
  INVALID(l, "mesh", "{'ep': 2}", "this llama model is dense", "set ep to 1");
  INVALID(x, "model.sliding_window", "16", "window of 16 tokens, shorter than seq (32)", "at most 16");
  OK(x, "model.sliding_window", "4096");
  OK(x, "mesh", "{'pp': 2}");   /* pipelines with experts (the load-balancing loss's limit: tests/cli/moe.sh) */
  LOAD_ERROR(g, "model", "42", "key \"model\"", "found 42");
  /* sizes */
  LOAD_ERROR(g, "model.n_head", "'twelve'",
             "key \"model.n_head\": expected a positive integer, found \"twelve\"",
             "found \"twelve\"; set it to the number of attention heads (e.g. 12)");
  LOAD_ERROR(g, "model.n_head", "0", "key \"model.n_head\"", "found 0");
  LOAD_ERROR(g, "model.n_layer", "-3", "key \"model.n_layer\"", "found -3");
  LOAD_ERROR(g, "model.n_embd", "768.5", "key \"model.n_embd\"", "found 768.5");
  LOAD_ERROR(g, "model.n_embd", "true", "key \"model.n_embd\"", "found true");
  LOAD_ERROR(g, "model.n_embd", "null", "key \"model.n_embd\": missing", "hidden_size");
  LOAD_ERROR(g, "model.vocab_size", NULL, "key \"model.vocab_size\": missing", "vocabulary size");
  LOAD_ERROR(g, "model.vocab_size", "4294967296", "key \"model.vocab_size\"", "at most 2147483647");
  LOAD_ERROR(g, "model.n_positions", NULL, "key \"model.n_positions\": missing", "max_position_embeddings");
  LOAD_ERROR(g, "model.hidden_size", "1024", "key \"model.n_embd\": 768 disagrees with its alias \"hidden_size\" (1024)", "remove one");
  LOAD_ERROR(g, "model.n_inner", "'big'", "key \"model.n_inner\"", "\"big\"");
  /* the brief's example: n_embd not divisible by n_head */
  LOAD_ERROR(g, "model.n_embd", "100", "n_embd (100) is not divisible by n_head (12)", "head size must be a whole number");
  /* GPT-2 settings loom would get wrong */
  LOAD_ERROR(g, "model.activation_function", "'relu'", "key \"model.activation_function\"", "\"relu\" is not yet supported");
  LOAD_ERROR(g, "model.activation_function", "7", "key \"model.activation_function\"", "expected a string");
  LOAD_ERROR(g, "model.tie_word_embeddings", "false", "key \"model.tie_word_embeddings\"", "not yet supported");
  LOAD_ERROR(g, "model.scale_attn_by_inverse_layer_idx", "true", "key \"model.scale_attn_by_inverse_layer_idx\"", "not yet supported");
  LOAD_ERROR(g, "model.scale_attn_weights", "false", "key \"model.scale_attn_weights\"", "not yet supported");
  LOAD_ERROR(g, "model.layer_norm_epsilon", "0", "key \"model.layer_norm_epsilon\"", "a positive number");
  LOAD_ERROR(g, "model.layer_norm_epsilon", "'1e-5'", "key \"model.layer_norm_epsilon\"", "\"1e-5\"");

  /* llama */
  LOAD_ERROR(l, "model.intermediate_size", NULL, "key \"model.intermediate_size\": missing", "MLP width");
  LOAD_ERROR(l, "model.hidden_act", "'gelu'", "key \"model.hidden_act\"", "\"gelu\" is not yet supported");
  LOAD_ERROR(l, "model.attention_bias", "true", "key \"model.attention_bias\"", "not yet supported");
  LOAD_ERROR(l, "model.mlp_bias", "true", "key \"model.mlp_bias\"", "not yet supported");
  LOAD_ERROR(l, "model.mlp_bias", "'no'", "key \"model.mlp_bias\"", "expected true or false");
  LOAD_ERROR(l, "model.tie_word_embeddings", "1", "key \"model.tie_word_embeddings\"", "expected true or false");
  LOAD_ERROR(l, "model.rope_scaling", "{'rope_type': 'linear', 'factor': 2.0}", "key \"model.rope_scaling.rope_type\"", "\"linear\" is not yet supported");
  LOAD_ERROR(l, "model.rope_scaling", "{'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0}",
             "key \"model.rope_scaling.original_max_position_embeddings\": missing", "needs factor");
  LOAD_ERROR(l, "model.rope_scaling", "{'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 4.0, 'high_freq_factor': 1.0, 'original_max_position_embeddings': 8192}",
             "key \"model.rope_scaling.high_freq_factor\"", "not above low_freq_factor");
  LOAD_ERROR(l, "model.rope_scaling", "{'rope_type': 'llama3', 'factor': -1, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': 8192}",
             "key \"model.rope_scaling.factor\"", "expected a positive number");
  LOAD_ERROR(l, "model.rope_scaling", "{'factor': 2.0}", "key \"model.rope_scaling\"", "with a rope_type");
  LOAD_ERROR(l, "model.rope_scaling", "'llama3'", "key \"model.rope_scaling\"", "expected an object");
  LOAD_ERROR(l, "model.rope_scaling", "{'type': 'dynamic', 'factor': 2.0}", "rope_type \"dynamic\"", "not yet supported");
  LOAD_ERROR(l, "model.rope_parameters", "{'rope_type': 'yarn', 'rope_theta': 10000.0}", "key \"model.rope_parameters.rope_type\"", "\"yarn\" is not yet supported");
  LOAD_ERROR(l, "model.rope_parameters", "[1]", "key \"model.rope_parameters\"", "an array");
  LOAD_ERROR(l, "model.rope_parameters", "{'rope_theta': -1}", "key \"model.rope_parameters.rope_theta\"", "found -1");
  LOAD_ERROR(l, "model.rope_theta", "0", "key \"model.rope_theta\"", "a positive number");
  LOAD_ERROR(l, "model.rms_norm_eps", "-1e-6", "key \"model.rms_norm_eps\"", "a positive number");
  LOAD_ERROR(l, "model.num_key_value_heads", "3", "num_attention_heads (4) is not divisible by num_key_value_heads (3)", NULL);
  LOAD_ERROR(l, "model.num_attention_heads", "6", "hidden_size (64) is not divisible by num_attention_heads (6)", "head_dim");
  LOAD_ERROR(l, "model.head_dim", "15", "key \"model.head_dim\"", "RoPE");
  LOAD_ERROR(l, "model.max_position_embeddings", "0", "key \"model.max_position_embeddings\"", "found 0");
}

static void test_spec_errors(Tmp *t) {
  const char *g = GPT2_SPEC;
  /* unknown keys: typos, other tools' names, nothing close */
  LOAD_ERROR(g, "setps", "5", "key \"setps\": unknown key", "did you mean \"steps\"?");
  LOAD_ERROR(g, "weight_decy", "0.1", "key \"weight_decy\"", "did you mean \"weight_decay\"?");
  LOAD_ERROR(g, "learning_rate", "0.1", "key \"learning_rate\"", "did you mean \"lr\"?");
  LOAD_ERROR(g, "batch_size", "8", "key \"batch_size\"", "did you mean \"batch\"?");
  LOAD_ERROR(g, "zzzzzzzzzz", "1", "key \"zzzzzzzzzz\": unknown key", "valid: model, batch, seq");
  LOAD_ERROR(g, "mesh", "{'dq': 2}", "key \"mesh.dq\": unknown mesh axis", "did you mean \"dp\"?");
  LOAD_ERROR(g, "tp", "2", "key \"tp\": unknown key", "\"mesh\": {\"tp\": ...}");
  LOAD_ERROR(g, "mesh", "[2, 2]", "key \"mesh\"", "an array");
  LOAD_ERROR(g, "mesh", "{'tp': 0}", "key \"mesh.tp\"", "found 0");
  /* values */
  LOAD_ERROR(g, "batch", "0", "key \"batch\": expected a positive integer, found 0", NULL);
  LOAD_ERROR(g, "batch", "'4'", "key \"batch\"", "found \"4\"");
  LOAD_ERROR(g, "seq", "64.5", "key \"seq\"", "found 64.5");
  LOAD_ERROR(g, "steps", "-1", "key \"steps\"", "found -1");
  LOAD_ERROR(g, "steps", "1e19", "key \"steps\"", "found 1e+19");
  LOAD_ERROR(g, "steps", "9223372036854775808.0", "key \"steps\"", "an integer >= 0");
  LOAD_ERROR(g, "grad_accum", "0", "key \"grad_accum\"", "found 0");
  LOAD_ERROR(g, "warmup", "'ten'", "key \"warmup\"", "\"ten\"");
  LOAD_ERROR(g, "seed", "-5", "key \"seed\"", "found -5");
  LOAD_ERROR(g, "save_every", "1.5", "key \"save_every\"", "found 1.5");
  LOAD_ERROR(g, "lr", "'3e-4'", "key \"lr\": expected a number >= 0, found \"3e-4\"", "without quotes");
  LOAD_ERROR(g, "lr", "-0.1", "key \"lr\"", "found -0.1");
  LOAD_ERROR(g, "min_lr", "null", "key \"min_lr\"", "found null");
  LOAD_ERROR(g, "weight_decay", "-1", "key \"weight_decay\"", NULL);
  LOAD_ERROR(g, "beta1", "1.0", "key \"beta1\"", "in [0, 1)");
  LOAD_ERROR(g, "beta2", "-0.5", "key \"beta2\"", "in [0, 1)");
  LOAD_ERROR(g, "eps", "0", "key \"eps\"", "a number > 0");
  LOAD_ERROR(g, "grad_clip", "false", "key \"grad_clip\"", "found false");
  LOAD_ERROR(g, "precision", "'bfloat16'", "key \"precision\"", "write \"bf16\"");
  LOAD_ERROR(g, "precision", "'fp16'", "key \"precision\"", "not yet supported");
  LOAD_ERROR(g, "precision", "32", "key \"precision\"", "\"fp32\" or \"bf16\"");
  LOAD_ERROR(g, "zero", "4", "key \"zero\": expected an integer from 0 to 3, found 4", "ZeRO stage");
  LOAD_ERROR(g, "data", "[]", "key \"data\"", "non-empty array");
  LOAD_ERROR(g, "data", "['a.bin', 3]", "key \"data[1]\"", "found 3");
  LOAD_ERROR(g, "data", "['a','a','a','a','a','a','a','a','a','a','a','a','a','a','a','a','a']",
             "key \"data\": expected at most 16 paths, found 17", NULL);
  LOAD_ERROR(g, "data", "''", "key \"data\"", "non-empty path");
  LOAD_ERROR(g, "init", "5", "key \"init\"", "found 5");
  LOAD_ERROR(g, "out", "''", "key \"out\"", "non-empty path");
  LOAD_ERROR(g, "save_dir", "{}", "key \"save_dir\"", "an object");
}

static void test_validate_errors(Tmp *t) {
  const char *g = GPT2_SPEC, *l = LLAMA_SPEC;
  INVALID(g, "seq", "2048", "key \"seq\": 2048 is longer than the model's 1024 positions", "at most 1024");
  INVALID(g, "min_lr", "0.01", "key \"min_lr\"", "between 0 and lr");
  INVALID(g, "mesh", "{'tp': 5}", "key \"mesh.tp\"", "12 heads");
  INVALID(l, "mesh", "{'tp': 3}", "key \"mesh.tp\"", NULL);
  INVALID(g, "mesh", "{'cp': 3}", "key \"mesh.cp\"", "seq (64) is not divisible by cp = 3");
  INVALID(g, "mesh", "{'pp': 13}", "key \"mesh.pp\"", "at most 12");
  INVALID(g, "mesh", "{'ep': 2}", "key \"mesh.ep\"", "mixture-of-experts");
  /* A spec built in code without a model, and values set in code. */
  RunSpec *s = malloc(sizeof *s);
  char err[1024] = "";
  spec_defaults(s);
  CHECK(spec_validate(s, err, sizeof err) == 2);
  CHECK_E(has(err, "run spec: key \"model\""), err);
  CHECK_E(spec_load("tests/unit/configs/gpt2_config.json", s, err, sizeof err) == 0, err);
  s->zero = 7;
  CHECK(spec_validate(s, err, sizeof err) == 2 && has(err, "gpt2_config.json: key \"zero\""));
  s->zero = 0;
  snprintf(s->precision, sizeof s->precision, "fp8");
  CHECK(spec_validate(s, err, sizeof err) == 2 && has(err, "key \"precision\""));
  snprintf(s->precision, sizeof s->precision, "fp32");
  s->mesh[MESH_DP] = 0;
  CHECK(spec_validate(s, err, sizeof err) == 2 && has(err, "key \"mesh.dp\""));
  s->mesh[MESH_DP] = 1;
  s->batch = 0;
  CHECK(spec_validate(s, err, sizeof err) == 2 && has(err, "key \"batch\""));
  s->batch = 1;
  s->beta2 = 1.0;
  CHECK(spec_validate(s, err, sizeof err) == 2 && has(err, "key \"beta2\""));
  s->beta2 = 0.95;
  CHECK_E(spec_validate(s, err, sizeof err) == 0, err);
  /* A tiny err buffer truncates but never overflows; errlen 0 writes nothing. */
  char small[8];
  s->batch = 0;
  CHECK(spec_validate(s, small, sizeof small) == 2 && strlen(small) == 7);
  CHECK(spec_validate(s, NULL, 0) == 2);
  free(s);
}

static void test_helpers(void) {
  CHECK(config_edit_distance("steps", "steps") == 0);
  CHECK(config_edit_distance("setps", "steps") == 2);
  CHECK(config_edit_distance("LR", "lr") == 0);
  CHECK(config_edit_distance("", "abc") == 3);
  char buf[96];
  json_t *v = json_real(768.0);
  config_describe_value(v, buf, sizeof buf);
  CHECK(strcmp(buf, "768.0") == 0);
  json_decref(v);
  v = json_string("twelve");
  config_describe_value(v, buf, sizeof buf);
  CHECK(strcmp(buf, "\"twelve\"") == 0);
  json_decref(v);
  config_describe_value(json_null(), buf, sizeof buf);
  CHECK(strcmp(buf, "null") == 0);
  CHECK(strcmp(arch_name(ARCH_LLAMA), "llama") == 0);
}

/* ---- the checked-in model specs under models/ ---- */

static void test_models_folder(void) {
  DIR *d = opendir("models");
  if (!d) {
    printf("models/ not found: skipping the checked-in model specs\n");
    return;
  }
  RunSpec *s = malloc(sizeof *s);
  char err[1024], path[512];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
    snprintf(path, sizeof path, "models/%s", e->d_name);
    err[0] = 0;
    int rc = spec_load(path, s, err, sizeof err);
    if (!rc) rc = spec_validate(s, err, sizeof err);
    CHECK_E(rc == 0, err);
    if (rc) continue;
    n++;
    const ModelConfig *m = &s->model;
    const char *name = e->d_name;
    if (strcmp(name, "gpt2-124M.json") == 0) {
      CHECK(m->arch == ARCH_GPT2 && m->n_layer == 12 && m->hidden == 768 && m->n_head == 12);
      CHECK(m->max_pos == 1024 && m->tied && m->intermediate == 3072);
      if (m->vocab_size == 50257) CHECK(config_param_count(m) == 124439808);
    } else if (strcmp(name, "gpt2-350M.json") == 0) {
      CHECK(m->arch == ARCH_GPT2 && m->n_layer == 24 && m->hidden == 1024 && m->n_head == 16);
      CHECK(m->tied && m->head_dim == 64);
    } else if (strcmp(name, "llama-1B.json") == 0) {
      CHECK(m->arch == ARCH_LLAMA && m->n_layer == 16 && m->hidden == 2048 && m->n_head == 32);
      CHECK(m->n_kv_head == 8 && m->head_dim == 64 && m->intermediate == 8192);
      CHECK(m->tied && m->vocab_size == 128256 && m->rope_theta == 500000.0);
      CHECK(config_param_count(m) == 1235814400);
    } else if (strcmp(name, "llama-tiny-tied.json") == 0) {
      CHECK(m->arch == ARCH_LLAMA && m->head_dim == 32 && m->n_kv_head == 1 && m->tied);
      CHECK(m->rope_theta == 500000.0);
    } else if (strcmp(name, "llama-tiny.json") == 0) {
      CHECK(m->arch == ARCH_LLAMA);
    } else if (strcmp(name, "gpt2-tiny.json") == 0) {
      CHECK(m->arch == ARCH_GPT2 && m->tied);
    }
  }
  closedir(d);
  printf("models/: %d spec(s) loaded and validated\n", n);
  free(s);
}

int main(void) {
  Tmp *t = calloc(1, sizeof *t);
  snprintf(t->dir, sizeof t->dir, "/tmp/loom-test-config-XXXXXX");
  if (!mkdtemp(t->dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_helpers();
  test_bare_gpt2_config();
  test_spec_with_relative_model_path();
  test_hub_configs();
  test_real_llama32(t);
  test_accepted_variants(t);
  test_spec_set();
  test_file_errors(t);
  test_model_errors(t);
  test_spec_errors(t);
  test_validate_errors(t);
  test_models_folder();
  tmp_cleanup(t);
  free(t);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
