# tests/cli/install.sh — `cmake --install BUILD --prefix P`: P/bin/loom trains and compiles
# from any folder, with no path into the source or build tree (issue 29 section 1).  The
# build folder is the one holding LOOM; the prefix is a temporary folder, and every command
# runs from another temporary folder.  That the installed share/loom/ is what loom reads
# (not the source tree, which is still here) is shown by an installed file edited in place.
# usage: bash tests/cli/install.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

BUILD=$(dirname "$LOOM")
P=$TMP/prefix
SHARD=$PWD/tests/golden/gpt2-tiny/tokens.bin
expect_exit 0 "cmake --install into a temporary prefix" cmake --install "$BUILD" --prefix "$P"
for f in bin/loom bin/loom-train share/loom/models/gpt2-tiny.json share/loom/models/hardware/h100-sxm.json \
         share/loom/tools/make_golden.py share/loom/data/shakespeare.txt; do
  check "  installed $f" [ -f "$P/$f" ]
done

mkdir -p "$TMP/elsewhere"
cd "$TMP/elsewhere" || exit 1
# the built-in demo, shortened
expect_exit 0 "P/bin/loom train (the demo) from another folder" "$P/bin/loom" train --steps 3
expect_stdout_contains "training the built-in demo"
check "  it ran 3 steps" grep -qE "step +3/3" "$OUT"
# a spec from the installed models, the final weights written here
expect_exit 0 "P/bin/loom train an installed spec" "$P/bin/loom" train "$P/share/loom/models/gpt2-tiny.json" \
  --data "$SHARD" --steps 2 -q --out w.safetensors
check "  the weights were written" [ -s w.safetensors ]
# compile needs the runner beside loom; the executable then runs with nothing else
expect_exit 0 "P/bin/loom compile from another folder" "$P/bin/loom" compile "$P/share/loom/models/gpt2-tiny.json" \
  --data "$SHARD" -o trainer -q
expect_exit 0 "the compiled executable runs" ./trainer --steps 2
check "  it ran 2 steps" grep -qE "step +2/2" "$OUT"
# the hardware descriptions are read from P/share/loom: an edited copy shows in the output
sed 's/"name": "NVIDIA H100 SXM5 80GB"/"name": "installed copy of the H100"/' \
  "$P/share/loom/models/hardware/h100-sxm.json" >h100.json && cp h100.json "$P/share/loom/models/hardware/h100-sxm.json"
expect_exit 0 "P/bin/loom ir --time finds the installed hardware" "$P/bin/loom" ir "$P/share/loom/models/gpt2-tiny.json" \
  --passes=train,lower --time --hw h100
expect_stdout_contains "installed copy of the H100"
# the golden generator is found in P/share/loom too: a stand-in script there is what runs
printf 'import sys\nprint("the installed make_golden.py ran")\nsys.exit(3)\n' >"$P/share/loom/tools/make_golden.py"
run "$P/bin/loom" make-golden "$P/share/loom/models/gpt2-tiny.json" -o g
check "  make-golden ran the installed script" grep -q "the installed make_golden.py ran" "$OUT" "$ERR"
finish
