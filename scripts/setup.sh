#!/usr/bin/env bash
# Install what corral needs on a Debian/Ubuntu machine, at one of two levels:
#
#   scripts/setup.sh --for run    what `corral up` runs (scripts/up.sh calls this)
#   scripts/setup.sh [--for test] that, and what the tests, benchmarks and protos'
#                                 generator use (scripts/test.sh calls this)
#
# Idempotent: each step runs only when its result is missing or out of date.
#
# run:
#   - Debian packages: MariaDB (`corral up` starts a private server of its own;
#     the system service is neither started nor configured here), the container
#     runtimes (crun, preferred, and runc: services/worker/oci/runc.py), the OCI
#     tools (umoci, skopeo) and iptables (containers' networks,
#     services/worker/oci/network.py), the OCI registry `corral up`
#     runs on loopback (docker-registry), the static busybox it seeds it with
#     (busybox-static), what builds its Debian base images (mmdebstrap,
#     faketime for Java's trust store, Debian's archive keys) and Graphviz
#     (graphviz: `dot` lays out the web UI's DAG, services/web/drawing/);
#   - on a hybrid cgroup layout (v1 hierarchies, v2 at /sys/fs/cgroup/unified)
#     whose v2 holds a controller no v1 hierarchy has (hugetlb, on some hosts),
#     that controller mounted as a v1 hierarchy of its own, as systemd's hybrid
#     layout does: crun refuses the layout otherwise (and runc runs the
#     containers instead, at some four times crun's cost per container);
#   - .venv with corral installed editable (`pip install -e .`: pyproject's
#     dependencies, no extras), re-installed when pyproject.toml changes.
# test adds:
#   - Debian packages: Node.js for buf, Azurite and axe-core, golang-grpc-gateway
#     (protoc-gen-swagger, with which scripts/gen_protos.py writes
#     corral/openapi.json), Slurm with munge (`bench slurm-compare` runs a
#     private one on loopback; the system services are not used), and Chromium
#     with NSS's certutil for the web tier (tests/web: Playwright drives
#     Debian's Chromium, as `playwright install` cannot download its own here,
#     and certutil makes it trust a test's CA);
#   - the dev and bench extras in .venv (`pip install -e '.[dev,bench]'`);
#   - the buf CLI in .tools/;
#   - Azurite (the Azure Blob Storage emulator) in .tools/azurite;
#   - axe-core, the accessibility checker the web tier injects into pages, in
#     .tools/axe: `npm ci` from tests/web/package-lock.json, which pins its
#     version and records its integrity hash.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/setup.sh [--for run|test]   (default: test, everything)"; }

LEVEL=test
while (($#)); do
    case $1 in
        --for) LEVEL=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
        --for=*) LEVEL=${1#--for=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "setup: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
if [[ $LEVEL != run && $LEVEL != test ]]; then
    echo "setup: --for takes run or test, not '$LEVEL'" >&2
    exit 2
fi

RUN_PACKAGES=(mariadb-server mariadb-client crun runc umoci skopeo iptables docker-registry busybox-static
              mmdebstrap faketime debian-archive-keyring graphviz)
TEST_PACKAGES=(nodejs npm golang-grpc-gateway slurm-wlm munge chromium libnss3-tools)
BUF_VERSION=1.75.0
# Azurite runs in a prefix of its own: npm prunes packages it was not asked for, so sharing buf's would
# remove one or the other. 3.35.0 is the newest that runs on Node.js 20 (3.36 wants 21, 3.37 wants 22).
AZURITE_VERSION=3.35.0
# One stamp per level, each holding pyproject.toml's digest when that level was installed: a .venv made
# by scripts/up.sh (run) gets the extras at the first scripts/test.sh, and a test install counts as run.
RUN_STAMP=.venv/.corral-run.sha256
TEST_STAMP=.venv/.corral-test.sha256
OLD_TEST_STAMP=.venv/.corral-pyproject.sha256 # before the levels: written by an install with the extras

say() { echo "setup: $*"; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        echo "setup: need root (or sudo) to run: $*" >&2
        exit 1
    fi
}

is_installed() {
    [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == "install ok installed" ]] && return 0
    # NodeSource's nodejs package ships npm itself and conflicts with Debian's
    # npm package, so an npm on the PATH counts.
    [[ $1 == npm ]] && command -v npm >/dev/null
}

stamped() { # stamped FILE...: whether one of the stamps holds pyproject.toml's digest
    local stamp
    for stamp in "$@"; do
        [[ -f $stamp && $(cat "$stamp") == "$pyproject_sha256" ]] && return 0
    done
    return 1
}

