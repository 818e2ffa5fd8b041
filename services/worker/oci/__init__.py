"""The OCI runtime: each attempt in a container of its own, run by `runc`.

Where things are:
- `runtime.py`: `OciRuntime`, the `ContainerRuntime` (runtime_api.py) that runs an attempt from start to
  cleanup; its settings in `config.py`, what it refuses in `refusals.py`;
- `bundle.py`: the bundle's `config.json`, from the image's config and the job's spec (pure);
- `images.py`: what the runtime needs of an image (`Rootfs`, `RootfsSource`) and a source serving
  unpacked root filesystems from a directory;
- `layer.py`: each attempt's writable root filesystem over the shared read-only image (overlayfs, or a
  copy where overlayfs cannot be mounted) and the host-side files put in it (work directory, inputs,
  secrets);
- `cgroups.py`: the attempt's cgroup: limits, the out-of-memory notification, cpu time and peak memory;
- `runc.py`: the runc command line;
- `keeper.py`: the parent of each container's first process: its exit status, and its end if the worker
  dies;
- `owner.py`: what a worker leaves on the host (runc state, records of attempts, cgroups) under a name of
  its own, and the cleanup of what a dead worker left.
"""

from services.worker.oci.config import OciRuntimeConfig
from services.worker.oci.images import ImageConfig, Rootfs, RootfsSource
from services.worker.oci.refusals import oci_refusals
from services.worker.oci.runtime import OciRuntime

__all__ = ["ImageConfig", "OciRuntime", "OciRuntimeConfig", "Rootfs", "RootfsSource", "oci_refusals"]
