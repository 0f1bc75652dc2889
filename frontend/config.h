/* frontend/config.h: model configurations and run specs.
 *
 * config.c  reads a Hugging Face config.json (gpt2, llama) into a ModelConfig, and the
 *           JSON helpers both files share (file reading with line:column errors,
 *           value descriptions, edit distance for "did you mean").
 * spec.c    reads a loom run spec (model + batch/seq + training settings + mesh + paths)
 *           into a RunSpec, applies command-line overrides, and checks fields against
 *           each other.
 *
 * Every function returns 0 on success, 2 when the user's input is wrong (bad JSON, bad
 * key, bad value, missing file the user named) and 1 on a run-time failure that is not
 * the user's fault (out of memory, read error). On failure a one-line message is
 * written to err (errlen bytes, may be 0): it names the file, the key as a JSON path
 * (e.g. `model.n_head`), what was found, and how to fix it. Nothing here prints or exits.
 */
#ifndef LOOM_FRONTEND_CONFIG_H
#define LOOM_FRONTEND_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Mixtral and Qwen3-MoE are Llama with mixture-of-experts MLPs (n_experts > 0); Qwen2 is Llama
   with q/k/v biases, Qwen3 Llama with per-head q/k norms, Mistral Llama with sliding-window
   attention (docs/models.md). */
typedef enum { ARCH_GPT2, ARCH_LLAMA, ARCH_MIXTRAL, ARCH_QWEN3_MOE, ARCH_QWEN2, ARCH_QWEN3, ARCH_MISTRAL } ModelArch;
#define CONFIG_MAX_MLP_ONLY 256

/* The largest size any dimension may have (keeps products of two sizes in int64). */
#define CONFIG_MAX_SIZE 2147483647LL

typedef struct {
  ModelArch arch;
  int64_t vocab_size;   /* V */
  int64_t hidden;       /* C: n_embd / hidden_size */
  int64_t n_layer;      /* L */
  int64_t n_head;       /* query heads */
  int64_t n_kv_head;    /* key/value heads (GQA); GPT-2: = n_head */
  int64_t head_dim;     /* D; GPT-2: hidden / n_head */
  int64_t intermediate; /* MLP width; GPT-2: n_inner or 4 * hidden */
  int64_t max_pos;      /* n_positions / max_position_embeddings */
  double norm_eps;      /* layer_norm_epsilon / rms_norm_eps */
  double rope_theta;    /* llama only (0 for GPT-2) */
  /* Llama 3.1's RoPE scaling (rope_type "llama3"); rope_factor 0: plain RoPE */
  double rope_factor, rope_low_freq, rope_high_freq;
  int64_t rope_orig_max;  /* original_max_position_embeddings */
  bool qkv_bias;        /* qwen2: biases on the q, k and v projections (not o) */
  bool tied;            /* lm_head shares the token embedding; GPT-2 always true */
  bool attention_bias, mlp_bias; /* llama; always false for now (true is refused) */
  /* Mixture of experts (mixtral, qwen3_moe; 0 experts: a dense model).  A sparse layer's MLP
     is n_experts SwiGLU experts of width moe_intermediate, top_k of them per token. */
  int64_t n_experts;    /* num_local_experts / num_experts */
  int64_t top_k;        /* num_experts_per_tok */
  int64_t moe_intermediate; /* mixtral: intermediate_size; qwen3_moe: moe_intermediate_size */
  bool norm_topk;       /* renormalize the k routing weights to sum 1 (mixtral always; qwen3: norm_topk_prob) */
  bool router_aux;      /* output_router_logits: training adds aux_coef x the load-balancing loss */
  double aux_coef;      /* router_aux_loss_coef */
  bool qk_norm;         /* qwen3_moe: RMSNorm over head_dim on each query and key head */
  int64_t sparse_step;  /* qwen3_moe decoder_sparse_step (1: every layer) */
  int n_mlp_only;       /* qwen3_moe mlp_only_layers: layers with a dense MLP */
  int64_t mlp_only[CONFIG_MAX_MLP_ONLY];
  int64_t sliding_window;   /* 0: full attention; mistral: the attention window (attention's `window`);
                               the others: refused by spec_validate when shorter than the sequence */
} ModelConfig;

/* Layer l's MLP is a mixture of experts. */
bool config_layer_is_moe(const ModelConfig *c, int64_t l);

/* Bits of RunSpec.set_mask: which settings were given (by the file or spec_set) rather
 * than left at their defaults. */
