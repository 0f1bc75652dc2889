# tests/cli/setup.sh — scripts/setup, the README's set-up step (issue 29 section 1): as root it
# runs apt-get itself (no sudo: containers and CI images have none), as another user through
# sudo, and with neither it says what to do (exit 2).  --dry-run prints the commands; a
# package list with a package that is surely not installed makes it have something to do.
# usage: bash tests/cli/setup.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

SETUP=$PWD/scripts/setup
printf 'bash\nloom-surely-not-a-package\n' >"$TMP/list.txt"
export LOOM_SETUP_LIST=$TMP/list.txt

LOOM_SETUP_UID=0 expect_exit 0 "as root: the commands, dry" bash "$SETUP" --dry-run
check "  apt-get without sudo" grep -qx "apt-get update -qq" "$OUT"
check "  installs only the missing package" \
  grep -qx "env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq loom-surely-not-a-package" "$OUT"
# a user with sudo: a stand-in sudo first in PATH
mkdir "$TMP/bin"
printf '#!/bin/sh\nexec "$@"\n' >"$TMP/bin/sudo"
chmod +x "$TMP/bin/sudo"
PATH=$TMP/bin:$PATH LOOM_SETUP_UID=1000 expect_exit 0 "as a user with sudo: the commands, dry" bash "$SETUP" --dry-run
check "  apt-get through sudo" grep -qx "sudo apt-get update -qq" "$OUT"
check "  install through sudo" grep -qx "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq loom-surely-not-a-package" "$OUT"
# a user without sudo: only where this machine has none (PATH cannot hide /usr/bin's)
if ! command -v sudo >/dev/null 2>&1; then
  LOOM_SETUP_UID=1000 expect_exit 2 "as a user without sudo" bash "$SETUP" --dry-run
  expect_stderr_contains "has no sudo: run 'bash scripts/setup' as root"
else
  echo "SKIP a user without sudo: this machine has sudo"
fi
# nothing missing: nothing to run
printf 'bash\n' >"$TMP/have.txt"
LOOM_SETUP_LIST=$TMP/have.txt expect_exit 0 "every package installed" bash "$SETUP" --dry-run
expect_stdout_contains "is installed"
check "  no command printed" bash -c "! grep -q apt-get '$OUT'"
expect_exit 2 "an unknown option" bash "$SETUP" --yes
expect_stderr_contains "unknown option '--yes'"
# the README's set-up line and CI call it
check "README's quick start calls scripts/setup" grep -q '^bash scripts/setup && cmake -S . -B build' README.md
check ".ci/run calls scripts/setup" grep -qx 'bash scripts/setup' .ci/run
finish
