#!/usr/bin/env bash
# The run command: install what is missing, then run corral on this machine
# until Ctrl-C. Arguments go to `corral up` (e.g. --data-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
exec .venv/bin/corral up "$@"
