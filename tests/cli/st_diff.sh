# tests/cli/st_diff.sh — the comparison tool the golden tests rely on must be able to fail:
# exit 0 within rtol, 1 beyond it, 2 for a missing tensor, a shape mismatch or bad usage.
# usage: bash tests/cli/st_diff.sh PATH-TO-LOOM PATH-TO-ST_DIFF   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

if [ -z "${ST_DIFF:-}" ] || [ ! -x "$ST_DIFF" ]; then
  fail "st_diff is needed as the second argument (build target st_diff); got '${ST_DIFF:-}'"
  finish
fi

E1=tests/golden/gpt2-tiny/expected.safetensors     # logits [2,32,256], loss
E2=tests/golden/llama-tiny/expected.safetensors    # logits [2,32,256], loss (other values)
E3=tests/golden/llama-tiny-tied/expected.safetensors   # logits [2,32,250]
W=tests/golden/gpt2-tiny/weights.safetensors

expect_exit 0 "a file against itself, rtol 0" "$ST_DIFF" $E1 $E1 --rtol 0
expect_stdout_contains "PASS logits [2,32,256] rel_err 0"
expect_stdout_contains "PASS loss [] rel_err 0"
expect_exit 1 "different values" "$ST_DIFF" $E1 $E2
expect_stdout_contains "FAIL logits"
expect_stdout_contains "FAIL loss"
expect_exit 1 "--only loss: different losses" "$ST_DIFF" $E1 $E2 --only loss
expect_stdout_contains "FAIL loss"
check "  only the named tensor is compared" sh -c "! grep -q logits '$OUT'"
expect_exit 0 "--rtol=0.02 lets the losses (6.258 vs 6.353) pass" "$ST_DIFF" $E1 $E2 --only=loss --rtol=0.02
expect_exit 1 "--rtol 0.01 does not" "$ST_DIFF" $E1 $E2 --only loss --rtol 0.01
expect_exit 2 "shape mismatch" "$ST_DIFF" $E1 $E3 --only logits
expect_stdout_contains "shape [2,32,256] in A but [2,32,250] in B"
expect_exit 2 "a tensor missing from A" "$ST_DIFF" $E1 $W --only wte.weight
expect_stdout_contains "has no tensor 'wte.weight'"
expect_exit 2 "a name missing from B" "$ST_DIFF" $E1 $E1 --only nosuch
expect_exit 2 "--prefix that names nothing" "$ST_DIFF" $E1 $E1 --prefix model.
expect_exit 2 "one file only" "$ST_DIFF" $E1
expect_stderr_contains "usage: st_diff"
expect_exit 2 "unknown option" "$ST_DIFF" $E1 $E1 --frob
expect_exit 2 "bad --rtol" "$ST_DIFF" $E1 $E1 --rtol abc
expect_exit 2 "unreadable file" "$ST_DIFF" $E1 "$TMP/none.safetensors"
expect_exit 0 "--help" "$ST_DIFF" --help

# A one-element perturbation is found, and reported where it is.
cp $E1 "$TMP/p.safetensors"
n=$(od -An -t u8 -N8 $E1 | tr -d ' ')
poke "$TMP/p.safetensors" $((8 + n + 4 * 100)) '\x00\x00\x80\x7f'   # logits element 100 = +inf
expect_exit 1 "an inf in A" "$ST_DIFF" "$TMP/p.safetensors" $E1
expect_stdout_contains "worst at element 100"
poke "$TMP/p.safetensors" $((8 + n + 4 * 100)) '\x00\x00\xc0\x7f'   # NaN
expect_exit 1 "a NaN in A" "$ST_DIFF" "$TMP/p.safetensors" $E1 --only logits
expect_stdout_contains "worst at element 100"

finish
