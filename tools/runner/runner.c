/* tools/runner/runner.c — loom-train, the runner of compiled training executables.
 * `loom compile` appends the trained program (the IR after the training pipeline) and
 * the run's settings to a copy of this binary.  It links the IR (parser and reference
 * executor) and the runtime only: no frontend, no passes. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/comm/launch.h"
#include "runtime/comm/comm_nccl.h"
#include "runtime/comm/spawn.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/exec/exec_cpu.h"
#include "tools/tools.h"

/* The options of help() for "did you mean". */
#define RUNNER_FLAGS " --data --steps --lr --min-lr --warmup --seed --init --out --save-dir --save-every --resume " \
  "--threads --val-data --val-every --val-tokens --log --log-experts --allow-changes --info --quiet --help"

static void help(const json_t *s) {
  printf("usage: %s [options]\n\n"
         "Trains the model it was compiled for (%s, batch %lld x seq %lld x grad_accum %lld, %s).\n\n"
         "options (defaults compiled in):\n"
         "  --data SHARD...   token shards\n"
         "  --steps N         optimizer steps (%lld)\n"
         "  --lr X --min-lr X --warmup N   learning-rate schedule\n"
         "  --seed S          seed of the initialization (%lld)\n"
         "  --init W          start from these weights (HF names)\n"
         "  --out W           write the final parameters and 'losses'\n"
         "  --save-dir D --save-every K    checkpoints\n"
         "  --resume D        continue from a checkpoint (settings that differ from its are refused)\n"
         "  --allow-changes   resume although --steps, --lr, --seed, ... differ from the checkpoint's\n"
         "  --threads N       threads of the cpu backend (default: LOOM_THREADS or every core)\n"
         "  --val-data SHARD...  validation loss on the step line (as loom train)\n"
         "  --val-every N     steps between validations (default: a tenth of the run)\n"
         "  --val-tokens K    tokens per validation (default: 10 micro-batches)\n"
         "  --log FILE.jsonl  one JSON object per step (as loom train)\n"
         "  --log-experts     a mixture of experts' tokens per expert, per layer, every step\n"
         "  --info            print the compiled settings (JSON) and exit\n"
         "  -q, --quiet       no per-step lines\n"
         "  -h, --help        show this help\n"
         "\n%s sample --prompt TEXT [...]   generate text from its checkpoints (%s sample --help)\n",
         tools_program(), json_string_value(json_object_get(s, "spec")), (long long)json_integer_value(json_object_get(s, "batch")),
         (long long)json_integer_value(json_object_get(s, "seq")),
         (long long)json_integer_value(json_object_get(s, "grad_accum")),
         json_string_value(json_object_get(s, "precision")), (long long)json_integer_value(json_object_get(s, "steps")),
         (long long)json_integer_value(json_object_get(s, "seed")), tools_program(), tools_program());
}

/* Whether a cubin built for `built` runs on a device of architecture `dev` (both "sm_XY" or
   "sm_XYa"): the same one, or without the "a", the same major and a minor at least as high. */
static bool cubin_runs_on(const char *built, const char *dev) {
  if (!strcmp(built, dev)) return true;
  size_t nb = strlen(built), nd = strlen(dev);
  if (nb < 5 || nd < 5 || built[nb - 1] == 'a') return false;
  size_t db = nd - (dev[nd - 1] == 'a');
  if (nb != db || strncmp(built, dev, nb - 1)) return false;   /* "sm_8" vs "sm_8": the major */
  return dev[db - 1] >= built[nb - 1];
}

