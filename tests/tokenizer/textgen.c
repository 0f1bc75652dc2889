/* tests/tokenizer/textgen.c — tok_textgen DOCS: writes documents 0..DOCS-1 of textgen.h to
   standard output, each followed by a NUL byte (gen_goldens.py reads them). */
#include <stdlib.h>

#include "tests/tokenizer/textgen.h"

int main(int argc, char **argv) {
  int docs = argc > 1 ? atoi(argv[1]) : 0;
  if (docs < 1) {
    fprintf(stderr, "usage: tok_textgen DOCS\n");
    return 2;
  }
  static char buf[1 << 16];
  for (int d = 0; d < docs; d++) {
    size_t n = textgen_doc(d, buf, sizeof buf);
    fwrite(buf, 1, n, stdout);
    fputc(0, stdout);
  }
  return 0;
}
