/* tests/fuzz/fuzz_ir.c — the IR text reader: parse_module, then verify_module.
 * Invariants beyond "no crash": a refusal has a message; a module that parses and verifies
 * prints to text that parses and verifies again and prints to the same text
 * (print(parse(print(m))) == print(m), README "The IR"). */
#include "ir/ir.h"
#include "tests/fuzz/fuzz_util.h"

static char *print_to_string(const Module *m) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  if (!f) abort();
  print_module(f, m);
  fclose(f);
  return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  if (parse_module("fuzz.ir", text, &m, err, sizeof err)) {
    fuzz_check_message("parse_module", err);
    free(text);
    return 0;
  }
  if (verify_module(m, err, sizeof err)) {
    fuzz_check_message("verify_module", err);
  } else {
    char *once = print_to_string(m);
    Module *m2 = NULL;
    if (parse_module("printed.ir", once, &m2, err, sizeof err))
      fuzz_fail("the printed form of a verified module does not parse: %s\n--- printed:\n%s", err, once);
    if (verify_module(m2, err, sizeof err))
      fuzz_fail("the printed form of a verified module does not verify: %s\n--- printed:\n%s", err, once);
    char *twice = print_to_string(m2);
    if (strcmp(once, twice)) fuzz_fail("print(parse(print(m))) != print(m)\n--- once:\n%s\n--- twice:\n%s", once, twice);
    free(twice);
    free(once);
    module_free(m2);
  }
  module_free(m);
  free(text);
  return 0;
}
