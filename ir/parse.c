/* ir/parse.c — reads the text form (see print.c) back into a module.
 *
 *   module   := 'module' @name '{' 'mesh' (axis '=' int)* global* func* '}'
 *   global   := ('param' | 'state') $name ':' type '=' init
 *   init     := 'zeros' | 'ones' | 'normal' '(' num ')' | 'const' '(' num ')'
 *   func     := 'func' @name '(' [%name ':' type {',' ...}] ')' '->' '(' [type {',' type}] ')'
 *               '{' op* 'return' [value {',' value}] '}'
 *   op       := value {',' value} '=' opname [value {',' value}] ['{' attr {',' attr} '}'] ':' type {',' type}
 *   type     := dtype '[' [int {',' int}] ']' ['<' axis ':' ('s' int | 'p') {',' ...} '>']
 *
 * Errors: "file:line:col: error: expected X, found Y", then the line and a caret.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ir.h"

typedef enum {
  TK_EOF, TK_IDENT, TK_LOCAL, TK_GLOBAL, TK_FUNC, TK_INT, TK_FLOAT, TK_STRING,
  TK_LBRACE, TK_RBRACE, TK_LPAREN, TK_RPAREN, TK_LBRACK, TK_RBRACK, TK_LT, TK_GT,
  TK_COMMA, TK_COLON, TK_EQ, TK_ARROW, TK_BAD
} TokKind;

typedef struct {
  TokKind kind;
  const char *s;   /* start in source (for sigiled names: after the sigil) */
  size_t n;
  int line, col;
} Tok;

/* A small string -> pointer hash map for value and global names. */
typedef struct {
  const char **keys;
  void **vals;
  size_t cap, n;
} Map;

typedef struct {
  const char *file, *src;
  const char *p;
  int line;
  const char *line_start;
  Tok tok;
  Module *m;
  char *err;
  size_t errlen;
  bool failed;
  Map globals, locals;
} Parser;

/* ---- map ---- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void *map_get(const Map *m, const char *k) {
  if (!m->cap) return NULL;
  for (size_t i = hash_str(k) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i]) return NULL;
    if (!strcmp(m->keys[i], k)) return m->vals[i];
  }
}

static void map_put(Map *m, const char *k, void *v) {
  if ((m->n + 1) * 2 > m->cap) {
    Map old = *m;
    m->cap = old.cap ? old.cap * 2 : 64;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = calloc(m->cap, sizeof *m->vals);
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
      if (old.keys[i]) map_put(m, old.keys[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
  }
  size_t i = hash_str(k) & (m->cap - 1);
  while (m->keys[i] && strcmp(m->keys[i], k)) i = (i + 1) & (m->cap - 1);
  if (!m->keys[i]) m->n++;
  m->keys[i] = k;
  m->vals[i] = v;
}

static void map_free(Map *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ---- errors ---- */

static const char *tok_desc(const Tok *t, char *buf, size_t n) {
  switch (t->kind) {
  case TK_EOF: return "end of file";
  case TK_LOCAL: snprintf(buf, n, "'%%%.*s'", (int)(t->n < 60 ? t->n : 60), t->s); return buf;
  case TK_GLOBAL: snprintf(buf, n, "'$%.*s'", (int)(t->n < 60 ? t->n : 60), t->s); return buf;
  case TK_FUNC: snprintf(buf, n, "'@%.*s'", (int)(t->n < 60 ? t->n : 60), t->s); return buf;
  default: snprintf(buf, n, "'%.*s'", (int)(t->n < 60 ? t->n : 60), t->s); return buf;
  }
}

static int error_at(Parser *ps, const Tok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int error_at(Parser *ps, const Tok *t, const char *fmt, ...) {
  if (ps->failed) return IR_EINPUT;
  ps->failed = true;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* Show the source line and a caret under the token. */
  const char *ls = t->s - (t->kind == TK_LOCAL || t->kind == TK_GLOBAL || t->kind == TK_FUNC ? 1 : 0);
  while (ls > ps->src && ls[-1] != '\n') ls--;
  const char *le = ls;
  while (*le && *le != '\n') le++;
  int col = t->col;
  int width = (int)(le - ls) < 200 ? (int)(le - ls) : 200;
  snprintf(ps->err, ps->errlen, "%s:%d:%d: error: %s\n  %.*s\n  %*s^", ps->file, t->line, col, msg, width, ls,
           col - 1 < width ? col - 1 : width, "");
  return IR_EINPUT;
}

static int expected(Parser *ps, const char *what) {
  char buf[128];
  return error_at(ps, &ps->tok, "expected %s, found %s", what, tok_desc(&ps->tok, buf, sizeof buf));
}

/* ---- lexer ---- */

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c) || c == '.' || c == '-'; }

