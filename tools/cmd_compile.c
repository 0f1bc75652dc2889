/* tools/cmd_compile.c — `loom compile`: a standalone training executable. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/tools.h"

static const char help[] =
  "usage: loom compile SPEC.json -o EXE [training options]\n"
  "\n"
  "Compiles the model's training step and writes EXE, an executable that trains it without\n"
  "loom or the spec present.  It takes the same options as 'loom train'.  Shapes (batch,\n"
  "seq, grad-accum), precision and the optimizer's constants are compiled in; the data,\n"
  "steps, learning-rate schedule, seed, --init, --out and checkpoint options are defaults\n"
  "that EXE's own flags can change (EXE --help lists them, EXE --info shows what was compiled).\n"
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
  Input in;
  int rc = train_prepare(&ta, ta.spec, &in, err, sizeof err);
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
    char *settings = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(o);
    char *ir = module_to_string(in.m);
    rc = payload_write(runner, ta.output, settings, ir, err, sizeof err);
    if (!rc) printf("wrote %s: trains %s (%s; run it with --help for its options)\n", ta.output, ta.spec, s->precision);
    free(settings);
    free(ir);
  }
  module_free(in.m);
  return report(rc, err);
}
