/* tools/cmd_compile.c — `loom compile`: a standalone training executable. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cpu/cpu.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom compile SPEC.json -o EXE [training options]\n"
  "\n"
  "Compiles the model's training step and writes EXE, an executable that trains it without\n"
  "loom or the spec present.  It takes the same options as 'loom train'.  Shapes (batch,\n"
  "seq, grad-accum), precision and the optimizer's constants are compiled in; the data,\n"
  "steps, learning-rate schedule, seed, --init, --out and checkpoint options are defaults\n"
  "that EXE's own flags can change (EXE --help lists them, EXE --info shows what was compiled).\n"
  "With the cpu backend (the default on one rank) EXE carries the lowered program and its\n"
  "kernels, JIT-compiled at start; with --backend ref it carries the IR.\n"
  "\n"
  "example:\n"
  "  loom compile models/gpt2-tiny.json --data shard.bin --steps 100 -o train-tiny && ./train-tiny\n";

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
  if (!ta.backend) ta.backend = "cpu";   /* executables embed the cpu or ref program (cuda: not yet) */
  if (!strcmp(ta.backend, "cuda"))
    return usage_error("compile", "compiled executables carry the cpu or ref program for now; use --backend cpu or ref");
  Input in;
  Backend backend;
  int rc = train_prepare(&ta, ta.spec, &in, &backend, err, sizeof err);
  if (!rc && backend == BACKEND_CPU && mesh_world(&in.m->mesh) > 1) {
    snprintf(err, sizeof err, "a compiled executable runs the cpu program on one rank for now; for a mesh of %lld "
             "ranks compile with --backend ref, or train with loom train --mesh", (long long)mesh_world(&in.m->mesh));
    rc = EXIT_USAGE;
  }
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
    json_object_set_new(o, "backend", json_string(backend == BACKEND_CPU ? "cpu" : "ref"));
    char *settings = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(o);
    /* The program: the lowered program and its kernels' LLVM IR (cpu), or the IR (ref). */
    unsigned char *prog = NULL;
    size_t prog_n = 0;
    char *text = NULL;
    if (backend == BACKEND_CPU) {
      RtProgram p;
      rc = cpu_lower(in.m, &p, &text, err, sizeof err);
      if (!rc) {
        rc = rt_program_save(&p, &prog, &prog_n, err, sizeof err);
        rt_program_free(&p);
      }
    } else {
      text = module_to_string(in.m);
    }
    if (!rc) {
      const void *parts[3] = {settings, backend == BACKEND_CPU ? (const void *)prog : (const void *)text, text};
      size_t sizes[3] = {strlen(settings), backend == BACKEND_CPU ? prog_n : strlen(text), strlen(text)};
      rc = payload_write(runner, ta.output, parts, sizes, backend == BACKEND_CPU ? 3 : 2, err, sizeof err);
    }
    if (!rc)
      printf("wrote %s: trains %s (%s, %s backend; run it with --help for its options)\n", ta.output, ta.spec,
             s->precision, backend == BACKEND_CPU ? "cpu" : "reference");
    free(settings);
    free(text);
    free(prog);
  }
  module_free(in.m);
  return report(rc, err);
}
