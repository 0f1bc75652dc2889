#!/usr/bin/env bash
# tests/gpu/bundle.sh — a loom build that runs on a GPU machine where loom's build
# dependencies are not installed (the library's device machines: CUDA, CMake and PyTorch,
# but no LLVM 14, OpenBLAS, jansson or PCRE2, and nothing can be fetched there).
#
#     bash tests/gpu/bundle.sh [BUILD_DIR]     (default /tmp/loom-bundle-build)
#
# Builds loom, loom-train and test_cuda_runtime here (RelWithDebInfo, no sanitizers, LLVM
# linked statically: LOOM_LLVM_STATIC=ON), copies them with the shared libraries they need
# that a plain Linux image lacks (OpenBLAS and its Fortran runtime, jansson, PCRE2, z3,
# libxml2 and ICU: everything but the C and C++ runtimes), and writes .gpu/bundle.tar.xz
# (ignored by git), and .gpu/attn_tu.cu (the CUDA source bench/attention_gpu.py takes its
# kernels from). A `run` call carries `.gpu`; tests/gpu/device_checks.sh unpacks it into
# build-gpu/ and puts build-gpu/lib on LD_LIBRARY_PATH. The CUDA libraries are not in it:
# loom dlopens the device machine's own (LOOM_LIBNVRTC, LOOM_LIBCUBLASLT, LOOM_LIBNCCL).
set -eu
cd "$(dirname "$0")/../.."
B=${1:-/tmp/loom-bundle-build}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_LLVM_STATIC=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed > "$B.cmake.log" 2>&1 || { tail -20 "$B.cmake.log"; exit 1; }
cmake --build "$B" -j"$(nproc)" --target loom loom-train test_cuda_runtime > "$B.build.log" 2>&1 ||
  { grep -E 'error|Error' "$B.build.log" | head -20; exit 1; }
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for exe in loom loom-train test_cuda_runtime; do
  strip --strip-debug -o "$stage/$exe" "$B/$exe"
done
printf '#!/bin/sh\n# loom diff, as the tests call it\nexec "$(dirname "$0")/loom" diff "$@"\n' > "$stage/st_diff"
chmod +x "$stage/st_diff"
for lib in $(ldd "$B/loom" "$B/test_cuda_runtime" | awk '$3 ~ /^\// {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;  # the image's own
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
mkdir -p .gpu
# the attention kernels' translation unit bench/attention_gpu.py builds from (checks 12 and 20)
"$B/loom" ir models/gpt2-124M.json --passes=train,lower --precision bf16 --target=cuda --emit=cuda \
  -o .gpu/attn_tu.cu > /dev/null
tar cf - -C "$stage" . | xz -T"$(nproc)" -6 > .gpu/bundle.tar.xz
echo "wrote .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1)): $(ls "$stage" "$stage/lib" | tr '\n' ' ')"
