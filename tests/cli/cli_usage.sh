# tests/cli/cli_usage.sh — help, usage errors and exit codes of `loom`, `loom ir`, `loom eval`.
# usage: bash tests/cli/cli_usage.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

SPEC=models/gpt2-tiny.json
G=tests/golden/gpt2-tiny
W=$G/weights.safetensors
K=$G/tokens.bin

# ---- top level
# Bare `loom` is a usage error: the usage goes to stderr and the exit code is 2.
expect_exit 2 "loom with no command" "$LOOM"
expect_stderr_contains "usage: loom COMMAND"
expect_stderr_contains "commands:"
expect_exit 0 "loom --help" "$LOOM" --help
expect_stdout_contains "usage: loom COMMAND"
expect_stdout_contains "  ir "
expect_stdout_contains "  eval "
expect_stdout_contains "exit codes: 0 success, 2 bad input or usage, 1 run-time failure"
expect_exit 0 "loom -h" "$LOOM" -h
expect_stdout_contains "usage: loom COMMAND"
expect_exit 0 "loom help" "$LOOM" help
expect_stdout_contains "usage: loom COMMAND"
expect_exit 0 "loom help ir" "$LOOM" help ir
expect_stdout_contains "usage: loom ir"
expect_exit 0 "loom --version" "$LOOM" --version
expect_stdout_contains "loom "
expect_exit 2 "unknown command" "$LOOM" frobnicate
expect_stderr_contains "unknown command 'frobnicate'"
expect_stderr_contains "usage: loom COMMAND"

# ---- loom ir
expect_exit 0 "loom ir --help" "$LOOM" ir --help
for opt in "usage: loom ir" --passes --list-passes --print-ir-after= --print-ir-after-all --dump-dir \
  --verify-each --time-passes --batch --seq "-o OUT.ir"; do
  expect_stdout_contains "$opt"
done
expect_exit 0 "loom ir -h" "$LOOM" ir -h
expect_stdout_contains "usage: loom ir"
expect_exit 0 "loom ir --list-passes" "$LOOM" ir --list-passes
for p in verify canonicalize cse dce; do expect_stdout_contains "  $p "; done
check "  --list-passes gives every pass a summary" awk 'NF < 2 { bad = 1 } END { exit bad }' "$OUT"
expect_exit 2 "loom ir without an input" "$LOOM" ir
expect_stderr_contains "loom ir: error: no input"
expect_stderr_contains "(run 'loom ir --help' for usage)"
expect_exit 2 "loom ir with an unknown option" "$LOOM" ir $SPEC --frobnicate
expect_stderr_contains "unknown option '--frobnicate'"
expect_exit 2 "loom ir with two inputs" "$LOOM" ir $SPEC models/llama-tiny.json
expect_stderr_contains "more than one input"
expect_exit 2 "loom ir --passes without a value" "$LOOM" ir $SPEC --passes
expect_stderr_contains "--passes needs"
expect_exit 2 "loom ir --dump-dir without a value" "$LOOM" ir $SPEC --dump-dir
expect_stderr_contains "--dump-dir needs"
expect_exit 2 "loom ir -o without a value" "$LOOM" ir $SPEC -o
expect_stderr_contains "-o needs"
expect_exit 2 "loom ir --print-ir-after with an unknown pass" "$LOOM" ir $SPEC --print-ir-after=nosuchpass
expect_stderr_contains "nosuchpass"
expect_exit 2 "loom ir --batch without a value" "$LOOM" ir $SPEC --batch
expect_stderr_contains "--batch needs a value"
expect_exit 2 "loom ir --batch on an .ir file" "$LOOM" ir tests/ir/ops_unary.ir --batch 2
expect_stderr_contains "applies to model specs, not to IR files"
expect_exit 2 "loom ir --batch zero" "$LOOM" ir $SPEC --batch 0
expect_stderr_contains "batch"

# ---- loom eval
expect_exit 0 "loom eval --help" "$LOOM" eval --help
for opt in "usage: loom eval" --weights --tokens --batch --seq --out "transformer."; do expect_stdout_contains "$opt"; done
expect_exit 0 "loom eval -h" "$LOOM" eval -h
expect_exit 2 "loom eval without arguments" "$LOOM" eval
expect_stderr_contains "no model spec given"
expect_stderr_contains "(run 'loom eval --help' for usage)"
expect_exit 2 "loom eval without --weights" "$LOOM" eval $SPEC --tokens $K
expect_stderr_contains "--weights is required"
expect_exit 2 "loom eval without --tokens" "$LOOM" eval $SPEC --weights $W
expect_stderr_contains "--tokens is required"
expect_exit 2 "loom eval --weights without a value" "$LOOM" eval $SPEC --tokens $K --weights
expect_stderr_contains "--weights needs a value"
expect_exit 2 "loom eval with an unknown option" "$LOOM" eval $SPEC --weights $W --tokens $K --frobnicate
expect_stderr_contains "unknown option '--frobnicate'"
expect_exit 2 "loom eval with two specs" "$LOOM" eval $SPEC models/llama-tiny.json --weights $W --tokens $K
expect_stderr_contains "more than one spec"
expect_exit 2 "loom eval on an .ir file" "$LOOM" eval tests/ir/ops_unary.ir --weights $W --tokens $K
expect_stderr_contains "eval takes a model spec (.json), not an IR file"
# --batch/--seq: the last value of each wins, as in `loom ir`, however many are given (one
# batch scored: --batches 1; the shard holds more).
expect_exit 0 "loom eval --batch 1 --batch 2 (the last wins)" "$LOOM" eval $SPEC --weights $W --tokens $K --batch 1 --batch 2 \
  --batches 1
expect_stderr_contains "eval of 64 tokens"
expect_exit 0 "loom eval --batch 1 --seq 8 --batch 2 (three overrides)" "$LOOM" eval $SPEC --weights $W --tokens $K \
  --batch 1 --seq 8 --batch 2 --batches 1
expect_stderr_contains "eval of 16 tokens"
expect_exit 0 "loom eval --seq=16 --batch=1" "$LOOM" eval $SPEC --weights=$W --tokens=$K --seq=16 --batch=1 --batches=1
expect_stderr_contains "eval of 16 tokens"
expect_stdout_contains "loss "

finish
