"""Which tracing a server runs: OpenTelemetry's, or none.

``tracing_from_env`` returns ``NO_TRACING`` unless an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, the
standard variables) and the ``tether[otel]`` extra is installed; only then is
``tether.observability.otel`` imported, and with it the SDK.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from tether.observability.traces import NO_TRACING, Tracing

logger = logging.getLogger(__name__)

_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing:
    """OpenTelemetry tracing when an OTLP endpoint is set and the SDK is
    installed; ``NO_TRACING`` otherwise (with a warning when only the SDK is
    missing: the operator asked for traces)."""
    environ = os.environ if environ is None else environ
    if not any(environ.get(name) for name in _ENDPOINT_VARIABLES):
        return NO_TRACING
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACING
    try:
        from tether.observability.otel import OTelTracing
    except ImportError as error:
        logger.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but tracing is off: install tether[otel] (%s)",
            error,
        )
        return NO_TRACING
    return OTelTracing.from_env(environ)
