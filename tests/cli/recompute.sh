#!/usr/bin/env bash
# tests/cli/recompute.sh — activation recomputation (pass "recompute", passes/recompute.c).
#   - bitwise: 2 training steps with --recompute selective, full and auto give exactly the
#     parameters and losses of --recompute none (loom diff --rtol 0), for the four tiny models
#     on one rank, on dp=2 with ZeRO-3 and on tp=2 (cpu backend, batch 8; auto with a budget halfway
#     between none's and selective's planned peaks, so it must recompute something; where
#     selective's peak is not below none's, as on GPT-2 with ZeRO-3 and overlap, auto must
#     refuse a budget under none's instead).
#   - memory: every run's planned @grad_step arena equals the arena the cpu backend measured
#     (the highest byte its first call wrote; runtime/cpu/cpu_exec.h), on every rank, and
#     equals what `loom ir --passes=train,lower --memory` plans (its total less the state).
#   - every class at once (selective:norm,act,eltwise,rope,attn) on Llama, bitwise too;
#   - the clones are visible (%rc.*), survive cse, and the IR round-trips with them.
#   - auto fits gpt2-tiny-4l (batch 8) and GPT-2 124M (8 x 1024) under three budgets each
#     (the planned peak of --memory is under the budget); an impossible budget is refused
#     before running (exit 2) with the smallest reachable peak; bad flags are refused.
#   - with pp=2: selective and full bitwise none (1f1b and zb-h1 on the tiny GPT-2 and Llama,
#     interleaved and dualpipev on the 4-layer GPT-2); the first stage's stash falls none > selective > full (full: about its layers'
#     inputs); auto fits the worst pp rank's peak, and an impossible budget is refused.
LOOM=$1 ST_DIFF=$2
. "$(dirname "$0")/lib.sh"
unset LOOM_LIBCUDA LOOM_LIBNVRTC LOOM_LIBCUBLASLT
"$LOOM" data data/shakespeare.txt -o "$TMP/d.bin" > /dev/null 2>&1

# the number after "(" on the --memory line that starts with $2 (bytes)
mem_bytes() { grep -E "^  $2 " "$1" | sed -E 's/.*\(([0-9]+) bytes.*/\1/' | head -1; }
# planned peak in bytes of `loom ir ... --memory` (args: spec flags...)
planned_total() {
  "$LOOM" ir "$@" --passes=train,lower --memory > "$TMP/mem.txt" 2> "$TMP/mem.err" || { cat "$TMP/mem.err" >&2; echo 0; return; }
  mem_bytes "$TMP/mem.txt" total
}
planned_arena() {   # the largest function arena: total less parameters, gradients and optimizer state
  "$LOOM" ir "$@" --passes=train,lower --memory > "$TMP/mem.txt" 2> "$TMP/mem.err" || { echo 0; return; }
  local t p g o
  t=$(mem_bytes "$TMP/mem.txt" total); p=$(mem_bytes "$TMP/mem.txt" parameters)
  g=$(mem_bytes "$TMP/mem.txt" gradients); o=$(mem_bytes "$TMP/mem.txt" "optimizer state")
  echo $((t - p - g - o))
}

