/* tools/train_args.c — the options `loom train` and `loom compile` share (their parsing; what
   they select is built by driver/prepare.c). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"

/* Flags that set a run-spec key. */
static const struct { const char *flag, *key; } spec_flags[] = {
  {"--steps", "steps"}, {"--batch", "batch"}, {"--seq", "seq"}, {"--grad-accum", "grad_accum"},
  {"--lr", "lr"}, {"--min-lr", "min_lr"}, {"--warmup", "warmup"}, {"--weight-decay", "weight_decay"},
  {"--beta1", "beta1"}, {"--beta2", "beta2"}, {"--eps", "eps"}, {"--grad-clip", "grad_clip"},
  {"--precision", "precision"}, {"--init", "init"}, {"--out", "out"}, {"--save-dir", "save_dir"},
  {"--save-every", "save_every"}, {"--seed", "seed"}, {"--mesh", "mesh"}, {"--zero", "zero"},
  {"--sequence-parallel", "sequence_parallel"}, {"--bucket-mb", "bucket_mb"}, {"--vocab-multiple", "vocab_multiple"},
  {"--pp-schedule", "pp_schedule"}, {"--pp-virtual", "pp_virtual"}, {"--pp-split", "pp_split"},
  {"--overlap", "overlap"}, {"--cp-balance", "cp_balance"}, {"--cp-attn", "cp_attn"},
  {"--recompute", "recompute"}, {"--memory-budget", "memory_budget"}, {"--capacity-factor", "capacity_factor"},
};
#define N_SPEC_FLAGS (int)(sizeof spec_flags / sizeof spec_flags[0])

int mesh_flag_json(const char *text, char *out, size_t n) {
  /* "dp=2,tp=2" -> {"dp":2,"tp":2} */
  size_t k = (size_t)snprintf(out, n, "{");
  const char *p = text;
  while (*p) {
    const char *eq = strchr(p, '='), *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    if (!eq || eq > end || eq == p) return -1;
    char *num_end;
    long v = strtol(eq + 1, &num_end, 10);
    if (num_end != end || eq + 1 == end || v < 1) return -1;
    k += (size_t)snprintf(out + k, n > k ? n - k : 0, "%s\"%.*s\":%ld", k > 1 ? "," : "", (int)(eq - p), p, v);
    p = *end ? end + 1 : end;
  }
  if (k + 2 > n) return -1;
  snprintf(out + k, n - k, "}");
  return 0;
}

