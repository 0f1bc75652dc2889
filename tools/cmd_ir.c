/* tools/cmd_ir.c — `loom ir`: build or parse a module, run a pipeline, print the IR. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "codegen/cuda/cost.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cpu/jit.h"
#include "ir/schedule.h"
#include "runtime/exec/exec.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom ir SPEC.json|FILE.ir [options] [-o OUT.ir]\n"
  "\n"
  "Builds the IR of a model spec (or reads an IR file), runs a pass pipeline and prints\n"
  "the result to standard output (or writes it to OUT.ir).  Dumps requested by the\n"
  "--print-ir-* options go to standard error, so standard output stays a valid IR file.\n"
  "\n"
  "options:\n"
  "  --passes=A,B,C         passes to run, in order (default: " DEFAULT_PIPELINE ");\n"
  "                         'train' stands for the training passes, 'lower' for " LOWER_PIPELINE "\n"
  "  --list-passes          list the available passes and exit\n"
  PASS_HOOKS_HELP
  "                         (--dump-dir after shard: one file per rank, NN-<pass>.rankR.ir, up to 64;\n"
  "                         a failing pass's reproducer goes to $TMPDIR without --dump-dir)\n"
  "  --memory               print the memory plan (parameters, gradients, optimizer state,\n"
  "                         activations, workspace) instead of the IR; runs memory-plan if needed\n"
  "  --emit=llvm            print the LLVM IR of the kernel funcs (after fuse) instead of the IR;\n"
  "  --emit=llvm-opt        the same after LLVM's O2 for this CPU (shows the vectorized loops)\n"
  "  --emit=cuda            print the CUDA C of every kernel (one translation unit that NVRTC or\n"
  "                         nvcc compiles as it is); needs fuse and memory-plan with --target=cuda\n"
  "  --flops                print each function's model FLOPs per call (matmuls and attention,\n"
  "                         the 6N + 12LTD count of MFU) instead of the IR\n"
  "  --collectives          print each function's collectives per rank (count, bytes, axis)\n"
  "  --time                print the predicted time of one training step (compute, memory-bound\n"
  "                         ops, collectives per axis and link, pipeline bubble, tokens/s, MFU)\n"
  "                         on the hardware of --hw instead of the IR; use after --passes=train,lower\n"
  "  --cost                 the CUDA program's step, counted (after --passes=train,lower --target=cuda):\n"
  "                         every launch and library call in order with its category, FLOPs, bytes\n"
  "                         and roofline bound on --hw, then the totals per category and the launch\n"
  "                         count (docs/gpu-cost.md)\n"
  "  --json                 with --cost: the same as one JSON object\n"
  "  --hw NAME|FILE.json    the hardware for --time and --cost: h100 (default), h200, a100, b200 (models/hardware/)\n"
  "                         or a description of your own (docs/time-model.md)\n"
  "  --rank-ir R=FILE.ir    verify-collectives: rank R runs FILE's program (e.g. a hand-edited\n"
  "                         per-rank dump) instead of the input's\n"
  "  --pp-schedule=NAME     with --mesh pp=N: afab, 1f1b, interleaved, zb-h1 or dualpipev (see loom train --help)\n"
  "  --pp-virtual=V         model chunks per pp rank (interleaved, dualpipev; default 2)\n"
  "  --pp-split=0,6,12,18   the first layer of every chunk (default: balanced by FLOPs)\n"
  "  --schedule             a pipelined module (--mesh pp=N): every pp rank's actions as a table,\n"
  "                         the predicted bubble (equal unit costs) and held activations\n"
  "  --trace-out F.json     the predicted timeline (Chrome/Perfetto trace, one track per pp rank;\n"
  "                         each action's time from its function's FLOPs at 1 TFLOP/s)\n"
  "                         instead of the IR\n"
  "  --rank=R               print the program of rank R (SPMD: every rank runs the same\n"
  "                         program on its own piece; the header names R's coordinates)\n"
  "  --target=cpu|cuda      storage sizes for memory-plan: cpu holds every element in 4 bytes,\n"
  "                         cuda uses each dtype's size (default cpu)\n"
  "  --batch=B, --seq=T     override the spec's batch size and sequence length\n"
  "  --precision=fp32|bf16, --grad-accum=G   override the spec's (used by the training passes)\n"
  "  --mesh=dp=2,...        the device mesh; the shard pass partitions the training program\n"
  "  --zero=0|1|2|3         ZeRO stage over dp\n"
  "  --sequence-parallel=true|false  with tp: norms and residuals split along the sequence\n"
  "  --cp-balance=zigzag|contiguous, --cp-attn=ring|allgather   with cp: how the sequence splits and\n"
  "                         how attention sees the other ranks' keys (see loom train --help)\n"
  "  --bucket-mb=X          dp gradient all-reduces in buckets of X MB (default 25; 0: one each)\n"
  "  --overlap=true|false   the overlap pass: collectives as start/wait, overlapped with compute (default true)\n"
  "  --vocab-multiple=N     the vocabulary padded to a multiple of N (masked; e.g. 128 aligns GPT-2's GEMMs)\n"
  "  --recompute=none|selective[:norm,act,eltwise,rope,attn]|full|auto   activation recomputation\n"
  "                         (the recompute pass; the default selective classes: norm,act,eltwise)\n"
  "  --memory-budget=40GiB  recompute auto: the planned peak per rank to fit (B, KB, MB, GB, KiB, MiB, GiB)\n"
  "  --capacity-factor=X    mixture of experts: tokens an expert takes, as a multiple of an even share (0: dropless)\n"
  "  -o OUT.ir              write the final IR to OUT.ir instead of standard output\n"
  "  -h, --help             show this help\n"
  "\n"
  "examples:\n"
  "  loom ir models/gpt2-124M.json --print-ir-after-all 2> dumps.txt\n"
  "  loom ir models/gpt2-124M.json --passes=train,lower --memory --target=cuda\n"
  "  loom ir models/llama-tiny.json -o llama.ir && loom ir llama.ir --passes=cse,dce\n";

/* `--schedule` / `--trace-out`: the action table with the predicted bubble (unit costs) to
   out (NULL: none), and the FLOP-weighted predicted timeline to trace_out. */
