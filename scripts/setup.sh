#!/usr/bin/env bash
# Install what corral's tests need on a Debian/Ubuntu machine. Idempotent:
# each step runs only when its result is missing or out of date.
#   - Debian packages: MariaDB (tests start a private server of their own; the
#     system service is neither started nor configured here), the OCI tools of
#     the container runtime (runc, umoci, skopeo), the OCI registry `corral up`
#     runs on loopback (docker-registry), the static busybox it seeds it
#     with (busybox-static) and what builds its Debian base images (mmdebstrap,
#     faketime for Java's trust store, Debian's archive keys), iptables (the partition fault cuts a worker off
#     with it), Node.js for buf, golang-grpc-gateway (protoc-gen-swagger,
#     with which scripts/gen_protos.py writes corral/openapi.json), and Slurm
#     with munge (`bench slurm-compare` runs a private one on loopback; the
#     system services are not used);
#   - .venv with corral installed editable, re-installed when pyproject.toml
#     changes;
#   - the buf CLI in .tools/;
#   - Azurite (the Azure Blob Storage emulator) in .tools/azurite.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(mariadb-server mariadb-client runc umoci skopeo docker-registry busybox-static mmdebstrap faketime debian-archive-keyring iptables nodejs npm golang-grpc-gateway
          slurm-wlm munge)
BUF_VERSION=1.75.0
STAMP=.venv/.corral-pyproject.sha256

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

missing=()
for package in "${PACKAGES[@]}"; do
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
    say "Debian packages present"
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
if [[ ! -f $STAMP || $(cat "$STAMP") != "$pyproject_sha256" ]]; then
    say "installing corral into .venv (pip install -e '.[dev,bench]')"
    .venv/bin/pip install -q -e '.[dev,bench]'
    echo "$pyproject_sha256" >"$STAMP"
else
    say ".venv up to date with pyproject.toml"
fi

if [[ ! -x .tools/node_modules/.bin/buf ]]; then
    say "installing buf $BUF_VERSION into .tools"
    npm install --no-save --prefix .tools "@bufbuild/buf@$BUF_VERSION"
else
    say "buf present"
fi

# Azurite, the Azure Blob Storage emulator the object-storage tests run on
# loopback, in a prefix of its own: npm prunes packages it was not asked for,
# so sharing buf's would remove one or the other. 3.35.0 is the newest that
# runs on Node.js 20 (3.36 wants 21, 3.37 wants 22).
AZURITE_VERSION=3.35.0
if [[ $(cat .tools/azurite/node_modules/azurite/package.json 2>/dev/null) != *"\"version\": \"$AZURITE_VERSION\""* ]]; then
    say "installing azurite $AZURITE_VERSION into .tools/azurite"
    npm install --no-save --no-audit --no-fund --loglevel=error --prefix .tools/azurite "azurite@$AZURITE_VERSION" >/dev/null
else
    say "azurite present"
fi
