"""Runs one call of a Python job: `python3 runner.py CALL_FILE`, in the job's image or on this machine.

Standalone on purpose: the service backend sends this file's text as the job's script, into an image that
has Python and cloudpickle but not corral. CALL_FILE (a path relative to $BATCH_TMPDIR) holds, pickled with
cloudpickle: the client's Python version, the function, its arguments (files as paths relative to
$BATCH_TMPDIR, other jobs' results to unpickle) and where to write the result (pickled) and, when asked, its
str(), repr() and JSON. An exception in the function prints its traceback and exits 1, so the job fails
with the traceback in its log.
"""

import json
import os
import pickle
import sys
import traceback


def _argument(prepared, root):
    kind, value = prepared
    if kind == "py_path":
        with open(os.path.join(root, value), "rb") as f:
            return pickle.load(f)
    if kind == "path":
        return os.path.join(root, value)
    if kind == "dict_path":
        return {name: os.path.join(root, path) for name, path in value.items()}
    if kind == "list":
        return [_argument(v, root) for v in value]
    if kind == "tuple":
        return tuple(_argument(v, root) for v in value)
    if kind == "dict":
        return {k: _argument(v, root) for k, v in value.items()}
    return value


def main(call_file):
    root = os.environ["BATCH_TMPDIR"]
    with open(os.path.join(root, call_file), "rb") as f:
        version = pickle.load(f)
        if tuple(version) != tuple(sys.version_info[:2]):
            sys.exit(f"corral.pipeline: this Python job was made by Python {version[0]}.{version[1]} and its image "
                     f"runs Python {sys.version_info[0]}.{sys.version_info[1]}; a function pickled by one minor "
                     "version cannot be loaded by another: use an image with the client's Python version")
        function, args, kwargs, outputs = pickle.load(f)
    try:
        result = function(*[_argument(a, root) for a in args], **{k: _argument(v, root) for k, v in kwargs.items()})
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    import cloudpickle  # the function's own module may be unimportable here: its result is pickled by value
    os.makedirs(os.path.dirname(os.path.join(root, outputs["result"])), exist_ok=True)
    with open(os.path.join(root, outputs["result"]), "wb") as f:
        cloudpickle.dump(result, f)
    for kind, convert in (("json", json.dumps), ("str", str), ("repr", repr)):
        if outputs.get(kind):
            with open(os.path.join(root, outputs[kind]), "w") as f:
                f.write(convert(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
