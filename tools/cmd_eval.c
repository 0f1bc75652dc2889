/* tools/cmd_eval.c — `loom eval`: forward pass and loss of a model on a token shard. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/tokens.h"
#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/exec_ref.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom eval SPEC.json --weights W.safetensors --tokens T.bin [options]\n"
  "\n"
  "Runs the model's forward pass on inputs tokens[0 : B*T] and targets tokens[1 : B*T+1]\n"
  "(both shaped [B,T]) of an llm.c token shard and prints 'loss <value>', the mean\n"
  "cross-entropy over all B*T positions.\n"
  "\n"
  "options:\n"
  "  --weights=FILE    parameters under their Hugging Face names (F32, BF16 or F16);\n"
  "                    GPT-2 names may carry the 'transformer.' prefix\n"
  "  --tokens=FILE     llm.c token shard (uint16 magic 20240520 or uint32 magic 20240801)\n"
  "  --batch=B         batch size (default: the spec's)\n"
  "  --seq=T           sequence length (default: the spec's)\n"
  "  --out=FILE        also write 'logits' [B,T,V] and 'loss' (f32) to a safetensors file\n"
  "  --mesh=dp=2,tp=2  run every rank of the device mesh (threads of this process; the cpu\n"
  "                    backend unless --backend ref) and write the gathered result\n"
  "  --backend=cpu|ref|cuda  cpu: fused kernels JIT-compiled with LLVM and OpenBLAS (default);\n"
  "                    ref: the reference executor, op by op; cuda: CUDA kernels compiled by\n"
  "                    NVRTC for GPU 0, cuBLASLt (needs a GPU)\n"
  "  --grads           also compute the gradient of the loss for every parameter and\n"
  "                    write it to --out as 'grad.<name>' (through the autodiff pass)\n"
  "the pass pipeline (as loom ir; --dump-dir also keeps a failing pass's reproducer):\n"
  PASS_HOOKS_HELP
  "  -h, --help        show this help\n"
  "\n"
  "example:\n"
  "  loom eval models/gpt2-tiny.json --weights tests/golden/gpt2-tiny/weights.safetensors \\\n"
  "            --tokens tests/golden/gpt2-tiny/tokens.bin\n";

/* Reads the first B*T+1 tokens of a shard into inputs/targets (int32), after the checks
   every backend needs. */
static int read_batch(const char *tokens, int64_t B, int64_t T, int64_t V, int32_t *in, int32_t *tg, char *err,
                      size_t errlen) {
  TokShard shard;
  int rc = tok_open(tokens, &shard, err, errlen);
  if (rc) return rc;
  if (shard.count < B * T + 1) {
    snprintf(err, errlen, "%s: holds %lld tokens, but batch %lld x seq %lld needs %lld (inputs plus one target); "
             "use a smaller --batch or --seq", tokens, (long long)shard.count, (long long)B, (long long)T,
             (long long)(B * T + 1));
    rc = EXIT_USAGE;
  }
  if (!rc) rc = tok_check_vocab(&shard, V, err, errlen);
  for (int64_t j = 0; !rc && j < B * T; j++) {
    in[j] = (int32_t)tok_get(&shard, j);
    tg[j] = (int32_t)tok_get(&shard, j + 1);
  }
  tok_close(&shard);
  return rc;
}

