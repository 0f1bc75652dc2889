#!/usr/bin/env bash
# loom compile: the executable trains exactly as `loom train` does, from any folder,
# without loom or the spec; compiled-in settings are refused at run time.
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
spec=tests/golden/gpt2-tiny/train_spec.json

"$LOOM" train $spec -q --out "$tmp/by-train.st" > /dev/null 2>&1 || bad "loom train"
if "$LOOM" compile $spec -q -o "$tmp/trainer" > "$tmp/log" 2>&1; then
  ok "compile writes an executable"
else
  bad "compile"; cat "$tmp/log"
fi
mkdir -p "$tmp/elsewhere"
cp "$tmp/trainer" "$tmp/elsewhere/" 2>/dev/null
if (cd "$tmp/elsewhere" && ./trainer -q --out by-exe.st) > "$tmp/log" 2>&1 && cmp -s "$tmp/by-train.st" "$tmp/elsewhere/by-exe.st"; then
  ok "the executable, run from another folder, gives bitwise the same result as loom train"
else
  bad "executable result"; cat "$tmp/log"
fi
if "$tmp/trainer" --help | grep -q "usage" && "$tmp/trainer" --info | grep -q '"batch":2'; then
  ok "--help and --info"
else
  bad "--help/--info"
fi
"$tmp/trainer" --batch 4 > "$tmp/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "fixed when this executable was compiled" "$tmp/log"; then ok "--batch refused (exit 2)"; else bad "--batch: exit $rc"; cat "$tmp/log"; fi
if "$tmp/trainer" -q --steps 2 --out "$tmp/two.st" > /dev/null 2>&1; then ok "--steps overrides the compiled default"; else bad "--steps"; fi
runner="$(dirname "$LOOM")/loom-train"
"$runner" > "$tmp/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "carries no compiled model" "$tmp/log"; then ok "the bare runner explains itself (exit 2)"; else bad "bare runner: exit $rc"; cat "$tmp/log"; fi
"$LOOM" compile $spec > "$tmp/log" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "\-o EXE" "$tmp/log"; then ok "compile without -o: exit 2"; else bad "compile without -o: exit $rc"; fi
# a mesh: the executable runs every rank as a thread (cpu backend) and matches loom train's
# single-rank run within 1e-5
ST_DIFF=$2
"$LOOM" train $spec -q --steps 3 --batch 4 --out "$tmp/single.st" > /dev/null 2>&1 || bad "single-rank train"
if "$LOOM" compile $spec -q --mesh dp=2,tp=2 --zero 1 --batch 4 --steps 3 -o "$tmp/mesh" > "$tmp/log" 2>&1 &&
   (cd "$tmp" && ./mesh --out m.st > run.log 2>&1) && grep -q "running 4 ranks as threads" "$tmp/run.log" &&
   "$ST_DIFF" "$tmp/m.st" "$tmp/single.st" --rtol 1e-5 > "$tmp/diff" 2>&1; then
  ok "compiled dp=2 x tp=2 ZeRO-1 executable: 4 ranks as threads, matches the single-rank run within 1e-5"
else
  bad "compiled mesh"; cat "$tmp/log" "$tmp/run.log" 2>/dev/null; tail -3 "$tmp/diff" 2>/dev/null
fi
# The mesh executable's program holds what its executor reads (the mesh, the placements, a
# pipeline's schedule and each global's stage): its payload's IR part (part 3 of program, LLVM
# IR, IR, "mesh") is empty, pipelined or not, and the runner parses none.  The pipelined one
# trains bitwise as loom train and reports its schedule (read from the program).
ir_part() {
  python3 -c "
import struct, sys
b = open(sys.argv[1], 'rb').read(); off, size = struct.unpack('<QQ', b[-16:]); p = b[off:off + size]; at = 8
for i in range(3): at += 8 + struct.unpack('<Q', p[at:at + 8])[0]
print(struct.unpack('<Q', p[at:at + 8])[0])" "$1"
}
if [ -x "$tmp/mesh" ] && [ "$(ir_part "$tmp/mesh")" = 0 ]; then ok "the compiled mesh carries no IR"; else bad "the compiled mesh's IR part: $(ir_part "$tmp/mesh")"; fi
"$LOOM" train $spec -q --mesh pp=2 --steps 2 --out "$tmp/pp.st" > /dev/null 2>&1 || bad "pp=2 train"
if "$LOOM" compile $spec -q --mesh pp=2 --steps 2 -o "$tmp/pp" > "$tmp/log" 2>&1 && [ "$(ir_part "$tmp/pp")" = 0 ] &&
   (cd "$tmp" && ./pp --out pp-exe.st > run.log 2>&1) && cmp -s "$tmp/pp.st" "$tmp/pp-exe.st" &&
   grep -q "^pipeline 1f1b, pp=2, " "$tmp/run.log"; then
  ok "a compiled pp=2 pipeline carries no IR (its schedule and stages are in the program) and trains bitwise as loom train"
else
  bad "compiled pp=2 pipeline (IR part: $(ir_part "$tmp/pp" 2>/dev/null))"; cat "$tmp/log" "$tmp/run.log" 2>/dev/null
fi
# A compiled executable started as one of several processes (srun's task 1 of 2) refuses,
# naming the launch, and writes nothing.
env SLURM_PROCID=1 SLURM_NTASKS=2 "$tmp/trainer" --out "$tmp/srun.safetensors" > "$tmp/log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "rank 1 of 2 started by slurm" "$tmp/log" && [ ! -e "$tmp/srun.safetensors" ]; then
  ok "the executable as srun's task 1 of 2: refused (exit 2), nothing written"
else
  bad "the executable as srun's task 1 of 2: exit $rc"; cat "$tmp/log"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