enum {
  SPEC_SET_BATCH = 1u << 0,
  SPEC_SET_SEQ = 1u << 1,
  SPEC_SET_STEPS = 1u << 2,
  SPEC_SET_GRAD_ACCUM = 1u << 3,
  SPEC_SET_WARMUP = 1u << 4,
  SPEC_SET_SAVE_EVERY = 1u << 5,
  SPEC_SET_SEED = 1u << 6,
  SPEC_SET_LR = 1u << 7,
  SPEC_SET_MIN_LR = 1u << 8,
  SPEC_SET_WEIGHT_DECAY = 1u << 9,
  SPEC_SET_BETA1 = 1u << 10,
  SPEC_SET_BETA2 = 1u << 11,
  SPEC_SET_EPS = 1u << 12,
  SPEC_SET_GRAD_CLIP = 1u << 13,
  SPEC_SET_PRECISION = 1u << 14,
  SPEC_SET_MESH = 1u << 15,
  SPEC_SET_ZERO = 1u << 16,
  SPEC_SET_DATA = 1u << 17,
  SPEC_SET_INIT = 1u << 18,
  SPEC_SET_OUT = 1u << 19,
  SPEC_SET_SAVE_DIR = 1u << 20,
  SPEC_SET_MODEL = 1u << 21,
  SPEC_SET_BUCKET_MB = 1u << 22,
  SPEC_SET_VOCAB_MULTIPLE = 1u << 23,
};

enum { MESH_DP, MESH_TP, MESH_CP, MESH_PP, MESH_EP, MESH_AXES };
#define SPEC_MAX_DATA 16
#define SPEC_PATH_MAX 4096

typedef struct {
  char path[SPEC_PATH_MAX];       /* the spec/config file path as given */
  char model_path[SPEC_PATH_MAX]; /* the config.json "model" named, resolved; "" if embedded
                                     or if the spec file is itself a config.json */
  ModelConfig model;
  int64_t batch, seq;             /* default 4 and min(1024, max_pos) */
  int64_t steps, grad_accum, warmup, save_every, seed;
  double lr, min_lr, weight_decay, beta1, beta2, eps, grad_clip;
  char precision[8];              /* "fp32" or "bf16" */
  int64_t mesh[MESH_AXES];        /* dp tp cp pp ep (index with MESH_*), default 1 each */
  int zero;                       /* ZeRO stage 0..3 */
  bool sequence_parallel;         /* with tp: norms and residuals split along the sequence */
  bool overlap;                   /* the overlap pass: async collectives (default true) */
  bool cp_contiguous;             /* cp_balance "contiguous" (default "zigzag": rank i holds chunks i and 2cp-1-i) */
  bool cp_allgather;              /* cp_attn "allgather" (default "ring": K/V travel around the cp ring) */
  double bucket_mb;               /* dp gradient all-reduce buckets in MB (10^6 bytes), default 25; 0 = off */
  int64_t vocab_multiple;         /* the graph's vocabulary rounded up to a multiple of it (and of tp); default 1 */
  int pp_schedule;                /* PipeKind (ir.h): afab 1f1b interleaved zb-h1 dualpipev; 0 = 1f1b */
  int64_t pp_virtual;             /* chunks per pp rank; 0 = the schedule's default (2 for interleaved) */
  int n_pp_split;                 /* pp_split: the first layer of every chunk; 0 = balanced by FLOPs */
  int64_t pp_split[256];
  int recompute;                  /* RecomputeMode (ir.h); spec "recompute": "none" (default), "selective[:classes]", "full", "auto" */
  unsigned recompute_classes;     /* selective: RC_* bits */
  int64_t memory_budget;          /* bytes per rank ("memory_budget": "40GiB"); 0 = none */
  double capacity_factor;         /* mixture of experts: 0 = dropless (as Hugging Face, the default); else each expert
                                     takes at most ceil(capacity_factor x tokens x top_k / experts) of a micro-batch's
                                     assignments (GShard/Switch: the rest are dropped, which changes the model) */
  int n_data;
  char data[SPEC_MAX_DATA][SPEC_PATH_MAX]; /* resolved relative to the spec's folder */
  char init[SPEC_PATH_MAX], out[SPEC_PATH_MAX], save_dir[SPEC_PATH_MAX]; /* "" if absent */
  uint32_t set_mask;              /* SPEC_SET_* bits */
} RunSpec;

/* ---- config.c ---- */

/* "gpt2" / "llama". */
const char *arch_name(ModelArch arch);

/* Reads a Hugging Face config object. `file` names the file in messages; `keyprefix` is
 * the JSON path of obj inside that file ("" or NULL at top level, "model" or "model."
 * when embedded in a run spec). Unknown keys are ignored; known keys with a bad type or
 * value are errors, and so are settings loom would silently get wrong (rope_scaling,
 * biases, other activations). */