/* The cpu backend: lowered, JIT-compiled, run by the runtime; grads read from its region. */
static int eval_cpu(const Module *m, const char *weights, const char *tokens, const char *out, bool grads, int64_t B,
                    int64_t T, int64_t V, char *err, size_t errlen) {
  CpuBackend b;
  RtProgram prog;
  unsigned char *bytes = NULL;
  size_t nb = 0;
  char *llvm = NULL;
  int32_t *in = malloc(sizeof(int32_t) * (size_t)(B * T)), *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
  float *logits = malloc(sizeof(float) * (size_t)(B * T * V)), loss = 0, loss2 = 0;
  StTensor *st = NULL;
  memset(&b, 0, sizeof b);
  int rc = in && tg && logits ? 0 : EXIT_RUN;
  if (rc) snprintf(err, errlen, "out of memory");
  if (!rc) rc = cpu_lower(m, &prog, &llvm, err, errlen);
  if (!rc) {
    rc = rt_program_save(&prog, &bytes, &nb, err, errlen);
    rt_program_free(&prog);
  }
  if (!rc) rc = cpu_backend_load(&b, bytes, nb, llvm, 0, err, errlen);
  if (!rc) rc = load_weights_rt(&b.prog, &b.cp, weights, err, errlen);
  if (!rc) rc = read_batch(tokens, B, T, V, in, tg, err, errlen);
  double t0 = seconds_now();
  if (!rc) {
    void *args[2] = {in, tg}, *rets[2] = {logits, &loss};
    rc = cpu_program_call(&b.cp, cpu_find_func(&b.cp, "forward"), args, rets, err, errlen);
  }
  if (!rc) {
    printf("loss %.6f\n", loss);
    fprintf(stderr, "loom: eval of %lld tokens took %.3f s on the cpu backend\n", (long long)(B * T), seconds_now() - t0);
  }
  if (!rc && grads) {
    void *args[2] = {in, tg}, *rets[1] = {&loss2};
    rc = cpu_program_call(&b.cp, cpu_find_func(&b.cp, "grad_step"), args, rets, err, errlen);
  }
  RtTensor *views = NULL;
  int nv = 0;
  if (!rc && out) {
    int max = 2;
    for (int i = 0; i < b.prog.n_globals; i++) max += rt_views_of(b.prog.globals[i].rank, b.prog.globals[i].shape, b.prog.globals[i].experts);
    st = calloc((size_t)max, sizeof *st);
    views = calloc((size_t)max, sizeof *views);
    if (!st || !views) rc = EXIT_RUN, snprintf(err, errlen, "out of memory");
    for (int i = 0; !rc && grads && i < b.prog.n_globals; i++) {   /* in the checkpoint's names (one per expert) */
      const RtGlobal *g = &b.prog.globals[i];
      if (g->region == RT_REGION_GRADS && rt_views_add(views, &nv, g->name, g->rank, g->shape, cpu_global(&b.cp, i), g->experts))
        rc = EXIT_RUN, snprintf(err, errlen, "out of memory");
    }
    int n = 0;
    if (!rc) {
      st[n++] = (StTensor){"logits", ST_F32, 3, {B, T, V}, (uint64_t)(B * T * V) * 4, logits};
      st[n++] = (StTensor){"loss", ST_F32, 0, {0}, 4, &loss};
    }
    for (int k = 0; !rc && k < nv; k++) {
      st[n] = (StTensor){(char *)views[k].name, ST_F32, views[k].rank, {0}, (uint64_t)st_numel(views[k].rank, views[k].shape) * 4,
                         views[k].data};
      memcpy(st[n].shape, views[k].shape, sizeof views[k].shape);
      n++;
    }
    if (!rc) rc = st_write(out, st, n, NULL, NULL, 0, err, errlen);
  }
  rt_views_free(views, nv);
  free(views);
  free(st);
  cpu_backend_free(&b);
  free(bytes);
  free(llvm);
  free(in);
  free(tg);
  free(logits);
  return rc;
}

/* The cuda backend: lowered for CUDA, compiled by NVRTC for GPU 0 (cached), run by
   runtime/cuda_exec.  GPU checks of this path are owed (tests/gpu/). */
