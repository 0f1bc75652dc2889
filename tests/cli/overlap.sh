#!/usr/bin/env bash
# tests/cli/overlap.sh — the overlap pass (passes/overlap.c) and the cpu mesh's communication
# threads (runtime/cpu/cpu_async.c, runtime/comm/comm_engine.c):
#   - bitwise: 3 training steps with --overlap true and --overlap false give the same losses,
#     gradient norms and final parameters to the bit (st_diff --rtol 0), for the tiny GPT-2
#     and Llama on one rank (no collectives: the pass has nothing to do), dp=2 with ZeRO 0, 1,
#     2 and 3, tp=2, and tp=2 with sequence parallelism (and ZeRO-3 on the reference executor);
#     and with one micro-batch a step, where ZeRO-0 all-reduces the gradients' buckets in the
#     backward (dp=2, dp=2 x tp=2, bf16, the reference executor);
#   - ZeRO-0 with one micro-batch: @grad_step all-reduces buckets, the first one waited for
#     matmuls later, @optimizer_step none; with two micro-batches they stay in @optimizer_step;
#   - the pass did something: with overlap the training IR holds starts and waits, without
#     none; ZeRO-3 gathers layer h.1's parameters only once layer h.0 has begun (not all at
#     the top), and the gradients' reduce-scatters are waited for at the end of the backward;
#   - overlap really happens: in the --trace-out timeline of an overlapped run, collectives on
#     a rank's comm track run while the same rank's compute track runs a step (not a wait);
#     without overlap they never do (they run on the compute thread); every rank has both
#     tracks;
#   - exposed communication is reported on every step line and in the summary;
#   - verify-collectives reads starts: two starts swapped on one rank are refused;
#   - the cuda lowering takes starts, waits, ring transfers and all_to_allv, and refuses a
#     pipeline's transfers naming the op;
#   - a bad --overlap value is refused.
LOOM=$1 ST_DIFF=$2
. "$(dirname "$0")/lib.sh"
unset LOOM_LIBCUDA LOOM_LIBNVRTC LOOM_LIBCUBLASLT

# ---- bitwise: overlap on against off ----
bitwise() {   # model, description, flags...
  local m=$1 what=$2
  shift 2
  local spec=tests/golden/$m/train_spec.json
  run "$LOOM" train "$spec" -q --steps 3 --overlap false --out "$TMP/off.st" "$@"
  if [ "$RC" -ne 0 ]; then fail "$m $what: the run without overlap failed"; show_last; return; fi
  run "$LOOM" train "$spec" -q --steps 3 --overlap true --out "$TMP/on.st" "$@"
  if [ "$RC" -ne 0 ]; then fail "$m $what: the run with overlap failed"; show_last; return; fi
  run "$ST_DIFF" "$TMP/on.st" "$TMP/off.st" --rtol 0
  if [ "$RC" -eq 0 ]; then pass "$m $what: overlap on = off, bitwise ($(tail -1 "$OUT" | grep -o '[0-9]* tensors'))"
  else fail "$m $what: overlap changes results"; grep FAIL "$OUT" | head -5; fi
}
for m in gpt2-tiny llama-tiny; do
  bitwise $m "one rank"
  bitwise $m "dp=2" --mesh dp=2
  bitwise $m "dp=2 ZeRO-1" --mesh dp=2 --zero 1
  bitwise $m "dp=2 ZeRO-2" --mesh dp=2 --zero 2
  bitwise $m "dp=2 ZeRO-3" --mesh dp=2 --zero 3
  bitwise $m "tp=2" --mesh tp=2
  bitwise $m "tp=2 with sp" --mesh tp=2 --sequence-parallel true
done
# the reference executor runs starts and waits too (a start completes its collective at once)
bitwise gpt2-tiny "dp=2 ZeRO-3, reference executor" --mesh dp=2 --zero 3 --backend ref
# one micro-batch a step: ZeRO-0 all-reduces the gradients' buckets in the backward
for m in gpt2-tiny llama-tiny; do
  bitwise $m "dp=2, one micro-batch (buckets all-reduced in the backward)" --mesh dp=2 --grad-accum 1
  bitwise $m "dp=2 x tp=2, one micro-batch" --mesh dp=2,tp=2 --grad-accum 1
done
bitwise llama-tiny-tied "dp=2, one micro-batch, bf16" --mesh dp=2 --grad-accum 1 --precision bf16
bitwise gpt2-tiny "dp=2, one micro-batch, reference executor" --mesh dp=2 --grad-accum 1 --backend ref

# ---- ZeRO-0 with one micro-batch: DDP's buckets, reduced while the backward runs ----
expect_exit 0 "the training IR at dp=2, one micro-batch" "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=2 --grad-accum 1
awk '/func @grad_step/,/^  }/' "$OUT" > "$TMP/gs1.ir"
awk '/func @optimizer_step/,/^  }/' "$OUT" > "$TMP/os1.ir"
nb=$(grep -c 'all_reduce_start %[0-9]* ' "$TMP/gs1.ir")
check "one micro-batch: @grad_step all-reduces the gradients in $nb buckets (concats of several)" \
  test "$nb" -ge 2 -a "$(grep -c ' = concat ' "$TMP/gs1.ir")" = "$nb"
