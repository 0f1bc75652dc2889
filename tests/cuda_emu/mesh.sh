#!/usr/bin/env bash
# Meshes on the CUDA backend, one process per rank, on the emulated device with the NCCL test
# double (fake_nccl.c: ranks exchange data through shared memory).  Not a GPU check: it
# proves the lowering of collectives, the per-axis streams' ordering, the launch and the
# fault handling; speed and real NCCL stay owed to tests/gpu/run.sh.
#   bash tests/cuda_emu/mesh.sh LOOM ST_DIFF LIBCUDA LIBNVRTC LIBCUBLASLT LIBNCCL
# 1. every layout issue 15 names, against the CPU mesh (threads) from the same init and data
#    (the goldens' training specs: grad_accum 2), 2 steps: losses and final parameters within
#    1e-4 (f32); 1a. the same from the seeded initialization (no init file);
# 2. the same run started by a launcher's environment (torchrun's variables, by hand), and by
#    a compiled executable;
# 3. a CUDA mesh's checkpoint resumed on one CPU rank, and a CPU checkpoint on a CUDA mesh;
# 5. SIGTERM: every rank stops after the same step, one checkpoint, resumed bitwise;
# 4. faults: a rank that never reaches a collective (every process ends within the timeout
#    plus a few seconds, the report names the collective), a rank killed mid-step;
# 1b-1d (below 3): context parallelism, expert parallelism and pipelines.
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
# the suite's shared cache under ctest (CMakeLists.txt), else one of our own
export LOOM_CACHE_DIR=${LOOM_CACHE_DIR:-$tmp/cache} TMPDIR=$tmp LOOM_THREADS=1 LOOM_FAKE_NCCL_MAX_WAIT=60 LOOM_FAKE_NCCL_STRICT=1 LOOM_EMU_DEVICES=8
pass=0 fail=0
# memo OUT [VAR=value...] LOOM ARGS...: `env VAR=value... LOOM ARGS --out OUT`, run once per
# distinct command (2b's loom train is 1's dp=2 ZeRO-1 run)
memo() {
  local out=$1 key; shift
  key=$(printf '%s\0' "$@" | md5sum | cut -c1-32)
  [ -s "$tmp/memo-$key.st" ] || env "$@" --out "$tmp/memo-$key.st" || return 1
  cp "$tmp/memo-$key.st" "$out"
}
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null