static void next(Parser *ps) {
  const char *p = ps->p;
  for (;;) {
    if (*p == '\n') { ps->line++; ps->line_start = p + 1; p++; }
    else if (*p == ' ' || *p == '\t' || *p == '\r') p++;
    else if (*p == '#') { while (*p && *p != '\n') p++; }
    else break;
  }
  Tok t = {TK_BAD, p, 1, ps->line, (int)(p - ps->line_start) + 1};
  char c = *p;
  if (!c) { t.kind = TK_EOF; t.n = 0; }
  else if (c == '%' || c == '$' || c == '@') {
    const char *q = p + 1;
    while (is_name_char(*q)) q++;
    t.kind = c == '%' ? TK_LOCAL : c == '$' ? TK_GLOBAL : TK_FUNC;
    t.s = p + 1;
    t.n = (size_t)(q - p - 1);
    p = q;
    ps->p = p;
    ps->tok = t;
    return;
  } else if (is_name_start(c)) {
    const char *q = p;
    while (is_name_char(*q)) q++;
    t.kind = TK_IDENT;
    t.n = (size_t)(q - p);
  } else if (c == '-' && p[1] == '>') { t.kind = TK_ARROW; t.n = 2; }
  else if (is_digit(c) || ((c == '-' || c == '+') && (is_digit(p[1]) || p[1] == '.' || p[1] == 'i' || p[1] == 'n')) ||
           (c == '.' && is_digit(p[1]))) {
    char *end;
    errno = 0;
    strtoll(p, &end, 10);
    char *fend;
    strtod(p, &fend);
    if (fend > end) { t.kind = TK_FLOAT; t.n = (size_t)(fend - p); }
    else if (end > p) { t.kind = TK_INT; t.n = (size_t)(end - p); }
    else t.n = 1;
  } else if (c == '"') {
    const char *q = p + 1;
    while (*q && *q != '"' && *q != '\n') q++;
    t.kind = *q == '"' ? TK_STRING : TK_BAD;
    t.n = (size_t)(q - p) + (*q == '"');
  } else {
    static const char punct[] = "{}()[]<>,:=";
    static const TokKind kinds[] = {TK_LBRACE, TK_RBRACE, TK_LPAREN, TK_RPAREN, TK_LBRACK, TK_RBRACK,
                                    TK_LT, TK_GT, TK_COMMA, TK_COLON, TK_EQ};
    const char *k = strchr(punct, c);
    if (k) t.kind = kinds[k - punct];
  }
  ps->p = p + t.n;
  ps->tok = t;
}

static bool tok_is(const Parser *ps, TokKind k) { return ps->tok.kind == k; }
static bool tok_word(const Parser *ps, const char *w) {
  return ps->tok.kind == TK_IDENT && ps->tok.n == strlen(w) && !memcmp(ps->tok.s, w, ps->tok.n);
}

static int expect(Parser *ps, TokKind k, const char *what) {
  if (!tok_is(ps, k)) return expected(ps, what);
  next(ps);
  return 0;
}

static int expect_word(Parser *ps, const char *w) {
  if (!tok_word(ps, w)) {
    char buf[64];
    snprintf(buf, sizeof buf, "'%s'", w);
    return expected(ps, buf);
  }
  next(ps);
  return 0;
}

static int parse_int(Parser *ps, int64_t *out, const char *what) {
  if (!tok_is(ps, TK_INT)) return expected(ps, what);
  errno = 0;
  long long v = strtoll(ps->tok.s, NULL, 10);
  if (errno) return error_at(ps, &ps->tok, "integer out of range");
  *out = v;
  next(ps);
  return 0;
}

