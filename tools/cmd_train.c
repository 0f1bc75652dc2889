/* tools/cmd_train.c — `loom train`: compile a model spec's training step and run it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/comm/launch.h"
#include "runtime/comm/spawn.h"
#include "runtime/io/textdata.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom train [SPEC.json] --data SHARD... [options]\n"
  "\n"
  "Builds the training step of a model (forward, loss, backward by the autodiff pass,\n"
  "AdamW by the optimizer pass) and runs it on llm.c token shards, printing one line per\n"
  "step.  Every setting can also sit in the run spec; flags win.  Without SPEC, trains\n"
  "the built-in demo: a small byte-level GPT-2 on the Shakespeare text that ships with loom.\n"
  "\n"
  "data and length:\n"
  "  --data SHARD...       token shards, read in order; the loader wraps after the last\n"
  "  --steps N             optimizer steps (default 10, or the spec's)\n"
  "  --batch B, --seq T    micro-batch size and sequence length\n"
  "  --grad-accum G        micro-batches per optimizer step (gradients averaged)\n"
  "optimizer (torch.optim.AdamW semantics; decay only on tensors of 2+ dims):\n"
  "  --lr X --min-lr X --warmup N   linear warmup to lr, then cosine to min-lr\n"
  "  --weight-decay X --beta1 X --beta2 X --eps X\n"
  "  --grad-clip X         clip by the global L2 norm (0: off; default 1.0)\n"
  "  --precision fp32|bf16 bf16 compute on f32 master weights and optimizer state\n"
  "parallelism (cpu, ref: ranks are threads of this process; cuda: one process per GPU over NCCL):\n"
  "  --mesh dp=N,tp=M      the device mesh (axes dp tp cp pp ep; ep: a mixture of experts' experts)\n"
  "  --zero 0|1|2|3        ZeRO stage over dp: shard optimizer state, + gradients, + parameters\n"
  "  --sequence-parallel true|false  with tp: norms and residuals split along the sequence\n"
  "  --bucket-mb X         dp gradient all-reduces in buckets of X MB (default 25; 0: one each)\n"
  "  --overlap true|false  collectives as start/wait, run by a communication thread per rank while\n"
  "                        compute goes on (default true; false: each where it is, for comparison);\n"
  "                        with one micro-batch, ZeRO-0 all-reduces the gradient buckets in the backward\n"
  "  --vocab-multiple N    pad the vocabulary to a multiple of N (masked logits, the same results;\n"
  "                        e.g. 128: GPT-2's 50257 -> 50304, aligned GEMMs on a GPU)\n"
  "context parallelism (--mesh cp=N; cpu, ref and cuda backends):\n"
  "  --cp-balance zigzag|contiguous  how the sequence splits: zigzag (default) gives rank i the\n"
  "                        chunks i and 2cp-1-i of 2cp, so causal attention work is even\n"
  "  --cp-attn ring|allgather  ring (default): K/V blocks travel around the cp ring while each\n"
  "                        block's attention runs, merged by log-sum-exp; allgather: gather K/V\n"
  "pipeline parallelism (--mesh pp=N; every backend; --trace-out on cpu and ref):\n"
  "  --pp-schedule S       afab, 1f1b (default), interleaved, zb-h1 or dualpipev; micro-batches\n"
  "                        per step: --grad-accum\n"
  "  --pp-virtual V        model chunks per pp rank (interleaved: 2 or more; default 2)\n"
  "  --pp-split 0,6,12,18  the first layer of every chunk (default: balanced by FLOPs)\n"
  "  --trace-out F.json    the last step's measured timeline: one track per pp rank (pipelines), or a\n"
  "                        compute and a communication track per rank (other meshes, cpu backend)\n"
  "                        (chrome://tracing or ui.perfetto.dev)\n"
  "mixture of experts (Mixtral, Qwen3-MoE configs; --mesh ep=N splits the experts; every backend):\n"
  "  --mesh ep=N           experts split over N ranks (N divides the experts); the batch splits over\n"
  "                        dp x ep; tokens travel to their experts' ranks by all_to_allv and back\n"
  "  --log-experts         a line per layer every step: tokens per expert and max/mean (routing\n"
  "                        collapse shows as a large max/mean); the step line shows the worst layer's\n"
  "                        max/mean on one rank without it\n"
  "  --capacity-factor X   each expert takes at most ceil(X x tokens x top_k / experts) of a rank's\n"
  "                        assignments, the rest dropped (GShard); changes the model. Default 0:\n"
  "                        dropless, as Hugging Face trains\n"
  "activation recomputation (the recompute pass; results are bitwise those of none):\n"
  "  --recompute P         none (default), selective (norms, activations, elementwise ops;\n"
  "                        selective:norm,act,eltwise,rope,attn names the classes), full (only each\n"
  "                        layer's input kept), auto (what fits --memory-budget at the least work)\n"
  "  --memory-budget SIZE  with auto: the planned peak per rank, e.g. 40GiB or 512MB\n"
  "validation and metrics:\n"
  "  --val-data SHARD...   validation shards (loom data --val-frac makes them): the step line shows\n"
  "                        'val' (the mean loss by the forward pass alone, no update) every\n"
  "                        --val-every steps and after the last; every backend and mesh\n"
  "  --val-every N         steps between validations (default: a tenth of the run)\n"
  "  --val-tokens K        tokens per validation: the first K of the shards, in whole micro-batches,\n"
  "                        the same ones every time (default: 10 micro-batches)\n"
  "  --peak-tflops X       one device's peak TFLOP/s: the step line and the log get MFU, the model\n"
  "                        FLOPs of a rank's step (loom ir --flops) / step time / peak\n"
  "  --log FILE.jsonl      one JSON object per step (step, loss, val_loss, lr, grad_norm, tokens_per_s,\n"
  "                        step_ms, mfu, comm_wait_ms, tokens, elapsed_s, eta_s, max_rss_mb, time); a\n"
  "                        fresh run starts the file, a --resume'd one keeps the lines up to its\n"
  "                        checkpoint and appends;\n"
  "                        'loom plot FILE.jsonl -o curves.svg' draws it\n"
  "parameters and checkpoints:\n"
  "  --init W.safetensors  start from these weights (HF names); default: seeded init\n"
  "  --seed S              seed of the initialization (default 1337)\n"
  "  --out W.safetensors   write the final parameters, and losses, grad_norms and lrs [steps]\n"
  "  --out DIR/            (a folder: ends with / or exists) a folder transformers loads as it is:\n"
  "                        config.json, model.safetensors (the model's tensors only), generation_config.json,\n"
  "                        metrics.json (losses, grad_norms, lrs, val_losses)\n"
  "  --dtype f32|bf16      the weights of --out DIR/ (default f32)\n"
  "  --tokenizer T.json    copied into --out DIR/ as tokenizer.json\n"
  "  --save-dir D          write checkpoints to D (at the end, every --save-every K steps, and when\n"
  "                        stopped by Ctrl-C or SIGTERM); one run at a time writes D (D/loom.lock)\n"
  "  --save-every K\n"
  "  --resume D            continue from the newest complete checkpoint in D (or a step folder; a\n"
  "                        damaged newest one is skipped for the one before), saving on into D\n"
  "                        unless --save-dir says otherwise; the continued run reproduces the\n"
  "                        uninterrupted one bit for bit.  Settings that differ from the checkpoint's\n"
  "                        (--steps, --batch, --lr, --seed, ...) are refused, listed\n"
  "  --allow-changes       resume with the settings given although they differ (each change printed)\n"
  "execution:\n"
  "  --backend cpu|cuda|ref  cuda: CUDA kernels compiled by NVRTC, cuBLASLt (default on one rank\n"
  "                        when a GPU is present); cpu: fused kernels JIT-compiled with LLVM,\n"
  "                        GEMMs in OpenBLAS (the default otherwise, and for a mesh: every rank\n"
  "                        a thread); ref: the reference executor (one rank or a mesh).\n"
  "                        cuda with a mesh (dp, tp, sp, cp, ep, ZeRO; not yet pp): one process per\n"
  "                        GPU over NCCL, started by loom itself or by torchrun, srun or mpirun\n"
  "                        (their RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, SLURM_*, OMPI_*); rank 0\n"
  "                        prints and writes the outputs\n"
  "  --nccl-timeout S      a collective that does not complete within S seconds (default 600) is\n"
  "                        aborted on every rank, with a report of the last collectives\n"
  "  --threads N           cpu backend threads, shared by a mesh's ranks (default: LOOM_THREADS\n"
  "                        or every core)\n"
  "the pass pipeline (as loom ir; --dump-dir also keeps a failing pass's reproducer):\n"
  PASS_HOOKS_HELP
  "  -q, --quiet           no per-step lines\n"
  "  -h, --help            show this help\n"
  "\n"
  "Ctrl-C (SIGINT) or SIGTERM: the step in flight finishes, a checkpoint is written (with --save-dir),\n"
  "the summary printed, and loom exits 130 / 143; a second one ends it at once (docs/checkpoints.md).\n"
  "\n"
  "examples:\n"
  "  loom train                                    # the built-in demo\n"
  "  loom data notes.txt -o notes.bin && loom train models/gpt2-tiny.json --data notes.bin --steps 50\n"
  "  loom train llama.json --data notes.bin --backend cuda --mesh dp=2,tp=4   # 8 GPUs of this node\n";

/* The built-in demo: a spec and a shard written to a temporary folder. */
extern const char demo_text[], demo_text_end[];
static const char demo_spec[] =
  "{\"model\": {\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_positions\": 64, \"n_embd\": 64,\n"
  "             \"n_layer\": 2, \"n_head\": 4},\n"
  " \"batch\": 16, \"seq\": 64, \"steps\": 400, \"lr\": 3e-3, \"min_lr\": 3e-4, \"warmup\": 20,\n"
  " \"data\": \"demo.bin\"}\n";

