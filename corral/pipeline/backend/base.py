"""What every backend offers a `Batch`: running it, and checking paths as they are named."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.pipeline.batch import Batch


class Backend:
    """Runs batches; a context manager that closes what it holds."""

    _closed = False

    def _run(self, batch: Batch, dry_run: bool, verbose: bool, delete_scratch_on_exit: bool,
             **backend_kwargs: Any) -> Any:
        raise NotImplementedError

    def _check_path(self, path: str) -> None:
        """Refuse an input path this backend could never read (at `read_input`, not at run)."""

    def _output_path(self, path: str) -> str:
        """Where `write_output(..., path)` writes, as this backend names it."""
        return path

    def _close(self) -> None:
        """Release what the backend holds (a connection)."""

    def close(self) -> None:
        """Release what the backend holds; a no-op when closed already."""
        if not self._closed:
            self._close()
            self._closed = True

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
