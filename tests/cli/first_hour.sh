#!/usr/bin/env bash
# What a new user meets in the first hour, where the other scripts leave a gap:
#  - every flag a command accepts is listed in its --help, and every option its --help lists
#    is accepted (tests/cli/help_flags.py reads the parsers in tools/ and runs each --help);
#  - `loom sample --help`'s example runs as written on the built-in demo's weights;
#  - Ctrl-C under `| tee`: the step lines reach the pipe as they happen, and the run stops
#    within two seconds of the signal, saying where its checkpoint is.
# (Exit codes, usage errors and hostile files: cli_usage.sh, bad_inputs.sh, hostile_inputs.sh;
# signals and bitwise resume: train_signals.sh.)
LOOM=$1
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
export LOOM_THREADS=1

# 1. --help against the parsers
check "every command's --help lists exactly the flags its parser accepts" python3 tests/cli/help_flags.py "$LOOM"

# 2. loom sample --help's example, on the demo's weights (one step: the shapes are the point)
run "$LOOM" train --steps 1 -q --out "$TMP/shk.safetensors"
check "the built-in demo writes --out" test "$RC" = 0 -a -s "$TMP/shk.safetensors"
example=$("$LOOM" sample --help | sed -n '/^  loom train --out shk.safetensors/,/[^\\]$/p' | tr -d '\\\n' |
  sed 's/.*&& loom sample //; s/  */ /g')
check "loom sample --help has an example after the demo's training" test -n "$example"
eval "set -- $example"
for a; do case "$a" in models/*) check "  its spec $a exists" test -f "$a" ;; esac; done
args=()
for a; do [ "$a" = shk.safetensors ] && a=$TMP/shk.safetensors; args+=("$a"); done
expect_exit 0 "loom sample --help's example runs as written" "$LOOM" sample "${args[@]}"
expect_stdout_contains "ROMEO:"

# 4. Ctrl-C under tee: lines as they happen, a stop within 2 s, the checkpoint named
if env --default-signal=INT true 2> /dev/null; then
  env --default-signal=INT "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --steps 1000000 --save-dir "$TMP/ck" \
    > >(tee "$TMP/tee.log" > /dev/null) 2>&1 &
  pid=$!
  for i in $(seq 400); do grep -q '^step ' "$TMP/tee.log" 2> /dev/null && break; sleep 0.05; done
  check "under | tee, a step line shows while the run goes on" sh -c "grep -q '^step ' '$TMP/tee.log' && kill -0 $pid"
  t0=$(date +%s%N)
  kill -INT $pid
  wait $pid
  rc=$? ms=$((($(date +%s%N) - t0) / 1000000))
  sleep 0.2   # tee drains
  check "SIGINT: exit 130 within 2 s (took $ms ms)" test $rc = 130 -a $ms -lt 2000
  check "  it says where the checkpoint is and how to continue" \
    grep -qE "stopped by SIGINT after step [0-9]+ of 1000000; the checkpoint of step [0-9]+ is in $TMP/ck: continue with the same command and --resume $TMP/ck" "$TMP/tee.log"
  k=$(ls "$TMP/ck" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | tail -1)
  check "  and the checkpoint is complete" test -n "$k" -a -f "$TMP/ck/step_$(printf %08d "${k:-0}")/DONE"
else
  echo "SKIPPED Ctrl-C under tee: this env cannot restore SIGINT's default (--default-signal, coreutils 8.31+)"
fi

finish
