#!/usr/bin/env bash
# Fuzzing of every reader of untrusted input (tests/fuzz/README.md).
#
#   bash tests/fuzz/run.sh [SECONDS] [HARNESS...]
#
# Builds the harnesses with clang (-fsanitize=fuzzer,address,undefined; build-fuzz/, or
# FUZZ_BUILD), then for each harness:
#   1. replays its checked-in corpus (corpus/NAME/) and regressions (regressions/NAME/):
#      every file once; any crash, leak, sanitizer report or broken invariant fails;
#   2. fuzzes it for SECONDS (default 20; 0 skips), starting from the corpus, new inputs
#      kept in a temporary folder (the checked-in corpus is not changed), and prints the
#      executions, the coverage reached (edges "cov", features "ft") and the findings.
# A finding is saved to fuzz-findings/NAME-crash-*; copy it to regressions/NAME/, fix it, and
# CI replays it from then on.  Harnesses run FUZZ_JOBS at a time (default: the CPU count).
# Exit 0 when every replay and fuzz run is clean.
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-20}
shift || true
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${FUZZ_JOBS:-$(nproc)}
[[ $SECS =~ ^[0-9]+$ ]] || { echo "run.sh: SECONDS must be a whole number (got '$SECS')" >&2; exit 2; }
command -v clang > /dev/null || { echo "run.sh: clang is needed (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }

ALL=$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//')
HARNESSES=${*:-$ALL}
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  CC=clang cmake -S . -B "$BUILD" -DLOOM_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null || exit 1
fi
echo "== building the harnesses ($BUILD)"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$(nproc)" --target $HARNESSES 2>&1 | grep -E 'error|warning: .*fuzz' ; status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || { echo "FAIL building the harnesses"; exit 1; }

FINDINGS=fuzz-findings
mkdir -p "$FINDINGS"
LOGS=$(mktemp -d /tmp/loom-fuzz-logs.XXXXXX)
trap 'rm -rf "$LOGS"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

one() {   # harness: replay, then fuzz; writes $LOGS/NAME.result
  local h=$1 name=${1#fuzz_} bin=$BUILD/$1
  local corpus=tests/fuzz/corpus/$name regress=tests/fuzz/regressions/$name
  mkdir -p "$regress"
  local files
  files=$(find "$corpus" "$regress" -type f 2> /dev/null | wc -l)
  if ! "$bin" -runs=0 -timeout=30 -rss_limit_mb=4096 -artifact_prefix="$FINDINGS/$name-" "$corpus" "$regress" \
      > "$LOGS/$h.replay" 2>&1; then
    echo "FAIL $h: replaying $files corpus and regression files" > "$LOGS/$h.result"
    grep -E -m 12 'ERROR|SUMMARY|invariant|Test unit written|runtime error' "$LOGS/$h.replay" | sed 's/^/    /' >> "$LOGS/$h.result"
    return
  fi
  local line="PASS $h: replayed $files files"
  if [ "$SECS" -gt 0 ]; then
    local work
    work=$(mktemp -d /tmp/loom-fuzz-corpus.XXXXXX)
    "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$FINDINGS/$name-" "$work" "$corpus" > "$LOGS/$h.fuzz" 2>&1
    local rc=$? execs cov ft
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$LOGS/$h.fuzz" | tail -1)
    cov=$(grep -E '^#[0-9]+' "$LOGS/$h.fuzz" | grep -o 'cov: [0-9]*' | tail -1 | grep -o '[0-9]*')
    ft=$(grep -E '^#[0-9]+' "$LOGS/$h.fuzz" | grep -o 'ft: [0-9]*' | tail -1 | grep -o '[0-9]*')
    local new
    new=$(find "$work" -type f | wc -l)
    rm -rf "$work"
    if [ $rc -ne 0 ]; then
      echo "FAIL $h: fuzzing for ${SECS}s found a problem (exit $rc) after ${execs:-?} executions" > "$LOGS/$h.result"
      grep -E -m 12 'ERROR|SUMMARY|invariant|Test unit written|runtime error|Slowest|timeout' "$LOGS/$h.fuzz" | sed 's/^/    /' >> "$LOGS/$h.result"
      return
    fi
    line="$line; fuzzed ${SECS}s: ${execs:-?} executions ($(( ${execs:-0} / (SECS > 0 ? SECS : 1) ))/s), cov ${cov:-?}, ft ${ft:-?}, $new new inputs, no findings"
  fi
  echo "$line" > "$LOGS/$h.result"
}

echo "== replay$( [ "$SECS" -gt 0 ] && echo " and ${SECS}s of fuzzing") per harness, $JOBS at a time"
running=0
for h in $HARNESSES; do
  one "$h" &
  running=$((running + 1))
  if [ $running -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
done
wait
fail=0
for h in $HARNESSES; do
  cat "$LOGS/$h.result"
  grep -q '^FAIL' "$LOGS/$h.result" && fail=1
done
if [ $fail -ne 0 ]; then
  echo "fuzzing: FAILED (inputs that fail are in $FINDINGS/; logs above)"
  exit 1
fi
rmdir "$FINDINGS" 2> /dev/null
echo "fuzzing: all clean"