int config_from_json(json_t *obj, const char *file, const char *keyprefix, ModelConfig *out,
                     char *err, size_t errlen);

/* Reads a config.json file (or a folder holding one) into *out. */
int config_load(const char *path, ModelConfig *out, char *err, size_t errlen);

/* Number of trainable parameters (GPT-2 124M: 124439808). */
int64_t config_param_count(const ModelConfig *c);

/* Parses a JSON file with duplicate keys rejected. *out must be json_decref'd.
 * Messages look like `path:3:17: invalid JSON: ...`. */
int config_read_json_file(const char *path, json_t **out, char *err, size_t errlen);

/* A short description of a JSON value for messages: `"twelve"`, `768.5`, `null`,
 * `an object`, `an array`. */
void config_describe_value(const json_t *v, char *buf, size_t n);

/* Levenshtein distance, ASCII case-insensitive (for "did you mean"). */
size_t config_edit_distance(const char *a, const char *b);

/* Formats a message into err (if errlen > 0) and returns rc. */
int config_errorf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- spec.c ---- */

/* Defaults: batch 4, seq 0 (spec_load fills min(1024, max_pos)), steps 10, grad_accum 1,
 * warmup 0, lr 3e-4, min_lr 0, weight_decay 0.1, beta1 0.9, beta2 0.95, eps 1e-8,
 * grad_clip 1.0, precision "fp32", seed 1337, save_every 0, mesh 1 each, zero 0, bucket_mb 25, no
 * data/init/out/save_dir, set_mask 0. The model is zeroed (arch GPT2). */
void spec_defaults(RunSpec *s);

/* Reads either a bare HF config.json (top level has "model_type"; everything else at its
 * defaults) or a loom run spec: {"model": {...config...} or "path/to/config.json", and
 * optionally batch, seq, steps, grad_accum, lr, min_lr, warmup, weight_decay, beta1,
 * beta2, eps, grad_clip, precision, mesh {"dp","tp","cp","pp","ep"}, zero, bucket_mb, seed,
 * save_every, data (string or array), init, out, save_dir}. Relative paths are resolved
 * against the spec file's folder. Keys starting with "_" are comments and ignored; any
 * other unknown key is an error with a "did you mean" suggestion.
 * Checks each value on its own; cross-field checks are left to spec_validate so that
 * command-line overrides (spec_set) can come first. */
int spec_load(const char *path, RunSpec *out, char *err, size_t errlen);

/* Applies one setting given as text (a command-line override, e.g. key "lr", text
 * "1e-3"), with the same checks and messages as in a spec file; `origin` names where it
 * came from in messages (e.g. "--lr" or "command line"). The text is read as JSON when it
 * parses (numbers, true/false, arrays, {"dp":2}), else as a string; paths are taken
 * relative to the current folder. "model" takes a config.json path; the seq default is
 * then recomputed unless seq was set. */
int spec_set(RunSpec *s, const char *key, const char *text, const char *origin, char *err,
             size_t errlen);

/* Cross-field checks: batch, seq > 0; seq <= max_pos for GPT-2 (learned positions);
 * mesh sizes >= 1 and compatible with the model (tp divides heads and the MLP width, cp
 * divides seq, pp <= layers, ep = 1 for dense models); zero in 0..3; precision valid;
 * lr >= 0, min_lr <= lr; betas in [0, 1); eps > 0; grad_clip >= 0; at most 16 data files. */
int spec_validate(const RunSpec *s, char *err, size_t errlen);

/* ---- bounds.c ---- */

/* What loom can build and run, checked before a graph is built: at most 1024 layers and
 * 65536 experts, 2^48 parameter elements (one matrix too); 2 naming the key (`keyprefix`
 * as in config_from_json) otherwise.  spec.c calls it on every model it reads. */
int config_check_bounds(const ModelConfig *m, const char *file, const char *keyprefix, char *err, size_t errlen);

/* The run's counts: steps <= 2^31-1, grad_accum <= 65536, batch x seq <= 2^31-1 tokens and
 * x the widest activation <= 2^48 elements, at most 2^20 ranks.  spec_validate calls it. */
int spec_check_bounds(const RunSpec *s, char *err, size_t errlen);

/* The config.json key of the model's largest part (vocab_size, the experts, the layers or
 * the width) and its value: what to make smaller when the model does not fit. */
const char *config_largest_key(const ModelConfig *m, int64_t *value);

#endif