check "one micro-batch: @optimizer_step all-reduces no gradient" test "$(grep -c 'all_reduce' "$TMP/os1.ir")" = 0
b1=$(grep -n 'all_reduce_start %[0-9]* ' "$TMP/gs1.ir" | head -1 | cut -d: -f1)
b1v=$(grep 'all_reduce_start %[0-9]* ' "$TMP/gs1.ir" | head -1 | awk '{print $1}')
b1w=$(awk -v v="$b1v" '$3 == "wait" && $4 == v { print NR; exit }' "$TMP/gs1.ir")
mm=$(sed -n "${b1},${b1w:-0}p" "$TMP/gs1.ir" | grep -c ' = matmul ')
check "the first bucket's all-reduce runs while the backward goes on: waited for $((${b1w:-0} - b1)) ops later, after $mm matmuls" \
  test -n "$b1w" -a "$mm" -ge 4
expect_exit 0 "the training IR at dp=2, two micro-batches" "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=2 --grad-accum 2
check "two micro-batches: the gradients are all-reduced once, in @optimizer_step (not each micro-batch)" \
  test "$(awk '/func @grad_step/,/^  }/' "$OUT" | grep -c 'all_reduce_start %[0-9]* ')" = 0 -a \
  "$(awk '/func @optimizer_step/,/^  }/' "$OUT" | grep -c 'all_reduce_start')" -ge 2

# ---- what the pass moved (the tiny GPT-2 at dp=2 with ZeRO-3) ----
expect_exit 0 "the training IR with overlap" "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=2 --zero 3
cp "$OUT" "$TMP/on.ir"
expect_exit 0 "the training IR without overlap" "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=2 --zero 3 --overlap false
cp "$OUT" "$TMP/off.ir"
starts=$(grep -c '_start ' "$TMP/on.ir")
waits=$(grep -c ' = wait ' "$TMP/on.ir")
check "with overlap: $starts starts and $waits waits, one wait each" test "$starts" -gt 0 -a "$starts" = "$waits"
check "without overlap: no starts, no waits" test "$(grep -c '_start \| = wait ' "$TMP/off.ir")" = 0
check "as many collectives either way" test "$starts" = "$(grep -cE ' = (all_reduce|all_gather|reduce_scatter|all_to_all) ' "$TMP/off.ir")"
# @grad_step's lines: where h.1's first gather starts, where h.0's first wait is, the top
awk '/func @grad_step/,/^  }/' "$TMP/on.ir" > "$TMP/gs.ir"
h1=$(grep -n 'all_gather_start \$h\.1\.' "$TMP/gs.ir" | head -1 | cut -d: -f1)
h0w=$(grep -n ' = wait %h\.0\.' "$TMP/gs.ir" | head -1 | cut -d: -f1)
check "ZeRO-3 prefetch: h.1's gathers start after h.0's first wait (line $h1 > $h0w), not at the top" \
  test -n "$h1" -a -n "$h0w" -a "${h1:-0}" -gt "${h0w:-0}"
inflight=$(awk '/all_gather_start \$h\./ { n++; if (n > most) most = n } / = wait %h\./ { n-- } END { print most }' "$TMP/gs.ir")
per_layer=$(grep -c 'all_gather_start \$h\.0\.' "$TMP/gs.ir")
check "ZeRO-3 prefetch window: at most two layers' gathers in flight ($inflight, a layer has up to $per_layer)" \
  test "$inflight" -le $((2 * per_layer))
first_rs=$(grep -n 'reduce_scatter_start' "$TMP/gs.ir" | head -1 | cut -d: -f1)
first_rs_wait=$(awk -v v="$(grep 'reduce_scatter_start' "$TMP/gs.ir" | head -1 | awk '{print $1}')" '$4 == v && $3 == "wait" { print NR; exit }' "$TMP/gs.ir")
# between them the backward goes on (matmuls) and the next gradients' reduce-scatters start:
# the wait comes with the window's (OVERLAP_WINDOW = 4) next start, not at once
between=$(sed -n "${first_rs},${first_rs_wait:-0}p" "$TMP/gs.ir")
rs_between=$(echo "$between" | grep -c 'reduce_scatter_start')
mm_between=$(echo "$between" | grep -c ' = matmul ')
check "the first gradient reduce-scatter is waited for $((first_rs_wait - first_rs)) ops after its start, after $mm_between matmuls and $((rs_between - 1)) more reduce-scatter starts" \
  test -n "$first_rs_wait" -a "$mm_between" -ge 1 -a "$rs_between" -ge 4

