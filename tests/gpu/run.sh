#!/usr/bin/env bash
# tests/gpu/run.sh — the tests that need an NVIDIA GPU.  A session with a GPU runs, from the
# repository root:
#
#     bash tests/gpu/run.sh [BUILD_DIR]        (default: build-gpu)
#
# Without a GPU it prints "SKIPPED: no GPU (...)" and exits 0.  With one it
#   1. builds everything in BUILD_DIR (RelWithDebInfo, no sanitizers: ASan and the CUDA
#      driver do not mix; ctest's CPU tests are not rerun here);
#   2. runs build/test_cuda_runtime --gpu: hand-written PTX kernels and cuBLASLt GEMMs (f32,
#      bf16, transposed, batched) through cuda_program_call against a C mirror, globals
#      initialized bitwise as on the CPU, the training Executor, error reports (a missing
#      kernel, a bad module, a faulting kernel and recovery from it), a one-rank NCCL world;
#   3. runs every tests/gpu/test_*.sh as `bash SCRIPT BUILD_DIR` (GPU vs CPU per op and for
#      a whole training step, goldens: one script each; exit 0 = pass, 77 = skipped);
#   4. reruns test_cuda_runtime --gpu --no-fault under compute-sanitizer (memcheck), and a
#      training step of gpt2-tiny and llama-tiny in fp32 and bf16 under memcheck and
#      racecheck, when the toolkit has it.
# It ends with "N passed, N failed" and exits 1 if anything failed.
set -u
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIPPED: no GPU (nvidia-smi not found)"
  exit 0
fi
if ! gpus=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$gpus"; then
  echo "SKIPPED: no GPU (no device: $(head -1 <<<"$gpus"))"
  exit 0
fi
echo "== GPUs"
echo "$gpus"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null || true

passed=0
failed=0
failures=()
result() {   # name status
  case $2 in
    0) passed=$((passed + 1)); echo "PASS: $1" ;;
    77) echo "SKIP: $1" ;;
    *) failed=$((failed + 1)); failures+=("$1"); echo "FAIL: $1 (exit $2)" ;;
  esac
}

echo "== build ($BUILD)"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$BUILD.cmake.log" 2>&1; then
  tail -30 "$BUILD.cmake.log"
  echo "FAIL: cmake (see $BUILD.cmake.log)"
  echo "0 passed, 1 failed"
  exit 1
fi
if ! cmake --build "$BUILD" -j"$(nproc)" >"$BUILD.build.log" 2>&1; then
  grep -E 'error|Error' "$BUILD.build.log" | head -30
  echo "note: the full build failed (see $BUILD.build.log); building test_cuda_runtime alone"
  result "build (all targets)" 1
  cmake --build "$BUILD" -j"$(nproc)" --target test_cuda_runtime >>"$BUILD.build.log" 2>&1 || {
    echo "FAIL: test_cuda_runtime does not build"
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
  }
fi

echo "== test_cuda_runtime --gpu"
timeout 900 "$BUILD/test_cuda_runtime" --gpu
result "test_cuda_runtime --gpu" $?

for t in tests/gpu/test_*.sh; do
  [ -e "$t" ] || continue
  echo "== $t"
  timeout 1800 bash "$t" "$BUILD"
  result "$t" $?
done

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  # --report-api-errors no: the test provokes API errors on purpose (a missing kernel, a bad
  # module), and NCCL probes its kernels with calls that fail on an H200 (seen 2026-11-26)
  echo "== compute-sanitizer memcheck: test_cuda_runtime --gpu --no-fault"
  timeout 1800 "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 99 "$BUILD/test_cuda_runtime" --gpu --no-fault
  result "compute-sanitizer memcheck" $?
  # loom's generated kernels: a training step of the tiny models in f32 and bf16 (the
  # tensor-core attention), under memcheck and racecheck (shared-memory hazards)
  for tool in memcheck racecheck; do
    for m in gpt2-tiny llama-tiny; do
      for prec in fp32 bf16; do
        echo "== compute-sanitizer $tool: loom train $m --precision $prec --backend cuda --steps 1"
        timeout 1800 "$sanitizer" --tool $tool --error-exitcode 99 "$BUILD/loom" train tests/golden/$m/train_spec.json -q \
          --backend cuda --precision $prec --steps 1 > "$BUILD.sanitizer.log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && tail -20 "$BUILD.sanitizer.log"
        result "compute-sanitizer $tool: $m $prec training step" $rc
      done
    done
  done
else
  echo "SKIP: compute-sanitizer not found"
fi

[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