packages=("${RUN_PACKAGES[@]}")
[[ $LEVEL == test ]] && packages+=("${TEST_PACKAGES[@]}")
missing=()
for package in "${packages[@]}"; do
    is_installed "$package" || missing+=("$package")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    # Under systemd, the docker-registry package starts a system registry on every interface (:5000),
    # without authentication. corral runs its own on loopback (services/registry), so the system one
    # goes again, if this run installed it.
    if [[ " ${missing[*]} " == *" docker-registry "* && -d /run/systemd/system ]]; then
        say "stopping and disabling the system docker-registry service (corral runs its own on loopback)"
        as_root systemctl disable --now docker-registry.service || true
    fi
    # Likewise Slurm's and munge's system daemons: the benchmark runs its own, on loopback, with its own key.
    if [[ " ${missing[*]} " == *" slurm-wlm "* && -d /run/systemd/system ]]; then
        say "stopping and disabling the system slurmctld, slurmd and munge services (the benchmark runs its own)"
        as_root systemctl disable --now slurmctld.service slurmd.service munge.service || true
    fi
else
    say "Debian packages present ($LEVEL)"
fi

# crun 1.8 refuses a hybrid cgroup layout whose v2 holds a controller; a controller that no v1 hierarchy
# has is in v2, and moves to a v1 hierarchy mounted for it (allowed while no v2 cgroup enables it).
if [[ -r /sys/fs/cgroup/unified/cgroup.controllers ]]; then
    for controller in $(cat /sys/fs/cgroup/unified/cgroup.controllers); do
        say "mounting the cgroup controller $controller as a v1 hierarchy (crun refuses it in the hybrid v2)"
        if ! { as_root mkdir -p "/sys/fs/cgroup/$controller" &&
               as_root mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"; }; then
            say "could not: the OCI runtime will use runc instead of crun on this host"
        fi
    done
fi

if [[ ! -x .venv/bin/python ]]; then
    if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "setup: corral needs Python 3.11 or newer; python3 is $(python3 --version 2>&1)" >&2
        exit 1
    fi
    say "creating .venv with $(python3 --version)"
    python3 -m venv .venv
fi

pyproject_sha256=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ $LEVEL == run ]]; then
    if stamped "$RUN_STAMP" "$TEST_STAMP" "$OLD_TEST_STAMP"; then
        say ".venv up to date with pyproject.toml"
    else
        say "installing corral into .venv (pip install -e .)"
        .venv/bin/pip install -q -e .
        echo "$pyproject_sha256" >"$RUN_STAMP"
    fi
    exit 0
fi
if stamped "$TEST_STAMP" "$OLD_TEST_STAMP"; then
    say ".venv up to date with pyproject.toml, with the test extras"
else
    say "installing corral into .venv with the test extras (pip install -e '.[dev,bench]')"
    .venv/bin/pip install -q -e '.[dev,bench]'
    echo "$pyproject_sha256" >"$TEST_STAMP"
    echo "$pyproject_sha256" >"$RUN_STAMP"
    rm -f "$OLD_TEST_STAMP"
fi

if [[ ! -x .tools/node_modules/.bin/buf ]]; then
    say "installing buf $BUF_VERSION into .tools"
    npm install --no-save --prefix .tools "@bufbuild/buf@$BUF_VERSION"
else
    say "buf present"
fi

if [[ $(cat .tools/azurite/node_modules/azurite/package.json 2>/dev/null) != *"\"version\": \"$AZURITE_VERSION\""* ]]; then
    say "installing azurite $AZURITE_VERSION into .tools/azurite"
    npm install --no-save --no-audit --no-fund --loglevel=error --prefix .tools/azurite "azurite@$AZURITE_VERSION" >/dev/null
else
    say "azurite present"
fi

# `npm ci` installs exactly what the lock file names and checks each package's integrity hash against it; it
# wants package.json and the lock beside node_modules, so both are copied into the prefix, and a changed lock
# installs again.
if ! cmp -s tests/web/package-lock.json .tools/axe/package-lock.json \
    || [[ ! -f .tools/axe/node_modules/axe-core/axe.min.js ]]; then
    say "installing axe-core into .tools/axe (npm ci, tests/web/package-lock.json)"
    mkdir -p .tools/axe
    cp tests/web/package.json tests/web/package-lock.json .tools/axe/
    npm ci --no-audit --no-fund --loglevel=error --prefix .tools/axe >/dev/null
else
    say "axe-core present"
fi