# Checks the "memory @grad_step" line of a training log: planned == measured on every rank
# == what loom ir plans for the same flags.
check_measured() {   # log what ir-flags...
  local log=$1 what=$2; shift 2
  local line planned measured ir x
  line=$(grep "^memory @grad_step:" "$log")
  planned=$(echo "$line" | sed -E 's/.*planned arena ([0-9]+) bytes.*/\1/')
  measured=$(echo "$line" | sed -E 's/.*measured ([0-9, ]+) \(.*/\1/' | tr -d ' ')
  ir=$(planned_arena "$@")
  local ok=1
  [ -n "$planned" ] && [ -n "$measured" ] || ok=0
  for x in ${measured//,/ }; do [ "$x" = "$planned" ] || ok=0; done
  [ "$ir" = "$planned" ] || ok=0
  if [ $ok = 1 ]; then pass "$what: planned arena $planned bytes = measured ($measured) = loom ir --memory"
  else fail "$what: planned arena '$planned', measured '$measured', loom ir --memory '$ir'" "$line"; fi
}

for m in gpt2-tiny llama-tiny gpt2-tiny-4l llama-tiny-4l; do
  for mesh in "" "--mesh dp=2 --zero 3" "--mesh tp=2"; do
    tag="$m${mesh:+ $mesh}"
    base=(models/$m.json --batch 8 $mesh)   # batch 8: activations, not the head, set the peak
    none_t=$(planned_total "${base[@]}")
    sel_t=$(planned_total "${base[@]}" --recompute selective)
    budget=$(( (none_t + sel_t) / 2 ))
    ref=$TMP/none.st
    "$LOOM" train "${base[@]}" --data "$TMP/d.bin" --steps 2 --lr 1e-3 --verbose --out "$ref" > "$TMP/none.log" 2>&1 \
      || { fail "$tag: recompute none did not run" "$(tail -3 "$TMP/none.log")"; continue; }
    check_measured "$TMP/none.log" "$tag none" "${base[@]}"
    if [ "$sel_t" -ge "$none_t" ]; then
      # With ZeRO-3 and overlap the arena holds gathers in flight and first-fit gaps, and
      # selective's clones do not lower it: no budget below none's is reachable, so auto
      # must refuse one, naming none's peak as the smallest it reaches.
      expect_exit 2 "$tag: selective's peak $sel_t >= none's $none_t: auto refuses a budget of none's - 1" \
        "$LOOM" train "${base[@]}" --data "$TMP/d.bin" --steps 1 --recompute auto --memory-budget $((none_t - 1))
      expect_stderr_contains "the smallest planned peak recomputation reaches is"
      expect_stderr_contains "($none_t bytes"
    fi
    for p in selective full auto; do
      [ $p = auto ] && [ "$sel_t" -ge "$none_t" ] && continue
      flags=(--recompute $p)
      [ $p = auto ] && flags+=(--memory-budget $budget)
      out=$TMP/$p.st
      if ! "$LOOM" train "${base[@]}" --data "$TMP/d.bin" --steps 2 --lr 1e-3 --verbose "${flags[@]}" --out "$out" > "$TMP/$p.log" 2>&1; then
        fail "$tag: recompute $p did not run" "$(tail -3 "$TMP/$p.log")"
        continue
      fi
      n=$(grep -E "^recompute $p[:a-z,]*: [0-9]+ forward ops cloned" "$TMP/$p.log" | sed -E 's/.*: ([0-9]+) forward ops.*/\1/')
      if [ "${n:-0}" -gt 0 ] && "$ST_DIFF" "$out" "$ref" --rtol 0 --atol 0 > "$TMP/diff.txt" 2>&1; then
        pass "$tag: recompute $p ($n ops cloned) gives parameters and losses bitwise equal to none"
      else
        fail "$tag: recompute $p: ${n:-no} ops cloned; against none:" "$(tail -2 "$TMP/diff.txt")"
      fi
      check_measured "$TMP/$p.log" "$tag $p" "${base[@]}" "${flags[@]}"
    done
  done
done

# Every op class at once (rope and attention recomputed too) on Llama: still the same bits.
"$LOOM" train models/llama-tiny.json --batch 8 --data "$TMP/d.bin" --steps 2 --lr 1e-3 --out "$TMP/n.st" > /dev/null 2>&1
"$LOOM" train models/llama-tiny.json --batch 8 --data "$TMP/d.bin" --steps 2 --lr 1e-3 \
  --recompute selective:norm,act,eltwise,rope,attn --out "$TMP/all.st" > "$TMP/all.log" 2>&1
if grep -q "^recompute selective:norm,act,eltwise,rope,attn: [1-9]" "$TMP/all.log" &&
   "$ST_DIFF" "$TMP/all.st" "$TMP/n.st" --rtol 0 --atol 0 > "$TMP/diff.txt" 2>&1; then
  pass "llama-tiny: selective:norm,act,eltwise,rope,attn gives parameters and losses bitwise equal to none"
else
  fail "llama-tiny: selective with every class" "$(tail -2 "$TMP/all.log")" "$(tail -1 "$TMP/diff.txt")"
fi

# The clones in the IR: named %rc.*, kept apart from their originals by cse, round-tripping.
run "$LOOM" ir models/gpt2-tiny.json --passes=train --recompute full -o "$TMP/full.ir"
n1=$(grep -c "%rc\." "$TMP/full.ir")
check "the IR after --passes=train --recompute full shows the clones (%rc.h0.ln_1 = layernorm ...; $n1 lines)" \
  grep -q "%rc.h0.ln_1 = layernorm %h0.out\|%rc.h0.ln_1 = layernorm %x" "$TMP/full.ir"
run "$LOOM" ir "$TMP/full.ir" --passes=cse,dce -o "$TMP/full2.ir"
n2=$(grep -c "%rc\." "$TMP/full2.ir")
check "cse and dce on the parsed IR keep every clone ($n1 -> $n2 lines with %rc.)" [ "$n1" -gt 0 -a "$n1" = "$n2" ]
run "$LOOM" ir "$TMP/full.ir" --passes=verify -o "$TMP/full3.ir"
check "the IR with clones round-trips (print(parse(print)) is identical)" cmp -s "$TMP/full.ir" "$TMP/full3.ir"

# auto under three budgets each: the planned peak (loom ir --memory) is under the budget.
auto_fits() {   # budget what flags...
  local b=$1 what=$2; shift 2
  "$LOOM" ir "$@" --passes=train,lower --memory --recompute auto --memory-budget "$b" > "$TMP/auto.txt" 2> "$TMP/auto.err"
  local rc=$? t bb
  t=$(mem_bytes "$TMP/auto.txt" total)
  bb=$(sed -E 's/.*\(budget ([0-9]+) bytes.*/\1/;t;d' "$TMP/auto.err" | head -1)
  if [ $rc = 0 ] && [ -n "$t" ] && [ -n "$bb" ] && [ "$t" -le "$bb" ] && grep -q "recompute auto: chose" "$TMP/auto.err"; then
    pass "$what: auto under --memory-budget $b: planned peak $t bytes <= $bb"
  else
    fail "$what: auto under --memory-budget $b: exit $rc, planned peak '$t', budget '$bb'" "$(tail -2 "$TMP/auto.err")"
  fi
}
# (gpt2-tiny-4l batch 8 plans 8.24 MiB with none, 6.55 with selective, 5.04 with full; auto
# reaches 4.85 MiB at the least)
for b in 8.0MiB 7.0MiB 5.0MiB; do auto_fits $b "gpt2-tiny-4l batch 8" models/gpt2-tiny-4l.json --batch 8; done
for b in 9GiB 8.5GiB 8GiB; do auto_fits $b "gpt2-124M 8x1024" models/gpt2-124M.json --batch 8 --seq 1024; done

expect_exit 2 "an impossible budget is refused before running" \
  "$LOOM" train models/gpt2-tiny-4l.json --batch 8 --data "$TMP/d.bin" --recompute auto --memory-budget 4.5MiB
expect_stderr_matches "cannot be met: the smallest planned peak recomputation reaches is [0-9.]+ MiB"
expect_stderr_lacks "step "
expect_exit 2 "a budget under the state alone is refused" \
  "$LOOM" ir models/gpt2-124M.json --passes=train --recompute auto --memory-budget 1GB
expect_stderr_contains "the parameters, gradients and optimizer state alone take"
expect_exit 2 "auto without a budget" "$LOOM" ir models/gpt2-tiny.json --passes=train --recompute auto
expect_stderr_contains "set \"memory_budget\" (--memory-budget 40GiB"
expect_exit 2 "an unknown policy" "$LOOM" train models/gpt2-tiny.json --data "$TMP/d.bin" --recompute partial
expect_stderr_contains "'partial' is not a recomputation policy"
expect_exit 2 "an unknown op class" "$LOOM" ir models/gpt2-tiny.json --passes=train --recompute selective:norm,mlp
expect_stderr_contains "unknown op class 'mlp'"
expect_exit 2 "a size without sense" "$LOOM" ir models/gpt2-tiny.json --recompute auto --memory-budget 40parsecs
expect_stderr_contains "key \"memory_budget\": expected a size per rank"

# ---- with pipeline parallelism: the clones run in their chunk's backward ----
pp_bitwise() {   # what, train args...
  local what=$1; shift
  run "$LOOM" train "$@" -q --steps 2 --out "$TMP/pp-none.st"
  [ "$RC" -eq 0 ] || { fail "$what: the run without recomputation failed"; show_last; return; }
  for r in selective full; do
    run "$LOOM" train "$@" -q --steps 2 --recompute $r --out "$TMP/pp-$r.st"
    if [ "$RC" -ne 0 ]; then fail "$what --recompute $r failed"; show_last; continue; fi
    run "$ST_DIFF" "$TMP/pp-$r.st" "$TMP/pp-none.st" --rtol 0
    [ "$RC" -eq 0 ] && pass "$what: --recompute $r = none, bitwise" || { fail "$what: --recompute $r changes results"; grep FAIL "$OUT" | head -3; }
  done
}
for m in gpt2-tiny llama-tiny; do
  for sch in 1f1b zb-h1; do pp_bitwise "$m pp=2 $sch" tests/golden/$m/train_spec.json --mesh pp=2 --pp-schedule $sch; done
done
# two chunks a rank (4 layers)
for sch in interleaved dualpipev; do
  pp_bitwise "gpt2-tiny-4l pp=2 $sch" models/gpt2-tiny-4l.json --data "$TMP/d.bin" --batch 4 --grad-accum 4 --mesh pp=2 --pp-schedule $sch
done
# the stash shrinks: the first stage's per-micro-batch stash (loom ir --memory's table)
stash0() { "$LOOM" ir models/gpt2-tiny-4l.json --passes=train,lower --mesh pp=2 --batch 8 --grad-accum 4 --memory "$@" 2>/dev/null |
  awk '$1 == "0" && $5 == "c0:" {print $6}'; }
s_none=$(stash0) s_sel=$(stash0 --recompute selective) s_full=$(stash0 --recompute full)
check "pp=2: the first stage's stash per micro-batch falls: none $s_none > selective $s_sel > full $s_full bytes" \
  test -n "$s_none" -a -n "$s_sel" -a -n "$s_full" -a "${s_none:-0}" -gt "${s_sel:-0}" -a "${s_sel:-0}" -gt "${s_full:-0}"
# full keeps each layer's input: gpt2-tiny-4l's first stage has 2 layers of [8,32,64] f32 inputs
check "pp=2 full: the first stage stashes its 2 layers' inputs and nothing else ($s_full bytes = 2 x 8 x 32 x 64 x 4)" \
  test "${s_full:-0}" = $((2 * 8 * 32 * 64 * 4))
# auto with pp fits the worst pp rank's peak (state, arena, stash)
for b in 7MiB 5MiB; do
  expect_exit 0 "pp=2 auto under $b" "$LOOM" ir models/gpt2-tiny-4l.json --passes=train,lower --mesh pp=2 --batch 8 \
    --grad-accum 4 --recompute auto --memory-budget $b --memory
  expect_stderr_matches "recompute auto: (chose|it fits|no prefix).*"
  expect_stderr_contains "the worst pp rank"
done
expect_exit 2 "pp=2 auto: an impossible budget is refused with the smallest peak" "$LOOM" ir models/gpt2-tiny-4l.json \
  --passes=train --mesh pp=2 --batch 8 --grad-accum 4 --recompute auto --memory-budget 3MiB
expect_stderr_matches "cannot be met: the smallest planned peak recomputation reaches is [0-9.]+ (MiB|KiB)"
expect_stderr_contains "the worst pp rank"
finish
