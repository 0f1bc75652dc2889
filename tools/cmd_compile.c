/* tools/cmd_compile.c — `loom compile`: a standalone training executable. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cpu/cpu.h"
#include "codegen/cuda/cuda.h"
#include "frontend/build.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/nvrtc.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom compile SPEC.json -o EXE [training options]\n"
  "\n"
  "Compiles the model's training step and writes EXE, an executable that trains it without\n"
  "loom or the spec present.  It takes the same options as 'loom train'.  Shapes (batch,\n"
  "seq, grad-accum), precision and the optimizer's constants are compiled in; the data,\n"
  "steps, learning-rate schedule, seed, --init, --out and checkpoint options are defaults\n"
  "that EXE's own flags can change (EXE --help lists them, EXE --info shows what was compiled).\n"
  "With the cpu backend (the default) EXE carries the lowered program and its kernels,\n"
  "JIT-compiled at start (with --mesh, every rank a thread); with --backend ref it carries the\n"
  "IR; with --backend cuda it carries the lowered program and a cubin that NVRTC compiled now,\n"
  "so it starts on the GPU without compiling anything (needs a GPU of that architecture and a\n"
  "driver; no NVRTC); with --mesh it starts one process per GPU, as loom train does, or runs as\n"
  "one rank of a torchrun, srun or mpirun launch.  A cpu EXE also carries the model's decode\n"
  "program (a KV cache of seq positions): 'EXE sample --prompt TEXT' generates text from its\n"
  "checkpoints (EXE sample --help).\n"
  "\n"
  "options besides loom train's:\n"
  "  --arch sm_XY[a]   with --backend cuda: the GPU to compile for (default: the one here), e.g.\n"
  "                    sm_80 (A100), sm_90a (H100, H200); compiles without a GPU\n"
  "\n"
  "examples:\n"
  "  loom compile models/gpt2-tiny.json --data shard.bin --steps 100 -o train-tiny && ./train-tiny\n"
  "  loom compile models/gpt2-124M.json --backend cuda --arch sm_90a --precision bf16 -o train-h100\n";

/* The decode program of the spec's model (loom sample's: batch 1, fp32, a KV cache of the
   spec's seq positions), lowered for the cpu backend. */
static int decode_program(const RunSpec *spec, unsigned char **prog, size_t *n, char **llvm, char *err, size_t errlen) {
  static RunSpec s;   /* large (paths): not on the stack */
  s = *spec;
  int64_t tmax = s.seq;
  s.batch = 1, s.seq = 1, s.grad_accum = 1;
  for (int k = 0; k < MESH_AXES; k++) s.mesh[k] = 1;
  snprintf(s.precision, sizeof s.precision, "fp32");
  Module *m = NULL;
  RtProgram p;
  PassOptions opt;
  memset(&opt, 0, sizeof opt);
  int rc = frontend_build_decode(&s, "decode", tmax, &m, err, errlen);
  if (!rc) rc = pipeline_run(m, DECODE_PIPELINE, &opt, err, errlen);
  if (!rc) rc = cpu_lower(m, &p, llvm, err, errlen);
  if (!rc) {
    rc = rt_program_save(&p, prog, n, err, errlen);
    rt_program_free(&p);
  }
  module_free(m);
  return rc;
}

/* Absolute path, so the executable runs from any folder. */
static json_t *abs_path(const char *p) {
  if (!p || !*p) return json_null();
  char buf[PATH_MAX];
  return json_string(realpath(p, buf) ? buf : p);
}

