"""`BatchPoolExecutor`: `concurrent.futures.Executor`'s shape over the ServiceBackend, as hailtop.batch has it.

Each `submit` is a batch of one Python job, submitted at once; its future waits for the batch in a thread and
reads the job's result from the executor's directory under the backend's `remote_tmpdir`. The job catches
the function's exception and returns it with its traceback (so the job itself succeeds and its result file
is copied out); `result()` then raises a ValueError holding the traceback, as hailtop.batch does, and
`exception()` returns that error, as `concurrent.futures` does.
"""

from __future__ import annotations

import concurrent.futures
import functools
import secrets
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle

from corral.pipeline import files, values
from corral.pipeline.backend.service import DEFAULT_PYTHON_IMAGE, ServiceBackend, ServiceBatch
from corral.pipeline.batch import Batch

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                    "NUMEXPR_NUM_THREADS")
"""Numerical libraries' thread counts, set to the job's cores so that a job does not oversubscribe them."""
WAITING_THREADS = 32
"""How many futures wait for their batches at once (more wait their turn: their batches run all the same)."""


def _name(n: int = 4) -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(n))


def _captured() -> Callable[[Callable[[], Any]], tuple[Any, str | None]]:
    """The job's function: call the submitted one, returning (value, None) or (exception, traceback). Made in
    a function so that cloudpickle sends it by value: the job's image has no corral to import it from."""
    def run(call: Callable[[], Any]) -> tuple[Any, str | None]:
        import traceback
        try:
            return call(), None
        except Exception as e:
            print("BatchPoolExecutor encountered an exception:")
            traceback.print_exc()
            return e, "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return run


def _chunked(fn: Callable[..., Any]) -> Callable[..., list[Any]]:
    def run(*columns: list[Any]) -> list[Any]:
        return [fn(*row) for row in zip(*columns)]
    return run


