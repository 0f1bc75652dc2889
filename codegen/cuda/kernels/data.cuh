/* ---------------------------------------------------------------- embedding
   forward  bufs: table ids -> y;     i: n_ids, V, D, vocab axis + 1, the rank's coordinate
            on it (the table holds rows [c*V, (c+1)*V): other ids give zero rows; unsplit, an id
            outside [0, V) gives NaN rows)
   backward bufs: dy ids -> dtable;   i: as forward.  Deterministic without atomics: the
   block of position r works only if r is the first position holding its id; it then sums
   dy over every position with that id in position order (the reference's order) and writes
   the row.  Rows of ids that never occur are zeroed by a fill step before; with i[5] set the
   rows are added into dtable instead (an f32 gradient the table's other pieces also add into:
   lower_gemm.c's gradient trees), and no fill runs. */
template <class ST, class SY>
LOOM_DEV void loom_embedding_fwd(const LoomArgs &a) {
  const typename ST::T *table = LOOM_IN(ST, 0);
  const int *ids = (const int *)a.buf[1];
  typename SY::T *y = LOOM_OUT(SY, 2);
  const long long n = a.i[0] * a.i[2], V = a.i[1], D = a.i[2], off = a.i[3] ? a.i[4] * V : 0;
  const float other = a.i[3] ? 0.0f : __int_as_float(0x7fc00000);
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    long long r = k / D, d = k - r * D, id = ids[r] - off;
    SY::st(y, k, id >= 0 && id < V ? ST::ld(table, id * D + d) : other);
  }
}
/* The embedding plus a table of positions broadcast over the batch, x = table[id] + pos[r % T]
   in one pass (lower_fuse.c): bufs table ids pos -> y; i: as forward, then T x D (pos's
   elements).  The add rounds once, as the kernel it replaces. */
template <class ST, class SY>
LOOM_DEV void loom_embedding_pos_fwd(const LoomArgs &a) {
  const typename ST::T *table = LOOM_IN(ST, 0);
  const int *ids = (const int *)a.buf[1];
  const typename SY::T *pos = LOOM_IN(SY, 2);
  typename SY::T *y = LOOM_OUT(SY, 3);
  const long long n = a.i[0] * a.i[2], V = a.i[1], D = a.i[2], np = a.i[5];
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    long long r = k / D, d = k - r * D, id = ids[r];
    float e = id >= 0 && id < V ? ST::ld(table, id * D + d) : __int_as_float(0x7fc00000);
    SY::st(y, k, e + SY::ld(pos, k % np));
  }
}
template <class SDY, class SO>
LOOM_DEV void loom_embedding_bwd(const LoomArgs &a) {
  __shared__ int list[1024];
  __shared__ int counts[32];
  const typename SDY::T *dy = LOOM_IN(SDY, 0);
  const int *ids = (const int *)a.buf[1];
  typename SO::T *out = LOOM_OUT(SO, 2);
  const long long n = a.i[0], V = a.i[1], D = a.i[2], voff = a.i[3] ? a.i[4] * V : 0;
  const int nt = (int)blockDim.x, tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
  for (long long r = blockIdx.x; r < n; r += gridDim.x) {
    const int id = ids[r];
    if (id - voff < 0 || id - voff >= V) continue;
    bool dup = false;
    for (long long j0 = 0; j0 < r && !dup; j0 += nt) {
      long long j = j0 + tid;
      dup = __syncthreads_or(j < r && ids[j] == id) != 0;
    }
    if (dup) continue;
    for (long long d0 = 0; d0 < D; d0 += nt) {
      const long long d = d0 + tid;
      float acc = 0.0f;
      for (long long p0 = r; p0 < n; p0 += nt) {
        const long long p = p0 + tid;
        const bool hit = p < n && ids[p] == id;
        const unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) counts[warp] = __popc(mask);
        __syncthreads();
        int off = 0, total = 0;
        for (int w = 0; w < nw; w++) {
          int c = counts[w];
          if (w < warp) off += c;
          total += c;
        }
        if (hit) list[off + __popc(mask & ((1u << lane) - 1u))] = (int)(p - r);
        __syncthreads();
        if (d < D)
          for (int q = 0; q < total; q++) acc += SDY::ld(dy, (r + list[q]) * D + d);
        __syncthreads();
      }
      if (d < D) {
        const long long at = ((long long)id - voff) * D + d;
        SO::st(out, at, a.i[5] ? SO::ld(out, at) + acc : acc);
      }
    }
  }
}

/* ---------------------------------------------------------------- rope
   bufs: x -> y;  i: B, T, H, Dh, offset, inverse, seq axis + 1, seq_n, zigzag, c;  f: theta,
   factor, low_wl, high_wl (loom_rope_inv_freq).
   One thread per pair (j, j + Dh/2); the angle in double precision as the reference
   computes it.  Row t is at position loom_seq_pos(c, t, ...) + offset: with the sequence split
   over a mesh axis (context parallelism), the rank's rows are at their global positions.
   c = i[9] is the rank's coordinate on that axis (mesh axis i[6] - 1), which the runtime
   writes before the launch (RtStep.coord_at; as i[11] of the attention blocks). */
