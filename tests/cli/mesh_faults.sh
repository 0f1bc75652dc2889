#!/usr/bin/env bash
# The CPU mesh's fault hook and watchdog (runtime/comm/comm_local.c), as emu.nccl checks the
# NCCL ones: LOOM_MESH_FAULT=fail:R:N, kill:R:N or hang:R:N on a tiny model's dp=2, tp=2,
# pp=2 and eval runs; each ends every rank, exits 1 within seconds (LOOM_MESH_TIMEOUT=2 for
# the hangs) and names the rank and the collective; bad settings exit 2.
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
G=tests/golden/gpt2-tiny
TRAIN=("$LOOM" train models/gpt2-tiny.json --data $G/tokens.bin --steps 2 -q)

# run_fault WHAT SECONDS ENV... -- CMD...: exit 1 within SECONDS (the timeout command's 124 fails it)
run_fault() {
  local what=$1 secs=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  expect_exit 1 "$what" env "${envs[@]}" timeout 60 "$@"
  check "  ended within $secs s (took $((SECONDS - t0)) s)" [ $((SECONDS - t0)) -le "$secs" ]
}

expect_exit 0 "dp=2 without a fault (the control)" "${TRAIN[@]}" --mesh dp=2

run_fault "dp=2, LOOM_MESH_FAULT=fail:1:3" 20 LOOM_MESH_FAULT=fail:1:3 -- "${TRAIN[@]}" --mesh dp=2
expect_stderr_contains "rank 1: collective #3 (all_reduce over dp) failed (LOOM_MESH_FAULT=fail:1:3)"
run_fault "dp=2, LOOM_MESH_FAULT=kill:0:2" 20 LOOM_MESH_FAULT=kill:0:2 -- "${TRAIN[@]}" --mesh dp=2
expect_stderr_contains "rank 0 died before collective #2 (all_reduce over dp; LOOM_MESH_FAULT=kill:0:2)"
run_fault "dp=2 on the reference executor, fail:0:1" 20 LOOM_MESH_FAULT=fail:0:1 -- "${TRAIN[@]}" --mesh dp=2 --backend ref
expect_stderr_contains "rank 0: collective #1 ("

# A rank that hangs: the others' watchdog ends the run, naming who never came.
run_fault "tp=2, LOOM_MESH_FAULT=hang:1:4 (LOOM_MESH_TIMEOUT=2)" 20 LOOM_MESH_FAULT=hang:1:4 LOOM_MESH_TIMEOUT=2 -- \
  "${TRAIN[@]}" --mesh tp=2
expect_stderr_contains "rank 1: LOOM_MESH_FAULT=hang:1:4: stopping forever before collective #4"
expect_stderr_matches "rank 0: collective #4 \(all_reduce over tp\) did not complete within 2 s: rank 1 never joined it"
run_fault "pp=2, hang:1:2 in the pipeline (LOOM_MESH_TIMEOUT=2)" 20 LOOM_MESH_FAULT=hang:1:2 LOOM_MESH_TIMEOUT=2 -- \
  "${TRAIN[@]}" --mesh pp=2
expect_stderr_contains "stopping forever before collective #2"
expect_stderr_contains "rank 1 never"
run_fault "loom eval --mesh tp=2, fail:1:1" 20 LOOM_MESH_FAULT=fail:1:1 -- "$LOOM" eval models/gpt2-tiny.json \
  --weights $G/weights.safetensors --tokens $G/tokens.bin --mesh tp=2
expect_stderr_contains "rank 1: collective #1 ("

# Bad settings are refused before anything runs.
expect_exit 2 "LOOM_MESH_FAULT=bogus" env LOOM_MESH_FAULT=bogus "${TRAIN[@]}" --mesh dp=2
expect_stderr_contains "LOOM_MESH_FAULT=bogus: give hang:R:N, kill:R:N or fail:R:N"
expect_exit 2 "LOOM_MESH_FAULT names rank 5 of 2" env LOOM_MESH_FAULT=fail:5:1 "${TRAIN[@]}" --mesh dp=2
expect_stderr_contains "rank R < 2"
expect_exit 2 "LOOM_MESH_TIMEOUT=abc" env LOOM_MESH_TIMEOUT=abc "${TRAIN[@]}" --mesh dp=2
expect_stderr_contains "LOOM_MESH_TIMEOUT=abc: give the seconds"

finish