static int eval_cuda(const Module *m, const char *weights, const char *tokens, const char *out, bool grads, int64_t B,
                     int64_t T, int64_t V, char *err, size_t errlen) {
  char why[512];
  if (!cuda_available(why, sizeof why)) {
    snprintf(err, errlen, "--backend cuda: %s", why);
    return EXIT_USAGE;
  }
  CudaDeviceInfo info;
  CudaProgram cp;
  bool have_cp = false;
  RtProgram prog;
  memset(&prog, 0, sizeof prog);
  char *src = NULL;
  unsigned char *image = NULL;
  size_t n = 0;
  bool is_cubin = false;
  int32_t *in = malloc(sizeof(int32_t) * (size_t)(B * T)), *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
  float *logits = malloc(sizeof(float) * (size_t)(B * T * V)), loss = 0, loss2 = 0, **host = NULL;
  StTensor *st = NULL;
  int rc = in && tg && logits ? 0 : EXIT_RUN;
  if (rc) snprintf(err, errlen, "out of memory");
  if (!rc) rc = cuda_device_query(0, &info, err, errlen);
  if (!rc) rc = cuda_lower(m, &prog, &src, err, errlen);
  if (!rc) rc = nvrtc_compile_programs(src, info.arch, NULL, 0, &image, &n, &is_cubin, NULL, NULL, NULL, err, errlen);
  if (!rc) have_cp = !(rc = cuda_program_init(&cp, &prog, image, n, 0, err, errlen));
  if (!rc) rc = cuda_load_params(&cp, &prog, weights, err, errlen);
  if (!rc && !(host = calloc((size_t)prog.n_globals + 1, sizeof *host))) {   /* the gradients read back */
    snprintf(err, errlen, "out of memory");
    rc = EXIT_RUN;
  }
  if (!rc) rc = read_batch(tokens, B, T, V, in, tg, err, errlen);
  double t0 = seconds_now();
  if (!rc) {
    void *args[2] = {in, tg}, *rets[2] = {logits, &loss};
    rc = cuda_program_call(&cp, cuda_find_func(&cp, "forward"), args, rets, err, errlen);
  }
  if (!rc) {
    printf("loss %.6f\n", loss);
    fprintf(stderr, "loom: eval of %lld tokens took %.3f s on %s (%s)\n", (long long)(B * T), seconds_now() - t0,
            info.name, info.arch);
  }
  if (!rc && grads) {
    void *args[2] = {in, tg}, *rets[1] = {&loss2};
    rc = cuda_program_call(&cp, cuda_find_func(&cp, "grad_step"), args, rets, err, errlen);
  }
  RtTensor *views = NULL;
  int nv = 0;
  if (!rc && out) {
    int max = 2;
    for (int i = 0; i < prog.n_globals; i++)
      max += rt_views_of(prog.globals[i].rank, prog.globals[i].shape, prog.globals[i].experts);
    st = calloc((size_t)max, sizeof *st);
    views = calloc((size_t)max, sizeof *views);
    if (!st || !views) rc = EXIT_RUN, snprintf(err, errlen, "out of memory");
    for (int i = 0; grads && !rc && i < prog.n_globals; i++) {   /* in the checkpoint's names (one per expert) */
      const RtGlobal *g = &prog.globals[i];
      if (g->region != RT_REGION_GRADS) continue;
      if (!host[i] && !(host[i] = calloc((size_t)g->n + 1, sizeof(float)))) {
        snprintf(err, errlen, "out of memory");
        rc = EXIT_RUN;
        break;
      }
      rc = cuda_global_read(&cp, i, host[i], err, errlen);
      if (!rc && rt_views_add(views, &nv, g->name, g->rank, g->shape, host[i], g->experts))
        rc = EXIT_RUN, snprintf(err, errlen, "out of memory");
    }
    int k = 0;
    if (!rc) {
      st[k++] = (StTensor){"logits", ST_F32, 3, {B, T, V}, (uint64_t)(B * T * V) * 4, logits};
      st[k++] = (StTensor){"loss", ST_F32, 0, {0}, 4, &loss};
    }
    for (int v = 0; !rc && v < nv; v++, k++) {
      st[k] = (StTensor){(char *)views[v].name, ST_F32, views[v].rank, {0},
                         (uint64_t)st_numel(views[v].rank, views[v].shape) * 4, views[v].data};
      memcpy(st[k].shape, views[v].shape, sizeof views[v].shape);
    }
    if (!rc) rc = st_write(out, st, k, NULL, NULL, 0, err, errlen);
  }
  rt_views_free(views, nv);
  free(views);
  if (host)
    for (int i = 0; i < prog.n_globals; i++) free(host[i]);
  free(host);
  free(st);
  if (have_cp) cuda_program_free(&cp);
  rt_program_free(&prog);
  free(src);
  free(image);
  free(in);
  free(tg);
  free(logits);
  return rc;
}

/* Every rank of a mesh: the forward pass partitioned by the shard pass, ranks as threads
   on the reference executor; the results come back whole. */
/* The partitioned forward on the reference executor's ranks (threads). */
static int ref_mesh_forward(Module *m, const char *weights, const int32_t *in_ids, const int32_t *tg, float *logits,
                            float *loss, char *err, size_t errlen) {
  RefExec rx;
  Tensor *args[2] = {0}, *rets[2] = {0};
  int rc = ref_exec_open(&rx, m, 0, weights, false, err, errlen);
  Func *f = module_find_func(m, "forward");
  for (int k = 0; !rc && k < 2; k++) {
    Type t = whole_type(m, &((Value *)f->args.items[k])->type);
    if (!(args[k] = tensor_new(&t))) {
      snprintf(err, errlen, "out of memory");
      rc = EXIT_RUN;
      break;
    }
    for (int64_t j = 0; j < args[k]->n; j++) args[k]->i[j] = (k ? tg : in_ids)[j];
  }
  if (!rc) rc = ref_exec_run(&rx, f, args, rets, err, errlen);
  if (!rc) {
    memcpy(logits, rets[0]->f, sizeof(float) * (size_t)rets[0]->n);
    *loss = rets[1]->f[0];
  }
  for (int k = 0; k < 2; k++) {
    tensor_free(args[k]);
    tensor_free(rets[k]);
  }
  ref_exec_free(&rx);
  return rc;
}

