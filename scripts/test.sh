#!/usr/bin/env bash
# The test command: install what is missing, lint the protos, run pytest.
# Arguments go to pytest, e.g. `scripts/test.sh -m slow` for the soak tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "test: buf lint"
.tools/node_modules/.bin/buf lint
exec .venv/bin/python -m pytest "$@"
