"""One attempt in the process runtime, isolated: what runs in the worker's
job launcher's child (see launcher.py) to put the job in namespaces of its
own and run its command as an unprivileged user. Standard library only.

The launcher forks and calls `run_attempt` with the instructions (JSON from
the worker: command, environment, uid and gid, what to hide and show), the
job's output pipe and its report pipe. Reports go to the report pipe, one
line each:

    started PID                   the command runs (PID as the job sees it: 2)
    error MESSAGE                 the command could not be started
    exit STATUS CPU_MS MAXRSS_KIB the command ended (its wait status) and what it used

Three processes. The top one, the launcher's child, keeps only stdin
(/dev/null), stdout and stderr (the output pipe) and the report pipe of the
launcher's descriptors, joins the attempt's cgroup (its pids.max holds
every process the job starts), unshares the mount, PID, IPC and UTS namespaces
(and the network one for network_mode NONE) and forks the namespace's
init, PID 1 there. The init makes the job's view of the files (its own
/proc, fresh private /tmp and the like, the worker's scratch root hidden but
for the attempt's own directories, its secrets mounted read-only below its
working directory), names the host, brings loopback up,
then forks the command, PID 2, which drops every privilege and execs. The
init reaps orphans, passes SIGTERM on to every process of the job (the top
process passes it to the init) and exits when the command does; the kernel
then kills whatever is left in the namespace. Each of the three dies with
its parent (PR_SET_PDEATHSIG), and the launcher with the worker, so SIGKILL
to the top process kills the whole tree at once, stuck init or not, and a
worker that dies takes its jobs with it.

Everything is imported before the mounts (by the launcher, once), which may
hide the interpreter's own files.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import select
import signal
import socket
import struct
import warnings  # noqa: F401 - os.execvpe imports it, too late once the files are the job's to read

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class Refused(Exception):
    """The job cannot be started; the message says why, for the job's status."""


def _call(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(_libc.mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)), f"mount {target}")


