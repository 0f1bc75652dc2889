/* runtime/cpu/cpu_attention_tiles.h — attention's register-blocked tiles, included by
 * runtime/cpu/cpu_attention.c once per instruction set with:
 *   TILE_V     the vector type (W floats: cv_f4, cv_f8 or cv_f16)
 *   TILE_W     its lane count
 *   TILE_VH    (W = 16 only) the 8-float type for the last 8 keys of the scores
 *   TILE(name) the function's name for this instance
 *   TILE_ATTR  its attributes (the target it is compiled for)
 * Every output element gets the same operations in the same order whatever W is (lanes
 * are independent keys or dims); only the FMA instance contracts a*b+c.
 */

/* sc[r][s] = sum_d q[r][d] * kt[d*ld + s] for 4 rows and s < npad (a multiple of 8); each
   sum runs over d in order.  Each slice of kt is loaded once for the 4 rows; 2W keys at a
   time keep 8 independent accumulators in flight. */
TILE_ATTR static void TILE(scores4)(float *const *sc, const float *const *q, const float *restrict kt, int64_t ld,
                                    int64_t Dh, int64_t npad) {
  const float *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
  int64_t s = 0;
  for (; s + 2 * TILE_W <= npad; s += 2 * TILE_W) {
    TILE_V a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0}, k0, k1;
    for (int64_t d = 0; d < Dh; d++) {
      const float *kd = kt + d * ld + s;
      memcpy(&k0, kd, sizeof k0);
      memcpy(&k1, kd + TILE_W, sizeof k1);
      float x = q0[d];
      a0 += x * k0;
      b0 += x * k1;
      x = q1[d];
      a1 += x * k0;
      b1 += x * k1;
      x = q2[d];
      a2 += x * k0;
      b2 += x * k1;
      x = q3[d];
      a3 += x * k0;
      b3 += x * k1;
    }
    memcpy(sc[0] + s, &a0, sizeof a0), memcpy(sc[0] + s + TILE_W, &b0, sizeof b0);
    memcpy(sc[1] + s, &a1, sizeof a1), memcpy(sc[1] + s + TILE_W, &b1, sizeof b1);
    memcpy(sc[2] + s, &a2, sizeof a2), memcpy(sc[2] + s + TILE_W, &b2, sizeof b2);
    memcpy(sc[3] + s, &a3, sizeof a3), memcpy(sc[3] + s + TILE_W, &b3, sizeof b3);
  }
  for (; s + TILE_W <= npad; s += TILE_W) {
    TILE_V a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, k;
    for (int64_t d = 0; d < Dh; d++) {
      memcpy(&k, kt + d * ld + s, sizeof k);
      a0 += q0[d] * k;
      a1 += q1[d] * k;
      a2 += q2[d] * k;
      a3 += q3[d] * k;
    }
    memcpy(sc[0] + s, &a0, sizeof a0);
    memcpy(sc[1] + s, &a1, sizeof a1);
    memcpy(sc[2] + s, &a2, sizeof a2);
    memcpy(sc[3] + s, &a3, sizeof a3);
  }
#ifdef TILE_VH   /* W = 16: npad is a multiple of 8, so one 8-key slice may be left */
  for (; s < npad; s += 8) {
    TILE_VH a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, k;
    for (int64_t d = 0; d < Dh; d++) {
      memcpy(&k, kt + d * ld + s, sizeof k);
      a0 += q0[d] * k;
      a1 += q1[d] * k;
      a2 += q2[d] * k;
      a3 += q3[d] * k;
    }
    memcpy(sc[0] + s, &a0, sizeof a0);
    memcpy(sc[1] + s, &a1, sizeof a1);
    memcpy(sc[2] + s, &a2, sizeof a2);
    memcpy(sc[3] + s, &a3, sizeof a3);
  }
#endif
}

/* o[r][d] = sum_{s < n_r} p[r][s] * rows[s*rs + d] for the real rows; each sum runs over s
   in order.  Value rows are loaded once for the 4 rows up to the shortest row's length. */
