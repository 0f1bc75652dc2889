/* tools/sample_args.c — the options `loom sample` and a compiled executable's `sample` share
   (parsing only; the generation is driver/sample.c). */
#include <stdlib.h>
#include <string.h>

#include "tools/tools.h"

void sample_args_init(SampleArgs *a) {
  memset(a, 0, sizeof *a);
  a->o.temperature = 1.0, a->o.top_p = 1.0, a->o.max_new = 64, a->o.seed = 1337;
  a->o.max_new_default = true;
}

int sample_arg(int argc, char **argv, int *i, SampleArgs *sa, const char *cmd) {
  const char *v;
  char *end;
  int r;
  if (!strcmp(argv[*i], "--ids")) {
    sa->o.ids = true;
    return 1;
  }
  const char *strs[] = {"--weights", "--prompt", "--tokenizer"};
  const char **dst[] = {&sa->weights, &sa->prompt, &sa->tokenizer};
  for (int k = 0; k < 3; k++)
    if ((r = arg_value(argc, argv, i, strs[k], &v))) {
      if (r < 0) {
        usage_error(cmd, "%s needs %s", strs[k], k == 0 ? "a file or folder" : k == 1 ? "the text to continue" : "a tokenizer.json");
        return -1;
      }
      *dst[k] = v;
      return 1;
    }
  const char *ints[] = {"--max-new-tokens", "--top-k", "--seed", "--threads"};
  for (int k = 0; k < 4; k++)
    if ((r = arg_value(argc, argv, i, ints[k], &v))) {
      long long x = r < 0 ? -1 : strtoll(v, &end, 10);
      if (r < 0 || *end || x < (k == 0 ? 1 : 0)) {
        usage_error(cmd, "%s takes a%s integer, not '%s'", ints[k], k == 0 ? " positive" : " non-negative", r < 0 ? "" : v);
        return -1;
      }
      if (k == 0) sa->o.max_new = x, sa->o.max_new_default = false;
      else if (k == 1) sa->o.top_k = x;
      else if (k == 2) sa->o.seed = (uint64_t)x;
      else sa->threads = (int)x;
      return 1;
    }
  for (int k = 0; k < 2; k++)
    if ((r = arg_value(argc, argv, i, k ? "--top-p" : "--temperature", &v))) {
      double x = r < 0 ? -1 : strtod(v, &end);
      if (r < 0 || *end || !(x >= 0) || (k && (x <= 0 || x > 1))) {
        usage_error(cmd, "%s", k ? "--top-p takes a number in (0, 1]" : "--temperature takes a number >= 0 (0: greedy)");
        return -1;
      }
      if (k) sa->o.top_p = x;
      else sa->o.temperature = x;
      return 1;
    }
  return 0;
}