static int parse_number(Parser *ps, double *out, const char *what) {
  if (tok_is(ps, TK_INT) || tok_is(ps, TK_FLOAT)) {
    *out = strtod(ps->tok.s, NULL);
    next(ps);
    return 0;
  }
  if (tok_word(ps, "inf") || tok_word(ps, "nan")) {
    *out = strtod(ps->tok.s, NULL);
    next(ps);
    return 0;
  }
  return expected(ps, what);
}

/* ---- types ---- */

static int parse_type(Parser *ps, Type *t) {
  memset(t, 0, sizeof *t);
  if (!tok_is(ps, TK_IDENT) || dtype_parse(ps->tok.s, ps->tok.n, &t->dtype))
    return expected(ps, "a type such as f32[4,64] (dtypes: f32 bf16 f16 f8e4m3 f8e5m2 i32 i64 u16 bool)");
  next(ps);
  if (expect(ps, TK_LBRACK, "'[' starting the shape")) return IR_EINPUT;
  while (!tok_is(ps, TK_RBRACK)) {
    if (t->rank == IR_MAX_RANK) return error_at(ps, &ps->tok, "too many dimensions (at most %d)", IR_MAX_RANK);
    Tok at = ps->tok;
    if (parse_int(ps, &t->dims[t->rank], "a dimension size")) return IR_EINPUT;
    if (t->dims[t->rank] < 0) return error_at(ps, &at, "dimension sizes cannot be negative");
    t->rank++;
    if (!tok_is(ps, TK_RBRACK) && expect(ps, TK_COMMA, "',' or ']'")) return IR_EINPUT;
  }
  Tok after = ps->tok;
  next(ps);
  if (type_numel(t) > IR_MAX_NUMEL)
    return error_at(ps, &after, "tensor too large: more than 2^48 elements");
  if (!tok_is(ps, TK_LT)) return 0;
  next(ps);
  for (;;) {
    int axis = -1;
    for (int a = 0; a < AX_COUNT; a++)
      if (tok_word(ps, mesh_axis_names[a])) axis = a;
    if (axis < 0) return expected(ps, "a mesh axis (dp, tp, cp, pp, ep)");
    if (t->sh.kind[axis] != SH_R) return error_at(ps, &ps->tok, "axis given twice in one sharding");
    next(ps);
    if (expect(ps, TK_COLON, "':'")) return IR_EINPUT;
    /* "p" (partial) or "s<dim>" (split along dim), lexed as one identifier */
    if (tok_word(ps, "p")) {
      t->sh.kind[axis] = SH_P;
    } else if (tok_is(ps, TK_IDENT) && ps->tok.s[0] == 's' && ps->tok.n > 1 && ps->tok.n < 4 && is_digit(ps->tok.s[1])) {
      int d = atoi(ps->tok.s + 1);
      if (d >= t->rank) return error_at(ps, &ps->tok, "sharded dim %d is out of range for rank %d", d, t->rank);
      t->sh.kind[axis] = SH_S;
      t->sh.dim[axis] = (int8_t)d;
    } else {
      return expected(ps, "'s<dim>' (sharded along dim) or 'p' (partial sum)");
    }
    next(ps);
    if (tok_is(ps, TK_GT)) break;
    if (expect(ps, TK_COMMA, "',' or '>'")) return IR_EINPUT;
  }
  next(ps);
  return 0;
}

static char *tok_str(Parser *ps);

/* An optional memory-plan offset after a type: "at 4096". */
static int parse_offset(Parser *ps, Value *v) {
  if (!tok_word(ps, "at")) return 0;
  next(ps);
  Tok at = ps->tok;
  if (parse_int(ps, &v->offset, "a byte offset")) return IR_EINPUT;
  if (v->offset < 0) return error_at(ps, &at, "offsets cannot be negative");
  return 0;
}

/* ---- attributes ---- */

