"""OpenTelemetry tracing for corral's services.

Every service traces every RPC it serves (the server interceptor in
`services/common/server.py`) and every RPC it makes (the gRPC client
instrumentor, installed once per process, adds its interceptor to every
`grpc.aio` channel), so one trace follows a call from the frontend to the
driver. Spans of our own use `opentelemetry.trace.get_tracer(__name__)`:
the provider is the process's global one. Where a hop is not an RPC of its own — the driver
handing a job to a worker over the worker's long-lived session stream — the
W3C trace context travels inside the message (`inject`/`extract`), so the
worker's span of the job joins the trace of the submission that created it.

Exporting is off by default. `CORRAL_TRACE_EXPORTER` (or a service's
`--trace-exporter`) chooses where spans go:
  none              no tracing at all (the default);
  console           one JSON span per line on stderr;
  file:PATH         one JSON span per line appended to PATH; `{service}` and
                    `{pid}` in PATH are replaced, so one setting gives each
                    process its own file (what `corral up --trace` uses);
  otlp              OTLP over gRPC to OTEL_EXPORTER_OTLP_ENDPOINT; needs the
                    opentelemetry-exporter-otlp-proto-grpc package installed.

Without a corral setting, the standard OpenTelemetry variables apply:
`OTEL_SDK_DISABLED=true` turns tracing off, `OTEL_TRACES_EXPORTER` chooses
otlp, console or none; `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
name the process (else `corral-<service>`), and the OTLP exporter and the
batch processor read their own (`OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import IO

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENV_VAR = "CORRAL_TRACE_EXPORTER"

_PROPAGATOR = TraceContextTextMapPropagator()


class UnknownExporter(ValueError):
    """The exporter setting names nothing we know."""


def _json_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def _exporter(spec: str, service_name: str) -> tuple[SpanExporter, IO[str] | None]:
    """The exporter a setting names, and the file it opened (to close at shutdown)."""
    if spec == "console":
        return ConsoleSpanExporter(out=sys.stderr, formatter=_json_line), None
    if spec.startswith("file:"):
        path = spec.removeprefix("file:").replace("{service}", service_name).replace("{pid}", str(os.getpid()))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        out = open(path, "a", buffering=1)  # line-buffered: a reader sees whole spans
        return ConsoleSpanExporter(out=out, formatter=_json_line), out
    if spec == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise UnknownExporter("the otlp exporter needs opentelemetry-exporter-otlp-proto-grpc installed") from e
        return OTLPSpanExporter(), None
    raise UnknownExporter(f"unknown trace exporter {spec!r}: use none, console, file:PATH or otlp")


def standard_exporter(environ: Mapping[str, str]) -> str:
    """The exporter OpenTelemetry's own variables choose: none unless OTEL_TRACES_EXPORTER names one (and
    OTEL_SDK_DISABLED is not true). Its first exporter, if it lists several."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"
    chosen = environ.get("OTEL_TRACES_EXPORTER", "").split(",")[0].strip().lower()
    if chosen in ("", "none"):
        return "none"
    if chosen not in ("otlp", "console"):
        raise UnknownExporter(f"OTEL_TRACES_EXPORTER={chosen!r}: corral's services export otlp, console or none")
    return chosen


class Tracing:
    """A service's tracer provider, or nothing when tracing is off."""

    def __init__(self, service_name: str, spec: str | None = None):
        spec = (spec if spec is not None else os.environ.get(ENV_VAR, "")) or standard_exporter(os.environ)
        self.provider: TracerProvider | None = None
        self._file: IO[str] | None = None
        if spec == "none":
            return
        exporter, self._file = _exporter(spec, service_name)
        # OTEL_SERVICE_NAME, when set, names the process (Resource.create reads it, and the variables'
        # resource attributes); an explicit service.name would override it.
        named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
        self.provider = TracerProvider(resource=Resource.create(named))
        # Files and the console get each span as it ends (tests and `corral up`
        # read them live); a network exporter batches.
        processor = BatchSpanProcessor(exporter) if spec == "otlp" else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        _install_globally(self.provider)

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self) -> None:
        """Flush what is buffered and close the file (call once, at exit)."""
        if self.provider is not None:
            self.provider.shutdown()
        if self._file is not None:
            self._file.close()


_installed: TracerProvider | None = None


def _install_globally(provider: TracerProvider) -> None:
    """Make `provider` the process's tracer provider and trace every `grpc.aio`
    channel the process opens (the instrumentor adds the client interceptor to
    each new channel), so no code that opens a channel has to know about
    tracing. Once per process: a service is one process."""
    global _installed
    if _installed is not None:
        return
    _installed = provider
    trace.set_tracer_provider(provider)
    GrpcAioInstrumentorClient().instrument(tracer_provider=provider)


def inject(carrier: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Write the current span's W3C trace context into `carrier` (e.g. a proto map field)."""
    _PROPAGATOR.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    """The context a message carried, to start a child span in."""
    return _PROPAGATOR.extract(carrier)


def current_context_json() -> str | None:
    """The current span's trace context as JSON, to store with what a call
    created (an update) and hand on later; None outside a recorded span."""
    carrier = inject({})
    return json.dumps(carrier, sort_keys=True) if carrier else None


def context_from_json(text: str | None) -> dict[str, str]:
    """The carrier `current_context_json` stored (empty if none or unreadable)."""
    if not text:
        return {}
    try:
        carrier = json.loads(text)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in carrier.items()} if isinstance(carrier, dict) else {}