static int pipe_schedule_report(const Module *m, FILE *out, const char *trace_out, char *err, size_t errlen) {
  Schedule s;
  int rc = schedule_build(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, &s, err, errlen);
  if (rc) return rc;
  if (s.chunks > 256) {
    schedule_free(&s);
    snprintf(err, errlen, "more than 256 chunks");
    return EXIT_USAGE;
  }
  double unit[256][3], flop[256][3];
  for (int c = 0; c < s.chunks; c++) {
    const char *pre[3][2] = {{"fwd", "fwd"}, {"bwd", "bwd_b"}, {"bwd", "bwd_w"}};
    for (int k = 0; k < 3; k++) {
      unit[c][k] = 1;
      double mm = 0, at = 0;
      char name[64];
      snprintf(name, sizeof name, "%s.c%d", pre[k][s.split_bw], c);
      const Func *f = module_find_func(m, name);
      if (f && (k < 2 || s.split_bw)) flops_of(f, &mm, &at);
      flop[c][k] = (mm + at) * 1e-6;   /* microseconds at 1 TFLOP/s */
    }
    if (!s.split_bw) flop[c][2] = 0;
  }
  SimResult sim;
  rc = schedule_simulate(&s, (const double (*)[3])unit, &sim, err, errlen);
  if (!rc && out) schedule_print(out, &s, &sim);
  if (!rc) sim_result_free(&sim, s.p);
  if (!rc && trace_out) {
    rc = schedule_simulate(&s, (const double (*)[3])flop, &sim, err, errlen);
    if (!rc) {
      rc = schedule_write_trace(trace_out, &s, sim.start, sim.end, "predicted: loom ir, each action's FLOPs at 1 TFLOP/s",
                                err, errlen);
      if (!rc && out) fprintf(out, "# FLOP-weighted: makespan %.1f us at 1 TFLOP/s, bubble %.4f; wrote %s\n", sim.makespan,
                              sim.bubble, trace_out);
      sim_result_free(&sim, s.p);
    }
  }
  schedule_free(&s);
  return rc;
}

