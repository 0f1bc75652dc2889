/* tools/cmd_sample.c — `loom sample`: text from a trained model, one token at a time.
 *
 * The model's decode graph (frontend_build_decode: a KV cache per layer sized for the
 * prompt and --max-new-tokens, @decode(tokens, positions) -> logits) is compiled like any
 * program (DECODE_PIPELINE, codegen/cpu) and run by the cpu backend; driver/sample.c feeds
 * it the prompt and picks the new tokens (greedy, temperature, top-k, top-p).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen/cpu/cpu.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "frontend/build.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/tokenizer.h"
#include "runtime/exec/exec_cpu.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom sample SPEC.json --weights W --prompt TEXT [options]\n"
  "\n"
  "Generates text with the model of SPEC (a run spec or a Hugging Face config.json) and the\n"
  "weights W, printing it to standard output as it is generated.  Generation uses a KV cache\n"
  "(on the cpu backend, or on GPU 0 with --backend cuda).  It stops after --max-new-tokens or\n"
  "at the model's end-of-sequence token (eos_token_id of its config).\n"
  "\n"
  "options:\n"
  "  --weights W           a safetensors file (HF names), a folder holding model.safetensors\n"
  "                        (loom train --out DIR/, loom export), or a --save-dir (its newest step)\n"
  "  --prompt TEXT         the text to continue (required, not empty)\n"
  "  --tokenizer T.json    a Hugging Face tokenizer.json; without one, a 256-token vocabulary is\n"
  "                        read as bytes (the demo's models)\n"
  "  --max-new-tokens N    tokens to generate at most (default 64, or what a GPT-2's positions\n"
  "                        leave after the prompt)\n"
  "  --temperature T       0: greedy (argmax); else sample softmax(logits / T) (default 1.0)\n"
  "  --top-k K             sample among the K most likely tokens only (default 0: all)\n"
  "  --top-p P             sample among the most likely tokens whose probabilities add up to P\n"
  "                        (default 1.0: all)\n"
  "  --seed S              the sampler's seed (default 1337)\n"
  "  --ids                 print the generated token ids (one line, space-separated) instead of text\n"
  "  --threads N           CPU threads (default: all cores)\n"
  "  --backend cpu|cuda    cpu (default): kernels JIT-compiled with LLVM; cuda: CUDA kernels compiled\n"
  "                        by NVRTC for GPU 0\n"
  "  -h, --help            show this help\n"
  "\n"
  "example (the built-in demo's model is models/gpt2-tiny.json's: 64 positions, so prompt and\n"
  "new tokens together at most 64):\n"
  "  loom train --out shk.safetensors && loom sample models/gpt2-tiny.json --weights shk.safetensors \\\n"
  "             --prompt 'ROMEO:' --max-new-tokens 50 --temperature 0.8 --top-k 40\n";

/* The end-of-sequence ids of the model's config (eos_token_id: a number or a list). */
int sample_read_eos(const char *spec_path, int64_t *eos, int max) {
  json_t *root;
  char err[256];
  if (config_read_json_file(spec_path, &root, err, sizeof err)) return 0;
  json_t *cfg = json_object_get(root, "model"), *owned = NULL;
  if (json_is_string(cfg)) {   /* a path, relative to the spec's folder */
    char path[4096];
    const char *slash = strrchr(spec_path, '/'), *name = json_string_value(cfg);
    if (name[0] == '/' || !slash) snprintf(path, sizeof path, "%s", name);
    else snprintf(path, sizeof path, "%.*s/%s", (int)(slash - spec_path), spec_path, name);
    if (config_read_json_file(path, &owned, err, sizeof err)) owned = NULL;
    cfg = owned;
  } else if (!json_is_object(cfg)) {
    cfg = root;   /* a bare config.json */
  }
  json_t *e = cfg ? json_object_get(cfg, "eos_token_id") : NULL;
  int n = 0;
  if (json_is_integer(e)) eos[n++] = json_integer_value(e);
  for (size_t i = 0; json_is_array(e) && i < json_array_size(e) && n < max; i++)
    if (json_is_integer(json_array_get(e, i))) eos[n++] = json_integer_value(json_array_get(e, i));
  json_decref(owned);
  json_decref(root);
  return n;
}


