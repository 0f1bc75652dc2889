#!/usr/bin/env bash
# Checkpoints and resume: a run stopped at step 3 and resumed reproduces the uninterrupted
# run bit for bit (parameters, losses, grad norms, lrs), across shards, with gradient
# accumulation, in f32 and bf16; it resumes under another layout (dp=2 ZeRO-3 -> dp=4
# ZeRO-1 -> tp=2 -> one rank, within 1e-5 of one rank throughout); damaged checkpoints are
# refused with a clear message.
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
spec=tests/golden/llama-tiny/train_spec.json   # two shards, grad_accum 2

for prec in fp32 bf16; do
  run=("$LOOM" train $spec -q --steps 7 --precision $prec)
  "${run[@]}" --out "$tmp/full.st" > /dev/null 2>&1 || bad "$prec: uninterrupted run"
  "${run[@]}" --save-dir "$tmp/ck-$prec" --save-every 3 > /dev/null 2>&1 || bad "$prec: run with checkpoints"
  # Stop after step 3: drop the later checkpoints, then resume from the folder.
  rm -rf "$tmp/ck-$prec/step_00000006" "$tmp/ck-$prec/step_00000007"
  if "${run[@]}" --resume "$tmp/ck-$prec" --out "$tmp/resumed.st" > "$tmp/log" 2>&1 && cmp -s "$tmp/full.st" "$tmp/resumed.st"; then
    ok "$prec: resumed at step 3 of 7, the output is bitwise equal to the uninterrupted run"
  else
    bad "$prec: resume differs"; cat "$tmp/log"
  fi
done

# Resume under another layout (issue 15): checkpoints hold whole tensors by their HF names,
# so a run moves dp=2 ZeRO-3 -> dp=4 ZeRO-1 -> tp=2 -> one rank, two steps on each, and ends
# within 1e-5 of the uninterrupted one-rank run (the layouts sum in other orders: not bitwise).
layout_run=("$LOOM" train $spec -q --batch 4 --min-lr 0.01 --warmup 0)   # a constant lr: legs of 2, 4, 6, 8 steps share the schedule
"${layout_run[@]}" --steps 8 --out "$tmp/one.st" > /dev/null 2>&1 || bad "layouts: the uninterrupted one-rank run"
legs=("--mesh dp=2 --zero 3" "--mesh dp=4 --zero 1" "--mesh tp=2" "")
for k in 0 1 2 3; do
  resume=(); [ $k -gt 0 ] && resume=(--resume "$tmp/ck-layouts" --allow-changes)   # --steps grows each leg
  # shellcheck disable=SC2086
  if ! "${layout_run[@]}" --steps $((2 * k + 2)) ${legs[$k]} "${resume[@]}" --save-dir "$tmp/ck-layouts" \
       --out "$tmp/leg.st" > "$tmp/log" 2>&1; then
    bad "layouts: leg $k (${legs[$k]:-one rank}) failed"; cat "$tmp/log"
  fi
done
if "$LOOM" diff "$tmp/leg.st" "$tmp/one.st" --rtol 1e-5 > "$tmp/diff" 2>&1; then
  ok "resumed across dp=2 ZeRO-3 -> dp=4 ZeRO-1 -> tp=2 -> one rank: parameters and losses after 8 steps within 1e-5 of one rank's"
else
  bad "resuming across layouts drifts"; grep FAIL "$tmp/diff" | head
fi

ck=$tmp/ck-fp32
# the resumed run above went on saving into the folder it resumed from (no --save-dir)
if [ -f "$ck/step_00000007/DONE" ]; then ok "a run resumed without --save-dir saves on into the folder it resumed from"
else bad "a resumed run without --save-dir wrote no checkpoint into $ck"; ls "$ck"; fi
rm -rf "$ck/step_00000007"   # step 3 alone: damaged, nothing older to fall back to
run=("$LOOM" train $spec -q --steps 7)
expect_refused() {   # description, substring
  "${run[@]}" --resume "$ck" > "$tmp/log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then bad "$1: accepted"; return; fi
  if [ $rc -eq 2 ] && grep -q "$2" "$tmp/log" && ! grep -q -e AddressSanitizer -e "runtime error" "$tmp/log"; then
    ok "$1: refused (exit 2): $(head -c 160 "$tmp/log" | head -1)"
  else
    bad "$1: exit $rc"; cat "$tmp/log"
  fi
}
cp -r "$ck" "$tmp/backup"
head -c 1000 "$tmp/backup/step_00000003/model.safetensors" > "$ck/step_00000003/model.safetensors"
expect_refused "truncated model.safetensors" "model.safetensors"
rm -rf "$ck" && cp -r "$tmp/backup" "$ck"
size=$(stat -c %s "$ck/step_00000003/optimizer.safetensors")
printf '\x55' | dd of="$ck/step_00000003/optimizer.safetensors" bs=1 seek=$((size - 7)) conv=notrunc 2>/dev/null
expect_refused "one byte changed in optimizer.safetensors" "checksum"
rm -rf "$ck" && cp -r "$tmp/backup" "$ck"
rm "$ck/step_00000003/DONE"
expect_refused "checkpoint without its DONE marker" "DONE\|complete"
rm -rf "$ck" && cp -r "$tmp/backup" "$ck"
echo '{"step": 3, "data": {"shard": 9, "pos": 0}}' > "$ck/step_00000003/state.json"
expect_refused "state.json edited after writing" "checksum\|state.json"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