static int cmd_ir_body(int argc, char **argv, PassOptions *optp);

/* The --rank-ir modules outlive every return of the body: freed here, once. */
int cmd_ir(int argc, char **argv) {
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  int rc = cmd_ir_body(argc, argv, &opt);
  for (int k = 0; k < opt.n_rank_ir; k++) module_free((Module *)opt.rank_ir[k]);
  return rc;
}

static int cmd_ir_body(int argc, char **argv, PassOptions *optp) {
  const char *input = NULL, *out_path = NULL, *pipeline = DEFAULT_PIPELINE, *v;
  bool memory = false, collectives = false, flops = false, schedule = false, timing = false, cost = false, json = false;
  const char *trace_out = NULL, *hw_arg = NULL;
  const char *emit = NULL;
  long rank = -1;
  const char *overrides[16];
  char override_buf[16][128];
  int n_overrides = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (arg_flag(a, "-h") || arg_flag(a, "--help")) { fputs(help, stdout); return EXIT_OK; }
    if (arg_flag(a, "--list-passes")) { pass_list(stdout); return EXIT_OK; }
    if ((r = pass_hook_arg(argc, argv, &i, optp, "ir"))) {
      if (r < 0) return EXIT_USAGE;
      continue;
    }
    if (arg_flag(a, "--memory")) { memory = true; continue; }
    if (arg_flag(a, "--collectives")) { collectives = true; continue; }
    if (arg_flag(a, "--flops")) { flops = true; continue; }
    if (arg_flag(a, "--time")) { timing = true; continue; }
    if (arg_flag(a, "--cost")) { cost = true; continue; }
    if (arg_flag(a, "--json")) { json = true; continue; }
    if ((r = arg_value(argc, argv, &i, "--hw", &v))) {
      if (r < 0) return usage_error("ir", "--hw needs a hardware name (h100, h200, a100, b200) or a JSON file");
      hw_arg = v;
      continue;
    }
    if (arg_flag(a, "--schedule")) { schedule = true; continue; }
    if ((r = arg_value(argc, argv, &i, "--trace-out", &v))) {
      if (r < 0) return usage_error("ir", "--trace-out needs a file name (FILE.json)");
      trace_out = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--emit", &v))) {
      if (r < 0 || (strcmp(v, "llvm") && strcmp(v, "llvm-opt") && strcmp(v, "cuda")))
        return usage_error("ir", "--emit takes llvm, llvm-opt or cuda");
      emit = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--rank", &v))) {
      char *end;
      rank = r < 0 ? -1 : strtol(v, &end, 10);
      if (r < 0 || *end || rank < 0) return usage_error("ir", "--rank takes a rank number (0 .. world-1)");
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--target", &v))) {
      if (r < 0 || (strcmp(v, "cpu") && strcmp(v, "cuda"))) return usage_error("ir", "--target takes cpu or cuda");
      optp->target = strcmp(v, "cpu") ? TARGET_CUDA : TARGET_CPU;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--passes", &v))) {
      if (r < 0) return usage_error("ir", "--passes needs a list of pass names");
      pipeline = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--rank-ir", &v))) {
      /* R=FILE: rank R runs FILE's program (verify-collectives checks hand-edited per-rank dumps) */
      char *end;
      long rk = r < 0 ? -1 : strtol(v, &end, 10);
      if (r < 0 || rk < 0 || *end != '=' || !end[1]) return usage_error("ir", "--rank-ir takes R=FILE.ir (a rank and its program)");
      if (optp->n_rank_ir == 16) return usage_error("ir", "at most 16 --rank-ir");
      Module *rm = NULL;
      char perr[IR_ERR_LEN];
      if (parse_module_file(end + 1, &rm, perr, sizeof perr) || verify_module(rm, perr, sizeof perr)) {
        module_free(rm);
        return report(EXIT_USAGE, perr);
      }
      optp->rank_ir[optp->n_rank_ir] = rm;
      optp->rank_ir_rank[optp->n_rank_ir++] = (int)rk;
      continue;
    }
    static const char *const spec_flags[][2] = {{"--batch", "batch"},           {"--seq", "seq"},
                                                {"--precision", "precision"},   {"--grad-accum", "grad_accum"},
                                                {"--mesh", "mesh"},             {"--zero", "zero"},
                                                {"--sequence-parallel", "sequence_parallel"},
                                                {"--bucket-mb", "bucket_mb"},
                                                {"--vocab-multiple", "vocab_multiple"},
                                                {"--pp-schedule", "pp_schedule"},
                                                {"--pp-virtual", "pp_virtual"},
                                                {"--pp-split", "pp_split"},
                                                {"--overlap", "overlap"},
                                                {"--cp-balance", "cp_balance"},
                                                {"--cp-attn", "cp_attn"},
                                                {"--recompute", "recompute"},
                                                {"--memory-budget", "memory_budget"},
                                                {"--capacity-factor", "capacity_factor"}};
    bool matched = false;
    for (int k = 0; k < (int)(sizeof spec_flags / sizeof spec_flags[0]) && !matched; k++)
      if ((r = arg_value(argc, argv, &i, spec_flags[k][0], &v))) {
        if (r < 0) return usage_error("ir", "%s needs a value", spec_flags[k][0]);
        if (n_overrides == 16) return usage_error("ir", "too many overrides");
        char json[200];
        if (k == 4 && mesh_flag_json(v, json, sizeof json))
          return usage_error("ir", "--mesh takes axis=size pairs such as dp=2,tp=2, not '%s'", v);
        snprintf(override_buf[n_overrides], sizeof override_buf[0], "%s=%.100s", spec_flags[k][1], k == 4 ? json : v);
        overrides[n_overrides] = override_buf[n_overrides];
        n_overrides++;
        matched = true;
      }
    if (matched) continue;
    if ((r = arg_value(argc, argv, &i, "-o", &v))) {
      if (r < 0) return usage_error("ir", "-o needs a file name");
      out_path = v;
      continue;
    }
    if (a[0] == '-') return unknown_option("ir", a, help);
    if (input) return usage_error("ir", "more than one input ('%s' and '%s')", input, a);
    input = a;
  }
  if (!input) return usage_error("ir", "no input: give a model spec (.json) or an IR file (.ir)");
  if (json && !cost) return usage_error("ir", "--json goes with --cost");
  if (cost && optp->target != TARGET_CUDA)
    return usage_error("ir", "--cost counts the CUDA program: add --target=cuda (and --passes=train,lower)");

  char err[IR_ERR_LEN];
  int rc = pipeline_check(pipeline, err, sizeof err);
  if (rc) return usage_error("ir", "%s", err);
  Input in;
  rc = input_load(input, overrides, n_overrides, &in, err, sizeof err);
  if (rc) return report(rc, err);
  /* The training passes read the spec's settings. */
  TrainSettings ts = train_defaults;
  if (in.from_spec) {
    const RunSpec *sp = &in.spec;
    ts = spec_train_settings(sp);
  }
  optp->train = &ts;
  char repro[4096];
  repro_command(input, argc, argv, NULL, repro, sizeof repro);
  optp->repro_cmd = repro;
  rc = pipeline_run(in.m, pipeline, optp, err, sizeof err);
  optp->repro_cmd = NULL;   /* later pipelines (--memory's memory-plan) start from this one's result */
  if (rc) {
    module_free(in.m);
    return report(rc, err);
  }
  if (emit) {
    char *text = NULL, *opt_text = NULL;
    bool any = false;
    for (int i = 0; i < in.m->funcs.n; i++) any |= ((Func *)in.m->funcs.items[i])->is_kernel;
    if (!any) {
      module_free(in.m);
      return usage_error("ir", "--emit=%s prints the kernels of a fused module: add fuse to --passes (e.g. --passes=train,lower)", emit);
    }
    bool cuda = !strcmp(emit, "cuda");
    if (cuda && optp->target != TARGET_CUDA) {
      module_free(in.m);
      return usage_error("ir", "--emit=cuda needs the memory plan of the CUDA target: add --target=cuda");
    }
    rc = cuda ? cuda_emit(in.m, &text, err, sizeof err) : cpu_emit_llvm(in.m, &text, err, sizeof err);
    if (!rc && !strcmp(emit, "llvm-opt")) rc = jit_optimize_ir(text, &opt_text, err, sizeof err);
    FILE *dst = stdout;
    if (!rc && out_path && !(dst = fopen(out_path, "w"))) {
      snprintf(err, sizeof err, "cannot write %s: %s", out_path, strerror(errno));
      rc = EXIT_RUN;
    }
    if (!rc) fputs(opt_text ? opt_text : text, dst);
    if (dst && dst != stdout && fclose(dst) && !rc) {
      snprintf(err, sizeof err, "cannot write %s: %s", out_path, strerror(errno));
      rc = EXIT_RUN;
    }
    free(text);
    free(opt_text);
    module_free(in.m);
    return report(rc, err);
  }
  if (schedule || trace_out) {
    if (!in.m->pipe.kind) {
      module_free(in.m);
      return report(EXIT_USAGE, "--schedule and --trace-out need a pipelined module: --mesh pp=N with --passes=train");
    }
    rc = pipe_schedule_report(in.m, schedule ? stdout : NULL, trace_out, err, sizeof err);
    module_free(in.m);
    return report(rc, err);
  }
  if (cost) {
    Hardware hw;
    RtProgram prog;
    bool fused = false;
    for (int i = 0; i < in.m->funcs.n; i++) fused |= ((Func *)in.m->funcs.items[i])->is_kernel;
    if (!fused) {
      module_free(in.m);
      return usage_error("ir", "--cost counts the lowered CUDA program: add lower to --passes (e.g. --passes=train,lower)");
    }
    rc = hardware_load(hw_arg ? hw_arg : "h100", &hw, err, sizeof err);
    if (!rc) rc = cuda_lower(in.m, &prog, NULL, err, sizeof err);
    if (!rc) {
      CudaCost c;
      cuda_cost(&prog, &hw, in.from_spec ? in.spec.grad_accum : 1, &c);
      cuda_cost_report(stdout, &prog, &hw, &c, json);
      rt_program_free(&prog);
    }
    module_free(in.m);
    return report(rc, err);
  }
  if (timing) {
    Hardware hw;
    StepTime t;
    rc = hardware_load(hw_arg ? hw_arg : "h100", &hw, err, sizeof err);
    int64_t ga = in.from_spec ? in.spec.grad_accum : 1;
    if (!rc) rc = timing_predict(in.m, &hw, ga, &t, err, sizeof err);
    if (!rc) {
      /* the spec's batch is the whole micro-batch (dp ranks split it); a pipeline's micro-batch
         count is grad_accum too */
      double tokens = in.from_spec ? (double)in.spec.batch * (double)in.spec.seq * (double)ga : 0;
      timing_report(stdout, in.m, &hw, &t, tokens);
    }
    module_free(in.m);
    return report(rc, err);
  }
  if (flops) {
    flops_report(stdout, in.m);
    module_free(in.m);
    return EXIT_OK;
  }
  if (collectives) {
    collective_report(stdout, in.m);
    module_free(in.m);
    return EXIT_OK;
  }
  if (rank >= 0) {
    int64_t world = mesh_world(&in.m->mesh);
    if (rank >= world) {
      snprintf(err, sizeof err, "--rank %ld: the mesh has %lld ranks", rank, (long long)world);
      module_free(in.m);
      return report(EXIT_USAGE, err);
    }
    int64_t coord[AX_COUNT];
    mesh_rank_coords(&in.m->mesh, rank, coord);
    printf("# rank %ld of %lld: dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld. Every rank runs this program (SPMD) on its\n"
           "# own piece of each value: along a dim split over an axis, the piece at its coordinate.\n",
           rank, (long long)world, (long long)coord[AX_DP], (long long)coord[AX_TP], (long long)coord[AX_CP],
           (long long)coord[AX_PP], (long long)coord[AX_EP]);
  }
  if (memory) {   /* what the figures assume */
    if (in.from_spec)
      printf("for batch %lld x seq %lld per micro-batch (the spec's; --batch and --seq change them)\n",
             (long long)in.spec.batch, (long long)in.spec.seq);
    else
      printf("for the shapes written in %s\n", input);
  }
  if (memory && in.m->pipe.kind) {   /* per pp rank: its state and the stash its schedule holds at most */
    Schedule s;
    if ((rc = schedule_build(in.m->pipe.kind, (int)in.m->mesh.size[AX_PP], (int)in.m->pipe.virt, (int)in.m->pipe.micro, &s,
                             err, sizeof err))) {
      module_free(in.m);
      return report(rc, err);
    }
    int64_t peak[64], fb[256], wb[256];
    pipe_stash_peaks(in.m, &s, peak, fb, wb);
    printf("pipeline %s, pp=%d, %d micro-batches; per rank (each of its dp/tp ranks holds the same), 4 bytes an element:\n",
           pipe_kind_names[s.kind], s.p, s.m);
    printf("  %-6s %14s %14s %14s   %s\n", "rank", "params+grads", "adam m+v", "stash peak", "stash per micro-batch (F->B | B->W)");
    for (int q = 0; q < s.p; q++) {
      /* globals this rank's functions touch */
      int64_t pg = 0, mv = 0;
      for (int gi = 0; gi < in.m->globals.n; gi++) {
        const Global *gl = in.m->globals.items[gi];
        bool used = false;
        for (int fi = 0; fi < in.m->funcs.n && !used; fi++) {
          const Func *f = in.m->funcs.items[fi];
          if (pipe_func_rank(&s, f->name) != q) continue;
          for (int i = 0; i < f->ops.n && !used; i++) {
            const Op *op = f->ops.items[i];
            for (int k = 0; k < op->n_operands && !used; k++) used = op->operands[k]->kind == VAL_GLOBAL && op->operands[k]->global == gl;
          }
        }
        if (!used) continue;
        int64_t b = 4 * type_numel(&gl->value->type);
        if (!strncmp(gl->name, ADAM_M_PREFIX, strlen(ADAM_M_PREFIX)) || !strncmp(gl->name, ADAM_V_PREFIX, strlen(ADAM_V_PREFIX))) mv += b;
        else pg += b;
      }
      printf("  %-6d %14lld %14lld %14lld  ", q, (long long)pg, (long long)mv, (long long)peak[q]);
      for (int c = 0; c < s.chunks; c++)
        if (schedule_chunk_rank(s.kind, s.p, s.v, c) == q) printf(" c%d: %lld | %lld", c, (long long)fb[c], (long long)wb[c]);
      printf("\n");
    }
    printf("(the stash: what each forward keeps for its backward, explicit as @fwd.cK's results; afab holds every "
           "micro-batch's, 1f1b at most pp - rank)\n");
    schedule_free(&s);
    module_free(in.m);
    return EXIT_OK;
  }
  if (memory) {
    bool planned = true;
    for (int i = 0; i < in.m->funcs.n; i++) {
      Func *f = in.m->funcs.items[i];
      if (!f->is_kernel && f->arena_bytes < 0) planned = false;
    }
    if (!planned && (rc = pipeline_run(in.m, "memory-plan", optp, err, sizeof err))) {
      module_free(in.m);
      return report(rc, err);
    }
    memory_report(stdout, in.m, optp->target);
    module_free(in.m);
    return EXIT_OK;
  }
  FILE *out = stdout;
  if (out_path && !(out = fopen(out_path, "w"))) {
    snprintf(err, sizeof err, "cannot write %s: %s", out_path, strerror(errno));
    module_free(in.m);
    return report(EXIT_RUN, err);
  }
  print_module(out, in.m);
  if (out != stdout && fclose(out)) {
    snprintf(err, sizeof err, "cannot write %s: %s", out_path, strerror(errno));
    module_free(in.m);
    return report(EXIT_RUN, err);
  }
  module_free(in.m);
  return EXIT_OK;
}