static int parse_attr(Parser *ps, Op *op) {
  const OpInfo *info = op_info(op->kind);
  if (!tok_is(ps, TK_IDENT)) return expected(ps, "an attribute name");
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(ps->tok.n < 63 ? ps->tok.n : 63), ps->tok.s);
  int idx = op_attr_index(op->kind, name);
  if (idx < 0) {
    char known[256] = "";
    for (int i = 0; i < info->n_attrs; i++)
      snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", info->attrs[i].name);
    return error_at(ps, &ps->tok, "op '%s' has no attribute '%s' (it has: %s)", info->name, name,
                    info->n_attrs ? known : "none");
  }
  Attr *a = &op->attrs[idx];
  next(ps);
  if (expect(ps, TK_EQ, "'='")) return IR_EINPUT;
  Tok at = ps->tok;
  switch (info->attrs[idx].kind) {
  case ATTR_INT:
    if (parse_int(ps, &a->i, "an integer")) return IR_EINPUT;
    break;
  case ATTR_FLOAT:
    if (parse_number(ps, &a->f, "a number")) return IR_EINPUT;
    break;
  case ATTR_BOOL:
    if (tok_word(ps, "true")) a->i = 1;
    else if (tok_word(ps, "false")) a->i = 0;
    else return expected(ps, "true or false");
    next(ps);
    break;
  case ATTR_DTYPE: {
    DType d;
    if (!tok_is(ps, TK_IDENT) || dtype_parse(ps->tok.s, ps->tok.n, &d)) return expected(ps, "a dtype");
    a->i = d;
    next(ps);
    break;
  }
  case ATTR_FUNC:
    if (!tok_is(ps, TK_FUNC)) return expected(ps, "a function name (@name)");
    a->s = tok_str(ps);
    next(ps);
    break;
  case ATTR_STR:
    if (!tok_is(ps, TK_STRING)) return expected(ps, "a quoted string");
    a->s = arena_strndup(ps->m->arena, ps->tok.s + 1, ps->tok.n - 2);
    next(ps);
    break;
  case ATTR_INTS: {
    int64_t vals[64];
    int n = 0;
    if (expect(ps, TK_LBRACK, "'[' starting a list of integers")) return IR_EINPUT;
    while (!tok_is(ps, TK_RBRACK)) {
      if (n == 64) return error_at(ps, &ps->tok, "too many list entries");
      if (parse_int(ps, &vals[n++], "an integer")) return IR_EINPUT;
      if (!tok_is(ps, TK_RBRACK) && expect(ps, TK_COMMA, "',' or ']'")) return IR_EINPUT;
    }
    next(ps);
    op_set_ints(ps->m, op, name, vals, n);
    break;
  }
  }
  (void)at;
  a->set = true;
  return 0;
}

/* ---- values ---- */

static char *tok_str(Parser *ps) { return arena_strndup(ps->m->arena, ps->tok.s, ps->tok.n); }

static int parse_operand(Parser *ps, Value **out) {
  if (tok_is(ps, TK_GLOBAL)) {
    char *name = tok_str(ps);
    Global *g = map_get(&ps->globals, name);
    if (!g) return error_at(ps, &ps->tok, "unknown global '$%s' (declare it with 'param' before the functions)", name);
    *out = g->value;
  } else if (tok_is(ps, TK_LOCAL)) {
    char *name = tok_str(ps);
    Value *v = map_get(&ps->locals, name);
    if (!v) return error_at(ps, &ps->tok, "use of undefined value '%%%s'", name);
    *out = v;
  } else {
    return expected(ps, "a value (%name or $global)");
  }
  next(ps);
  return 0;
}

static int define_local(Parser *ps, Value *v, const Tok *at) {
  char *name = arena_strndup(ps->m->arena, at->s, at->n);
  if (map_get(&ps->locals, name)) return error_at(ps, at, "value '%%%s' is defined twice", name);
  map_put(&ps->locals, name, v);
  v->name = name;
  return 0;
}

/* ---- ops and functions ---- */

