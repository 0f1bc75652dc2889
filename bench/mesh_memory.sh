#!/usr/bin/env bash
# Host memory of a CUDA mesh's processes at the start and at --out (issue 15): GPT-2 124M loaded from a
# Hugging Face safetensors file by one rank (`--backend cuda`, one GPU: whole host copies of
# the parameters and optimizer state) against tp=2 (each process reads only its slices of
# the memory-mapped file and holds only its pieces).  Prints each run's peak resident memory
# after the start (`--steps 0`), as rank 0 logs it.
#   bash bench/mesh_memory.sh BUILD_DIR
# Without a GPU it runs on the emulated device (BUILD_DIR's test doubles); there the device
# memory is host memory too, and what the start writes of it (the parameters; zeroed state
# is not touched) counts in the figure.  With LOOM_MESH_REAL=1 (2+ GPUs) the real libraries.
set -e
B=${1:-build}
LOOM=$B/loom
if [ "${LOOM_MESH_REAL:-0}" != 1 ]; then
  export LOOM_LIBCUDA=$B/libloom_fake_cuda.so LOOM_LIBNVRTC=$B/libloom_fake_nvrtc.so \
    LOOM_LIBCUBLASLT=$B/libloom_fake_cublaslt.so LOOM_LIBNCCL=$B/libloom_fake_nccl.so LOOM_EMU_DEVICES=8
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export LOOM_CACHE_DIR=$tmp/cache
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null
"$LOOM" train models/gpt2-124M.json --data "$tmp/d.bin" --steps 0 --backend cpu --batch 1 --seq 64 -q --out "$tmp/w.st" > /dev/null
echo "GPT-2 124M ($(du -m "$tmp/w.st" | cut -f1) MB of f32 safetensors), batch 1 x seq 64, --steps 0, $(lscpu | grep 'Model name' | sed 's/.*: *//')"
for mesh in "" "--mesh tp=2" "--mesh tp=4"; do
  line=$("$LOOM" train models/gpt2-124M.json --data "$tmp/d.bin" --init "$tmp/w.st" --steps 0 --backend cuda --batch 1 \
    --seq 64 $mesh 2>&1 | grep -o 'host memory peak so far [0-9]* MiB')
  printf '  %-14s %s\n' "${mesh:-one rank}" "$line"
done
# --out at the end: a .safetensors file is streamed a tensor at a time (Executor.stream_param:
# each global gathered into one reusable buffer); a Hugging Face folder (--out DIR/) still
# gathers every parameter and optimizer moment into whole host copies first
echo "GPT-2 124M, tp=2, one step, then --out; rank 0's host memory peak over the whole run:"
for out in "$tmp/o.st" "$tmp/hf/"; do
  line=$("$LOOM" train models/gpt2-124M.json --data "$tmp/d.bin" --init "$tmp/w.st" --steps 1 --backend cuda --batch 1 \
    --seq 64 --mesh tp=2 --out "$out" 2>&1 | grep -o "rank 0's host memory peak [0-9]* MiB")
  printf '  %-40s %s\n' "--out $(case $out in */) echo 'DIR/ (whole gather)';; *) echo 'F.safetensors (streamed)';; esac)" "$line"
done
