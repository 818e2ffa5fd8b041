"""A job's page: its spec, its attempts with their end reasons, an attempt's log (the live tail while it
runs, services.web.live), its resource usage over time as charts, and, while it waits, why it is not
running (ExplainJob, the scheduler's own planner)."""

from __future__ import annotations

from aiohttp import web
from google.protobuf import json_format

from corral.batch.v1 import job_explanation_pb2, job_pb2, job_state_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from corral.errors import CorralError, NotFound
from services.web import views
from services.web.app import BACKEND, path_id, render, session_of
from services.web.drawing import charts

LOG_SHOWN_BYTES = 256 * 1024
"""The most of a log a page shows: its end (where a failure says why); the whole is a download."""
LOG_READ_BYTES = 4 * 1024 * 1024
"""One GetJobLog call's most."""
FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED, job_state_pb2.JOB_STATE_FAILED, job_state_pb2.JOB_STATE_ERROR,
         job_state_pb2.JOB_STATE_CANCELLED}


def _attempt_row(number: int, attempt: job_pb2.Attempt) -> dict[str, object]:
    return {"number": number, "id": attempt.attempt_id, "instance": attempt.instance_name,
            "started": views.when(attempt.started_at), "ended": views.when(attempt.ended_at),
            "duration": views.span(attempt.started_at, attempt.ended_at),
            "reason": views.end_reason(attempt.end_reason) or ("running" if not attempt.ended_at.seconds else ""),
            "exit_code": attempt.exit_code if attempt.HasField("exit_code") else "",
            "error": attempt.error_message, "cost": views.usd(attempt.cost_micro_usd),
            "retry": attempt.retry_reason, "running": views.seconds_of(attempt.ended_at) is None}


def _reason(reason: job_explanation_pb2.WaitReason) -> dict[str, object]:
    code = job_explanation_pb2.WaitReasonCode.Name(reason.code).removeprefix("WAIT_REASON_CODE_")
    return {"code": code.lower().replace("_", " "), "detail": reason.detail,
            "jobs": [(ref.batch_id, ref.job_id) for ref in reason.jobs], "regions": list(reason.regions)}


async def job_page(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id, job_id = path_id(request, "batch_id"), path_id(request, "job_id")
    job = (await session.calls.call(backend.jobs.GetJob, jpb.GetJobRequest(batch_id=batch_id, job_id=job_id))).job
    attempts = list(job.attempts)
    chosen_id = request.query.get("attempt", "")[:128]
    chosen = next((a for a in attempts if a.attempt_id == chosen_id), attempts[-1] if attempts else None)
    log, log_bytes, usage = None, 0, None
    explanation: list[dict[str, object]] = []
    if chosen is not None:
        log, log_bytes = await _log_tail(request, batch_id, job_id, chosen.attempt_id)
        usage = await _usage(request, batch_id, job_id, chosen.attempt_id)
    if job.state not in FINAL:
        answer = await session.calls.call(backend.jobs.ExplainJob, jpb.ExplainJobRequest(batch_id=batch_id,
                                                                                         job_id=job_id))
        explanation = [_reason(r) for r in answer.explanation.reasons]
    spec = json_format.MessageToJson(job.spec, indent=2, preserving_proto_field_name=True) if job.HasField("spec") \
        else ""
    return render(request, "job.html", title=f"Job {job_id} of batch {batch_id}", batch_id=batch_id, job=job,
                  name=job.attributes.get("name", ""), state=views.job_state(job.state),
                  attributes=sorted(job.attributes.items()), spec=spec,
                  attempts=[_attempt_row(n, a) for n, a in enumerate(attempts, start=1)],
                  chosen=chosen.attempt_id if chosen else "", chosen_running=bool(chosen) and
                  views.seconds_of(chosen.ended_at) is None and job.state not in FINAL,  # type: ignore[union-attr]
                  log=log, log_bytes=log_bytes, shown_bytes=LOG_SHOWN_BYTES, usage=usage,
                  explanation=explanation, final=job.state in FINAL,
                  exit_code=job.exit_code if job.HasField("exit_code") else "", error_message=job.error_message,
                  cost=views.usd(job.cost_micro_usd), resources=job.resources)


async def _log_tail(request: web.Request, batch_id: int, job_id: int, attempt_id: str) -> tuple[str | None, int]:
    """The end of an attempt's log (at most LOG_SHOWN_BYTES) and its whole size; None when it has none yet."""
    session = session_of(request)
    backend = request.app[BACKEND]
    try:
        head = await session.calls.call(backend.jobs.GetJobLog, jpb.GetJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, max_bytes=LOG_SHOWN_BYTES))
    except NotFound:
        return None, 0
    data = head.data
    if head.total_bytes > LOG_SHOWN_BYTES:
        tail = await session.calls.call(backend.jobs.GetJobLog, jpb.GetJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, start_byte=head.total_bytes - LOG_SHOWN_BYTES,
            max_bytes=LOG_SHOWN_BYTES))
        data = tail.data
    return data.decode("utf-8", "replace"), head.total_bytes


