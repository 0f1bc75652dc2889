/* tools/cmd_make_golden.c — `loom make-golden SPEC -o DIR`: runs tools/make_golden.py, which
 * writes a golden folder (README "Golden folders") with PyTorch and Hugging Face transformers.
 * The python is LOOM_PYTHON or python3 on PATH; the script is LOOM_MAKE_GOLDEN or the one in
 * the source tree loom was built from.  Its exit status is passed on (0 done, 2 bad input or
 * missing packages, 1 anything else). */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "tools/tools.h"


extern char **environ;

static const char help[] =
  "usage: loom make-golden SPEC -o DIR [--steps N] [--seed S]\n"
  "\n"
  "Writes a golden folder for the model of SPEC (a Hugging Face config.json or a loom run\n"
  "spec): config.json, weights.safetensors (drawn from the seed), tokens.bin, golden.json\n"
  "and expected.safetensors, which PyTorch computes in float64 with the transformers model\n"
  "of the config (GPT2LMHeadModel, LlamaForCausalLM): logits, loss and every gradient of one\n"
  "forward and backward, and the parameters and losses after N training steps with loom's\n"
  "training semantics.  Batch, seq and the training settings come from the spec (loom's\n"
  "defaults otherwise, but for Adam's eps: 1e-4, not 1e-8, so that float noise on near-zero\n"
  "gradients does not move weights by +-lr and hide a wrong run in the training check; golden.json\n"
  "records every setting).  Then `loom check DIR` runs it on every backend and layout.\n"
  "\n"
  "options:\n"
  "  -o, --out DIR     the folder to write (created)\n"
  "  --steps N         training steps (default: the spec's steps, else 3; 0: forward and\n"
  "                    gradients only)\n"
  "  --seed S          seed of the weights and tokens (default 1337)\n"
  "  -h, --help        show this help\n"
  "\n"
  "Needs a python with torch, transformers and numpy: LOOM_PYTHON names it (default: python3\n"
  "on PATH), e.g. python3 -m venv V && V/bin/pip install torch transformers numpy, then\n"
  "LOOM_PYTHON=V/bin/python.  The script is tools/make_golden.py of the source tree\n"
  "(LOOM_MAKE_GOLDEN names another).\n"
  "\n"
  "example:\n"
  "  LOOM_PYTHON=V/bin/python loom make-golden models/llama-tiny.json -o golden/ --steps 3\n"
  "  loom check golden/ --mesh dp=2 --precision fp32,bf16\n";

int cmd_make_golden(int argc, char **argv) {
  const char *spec = NULL, *out = NULL, *steps = NULL, *seed = NULL, *v;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) {
      fputs(help, stdout);
      return EXIT_OK;
    }
    if ((r = arg_value(argc, argv, &i, "-o", &v)) || (r = arg_value(argc, argv, &i, "--out", &v))) {
      if (r < 0) return usage_error("make-golden", "-o needs the folder to write");
      out = v;
      continue;
    }
    const char **num = NULL, *flag = NULL;
    if ((r = arg_value(argc, argv, &i, "--steps", &v))) num = &steps, flag = "--steps";
    else if ((r = arg_value(argc, argv, &i, "--seed", &v))) num = &seed, flag = "--seed";
    if (num) {
      char *end = NULL;
      long long x = r > 0 ? strtoll(v, &end, 10) : -1;
      if (r < 0 || end == v || *end || x < 0)
        return usage_error("make-golden", "%s needs a whole number >= 0%s%s", flag, r > 0 ? ", not " : "", r > 0 ? v : "");
      *num = v;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) return unknown_option("make-golden", argv[i], help);
    if (spec) return usage_error("make-golden", "one spec at a time (got '%s' and '%s')", spec, argv[i]);
    spec = argv[i];
  }
  if (!spec) return usage_error("make-golden", "no spec given: loom make-golden SPEC -o DIR");
  if (!out) return usage_error("make-golden", "no output folder: give -o DIR");
  struct stat st;
  if (stat(spec, &st) || !S_ISREG(st.st_mode)) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%.1000s: no such file (a Hugging Face config.json or a loom run spec)", spec);
    return report(EXIT_USAGE, msg);
  }
  const char *python = getenv("LOOM_PYTHON");
  if (!python || !*python) python = "python3";
  char script[1200];
  const char *s = getenv("LOOM_MAKE_GOLDEN");
  if (s && *s) snprintf(script, sizeof script, "%s", s);
  else loom_share_path("tools/make_golden.py", script, sizeof script);   /* installed, else the source tree's */
  if (stat(script, &st)) {
    char msg[1400];
    snprintf(msg, sizeof msg, "the generator script %s is missing (loom finds it in PREFIX/share/loom/tools/ when "
             "installed, else in the source tree it was built from; set LOOM_MAKE_GOLDEN to tools/make_golden.py of a loom checkout)", script);
    return report(EXIT_USAGE, msg);
  }
  char *args[12];
  int n = 0;
  args[n++] = (char *)python;
  args[n++] = script;
  args[n++] = (char *)spec;
  args[n++] = "-o";
  args[n++] = (char *)out;
  if (steps) args[n++] = "--steps", args[n++] = (char *)steps;
  if (seed) args[n++] = "--seed", args[n++] = (char *)seed;
  args[n] = NULL;
  fflush(stdout);
  pid_t pid;
  int e = posix_spawnp(&pid, python, NULL, NULL, args, environ);
  if (e) {
    char msg[1400];
    snprintf(msg, sizeof msg, "cannot run %s (%s): make-golden needs a python with torch, transformers and numpy; set "
             "LOOM_PYTHON to one (python3 -m venv V && V/bin/pip install torch transformers numpy)", python,
             strerror(e));
    return report(EXIT_USAGE, msg);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status)) {
    char msg[200];
    snprintf(msg, sizeof msg, "the generator was killed by signal %d", WTERMSIG(status));
    return report(EXIT_RUN, msg);
  }
  int rc = WEXITSTATUS(status);
  return rc == 0 ? EXIT_OK : rc == 2 ? EXIT_USAGE : EXIT_RUN;
}