static int parse_op(Parser *ps, Func *f) {
  Tok defs[16];
  int n_defs = 0;
  /* An op without results (an effect such as accumulate) starts with its name. */
  while (!tok_is(ps, TK_IDENT)) {
    if (!tok_is(ps, TK_LOCAL)) return expected(ps, "a result name (%name), an op name or 'return'");
    if (n_defs == 16) return error_at(ps, &ps->tok, "too many results");
    defs[n_defs++] = ps->tok;
    next(ps);
    if (tok_is(ps, TK_COMMA)) {
      next(ps);
      continue;
    }
    if (expect(ps, TK_EQ, "'='")) return IR_EINPUT;
    break;
  }
  OpKind kind;
  Tok optok = ps->tok;
  if (!tok_is(ps, TK_IDENT) || op_lookup(ps->tok.s, ps->tok.n, &kind)) {
    if (tok_is(ps, TK_IDENT)) {
      char name[64];
      snprintf(name, sizeof name, "%.*s", (int)(ps->tok.n < 63 ? ps->tok.n : 63), ps->tok.s);
      return error_at(ps, &ps->tok, "unknown op '%s'", name);
    }
    return expected(ps, "an op name");
  }
  const OpInfo *info = op_info(kind);
  next(ps);
  Value *operands[256];
  int n_operands = 0;
  while (tok_is(ps, TK_LOCAL) || tok_is(ps, TK_GLOBAL)) {
    if (n_operands == 256) return error_at(ps, &ps->tok, "too many operands");
    if (parse_operand(ps, &operands[n_operands++])) return IR_EINPUT;
    if (!tok_is(ps, TK_COMMA)) break;
    next(ps);
  }
  if (info->n_operands >= 0 ? n_operands != info->n_operands : n_operands < 1 && kind != OP_CALL)
    return error_at(ps, &optok, "op '%s' takes %s%d operand%s, found %d", info->name, info->n_operands < 0 ? "at least " : "",
                    info->n_operands < 0 ? 1 : info->n_operands, info->n_operands == 1 || info->n_operands < 0 ? "" : "s",
                    n_operands);
  if (info->n_results >= 0 && n_defs != info->n_results)
    return error_at(ps, n_defs ? &defs[0] : &optok, "op '%s' has %d result%s, but %d name%s given", info->name,
                    info->n_results, info->n_results == 1 ? "" : "s", n_defs, n_defs == 1 ? " is" : "s are");
  Op *op = op_new_n(ps->m, kind, operands, n_operands, NULL, n_defs);
  ptrvec_push(ps->m->arena, &f->ops, op);
  op->line = optok.line;
  if (tok_is(ps, TK_LBRACE)) {
    next(ps);
    while (!tok_is(ps, TK_RBRACE)) {
      if (parse_attr(ps, op)) return IR_EINPUT;
      if (!tok_is(ps, TK_RBRACE) && expect(ps, TK_COMMA, "',' or '}'")) return IR_EINPUT;
    }
    next(ps);
  }
  for (int i = 0; i < info->n_attrs; i++)
    if (!op->attrs[i].set)
      return error_at(ps, &optok, "op '%s' needs attribute '%s'", info->name, info->attrs[i].name);
  if (n_defs && expect(ps, TK_COLON, "':' and the result type")) return IR_EINPUT;
  for (int r = 0; r < n_defs; r++) {
    if (r && expect(ps, TK_COMMA, "',' and the next result type")) return IR_EINPUT;
    if (parse_type(ps, &op->results[r]->type) || parse_offset(ps, op->results[r])) return IR_EINPUT;
  }
  for (int r = 0; r < n_defs; r++)
    if (define_local(ps, op->results[r], &defs[r])) return IR_EINPUT;
  return 0;
}