def _prctl(option: int, arg: int = 0) -> None:
    _call(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def _report(fd: int, line: str) -> None:
    os.write(fd, (" ".join(line.split("\n")) + "\n").encode("utf-8", "replace"))


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel for SIGKILL when our parent dies; False if it already has (then leave at once)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent_pid


def run_attempt(spec: dict, output_fd: int, status_fd: int, launcher_pid: int) -> int:
    """The attempt's top process, just forked by the launcher: unshare, fork the namespace's init, wait for
    it; returns the exit code (the launcher's child never returns into the launcher)."""
    try:
        if not die_with_parent(launcher_pid):
            return 1  # the launcher died before we could ask to die with it
        status = _own_fds(output_fd, status_fd)
    except OSError:
        return 1  # with no report; the worker says the init ended without one
    try:
        if spec.get("cgroup_procs"):  # before any fork: every process of the job is held to its pids.max
            with open(spec["cgroup_procs"], "w") as procs:
                procs.write("0")
    except OSError as e:
        _report(status, f"error could not join the job's cgroup: {e}")
        return 1
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
        if spec["network"] == "none":
            flags |= CLONE_NEWNET
        _call(_libc.unshare(flags), "unshare")
        alive_r, alive_w = os.pipe()
        init = os.fork()
    except OSError as e:
        _report(status, f"error could not isolate the job: {e}")
        return 1
    if init == 0:
        code = 1
        try:
            os.close(alive_w)
            code = _namespace_init(spec, status, alive_r)
        except BaseException as e:  # noqa: BLE001 - say it, whatever it was, and leave
            _report(status, f"error could not isolate the job: {e}")
        os._exit(code)
    os.close(alive_r)
    signal.signal(signal.SIGTERM, lambda *_: _signal(init, signal.SIGTERM))
    _, wait_status = os.waitpid(init, 0)
    return 0 if os.waitstatus_to_exitcode(wait_status) == 0 else 1


def _own_fds(output_fd: int, status_fd: int) -> int:
    """Keep only what the attempt needs of the launcher's descriptors: /dev/null as stdin, the job's output
    as stdout and stderr, and the report pipe (returned: fd 3). Nothing else of the launcher, its socket to
    the worker above all, reaches the job."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    if status_fd != 3:
        os.dup2(status_fd, 3)  # 3 may have been `null` or `output_fd`: copied already
    os.set_inheritable(3, False)
    os.closerange(4, 1 << 20)
    return 3


def _namespace_init(spec: dict, status: int, alive_r: int) -> int:
    """PID 1 of the job's namespace: set up, run the command, reap, report."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_r], [], [], 0)[0]:
        return 1  # our parent died before we could ask to die with it (the pipe says EOF)
    try:
        _isolate_files(spec)
        socket.sethostname(spec["hostname"])
        if spec["network"] == "none":
            _loopback_up()
    except OSError as e:
        _report(status, f"error could not isolate the job: {e}")
        return 1
    failed_r, failed_w = os.pipe()  # close-on-exec: EOF without a word means the exec happened
    command = os.fork()
    if command == 0:
        os.close(failed_r)
        try:
            _exec_command(spec, failed_w)
        except Refused as e:
            os.write(failed_w, str(e).encode("utf-8", "replace"))
        except BaseException as e:  # noqa: BLE001 - in the command's process: say it, never return
            os.write(failed_w, f"could not start the command: {e}".encode("utf-8", "replace"))
        os._exit(127)
    os.close(failed_w)
    failure = b""
    while chunk := os.read(failed_r, 4096):
        failure += chunk
    os.close(failed_r)
    if failure:
        os.waitpid(command, 0)
        _report(status, "error " + failure.decode("utf-8", "replace"))
        return 1
    _report(status, f"started {command}")
    # As PID 1 we get only the signals we handle; the job's processes get this one from us.
    signal.signal(signal.SIGTERM, lambda *_: _signal(-1, signal.SIGTERM))
    cpu_s, maxrss_kib = 0.0, 0
    while True:
        pid, wait_status, usage = os.wait4(-1, 0)
        cpu_s += usage.ru_utime + usage.ru_stime
        maxrss_kib = max(maxrss_kib, usage.ru_maxrss)
        if pid == command:
            _report(status, f"exit {wait_status} {round(cpu_s * 1000)} {maxrss_kib}")
            return 0  # and the kernel kills what the command left running


def _isolate_files(spec: dict) -> None:
    """The job's view of the files: the host's, but for a fresh /proc, fresh private directories (/tmp and
    the like), and the worker's scratch root hidden under an empty tmpfs ("cover") in which only the
    attempt's own directories ("reveal") appear, at their usual paths; then each read-only bind (its
    secrets: a directory of the attempt's that the cover hides) at its target below them."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
    kept = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW) for path in spec["reveal"]]
    binds = [(os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW), target)
             for source, target in spec.get("read_only_binds", [])]
    _mount("tmpfs", spec["cover"], "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0711,size=1m")
    for path in spec["private_dirs"]:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec['private_dir_bytes']}")
    for path, fd in zip(spec["reveal"], kept):
        _make_path(path)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        os.close(fd)
    for source_fd, target in binds:
        _bind_read_only(source_fd, target)
        os.close(source_fd)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _open_without_links(path: str) -> int:
    """An O_PATH descriptor of directory `path`, opened a component at a time, following no link."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for part in path.strip("/").split("/"):
            next_fd = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bind_read_only(source_fd: int, target: str) -> None:
    """Mount the directory `source_fd` at `target` (a directory the worker made, reached without following a
    link), then make that mount read-only: its files' owner cannot write, chmod or remove them either."""
    target_fd = _open_without_links(target)
    try:
        _mount(f"/proc/self/fd/{source_fd}", f"/proc/self/fd/{target_fd}", None, MS_BIND)
    finally:
        os.close(target_fd)
    mounted_fd = _open_without_links(target)  # now the mount's root
    try:
        _mount(None, f"/proc/self/fd/{mounted_fd}", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
               | MS_NOEXEC)
    finally:
        os.close(mounted_fd)


def _make_path(path: str) -> None:
    """Create `path` and its missing parents, 0711: the job may pass through them but not list them."""
    current = "/"
    for part in path.strip("/").split("/"):
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current, 0o711)
            os.chmod(current, 0o711)  # whatever the umask


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        _, flags = struct.unpack(IFREQ, fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0)))
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def _exec_command(spec: dict, failed_w: int) -> None:
    """PID 2: become the job's user with no privilege at all, then exec the command."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ; exec keeps ignored ones
    os.setsid()
    os.closerange(3, failed_w)
    os.closerange(failed_w + 1, 1 << 20)
    nproc = spec["max_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))  # per uid, and the uid is the attempt's alone
    if (file_bytes := spec.get("max_file_bytes", 0)) > 0:  # no file past the storage request (SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if (limit := spec["address_space_bytes"]) > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    uid, gid = spec["uid"], spec["gid"]
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # from root to a user: the kernel clears every capability
    _prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid program, no file capability gives them back
    if os.getuid() == 0 or os.geteuid() == 0:
        raise Refused("could not give up root")
    try:
        os.chdir(spec["cwd"])
    except OSError as e:
        raise Refused(f"could not enter its working directory {spec['cwd']}: {e.strerror}") from e
    os.umask(0o022)
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])
    except OSError as e:
        raise Refused(f"could not start {argv[0]!r}: {e.strerror}") from e


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass
