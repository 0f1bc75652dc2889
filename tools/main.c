/* tools/main.c — `loom`: subcommand dispatch. */
#include <string.h>

#include "tools/tools.h"

#define LOOM_VERSION "0.1.0"

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} commands[] = {
  {"ir", cmd_ir, "print a model's IR after a pass pipeline"},
  {"eval", cmd_eval, "forward pass and loss of a model on a token shard"},
  {"sample", cmd_sample, "generate text from a trained model (KV cache; greedy, temperature, top-k, top-p)"},
  {"train", cmd_train, "train a model on token shards (no spec: the built-in demo)"},
  {"compile", cmd_compile, "write a standalone training executable for a model spec"},
  {"data", cmd_data, "turn text files into token shards (byte-level or a tokenizer.json), and back"},
  {"plot", cmd_plot, "draw a training log's loss, validation-loss and lr curves as SVG"},
  {"diff", cmd_diff, "compare the tensors of two safetensors files (golden tests)"},
  {"make-golden", cmd_make_golden, "write a golden folder for a model with PyTorch + transformers"},
  {"check", cmd_check, "run a golden folder on every backend and layout and compare"},
  {"export", cmd_export, "a checkpoint as a folder Hugging Face transformers loads"},
  {"plan", cmd_plan, "the best layouts of a model on N devices, with memory and step time predicted"},
  {"calibrate", cmd_calibrate, "measure this CPU for the time model (a hardware description)"},
};
#define N_COMMANDS (int)(sizeof commands / sizeof commands[0])

static void help(FILE *out) {
  fputs("loom " LOOM_VERSION " — a compiler for training large language models\n\n"
        "usage: loom COMMAND [options]      (loom COMMAND --help for each)\n\ncommands:\n", out);
  for (int i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fputs("\nexit codes: 0 success, 2 bad input or usage, 1 run-time failure\n", out);
}

int main(int argc, char **argv) {
  /* a line at a time also into a pipe or a file (tee, nohup, a batch system's log): step
     lines show as they happen, and a killed run loses no finished line */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    help(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    if (argc > 2 && strcmp(cmd, "help") == 0)
      for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, argv[2])) {
          char *args[] = {argv[2], "--help", NULL};
          return commands[i].run(2, args);
        }
    help(stdout);
    return EXIT_OK;
  }
  if (!strcmp(cmd, "--version")) {
    puts("loom " LOOM_VERSION);
    return EXIT_OK;
  }
  if (!strcmp(cmd, "train") || !strcmp(cmd, "eval") || !strcmp(cmd, "sample")) cpu_run_setup(argv);
  for (int i = 0; i < N_COMMANDS; i++)
    if (!strcmp(commands[i].name, cmd)) return commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "loom: error: unknown command '%s'\n\n", cmd);
  help(stderr);
  return EXIT_USAGE;
}