static int parse_func(Parser *ps) {
  bool kernel = tok_word(ps, "kernel");
  if (kernel) next(ps);
  if (expect_word(ps, "func")) return IR_EINPUT;
  if (!tok_is(ps, TK_FUNC)) return expected(ps, "a function name (@name)");
  Tok nametok = ps->tok;
  char *name = tok_str(ps);
  if (module_find_func(ps->m, name)) return error_at(ps, &nametok, "function '@%s' is defined twice", name);
  Func *f = module_add_func(ps->m, name);
  f->is_kernel = kernel;
  next(ps);
  map_free(&ps->locals);
  if (expect(ps, TK_LPAREN, "'('")) return IR_EINPUT;
  while (!tok_is(ps, TK_RPAREN)) {
    if (!tok_is(ps, TK_LOCAL)) return expected(ps, "an argument (%name: type)");
    Tok at = ps->tok;
    next(ps);
    if (expect(ps, TK_COLON, "':' and the argument type")) return IR_EINPUT;
    Type t;
    if (parse_type(ps, &t)) return IR_EINPUT;
    Value *v = func_add_arg(f, NULL, t);
    if (parse_offset(ps, v) || define_local(ps, v, &at)) return IR_EINPUT;
    if (!tok_is(ps, TK_RPAREN) && expect(ps, TK_COMMA, "',' or ')'")) return IR_EINPUT;
  }
  next(ps);
  if (expect(ps, TK_ARROW, "'->' and the result types")) return IR_EINPUT;
  if (expect(ps, TK_LPAREN, "'('")) return IR_EINPUT;
  Type ret_types[64];
  Tok ret_tok[64];
  int n_ret_types = 0;
  while (!tok_is(ps, TK_RPAREN)) {
    if (n_ret_types == 64) return error_at(ps, &ps->tok, "too many results");
    ret_tok[n_ret_types] = ps->tok;
    if (parse_type(ps, &ret_types[n_ret_types++])) return IR_EINPUT;
    if (!tok_is(ps, TK_RPAREN) && expect(ps, TK_COMMA, "',' or ')'")) return IR_EINPUT;
  }
  next(ps);
  if (tok_word(ps, "arena")) {
    next(ps);
    if (parse_int(ps, &f->arena_bytes, "the arena size in bytes")) return IR_EINPUT;
  }
  if (expect(ps, TK_LBRACE, "'{' starting the body")) return IR_EINPUT;
  while (!tok_word(ps, "return"))
    if (parse_op(ps, f)) return IR_EINPUT;
  Tok rettok = ps->tok;
  next(ps);
  while (tok_is(ps, TK_LOCAL) || tok_is(ps, TK_GLOBAL)) {
    Value *v;
    if (parse_operand(ps, &v)) return IR_EINPUT;
    func_add_ret(f, v);
    if (!tok_is(ps, TK_COMMA)) break;
    next(ps);
  }
  if (f->rets.n != n_ret_types)
    return error_at(ps, &rettok, "'@%s' declares %d result%s but returns %d value%s", name, n_ret_types,
                    n_ret_types == 1 ? "" : "s", f->rets.n, f->rets.n == 1 ? "" : "s");
  for (int i = 0; i < n_ret_types; i++) {
    const Value *v = f->rets.items[i];
    if (!type_eq(&v->type, &ret_types[i])) {
      char a[256], b[256];
      return error_at(ps, &ret_tok[i], "result %d is declared %s but the returned value is %s", i,
                      type_str(&ret_types[i], a, sizeof a), type_str(&v->type, b, sizeof b));
    }
  }
  return expect(ps, TK_RBRACE, "'}' closing the function");
}

