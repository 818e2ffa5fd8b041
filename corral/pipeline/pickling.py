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

_INSTALLED = {Path(p).resolve() for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"]}}


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
    module = _by_value(function)
    if module is not None:
        cloudpickle.register_pickle_by_value(module)
    try:
        cloudpickle.dump((function, [prepared(a) for a in args], {k: prepared(v) for k, v in kwargs.items()},
                          outputs), out)
    finally:
        if module is not None:
            cloudpickle.unregister_pickle_by_value(module)
    return out.getvalue()


def _by_value(function: Callable[..., Any]) -> Any:
    """The function's module when it is the user's own code (not the standard library or an installed package):
    cloudpickle would pickle its functions by name, and the job's image cannot import it."""
    name = getattr(function, "__module__", None)
    module = sys.modules.get(name or "")
    if module is None or name == "__main__" or not getattr(module, "__file__", None):
        return None
    where = Path(module.__file__).resolve()
    if any(root in where.parents for root in _INSTALLED):
        return None
    return module
