#!/usr/bin/env bash
# Meshes on the CUDA backend, one process per rank, on the emulated device with the NCCL test
# double (fake_nccl.c: ranks exchange data through shared memory).  Not a GPU check: it
# proves the lowering of collectives, the per-axis streams' ordering, the launch and the
# fault handling; speed and real NCCL stay owed to tests/gpu/run.sh.
#   bash tests/cuda_emu/mesh.sh LOOM ST_DIFF LIBCUDA LIBNVRTC LIBCUBLASLT LIBNCCL
# 1. every layout issue 15 names, against the CPU mesh (threads) from the same init and data
#    (the goldens' training specs: grad_accum 2), 3 steps: losses and final parameters within
#    1e-4 (f32); 1a. the same from the seeded initialization (no init file);
# 2. the same run started by a launcher's environment (torchrun's variables, by hand);
# 3. a CUDA mesh's checkpoint resumed on one CPU rank, and a CPU checkpoint on a CUDA mesh;
# 4. faults: a rank that never reaches a collective (every process ends within the timeout
#    plus a few seconds, the report names the collective), a rank killed mid-step.
# LOOM_MESH_REAL=1 (a GPU session with 2+ GPUs, tests/gpu/OWED.md check 10): the real driver,
# NVRTC, cuBLASLt and NCCL instead of the test doubles (no library arguments then).
LOOM=$1 ST_DIFF=$2
if [ "${LOOM_MESH_REAL:-0}" != 1 ]; then
  export LOOM_LIBCUDA=$3 LOOM_LIBNVRTC=$4 LOOM_LIBCUBLASLT=$5 LOOM_LIBNCCL=$6
  for f in "$LOOM_LIBCUDA" "$LOOM_LIBNVRTC" "$LOOM_LIBCUBLASLT" "$LOOM_LIBNCCL"; do
    [ -f "$f" ] || { echo "FAIL: $f not built"; exit 1; }
  done
  command -v "${LOOM_EMU_CXX:-g++}" > /dev/null || { echo "SKIPPED: no C++ compiler for the emulated device"; exit 0; }
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export LOOM_CACHE_DIR=$tmp/cache TMPDIR=$tmp LOOM_THREADS=1 LOOM_FAKE_NCCL_MAX_WAIT=60 LOOM_EMU_DEVICES=8
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null