int train_args_parse(const char *cmd, int argc, char **argv, TrainArgs *t, const char *help) {
  memset(t, 0, sizeof *t);
  t->argc = argc;
  t->argv = argv;
  const char *v;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r = 0;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) { fputs(help, stdout); return EXIT_OK; }
    if (arg_flag(a, "-q") || arg_flag(a, "--quiet")) { t->quiet = true; continue; }
    if ((r = pass_hook_arg(argc, argv, &i, &t->hooks, cmd))) {
      if (r < 0) return EXIT_USAGE;
      continue;
    }
    if (arg_flag(a, "--log-experts")) { t->log_experts = true; continue; }
    if (arg_flag(a, "--allow-changes")) { t->allow_changes = true; continue; }
    if (!strcmp(a, "--data") || !strncmp(a, "--data=", 7)) {
      /* --data A B C (until the next option) or --data=A */
      json_t *arr = json_array();
      if (a[6] == '=') json_array_append_new(arr, json_string(a + 7));
      else
        while (i + 1 < argc && argv[i + 1][0] != '-') json_array_append_new(arr, json_string(argv[++i]));
      if (!json_array_size(arr)) { json_decref(arr); return usage_error(cmd, "--data needs one or more token shards"); }
      char *text = json_dumps(arr, JSON_COMPACT);
      snprintf(t->data_json, sizeof t->data_json, "%s", text);
      free(text);
      json_decref(arr);
      continue;
    }
    if (!strcmp(a, "--val-data") || !strncmp(a, "--val-data=", 11)) {
      /* --val-data A B C (until the next option) or --val-data=A */
      if (a[10] == '=') t->val_data[t->n_val++] = a + 11;
      else
        while (i + 1 < argc && argv[i + 1][0] != '-' && t->n_val < 64) t->val_data[t->n_val++] = argv[++i];
      if (!t->n_val) return usage_error(cmd, "--val-data needs one or more token shards");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--val-every", &v)) || (r = arg_value(argc, argv, &i, "--val-tokens", &v))) {
      bool every = !strncmp(a, "--val-every", 11);
      char *end;
      long long n = r < 0 ? -1 : strtoll(v, &end, 10);
      if (r < 0 || !*v || *end || n < 1)
        return usage_error(cmd, "%s takes a positive number of %s", every ? "--val-every" : "--val-tokens",
                           every ? "steps" : "tokens");
      *(every ? &t->val_every : &t->val_tokens) = n;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--peak-tflops", &v))) {
      char *end;
      double x = r < 0 ? -1 : strtod(v, &end);
      if (r < 0 || !*v || *end || !(x > 0 && x < 1e9))
        return usage_error(cmd, "--peak-tflops takes one device's peak in TFLOP/s for the run's precision (e.g. 989 "
                           "for an H100's bf16 dense)");
      t->peak_tflops = x;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--nccl-timeout", &v))) {
      char *end;
      double x = r < 0 ? -1 : strtod(v, &end);
      if (r < 0 || !*v || *end || !(x > 0 && x < 1e7))
        return usage_error(cmd, "--nccl-timeout takes a positive number of seconds (default 600)");
      t->nccl_timeout = v;   /* the ranks read it as LOOM_NCCL_TIMEOUT (comm_nccl.h) */
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--log", &v))) {
      if (r < 0 || !*v) return usage_error(cmd, "--log needs a file name (FILE.jsonl)");
      t->log_path = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--resume", &v))) {
      if (r < 0) return usage_error(cmd, "--resume needs a checkpoint folder");
      t->resume = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--backend", &v))) {
      if (r < 0 || (strcmp(v, "cpu") && strcmp(v, "ref") && strcmp(v, "cuda")))
        return usage_error(cmd, "--backend takes cpu, ref or cuda");
      t->backend = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--arch", &v))) {
      if (r < 0 || strncmp(v, "sm_", 3) || strlen(v) < 5 || strlen(v) > 8)
        return usage_error(cmd, "--arch takes a real GPU architecture such as sm_80, sm_90 or sm_90a");
      t->arch = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--threads", &v))) {
      char *end;
      long n = r < 0 ? -1 : strtol(v, &end, 10);
      if (r < 0 || *end || n < 1 || n > 1024) return usage_error(cmd, "--threads takes a number of threads (1..1024)");
      t->threads = (int)n;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--tokenizer", &v))) {
      if (r < 0) return usage_error(cmd, "--tokenizer needs a tokenizer.json (copied into --out DIR/)");
      t->tokenizer = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--dtype", &v))) {
      if (r < 0 || (strcmp(v, "f32") && strcmp(v, "bf16")))
        return usage_error(cmd, "--dtype takes f32 or bf16 (the weights of a Hugging Face --out DIR/)");
      t->out_bf16 = !strcmp(v, "bf16");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--trace-out", &v))) {
      if (r < 0) return usage_error(cmd, "--trace-out needs a file name (FILE.json)");
      t->trace_out = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "-o", &v))) {
      if (r < 0) return usage_error(cmd, "-o needs a file name");
      t->output = v;
      continue;
    }
    bool matched = false;
    for (int k = 0; k < N_SPEC_FLAGS && !matched; k++)
      if ((r = arg_value(argc, argv, &i, spec_flags[k].flag, &v))) {
        if (r < 0) return usage_error(cmd, "%s needs a value", spec_flags[k].flag);
        if (t->n_ov == 63) return usage_error(cmd, "too many options");
        if (!strcmp(spec_flags[k].key, "mesh")) {
          char json[512];
          if (mesh_flag_json(v, json, sizeof json))
            return usage_error(cmd, "--mesh takes axis=size pairs such as dp=2,tp=2 (axes: dp tp cp pp ep), not '%s'", v);
          v = json;
          snprintf(t->ovbuf[t->n_ov], sizeof t->ovbuf[0], "mesh=%s", json);
        } else {
          snprintf(t->ovbuf[t->n_ov], sizeof t->ovbuf[0], "%s=%s", spec_flags[k].key, v);
        }
        t->ov[t->n_ov] = t->ovbuf[t->n_ov];
        t->n_ov++;
        matched = true;
      }
    if (matched) continue;
    if (a[0] == '-') return usage_error(cmd, "unknown option '%s'", a);
    if (t->spec) return usage_error(cmd, "more than one spec ('%s' and '%s')", t->spec, a);
    t->spec = a;
  }
  return -1;
}