TILE_ATTR static void TILE(pv4)(float *const *o, const float *const *p, const Rows *g, const float *restrict rows,
                                int64_t rs, int64_t Dh) {
  const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
  int64_t d = 0;
  for (; d + 2 * TILE_W <= Dh; d += 2 * TILE_W) {
    TILE_V a[RB][2], v0, v1;
    TILE_V a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    for (int64_t s = 0; s < g->nmin; s++) {
      const float *v = rows + s * rs + d;
      memcpy(&v0, v, sizeof v0);
      memcpy(&v1, v + TILE_W, sizeof v1);
      float x = p0[s];
      a0 += x * v0;
      b0 += x * v1;
      x = p1[s];
      a1 += x * v0;
      b1 += x * v1;
      x = p2[s];
      a2 += x * v0;
      b2 += x * v1;
      x = p3[s];
      a3 += x * v0;
      b3 += x * v1;
    }
    a[0][0] = a0, a[0][1] = b0, a[1][0] = a1, a[1][1] = b1;
    a[2][0] = a2, a[2][1] = b2, a[3][0] = a3, a[3][1] = b3;
    for (int r = 0; r < g->nr; r++) {   /* the longer rows go on alone */
      for (int64_t s = g->nmin; s < g->n[r]; s++) {
        float x = p[r][s];
        memcpy(&v0, rows + s * rs + d, sizeof v0);
        memcpy(&v1, rows + s * rs + d + TILE_W, sizeof v1);
        a[r][0] += x * v0;
        a[r][1] += x * v1;
      }
      memcpy(o[r] + d, &a[r][0], sizeof v0);
      memcpy(o[r] + d + TILE_W, &a[r][1], sizeof v1);
    }
  }
  for (; d < Dh; d++)
    for (int r = 0; r < g->nr; r++) {
      float acc = 0;
      for (int64_t s = 0; s < g->n[r]; s++) acc += p[r][s] * rows[s * rs + d];
      o[r][d] = acc;
    }
}

/* acc[s][d] += sum over the rows r that see key s (s < n_r), in row order, of
   w[r][s] * x[r][d], for s < nmax */
TILE_ATTR static void TILE(accumulate_rows)(float *acc, const float *const *w, const float *const *x, const Rows *g,
                                            int64_t Dh) {
  const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
  for (int64_t s = 0; s < g->nmax; s++) {
    float *row = acc + s * Dh;
    int r0 = 0;   /* the rows that see key s are a suffix: n_r grows with r */
    while (r0 < g->nr && g->n[r0] <= s) r0++;
    int64_t d = 0;
    TILE_V a0, a1, t;
    if (r0 == 0 && g->nr == RB) {   /* all four rows see key s (off the causal diagonal) */
      float w0 = w[0][s], w1 = w[1][s], w2 = w[2][s], w3 = w[3][s];
      for (; d + 2 * TILE_W <= Dh; d += 2 * TILE_W) {
        memcpy(&a0, row + d, sizeof a0);
        memcpy(&a1, row + d + TILE_W, sizeof a1);
#define ACC_ROW(wr, xr)                                                                                                \
  memcpy(&t, xr + d, sizeof t);                                                                                        \
  a0 += wr * t;                                                                                                        \
  memcpy(&t, xr + d + TILE_W, sizeof t);                                                                               \
  a1 += wr * t;
        ACC_ROW(w0, x0)
        ACC_ROW(w1, x1)
        ACC_ROW(w2, x2)
        ACC_ROW(w3, x3)
#undef ACC_ROW
        memcpy(row + d, &a0, sizeof a0);
        memcpy(row + d + TILE_W, &a1, sizeof a1);
      }
      for (; d < Dh; d++) {
        float a = row[d];
        a += w0 * x0[d];
        a += w1 * x1[d];
        a += w2 * x2[d];
        a += w3 * x3[d];
        row[d] = a;
      }
      continue;
    }
    for (; d + 2 * TILE_W <= Dh; d += 2 * TILE_W) {
      memcpy(&a0, row + d, sizeof a0);
      memcpy(&a1, row + d + TILE_W, sizeof a1);
      for (int r = r0; r < g->nr; r++) {
        float c = w[r][s];
        memcpy(&t, x[r] + d, sizeof t);
        a0 += c * t;
        memcpy(&t, x[r] + d + TILE_W, sizeof t);
        a1 += c * t;
      }
      memcpy(row + d, &a0, sizeof a0);
      memcpy(row + d + TILE_W, &a1, sizeof a1);
    }
    for (; d < Dh; d++)
      for (int r = r0; r < g->nr; r++) row[d] += w[r][s] * x[r][d];
  }
}

/* The instance's table entry. */
static const Tiles TILE(tiles) = {TILE(scores4), TILE(pv4), TILE(accumulate_rows)};
