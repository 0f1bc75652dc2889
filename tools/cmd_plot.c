/* tools/cmd_plot.c — `loom plot`: the loss, validation-loss and learning-rate curves of a
   `loom train --log FILE.jsonl` as an SVG picture (SVG is text: no plotting library). */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/io/safetensors.h" /* rt_read_file, RtAtomic */
#include "tools/tools.h"

static const char help[] =
  "usage: loom plot FILE.jsonl -o curves.svg [--title TEXT]\n"
  "\n"
  "Draws the curves of a metrics log that 'loom train --log FILE.jsonl' wrote: the training\n"
  "loss and the validation loss (dots, where it was measured) against the step, and the\n"
  "learning rate below, as an SVG picture with axes, ticks and a legend.  A step logged more\n"
  "than once (a run resumed from an earlier checkpoint) is drawn with its last line.\n"
  "\n"
  "options:\n"
  "  -o, --out FILE.svg  the picture to write\n"
  "  --title TEXT        its title (default: the log's file name)\n"
  "  -h, --help          show this help\n"
  "\n"
  "example:\n"
  "  loom train SPEC --data train.bin --val-data val.bin --log run.jsonl && loom plot run.jsonl -o run.svg\n";

typedef struct {
  int64_t step;
  double loss, val, lr;   /* NAN when absent */
  int line;               /* its line in the file */
} Point;

/* By step, and of equal steps the latest line first (the one kept). */
static int by_step(const void *a, const void *b) {
  const Point *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return y->line - x->line;
}

static double field(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Reads the log: sorted by step, the last line of a repeated step kept. */
static int read_log(const char *path, Point **out, int *n_out, char *err, size_t errlen) {
  uint8_t *buf;
  size_t size;
  int rc = rt_read_file(path, &buf, &size, err, errlen);
  if (rc) return rc;
  Point *p = NULL;
  int n = 0, cap = 0, line_no = 0;
  for (size_t at = 0; at < size && !rc; line_no++) {
    const uint8_t *nl = memchr(buf + at, '\n', size - at);
    size_t len = nl ? (size_t)(nl - (buf + at)) : size - at;
    size_t start = at;
    at += len + (nl != NULL);
    bool blank = true;
    for (size_t k = 0; k < len && blank; k++) blank = buf[start + k] == ' ' || buf[start + k] == '\r' || buf[start + k] == '\t';
    if (blank) continue;
    json_error_t je;
    json_t *o = json_loadb((const char *)buf + start, len, 0, &je);
    json_t *step = json_object_get(o, "step");
    if (!json_is_object(o) || !json_is_integer(step)) {
      snprintf(err, errlen, "%s:%d: %s; each line of a metrics log is a JSON object with an integer \"step\" (as "
               "'loom train --log' writes)", path, line_no + 1, !o ? je.text : "no integer \"step\"");
      rc = 2;
    } else {
      if (n == cap) {
        cap = cap ? cap * 2 : 256;
        Point *np = realloc(p, sizeof *p * (size_t)cap);
        if (!np) rc = 1, snprintf(err, errlen, "out of memory");
        else p = np;
      }
      if (!rc) p[n++] = (Point){json_integer_value(step), field(o, "loss"), field(o, "val_loss"), field(o, "lr"), line_no};
    }
    json_decref(o);
  }
  free(buf);
  if (!rc && n == 0) {
    snprintf(err, errlen, "%s: no steps in the log; write one with 'loom train ... --log %s'", path, path);
    rc = 2;
  }
  if (rc) {
    free(p);
    return rc;
  }
  qsort(p, (size_t)n, sizeof *p, by_step);
  int m = 0;
  for (int i = 0; i < n; i++)
    if (m == 0 || p[m - 1].step != p[i].step) p[m++] = p[i];
  *out = p;
  *n_out = m;
  return 0;
}
/* "Nice" tick spacing for about `want` ticks over [lo, hi]: 1, 2 or 5 times a power of 10. */
static double nice_step(double lo, double hi, int want) {
  double raw = (hi - lo) / want;
  if (!(raw > 0)) return 1;
  double p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* One format for a whole axis: scientific when its largest value is tiny or huge. */
static void fmt_num(char *out, size_t n, double v, double step, bool sci) {
  if (sci) snprintf(out, n, "%.1e", v);
  else {
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(out, n, "%.*f", dec > 6 ? 6 : dec, v);
  }
}

typedef struct {
  double x0, y0, w, h;     /* the panel's plotting area in pixels */
  double xlo, xhi, ylo, yhi;
} Panel;

static double px(const Panel *p, double x) { return p->x0 + (x - p->xlo) / (p->xhi - p->xlo) * p->w; }
static double py(const Panel *p, double y) { return p->y0 + p->h - (y - p->ylo) / (p->yhi - p->ylo) * p->h; }

/* Frame, grid, ticks and labels; the y range is widened to whole ticks. */
static void axes(FILE *f, Panel *p, const char *ylabel, bool xlabels) {
  double ys = nice_step(p->ylo, p->yhi, 5);
  p->ylo = floor(p->ylo / ys) * ys;
  p->yhi = ceil(p->yhi / ys) * ys;
  if (p->yhi <= p->ylo) p->yhi = p->ylo + ys;
  double xs = nice_step(p->xlo, p->xhi, 8);
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", p->x0, p->y0,
          p->w, p->h);
  char t[64];
  double big = fmax(fabs(p->ylo), fabs(p->yhi));
  bool ysci = big > 0 && (big < 1e-2 || big >= 1e6);
  for (double y = p->ylo; y <= p->yhi + ys * 1e-6; y += ys) {
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", p->x0, py(p, y), p->x0 + p->w,
            py(p, y));
    fmt_num(t, sizeof t, fabs(y) < ys * 1e-9 ? 0 : y, ys, ysci);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 6, py(p, y) + 4, t);
  }
  for (double x = ceil(p->xlo / xs) * xs; x <= p->xhi + xs * 1e-6; x += xs) {
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", px(p, x), p->y0, px(p, x),
            p->y0 + p->h);
    fmt_num(t, sizeof t, x, xs, p->xhi >= 1e6);
    if (xlabels) fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px(p, x), p->y0 + p->h + 16, t);
  }
  fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", p->x0 - 62,
          p->y0 + p->h / 2, ylabel);
}

