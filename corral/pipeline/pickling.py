"""A Python job's call as the file its runner reads (corral/pipeline/runner.py)."""

from __future__ import annotations

import io
import pickle
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle

from corral.pipeline.job import PythonJob, prepared
from corral.pipeline.resource import PythonResult

_INSTALLED = {Path(sysconfig.get_paths()[kind]).resolve() for kind in ("stdlib", "platstdlib", "purelib", "platlib")}
"""Where the standard library and installed packages are: modules elsewhere are the user's."""


def call_path(job: PythonJob, index: int) -> str:
    """Where call `index` (0-based) of `job` is, relative to $BATCH_TMPDIR."""
    return f"{job._dirname}/call{index}.pkl"


def call_bytes(result: PythonResult, function: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> bytes:
    """The call file: the client's Python version (read first, with plain pickle, so that a runner of another
    version says so instead of failing to load the rest), then the function, its arguments and the paths of its
    result and conversions, with cloudpickle."""
    outputs = {"result": result._relative_path()}
    for kind, converted in (("json", result._json), ("str", result._str), ("repr", result._repr)):
        if converted is not None:
            outputs[kind] = converted._relative_path()
    out = io.BytesIO()
    pickle.dump(tuple(sys.version_info[:2]), out)
    modules = []
    for module in _users_modules():
        try:
            cloudpickle.register_pickle_by_value(module)
            modules.append(module)
        except ValueError:  # imported under another name than its own: cloudpickle cannot find it by name
            pass
    try:
        cloudpickle.dump((function, [prepared(a) for a in args], {k: prepared(v) for k, v in kwargs.items()},
                          outputs), out)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    return out.getvalue()


_kinds: dict[str, bool] = {}
"""Module name: whether it is the user's own code (cached: a module's file does not move)."""


def _users_modules() -> list[Any]:
    """The imported modules that are the user's own code, not the standard library or an installed package:
    cloudpickle would pickle their functions and classes by name, and the job's image cannot import them (a
    function of the script's module, or one that a submitted function or partial refers to). Pickled by value,
    they need nothing but cloudpickle there."""
    found = []
    for name, module in list(sys.modules.items()):
        if name not in _kinds:
            _kinds[name] = _is_users(module)
        if _kinds[name]:
            found.append(module)
    return found


def _is_users(module: Any) -> bool:
    where = getattr(module, "__file__", None)
    if not where or getattr(module, "__name__", "__main__") == "__main__":
        return False  # built in, a namespace package, or __main__ (which cloudpickle sends by value anyway)
    resolved = Path(where).resolve()
    return not any(root == resolved or root in resolved.parents for root in _INSTALLED)