int cmd_compile(int argc, char **argv) {
  static TrainArgs ta;
  int parsed = train_args_parse("compile", argc, argv, &ta, help);
  if (parsed >= 0) return parsed;
  if (!ta.spec) return usage_error("compile", "no model spec given");
  if (!ta.output) return usage_error("compile", "no output: give -o EXE");
  if (ta.resume) return usage_error("compile", "--resume is an option of the executable, not of compile");
  if (ta.n_val || ta.val_every || ta.val_tokens || ta.log_path)
    return usage_error("compile", "--val-data, --val-every, --val-tokens and --log are given to the executable when "
                       "it runs (./EXE --val-data SHARD... --log FILE.jsonl), not compiled in");
  char err[IR_ERR_LEN] = "", runner[PATH_MAX];
  /* The runner is built next to loom. */
  ssize_t len = readlink("/proc/self/exe", runner, sizeof runner - 16);
  if (len <= 0) return report(EXIT_RUN, "cannot find loom's own path (/proc/self/exe)");
  runner[len] = 0;
  char *slash = strrchr(runner, '/');
  strcpy(slash ? slash + 1 : runner, "loom-train");
  if (access(runner, R_OK)) {
    snprintf(err, sizeof err, "the training runner %.1500s is missing; it is built with loom (cmake --build ... --target loom-train)",
             runner);
    return report(EXIT_RUN, err);
  }
  if (!ta.backend) ta.backend = "cpu";   /* the cpu program unless cuda (or ref) is asked for */
  bool cuda = !strcmp(ta.backend, "cuda");
  if (ta.arch && !cuda) return usage_error("compile", "--arch goes with --backend cuda");
  char arch[32] = "";
  if (cuda) {   /* the GPU to compile for: --arch, else the one here */
    char why[512];
    CudaDeviceInfo info;
    if (ta.arch) snprintf(arch, sizeof arch, "%s", ta.arch);
    else if (cuda_available(why, sizeof why) && !cuda_device_query(0, &info, err, sizeof err))
      snprintf(arch, sizeof arch, "%s", info.arch);
    else
      return usage_error("compile", "--backend cuda without a usable GPU here (%s): give the GPU to compile for, "
                         "e.g. --arch sm_80 (A100) or --arch sm_90a (H100, H200)", why);
    int major, minor;
    if (!nvrtc_available(&major, &minor, why, sizeof why))
      return report(EXIT_RUN, why);
  }
  Input in;
  Backend backend;
  int rc = train_prepare(&ta, ta.spec, &in, &backend, err, sizeof err);
  if (!rc && backend == BACKEND_CUDA && in.m->pipe.kind)
    rc = cuda_mesh_precheck(in.m, err, sizeof err);   /* what a CUDA mesh refuses, said now */
  if (!rc) {
    RunSpec *s = &in.spec;
    char *base = spec_settings_json(s);
    json_t *o = json_loads(base, 0, NULL);
    free(base);
    json_t *data = json_array();
    for (int i = 0; i < s->n_data; i++) json_array_append_new(data, abs_path(s->data[i]));
    json_object_set_new(o, "data", data);
    json_object_set_new(o, "vocab", json_integer(s->model.vocab_size));
    json_object_set_new(o, "model", json_string(arch_name(s->model.arch)));
    json_object_set_new(o, "parameters", json_integer(config_param_count(&s->model)));
    json_object_set_new(o, "save_every", json_integer(s->save_every));
    json_object_set_new(o, "init", abs_path(s->init));
    json_object_set_new(o, "out", s->out[0] ? json_string(s->out) : json_null());
    json_object_set_new(o, "save_dir", s->save_dir[0] ? json_string(s->save_dir) : json_null());
    json_object_set_new(o, "backend", json_string(backend == BACKEND_CPU ? "cpu" : cuda ? "cuda" : "ref"));
    if (cuda) json_object_set_new(o, "arch", json_string(arch));
    /* sampling (cpu executables): the decode program's cache rows and the end-of-sequence ids */
    int64_t eos[8];
    int n_eos = sample_read_eos(ta.spec, eos, 8);
    json_t *je = json_array();
    for (int k = 0; k < n_eos; k++) json_array_append_new(je, json_integer(eos[k]));
    json_object_set_new(o, "eos", je);
    json_object_set_new(o, "sample_positions", json_integer(s->seq));
    char *settings = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(o);
    /* The program: the lowered program and its kernels' LLVM IR (cpu), the lowered program
       and the cubin NVRTC made of its CUDA C (cuda), or the IR (ref). */
    unsigned char *prog = NULL, *image = NULL;
    size_t prog_n = 0, image_n = 0;
    char *text = NULL;
    if (cuda) {
      RtProgram p;
      bool is_cubin = false, hit = false;
      char *log = NULL;
      int programs = 1;
      double t0 = seconds_now();
      rc = cuda_lower(in.m, &p, &text, err, sizeof err);
      if (!rc) {
        rc = rt_program_save(&p, &prog, &prog_n, err, sizeof err);
        if (!rc)
          rc = nvrtc_compile_programs(text, arch, NULL, 0, &image, &image_n, &is_cubin, &log, &hit, &programs, err,
                                      sizeof err);
        if (!rc && !ta.quiet)
          printf("cuda: %d kernels compiled by NVRTC for %s in %.2f s (%d program%s)%s: a %zu-byte %s\n", p.n_kernels,
                 arch, seconds_now() - t0, programs, programs == 1 ? "" : "s", hit ? " (from the cache)" : "", image_n,
                 programs == 1 ? "cubin" : "bundle of cubins");
        rt_program_free(&p);
      }
      free(log);
    } else if (backend == BACKEND_CPU) {
      RtProgram p;
      rc = cpu_lower(in.m, &p, &text, err, sizeof err);
      if (!rc) {
        rc = rt_program_save(&p, &prog, &prog_n, err, sizeof err);
        rt_program_free(&p);
      }
    } else {
      text = module_to_string(in.m);
    }
    /* parts: settings, then ref: the IR; cpu: program, LLVM IR; cuda: program, cubin, "cuda";
       a cpu mesh: program, LLVM IR, an empty IR part, "mesh"; a cuda mesh: program, cubin, an
       empty IR part, "cuda-mesh".  A mesh carries no IR, pipelined or not: the program holds
       the mesh, the placements, the schedule and the stages the executor reads */
    bool mesh = backend == BACKEND_CPU && mesh_world(&in.m->mesh) > 1;
    bool cuda_mesh = cuda && mesh_world(&in.m->mesh) > 1;
    char *ir = !rc && (mesh || cuda_mesh) ? strdup("") : NULL;
    /* a cpu executable ends with the decode program: its program, LLVM IR, "sample" */
    unsigned char *dprog = NULL;
    size_t dprog_n = 0;
    char *dllvm = NULL;
    if (!rc && backend == BACKEND_CPU) rc = decode_program(s, &dprog, &dprog_n, &dllvm, err, sizeof err);
    if (!rc && mesh) {
      const void *parts[8] = {settings, prog, text, ir, "mesh", dprog, dllvm, "sample"};
      size_t sizes[8] = {strlen(settings), prog_n, strlen(text), strlen(ir), 4, dprog_n, strlen(dllvm), 6};
      rc = payload_write(runner, ta.output, parts, sizes, 8, err, sizeof err);
    } else if (!rc && cuda_mesh) {
      const void *parts[5] = {settings, prog, image, ir, "cuda-mesh"};
      size_t sizes[5] = {strlen(settings), prog_n, image_n, strlen(ir), 9};
      rc = payload_write(runner, ta.output, parts, sizes, 5, err, sizeof err);
    } else if (!rc && cuda) {
      const void *parts[4] = {settings, prog, image, "cuda"};
      size_t sizes[4] = {strlen(settings), prog_n, image_n, 4};
      rc = payload_write(runner, ta.output, parts, sizes, 4, err, sizeof err);
    } else if (!rc && backend == BACKEND_CPU) {
      const void *parts[6] = {settings, prog, text, dprog, dllvm, "sample"};
      size_t sizes[6] = {strlen(settings), prog_n, strlen(text), dprog_n, strlen(dllvm), 6};
      rc = payload_write(runner, ta.output, parts, sizes, 6, err, sizeof err);
    } else if (!rc) {
      const void *parts[2] = {settings, text};
      size_t sizes[2] = {strlen(settings), strlen(text)};
      rc = payload_write(runner, ta.output, parts, sizes, 2, err, sizeof err);
    }
    free(dprog);
    free(dllvm);
    if (!rc)
      printf("wrote %s: trains %s (%s, %s backend%s%s; run it with --help for its options)\n", ta.output, ta.spec,
             s->precision, backend == BACKEND_CPU ? "cpu" : cuda ? "cuda" : "reference", cuda ? ", cubin for " : "",
             cuda ? arch : "");
    free(settings);
    free(text);
    free(prog);
    free(image);
    free(ir);
  }
  module_free(in.m);
  return report(rc, err);
}
