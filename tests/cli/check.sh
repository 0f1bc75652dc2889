#!/usr/bin/env bash
# tests/cli/check.sh — `loom check DIR`: the checked-in goldens (README "Golden folders") pass
# on the reference executor and the cpu backend, on one rank and on meshes, in fp32 and bf16;
# a golden that loom does not reproduce fails with the cell named; bad golden folders (a
# missing file, a tensor of the wrong shape, a config that does not match the weights,
# broken golden.json) are refused with exit 2 and the file named.
# usage: bash tests/cli/check.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
# without a GPU driver, whatever the environment says (the emulated device has its own test)
unset LOOM_LIBCUDA LOOM_LIBNVRTC LOOM_LIBCUBLASLT

expect_exit 0 "gpt2-tiny on ref and cpu, one rank and dp=2 x tp=2" "$LOOM" check tests/golden/gpt2-tiny \
  --backend ref,cpu --mesh dp=2,tp=2
check "  a row per backend and layout, every cell passing" sh -c "
  grep -qE '^ref +1 rank +fp32 +pass .* pass .* pass .* pass ' '$OUT' &&
  grep -qE '^cpu +1 rank +fp32 +pass .* pass .* pass .* pass ' '$OUT' &&
  grep -qE '^cpu +dp=2,tp=2 +fp32 +pass .* pass .* - 1 rank only +pass ' '$OUT'"
expect_stdout_contains "loom check: every cell within its tolerance"
sed 's/^/    | /' "$OUT"
expect_exit 0 "llama-tiny (two training shards) on cpu: tp=2 with sequence parallelism, fp32 and bf16" "$LOOM" check \
  tests/golden/llama-tiny --backend cpu --mesh tp=2,sp --precision fp32,bf16
check "  bf16 rows are compared with fp32 (marked *)" grep -qE '^cpu +tp=2,sp +bf16 +- +- +- +pass [0-9.e-]+ / 2e-02\*' "$OUT"
expect_exit 0 "llama-tiny-tied with no --backend: every backend this machine has" "$LOOM" check tests/golden/llama-tiny-tied
expect_stdout_contains "skipped: cuda"
check "  ref and cpu ran" sh -c "grep -qE '^ref ' '$OUT' && grep -qE '^cpu ' '$OUT'"

# A golden loom does not reproduce: one logit set to 0.
cp -r tests/golden/gpt2-tiny "$TMP/g"
n=$(od -An -t u8 -N8 "$TMP/g/expected.safetensors" | tr -d ' ')
off=$(grep -ao '"logits":{"dtype":"F32","shape":\[[0-9,]*\],"data_offsets":\[[0-9]*' "$TMP/g/expected.safetensors" | grep -o '[0-9]*$')
poke "$TMP/g/expected.safetensors" $((8 + n + off + 4 * 7)) '\x00\x00\x00\x00'   # logit 7 becomes 0
expect_exit 1 "a golden whose logit 7 is 0: fails" "$LOOM" check "$TMP/g" --backend cpu
expect_stdout_contains "FAIL cpu 1 rank fp32 logits: logits relative error"
check "  the other cells still pass" grep -qE '^cpu +1 rank +fp32 +FAIL .* pass .* pass .* pass ' "$OUT"
expect_exit 0 "  ... and passes with --rtol-forward 1 (the change is below max|logits|)" "$LOOM" check "$TMP/g" --backend cpu --rtol-forward 1

# Bad golden folders.
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && rm "$TMP/g/weights.safetensors"
expect_exit 2 "weights.safetensors missing" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "weights.safetensors is missing"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && rm "$TMP/g/config.json"
expect_exit 2 "no config.json and no spec.json" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "no config.json"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && rm "$TMP/g/golden.json"
expect_exit 2 "golden.json missing" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "golden.json is missing"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && printf '{"batch": 2, "seq": }' > "$TMP/g/golden.json"
expect_exit 2 "golden.json is not JSON" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_matches "golden.json:1:[0-9]+:"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && sed -i 's/"batch": 2/"batch": 4/' "$TMP/g/golden.json"
expect_exit 2 "logits of the wrong shape for golden.json's batch" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "logits is [2,32,256] (rank 3) and loss has rank 0, but golden.json says batch 4 x seq 32"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && sed -i 's/"n_embd": 64/"n_embd": 128/' "$TMP/g/config.json"
expect_exit 2 "a config that does not match the weights" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "loom eval refuses the golden's files"
expect_stderr_contains "wte.weight"
rm -rf "$TMP/g" && cp -r tests/golden/gpt2-tiny "$TMP/g" && sed -i 's/"steps": 3/"steps": 5/' "$TMP/g/golden.json"
expect_exit 2 "golden.json's steps do not match the expected losses" "$LOOM" check "$TMP/g" --backend cpu
expect_stderr_contains "losses has 3 entries but golden.json says 5 training steps"

# Usage.
expect_exit 2 "no folder" "$LOOM" check
expect_stderr_contains "no golden folder given"
expect_exit 2 "not a folder" "$LOOM" check "$TMP/nosuch"
expect_stderr_contains "not a folder"
expect_exit 2 "unknown backend" "$LOOM" check tests/golden/gpt2-tiny --backend tpu
expect_stderr_contains "unknown backend 'tpu'"
expect_exit 2 "bad mesh" "$LOOM" check tests/golden/gpt2-tiny --mesh dp2
expect_exit 1 "cuda asked for on a machine without a GPU: not a pass" "$LOOM" check tests/golden/gpt2-tiny --backend cuda
expect_stdout_contains "skipped: cuda:"
expect_exit 0 "--help" "$LOOM" check --help
expect_stdout_contains "Why these tolerances"
finish
