"""The OCI runtime configuration (`config.json`) of an attempt's bundle: what
runc is told to make of the job. Pure: plain data in, a dict out.

The container gets no privilege at all: an unprivileged uid and gid of the
attempt's own (no supplementary groups), no capability in any set,
`noNewPrivileges`, no core dumps (the host's core_pattern may hand them to a
host program), the kernel's interfaces of /proc and /sys masked or read-only
as runc and Docker do, only runc's default devices, and a seccomp filter
that refuses what an unprivileged process would mostly be refused anyway
but which widens the kernel's reach if allowed: new namespaces (a user
namespace would make it root of its own), mounts, keyrings, BPF,
perf events, userfaultfd, io_uring, module and kexec loading. It has its
own PID, mount, IPC, UTS, cgroup and network namespaces (loopback only, or
the one the worker made for its private or public network).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

RUNC_DEFAULT_MASKED = ("/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                       "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
                       "/sys/devices/virtual/powercap")
RUNC_DEFAULT_READONLY = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")

DENIED_SYSCALLS = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "fanotify_init",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module", "io_uring_enter",
    "io_uring_register", "io_uring_setup", "ioperm", "iopl", "kexec_file_load", "kexec_load", "keyctl",
    "lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "query_module", "quotactl", "quotactl_fd",
    "reboot", "request_key", "setns", "settimeofday", "stime", "swapoff", "swapon", "_sysctl", "syslog", "umount",
    "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86", "vm86old")
"""Refused with EPERM. (runc skips names the architecture does not have.)"""

NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
"""clone(2) with any of these is refused; clone3 is refused with ENOSYS (its flags are in memory, out of a
filter's reach), so that C libraries fall back to clone."""

EPERM = 1
ENOSYS = 38

_ARCHITECTURES = {"x86_64": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
                  "aarch64": ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]}


@dataclass(frozen=True)
class Container:
    """What the bundle says about one attempt."""

    argv: tuple[str, ...]
    env: tuple[str, ...]
    """`NAME=value` entries, in order (a name appears once)."""
    cwd: str
    uid: int
    gid: int
    hostname: str
    cgroups_path: str
    """runc's cgroup (a child of the attempt's, see cgroups.py)."""
    network_namespace: str
    """The path of the network namespace the worker made for it (network.py: a veth pair to a bridge), or
    '' for a new one with only loopback (NETWORK_MODE_NONE)."""
    shm_bytes: int
    """Size of /dev/shm (a tmpfs: what the job writes there counts as its memory)."""
    max_open_files: int
    max_file_bytes: int = 0
    """RLIMIT_FSIZE of its processes: the largest file they may write (its storage request); 0: none."""
    read_only_binds: tuple[tuple[str, str], ...] = ()
    """(host directory, container directory) mounted read-only: the job's secrets."""
    annotations: tuple[tuple[str, str], ...] = ()


def merged_env(*layers: dict[str, str] | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`NAME=value` entries from `layers` (dicts, or lists of `NAME=value` as images give them); a later
    layer's value wins, in the place of the name's first appearance."""
    merged: dict[str, str] = {}
    for layer in layers:
        items = layer.items() if isinstance(layer, dict) else (entry.partition("=")[::2] for entry in layer)
        for name, value in items:
            merged[name] = value
    return tuple(f"{name}={value}" for name, value in merged.items())


def config_json(container: Container, machine: str | None = None) -> dict:
    """The bundle's config.json, as a dict (its root filesystem is the bundle's `rootfs/`)."""
    no_caps: dict[str, list[str]] = {s: [] for s in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")]
    if container.network_namespace:
        namespaces.append({"type": "network", "path": container.network_namespace})
    else:
        namespaces.append({"type": "network"})  # new and empty: runc brings its loopback up
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": container.uid, "gid": container.gid, "additionalGids": [], "umask": 0o022},
            "args": list(container.argv),
            "env": list(container.env),
            "cwd": container.cwd,
            "capabilities": no_caps,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": container.max_open_files, "soft": container.max_open_files},
                        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
                        *([{"type": "RLIMIT_FSIZE", "hard": container.max_file_bytes,
                            "soft": container.max_file_bytes}] if container.max_file_bytes > 0 else [])],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": container.hostname,
        "mounts": _mounts(container),
        "annotations": dict(container.annotations),
        "linux": {
            "cgroupsPath": container.cgroups_path,
            # Limits are set on the attempt's cgroup, runc's parent (cgroups.py); runc adds its default
            # devices (null, zero, full, random, urandom, tty, ptmx) to this deny-all.
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": namespaces,
            "maskedPaths": list(RUNC_DEFAULT_MASKED),
            "readonlyPaths": list(RUNC_DEFAULT_READONLY),
            "seccomp": seccomp_profile(machine or platform.machine()),
        },
    }


def _mounts(container: Container) -> list[dict]:
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={max(1, container.shm_bytes // 1024)}k"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    for source, destination in container.read_only_binds:
        mounts.append({"destination": destination, "type": "bind", "source": source,
                       "options": ["bind", "ro", "nosuid", "nodev", "noexec"]})
    return mounts


def seccomp_profile(machine: str) -> dict:
    """Allow everything but the syscalls above (see the module's docstring)."""
    rules: list[dict] = [{"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}]
    rules += [{"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM,
               "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]}
              for flag in NAMESPACE_FLAGS.values()]
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": _ARCHITECTURES.get(machine, []), "syscalls": rules}