/* The decode program on GPU 0: compiled by NVRTC, the parameters written from W, the caches
   zeroed (cuda_globals_init). */
typedef struct {
  RtProgram prog;   /* the CudaProgram reads it while it runs */
  CudaProgram cp;
  bool have;
  int f;
} CudaDecode;

static int cuda_decode(void *ctx, int32_t tok, int32_t pos, float *logits, char *err, size_t errlen) {
  CudaDecode *d = ctx;
  void *args[2] = {&tok, &pos}, *rets[1] = {logits};
  return cuda_program_call(&d->cp, d->f, args, rets, err, errlen);
}

static int cuda_open(Module *m, const char *wpath, CudaDecode *d, char *err, size_t errlen) {
  char why[512];
  if (!cuda_available(why, sizeof why)) {
    snprintf(err, errlen, "--backend cuda: %s", why);
    return EXIT_USAGE;
  }
  CudaDeviceInfo info;
  RtProgram *pp = &d->prog;
  char *src = NULL;
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false;
  int rc = cuda_device_query(0, &info, err, errlen);
  if (!rc) rc = cuda_lower(m, pp, &src, err, errlen);
  if (!rc) rc = nvrtc_compile_programs(src, info.arch, NULL, 0, &image, &n, &is_cubin, NULL, NULL, NULL, err, errlen);
  if (!rc) d->have = !(rc = cuda_program_init(&d->cp, pp, image, n, 0, err, errlen));
  if (!rc) rc = cuda_globals_init(&d->cp, 0, err, errlen);   /* the caches' zeros */
  if (!rc) rc = cuda_load_params(&d->cp, pp, wpath, err, errlen);
  if (!rc && (d->f = cuda_find_func(&d->cp, "decode")) < 0) {
    snprintf(err, errlen, "the program has no @decode to sample with");
    rc = EXIT_RUN;
  }
  free(src);
  free(image);
  return rc;
}

