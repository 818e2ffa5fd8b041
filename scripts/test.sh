#!/usr/bin/env bash
# The test command: install what is missing (what `corral up` needs and the test tools:
# scripts/setup.sh --for test), lint the protos, run pytest.
# Arguments go to pytest, e.g. `scripts/test.sh -m slow` for the soak tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --for test
echo "test: buf lint"
.tools/node_modules/.bin/buf lint
# On every core (pytest-xdist; each worker its own MariaDB), a module's tests together in one worker so that
# a module's fixtures (a `corral up`, say) start once; `-n 0` runs them in this process alone.
parallel=(-n auto --dist loadscope)
for arg in "$@"; do
    case $arg in -n | -n* | --numprocesses*) parallel=() ;; esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
