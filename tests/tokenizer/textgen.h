/* tests/tokenizer/textgen.h — the tokenizer goldens' text, generated deterministically.
 *
 * gen_goldens.py runs tok_textgen (textgen.c) to get the documents, encodes them with the
 * Hugging Face `tokenizers` package and checks in a count and a hash per document;
 * tests/unit/test_tokenizer.c generates the same documents and compares loom's tokens.  So the
 * megabytes of text are never checked in, only the generator and ~40 bytes per document.
 *
 * Document d of textgen_doc: the first TEXTGEN_EDGE are edge cases (whitespace runs, long
 * words, contractions, special tokens, U+0085 ...); the others mix English, code, text in
 * many scripts, emoji, numbers and whitespace runs, 1 to 12 KB each.  Never a NUL byte.
 */
#ifndef LOOM_TESTS_TEXTGEN_H
#define LOOM_TESTS_TEXTGEN_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  char *buf;
  size_t n, cap;
  uint64_t rng;
} TextGen;

static uint64_t textgen_next(TextGen *g) {   /* splitmix64 */
  uint64_t z = (g->rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static unsigned textgen_below(TextGen *g, unsigned n) { return (unsigned)(textgen_next(g) % n); }

static void textgen_put(TextGen *g, const char *s) {
  size_t k = strlen(s);
  if (g->n + k < g->cap) memcpy(g->buf + g->n, s, k), g->n += k;
}
static const char *textgen_pick(TextGen *g, const char *const *list, unsigned n) { return list[textgen_below(g, n)]; }
#define TG_PICK(g, list) textgen_pick(g, list, (unsigned)(sizeof list / sizeof list[0]))

static const char *const tg_words[] = {
  "the", "of", "and", "to", "in", "is", "was", "that", "for", "it", "with", "as", "his", "on", "be", "at", "by", "I",
  "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all",
  "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so",
  "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
  "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even",
  "most", "made", "after", "also", "did", "many", "before", "must", "through", "years", "where", "much", "your", "way",
  "compiler", "gradient", "tokenizer", "Shakespeare", "London", "NASA", "McDonald", "iPhone", "O'Brien", "rock'n'roll",
  "self-attention", "e-mail", "naïve", "café", "résumé", "Zürich", "façade", "Ångström", "coöperate", "ﬁnance"};
static const char *const tg_suffix[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'D", "n't"};
static const char *const tg_punct[] = {".", ",", ";", ":", "!", "?", "...", " -", " --", "\u2014", "\u2026", "\"", "'",
                                       "(", ")", "[", "]", " «", "» ", "\u201c", "\u201d", "\u00bf", "\u00a1"};
static const char *const tg_code[] = {
  "    if (x > 0) {\n        return x * 2;\n    }\n", "def f(a, b=None):\n\treturn a ** 2 + b // 3\n",
  "#include <stdio.h>\n", "for (int i = 0; i < n; i++) sum += v[i];\n", "x = [1, 2, 3]  # a comment\n",
  "  \"key\": \"value\",\n", "<div class=\"a\">&nbsp;</div>\r\n", "SELECT id, name FROM users WHERE age >= 21;\n",
  "fn main() -> Result<(), Box<dyn Error>> {\n", "\t\t}\n\t}\n}\n", "const re = /^[a-z]+$/i;\n",
  "std::vector<std::string> v{\"a\", \"b\"};\n", "$ ls -la | grep '.txt' > out.log 2>&1\n", "x+=1;y-=2;z*=3;w/=4;\n",
  "0xDEADBEEF, 0b1010, 1e-5, 3.14159f, 1_000_000\n", "// TODO(loom): fix this\n", "/* block\n * comment\n */\n",
  "    \n\n    pass\n", "if __name__ == '__main__':\n    main()\n", "a&&b||!c?d:e\n", "@@ -1,3 +1,4 @@\n"};
static const char *const tg_unicode[] = {
  "Ελληνικά", "γλώσσα", "Σίσυφος", "русский", "язык", "Москва", "日本語のテキスト", "東京", "カタカナ", "中文字符",
  "北京市", "한국어", "서울", "العربية", "مرحبا", "हिन्दी", "नमस्ते", "עברית", "שלום", "ไทย", "สวัสดี", "ქართული",
  "Հայերեն", "e\u0301", "a\u0308o\u0308", "ﬁ", "ﬂ", "①②③", "Ⅻ", "ⅷ", "²³", "½", "０１２", "٣٤٥", "१२३", "😀",
  "👩\u200d💻", "🇩🇪", "👍🏽", "🤖🤖🤖", "\u200b", "\u00a0", "\u3000", "\xc2\x85", "\u2028", "\u2029", "\u202f",
  "\u205f", "\u1680", "\ufeff", "ſ", "İ", "ß", "ẞ", "ǅ", "Σσς", "ŉ", "\u0301", "\u1e9e", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟙𝟚",
  "\U0001F600", "\x7f", "\x01", "\x1b[0m", "\x1c", "\x0b", "\x0c", "�"};
static const char *const tg_space[] = {" ", " ", " ", "  ", "\t", "\n", "\n", "\r\n", "\u00a0", "\u3000", "\n\n",
                                       "\x0b", "\x0c", "\xc2\x85"};

static void textgen_number(TextGen *g) {
  char num[48];
  unsigned len = 1 + textgen_below(g, 12), k = 0;
  for (unsigned i = 0; i < len; i++) {
    num[k++] = (char)('0' + textgen_below(g, 10));
    if (i + 1 < len && textgen_below(g, 8) == 0) num[k++] = textgen_below(g, 2) ? ',' : '.';
  }
  num[k] = 0;
  textgen_put(g, num);
}

static void textgen_sentence(TextGen *g) {
  unsigned n = 3 + textgen_below(g, 20);
  for (unsigned i = 0; i < n; i++) {
    const char *w = TG_PICK(g, tg_words);
    if (i == 0 && w[0] >= 'a' && w[0] <= 'z') {
      char cap[64];
      snprintf(cap, sizeof cap, "%c%s", w[0] - 32, w + 1);
      textgen_put(g, cap);
    } else if (textgen_below(g, 40) == 0) {   /* SHOUTING */
      char up[64];
      size_t k = 0;
      for (; w[k] && k < 63; k++) up[k] = (w[k] >= 'a' && w[k] <= 'z') ? (char)(w[k] - 32) : w[k];
      up[k] = 0;
      textgen_put(g, up);
    } else {
      textgen_put(g, w);
    }
    unsigned r = textgen_below(g, 30);
    if (r == 0) textgen_put(g, TG_PICK(g, tg_suffix));
    else if (r == 1) textgen_number(g);
    else if (r < 5) textgen_put(g, TG_PICK(g, tg_punct));
    else if (r == 5) textgen_put(g, TG_PICK(g, tg_unicode));
    textgen_put(g, i + 1 < n ? (textgen_below(g, 25) ? " " : TG_PICK(g, tg_space)) : "");
  }
  textgen_put(g, textgen_below(g, 4) ? ". " : textgen_below(g, 2) ? ".\n" : "!\n\n");
}

/* Edge cases, one per document. */
static void textgen_edge(TextGen *g, int d) {
  char run[6000];
  switch (d) {
  case 0: break;   /* empty */
  case 1: textgen_put(g, " "); break;
  case 2: memset(run, ' ', 1000), run[1000] = 0, textgen_put(g, run); textgen_put(g, "x"); break;
  case 3: for (int i = 0; i < 200; i++) textgen_put(g, i % 3 ? " \n" : "\t \r\n "); break;
  case 4: memset(run, 'a', 5000), run[5000] = 0, textgen_put(g, run); break;
  case 5: textgen_put(g, "I'm you're he's we've they'll she'd don't 'S 'LL 'Ve I'M HE'S 'tis 's's"); break;
  case 6: textgen_put(g, "<|endoftext|><|endoftext|>a<|endoftext|> <|endoftext|>\n<|end_of_text|>"
                         "<|begin_of_text|>x<|endoftext"); break;
  case 7: textgen_put(g, "a" "\xc2\x85" "\xc2\x85" "b " "\xc2\x85" " c\u00a0\u00a0d \u3000 e\u2028f  " "\xc2\x85" "\ng"); break;
  case 8: textgen_put(g, "1234567 12 123 1234 ١٢٣٤ 1.5e10 -3 +4 ½¼ ²³⁴ ⅧⅨ"); break;
  case 9: textgen_put(g, "    def f():\n        return 1\n\n\n    \n\t\t\n   x"); break;
  case 10: textgen_put(g, "\r\n\r\n\r\r\n\n \n  \n   hello   \n   "); break;
  case 11: textgen_put(g, "!!!???...,,,;;;:::---___***&&&^^^%%%$$$###@@@"); break;
  case 12: textgen_put(g, "😀😀😀 👩\u200d💻👩\u200d💻 🇩🇪🇫🇷 a😀b"); break;
  case 13: textgen_put(g, "Ǆǅǆ İı ẞß ſ Σσς ﬃ ÅÅ e\u0301e\u0301\u0301"); break;
  case 14: for (int i = 0; i < 300; i++) textgen_put(g, "ab"); break;
  default: for (int i = 0; i < 40; i++) textgen_put(g, TG_PICK(g, tg_unicode)); break;
  }
}
#define TEXTGEN_EDGE 16

/* Document d (seeded by d alone) into buf[cap]; returns its length (no NUL inside). */
static size_t textgen_doc(int d, char *buf, size_t cap) {
  TextGen g = {buf, 0, cap, 0x6c6f6f6dull * 1000003u + (uint64_t)d};
  if (d < TEXTGEN_EDGE) {
    textgen_edge(&g, d);
    return g.n;
  }
  size_t target = 1000 + textgen_below(&g, 11000);
  while (g.n < target && g.n + 1024 < cap) {
    unsigned r = textgen_below(&g, 100);
    if (r < 50) textgen_sentence(&g);
    else if (r < 70) textgen_put(&g, TG_PICK(&g, tg_code));
    else if (r < 85) {
      unsigned n = 1 + textgen_below(&g, 8);
      for (unsigned i = 0; i < n; i++) {
        textgen_put(&g, TG_PICK(&g, tg_unicode));
        if (textgen_below(&g, 2)) textgen_put(&g, " ");
      }
    } else if (r < 95) {
      unsigned n = 1 + textgen_below(&g, 30);
      for (unsigned i = 0; i < n; i++) textgen_put(&g, TG_PICK(&g, tg_space));
    } else if (r < 99) {
      textgen_number(&g);
      textgen_put(&g, " ");
    } else {
      textgen_put(&g, "<|endoftext|>");
    }
  }
  return g.n;
}

#endif