/* A cuda executable: the GPU must be here and of the architecture the cubin was built for. */
static int run_cuda(const json_t *s, const Payload *pl, RunPlan *plan, char *err, size_t errlen) {
  const char *arch = json_string_value(json_object_get(s, "arch"));
  char why[512];
  if (!arch) {
    snprintf(err, errlen, "the compiled settings name no GPU architecture; recompile the executable");
    return EXIT_RUN;
  }
  if (!cuda_available(why, sizeof why)) {
    char *hint = strstr(why, ": use --backend cpu");   /* loom's hint; this executable has no --backend */
    if (hint) *hint = 0;
    snprintf(err, errlen, "this executable trains on an NVIDIA GPU (a cubin for %s) and there is none usable here: %s; "
             "to train on the CPU, compile it with 'loom compile ... --backend cpu'", arch, why);
    return EXIT_USAGE;
  }
  CudaDeviceInfo info;
  int rc = cuda_device_query(0, &info, err, errlen);
  if (rc) return rc;
  if (!cubin_runs_on(arch, info.arch)) {
    snprintf(err, errlen, "this executable's kernels were compiled for %s, but GPU 0 is %s (%s); recompile with "
             "'loom compile ... --backend cuda --arch %s'", arch, info.name, info.arch, info.arch);
    return EXIT_USAGE;
  }
  RtProgram prog;
  if ((rc = rt_program_load(pl->parts[1], pl->sizes[1], &prog, err, errlen))) return rc;
  if (plan->opt.log) fprintf(plan->opt.log, "cuda: %s (%s), %d kernels from the executable's cubin\n", info.name,
                             info.arch, prog.n_kernels);
  rc = cuda_train_program(&prog, pl->parts[2], pl->sizes[2], plan, err, errlen);
  rt_program_free(&prog);
  return rc;
}

/* A CUDA mesh executable: with no launcher, this program again once per rank (as loom
   train does); as one rank of a launch, its GPU must run the cubin, and it trains its piece. */
static int run_cuda_mesh(int argc, char **argv, const json_t *s, const Payload *pl, const LaunchEnv *le, RunPlan *plan,
                         char *err, size_t errlen) {
  RtProgram prog;
  int rc = rt_program_load(pl->parts[1], pl->sizes[1], &prog, err, errlen);
  int64_t world = rc ? 1 : rt_program_world(&prog);
  if (!rc && le->world == 1) {
    rt_program_free(&prog);
    if (plan->opt.log) printf("starting %lld processes, one per GPU (rank 0 prints the log)\n", (long long)world);
    fflush(stdout);
    SpawnSpec sp = {.world = (int)world, .argv = argv, .log = stderr};
    err[0] = 0;
    rc = spawn_local(&sp, err, errlen);
    if (!err[0] && rc) snprintf(err, errlen, "a rank failed (above)");
    return rc;
  }
  (void)argc;
  if (!rc && le->world != world) {
    snprintf(err, errlen, "the mesh has %lld ranks but %s started %lld processes: start one per rank", (long long)world,
             le->launcher, (long long)le->world);
    rc = EXIT_USAGE;
  }
  const char *arch = json_string_value(json_object_get(s, "arch"));
  NcclBootstrap b;
  CudaDeviceInfo info;
  int count = 0;
  if (!rc) rc = nccl_bootstrap_from_env(&b, err, errlen);
  if (!rc && !cuda_available(err, errlen)) rc = EXIT_USAGE;
  if (!rc) rc = cuda_device_count(&count, err, errlen);
  int device = b.device >= 0 ? b.device : count > 0 ? b.rank % count : 0;
  if (!rc && (rc = cuda_device_query(device, &info, err, errlen)) == 0 && (!arch || !cubin_runs_on(arch, info.arch))) {
    snprintf(err, errlen, "rank %d: this executable's kernels were compiled for %s, but GPU %d is %s (%s); recompile with "
             "'loom compile ... --backend cuda --arch %s'", b.rank, arch ? arch : "?", device, info.name, info.arch,
             info.arch);
    rc = EXIT_USAGE;
  }
  plan_for_rank(plan, le->rank);
  if (!rc) rc = cuda_rank_train(&prog, pl->parts[2], pl->sizes[2], plan, err, errlen);
  rt_program_free(&prog);
  return rc;
}

/* EXE sample: text from the model's decode program (a KV cache of the compiled seq
   positions), with --weights W or the executable's own checkpoints (its --save-dir, newest
   step) or --out weights. */