int cmd_sample(int argc, char **argv) {
  const char *spec_path = NULL;
  SampleArgs sa;
  sample_args_init(&sa);
  bool cuda = false;
  CudaDecode cd;
  memset(&cd, 0, sizeof cd);
  char err[IR_ERR_LEN];
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(help, stdout);
      return 0;
    }
    int r = sample_arg(argc, argv, &i, &sa, "sample");
    if (r < 0) return EXIT_USAGE;
    if (r) continue;
    const char *v;
    if ((r = arg_value(argc, argv, &i, "--backend", &v))) {
      if (r < 0 || (strcmp(v, "cpu") && strcmp(v, "cuda"))) return usage_error("sample", "--backend takes cpu or cuda");
      cuda = !strcmp(v, "cuda");
      continue;
    }
    if (a[0] == '-') return unknown_option("sample", a, help);
    if (spec_path) return usage_error("sample", "more than one spec ('%s' and '%s')", spec_path, a);
    spec_path = a;
  }
  const char *weights = sa.weights, *prompt = sa.prompt, *tok_path = sa.tokenizer;
  int64_t max_new = sa.o.max_new, threads = sa.threads;
  if (!spec_path) return usage_error("sample", "no model spec (loom sample SPEC.json --weights W --prompt TEXT)");
  if (!weights) return usage_error("sample", "--weights is required: the trained model's safetensors, folder or --save-dir");
  if (!prompt || !prompt[0]) return usage_error("sample", "--prompt is required and must not be empty");

  if (ends_with(spec_path, ".ir"))
    return usage_error("sample", "%s: give a run spec or config.json (an .ir file has no model to sample from)", spec_path);
  static RunSpec spec_store;   /* large (paths): not on the stack; only the decode graph is built from it */
  RunSpec *spec = &spec_store;
  int rc = spec_load(spec_path, spec, err, sizeof err);
  if (!rc) rc = spec_validate(spec, err, sizeof err);
  if (rc) return report(rc, err);
  int64_t V = spec->model.vocab_size;
  Tokenizer *tok = NULL;
  TokIds pids = {0};
  char wpath[4096];
  Module *m = NULL;
  RtProgram prog;
  memset(&prog, 0, sizeof prog);
  CpuBackend b;
  memset(&b, 0, sizeof b);
  unsigned char *bytes = NULL;
  size_t nb = 0;
  char *llvm = NULL;

  rc = sample_weights_path(weights, wpath, sizeof wpath, err, sizeof err);
  if (!rc && tok_path) rc = tokenizer_load(tok_path, &tok, err, sizeof err);
  if (!rc) rc = sample_prompt_ids(tok, V, prompt, &pids, err, sizeof err);
  /* the default 64 asks more than a small GPT-2 holds: it takes what the positions leave */
  if (!rc && sa.o.max_new_default && spec->model.arch == ARCH_GPT2 && pids.n < spec->model.max_pos &&
      pids.n + max_new > spec->model.max_pos)
    max_new = sa.o.max_new = spec->model.max_pos - pids.n;
  int64_t tmax = pids.n + max_new;
  if (!rc && spec->model.arch == ARCH_GPT2 && tmax > spec->model.max_pos) {
    snprintf(err, sizeof err, "the prompt (%lld tokens) and --max-new-tokens %lld need %lld positions, and the model "
             "learned %lld (n_positions); shorten the prompt or ask for fewer tokens", (long long)pids.n,
             (long long)max_new, (long long)tmax, (long long)spec->model.max_pos);
    rc = EXIT_USAGE;
  }
  /* the decode program: one token a call, batch 1, fp32, a cache of the positions asked for */
  if (!rc) {
    spec->batch = 1, spec->seq = 1;
    for (int k = 0; k < MESH_AXES; k++) spec->mesh[k] = 1;
    snprintf(spec->precision, sizeof spec->precision, "fp32");
    rc = frontend_build_decode(spec, "sample", tmax, &m, err, sizeof err);
  }
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  opt.target = cuda ? TARGET_CUDA : TARGET_CPU;   /* the memory plan's storage sizes */
  if (!rc) rc = pipeline_run(m, DECODE_PIPELINE, &opt, err, sizeof err);
  if (!rc && cuda) {
    rc = cuda_open(m, wpath, &cd, err, sizeof err);
  } else if (!rc) {
    rc = cpu_lower(m, &prog, &llvm, err, sizeof err);
    if (!rc) rc = rt_program_save(&prog, &bytes, &nb, err, sizeof err);
    if (!rc) rc = cpu_backend_load(&b, bytes, nb, llvm, (int)threads, err, sizeof err);
    if (!rc) {
      cpu_globals_init(&b.cp, 0);   /* the caches' zeros */
      rc = load_weights_rt(&b.prog, &b.cp, wpath, err, sizeof err);
    }
  }
  sa.o.n_eos = sample_read_eos(spec->path, sa.o.eos, 8);
  if (!rc && cuda) rc = sample_generate_with(cuda_decode, &cd, "cuda backend (GPU 0)", tok, V, &pids, prompt, tmax, &sa.o,
                                            err, sizeof err);
  else if (!rc) rc = sample_generate(&b.cp, tok, V, &pids, prompt, tmax, &sa.o, err, sizeof err);
  if (cd.have) cuda_program_free(&cd.cp);
  rt_program_free(&cd.prog);
  cpu_backend_free(&b);
  rt_program_free(&prog);
  free(bytes);
  free(llvm);
  module_free(m);
  tokids_free(&pids);
  tokenizer_free(tok);
  return report(rc, err);
}
