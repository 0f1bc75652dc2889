#!/usr/bin/env bash
# Output and stopping (issue 29, section 2): step lines reach a file or a pipe as they happen;
# SIGINT / SIGTERM finish the step in flight, write a checkpoint (--save-dir), flush --log,
# print the summary and exit 130 / 143, on one rank, the CPU mesh (threads), a pipeline and a
# compiled executable; the run resumed from that checkpoint equals the uninterrupted run bit
# for bit.  (The CUDA mesh's ranks: tests/cuda_emu/mesh.sh.)
LOOM=$1
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
spec=tests/golden/gpt2-tiny/train_spec.json
# A constant learning rate (warmup 0, min-lr = lr): a run of many steps stopped at step K and
# resumed to K+2 follows the same schedule as an uninterrupted run of K+2 steps.
flat=(--warmup 0 --lr 0.01 --min-lr 0.01)
export LOOM_THREADS=1

# Starts CMD with stdout into $1.out, waits for its first step line, sends signal $2, waits for
# the end; RC its exit status.  "none" sends nothing (the caller does).
signal_after_first_step() {
  local base=$1 sig=$2
  shift 2
  LAST="$*"
  "$@" > "$base.out" 2> "$base.err" &
  PID=$!
  local i
  for i in $(seq 1200); do grep -q '^step ' "$base.out" 2> /dev/null && break; kill -0 $PID 2> /dev/null || break; sleep 0.05; done
  [ "$sig" != none ] && kill -"$sig" $PID 2> /dev/null
  wait $PID
  RC=$?
  OUT=$base.out ERR=$base.err
}

# 1. line-buffered: a file and a pipe get each step line as it is printed.  The run is killed
#    (-9: no chance to flush) after its first step line shows: what the file holds then ends
#    with a whole line (block buffering would hold back 4 KB and cut a line at the kill).
for how in file pipe; do
  rm -f "$TMP/lb.out" "$TMP/fifo"
  if [ $how = file ]; then
    "$LOOM" train $spec --steps 1000000 "${flat[@]}" > "$TMP/lb.out" 2> "$TMP/lb.err" &
  else   # a pipe: loom writes into a FIFO that cat drains into the file
    mkfifo "$TMP/fifo"
    cat "$TMP/fifo" > "$TMP/lb.out" &
    "$LOOM" train $spec --steps 1000000 "${flat[@]}" > "$TMP/fifo" 2> "$TMP/lb.err" &
  fi
  pid=$!
  seen=0
  for i in $(seq 1200); do grep -q '^step ' "$TMP/lb.out" 2> /dev/null && { seen=1; break; }; sleep 0.05; done
  still=0; kill -0 $pid 2> /dev/null && still=1
  kill -9 $pid 2> /dev/null
  wait 2> /dev/null
  last=$(tail -c 1 "$TMP/lb.out" | od -An -c | tr -d ' ')
  check "stdout to a $how: a step line shows while the run goes on, and a kill -9 leaves whole lines only" \
    test $seen = 1 -a $still = 1 -a "$last" = '\n'
done

# 1b. no silent phase before step 1: each one's line, with its time, in order; -q keeps quiet
run "$LOOM" train $spec --steps 1
check "the phases before step 1 each say what they do and how long it took" sh -c "
  grep -n -e '^built the training step of .* in [0-9.]* s' -e '^lowered to cpu kernels in [0-9.]* s' \
    -e '^JIT-compiling the kernels with LLVM \.\.\.' -e '^JIT-compiled [0-9]* kernels in [0-9.]* s' \
    -e '^loaded the weights from .* in [0-9.]* s' -e '^step ' '$OUT' | cut -d: -f1 | tr '\n' ' ' | grep -qx '1 2 3 4 5 6 '"
run "$LOOM" train $spec --steps 1 -q
check "  -q: none of them" test ! -s "$OUT"

# 2. SIGTERM on one rank: the step in flight finishes, then checkpoint, summary, exit 143
signal_after_first_step "$TMP/one" TERM "$LOOM" train $spec --steps 1000000 "${flat[@]}" --save-dir "$TMP/ck1" \
  --log "$TMP/one.jsonl"
