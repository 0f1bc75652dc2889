#!/usr/bin/env bash
# tests/cli/pass_hooks.sh — the pass manager's hooks on train, eval and compile as on ir
# (issue 30): --print-ir-after, --time-passes, --dump-dir, --verify-each; and a failing pass's
# reproducer: the IR before the pass, which parses, and rerun.sh, whose `loom ir` line fails
# the same way; a refusal of the input without --dump-dir leaves no reproducer behind.
# usage: bash tests/cli/pass_hooks.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
spec=tests/golden/gpt2-tiny/train_spec.json
G=tests/golden/gpt2-tiny

expect_exit 0 "loom train --print-ir-after=optimizer --time-passes" "$LOOM" train $spec --steps 1 -q \
  --print-ir-after=optimizer --time-passes
expect_stderr_contains "# ----- IR after optimizer"
expect_stderr_contains "func @optimizer_step"
expect_stderr_matches "# pass fuse +[0-9.]+ ms"

expect_exit 0 "loom eval --time-passes --verify-each" "$LOOM" eval models/gpt2-tiny.json --weights $G/weights.safetensors \
  --tokens $G/tokens.bin --time-passes --verify-each
expect_stderr_matches "# pass memory-plan +[0-9.]+ ms"
expect_stdout_contains "loss "

expect_exit 0 "loom compile --dump-dir" "$LOOM" compile $spec -q -o "$TMP/exe" --dump-dir "$TMP/dump"
check "  the dumps of every pass are written" test -s "$TMP/dump/00-input.ir" -a -s "$TMP/dump/04-autodiff.ir"
expect_exit 0 "  and parse back" "$LOOM" ir "$TMP/dump/04-autodiff.ir" --passes=verify -o "$TMP/reparsed.ir"

# recompute auto cannot fit 1 KB: the pass fails (a refusal of the input)
expect_exit 2 "loom train: a failing pass with --dump-dir" "$LOOM" train $spec --steps 1 -q --recompute auto \
  --memory-budget 1KB --dump-dir "$TMP/fail"
expect_stderr_contains "in pass 'recompute'"
expect_stderr_contains "reproducer: $TMP/fail/before-recompute.ir"
check "  before-recompute.ir and rerun.sh are written" test -s "$TMP/fail/before-recompute.ir" -a -s "$TMP/fail/rerun.sh"
expect_exit 0 "  the IR before the pass parses and verifies" "$LOOM" ir "$TMP/fail/before-recompute.ir" --passes=verify \
  -o "$TMP/before.ir"
rerun=$(grep '^loom ir ' "$TMP/fail/rerun.sh")
check "  rerun.sh names the pipeline up to the pass" test -n "$rerun"
expect_exit 2 "  rerun.sh's command fails the same way" bash -c "${rerun/#loom /\"$LOOM\" }"
expect_stderr_contains "in pass 'recompute': --memory-budget 1000 B per rank cannot be met"

mkdir -p "$TMP/tmpdir"
expect_exit 2 "a refusal without --dump-dir" env TMPDIR="$TMP/tmpdir" "$LOOM" train $spec --steps 1 -q \
  --recompute auto --memory-budget 1KB
expect_stderr_lacks "reproducer"
check "  leaves no reproducer in TMPDIR" test -z "$(ls -A "$TMP/tmpdir")"

expect_exit 2 "an unknown pass in --print-ir-after is a usage error" "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens $G/tokens.bin --print-ir-after=nosuchpass
expect_stderr_contains "unknown pass"
finish
