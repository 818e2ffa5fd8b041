#!/usr/bin/env bash
# The run command: install what `corral up` needs and is missing (the Debian
# packages it runs and .venv without the test extras: scripts/setup.sh --for
# run), then run corral on this machine until Ctrl-C. Arguments go to `corral
# up` (e.g. --data-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --for run
exec .venv/bin/corral up "$@"
