/* tests/tokenizer/textgen.c — the goldens' documents (textgen.h):
     tok_textgen DOCS       documents 0..DOCS-1, each followed by a NUL byte (gen_goldens.py)
     tok_textgen --doc D    document D alone (the CLI tests) */
#include <stdlib.h>

#include "tests/tokenizer/textgen.h"

int main(int argc, char **argv) {
  static char buf[1 << 16];
  if (argc == 3 && !strcmp(argv[1], "--doc")) {
    fwrite(buf, 1, textgen_doc(atoi(argv[2]), buf, sizeof buf), stdout);
    return 0;
  }
  int docs = argc == 2 ? atoi(argv[1]) : 0;
  if (docs < 1) {
    fprintf(stderr, "usage: tok_textgen DOCS | tok_textgen --doc D\n");
    return 2;
  }
  for (int d = 0; d < docs; d++) {
    fwrite(buf, 1, textgen_doc(d, buf, sizeof buf), stdout);
    fputc(0, stdout);
  }
  return 0;
}