static int parse_global(Parser *ps) {
  GlobalKind kind = tok_word(ps, "param") ? GLOBAL_PARAM : GLOBAL_STATE;
  next(ps);
  if (!tok_is(ps, TK_GLOBAL)) return expected(ps, "a global name ($name)");
  Tok at = ps->tok;
  char *name = tok_str(ps);
  if (map_get(&ps->globals, name)) return error_at(ps, &at, "global '$%s' is declared twice", name);
  next(ps);
  if (expect(ps, TK_COLON, "':' and the type")) return IR_EINPUT;
  Type t;
  if (parse_type(ps, &t)) return IR_EINPUT;
  if (expect(ps, TK_EQ, "'=' and an initializer")) return IR_EINPUT;
  Init init = {INIT_ZEROS, 0};
  if (tok_word(ps, "zeros")) next(ps);
  else if (tok_word(ps, "ones")) { init.kind = INIT_ONES; next(ps); }
  else if (tok_word(ps, "normal") || tok_word(ps, "const")) {
    init.kind = tok_word(ps, "normal") ? INIT_NORMAL : INIT_CONST;
    next(ps);
    if (expect(ps, TK_LPAREN, "'('") || parse_number(ps, &init.value, "a number") || expect(ps, TK_RPAREN, "')'"))
      return IR_EINPUT;
  } else {
    return expected(ps, "an initializer: zeros, ones, normal(std) or const(value)");
  }
  Global *g = module_add_global(ps->m, kind, name, t, init);
  map_put(&ps->globals, g->name, g);
  if (tok_word(ps, "as")) {   /* the shape in checkpoints: same elements, another shape */
    next(ps);
    if (tok_word(ps, "experts")) {   /* a stack of per-expert tensors */
      Tok at = ps->tok;
      next(ps);
      if (t.rank < 2 || !strstr(g->name, ".experts."))
        return error_at(ps, &at, "'as experts' needs a global named P.experts.X of rank 2 or more");
      g->hf_experts = true;
      return 0;
    }
    Tok at = ps->tok;
    if (expect(ps, TK_LBRACK, "'[' starting the checkpoint shape")) return IR_EINPUT;
    int64_t numel = 1;
    while (!tok_is(ps, TK_RBRACK)) {
      if (g->hf_rank == IR_MAX_RANK) return error_at(ps, &ps->tok, "too many dimensions");
      if (parse_int(ps, &g->hf_dims[g->hf_rank], "a dimension size")) return IR_EINPUT;
      if (g->hf_dims[g->hf_rank] < 0) return error_at(ps, &at, "dimension sizes cannot be negative");
      numel *= g->hf_dims[g->hf_rank++];
      if (!tok_is(ps, TK_RBRACK) && expect(ps, TK_COMMA, "',' or ']'")) return IR_EINPUT;
    }
    next(ps);
    Type whole = t;
    if (ps->m->local)
      for (int a = 0; a < AX_COUNT; a++)
        if (whole.sh.kind[a] == SH_S) whole.dims[whole.sh.dim[a]] *= ps->m->mesh.size[a];
    /* Either the same elements in another shape, or the same shape with fewer rows
       (vocabulary padding: the rows past the checkpoint's are zero and not saved). */
    bool padded = g->hf_rank == whole.rank && g->hf_dims[0] <= whole.dims[0];
    for (int d = 1; padded && d < whole.rank; d++) padded = g->hf_dims[d] == whole.dims[d];
    if (g->hf_rank == 0 || (numel != type_numel(&whole) && !padded))
      return error_at(ps, &at, "the checkpoint shape must hold as many elements as the type, or as many rows of it");
  }
  return 0;
}

static int parse_top(Parser *ps) {
  if (expect_word(ps, "module")) return IR_EINPUT;
  if (!tok_is(ps, TK_FUNC)) return expected(ps, "the module name (@name)");
  ps->m->name = tok_str(ps);
  next(ps);
  if (expect(ps, TK_LBRACE, "'{'")) return IR_EINPUT;
  if (tok_word(ps, "mesh")) {
    next(ps);
    bool seen[AX_COUNT] = {0};
    while (tok_is(ps, TK_IDENT) && !tok_word(ps, "param") && !tok_word(ps, "state") && !tok_word(ps, "func") && !tok_word(ps, "pipeline") &&
           !tok_word(ps, "kernel")) {
      if (tok_word(ps, "local")) {   /* partitioned: shapes are per rank */
        ps->m->local = true;
        next(ps);
        continue;
      }
      int axis = -1;
      for (int a = 0; a < AX_COUNT; a++)
        if (tok_word(ps, mesh_axis_names[a])) axis = a;
      if (axis < 0) return expected(ps, "a mesh axis (dp, tp, cp, pp, ep)");
      if (seen[axis]) return error_at(ps, &ps->tok, "mesh axis given twice");
      seen[axis] = true;
      next(ps);
      if (expect(ps, TK_EQ, "'='")) return IR_EINPUT;
      Tok at = ps->tok;
      if (parse_int(ps, &ps->m->mesh.size[axis], "the axis size")) return IR_EINPUT;
      if (ps->m->mesh.size[axis] < 1) return error_at(ps, &at, "mesh axis sizes must be at least 1");
    }
  }
  if (tok_word(ps, "pipeline")) {   /* pipeline "1f1b" virtual=1 micro=4 chunks=2 */
    next(ps);
    if (!tok_is(ps, TK_STRING)) return expected(ps, "a quoted schedule name (\"afab\", \"1f1b\", \"interleaved\", \"zb-h1\", \"dualpipev\")");
    char *name = arena_strndup(ps->m->arena, ps->tok.s + 1, ps->tok.n - 2);
    if ((ps->m->pipe.kind = pipe_kind_parse(name)) < 0)
      return error_at(ps, &ps->tok, "unknown pipeline schedule (afab, 1f1b, interleaved, zb-h1 or dualpipev)");
    next(ps);
    const char *keys[3] = {"virtual", "micro", "chunks"};
    int64_t *dst[3] = {&ps->m->pipe.virt, &ps->m->pipe.micro, &ps->m->pipe.chunks};
    for (int k = 0; k < 3; k++) {
      if (!tok_word(ps, keys[k])) {
        char buf[64];
        snprintf(buf, sizeof buf, "'%s='", keys[k]);
        return expected(ps, buf);
      }
      next(ps);
      if (expect(ps, TK_EQ, "'='")) return IR_EINPUT;
      Tok at = ps->tok;
      if (parse_int(ps, dst[k], keys[k])) return IR_EINPUT;
      if (*dst[k] < 1 || *dst[k] > 1 << 20) return error_at(ps, &at, "must be between 1 and 2^20");
    }
    if (ps->m->pipe.chunks != ps->m->pipe.virt * ps->m->mesh.size[AX_PP])
      return error_at(ps, &ps->tok, "chunks must be pp x virtual");
  }
  while (tok_word(ps, "param") || tok_word(ps, "state"))
    if (parse_global(ps)) return IR_EINPUT;
  while (!tok_is(ps, TK_RBRACE)) {
    if (tok_word(ps, "param") || tok_word(ps, "state"))
      return error_at(ps, &ps->tok, "globals ('param', 'state') must come before the functions");
    if (!tok_word(ps, "func") && !tok_word(ps, "kernel")) return expected(ps, "'func', 'kernel func' or '}'");
    if (parse_func(ps)) return IR_EINPUT;
  }
  next(ps);
  /* Calls name their kernel; kernels may be printed after their callers. */
  for (int i = 0; i < ps->m->funcs.n; i++) {
    Func *f = ps->m->funcs.items[i];
    for (int k = 0; k < f->ops.n; k++) {
      Op *op = f->ops.items[k];
      if (op->kind != OP_CALL) continue;
      op->callee = module_find_func(ps->m, op->attrs[0].s);
      if (!op->callee || !op->callee->is_kernel) {
        snprintf(ps->err, ps->errlen, "%s:%d: error: call of '@%s', which is not a kernel func of this module", ps->file,
                 op->line, op->attrs[0].s);
        ps->failed = true;
        return IR_EINPUT;
      }
    }
  }
  if (!tok_is(ps, TK_EOF)) return expected(ps, "end of file after the module");
  return 0;
}