async def _usage(request: web.Request, batch_id: int, job_id: int, attempt_id: str) -> dict[str, object] | None:
    """The attempt's CPU (cores) and memory over time as charts, with their data as tables; None without
    samples."""
    session = session_of(request)
    backend = request.app[BACKEND]
    try:
        answer = await session.calls.call(backend.jobs.GetAttemptUsage, jpb.GetAttemptUsageRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id))
    except CorralError:
        return None
    samples = [(views.seconds_of(s.at), s) for s in answer.samples]
    samples = [(at, s) for at, s in samples if at is not None]
    if len(samples) < 2:
        return None
    begun = samples[0][0]
    cpu = []
    for (t0, s0), (t1, s1) in zip(samples, samples[1:]):
        used = s1.cpu_time.ToTimedelta().total_seconds() - s0.cpu_time.ToTimedelta().total_seconds()
        if t1 > t0:
            cpu.append((t1 - begun, max(0.0, used / (t1 - t0))))
    memory = [(at - begun, float(s.memory_bytes)) for at, s in samples if s.HasField("memory_bytes")]
    seconds = lambda x: views.duration(x)  # noqa: E731
    drawn = {"cpu": charts.line_chart([charts.Series("cores in use", cpu)], title="CPU", y_label="cores",
                                      y_format=lambda v: f"{v:.2f}", x_format=seconds, x_is_time=False),
             "memory": charts.line_chart([charts.Series("memory", memory)], title="Memory", y_label="memory",
                                         y_format=lambda v: views.size(int(v)), x_format=seconds, x_is_time=False)}
    return {"charts": drawn, "cpu": [(seconds(x), f"{y:.2f}") for x, y in cpu],
            "memory": [(seconds(x), views.size(int(y))) for x, y in memory]}


async def log_download(request: web.Request) -> web.StreamResponse:
    """An attempt's whole log, as text, read in LOG_READ_BYTES calls."""
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id, job_id = path_id(request, "batch_id"), path_id(request, "job_id")
    attempt_id = request.query.get("attempt", "")[:128]
    first = await session.calls.call(backend.jobs.GetJobLog, jpb.GetJobLogRequest(
        batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, max_bytes=LOG_READ_BYTES))
    response = web.StreamResponse(headers={
        "Content-Type": "text/plain; charset=utf-8",
        "Content-Disposition": f'attachment; filename="batch-{batch_id}-job-{job_id}.log"'})
    await response.prepare(request)
    await response.write(first.data)
    at = first.start_byte + len(first.data)
    while at < first.total_bytes:
        part = await session.calls.call(backend.jobs.GetJobLog, jpb.GetJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=first.attempt_id, start_byte=at, max_bytes=LOG_READ_BYTES))
        if not part.data:
            break
        await response.write(part.data)
        at += len(part.data)
    await response.write_eof()
    return response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/batches/{batch_id}/jobs/{job_id}", job_page)
    router.add_get("/batches/{batch_id}/jobs/{job_id}/log", log_download)