static void curve(FILE *f, const Panel *p, const Point *pts, int n, size_t off, const char *color, bool dots) {
  bool open = false;
  for (int i = 0; i < n; i++) {
    double v = *(const double *)((const char *)&pts[i] + off);
    if (!isfinite(v)) continue;
    if (dots) {
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(p, (double)pts[i].step), py(p, v), color);
      continue;
    }
    fprintf(f, "%s%.1f,%.1f", open ? " " : "<polyline fill=\"none\" stroke-width=\"1.5\" points=\"", px(p, (double)pts[i].step),
            py(p, v));
    open = true;
  }
  if (open) fprintf(f, "\" stroke=\"%s\"/>\n", color);
  if (dots) {   /* a line through the dots too */
    bool any = false;
    for (int i = 0; i < n; i++) {
      double v = *(const double *)((const char *)&pts[i] + off);
      if (!isfinite(v)) continue;
      fprintf(f, "%s%.1f,%.1f", any ? " " : "<polyline fill=\"none\" stroke-dasharray=\"4 3\" points=\"",
              px(p, (double)pts[i].step), py(p, v));
      any = true;
    }
    if (any) fprintf(f, "\" stroke=\"%s\"/>\n", color);
  }
}

static void range_of(const Point *pts, int n, size_t off, double *lo, double *hi) {
  for (int i = 0; i < n; i++) {
    double v = *(const double *)((const char *)&pts[i] + off);
    if (!isfinite(v)) continue;
    if (v < *lo) *lo = v;
    if (v > *hi) *hi = v;
  }
}

static void xml_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '<') fputs("&lt;", f);
    else if (*s == '>') fputs("&gt;", f);
    else if (*s == '&') fputs("&amp;", f);
    else if (*s == '"') fputs("&quot;", f);
    else fputc(*s, f);
  }
}