/* The pass manager's hooks from the command line, and the reproducer's `loom ir` command. */
static PassOptions eval_hooks;
static char eval_repro[4096];

/* eval --mesh: every rank runs the partitioned forward, on the cpu backend (one lowered
   program, every rank a thread with its own CpuProgram) or the reference executor; the
   gathered logits and the loss. */
static int eval_mesh(Input *in, const char *weights, const char *tokens, const char *out, bool cpu, char *err,
                     size_t errlen) {
  Module *m = in->m;
  int64_t B = in->spec.batch, T = in->spec.seq, V = in->spec.model.vocab_size;
  TrainSettings ts = train_defaults;
  ts.bf16 = !strcmp(in->spec.precision, "bf16");
  ts.sp = in->spec.sequence_parallel;
  PassOptions popt = eval_hooks;   /* the command's --print-ir-after, --dump-dir, ... */
  popt.train = &ts;
  popt.repro_cmd = eval_repro;
  int32_t *in_ids = malloc(sizeof(int32_t) * (size_t)(B * T)), *tg = malloc(sizeof(int32_t) * (size_t)(B * T));
  float *logits = malloc(sizeof(float) * (size_t)(B * T * V)), loss = 0;
  int rc = in_ids && tg && logits ? 0 : EXIT_RUN;
  if (rc) snprintf(err, errlen, "out of memory");
  if (!rc) rc = pipeline_run(m, cpu ? EVAL_MESH_PIPELINE "," LOWER_PIPELINE : EVAL_MESH_PIPELINE, &popt, err, errlen);
  if (!rc) rc = read_batch(tokens, B, T, V, in_ids, tg, err, errlen);
  double t0 = seconds_now();
  if (!rc && cpu) {
    unsigned char *prog = NULL;
    size_t n = 0;
    char *llvm = NULL;
    rc = lower_cpu_bytes(m, &prog, &n, &llvm, err, errlen);
    if (!rc) rc = eval_cpu_mesh(m, prog, n, llvm, weights, in_ids, tg, logits, &loss, err, errlen);
    free(prog);
    free(llvm);
  } else if (!rc) {
    rc = ref_mesh_forward(m, weights, in_ids, tg, logits, &loss, err, errlen);
  }
  if (!rc) {
    printf("loss %.6f\n", loss);
    fprintf(stderr, "loom: eval of %lld tokens on %lld ranks took %.3f s on the %s\n", (long long)(B * T),
            (long long)mesh_world(&m->mesh), seconds_now() - t0,
            cpu ? "cpu backend (kernel JIT included)" : "reference executor");
    StTensor st[2] = {{"logits", ST_F32, 3, {B, T, V}, (uint64_t)(B * T * V) * 4, logits},
                      {"loss", ST_F32, 0, {0}, 4, &loss}};
    if (out) rc = st_write(out, st, 2, NULL, NULL, 0, err, errlen);
  }
  free(in_ids);
  free(tg);
  free(logits);
  return rc;
}

