"""An attempt's root filesystem: a fresh writable layer over the shared,
read-only image, and what the worker puts into it before the job starts.

**overlayfs** (where the scratch filesystem allows it, probed once): the
image's root filesystem is the lower directory, the attempt's `upper/` and
`ovlwork/` take every write, and the merged view is mounted at `rootfs/`. The
image's directory is never written, so attempts share it and see nothing of
each other's writes. **copy** (where overlayfs cannot be mounted): the image
is copied (`cp -a`) into `rootfs/` for each attempt: the same isolation, at
the cost of the copy's time and disk. Either way the job's writes (its work
directory, /tmp) land on the worker's scratch disk, under the attempt's
directory; nothing limits their size there but the disk (see OciRuntime).

The worker writes into that root filesystem as root before the job runs
(its work directory, /tmp, the inputs), and reads outputs from it after. The
image is not trusted: a link in it, relative or absolute, could lead the
worker anywhere on the host, so every path is walked one component at a
time with O_NOFOLLOW from a descriptor of the root (job_files.py does the
same for inputs and outputs), and a link on the way is refused; and a
device node in it would be the host's device to the worker, so the root
filesystem is mounted nodev (and nosuid), whichever the layer.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

OVERLAY = "overlayfs"
COPY = "copy"

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LayerError(Exception):
    """The attempt's root filesystem could not be made; the message says which step and why."""


def mount(source: str, target: Path, fstype: str, flags: int = 0, data: str = "") -> None:
    """mount(2); raises OSError."""
    if _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), flags, data.encode() or None) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"mount {fstype} at {target}: {os.strerror(number)}")