static int run_sample(int argc, char **argv, const json_t *s, const Payload *pl, int dec, char *err, size_t errlen) {
  SampleArgs sa;
  sample_args_init(&sa);
  for (int i = 2; i < argc; i++) {
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      printf("usage: %s sample --prompt TEXT [options]\n\n"
             "Generates text with the model this executable trains (a KV cache of %lld positions, cpu backend),\n"
             "printing it as it goes; it stops after --max-new-tokens or at the end-of-sequence token.\n\n"
             "options (as loom sample's):\n"
             "  --weights W          safetensors, a folder with model.safetensors, or a --save-dir (default: the\n"
             "                       compiled --save-dir's newest step, else the compiled --out)\n"
             "  --prompt TEXT        the text to continue (required)\n"
             "  --tokenizer T.json   without one, a 256-token vocabulary is read as bytes\n"
             "  --max-new-tokens N (64, or what the cache leaves after the prompt)\n"
             "  --temperature T (1.0; 0: greedy)  --top-k K (0: all)  --top-p P (1.0)\n"
             "  --seed S (1337)  --ids (print token ids)  --threads N\n"
             "  -h, --help           show this help\n",
             tools_program(), (long long)json_integer_value(json_object_get(s, "sample_positions")));
      return EXIT_OK;
    }
    int r = sample_arg(argc, argv, &i, &sa, "sample");
    if (r < 0) return EXIT_USAGE;
    if (!r) return usage_error("sample", "unknown option '%s'", argv[i]);
  }
  if (!sa.prompt || !sa.prompt[0]) return usage_error("sample", "--prompt is required and must not be empty");
  const char *w = sa.weights;
  if (!w) w = json_string_value(json_object_get(s, "save_dir"));
  if (!w) w = json_string_value(json_object_get(s, "out"));
  if (!w) return usage_error("sample", "no weights: give --weights W (this executable was compiled without --save-dir or --out)");
  int64_t V = json_integer_value(json_object_get(s, "vocab")), tmax = json_integer_value(json_object_get(s, "sample_positions"));
  json_t *je = json_object_get(s, "eos");
  for (size_t k = 0; k < json_array_size(je) && sa.o.n_eos < 8; k++)
    sa.o.eos[sa.o.n_eos++] = json_integer_value(json_array_get(je, k));
  char wpath[4096], *llvm = strndup((const char *)pl->parts[dec + 1], pl->sizes[dec + 1]);
  Tokenizer *tok = NULL;
  TokIds ids = {0};
  CpuBackend b;
  memset(&b, 0, sizeof b);
  int rc = llvm ? sample_weights_path(w, wpath, sizeof wpath, err, errlen) : EXIT_RUN;
  if (!rc && sa.tokenizer) rc = tokenizer_load(sa.tokenizer, &tok, err, errlen);
  if (!rc) rc = sample_prompt_ids(tok, V, sa.prompt, &ids, err, errlen);
  if (!rc) rc = cpu_backend_load(&b, pl->parts[dec], pl->sizes[dec], llvm, sa.threads, err, errlen);
  if (!rc) {
    cpu_globals_init(&b.cp, 0);   /* the caches' zeros */
    rc = load_weights_rt(&b.prog, &b.cp, wpath, err, errlen);
  }
  if (!rc) rc = sample_generate(&b.cp, tok, V, &ids, sa.prompt, tmax, &sa.o, err, errlen);
  cpu_backend_free(&b);
  tokids_free(&ids);
  tokenizer_free(tok);
  free(llvm);
  return rc;
}

/* report(), but a run a signal stopped cleanly (130 / 143) says so without "error". */
static int finish(int rc, const char *err) {
  if (train_stopped(rc) && err[0]) {
    fprintf(stderr, "%s: %s\n", tools_program(), err);   /* this executable's name, as its other messages */
    return rc;
  }
  return report(rc, err);
}

static const char *const fixed[] = {"--batch", "--seq", "--grad-accum", "--precision", "--beta1", "--beta2",
                                    "--eps", "--weight-decay", "--grad-clip"};

