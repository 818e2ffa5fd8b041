"""Copying a pipeline's files where a plain path or a URL names them (file://, gs://, az://, through fsspec)."""

from __future__ import annotations

import os
import shutil
from urllib.parse import urlsplit

import fsspec


def is_url(path: str) -> bool:
    """Whether `path` is a URL (scheme://...) rather than a local path."""
    return "://" in path and bool(urlsplit(path).scheme)


def local_path(path: str) -> str | None:
    """The local path `path` names (a plain path, or a file:// URL), else None."""
    if not is_url(path):
        return os.path.abspath(os.path.expanduser(path))
    if urlsplit(path).scheme == "file":
        return urlsplit(path).path
    return None


def copy(source: str, dest: str) -> None:
    """Copy a file from `source` to `dest`, making dest's parents; a local directory with its contents."""
    from_local, to_local = local_path(source), local_path(dest)
    if from_local is not None and to_local is not None:
        os.makedirs(os.path.dirname(to_local) or ".", exist_ok=True)
        if os.path.isdir(from_local):
            shutil.copytree(from_local, to_local, dirs_exist_ok=True)
        else:
            shutil.copyfile(from_local, to_local)
        return
    source_fs, source_path = fsspec.core.url_to_fs(source)
    dest_fs, dest_path = fsspec.core.url_to_fs(dest)
    if source_fs.isdir(source_path):
        raise NotImplementedError(f"{source}: copying a directory to or from object storage is not built yet")
    dest_fs.makedirs(dest_fs._parent(dest_path), exist_ok=True)
    with source_fs.open(source_path, "rb") as reader, dest_fs.open(dest_path, "wb") as writer:
        shutil.copyfileobj(reader, writer, 1 << 20)


def write_bytes(dest: str, data: bytes) -> None:
    """Write `data` to the file `dest` (a path or a URL), making its parents."""
    fs, path = fsspec.core.url_to_fs(dest)
    fs.makedirs(fs._parent(path), exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(data)


def remove_tree(url: str) -> None:
    """Remove the directory `url` and everything in it; nothing when it is not there."""
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def url_of(path: str) -> str:
    """`path` as a URL: a URL as it is, a local path as file:///ABSOLUTE/PATH."""
    return path if is_url(path) else "file://" + os.path.abspath(os.path.expanduser(path))


def read_bytes(url: str) -> bytes:
    """The contents of the file `url` (a path or a URL)."""
    fs, path = fsspec.core.url_to_fs(url)
    with fs.open(path, "rb") as f:
        return f.read()
