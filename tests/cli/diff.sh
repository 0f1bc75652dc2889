#!/usr/bin/env bash
# tests/cli/diff.sh — `loom diff`, the comparison every golden test relies on, must be able
# to fail: exit 0 within the tolerances, 1 beyond them, 2 for a missing tensor, a shape
# mismatch or bad usage; the table names the worst element by its index; --json for scripts.
# (The other tests call it through the st_diff wrapper CMake writes next to loom.)
# usage: bash tests/cli/diff.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

E1=tests/golden/gpt2-tiny/expected.safetensors     # logits [2,32,256], loss, grad.*, trained parameters, losses
E2=tests/golden/llama-tiny/expected.safetensors    # logits [2,32,256], loss (other values), llama's names
E3=tests/golden/llama-tiny-tied/expected.safetensors   # logits [2,32,250]
W=tests/golden/gpt2-tiny/weights.safetensors

expect_exit 0 "a file against itself, rtol 0" "$LOOM" diff $E1 $E1 --rtol 0
expect_stdout_contains "loom diff: 61 tensors within rtol 0 (atol 0), 0 not"
expect_exit 0 "two names of it" "$LOOM" diff $E1 $E1 logits loss --rtol 0
expect_stdout_contains "PASS  logits  [2,32,256]"
check "  the table has a header with every column" grep -qE 'tensor +shape +max\|a-b\| +max\|b\| +rel_err +rel_l2 +worst at +a +b' "$OUT"
expect_stdout_contains "loom diff: 2 tensors within rtol 0 (atol 0), 0 not"
expect_exit 1 "different values" "$LOOM" diff $E1 $E2 logits loss
expect_stdout_contains "FAIL  logits"
expect_stdout_contains "FAIL  loss"
expect_exit 1 "one name: different losses" "$LOOM" diff $E1 $E2 loss
check "  only the named tensor is compared" sh -c "! grep -q 'FAIL  logits' '$OUT'"
expect_exit 1 "--only loss (the st_diff spelling)" "$LOOM" diff $E1 $E2 --only loss
expect_exit 0 "--rtol=0.02 lets the losses (6.258 vs 6.353) pass" "$LOOM" diff $E1 $E2 loss --rtol=0.02
expect_exit 1 "--rtol 0.01 does not" "$LOOM" diff $E1 $E2 loss --rtol 0.01
expect_exit 0 "--atol 0.1 does (|6.258 - 6.353| = 0.095)" "$LOOM" diff $E1 $E2 loss --rtol 0 --atol 0.1
expect_exit 1 "--atol 0.09 does not" "$LOOM" diff $E1 $E2 loss --rtol 0 --atol 0.09
expect_exit 2 "shape mismatch" "$LOOM" diff $E1 $E3 logits
expect_stdout_contains "shape [2,32,256] in A but [2,32,250] in B"
expect_exit 2 "a tensor missing from A" "$LOOM" diff $E2 $W wte.weight
expect_stdout_contains "has no tensor 'wte.weight'"
expect_exit 2 "a name missing from B" "$LOOM" diff $E1 $E1 nosuch
expect_stdout_contains "ERROR nosuch"
expect_exit 2 "--prefix that names nothing" "$LOOM" diff $E1 $E1 --prefix model.
expect_exit 2 "one file only" "$LOOM" diff $E1
expect_stderr_contains "two safetensors files are needed"
expect_exit 2 "unknown option" "$LOOM" diff $E1 $E1 --frob
expect_stderr_contains "unknown option '--frob'"
expect_exit 2 "bad --rtol" "$LOOM" diff $E1 $E1 --rtol abc
expect_stderr_contains "--rtol needs a non-negative number, not abc"
expect_exit 2 "negative --atol" "$LOOM" diff $E1 $E1 --atol -1
expect_exit 2 "unreadable file" "$LOOM" diff $E1 "$TMP/none.safetensors"
expect_stderr_contains "none.safetensors"
expect_exit 0 "--help" "$LOOM" diff --help
expect_stdout_contains "usage: loom diff A.safetensors B.safetensors"

# A one-element perturbation is found, and reported where it is: flat element 100 of logits
# [2,32,256] is [0,0,100].
cp $E1 "$TMP/p.safetensors"
n=$(od -An -t u8 -N8 $E1 | tr -d ' ')
poke "$TMP/p.safetensors" $((8 + n + 4 * 100)) '\x00\x00\x80\x7f'   # logits element 100 = +inf
expect_exit 1 "an inf in A" "$LOOM" diff "$TMP/p.safetensors" $E1 logits loss
check "  the worst element is named by its index, [0,0,100], with A's value inf" grep -qE '^FAIL +logits .* \[0,0,100\] +inf ' "$OUT"
poke "$TMP/p.safetensors" $((8 + n + 4 * 100)) '\x00\x00\xc0\x7f'   # NaN
expect_exit 1 "a NaN in A" "$LOOM" diff "$TMP/p.safetensors" $E1 logits
check "  the NaN is the worst element" grep -qE '^FAIL +logits .* \[0,0,100\] +nan ' "$OUT"
poke "$TMP/p.safetensors" $((8 + n + 4 * 100)) '\x00\x00\x00\x00'   # 0: a finite change
expect_exit 1 "one changed element" "$LOOM" diff "$TMP/p.safetensors" $E1 logits --rtol 1e-6
check "  found at [0,0,100]" grep -qE '^FAIL +logits .* \[0,0,100\] +0 ' "$OUT"

# --json: one object with every figure, for scripts.
expect_exit 1 "--json" "$LOOM" diff $E1 $E2 logits loss --json
check "  --json: ok false, 2 failed, 0 passed" sh -c "grep -q '\"ok\": false' '$OUT' && grep -q '\"failed\": 2' '$OUT' && grep -q '\"passed\": 0' '$OUT'"
check "  --json: each tensor's status, shape, rel_l2 and worst index" sh -c "grep -c '\"status\": \"fail\"' '$OUT' | grep -qx 2 && grep -q '\"shape\": \"\[2,32,256\]\"' '$OUT' && grep -q '\"rel_l2\": ' '$OUT' && grep -q '\"worst_index\": \"\[' '$OUT'"
check "  --json: B's loss, 6.35279131" grep -q '"b": 6.35279131' "$OUT"
expect_exit 2 "--json with a missing tensor" "$LOOM" diff $E1 $E1 nosuch --json
check "  the error is in the JSON" grep -q '"error": "not in' "$OUT"
finish
