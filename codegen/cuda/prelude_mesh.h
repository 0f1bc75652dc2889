/* codegen/cuda/prelude_mesh.h — the prelude's part for a partitioned program's local ops: the
 * pieces a rank takes of, or puts into, a whole tensor (ops.def shard_slice, shard_pad) and the
 * vocabulary-parallel cross-entropy's pieces (target_pick, onehot).  Each depends on the
 * rank's coordinate on a mesh axis, which the runtime writes into i[] before the launch
 * (RtStep.coord_at: the lowered program is the same for every rank).  Included by
 * codegen/cuda/lower.c only, emitted after the other prelude parts (it uses the storage
 * classes and LOOM_GRID_LOOP).  The collectives themselves are NCCL calls, not kernels. */
#ifndef LOOM_CODEGEN_CUDA_PRELUDE_MESH_H
#define LOOM_CODEGEN_CUDA_PRELUDE_MESH_H

static const char cuda_prelude_mesh_text[] =
  "/* ---------------------------------------------------------------- a rank's pieces\n"
  "   shard_slice: x[outer, parts*mid, inner] -> y[outer, mid, inner], chunk c of the dim;\n"
  "   shard_pad:   x[outer, mid, inner] -> y[outer, parts*mid, inner], zeros but chunk c.\n"
  "   i: axis, size, parts, outer, mid, inner, the rank's coordinate on the axis (c = it /\n"
  "   (size / parts)).  Raw elements: the storage's bytes move unchanged. */\n"
  "template <class S, bool SLICE>\n"
  "LOOM_DEV void loom_shard_move(const LoomArgs &a) {\n"
  "  const typename S::T *x = LOOM_IN(S, 0);\n"
  "  typename S::T *y = LOOM_OUT(S, 1);\n"
  "  const long long size = a.i[1], parts = a.i[2], outer = a.i[3], mid = a.i[4], inner = a.i[5];\n"
  "  const long long c = a.i[6] / (size / parts), piece = mid * inner;\n"
  "  const long long n = outer * (SLICE ? 1 : parts) * piece;\n"
  "  LOOM_GRID_LOOP(k, n) {\n"
  "    if (SLICE) {\n"
  "      const long long o = k / piece, e = k - o * piece;\n"
  "      y[k] = x[(o * parts + c) * piece + e];\n"
  "    } else {\n"
  "      const long long o = k / (parts * piece), r = k - o * parts * piece, ch = r / piece;\n"
  "      y[k] = ch == c ? x[o * piece + (r - ch * piece)] : (typename S::T)0;\n"
  "    }\n"
  "  }\n"
  "}\n"
  "\n"
  "/* ---------------------------------------------------------------- the vocabulary-parallel loss\n"
  "   target_pick: x[rows, V] targets(i32) -> y[rows] = x[r, t - c*V], 0 where the target is\n"
  "   another rank's;  onehot: targets(i32) -> y[rows, V] = 1 at t - c*V, else 0.\n"
  "   i: rows, V, vocab axis + 1 (0: not split), the rank's coordinate on that axis. */\n"
  "template <class SX, class SY>\n"
  "LOOM_DEV void loom_target_pick(const LoomArgs &a) {\n"
  "  const typename SX::T *x = LOOM_IN(SX, 0);\n"
  "  const int *t = (const int *)a.buf[1];\n"
  "  typename SY::T *y = LOOM_OUT(SY, 2);\n"
  "  const long long rows = a.i[0], V = a.i[1], off = a.i[2] ? a.i[3] * V : 0;\n"
  "  LOOM_GRID_LOOP(r, rows) {\n"
  "    const long long id = (long long)t[r] - off;\n"
  "    SY::st(y, r, id >= 0 && id < V ? SX::ld(x, r * V + id) : 0.0f);\n"
  "  }\n"
  "}\n"
  "template <class SY>\n"
  "LOOM_DEV void loom_onehot(const LoomArgs &a) {\n"
  "  const int *t = (const int *)a.buf[0];\n"
  "  typename SY::T *y = LOOM_OUT(SY, 1);\n"
  "  const long long rows = a.i[0], V = a.i[1], off = a.i[2] ? a.i[3] * V : 0;\n"
  "  LOOM_GRID_LOOP(k, rows * V) {\n"
  "    const long long r = k / V, d = k - r * V;\n"
  "    SY::st(y, k, (long long)t[r] - off == d ? 1.0f : 0.0f);\n"
  "  }\n"
  "}\n";

#endif
