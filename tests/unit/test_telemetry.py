"""The tracing settings and the trace context carried in messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from services.common import telemetry


def test_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (telemetry.ENV_VAR, "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(variable, raising=False)
    assert not telemetry.Tracing("svc").enabled
    assert not telemetry.Tracing("svc", "none").enabled


@pytest.mark.parametrize(("environ", "chosen"), [
    ({}, "none"),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
    ({"OTEL_TRACES_EXPORTER": " Console "}, "console"),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "otlp"),
    ({"OTEL_TRACES_EXPORTER": "none"}, "none"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, "none"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, "otlp"),
])
def test_the_standard_variables_choose_the_exporter(environ: dict[str, str], chosen: str) -> None:
    assert telemetry.standard_exporter(environ) == chosen


def test_a_standard_exporter_corral_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(telemetry.ENV_VAR, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(telemetry.UnknownExporter, match="otlp, console or none"):
        telemetry.Tracing("svc")


def test_the_corral_setting_comes_before_the_standard_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(telemetry.ENV_VAR, "none")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    assert not telemetry.Tracing("svc").enabled


def test_an_unknown_exporter_is_refused_with_the_choices() -> None:
    with pytest.raises(telemetry.UnknownExporter, match="none, console, file:PATH or otlp"):
        telemetry.Tracing("svc", "zipkin")


def test_file_exporter_names_the_file_per_service_and_process(tmp_path: Path) -> None:
    exporter, out = telemetry._exporter(f"file:{tmp_path}/{{service}}-{{pid}}.jsonl", "corral-test")
    try:
        provider = TracerProvider()
        provider.add_span_processor(telemetry.SimpleSpanProcessor(exporter))
        with provider.get_tracer("t").start_as_current_span("hello"):
            pass
    finally:
        assert out is not None
        out.close()
    [path] = tmp_path.glob("corral-test-*.jsonl")
    [line] = path.read_text().splitlines()
    assert json.loads(line)["name"] == "hello"


def test_context_travels_as_json_and_back() -> None:
    assert telemetry.current_context_json() is None  # no span: nothing to carry
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("submit") as span:
        carried = telemetry.current_context_json()
    assert carried is not None
    carrier = telemetry.context_from_json(carried)
    assert carrier["traceparent"].split("-")[1] == format(span.get_span_context().trace_id, "032x")
    with provider.get_tracer("t").start_as_current_span("run", context=telemetry.extract(carrier)) as child:
        assert child.get_span_context().trace_id == span.get_span_context().trace_id
        assert trace.get_current_span() is child
    assert telemetry.context_from_json("not json") == {}
    assert telemetry.context_from_json(None) == {}
