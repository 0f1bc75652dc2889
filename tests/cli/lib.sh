# tests/cli/lib.sh — helpers for the command-line tests (sourced, not run; ctest runs
# only files that call `finish`, and this one is harmless if run: it checks nothing).
#
#   LOOM=$1 ST_DIFF=$2 . tests/cli/lib.sh   (every script: `bash tests/cli/X.sh LOOM [ST_DIFF]`)
#
#   run CMD...                       run a command; RC, $OUT (stdout file), $ERR (stderr file)
#   expect_exit CODE "what" CMD...   run CMD, check its exit code and that it did not crash
#   expect_stderr_contains "text"    the last command's stderr holds text (fixed string)
#   expect_stdout_contains "text"    the same for stdout
#   expect_stderr_matches "regex"    extended regex on stderr
#   expect_stderr_lacks "text"       the last command's stderr does not hold text
#   check "what" CMD...              passes when CMD succeeds (a shell test, cmp, ...)
#   finish                           prints "N passed, M failed", exits non-zero on failure
#
# Every command runs with the repository root as the working directory; temporary files
# go under $TMP (mktemp -d under /tmp), removed on exit.

# Run directly (ctest globs tests/cli/*.sh): there is nothing to check.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "lib.sh holds helpers for the other tests/cli scripts"
  echo "0 passed, 0 failed"
  exit 0
fi

export LC_ALL=C
PASSED=0
FAILED=0
TMP=$(mktemp -d /tmp/loom-cli.XXXXXX) || { echo "FAIL cannot create a temporary directory"; exit 1; }
trap 'rm -rf "$TMP"' EXIT
OUT=$TMP/.stdout
ERR=$TMP/.stderr
RC=0
LAST=""
# Leaks are real failures too, but keep sanitizer output short if it happens.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

if [ -z "${LOOM:-}" ] || [ ! -x "$LOOM" ]; then
  echo "FAIL usage: bash $0 PATH-TO-LOOM [PATH-TO-ST_DIFF] (got '${LOOM:-}')"
  echo "0 passed, 1 failed"
  exit 1
fi
case "$LOOM" in /*) ;; *) LOOM=$PWD/$LOOM ;; esac
# st_diff: the second argument, else next to the loom binary.
if [ -z "${ST_DIFF:-}" ] && [ -x "$(dirname "$LOOM")/st_diff" ]; then ST_DIFF=$(dirname "$LOOM")/st_diff; fi
if [ -n "${ST_DIFF:-}" ]; then case "$ST_DIFF" in /*) ;; *) ST_DIFF=$PWD/$ST_DIFF ;; esac; fi

pass() {
  PASSED=$((PASSED + 1))
  echo "PASS $1"
}

fail() {
  FAILED=$((FAILED + 1))
  echo "FAIL $1"
  shift
  local line
  for line in "$@"; do echo "    $line"; done
}

# Shows the tail of the last command's output under a failure.
show_last() {
  echo "    command: $LAST"
  echo "    exit code: $RC"
  if grep -qE 'Sanitizer|runtime error:' "$ERR" 2>/dev/null; then
    echo "    sanitizer report:"
    grep -E -m 3 -A 4 'ERROR: [A-Za-z]*Sanitizer|runtime error:' "$ERR" | head -n 12 | sed 's/^/      /'
  elif [ -s "$ERR" ]; then
    echo "    stderr:"
    tail -n 8 "$ERR" | sed 's/^/      /'
  fi
  if [ -s "$OUT" ]; then echo "    stdout:"; tail -n 4 "$OUT" | sed 's/^/      /'; fi
}

run() {
  LAST="$*"
  "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# A crash: killed by a signal, or a sanitizer report.
crashed() {
  [ "$RC" -ge 128 ] && return 0
  grep -qE 'AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|Segmentation fault|core dumped' "$ERR" "$OUT" 2>/dev/null
}

expect_exit() {
  local code=$1 what=$2
  shift 2
  run "$@"
  if crashed; then
    fail "$what: crashed (exit $RC)"
    show_last
  elif [ "$RC" -ne "$code" ]; then
    fail "$what: exit code $RC, expected $code"
    show_last
  else
    pass "$what (exit $code)"
  fi
}

expect_stderr_contains() {
  if grep -qF -- "$1" "$ERR"; then pass "  stderr mentions: $1"
  else fail "  stderr should mention: $1"; show_last; fi
}

expect_stdout_contains() {
  if grep -qF -- "$1" "$OUT"; then pass "  stdout mentions: $1"
  else fail "  stdout should mention: $1"; show_last; fi
}

expect_stderr_matches() {
  if grep -qE -- "$1" "$ERR"; then pass "  stderr matches: $1"
  else fail "  stderr should match: $1"; show_last; fi
}

expect_stderr_lacks() {
  if grep -qF -- "$1" "$ERR"; then fail "  stderr should not mention: $1"; show_last
  else pass "  stderr does not mention: $1"; fi
}

check() {
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

# Copies a safetensors file with its JSON header edited by a sed expression; the header
# length is rewritten (the data offsets are relative to the data, so they stay valid).
st_edit_header() {
  local in=$1 out=$2 expr=$3 n h len b shift_by
  n=$(od -An -t u8 -N8 "$in" | tr -d ' ')
  h=$(dd if="$in" bs=1 skip=8 count="$n" 2>/dev/null | sed "$expr")
  len=${#h}
  b=""
  for shift_by in 0 8 16 24 32 40 48 56; do b="$b\\x$(printf %02x $(((len >> shift_by) & 255)))"; done
  printf "$b" >"$out"
  printf '%s' "$h" >>"$out"
  tail -c +$((9 + n)) "$in" >>"$out"
}

# Writes bytes (printf escapes) at a byte offset of a file, in place.
poke() {
  local file=$1 offset=$2 bytes=$3
  printf "$bytes" | dd of="$file" bs=1 seek="$offset" conv=notrunc 2>/dev/null
}

finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
  exit $?
}
