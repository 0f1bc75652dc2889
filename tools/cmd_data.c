/* tools/cmd_data.c — `loom data`: text files to a byte-level llm.c token shard. */
#include <string.h>

#include "runtime/io/textdata.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom data TEXT... -o SHARD.bin\n"
  "\n"
  "Turns text files into an llm.c token shard (uint16, magic 20240520) with byte-level\n"
  "tokens: token = byte value, so any model with a vocabulary of 256 or more can train on\n"
  "it.  Files are concatenated in the order given.\n"
  "\n"
  "example:\n"
  "  loom data data/shakespeare.txt -o shakespeare.bin\n";

int cmd_data(int argc, char **argv) {
  const char *out = NULL, *v;
  const char *inputs[1024];
  int n = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) { fputs(help, stdout); return EXIT_OK; }
    if ((r = arg_value(argc, argv, &i, "-o", &v)) || (r = arg_value(argc, argv, &i, "--out", &v))) {
      if (r < 0) return usage_error("data", "-o needs the output file");
      out = v;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) return usage_error("data", "unknown option '%s'", argv[i]);
    if (n == 1024) return usage_error("data", "too many input files (at most 1024)");
    inputs[n++] = argv[i];
  }
  if (!n) return usage_error("data", "no text files given");
  if (!out) return usage_error("data", "no output: give -o SHARD.bin");
  char err[IR_ERR_LEN];
  int64_t count;
  int rc = text_to_shard(inputs, n, out, &count, err, sizeof err);
  if (!rc) printf("wrote %s: %lld tokens (byte-level, vocabulary 256)\n", out, (long long)count);
  return report(rc, err);
}