# ---- overlap that happens: the timeline ----
overlapping() {   # trace -> "ranks comm_events overlapped": comm events that overlap a compute step of their rank
  python3 - "$1" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
names = {e["tid"]: e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M"}
ev = [e for e in t["traceEvents"] if e["ph"] == "X"]
ranks = sorted({n.split()[1] for n in names.values()})
tracks_ok = all(("rank %s compute" % r) in names.values() and ("rank %s comm" % r) in names.values() for r in ranks)
comm = [e for e in ev if e["cat"] == "comm"]
work = [e for e in ev if e["cat"] == "compute" and not e["name"].startswith("wait ")]
hits = 0
for c in comm:
    rank = c["tid"] // 2
    a, b = c["ts"], c["ts"] + c["dur"]
    if any(w["tid"] // 2 == rank and w["ts"] < b and a < w["ts"] + w["dur"] for w in work):
        hits += 1
have_both = all(any(e["tid"] == tid for e in ev) for tid in names)
print(len(ranks), len(comm), hits, int(tracks_ok and have_both))
PY
}
for o in true false; do
  expect_exit 0 "dp=2 ZeRO-3 with --overlap $o --trace-out" "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --steps 3 \
    --mesh dp=2 --zero 3 --overlap $o --trace-out "$TMP/trace-$o.json"
  expect_stdout_contains "wrote the measured timeline to $TMP/trace-$o.json"
  expect_stdout_contains "comm wait: "
  check "  every step line reports the exposed communication" test "$(grep -c '^step .*| comm wait [0-9.]* ms (max [0-9.]*)$' "$OUT")" = 3
  read -r ranks comm hits tracks < <(overlapping "$TMP/trace-$o.json")
  check "  the timeline has a compute and a comm track with events for each of its $ranks ranks" test "$tracks" = 1 -a "$ranks" = 2
  if [ $o = true ]; then
    check "  overlap: $hits of $comm collectives ran while their rank computed" test "$hits" -gt 0
  else
    check "  no overlap: none of $comm collectives ran while their rank computed ($hits)" test "$hits" = 0
  fi
done

# ---- verify-collectives reads starts ----
expect_exit 0 "llama-tiny tp=2 with overlap verifies" "$LOOM" ir models/llama-tiny.json --passes=train --mesh tp=2
cp "$OUT" "$TMP/tp.ir"
python3 - "$TMP/tp.ir" "$TMP/swap.ir" <<'PY'
import sys
lines = open(sys.argv[1]).read().split('\n')
start = next(i for i, l in enumerate(lines) if l.strip().startswith('func @optimizer_step'))
s = [i for i in range(start, len(lines)) if '_start ' in lines[i]]
# the norm's first start (a scalar), and the gradient start issued just before it: the
# gradient's start moves after the norm's (it reads a global, its wait comes later: valid)
norm = next(i for i in s if lines[i].rstrip().endswith(': f32[]'))
grad = max(i for i in s if i < norm and 'all_reduce_start $grad.' in lines[i])
lines.insert(norm, lines.pop(grad))
open(sys.argv[2], 'w').write('\n'.join(lines))
PY
expect_exit 2 "two starts swapped on rank 1" "$LOOM" ir "$TMP/tp.ir" --passes=verify-collectives --rank-ir 1="$TMP/swap.ir"
expect_stderr_contains "the tp group of rank 0 disagrees"
expect_stderr_contains "_start"

# ---- the CUDA lowering: starts and waits become NCCL steps (issue 15), and so do ring
#      attention's send/recv, expert parallelism's all_to_allv and a pipeline's transfers to
#      fixed ranks ----
expect_exit 0 "cuda lowering of an overlapped mesh program" env LOOM_LIBCUDA=/nonexistent "$LOOM" ir models/gpt2-tiny.json \
  --passes=train,lower --mesh dp=2 --zero 3 --target cuda --emit=cuda -o "$TMP/z3.cu"
expect_exit 0 "cuda lowering of ring attention (send/recv)" env LOOM_LIBCUDA=/nonexistent "$LOOM" ir models/llama-tiny.json \
  --passes=train,lower --mesh cp=2 --target cuda --emit=cuda -o "$TMP/cp.cu"
expect_exit 0 "cuda lowering of expert parallelism (all_to_allv)" env LOOM_LIBCUDA=/nonexistent "$LOOM" ir models/mixtral-tiny.json \
  --passes=train,lower --mesh ep=2 --target cuda --emit=cuda -o "$TMP/ep.cu"
expect_exit 0 "cuda lowering of a pipeline (send/recv to fixed ranks)" env LOOM_LIBCUDA=/nonexistent "$LOOM" ir \
  models/gpt2-tiny-4l.json --passes=train,lower --mesh pp=2 --target cuda --emit=cuda -o "$TMP/pp.cu"

# ---- bad input ----
expect_exit 2 "--overlap maybe" "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --steps 1 --overlap maybe
expect_stderr_contains "overlap"
finish