static int write_svg(FILE *f, const Point *pts, int n, const char *title) {
  const double W = 820, H = 600;
  Panel top = {95, 50, 690, 330, (double)pts[0].step, (double)pts[n - 1].step, INFINITY, -INFINITY};
  if (top.xhi <= top.xlo) top.xhi = top.xlo + 1;
  range_of(pts, n, offsetof(Point, loss), &top.ylo, &top.yhi);
  range_of(pts, n, offsetof(Point, val), &top.ylo, &top.yhi);
  Panel low = {95, 430, 690, 120, top.xlo, top.xhi, INFINITY, -INFINITY};
  range_of(pts, n, offsetof(Point, lr), &low.ylo, &low.yhi);
  bool has_val = false, has_lr = isfinite(low.ylo);
  for (int i = 0; i < n; i++) has_val |= isfinite(pts[i].val);
  if (!isfinite(top.ylo)) top.ylo = 0, top.yhi = 1;
  if (!has_lr) low.ylo = 0, low.yhi = 1;
  if (low.ylo > 0) low.ylo = 0;   /* the learning rate from 0 */
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
          "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
          W, H, W, H);
  fprintf(f, "<text x=\"%.0f\" y=\"28\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
  xml_escape(f, title);
  fputs("</text>\n", f);
  axes(f, &top, "loss", false);
  curve(f, &top, pts, n, offsetof(Point, loss), "#1f77b4", false);
  if (has_val) curve(f, &top, pts, n, offsetof(Point, val), "#ff7f0e", true);
  /* legend, top right inside the panel */
  double lx = top.x0 + top.w - 170, ly = top.y0 + 18;
  fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"160\" height=\"%d\" fill=\"white\" stroke=\"#ccc\"/>\n", lx - 8, ly - 13,
          has_val ? 42 : 24);
  fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" stroke-width=\"2\"/>"
          "<text x=\"%.1f\" y=\"%.1f\">training loss</text>\n", lx, ly - 4, lx + 24, ly - 4, lx + 30, ly);
  if (has_val)
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#ff7f0e\"/><text x=\"%.1f\" y=\"%.1f\">validation loss</text>\n",
            lx + 12, ly + 14, lx + 30, ly + 18);
  axes(f, &low, "learning rate", true);
  if (has_lr) curve(f, &low, pts, n, offsetof(Point, lr), "#2ca02c", false);
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n</svg>\n", low.x0 + low.w / 2,
          low.y0 + low.h + 36);
  return ferror(f) ? -1 : 0;
}

int cmd_plot(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *title = NULL, *v;
  for (int i = 1; i < argc; i++) {
    int r;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) { fputs(help, stdout); return EXIT_OK; }
    if ((r = arg_value(argc, argv, &i, "-o", &v)) || (r = arg_value(argc, argv, &i, "--out", &v))) {
      if (r < 0) return usage_error("plot", "-o needs the SVG file to write");
      out = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--title", &v))) {
      if (r < 0) return usage_error("plot", "--title needs a text");
      title = v;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) return unknown_option("plot", argv[i], help);
    if (in) return usage_error("plot", "one metrics log at a time ('%s' and '%s')", in, argv[i]);
    in = argv[i];
  }
  if (!in) return usage_error("plot", "no metrics log given (loom train ... --log FILE.jsonl writes one)");
  if (!out) return usage_error("plot", "no output: give -o curves.svg");
  char err[IR_ERR_LEN] = "";
  Point *pts;
  int n;
  int rc = read_log(in, &pts, &n, err, sizeof err);
  if (rc) return report(rc, err);
  int m = n;
  RtAtomic a;
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (!mem || write_svg(mem, pts, m, title ? title : in) || fclose(mem)) {
    snprintf(err, sizeof err, "out of memory writing the picture");
    rc = EXIT_RUN;
  }
  if (!rc) rc = rt_atomic_open(&a, out, err, sizeof err);
  if (!rc) {
    rc = rt_atomic_write(&a, text, len, err, sizeof err);
    if (!rc) rc = rt_atomic_commit(&a, err, sizeof err);
    rt_atomic_abort(&a);
  }
  if (!rc) printf("wrote %s: %d steps from %s\n", out, m, in);
  free(text);
  free(pts);
  return report(rc, err);
}