if [ "$RC" = 143 ]; then pass "SIGTERM: exit 143"; else fail "SIGTERM: exit $RC, expected 143"; show_last; fi
expect_stderr_matches "stopped by SIGTERM after step [0-9]+ of 1000000; the checkpoint of step [0-9]+ is in .*ck1: continue with the same command and --resume"
expect_stdout_contains "done: "
k=$(ls "$TMP/ck1" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
check "SIGTERM: the checkpoint of the last step is complete" test -n "$k" -a -f "$TMP/ck1/step_$(printf %08d "${k:-0}")/DONE"
check "SIGTERM: --log holds one whole JSON line per step run" \
  test "$(wc -l < "$TMP/one.jsonl")" = "$k" -a "$(tail -c 1 "$TMP/one.jsonl" | od -An -c | tr -d ' ')" = '\n'
# resumed to K+2 = the uninterrupted run of K+2 steps, bit for bit
if [ -n "$k" ]; then
  run "$LOOM" train $spec -q --steps $((k + 2)) "${flat[@]}" --resume "$TMP/ck1" --allow-changes --out "$TMP/res1.st"
  run "$LOOM" train $spec -q --steps $((k + 2)) "${flat[@]}" --out "$TMP/full1.st"
  check "SIGTERM at step $k, resumed to step $((k + 2)): bitwise the uninterrupted run" cmp -s "$TMP/res1.st" "$TMP/full1.st"
fi

# 3. SIGINT (Ctrl-C): exit 130.  A background job of a script ignores SIGINT (and loom keeps an
#    ignored signal ignored), so the run starts with SIGINT's default restored.
if env --default-signal=INT true 2> /dev/null; then
  signal_after_first_step "$TMP/int" INT env --default-signal=INT "$LOOM" train $spec --steps 1000000 "${flat[@]}"
  if [ "$RC" = 130 ]; then pass "SIGINT: exit 130"; else fail "SIGINT: exit $RC, expected 130"; show_last; fi
  expect_stderr_contains "stopped by SIGINT after step"
  expect_stderr_contains "nothing saved (give --save-dir D"
  expect_stdout_contains "done: "
else
  echo "SKIPPED SIGINT: this env cannot restore SIGINT's default (--default-signal, coreutils 8.31+)"
fi

# 3b. a second signal ends the run at once: stopped (SIGSTOP) after its first step line, the run
#     gets SIGINT and SIGTERM, then SIGCONT: both are handled together, the second exits at
#     once (130 or 143, whichever the kernel hands over second), with no stop message and no
#     checkpoint of a stop
if env --default-signal=INT true 2> /dev/null; then
  env --default-signal=INT "$LOOM" train $spec --steps 1000000 "${flat[@]}" --save-dir "$TMP/ck2x" > "$TMP/two.out" \
    2> "$TMP/two.err" &
  pid=$!
  for i in $(seq 1200); do grep -q '^step ' "$TMP/two.out" 2> /dev/null && break; sleep 0.05; done
  kill -STOP $pid; kill -INT $pid; kill -TERM $pid; kill -CONT $pid
  wait $pid
  RC=$? OUT=$TMP/two.out ERR=$TMP/two.err LAST="two signals"
  if [ "$RC" = 130 ] || [ "$RC" = 143 ]; then pass "two signals: exit $RC at once"; else fail "two signals: exit $RC"; show_last; fi
  expect_stderr_lacks "stopped by"
  check "  no checkpoint and no summary" sh -c "! ls '$TMP/ck2x' | grep -q '^step_' && ! grep -q '^done: ' '$TMP/two.out'"
fi

# 4. the CPU mesh (ranks as threads) and a pipeline: every rank stops after the same step; the
#    resumed run equals the uninterrupted one bit for bit
for layout in "dp=2" "pp=2"; do
  signal_after_first_step "$TMP/mesh" TERM "$LOOM" train $spec --steps 1000000 "${flat[@]}" --mesh $layout \
    --save-dir "$TMP/ck-$layout"
  if [ "$RC" = 143 ]; then pass "$layout: SIGTERM, exit 143"; else fail "$layout: exit $RC, expected 143"; show_last; fi
  expect_stderr_contains "stopped by SIGTERM after step"
  k=$(ls "$TMP/ck-$layout" | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
  if [ -n "$k" ]; then
    run "$LOOM" train $spec -q --steps $((k + 2)) "${flat[@]}" --mesh $layout --resume "$TMP/ck-$layout" --allow-changes \
      --out "$TMP/res.st"
    run "$LOOM" train $spec -q --steps $((k + 2)) "${flat[@]}" --mesh $layout --out "$TMP/full.st"
    check "$layout: stopped at step $k, resumed to $((k + 2)): bitwise the uninterrupted run" cmp -s "$TMP/res.st" "$TMP/full.st"
  else
    fail "$layout: no checkpoint written on SIGTERM"
  fi
done

# 5. a compiled executable
if "$LOOM" compile $spec -q -o "$TMP/trainer" > "$TMP/c.log" 2>&1; then
  signal_after_first_step "$TMP/exe" TERM "$TMP/trainer" --steps 1000000 --lr 0.01 --min-lr 0.01 --warmup 0 \
    --save-dir "$TMP/ck-exe"
  if [ "$RC" = 143 ]; then pass "compiled executable: SIGTERM, exit 143"; else fail "compiled executable: exit $RC"; show_last; fi
  expect_stderr_contains "$TMP/trainer: stopped by SIGTERM after step"   # its own name, not loom's
  expect_stderr_lacks "loom: stopped by"
  check "compiled executable: a checkpoint was written" test -n "$(ls "$TMP/ck-exe" | grep -x 'step_[0-9]*')"
else
  fail "loom compile"; cat "$TMP/c.log"
fi
finish
