#!/usr/bin/env bash
# tests/cli/verify_collectives.sh — pass "verify-collectives" (passes/verify_collectives.c):
# every program the training pipeline makes passes it (it is the pipeline's last pass, so
# every `loom train` and the equivalence tests run it), and hand-broken per-rank programs are
# refused before anything runs, naming the rank, the function and the op:
#   - a missing recv (pp: the first stage's backward no longer receives its gradient);
#   - two tp all-reduces swapped on one rank (rank 1 runs an edited copy: --rank-ir 1=FILE);
#   - a shape mismatch (pp: stage 0 sends an activation of the wrong shape);
#   - a deadlock (a recv whose peer never sends: the wrong tag).
LOOM=$1 ST_DIFF=$2
. "$(dirname "$0")/lib.sh"

expect_exit 0 "a 1f1b pipeline over pp=2 verifies" "$LOOM" ir models/gpt2-tiny-4l.json --passes=train --mesh pp=2 --grad-accum 2
cp "$OUT" "$TMP/pp.ir"
expect_exit 0 "and its printed form verifies again" "$LOOM" ir "$TMP/pp.ir" --passes=verify-collectives
expect_exit 0 "pp=2 x dp=2 x tp=2 (sp, ZeRO-1), interleaved, verifies" "$LOOM" ir models/gpt2-tiny-4l.json --passes=train \
  --mesh pp=2,dp=2,tp=2 --sequence-parallel true --zero 1 --grad-accum 4 --pp-schedule interleaved
expect_exit 0 "dualpipev verifies" "$LOOM" ir models/llama-tiny-4l.json --passes=train --mesh pp=2 --grad-accum 4 \
  --pp-schedule dualpipev

# A missing recv: @bwd.c0's recv of the gradient becomes a constant.
python3 - "$TMP/pp.ir" "$TMP/norecv.ir" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
t2, n = re.subn(r'(%\w+) = recv \{axis="pp", n=2, peer=1, tag=256\} : (f32\[[0-9,]+\])', r'\1 = constant {value=0} : \2', t, count=1)
assert n == 1
open(sys.argv[2], 'w').write(t2)
PY
expect_exit 2 "a missing recv" "$LOOM" ir "$TMP/norecv.ir" --passes=verify-collectives
expect_stderr_contains "rank 1 (dp=0 tp=0 cp=0 pp=1 ep=0) sends with @bwd.c1"
expect_stderr_contains "to rank 0, which never receives it: add the matching recv"

# A shape mismatch: rank 0's copy sends %h1.fc (f32[2,32,256]) where %h1.out was sent.
sed 's/send %h1.out {axis="pp", n=2, peer=1, tag=512}/send %h1.fc {axis="pp", n=2, peer=1, tag=512}/' "$TMP/pp.ir" > "$TMP/shape.ir"
check "  (the edit took)" grep -q 'send %h1.fc' "$TMP/shape.ir"
expect_exit 2 "a shape mismatch between send and recv" "$LOOM" ir "$TMP/pp.ir" --passes=verify-collectives --rank-ir 0="$TMP/shape.ir"
expect_stderr_contains "rank 1 (dp=0 tp=0 cp=0 pp=1 ep=0) receives f32[2,32,64] with @fwd.c1 (micro-batch 0)"
expect_stderr_contains "but rank 0 (dp=0 tp=0 cp=0 pp=0 ep=0) sends it f32[2,32,256]"

# A deadlock: rank 1's first recv waits for a tag nobody sends.
sed '0,/%h1.out = recv {axis="pp", n=2, peer=0, tag=512}/s//%h1.out = recv {axis="pp", n=2, peer=0, tag=999}/' "$TMP/pp.ir" > "$TMP/tag.ir"
expect_exit 2 "a recv of a tag nobody sends" "$LOOM" ir "$TMP/pp.ir" --passes=verify-collectives --rank-ir 1="$TMP/tag.ir"
expect_stderr_contains "the ranks deadlock"
expect_stderr_contains "rank 1 (dp=0 tp=0 cp=0 pp=1 ep=0) waits in @fwd.c1 (micro-batch 0)"

# Two tp all-reduces swapped on rank 1: a gradient's all-reduce moved before the norm's.
# (--overlap false: the edit below moves synchronous all-reduces; tests/cli/overlap.sh swaps starts)
expect_exit 0 "llama-tiny tp=2 with sp verifies" "$LOOM" ir models/llama-tiny.json --passes=train --mesh tp=2 --sequence-parallel true --overlap false
cp "$OUT" "$TMP/tp.ir"
python3 - "$TMP/tp.ir" "$TMP/swap.ir" <<'PY'
import sys
lines = open(sys.argv[1]).read().split('\n')
start = next(i for i, l in enumerate(lines) if l.strip().startswith('func @optimizer_step'))
ars = [i for i in range(start, len(lines)) if ' = all_reduce ' in lines[i]]
# the first all-reduce of a scalar (the norm's), and the next one of a global (a gradient)
norm = next(i for i in ars if lines[i].rstrip().endswith(': f32[]'))
grad = next(i for i in ars if i > norm and 'all_reduce $grad.' in lines[i])
moved = lines.pop(grad)
lines.insert(norm, moved)
open(sys.argv[2], 'w').write('\n'.join(lines))
PY
expect_exit 2 "two tp all-reduces swapped on rank 1" "$LOOM" ir "$TMP/tp.ir" --passes=verify-collectives --rank-ir 1="$TMP/swap.ir"
expect_stderr_contains "the tp group of rank 0 disagrees: rank 0 (dp=0 tp=0 cp=0 pp=0 ep=0) issues @optimizer_step op"
expect_stderr_contains "while rank 1 (dp=0 tp=1 cp=0 pp=0 ep=0) issues @optimizer_step op"
expect_exit 2 "--rank-ir outside the mesh" "$LOOM" ir "$TMP/tp.ir" --passes=verify-collectives --rank-ir 5="$TMP/swap.ir"
expect_stderr_contains "--rank-ir names rank 5, but the mesh has 2 ranks"
finish