/* ir_seq_pos (ir/ir.h): the global position of row t of the L rows that rank c of n holds;
   contiguous chunks, or zigzag's half-chunks c and 2n-1-c. */
LOOM_DEV long long loom_seq_pos(long long c, long long t, long long L, long long n, bool zigzag) {
  if (!zigzag) return c * L + t;
  const long long h = L / 2;
  return t < h ? c * h + t : (2 * n - 1 - c) * h + (t - h);
}
/* The inverse frequency of pair j of Dh: theta^(-2j/Dh), f = {theta, factor, low_wl, high_wl};
   factor > 0: Llama 3.1's scaling (rt_rope_inv_freq in runtime/program.h, the same formula). */
LOOM_DEV double loom_rope_inv_freq(const double *f, long long j, long long Dh) {
  const double inv = pow(f[0], -2.0 * (double)j / (double)Dh);
  if (!(f[1] > 0.0)) return inv;
  const double wl = 2.0 * 3.14159265358979323846 / inv;
  if (wl < f[3]) return inv;
  if (wl > f[2]) return inv / f[1];
  const double sm = (1.0 / wl - 1.0 / f[2]) / (1.0 / f[3] - 1.0 / f[2]);
  return (1.0 - sm) * inv / f[1] + sm * inv;
}
template <class SX, class SY>
LOOM_DEV void loom_rope(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  typename SY::T *y = LOOM_OUT(SY, 1);
  const long long T = a.i[1], H = a.i[2], Dh = a.i[3], off = a.i[4], half = Dh / 2;
  const long long n = a.i[0] * T * H * half;
  const long long rank = a.i[9], seq_n = a.i[7];
  const bool zigzag = a.i[8] != 0;
  const double sign = a.i[5] ? -1.0 : 1.0;
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    long long j = k % half, bth = k / half, t = (bth / H) % T;
    double ang = (double)(loom_seq_pos(rank, t, T, seq_n, zigzag) + off) * loom_rope_inv_freq(a.f, j, Dh);
    float c = (float)cos(ang), s = (float)(sign * sin(ang));
    long long base = bth * Dh;
    float x0 = SX::ld(x, base + j), x1 = SX::ld(x, base + j + half);
    SY::st(y, base + j, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)));
    SY::st(y, base + j + half, __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)));
  }
}

/* ---------------------------------------------------------------- data movement
   Raw element copies (S: loom_sraw4/2/1); sizes from i[] as program.h lays them out. */
#define LOOM_GRID_LOOP(k, n) \
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < (n); k += (long long)gridDim.x * blockDim.x)

/* bufs: x -> y;  i: rank, x dims[rank], perm[rank] */
template <class S>
LOOM_DEV void loom_transpose(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  const int rank = (int)a.i[0];
  long long xs[8], yd[8], ys[8], n = 1, s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    xs[d] = s;
    s *= a.i[1 + d];
  }
  for (int d = 0; d < rank; d++) {
    yd[d] = a.i[1 + a.i[1 + rank + d]];
    ys[d] = xs[a.i[1 + rank + d]];
    n *= yd[d];
  }
  LOOM_GRID_LOOP(k, n) {
    long long rem = k, xo = 0;
    for (int d = rank - 1; d >= 0; d--) {
      long long c = rem % yd[d];
      rem /= yd[d];
      xo += c * ys[d];
    }
    y[k] = x[xo];
  }
}
/* bufs: x -> y;  i: rank, x dims[rank], start[rank], end[rank] */
template <class S>
LOOM_DEV void loom_slice(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  const int rank = (int)a.i[0];
  long long xs[8], yd[8], st[8], n = 1, s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    xs[d] = s;
    s *= a.i[1 + d];
  }
  for (int d = 0; d < rank; d++) {
    st[d] = a.i[1 + rank + d];
    yd[d] = a.i[1 + 2 * rank + d] - st[d];
    n *= yd[d];
  }
  LOOM_GRID_LOOP(k, n) {
    long long rem = k, xo = 0;
    for (int d = rank - 1; d >= 0; d--) {
      long long c = rem % yd[d];
      rem /= yd[d];
      xo += (c + st[d]) * xs[d];
    }
    y[k] = x[xo];
  }
}
/* bufs: x -> y;  i: rank, x dims[rank], low[rank], high[rank];  zeros around */
template <class S>
LOOM_DEV void loom_pad(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  const int rank = (int)a.i[0];
  long long xd[8], xs[8], yd[8], lo[8], n = 1, s = 1;
  for (int d = rank - 1; d >= 0; d--) {
    xd[d] = a.i[1 + d];
    xs[d] = s;
    s *= xd[d];
  }
  for (int d = 0; d < rank; d++) {
    lo[d] = a.i[1 + rank + d];
    yd[d] = xd[d] + lo[d] + a.i[1 + 2 * rank + d];
    n *= yd[d];
  }
  LOOM_GRID_LOOP(k, n) {
    long long rem = k, xo = 0;
    bool in = true;
    for (int d = rank - 1; d >= 0; d--) {
      long long c = rem % yd[d] - lo[d];
      rem /= yd[d];
      in = in && c >= 0 && c < xd[d];
      xo += c * xs[d];
    }
    y[k] = in ? x[xo] : (typename S::T)0;
  }
}
/* bufs: x0..x(k-1) -> y;  i: k, outer, inner, size of each input along the dim */
template <class S>
LOOM_DEV void loom_concat(const LoomArgs &a) {
  const int k = (int)a.i[0];
  typename S::T *y = LOOM_OUT(S, k);
  const long long outer = a.i[1], inner = a.i[2];
  long long Y = 0;
  for (int q = 0; q < k; q++) Y += a.i[3 + q];
  const long long n = outer * Y * inner;
  LOOM_GRID_LOOP(e, n) {
    long long in = e % inner, rest = e / inner, mid = rest % Y, o = rest / Y;
    int q = 0;
    while (q < k - 1 && mid >= a.i[3 + q]) mid -= a.i[3 + q++];
    y[e] = LOOM_IN(S, q)[(o * a.i[3 + q] + mid) * inner + in];
  }
}
/* bufs: x -> y;  i: rank (of y), y dims[rank], x element strides per y dim (0: broadcast) */
template <class S>
LOOM_DEV void loom_broadcast(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  const int rank = (int)a.i[0];
  long long n = 1;
  for (int d = 0; d < rank; d++) n *= a.i[1 + d];
  LOOM_GRID_LOOP(k, n) {
    long long rem = k, xo = 0;
    for (int d = rank - 1; d >= 0; d--) {
      long long c = rem % a.i[1 + d];
      rem /= a.i[1 + d];
      xo += c * a.i[1 + rank + d];
    }
    y[k] = x[xo];
  }
}
/* bufs: x -> y;  i: n.  A reshape (same storage) or a float -> float cast (y's storage
   rounds). */
