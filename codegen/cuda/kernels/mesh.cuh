/* ---------------------------------------------------------------- a rank's pieces
   shard_slice: x[outer, parts*mid, inner] -> y[outer, mid, inner], chunk c of the dim;
   shard_pad:   x[outer, mid, inner] -> y[outer, parts*mid, inner], zeros but chunk c.
   i: axis, size, parts, outer, mid, inner, the rank's coordinate on the axis (c = it /
   (size / parts)).  Raw elements: the storage's bytes move unchanged. */
template <class S, bool SLICE>
LOOM_DEV void loom_shard_move(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  const long long size = a.i[1], parts = a.i[2], outer = a.i[3], mid = a.i[4], inner = a.i[5];
  const long long c = a.i[6] / (size / parts), piece = mid * inner;
  const long long n = outer * (SLICE ? 1 : parts) * piece;
  LOOM_GRID_LOOP(k, n) {
    if (SLICE) {
      const long long o = k / piece, e = k - o * piece;
      y[k] = x[(o * parts + c) * piece + e];
    } else {
      const long long o = k / (parts * piece), r = k - o * parts * piece, ch = r / piece;
      y[k] = ch == c ? x[o * piece + (r - ch * piece)] : (typename S::T)0;
    }
  }
}

/* ---------------------------------------------------------------- the vocabulary-parallel loss
   target_pick: x[rows, V] targets(i32) -> y[rows] = x[r, t - c*V], 0 where the target is
   another rank's;  onehot: targets(i32) -> y[rows, V] = 1 at t - c*V, else 0.
   i: rows, V, vocab axis + 1 (0: not split), the rank's coordinate on that axis. */
template <class SX, class SY>
LOOM_DEV void loom_target_pick(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  const int *t = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long rows = a.i[0], V = a.i[1], off = a.i[2] ? a.i[3] * V : 0;
  LOOM_GRID_LOOP(r, rows) {
    const long long id = (long long)t[r] - off;
    SY::st(y, r, id >= 0 && id < V ? SX::ld(x, r * V + id) : 0.0f);
  }
}
template <class SY>
LOOM_DEV void loom_onehot(const LoomArgs &a) {
  const int *t = (const int *)a.buf[0];
  typename SY::T *y = LOOM_OUT(SY, 1);
  const long long rows = a.i[0], V = a.i[1], off = a.i[2] ? a.i[3] * V : 0;
  LOOM_GRID_LOOP(k, rows * V) {
    const long long r = k / V, d = k - r * V;
    SY::st(y, k, (long long)t[r] - off == d ? 1.0f : 0.0f);
  }
}