int parse_module(const char *filename, const char *text, Module **out, char *err, size_t errlen) {
  Parser ps;
  memset(&ps, 0, sizeof ps);
  ps.file = filename ? filename : "<input>";
  ps.src = ps.p = ps.line_start = text;
  ps.line = 1;
  ps.err = err;
  ps.errlen = errlen;
  ps.m = module_new("m");
  ps.m->source = arena_strdup(ps.m->arena, ps.file);
  if (strlen(text) > 0 && memchr(text, 0, strlen(text)) != NULL) { /* unreachable: strlen stops at NUL */ }
  next(&ps);
  int rc = parse_top(&ps);
  map_free(&ps.globals);
  map_free(&ps.locals);
  if (rc || ps.failed) {
    module_free(ps.m);
    *out = NULL;
    return IR_EINPUT;
  }
  *out = ps.m;
  return 0;
}

int parse_module_file(const char *path, Module **out, char *err, size_t errlen) {
  struct stat st;
  if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s: is a folder, not an IR file", path);
    return IR_EINPUT;
  }
  if (!stat(path, &st) && !S_ISREG(st.st_mode)) {   /* a FIFO or a device would block or never end */
    snprintf(err, errlen, "%s: not a regular file, expected an IR file", path);
    return IR_EINPUT;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return IR_EINPUT;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *nb = realloc(buf, cap);
      if (!nb) { free(buf); fclose(f); snprintf(err, errlen, "%s: out of memory", path); return IR_ERUN; }
      buf = nb;
    }
    size_t got = fread(buf + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0) break;
  }
  fclose(f);
  buf[len] = 0;
  if (strlen(buf) != len) {
    snprintf(err, errlen, "%s: contains a NUL byte at offset %zu; IR files are text", path, strlen(buf));
    free(buf);
    return IR_EINPUT;
  }
  int rc = parse_module(path, buf, out, err, errlen);
  free(buf);
  return rc;
}