static int write_demo(char *dir, char *spec_path, size_t n, char *err, size_t errlen) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, 512, "%s/loom-demo-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    snprintf(err, errlen, "cannot create a temporary folder for the demo in %s", tmp && *tmp ? tmp : "/tmp");
    return EXIT_RUN;
  }
  char shard[600];
  snprintf(shard, sizeof shard, "%s/demo.bin", dir);
  snprintf(spec_path, n, "%s/demo.json", dir);
  int64_t count;
  int rc = text_bytes_to_shard((const uint8_t *)demo_text, (size_t)(demo_text_end - demo_text), shard, &count, err, errlen);
  if (rc) return rc;
  FILE *f = fopen(spec_path, "w");
  if (!f || fputs(demo_spec, f) < 0 || fclose(f)) {
    snprintf(err, errlen, "cannot write %s", spec_path);
    return EXIT_RUN;
  }
  printf("loom train: no spec given, so training the built-in demo: a byte-level GPT-2 (2 layers, width 64)\n"
         "on %lld bytes of Shakespeare. Watch the loss fall from about ln(256) = 5.5.\n\n", (long long)count);
  return 0;
}

static void remove_demo(const char *dir) {
  char path[700];
  snprintf(path, sizeof path, "%s/demo.bin", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/demo.json", dir);
  unlink(path);
  rmdir(dir);
}

/* `loom train --backend cuda --mesh ...` with no launcher: this program again, once per rank,
   with torchrun's variables (runtime/comm/spawn.h); their exit status is ours. */
static int spawn_ranks(int argc, char **argv, int world, bool quiet) {
  char **args = calloc((size_t)argc + 2, sizeof *args);
  if (!args) return report(EXIT_RUN, "out of memory");
  args[0] = "loom";
  for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
  if (!quiet) printf("loom train: starting %d processes, one per GPU (rank 0 prints the log)\n", world);
  fflush(stdout);
  SpawnSpec sp = {.world = world, .argv = args, .log = stderr};
  char err[1024] = "";
  int rc = spawn_local(&sp, err, sizeof err);
  free(args);
  if (err[0]) return report(rc ? rc : EXIT_RUN, err);
  return rc;
}

int cmd_train(int argc, char **argv) {
  static TrainArgs ta;
  int parsed = train_args_parse("train", argc, argv, &ta, help);
  if (parsed >= 0) return parsed;
  LaunchEnv le;
  {
    char lerr[1024];
    int lrc = launch_env_read(&le, NULL, lerr, sizeof lerr);
    if (lrc) return report(lrc, lerr);
  }
  if (ta.nccl_timeout) setenv("LOOM_NCCL_TIMEOUT", ta.nccl_timeout, 1);
  if (le.world > 1 && !(ta.backend && !strcmp(ta.backend, "cuda"))) {   /* one process: refuse to be one of several */
    char lerr[1024];
    return report(launch_env_single(&le, "loom train", lerr, sizeof lerr), lerr);
  }
  if (le.world > 1 && le.rank != 0) ta.quiet = true;   /* one of several processes: rank 0 speaks */
  if (ta.output) return usage_error("train", "-o is for 'loom compile'; use --out W.safetensors for the final weights");
  if (ta.arch) return usage_error("train", "--arch is for 'loom compile --backend cuda'; loom train compiles for the GPU it runs on");
  if (!ta.n_val && (ta.val_every || ta.val_tokens))
    return usage_error("train", "--val-every and --val-tokens need --val-data SHARD... (make one with 'loom data ... --val-frac F')");
  const char *spec = ta.spec;
  if (spec && ends_with(spec, ".ir")) return usage_error("train", "train takes a model spec (.json), not an IR file");
  char err[IR_ERR_LEN] = "", demo_dir[512] = "", demo_spec_path[700];
  int rc = 0;
  if (!spec) {
    if ((rc = write_demo(demo_dir, demo_spec_path, sizeof demo_spec_path, err, sizeof err))) return report(rc, err);
    spec = demo_spec_path;
  }
  Input in;
  Backend backend;
  rc = train_prepare(&ta, spec, &in, &backend, err, sizeof err);
  if (!rc) rc = run_check_memory(in.m, &in.spec, backend, err, sizeof err);   /* before any buffer (resources.c) */
  if (!rc && in.spec.n_data == 0) {
    snprintf(err, sizeof err, "no training data: give --data SHARD... (make one with 'loom data TEXT -o SHARD.bin') "
             "or set \"data\" in %s", spec);
    rc = EXIT_USAGE;
  }
  /* A mesh on CUDA runs one process per GPU: this is one of them (a launcher's, or ours), or
     it starts them (every process compiles the same program; this one checked the spec). */
  int64_t world = rc ? 1 : mesh_world(&in.m->mesh);
  bool cuda_mesh = !rc && backend == BACKEND_CUDA && world > 1;
  if (!rc && !cuda_mesh) {   /* one process: refuse to be one of several a launcher started */
    char lerr[1024];
    if ((rc = launch_env_single(&le, "loom train", lerr, sizeof lerr))) snprintf(err, sizeof err, "%s", lerr);
  }
  if (cuda_mesh && le.world == 1 && (rc = cuda_mesh_precheck(in.m, err, sizeof err))) cuda_mesh = false;
  if (cuda_mesh && le.world == 1) {
    module_free(in.m);
    if (demo_dir[0]) remove_demo(demo_dir);
    return spawn_ranks(argc, argv, (int)world, ta.quiet);
  }
  if (cuda_mesh && le.world != world) {
    snprintf(err, sizeof err, "the mesh has %lld ranks but %s started %lld processes (%s=%lld): start one per rank",
             (long long)world, le.launcher, (long long)le.world, le.rank_var, (long long)le.rank);
    rc = EXIT_USAGE;
  }
  if (!rc) {
    RunSpec *s = &in.spec;
    const char *data[SPEC_MAX_DATA];
    for (int i = 0; i < s->n_data; i++) data[i] = s->data[i];
    char *settings = spec_settings_json(s);
    RunPlan plan = {{s->steps, s->grad_accum, s->warmup, s->lr, s->min_lr, data, s->n_data, s->model.vocab_size,
                     s->save_dir[0] ? s->save_dir : NULL, s->save_every, ta.resume, settings, (uint64_t)s->seed,
                     ta.quiet ? NULL : stdout, ta.val_data, ta.n_val, ta.val_every, ta.val_tokens, ta.log_path, 0,
                     ta.peak_tflops * 1e12, ta.log_experts, false, ta.allow_changes},
                    s->init[0] ? s->init : NULL, s->out[0] ? s->out : NULL, (uint64_t)s->seed, backend, ta.threads,
                    s->batch, s->seq, ta.trace_out, spec, ta.tokenizer, ta.out_bf16, NULL};
    if (ta.peak_tflops > 0) plan.opt.flops_per_step = driver_step_flops(in.m, s->grad_accum);
    if (cuda_mesh) plan_for_rank(&plan, le.rank);
    rc = driver_train(in.m, backend, &plan, err, sizeof err);
    free(settings);
  }
  module_free(in.m);
  if (demo_dir[0]) remove_demo(demo_dir);
  if (train_stopped(rc) && err[0]) {   /* stopped by a signal, cleanly: not an error */
    fprintf(stderr, "loom: %s\n", err);
    return rc;
  }
  return report(rc, err);
}