int main(int argc, char **argv) {
  tools_set_program(argv[0]);   /* messages name this executable, not loom */
  setvbuf(stdout, NULL, _IOLBF, 0);   /* step lines as they happen into a pipe or a file (as loom's main) */
  cpu_run_setup(argv);
  char err[IR_ERR_LEN] = "", *settings_text = NULL, *ir_text = NULL, *run_settings = NULL;
  LaunchEnv le;
  int lrc = launch_env_read(&le, NULL, err, sizeof err);
  if (lrc) return report(lrc, err);
  Payload pl;
  int rc = payload_read_self(&pl, err, sizeof err);
  if (rc) return report(rc, err);
  if (pl.n_parts < 2) {
    free(pl.file);
    return report(EXIT_RUN, "the compiled model in this executable is incomplete; compile it again");
  }
  /* a CUDA mesh: program, cubin, an empty IR part, "cuda-mesh"; one process per GPU, as loom
     train starts them; the other executables are one process */
  bool cuda_mesh = pl.n_parts == 5 && pl.sizes[4] == 9 && !memcmp(pl.parts[4], "cuda-mesh", 9);
  if (!cuda_mesh && (lrc = launch_env_single(&le, "a loom executable", err, sizeof err))) {
    free(pl.file);
    return report(lrc, err);
  }
  settings_text = strndup((const char *)pl.parts[0], pl.sizes[0]);
  /* a cpu executable ends with its decode program: program, LLVM IR, "sample" */
  int dec = -1;
  if (pl.n_parts >= 4 && pl.sizes[pl.n_parts - 1] == 6 && !memcmp(pl.parts[pl.n_parts - 1], "sample", 6)) {
    dec = pl.n_parts - 3;
    pl.n_parts -= 3;
  }
  /* parts after the settings: ref: the IR; cpu: program, LLVM IR; cuda: program, cubin,
     "cuda"; a cpu mesh: program, LLVM IR, an empty IR part, "mesh" (a mesh's program holds
     what its executor reads, a pipeline's schedule too: no IR is parsed) */
  bool mesh = pl.n_parts == 5 && !cuda_mesh, cpu = pl.n_parts == 3 || mesh, cuda = pl.n_parts == 4 || cuda_mesh;
  ir_text = cuda ? strdup("") : strndup((const char *)pl.parts[cpu ? 2 : 1], pl.sizes[cpu ? 2 : 1]);
  json_t *s = json_loads(settings_text, 0, NULL);
  if (!s) {
    free(settings_text);
    free(ir_text);
    free(pl.file);
    return report(EXIT_RUN, "the compiled settings are damaged; recompile the executable");
  }
  if (argc > 1 && !strcmp(argv[1], "sample")) {
    rc = dec < 0 ? usage_error("sample", "this executable carries no decode program (a cpu executable does; recompile "
                                         "with 'loom compile ... --backend cpu')")
                 : report(run_sample(argc, argv, s, &pl, dec, err, sizeof err), err);
    goto done;
  }
  int64_t steps = json_integer_value(json_object_get(s, "steps")), warmup = json_integer_value(json_object_get(s, "warmup"));
  int64_t save_every = json_integer_value(json_object_get(s, "save_every"));
  uint64_t seed = (uint64_t)json_integer_value(json_object_get(s, "seed"));
  double lr = json_number_value(json_object_get(s, "lr")), min_lr = json_number_value(json_object_get(s, "min_lr"));
  const char *init = json_string_value(json_object_get(s, "init")), *out = json_string_value(json_object_get(s, "out"));
  const char *save_dir = json_string_value(json_object_get(s, "save_dir")), *resume = NULL;
  const char *data[64];
  int n_data = 0;
  json_t *jd = json_object_get(s, "data");
  for (size_t i = 0; i < json_array_size(jd) && n_data < 64; i++) data[n_data++] = json_string_value(json_array_get(jd, i));
  const char *val_data[64], *log_path = NULL;
  int n_val = 0;
  int64_t val_every = 0, val_tokens = 0;
  bool quiet = false, cli_data = false, log_experts = false, allow_changes = false;
  int threads = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    int r;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) { help(s); rc = EXIT_OK; goto done; }
    if (arg_flag(a, "--info")) { puts(settings_text); rc = EXIT_OK; goto done; }
    if (arg_flag(a, "-q") || arg_flag(a, "--quiet")) { quiet = true; continue; }
    if (arg_flag(a, "--log-experts")) { log_experts = true; continue; }
    if (arg_flag(a, "--allow-changes")) { allow_changes = true; continue; }
    if (!strcmp(a, "--data")) {
      if (!cli_data) n_data = 0;
      cli_data = true;
      while (i + 1 < argc && argv[i + 1][0] != '-' && n_data < 64) data[n_data++] = argv[++i];
      continue;
    }
    if (!strcmp(a, "--val-data")) {
      while (i + 1 < argc && argv[i + 1][0] != '-' && n_val < 64) val_data[n_val++] = argv[++i];
      if (!n_val) { rc = usage_error(NULL, "--val-data needs one or more token shards"); goto done; }
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--log", &v))) {
      if (r < 0 || !*v) { rc = usage_error(NULL, "--log needs a file name (FILE.jsonl)"); goto done; }
      log_path = v;
      continue;
    }
    char *end = NULL;