class BatchPoolExecutor:
    """Runs functions as jobs on corral: `submit(fn, *args)` gives a future, `map(fn, *iterables)` the results in
    order. A context manager: leaving it shuts it down (waiting for the futures unless `wait_on_exit=False`).
    `image` (default `python`) runs the functions, `cpus_per_job` cores each; `cleanup_bucket` removes the
    executor's files under `remote_tmpdir` once every future is done. `project` is Google-only and refused."""

    def __init__(self, *, name: str | None = None, backend: ServiceBackend | None = None, image: str | None = None,
                 cpus_per_job: int | str | None = None, wait_on_exit: bool = True, cleanup_bucket: bool = True,
                 project: str | None = None):
        if project is not None:
            raise NotImplementedError("corral has no Google project to bill reads to: project must be None")
        self.name = name or f"BatchPoolExecutor-{_name()}"
        self.backend = backend or ServiceBackend()
        if not isinstance(self.backend, ServiceBackend):
            raise ValueError(f"BatchPoolExecutor is not compatible with {type(self.backend)}")
        if cpus_per_job is not None:
            values.cpu_mcpu(cpus_per_job)
        self.image = image or DEFAULT_PYTHON_IMAGE
        self.cpus_per_job = cpus_per_job
        self.wait_on_exit = wait_on_exit
        self.cleanup_bucket = cleanup_bucket
        self.directory = f"{self.backend.remote_tmpdir}/batch-pool-executor/{self.name}"
        self.futures: list[BatchPoolFuture] = []
        self._waiting = concurrent.futures.ThreadPoolExecutor(WAITING_THREADS, thread_name_prefix="batch-pool")
        self._lock = threading.Lock()
        self._shutdown = False
        self._cleaned = False

    def __enter__(self) -> BatchPoolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=self.wait_on_exit)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BatchPoolFuture:
        """Run `fn(*args, **kwargs)` as a job (a batch of its own); its future."""
        if self._shutdown:
            raise RuntimeError("BatchPoolExecutor has already been shutdown.")
        name = f"{getattr(fn, '__name__', '<anonymous>')}-{_name()}".replace("<", "").replace(">", "")
        batch = Batch(name=f"{self.name}-{name}", backend=self.backend, default_python_image=self.image)
        job = batch.new_python_job(name)
        if self.cpus_per_job is not None:
            job.cpu(self.cpus_per_job)
        threads = str(max(1, values.cpu_mcpu(self.cpus_per_job) // 1000)) if self.cpus_per_job is not None else "1"
        for variable in THREAD_VARIABLES:
            job.env(variable, threads)
        result = job.call(_captured(), functools.partial(fn, *args, **kwargs))
        output = f"{self.directory}/outputs/{name}/output"
        batch.write_output(result, output)
        handle = batch.run(wait=False, disable_progress_bar=True, delete_scratch_on_exit=False)
        future = BatchPoolFuture(self, handle, output)
        with self._lock:
            self.futures.append(future)
        future._waiting = self._waiting.submit(future._fetch)
        future._waiting.add_done_callback(lambda _: self._cleanup_if_done())
        return future

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: float | None = None,
            chunksize: int = 1) -> Iterator[Any]:
        """`fn` over the iterables' items (as `map` takes them), each call (or `chunksize` calls) a job, all
        submitted now; the results in order. `timeout` (seconds, from this call) bounds the wait for them all: a
        TimeoutError then; a failure cancels the jobs not done and is raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        rows = list(zip(*iterables)) if iterables else []
        if chunksize > 1:
            chunks = [rows[i:i + chunksize] for i in range(0, len(rows), chunksize)]
            futures = [self.submit(_chunked(fn), *[list(column) for column in zip(*chunk)]) for chunk in chunks]
        else:
            futures = [self.submit(fn, *row) for row in rows]

        def results() -> Iterator[Any]:
            try:
                for future in futures:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    if chunksize > 1:
                        yield from future.result(left)
                    else:
                        yield future.result(left)
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        return results()

    def shutdown(self, wait: bool = True) -> None:
        """No more submissions. With `wait`, wait for every future (their failures aside); the executor's files
        are removed once all are done (`cleanup_bucket`)."""
        self._shutdown = True
        if wait:
            for future in list(self.futures):
                try:
                    future.result()
                except BaseException:  # noqa: BLE001 - a failure belongs to its future, not to shutdown
                    pass
        self._cleanup_if_done()

    def _cleanup_if_done(self) -> None:
        with self._lock:
            if not self._shutdown or self._cleaned or not all(f.done() for f in self.futures):
                return
            self._cleaned = True
        if self.cleanup_bucket:
            files.remove_tree(self.directory)
        self._waiting.shutdown(wait=False)


class BatchPoolFuture:
    """The future of one submitted call: `result(timeout)`, `exception(timeout)`, `cancel()`, `cancelled()`,
    `done()`, `running()`."""

    def __init__(self, executor: BatchPoolExecutor, batch: ServiceBatch, output: str):
        self.executor = executor
        self.batch = batch
        self.output = output
        self._waiting: concurrent.futures.Future[Any] | None = None
        self._cancelled = False

    def _fetch(self) -> Any:
        """Wait for the batch, then read the result (in a thread of the executor's)."""
        status = self.batch.wait(disable_progress_bar=True)
        if self._cancelled:
            raise concurrent.futures.CancelledError()
        job = self.batch.get_job(1).status()
        if job["state"] != "Success":
            raise ValueError(f"submitted job failed ({job['state']}):\n{job['error']}\n\nLog:\n"
                             f"{self.batch.get_job_log(1)['main']}")
        try:
            value, traceback = cloudpickle.loads(files.read_bytes(self.output))
        except FileNotFoundError as e:
            raise ValueError(f"submitted job did not write output:\n{status}") from e
        if traceback is not None:
            raise ValueError(f"submitted job failed:\n{traceback}")
        return value

    def cancel(self) -> bool:
        """Cancel the job's batch unless it is done; whether it was cancelled."""
        if self._cancelled:
            return True
        if self.done():
            return False
        self._cancelled = True
        self.batch.cancel()
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return self._cancelled or (self._waiting is not None and self._waiting.done())

    def result(self, timeout: float | None = None) -> Any:
        """The function's value; a ValueError with its traceback when it raised; CancelledError when
        cancelled; TimeoutError after `timeout` seconds."""
        if self._cancelled:
            raise concurrent.futures.CancelledError()
        assert self._waiting is not None
        return self._waiting.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """What `result` would raise (None when it would return), returned as `concurrent.futures` does."""
        if self._cancelled:
            raise concurrent.futures.CancelledError()
        try:
            self.result(timeout)
        except (concurrent.futures.CancelledError, TimeoutError):
            raise
        except Exception as e:
            return e
        return None


__all__ = ["BatchPoolExecutor", "BatchPoolFuture"]