# 1. layouts against the CPU mesh
check() {   # model, description, flags...
  local m=$1 what=$2; shift 2
  local run=("$LOOM" train tests/golden/$m/train_spec.json -q --steps 3 --batch 4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     "${run[@]}" --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "$m $what: cuda (one process per rank) = the cpu mesh within 1e-4 ($(tail -1 "$tmp/diff" | grep -o '[0-9]* tensors'))"
  else
    bad "$m $what"; tail -20 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
}
check gpt2-tiny "dp=2, ZeRO-0" --mesh dp=2 --zero 0
check gpt2-tiny "dp=2, ZeRO-1" --mesh dp=2 --zero 1
check gpt2-tiny "dp=2, ZeRO-3" --mesh dp=2 --zero 3
check gpt2-tiny "tp=2, sequence parallel" --mesh tp=2 --sequence-parallel true
check gpt2-tiny "dp=2 x tp=2, ZeRO-1" --mesh dp=2,tp=2 --zero 1
check llama-tiny "tp=2, sequence parallel" --mesh tp=2 --sequence-parallel true
check llama-tiny "dp=2 x tp=2" --mesh dp=2,tp=2

# 1a. the seeded initialization (no --init): each rank draws its pieces of the whole tensors'
#     values (rt_global_init_piece) where the CPU mesh splits whole tensors; a padded
#     vocabulary (250 over tp=4: 252 rows) included.  eps 1e-4: Adam's steps on GPT-2's key
#     biases (gradient 0 but for rounding) then do not amplify rounding differences.
seeded() {   # model, description, flags...
  local m=$1 what=$2; shift 2
  local run=("$LOOM" train models/$m.json --data "$tmp/d.bin" -q --steps 3 --batch 4 --seq 32 --eps 1e-4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     "${run[@]}" --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "$m $what, seeded: each rank's pieces of the initialization = the cpu mesh's within 1e-4 after 3 steps"
  else
    bad "$m $what, seeded"; tail -20 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
}
seeded gpt2-tiny "dp=2, ZeRO-3" --mesh dp=2 --zero 3
seeded gpt2-tiny "tp=2" --mesh tp=2
seeded llama-tiny-tied "tp=4 (vocabulary 250 padded to 252)" --mesh tp=4

# 2. started by a launcher (torchrun's variables set by hand): the same bits as loom's own start
"$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" -q --steps 3 --batch 4 --seq 32 --mesh dp=2 --backend cuda \
  --out "$tmp/self.st" > "$tmp/log" 2>&1
port=$((20000 + RANDOM % 20000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" -q --steps 3 --batch 4 --seq 32 --mesh dp=2 --backend cuda \
    --out "$tmp/env$r.st" > "$tmp/env$r.log" 2>&1 &
done
wait
if [ -f "$tmp/env0.st" ] && [ ! -f "$tmp/env1.st" ] && "$ST_DIFF" "$tmp/env0.st" "$tmp/self.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 alone writes --out, bitwise loom's own start"
else
  bad "torchrun-style launch"; cat "$tmp/env0.log" "$tmp/env1.log" | tail -20; grep FAIL "$tmp/diff" | head -3
fi

# 3. a CUDA mesh's checkpoint (dp=2, ZeRO-3: the pieces gathered over NCCL) resumed on one
#    CPU rank: 2 + 2 steps = 4 steps straight on the CPU
flags=(tests/golden/gpt2-tiny/train_spec.json -q --batch 4 --min-lr 0.01 --warmup 0)
"$LOOM" train "${flags[@]}" --steps 4 --out "$tmp/straight.st" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 2 --mesh dp=2 --zero 3 --backend cuda --save-dir "$tmp/ck" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 4 --resume "$tmp/ck" --out "$tmp/resumed.st" > "$tmp/log2" 2>&1
if "$ST_DIFF" "$tmp/resumed.st" "$tmp/straight.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "a dp=2 ZeRO-3 CUDA checkpoint resumed on one CPU rank: 2 + 2 steps = 4 straight within 1e-4"
else
  bad "CUDA mesh checkpoint resumed on the CPU"; tail -n 5 "$tmp/log" "$tmp/log2"; grep FAIL "$tmp/diff" | head -3
fi

# 3b. a CPU checkpoint resumed on a CUDA mesh (tp=2: each rank takes its pieces of the whole
#     tensors the checkpoint holds, sync_in), 2 + 2 steps = 4 straight on the CPU
"$LOOM" train "${flags[@]}" --steps 2 --save-dir "$tmp/ck2" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 4 --mesh tp=2 --backend cuda --resume "$tmp/ck2" --out "$tmp/resumed2.st" > "$tmp/log2" 2>&1
if "$ST_DIFF" "$tmp/resumed2.st" "$tmp/straight.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "a one-rank CPU checkpoint resumed on a tp=2 CUDA mesh: 2 + 2 steps = 4 straight within 1e-4"
else
  bad "CPU checkpoint resumed on a CUDA mesh"; tail -n 5 "$tmp/log" "$tmp/log2"; grep FAIL "$tmp/diff" | head -3
fi

# 4. faults (LOOM_NCCL_FAULT, runtime/comm/comm_nccl.c's test hook)
fault() {   # kind, what, expected text
  local t0=$SECONDS
  LOOM_NCCL_FAULT=$1:1:6 "$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" --steps 50 --batch 4 --seq 32 \
    --mesh dp=2 --backend cuda --nccl-timeout 3 --save-dir "$tmp/fault-$1" > "$tmp/fault.log" 2>&1
  local rc=$? took=$((SECONDS - t0))
  sleep 1
  local left; left=$(pgrep -f "fault-$1" | wc -l)
  if [ $rc != 0 ] && [ "$took" -le 30 ] && [ "$left" = 0 ] && grep -q "$3" "$tmp/fault.log"; then
    ok "$2: exit $rc after $took s, no process left, the report: $(grep -m1 "$3" "$tmp/fault.log" | cut -c1-150)"
  else
    bad "$2 (exit $rc after $took s, $left processes left)"; tail -20 "$tmp/fault.log"
    pkill -9 -f "fault-$1"
  fi
}
fault hang "a rank that never reaches collective #6 (--nccl-timeout 3)" "did not complete within 3 s"
fault kill "a rank killed before collective #6" "killed by signal 9"
grep -q "collective #6" "$tmp/fault.log" || true

echo "$pass passed, $fail failed"
[ $fail = 0 ]