int cmd_eval(int argc, char **argv) {
  const char *spec = NULL, *weights = NULL, *tokens = NULL, *out = NULL, *backend = NULL, *v;
  bool grads = false;
  const char *batch = NULL, *seq = NULL, *mesh = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) { fputs(help, stdout); return EXIT_OK; }
    if (arg_flag(a, "--grads")) { grads = true; continue; }
    if ((r = pass_hook_arg(argc, argv, &i, &eval_hooks, "eval"))) {
      if (r < 0) return EXIT_USAGE;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--weights", &v))) { if (r < 0) goto missing; weights = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--tokens", &v))) { if (r < 0) goto missing; tokens = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--out", &v))) { if (r < 0) goto missing; out = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--backend", &v))) {
      if (r < 0) goto missing;
      if (strcmp(v, "cpu") && strcmp(v, "ref") && strcmp(v, "cuda"))
        return usage_error("eval", "--backend takes cpu, ref or cuda");
      backend = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--batch", &v))) { if (r < 0) goto missing; batch = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--seq", &v))) { if (r < 0) goto missing; seq = v; continue; }
    if ((r = arg_value(argc, argv, &i, "--mesh", &v))) { if (r < 0) goto missing; mesh = v; continue; }
    if (a[0] == '-') return usage_error("eval", "unknown option '%s'", a);
    if (spec) return usage_error("eval", "more than one spec ('%s' and '%s')", spec, a);
    spec = a;
    continue;
  missing:
    return usage_error("eval", "%s needs a value", a);
  }
  if (!spec) return usage_error("eval", "no model spec given");
  if (!weights) return usage_error("eval", "--weights is required");
  if (!tokens) return usage_error("eval", "--tokens is required");
  if (ends_with(spec, ".ir")) return usage_error("eval", "eval takes a model spec (.json), not an IR file");
  repro_command(spec, argc, argv, backend && !strcmp(backend, "cuda") ? "--target=cuda" : NULL, eval_repro,
                sizeof eval_repro);
  if (grads && !out) return usage_error("eval", "--grads writes its results to --out; give --out=FILE");

  char err[IR_ERR_LEN] = "", override_buf[3][256];
  const char *overrides[3];
  int n_overrides = 0;
  if (batch) snprintf(override_buf[n_overrides], sizeof override_buf[0], "batch=%.100s", batch);
  if (batch) overrides[n_overrides] = override_buf[n_overrides], n_overrides++;
  if (seq) snprintf(override_buf[n_overrides], sizeof override_buf[0], "seq=%.100s", seq);
  if (seq) overrides[n_overrides] = override_buf[n_overrides], n_overrides++;
  if (mesh) {
    char json[200];
    if (mesh_flag_json(mesh, json, sizeof json))
      return usage_error("eval", "--mesh takes axis=size pairs such as dp=2,tp=2, not '%s'", mesh);
    snprintf(override_buf[n_overrides], sizeof override_buf[0], "mesh=%s", json);
    overrides[n_overrides] = override_buf[n_overrides];
    n_overrides++;
  }
  Input in;
  int rc = input_load(spec, overrides, n_overrides, &in, err, sizeof err);
  if (rc) return report(rc, err);
  Module *m = in.m;
  int64_t B = in.spec.batch, T = in.spec.seq, V = in.spec.model.vocab_size;
  GlobalStore *g = NULL;
  TokShard shard;
  memset(&shard, 0, sizeof shard);
  Tensor *args[2] = {0}, *rets[2] = {0}, *grad_loss = NULL;
  Tensor **outs = NULL, **views = NULL;
  char **vnames = NULL;
  int n_views = 0;
  const char **names = NULL;

  /* With --grads the autodiff pass adds @grad_step; the precision of the spec applies. */
  TrainSettings ts = train_defaults;
  ts.bf16 = !strcmp(in.spec.precision, "bf16");
  PassOptions popt = eval_hooks;
  popt.train = &ts;
  popt.repro_cmd = eval_repro;
  if (mesh_world(&m->mesh) > 1 && backend && !strcmp(backend, "cuda")) {
    rc = usage_error("eval", "--backend cuda runs one rank (one GPU) for now; drop --mesh, or evaluate the mesh on the CPU");
    goto done;
  }
  if (mesh_world(&m->mesh) > 1) {
    rc = grads ? usage_error("eval", "--grads runs one rank; drop --mesh (or --grads)")
               : eval_mesh(&in, weights, tokens, out, !backend || strcmp(backend, "ref"), err, sizeof err);
    m = in.m;
    goto done;
  }
  bool cuda = backend && !strcmp(backend, "cuda"), cpu = !backend || !strcmp(backend, "cpu");
  char pipeline[512];
  snprintf(pipeline, sizeof pipeline, "%s%s", grads ? EVAL_GRADS_PIPELINE : DEFAULT_PIPELINE,
           cpu || cuda ? "," LOWER_PIPELINE : "");
  if (cuda) popt.target = TARGET_CUDA;
  rc = pipeline_run(m, pipeline, &popt, err, sizeof err);
  if (rc) goto done;
  if (cuda) {
    rc = eval_cuda(m, weights, tokens, out, grads, B, T, V, err, sizeof err);
    goto done;
  }
  if (cpu) {
    rc = eval_cpu(m, weights, tokens, out, grads, B, T, V, err, sizeof err);
    goto done;
  }
  if (!(g = globals_new(m))) { snprintf(err, sizeof err, "out of memory for the parameters"); rc = EXIT_RUN; goto done; }
  if ((rc = load_weights(m, g, weights, err, sizeof err))) goto done;
  if ((rc = tok_open(tokens, &shard, err, sizeof err))) goto done;
  if (shard.count < B * T + 1) {
    snprintf(err, sizeof err, "%s: holds %lld tokens, but batch %lld x seq %lld needs %lld (inputs plus one target); "
             "use a smaller --batch or --seq", tokens, (long long)shard.count, (long long)B, (long long)T,
             (long long)(B * T + 1));
    rc = EXIT_USAGE;
    goto done;
  }
  if ((rc = tok_check_vocab(&shard, V, err, sizeof err))) goto done;
  Func *f = module_find_func(m, "forward");
  for (int k = 0; k < 2; k++) {
    args[k] = tensor_new(&((Value *)f->args.items[k])->type);
    if (!args[k]) { snprintf(err, sizeof err, "out of memory"); rc = EXIT_RUN; goto done; }
    for (int64_t j = 0; j < B * T; j++) args[k]->i[j] = tok_get(&shard, j + k);
  }
  double t0 = seconds_now();
  if ((rc = interp_run(f, g, args, rets, err, sizeof err))) goto done;
  double dt = seconds_now() - t0;
  printf("loss %.6f\n", rets[1]->f[0]);
  fprintf(stderr, "loom: eval of %lld tokens took %.3f s on the reference executor\n", (long long)(B * T), dt);
  int n_out = 2, n_max = 2;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    n_max += rt_views_of(gl->value->type.rank, g->t[i]->type.dims, gl->hf_experts);
  }
  outs = calloc((size_t)n_max, sizeof *outs);
  names = calloc((size_t)n_max, sizeof *names);
  views = calloc((size_t)n_max, sizeof *views);
  vnames = calloc((size_t)n_max, sizeof *vnames);
  if (!outs || !names || !views || !vnames) { snprintf(err, sizeof err, "out of memory"); rc = EXIT_RUN; goto done; }
  outs[0] = rets[0];
  outs[1] = rets[1];
  names[0] = "logits";
  names[1] = "loss";
  if (grads) {
    /* @grad_step accumulates d(loss)/d(param) into $grad.<name>. */
    Func *gs = module_find_func(m, "grad_step");
    if ((rc = interp_run(gs, g, args, &grad_loss, err, sizeof err))) goto done;
    for (int i = 0; i < m->globals.n; i++) {
      const Global *gl = m->globals.items[i];
      if (gl->kind != GLOBAL_STATE || strncmp(gl->name, GRAD_PREFIX, strlen(GRAD_PREFIX))) continue;
      const Tensor *t = g->t[i];
      int k = gl->hf_experts ? rt_views_of(t->type.rank, t->type.dims, true) : 1;
      for (int e = 0; e < k; e++) {   /* written in the checkpoint shape (a stack of experts: one per expert) */
        Tensor *v = malloc(sizeof *v);
        char ename[600];
        if (!v || (gl->hf_experts && (rt_expert_name(gl->name, e, ename, sizeof ename) || !(vnames[n_views] = strdup(ename))))) {
          free(v);
          snprintf(err, sizeof err, "out of memory");
          rc = EXIT_RUN;
          goto done;
        }
        *v = *t;
        names[n_out] = gl->hf_experts ? vnames[n_views] : gl->name;
        if (gl->hf_rank) {
          v->type.rank = gl->hf_rank;
          memcpy(v->type.dims, gl->hf_dims, sizeof v->type.dims);
        } else if (gl->hf_experts) {
          v->n = t->n / k;
          v->f = t->f + e * v->n;
          v->type.rank = t->type.rank - 1;
          memmove(v->type.dims, t->type.dims + 1, sizeof(int64_t) * (size_t)v->type.rank);
        }
        outs[n_out++] = views[n_views++] = v;
      }
    }
  }
  if (out) rc = write_tensors(out, names, outs, n_out, err, sizeof err);
done:
  for (int k = 0; k < n_views; k++) free(views[k]), free(vnames[k]);   /* views share the store's data */
  free(views);
  free(vnames);
  free(outs);
  free(names);
  tensor_free(grad_loss);
  for (int k = 0; k < 2; k++) {
    tensor_free(args[k]);
    tensor_free(rets[k]);
  }
  tok_close(&shard);
  globals_free(g);
  module_free(m);
  return !err[0] && rc == EXIT_USAGE ? rc : report(rc, err);   /* usage errors printed themselves */
}