#define NUM(flag, var, conv)                                                                     \
  if ((r = arg_value(argc, argv, &i, flag, &v))) {                                               \
    if (r < 0) { rc = usage_error(NULL, flag " needs a value"); goto done; }                  \
    var = conv(v, &end);                                                                         \
    if (!*v || *end) { rc = usage_error(NULL, flag " needs a number, got '%s'", v); goto done; } \
    continue;                                                                                    \
  }
#define strtoi(v, e) strtoll(v, e, 10)
    NUM("--steps", steps, strtoi)
    NUM("--warmup", warmup, strtoi)
    NUM("--save-every", save_every, strtoi)
    NUM("--seed", seed, strtoi)
    NUM("--lr", lr, strtod)
    NUM("--min-lr", min_lr, strtod)
    NUM("--threads", threads, strtoi)
    NUM("--val-every", val_every, strtoi)
    NUM("--val-tokens", val_tokens, strtoi)
    if ((r = arg_value(argc, argv, &i, "--init", &v)) || (r = arg_value(argc, argv, &i, "--out", &v)) ||
        (r = arg_value(argc, argv, &i, "--save-dir", &v)) || (r = arg_value(argc, argv, &i, "--resume", &v))) {
      if (r < 0) { rc = usage_error(NULL, "%s needs a value", a); goto done; }
      if (!strncmp(a, "--init", 6)) init = v;
      else if (!strncmp(a, "--out", 5)) out = v;
      else if (!strncmp(a, "--save-dir", 10)) save_dir = v;
      else resume = v;
      continue;
    }
    for (size_t k = 0; k < sizeof fixed / sizeof fixed[0]; k++)
      if (!strncmp(a, fixed[k], strlen(fixed[k]))) {
        rc = usage_error(NULL, "%s was fixed when this executable was compiled (see --info); recompile with "
                         "'loom compile ... %s'", fixed[k], fixed[k]);
        goto done;
      }
    rc = unknown_option(NULL, a, RUNNER_FLAGS);
    goto done;
  }
  if (val_every < 0 || val_tokens < 0 || (!n_val && (val_every || val_tokens))) {
    rc = usage_error(NULL, "--val-every and --val-tokens take positive numbers and need --val-data SHARD...");
    goto done;
  }
  if (steps > 2147483647LL) {   /* as loom train: the run keeps each step's loss, norm and lr */
    rc = usage_error(NULL, "--steps %lld is more than can run: at most 2147483647", (long long)steps);
    goto done;
  }
  if (steps < 1 || warmup < 0 || lr < 0 || min_lr < 0 || save_every < 0) {
    rc = usage_error(NULL, "--steps must be >= 1; --warmup, --lr, --min-lr and --save-every >= 0");
    goto done;
  }
  if (!n_data) {
    rc = usage_error(NULL, "no training data was compiled in: give --data SHARD...");
    goto done;
  }
  /* the checkpoints record the settings this run uses (a resume compares them), flags included */
  json_object_set_new(s, "steps", json_integer(steps));
  json_object_set_new(s, "warmup", json_integer(warmup));
  json_object_set_new(s, "seed", json_integer((json_int_t)seed));
  json_object_set_new(s, "lr", json_real(lr));
  json_object_set_new(s, "min_lr", json_real(min_lr));
  run_settings = json_dumps(s, JSON_COMPACT | JSON_REAL_PRECISION(15));
  RunPlan plan = {{steps, json_integer_value(json_object_get(s, "grad_accum")), warmup, lr, min_lr, data, n_data,
                   json_integer_value(json_object_get(s, "vocab")), save_dir, save_every, resume, run_settings, seed,
                   quiet ? NULL : stdout, val_data, n_val, val_every, val_tokens, log_path, 0, 0, log_experts, false, allow_changes},
                  init, out, seed, cuda ? BACKEND_CUDA : cpu ? BACKEND_CPU : BACKEND_REF, threads,
                  json_integer_value(json_object_get(s, "batch")), json_integer_value(json_object_get(s, "seq")), NULL,
                  NULL, NULL, false, NULL, false};   /* no spec file: --out DIR/ is refused with the fix (loom export) */
  if (cuda_mesh) {
    rc = run_cuda_mesh(argc, argv, s, &pl, &le, &plan, err, sizeof err);
    rc = finish(rc, err);
    goto done;
  }
  if (cuda) {   /* the lowered program and its cubin: no IR, no compiler */
    rc = run_cuda(s, &pl, &plan, err, sizeof err);
    rc = finish(rc, err);
    goto done;
  }
  if (mesh) {   /* the lowered program for every rank (its mesh, placements and schedule): no IR */
    rc = run_training_cpu_mesh(pl.parts[1], pl.sizes[1], ir_text, &plan, err, sizeof err);
    rc = finish(rc, err);
    goto done;
  }
  if (cpu) {   /* the lowered program: no IR, no compiler */
    CpuBackend b;
    double t0 = seconds_now();
    if (plan.opt.log) fprintf(plan.opt.log, "JIT-compiling the kernels with LLVM ...\n");
    rc = cpu_backend_load(&b, pl.parts[1], pl.sizes[1], ir_text, threads, err, sizeof err);
    if (!rc && plan.opt.log) fprintf(plan.opt.log, "JIT-compiled %d kernels in %.2f s%s\n", b.prog.n_kernels, seconds_now() - t0,
                                     jit_from_cache(b.jit) ? " (object code from the cache)" : "");
    t0 = seconds_now();
    if (!rc) rc = cpu_backend_init_params(&b, seed, init, err, sizeof err);
    if (!rc && plan.opt.log) fprintf(plan.opt.log, "%s in %.2f s\n", init ? "loaded the weights" : "initialized the parameters",
                                     seconds_now() - t0);
    if (!rc) rc = cpu_backend_executor(&b, plan.batch, plan.seq, err, sizeof err);
    if (!rc) rc = train_and_write(&b.re.ex, &plan, err, sizeof err);
    cpu_backend_free(&b);
    rc = finish(rc, err);
    goto done;
  }
  Module *m = NULL;
  if ((rc = parse_module("<compiled program>", ir_text, &m, err, sizeof err)) || (rc = verify_module(m, err, sizeof err))) {
    module_free(m);
    rc = report(EXIT_RUN, err);
    goto done;
  }
  rc = finish(driver_train(m, BACKEND_REF, &plan, err, sizeof err), err);
  module_free(m);
done:
  free(run_settings);
  json_decref(s);
  free(settings_text);
  free(ir_text);
  free(pl.file);
  return rc;
}