def unmount(target: Path) -> None:
    """Detach the mount at `target` (lazily: a process still in it cannot keep it on the host's view)."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH | UMOUNT_NOFOLLOW) != 0:
        number = ctypes.get_errno()
        if number not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise OSError(number, f"unmount {target}: {os.strerror(number)}")


def mounts_under(directory: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Path]:
    """Mount points at or below `directory`, deepest first (the order to unmount them in)."""
    top = os.path.realpath(directory)
    found = []
    for line in mountinfo.read_text().splitlines():
        point = _unescape(line.split(" ")[4])
        if point == top or point.startswith(top.rstrip("/") + "/"):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        field = field.replace(code, chr(int(code[1:], 8)))
    return field


def unmount_all_under(directory: Path) -> None:
    """Unmount everything at or below `directory`."""
    for point in mounts_under(directory):
        unmount(point)


def overlay_option_path(path: Path) -> str:
    """A path as overlayfs's mount options take it: ',' separates options and ':' lower layers, so both
    are escaped with '\\' (an image cache's directories may well be named 'sha256:…')."""
    text = str(path)
    if "\n" in text:
        raise LayerError(f"{text!r} cannot be given to overlayfs (it has a newline)")
    return text.replace("\\", "\\\\").replace(":", "\\:").replace(",", "\\,")


def overlay_works(scratch: Path) -> str:
    """'' if an overlayfs can be mounted with its upper layer on `scratch`'s filesystem, else why not."""
    probe = scratch / f".overlay-probe-{uuid.uuid4().hex[:8]}"
    dirs = [probe / name for name in ("lower", "upper", "work", "merged")]
    try:
        for d in dirs:
            d.mkdir(parents=True, mode=0o700)
        (probe / "lower" / "file").write_bytes(b"lower")
        lower, upper, work, merged = dirs
        mount("overlay", merged, "overlay", 0, _overlay_options(lower, upper, work))
        try:
            (merged / "file").write_bytes(b"upper")
            if (lower / "file").read_bytes() != b"lower":
                return "a write through the overlay reached its lower layer"
        finally:
            unmount(merged)
        return ""
    except (OSError, LayerError) as e:
        return str(e)
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _overlay_options(lower: Path, upper: Path, work: Path) -> str:
    return (f"lowerdir={overlay_option_path(lower)},upperdir={overlay_option_path(upper)},"
            f"workdir={overlay_option_path(work)}")


async def make_root(image_root: Path, oci_dir: Path, kind: str) -> Path:
    """The attempt's writable root filesystem at `oci_dir/rootfs`, over (or copied from) `image_root`."""
    root = oci_dir / "rootfs"
    root.mkdir(mode=0o700)
    os.chmod(root, 0o755)  # exactly, whatever the umask (services run with 077): the job must enter its /
    if kind == OVERLAY:
        upper, work = oci_dir / "upper", oci_dir / "ovlwork"
        upper.mkdir(mode=0o700)
        os.chmod(upper, 0o755)  # the overlay's top directory takes the upper layer's mode
        work.mkdir(mode=0o700)
        try:
            mount("overlay", root, "overlay", MS_NODEV | MS_NOSUID, _overlay_options(image_root, upper, work))
        except OSError as e:
            raise LayerError(f"could not mount the writable layer (overlayfs): {e}") from e
        return root
    copy = await asyncio.create_subprocess_exec(
        "cp", "-a", "--", f"{image_root}/.", str(root), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    _, err = await copy.communicate()
    if copy.returncode != 0:
        raise LayerError(f"could not copy the image into the attempt's root filesystem: "
                         f"{err.decode(errors='replace').strip()[-500:]}")
    try:  # a mount of its own, nodev and nosuid as the overlay is
        mount(str(root), root, "", MS_BIND)
        mount("", root, "", MS_BIND | MS_REMOUNT | MS_NODEV | MS_NOSUID)
    except OSError as e:
        raise LayerError(f"could not mount the attempt's copy of the image: {e}") from e
    return root


def remove_oci_dir(oci_dir: Path) -> None:
    """Unmount whatever is mounted below the attempt's `oci_dir`, then remove it (never through a mount)."""
    if not oci_dir.exists():
        return
    unmount_all_under(oci_dir)
    if left := mounts_under(oci_dir):
        raise OSError(f"still mounted after unmounting: {', '.join(map(str, left))}")
    shutil.rmtree(oci_dir)


def open_root(root: Path) -> int:
    """A descriptor of the root filesystem's top directory."""
    return os.open(root, _DIR)


def ensure_dir(root_fd: int, container_path: str, mode: int, owner: tuple[int, int] | None = None) -> None:
    """Make `container_path` a directory in the root filesystem unless it is one (the directories made on
    the way are root's, 0755). A directory made here gets `mode`; with `owner` (uid, gid), one that was
    there too gets both. A link or a file on the way is refused: the image made it, and the worker is root."""
    parts = PurePosixPath(container_path).parts[1:]
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            made = True
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                made = False
            try:
                next_fd = os.open(part, _DIR, dir_fd=fd)
            except OSError as e:
                where = "/" + "/".join(parts[: i + 1])
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise LayerError(f"the image's {where} is a symbolic link or not a directory") from e
                raise LayerError(f"could not make {where}: {e.strerror}") from e
            os.close(fd)
            fd = next_fd
            if last and owner is not None:
                os.fchown(fd, *owner)
            if made or (last and owner is not None):
                os.fchmod(fd, mode if last else 0o755)  # after fchown, which clears set-id bits
    finally:
        os.close(fd)


def give_paths(root: Path, container_paths: list[str], uid: int, gid: int) -> None:
    """Give the paths (inputs the worker copied in and the directories it made for them: job_files walked
    them without following links just before, and the job has not run) and everything in them to the
    job's user; links themselves, never what they point to."""
    for path in container_paths:
        host = root / path.lstrip("/")
        st = os.lstat(host)
        os.chown(host, uid, gid, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            for top, dirs, files in os.walk(host):
                for name in (*dirs, *files):
                    os.chown(os.path.join(top, name), uid, gid, follow_symlinks=False)


def stage_secrets(secrets_dir: Path, secrets: list[Mapping[str, bytes]], uid: int, gid: int) -> list[Path]:
    """Each secret's files (name to content, as the driver delivered them) for the job: on a tmpfs of the
    attempt's own (never on disk), each directory 0500 and each file 0400, the job's. Returns each secret's
    directory, in order. A file name that is not a plain name is refused."""
    for files in secrets:
        for name in files:
            if not name or name in (".", "..") or "/" in name or "\0" in name:
                raise LayerError(f"a secret file name must be a plain file name, got {name!r}")
    total = sum(len(data) for files in secrets for data in files.values())
    secrets_dir.mkdir(mode=0o700)
    size_kib = total // 1024 + 64 * (len(secrets) + 1)
    mount("tmpfs", secrets_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, f"mode=0711,size={size_kib}k")
    copies = []
    for i, files in enumerate(secrets):
        copy = secrets_dir / str(i)
        copy.mkdir(mode=0o500)
        for name, data in sorted(files.items()):
            fd = os.open(copy / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
            with open(fd, "wb") as f:
                f.write(data)
                os.fchown(f.fileno(), uid, gid)
        os.chown(copy, uid, gid)
        copies.append(copy)
    return copies


def make_attempt_dir(oci_dir: Path) -> Path:
    """The attempt's directory (private to the worker on the way) and its fresh `oci_dir` inside."""
    attempt_dir = oci_dir.parent
    scratch = attempt_dir.parent
    try:
        scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        if scratch.stat().st_mode & (stat.S_ISVTX | stat.S_IWOTH):
            raise LayerError(f"the scratch root {scratch} is shared with other users; the worker needs a "
                             "directory of its own")
        scratch.chmod(0o700)
        attempt_dir.mkdir(mode=0o700, exist_ok=True)  # the log may have made it already
        attempt_dir.chmod(0o700)
        oci_dir.mkdir(mode=0o700)
        return oci_dir
    except FileExistsError as e:
        raise LayerError(f"{attempt_dir}/oci already exists") from e
    except OSError as e:
        raise LayerError(f"could not make the attempt's directories: {e}") from e


def write_private(path: Path, data: bytes) -> None:
    """A new file only the worker may read (the bundle's config.json holds the job's environment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as f:
        f.write(data)
