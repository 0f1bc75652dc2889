#!/usr/bin/env bash
# Meshes against the single-rank run (ranks are threads; the shard pass partitions the
# program and inserts the collectives).  The meshes run on the cpu backend (the default:
# one lowered program, each rank its own CpuProgram, collectives as runtime builtins), and
# three of them again on the reference executor.  From the same init and data, 5 training steps
# must give the same losses and final parameters within 1e-5 (relative, per tensor):
# dp=2; dp=2 with grad_accum 2; dp=4 with ZeRO-1, ZeRO-2 and ZeRO-3; tp=2; tp=2 with sequence
# parallel (and with a batch of one); dp=2 x tp=2 with
# ZeRO-1; tp=4 on the Llama with 2 KV heads (each rank slices the KV head it needs); a
# vocabulary tp does not divide (padded).  Also bf16 dp=2 ZeRO-1,
# within 2e-2: each rank rounds its half-batch weight gradient to bf16 before the f32 sum
# across ranks, where one rank rounds the whole sum once (differences of bf16's 2^-8).
LOOM=$1 ST_DIFF=$2
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

check() {   # model, description, extra flags...
  local m=$1 what=$2; shift 2
  local spec=tests/golden/$m/train_spec.json
  local base=("$LOOM" train $spec -q --steps 5 --batch 4 "$@")
  local ref=$tmp/$m-ref-$(echo "$@" | tr ' =' '__' | grep -o -- '--precision_[a-z0-9]*\|--grad-accum_[0-9]*\|--batch_[0-9]*' | tr -d '\n').st
  # the single-rank reference with the same settings (mesh and ZeRO removed)
  local single=() skip=0
  for a in "$@"; do
    if [ $skip = 1 ]; then skip=0; continue; fi
    case $a in --mesh|--zero|--sequence-parallel|--backend) skip=1;; *) single+=("$a");; esac
  done
  [ -f "$ref" ] || "$LOOM" train $spec -q --steps 5 --batch 4 "${single[@]}" --out "$ref" > "$tmp/log" 2>&1 || { bad "$m: single-rank run"; cat "$tmp/log"; return; }
  if "${base[@]}" --out "$tmp/run.st" > "$tmp/log" 2>&1 && "$ST_DIFF" "$tmp/run.st" "$ref" --rtol "${RTOL:-1e-5}" > "$tmp/diff" 2>&1; then
    ok "$m $what: losses and all parameters match the single-rank run within ${RTOL:-1e-5} ($(tail -1 "$tmp/diff" | grep -o '[0-9]* tensors'))"
  else
    bad "$m $what"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head -5; tail -1 "$tmp/diff"
  fi
}

for m in gpt2-tiny llama-tiny; do
  check $m "dp=2" --mesh dp=2
  check $m "dp=2, grad_accum 2" --mesh dp=2 --grad-accum 2
  check $m "dp=4, ZeRO-1" --mesh dp=4 --zero 1
  check $m "dp=4, ZeRO-2" --mesh dp=4 --zero 2
  check $m "dp=4, ZeRO-3" --mesh dp=4 --zero 3
  check $m "tp=2" --mesh tp=2
  check $m "tp=2, sequence parallel" --mesh tp=2 --sequence-parallel true
  # a batch of one: the flattened activations of the weight gradients are gathered as with more
  check $m "tp=2, sequence parallel, batch 1" --mesh tp=2 --sequence-parallel true --batch 1
  check $m "dp=2 x tp=2, ZeRO-1" --mesh dp=2,tp=2 --zero 1
done
check llama-tiny "tp=4 (4 heads, 2 KV heads)" --mesh tp=4
check gpt2-tiny "dp=2 x tp=2, ZeRO-3" --mesh dp=2,tp=2 --zero 3
# vocabulary 250 over tp=4: padded to 252; the padded rows never reach the loss or a
# gradient, and --out writes [250, 64] (st_diff checks every shape against the reference)
check llama-tiny-tied "tp=4, vocabulary padded 250 -> 252 (1 KV head, replicated)" --mesh tp=4
RTOL=2e-2 check gpt2-tiny "bf16, dp=2, ZeRO-1" --mesh dp=2 --zero 1 --precision bf16
# the reference executor's ranks (against the same single-rank run of the cpu backend)
check gpt2-tiny "dp=2 x tp=2, ZeRO-1, --backend ref" --mesh dp=2,tp=2 --zero 1 --backend ref
check llama-tiny "tp=2, sequence parallel, --backend ref" --mesh tp=2 --sequence-parallel true --backend ref
check llama-tiny "dp=4, ZeRO-3, --backend ref" --mesh dp=4 --zero 3 --backend ref

# loom eval --mesh: every rank runs the partitioned forward (cpu backend; and on the
# reference executor for dp=2,tp=2); the gathered logits and the loss match the PyTorch
# goldens within 1e-5.
for m in gpt2-tiny llama-tiny llama-tiny-tied; do
  g=tests/golden/$m
  for mesh in dp=2 tp=2 dp=2,tp=2 "dp=2,tp=2 --backend ref"; do
    if "$LOOM" eval models/$m.json --weights $g/weights.safetensors --tokens $g/tokens.bin --mesh $mesh \
         --out "$tmp/eval.st" > "$tmp/log" 2>&1 && "$ST_DIFF" "$tmp/eval.st" $g/expected.safetensors --rtol 1e-5 logits loss > "$tmp/diff" 2>&1; then
      ok "eval $m --mesh $mesh: gathered logits and loss match the PyTorch golden"
    else
      bad "eval $m --mesh $mesh"; cat "$tmp/log" "$tmp/diff"
    fi
  done
done

# Refusals: a batch dp does not divide; a tp that does not divide the heads.
"$LOOM" train tests/golden/gpt2-tiny/train_spec.json -q --steps 1 --mesh dp=3 > "$tmp/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "dp" "$tmp/log"; then ok "batch 2 over dp=3 refused (exit 2): $(head -1 "$tmp/log" | cut -c1-150)"; else bad "dp=3: exit $rc"; cat "$tmp/log"; fi
"$LOOM" train tests/golden/llama-tiny/train_spec.json -q --steps 1 --mesh tp=3 > "$tmp/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "tp" "$tmp/log"; then ok "tp=3 with 4 heads refused (exit 2): $(head -1 "$tmp/log" | cut -c1-150)"; else bad "tp=3: exit $rc"; cat "$tmp/log"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