# 1. layouts against the CPU mesh
check() {   # model, description, flags...
  local m=$1 what=$2; shift 2
  local run=("$LOOM" train tests/golden/$m/train_spec.json -q --steps 2 --batch 4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     memo "$tmp/cuda.st" "${run[@]}" --backend cuda > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol "${RTOL:-1e-4}" > "$tmp/diff" 2>&1; then
    ok "$m $what: cuda (one process per rank) = the cpu mesh within ${RTOL:-1e-4} ($(tail -1 "$tmp/diff" | grep -o '[0-9]* tensors'))"
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
  local run=("$LOOM" train models/$m.json --data "$tmp/d.bin" -q --steps 2 --batch 4 --seq 32 --eps 1e-4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     "${run[@]}" --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "$m $what, seeded: each rank's pieces of the initialization = the cpu mesh's within 1e-4 after 2 steps"
  else
    bad "$m $what, seeded"; tail -20 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
}
seeded gpt2-tiny "dp=2, ZeRO-3" --mesh dp=2 --zero 3
seeded gpt2-tiny "tp=2" --mesh tp=2
seeded llama-tiny-tied "tp=4 (vocabulary 250 padded to 252)" --mesh tp=4

# 2. started by a launcher (torchrun's variables set by hand): the same bits as loom's own start
"$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" -q --steps 2 --batch 4 --seq 32 --mesh dp=2 --backend cuda \
  --out "$tmp/self.st" > "$tmp/log" 2>&1
port=$((20000 + RANDOM % 20000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" -q --steps 2 --batch 4 --seq 32 --mesh dp=2 --backend cuda \
    --out "$tmp/env$r.st" > "$tmp/env$r.log" 2>&1 &
done
wait
if [ -f "$tmp/env0.st" ] && [ ! -f "$tmp/env1.st" ] && "$ST_DIFF" "$tmp/env0.st" "$tmp/self.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): rank 0 alone writes --out, bitwise loom's own start"
else
  bad "torchrun-style launch"; cat "$tmp/env0.log" "$tmp/env1.log" | tail -20; grep FAIL "$tmp/diff" | head -3
fi

# 2b. a compiled executable of a CUDA mesh (program and cubin, no IR): it starts one process
#     per rank itself, bitwise loom train's run
"$LOOM" compile tests/golden/gpt2-tiny/train_spec.json --backend cuda --mesh dp=2 --zero 1 --batch 4 -o "$tmp/exe" \
  > "$tmp/log" 2>&1
memo "$tmp/train.st" "$LOOM" train tests/golden/gpt2-tiny/train_spec.json -q --steps 2 --batch 4 --mesh dp=2 --zero 1 \
  --backend cuda > "$tmp/log2" 2>&1
if "$tmp/exe" --steps 2 -q --out "$tmp/exe.st" > "$tmp/log3" 2>&1 &&
   "$ST_DIFF" "$tmp/exe.st" "$tmp/train.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "a compiled dp=2 ZeRO-1 CUDA executable starts its ranks and trains bitwise as loom train"
else
  bad "compiled CUDA mesh executable"; tail -n 5 "$tmp/log" "$tmp/log2" "$tmp/log3"; grep FAIL "$tmp/diff" | head -3
fi

# 3. a CUDA mesh's checkpoint (dp=2, ZeRO-3: a shard per rank, checkpoint.h) resumed on one
#    CPU rank: 2 + 2 steps = 4 steps straight on the CPU
# --allow-changes: the legs resume with more --steps than the checkpoint was saved with
flags=(tests/golden/gpt2-tiny/train_spec.json -q --batch 4 --min-lr 0.01 --warmup 0 --allow-changes)
"$LOOM" train "${flags[@]}" --steps 4 --out "$tmp/straight.st" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 2 --mesh dp=2 --zero 3 --backend cuda --save-dir "$tmp/ck" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 4 --resume "$tmp/ck" --save-dir "$tmp/ck-r1" --out "$tmp/resumed.st" > "$tmp/log2" 2>&1
if "$ST_DIFF" "$tmp/resumed.st" "$tmp/straight.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "a dp=2 ZeRO-3 CUDA checkpoint resumed on one CPU rank: 2 + 2 steps = 4 straight within 1e-4"
else
  bad "CUDA mesh checkpoint resumed on the CPU"; tail -n 5 "$tmp/log" "$tmp/log2"; grep FAIL "$tmp/diff" | head -3
fi

# 3a. resharding (issue 15's chain): dp=2 ZeRO-3 -> dp=4 ZeRO-1 -> tp=2, each a CUDA mesh
#     resuming the last one's shards, then one CPU rank: 2+1+1+1 steps = 5 straight within
#     1e-4; and right after a reshard the parameters are bitwise those one rank assembles
"$LOOM" train "${flags[@]}" --steps 5 --out "$tmp/straight5.st" > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 3 --mesh dp=4 --zero 1 --backend cuda --resume "$tmp/ck" --save-dir "$tmp/ck3" \
  > "$tmp/log" 2>&1 &&
"$LOOM" train "${flags[@]}" --steps 4 --mesh tp=2 --backend cuda --resume "$tmp/ck3" --save-dir "$tmp/ck4" \
  > "$tmp/log2" 2>&1 &&
"$LOOM" train "${flags[@]}" --steps 5 --resume "$tmp/ck4" --out "$tmp/chain.st" > "$tmp/log3" 2>&1
if ls "$tmp/ck3"/step_00000003/shard-00003-of-00004.safetensors > /dev/null 2>&1 &&
   "$ST_DIFF" "$tmp/chain.st" "$tmp/straight5.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "dp=2 ZeRO-3 -> dp=4 ZeRO-1 -> tp=2 (CUDA meshes, a shard per rank) -> one CPU rank: 5 steps within 1e-4 of straight"
else
  bad "the resharding chain"; tail -n 5 "$tmp/log" "$tmp/log2" "$tmp/log3"; grep FAIL "$tmp/diff" | head -3
fi
"$LOOM" train "${flags[@]}" --steps 2 --mesh dp=4 --zero 1 --backend cuda --resume "$tmp/ck" --out "$tmp/re4.st" \
  > "$tmp/log" 2>&1
"$LOOM" train "${flags[@]}" --steps 2 --resume "$tmp/ck" --out "$tmp/re1.st" > "$tmp/log2" 2>&1
if "$ST_DIFF" "$tmp/re4.st" "$tmp/re1.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "a dp=2 ZeRO-3 checkpoint resharded to dp=4 ZeRO-1: the parameters bitwise one rank's assembly"
else
  bad "bitwise reshard"; tail -n 5 "$tmp/log" "$tmp/log2"; grep FAIL "$tmp/diff" | head -3
fi
# a damaged shard is refused, naming it
printf 'X' | dd of="$(ls "$tmp"/ck/step_00000002/shard-00001-of-00002.safetensors)" bs=1 seek=200 conv=notrunc 2> /dev/null
if ! "$LOOM" train "${flags[@]}" --steps 4 --resume "$tmp/ck" > "$tmp/log" 2>&1 &&
   grep -q "shard-00001-of-00002.safetensors is corrupt: checksum mismatch" "$tmp/log"; then
  ok "a damaged shard is refused: $(grep -o 'shard-00001[^;]*' "$tmp/log" | head -1)"
else
  bad "a damaged shard"; tail -n 3 "$tmp/log"
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

# ---------------------------------------------------------------------------------------
# 1b. context parallelism: ring attention's send/recv as NCCL groups (runtime/cuda/cuda_mesh.c
#     plans them: both ends of each message in one group, issued in step order, staging where
#     NCCL's reads and writes could meet another step's), against the CPU mesh within 1e-4.
#     cp=2 cannot tell the ring's directions apart (+1 = -1): cp=4 does.  The emulated device
#     runs a group when it is issued, so these catch a wrong pairing, order, peer or staging
#     decision, not a missing stream wait (that is OWED.md check 10's).
check llama-tiny "cp=2 (ring attention, zigzag)" --mesh cp=2
check llama-tiny "cp=2, all-gather attention" --mesh cp=2 --cp-attn allgather
check llama-tiny "cp=2, contiguous split" --mesh cp=2 --cp-balance contiguous
# Mistral's sliding window (8) in the ring's blocks (kernels/attn_block.cuh, i[12]): across the
# boundary of cp=2, and cp=4 contiguous, whose ring stops after 2 of 4 steps
mistral() {   # description, flags...
  local what=$1 g=tests/golden/mistral-tiny; shift
  local run=("$LOOM" train $g/config.json --data $g/tokens.bin --seq 32 -q --steps 2 --batch 4 --eps 1e-4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     "${run[@]}" --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "mistral-tiny $what: cuda (one process per rank) = the cpu mesh within 1e-4"
  else
    bad "mistral-tiny $what"; tail -20 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
}
mistral "cp=2 (ring attention, zigzag)" --mesh cp=2
mistral "cp=4, contiguous split (the ring stops after 2 steps)" --mesh cp=4 --cp-balance contiguous
check gpt2-tiny "cp=2 (ring attention)" --mesh cp=2
check llama-tiny "dp=2 x cp=2" --mesh dp=2,cp=2
check llama-tiny "cp=4 (ring attention, zigzag)" --mesh cp=4
# bf16 (issue 12): the tensor-core attention blocks and the bf16 ring, against the CPU mesh's
# bf16 run within 2e-2 (the two round differently)
RTOL=2e-2 check llama-tiny "cp=2, bf16" --mesh cp=2 --precision bf16

# 1c. expert parallelism: all_to_allv's counts read on the host, each peer's rows one NCCL
#     group (runtime/cuda/cuda_mesh.c), the MoE kernels of codegen/cuda/kernels/moe.cuh
check mixtral-tiny "ep=2 (all_to_allv)" --mesh ep=2
check qwen3-moe-tiny "dp=2 x ep=2" --mesh dp=2,ep=2
# the experts on the rank's own tokens under sequence and context parallelism: flattened
# [B*T/n, D] rows kept split (passes/shard_rows.c), the experts' gradients summed over tp / cp
check mixtral-tiny "tp=2 with sequence parallel (experts on the rank's tokens)" --mesh tp=2 --sequence-parallel true
check qwen3-moe-tiny "cp=2 (ring attention, experts on the rank's tokens)" --mesh cp=2
# pipelines with experts (the load-balancing loss on), the expert load a stage's state
check mixtral-tiny "pp=2 1f1b (experts in both stages)" --mesh pp=2 --pp-schedule 1f1b
check qwen3-moe-tiny "pp=2 x ep=2 zb-h1" --mesh pp=2,ep=2 --pp-schedule zb-h1
# three chunks (a dense layer between the sparse ones): the load-balancing loss's values relayed
# up the forward and down the backward (passes/pipeline_chunks.c)
check qwen3-moe-tiny "pp=3 1f1b (relays)" --mesh pp=3 --pp-schedule 1f1b
# --log-experts: the trainer reads the load counts through sync_out and zeroes them through
# sync_in, which must give every rank its own pieces back (it once wrote rank 0's whole views,
# zeros elsewhere, over every rank's parameters)
le=(tests/golden/mixtral-tiny/train_spec.json --steps 2 --batch 4 --mesh ep=2 --log-experts)
lc=$("$LOOM" train "${le[@]}" --backend cpu 2>&1 | grep -E '^step|experts l' | sed 's/|[^|]*ms.*//' | tr -s ' ')
lg=$("$LOOM" train "${le[@]}" --backend cuda 2>&1 | grep -E '^step|experts l' | sed 's/|[^|]*ms.*//' | tr -s ' ')
[ -n "$lc" ] && [ "$lc" = "$lg" ] && ok "mixtral-tiny ep=2 --log-experts on cuda: the cpu mesh's losses and expert loads ($(echo "$lg" | grep -m1 'experts l1'))" ||
  { bad "mixtral-tiny ep=2 --log-experts on cuda"; echo "cpu: $lc"; echo "cuda: $lg"; }
# a rank that never reaches a send/recv group (#2: layer 1's ring in the first forward)
t0=$SECONDS
LOOM_NCCL_FAULT=hang:1:2 "$LOOM" train models/llama-tiny.json --data "$tmp/d.bin" --steps 5 --batch 4 --seq 32 \
  --mesh cp=2 --backend cuda --nccl-timeout 3 --save-dir "$tmp/fault-cp" > "$tmp/fault.log" 2>&1
rc=$? took=$((SECONDS - t0))
sleep 1
left=$(pgrep -f "$tmp/fault-cp" | wc -l)
if [ $rc != 0 ] && [ "$took" -le 30 ] && [ "$left" = 0 ] && grep -q "collective #2 send/recv group of 4 on cp" "$tmp/fault.log"; then
  ok "a cp rank that never reaches send/recv group #2: exit $rc after $took s, no process left, the report: $(grep -m1 "send/recv group" "$tmp/fault.log" | cut -c1-150)"
else
  bad "a cp rank that never reaches a send/recv group (exit $rc after $took s, $left processes left)"; tail -20 "$tmp/fault.log"
  pkill -9 -f "$tmp/fault-cp"
fi
# ---------------------------------------------------------------------------------------
# 1d. pipeline parallelism (runtime/exec/exec_cuda_pipe.c): a chunk function's transfers to fixed pp
#     ranks copy to and from staging slots, and the driver exchanges the slots between its
#     calls as NCCL groups it plans at setup (every rank runs every rank's actions: a group
#     holds only messages whose partners are in the partner's group of the same round, so
#     none can deadlock, which strict mode checks); the stash stays in device memory.
#     Against the CPU mesh within 1e-4, 4-layer models, 4 micro-batches: every schedule,
#     pp=4, and with dp (ZeRO-1), tp (sequence parallel) and cp.
pipe() {   # model, description, flags...
  local m=$1 what=$2; shift 2
  local run=("$LOOM" train models/$m.json --data "$tmp/d.bin" -q --steps 2 --batch 4 --seq 32 --eps 1e-4 --grad-accum 4 "$@")
  if "${run[@]}" --backend cpu --out "$tmp/cpu.st" > "$tmp/log" 2>&1 &&
     "${run[@]}" --backend cuda --out "$tmp/cuda.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "$m $what: cuda (one process per rank) = the cpu mesh within 1e-4 ($(tail -1 "$tmp/diff" | grep -o '[0-9]* tensors'))"
  else
    bad "$m $what"; tail -20 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
}
pipe llama-tiny-4l "pp=2, 1f1b" --mesh pp=2
# a compiled pp=2 CUDA executable: its program holds the schedule and each global's stage (no
# IR in it, none parsed); it starts its ranks and trains bitwise as loom train did just above
cp "$tmp/cuda.st" "$tmp/pp-train.st" 2> /dev/null
if "$LOOM" compile models/llama-tiny-4l.json --data "$tmp/d.bin" -q --batch 4 --seq 32 --eps 1e-4 --grad-accum 4 \
     --mesh pp=2 --backend cuda -o "$tmp/ppexe" > "$tmp/log" 2>&1 &&
   "$tmp/ppexe" --steps 2 -q --out "$tmp/ppexe.st" > "$tmp/log3" 2>&1 &&
   "$ST_DIFF" "$tmp/ppexe.st" "$tmp/pp-train.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "a compiled pp=2 CUDA executable (the schedule in its program, no IR) trains bitwise as loom train"
else
  bad "compiled pp=2 CUDA executable"; tail -n 5 "$tmp/log" "$tmp/log3"; grep FAIL "$tmp/diff" | head -3
fi
pipe llama-tiny-4l "pp=2, afab" --mesh pp=2 --pp-schedule afab
pipe llama-tiny-4l "pp=2, zb-h1 (B and W split)" --mesh pp=2 --pp-schedule zb-h1
pipe llama-tiny-4l "pp=2, interleaved (v=2)" --mesh pp=2 --pp-schedule interleaved
pipe llama-tiny-4l "pp=2, dualpipev (a transfer to the rank itself at the V)" --mesh pp=2 --pp-schedule dualpipev
pipe gpt2-tiny-4l "pp=4, zb-h1 (tied embedding: the optimizer steps exchange its gradient)" --mesh pp=4 --pp-schedule zb-h1 \
  --grad-accum 8
pipe llama-tiny-4l "pp=2 x dp=2, ZeRO-1" --mesh pp=2,dp=2 --zero 1
pipe llama-tiny-4l "pp=2 x tp=2, sequence parallel" --mesh pp=2,tp=2 --sequence-parallel true
pipe llama-tiny-4l "pp=2 x cp=2 (ring attention in the chunks)" --mesh pp=2,cp=2
# validation through the forward-only schedule, and a pipeline's checkpoint (a shard per rank,
# each global written by the stage that updates it) resumed on one CPU rank: 2 + 2 = 4 straight
v=(models/llama-tiny-4l.json --data "$tmp/d.bin" --steps 2 --batch 4 --seq 32 --grad-accum 4 --val-data "$tmp/d.bin"
   --val-tokens 256 --mesh pp=2)
vc=$("$LOOM" train "${v[@]}" --backend cpu 2>&1 | grep -o 'val [0-9.]*' | tr '\n' ' ')
vg=$("$LOOM" train "${v[@]}" --backend cuda 2>&1 | grep -o 'val [0-9.]*' | tr '\n' ' ')
[ -n "$vc" ] && [ "$vc" = "$vg" ] && ok "pp=2 validation loss on cuda ($vg) = the cpu mesh's" ||
  bad "pp=2 validation loss: cuda '$vg', cpu '$vc'"
f=(models/llama-tiny-4l.json --data "$tmp/d.bin" -q --batch 4 --seq 32 --eps 1e-4 --grad-accum 4 --lr 0.01 --min-lr 0.01
   --warmup 0 --allow-changes)
"$LOOM" train "${f[@]}" --steps 4 --out "$tmp/pstraight.st" > "$tmp/log" 2>&1
"$LOOM" train "${f[@]}" --steps 2 --mesh pp=2 --pp-schedule zb-h1 --backend cuda --save-dir "$tmp/ckpp" > "$tmp/log" 2>&1
"$LOOM" train "${f[@]}" --steps 4 --resume "$tmp/ckpp" --out "$tmp/presumed.st" > "$tmp/log2" 2>&1
if "$ST_DIFF" "$tmp/presumed.st" "$tmp/pstraight.st" --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "a pp=2 zb-h1 CUDA checkpoint resumed on one CPU rank: 2 + 2 steps = 4 straight within 1e-4"
else
  bad "pp=2 CUDA checkpoint resumed on the CPU"; tail -n 5 "$tmp/log" "$tmp/log2"; grep FAIL "$tmp/diff" | head -3
fi
# refused before any process starts: cp with a split backward (the ring's gradients cross
# from @bwd_b to @bwd_w, which NCCL's in-function ring plan cannot pair)
if ! "$LOOM" train models/llama-tiny-4l.json --data "$tmp/d.bin" --steps 1 --batch 4 --seq 32 --grad-accum 4 \
     --mesh pp=2,cp=2 --pp-schedule zb-h1 --backend cuda > "$tmp/log" 2>&1 &&
   grep -q "use --pp-schedule 1f1b or interleaved with cp on cuda" "$tmp/log"; then
  ok "pp=2 x cp=2 with zb-h1 on cuda refused with the fix: $(grep -o 'a split backward.*' "$tmp/log" | cut -c1-100)"
else
  bad "pp x cp with zb-h1 on cuda"; tail -3 "$tmp/log"
fi
# ---------------------------------------------------------------------------------------

# 5. SIGTERM to `loom train` that started a CUDA mesh's ranks: the supervisor passes it on, the
#    ranks agree on the step to stop after (Executor.agree_stop), write one sharded checkpoint,
#    exit 143; resumed to two steps more: the uninterrupted run's bits.  Step lines of rank 0
#    reach the file as they are printed (a rank's stdout is a file too).
sig_flags=(tests/golden/gpt2-tiny/train_spec.json --batch 4 --warmup 0 --lr 0.01 --min-lr 0.01 --mesh dp=2 --zero 1
           --backend cuda)
"$LOOM" train "${sig_flags[@]}" --steps 1000000 --save-dir "$tmp/ck-sig" > "$tmp/sig.out" 2> "$tmp/sig.err" &
pid=$!
seen=0   # rank 0's step line in the file while the run goes on: its stdout is line-buffered too
for i in $(seq 1200); do grep -q '^step ' "$tmp/sig.out" 2> /dev/null && { seen=1; break; }; kill -0 $pid 2> /dev/null || break; sleep 0.1; done
kill -TERM $pid 2> /dev/null
wait $pid
rc=$?
k=$(ls "$tmp/ck-sig" 2> /dev/null | sed -n 's/^step_0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
if [ $seen = 1 ] && [ $rc = 143 ] && [ -n "$k" ] && [ -f "$tmp/ck-sig/step_$(printf %08d "$k")/DONE" ] &&
   grep -q "stopped by SIGTERM after step $k of 1000000" "$tmp/sig.err"; then
  ok "a CUDA mesh (dp=2, one process per rank) stopped by SIGTERM: exit 143, every rank stopped after step $k, one checkpoint"
  "$LOOM" train "${sig_flags[@]}" -q --steps $((k + 2)) --resume "$tmp/ck-sig" --allow-changes --out "$tmp/sig-res.st" \
    > "$tmp/log" 2>&1
  "$LOOM" train "${sig_flags[@]}" -q --steps $((k + 2)) --out "$tmp/sig-full.st" > "$tmp/log2" 2>&1
  if cmp -s "$tmp/sig-res.st" "$tmp/sig-full.st"; then
    ok "the CUDA mesh stopped at step $k and resumed to $((k + 2)): bitwise the uninterrupted run"
  else
    bad "the CUDA mesh's stop checkpoint resumed differs"; tail -3 "$tmp/log" "$tmp/log2"
  fi
else
  bad "a CUDA mesh stopped by SIGTERM (step line seen while running: $seen, exit $rc, checkpoint step '${k}')"; tail -5 "$tmp/sig.out" "$tmp/sig.err"
fi

# 4. faults (LOOM_NCCL_FAULT, runtime/comm/comm_nccl.c's test hook)
fault() {   # kind, what, expected text
  local t0=$SECONDS
  LOOM_NCCL_FAULT=$1:1:6 "$LOOM" train models/gpt2-tiny.json --data "$tmp/d.bin" --steps 50 --batch 4 --seq 32 \
    --mesh dp=2 --backend cuda --nccl-timeout 3 --save-dir "$tmp/fault-$1" > "$tmp/fault.log" 2>&1
  local rc=$? took=$((SECONDS - t0))
  sleep 1
  local left; left=$(pgrep -f "$tmp/fault-$1" | wc -l)
  if [ $rc != 0 ] && [ "$took" -le 30 ] && [ "$left" = 0 ] && grep -q "$3" "$tmp/fault.log"; then
    ok "$2: exit $rc after $took s, no process left, the report: $(grep -m1 "$3" "$tmp/fault.log" | cut -c1-150)"
  else
    bad "$2 (exit $rc after $took s, $left processes left)"; tail -20 "$tmp/fault.log"
    pkill -9 -f "$tmp/fault-$1"
  fi
}
fault hang "a rank that never reaches collective #6 (--nccl-timeout 3)" "did not complete within 3 s"
fault kill "a rank killed before collective #6" "killed by signal 9"
grep -q "collective #6" "$tmp/fault.log" || true

echo "$pass passed, $fail failed"
[ $fail = 0 ]