template <class SX, class SY>
LOOM_DEV void loom_copy(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  typename SY::T *y = LOOM_OUT(SY, 1);
  LOOM_GRID_LOOP(k, a.i[0]) SY::st(y, k, (typename SY::V)SX::ld(x, k));
}
template <class S>
LOOM_DEV void loom_copy_raw(const LoomArgs &a) {
  const typename S::T *x = LOOM_IN(S, 0);
  typename S::T *y = LOOM_OUT(S, 1);
  LOOM_GRID_LOOP(k, a.i[0]) y[k] = x[k];
}
/* bufs: x -> y;  i: n, to_bool.  Between int and float: float -> int truncates. */
template <class SX, class SY>
LOOM_DEV void loom_cast(const LoomArgs &a) {
  const typename SX::T *x = LOOM_IN(SX, 0);
  typename SY::T *y = LOOM_OUT(SY, 1);
  const bool to_bool = a.i[1] != 0;
  LOOM_GRID_LOOP(k, a.i[0]) {
    double v = (double)SX::ld(x, k);
    if (to_bool) SY::st(y, k, (typename SY::V)(v != 0.0));
    else SY::st(y, k, (typename SY::V)(sizeof(typename SY::V) == 8 ? (double)(long long)v : v));
  }
}
/* bufs: -> y;  i: n;  f: value */
template <class S>
LOOM_DEV void loom_fill(const LoomArgs &a) {
  typename S::T *y = LOOM_OUT(S, 0);
  const typename S::V v = (typename S::V)(sizeof(typename S::V) == 8 ? (double)(long long)a.f[0] : (double)(float)a.f[0]);
  LOOM_GRID_LOOP(k, a.i[0]) S::st(y, k, v);
}
/* bufs: -> y;  i: rank, dims[rank], dim */
template <class S>
LOOM_DEV void loom_iota(const LoomArgs &a) {
  typename S::T *y = LOOM_OUT(S, 0);
  const int rank = (int)a.i[0], dim = (int)a.i[1 + rank];
  long long n = 1, inner = 1;
  for (int d = 0; d < rank; d++) n *= a.i[1 + d];
  for (int d = dim + 1; d < rank; d++) inner *= a.i[1 + d];
  const long long size = a.i[1 + dim];
  LOOM_GRID_LOOP(k, n) S::st(y, k, (typename S::V)((k / inner) % size));
}
/* bufs: dst x (dst in place, listed once);  i: n.  ACC: dst += x, else dst = x. */
template <class SD, class SX, bool ACC>
LOOM_DEV void loom_update(const LoomArgs &a) {
  typename SD::T *dst = LOOM_OUT(SD, 0);
  const typename SX::T *x = LOOM_IN(SX, 1);
  LOOM_GRID_LOOP(k, a.i[0]) {
    typename SD::V v = (typename SD::V)SX::ld(x, k);
    SD::st(dst, k, ACC ? SD::ld(dst, k) + v : v);
  }
}

