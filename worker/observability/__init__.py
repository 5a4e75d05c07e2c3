"""What the worker tells the people running it: JSON logs (`logs`), Prometheus metrics (`metrics`) and the
periodic broker/outbox readings behind some of them (`sampler`), OpenTelemetry spans (`tracing`), what
handling one event reports through them (`telemetry`), the dependency probes (`probes`) and the HTTP server
for /metrics, /healthz and /readyz (`http_server`)."""

__all__ = ["http_server", "logs", "metrics", "probes", "sampler", "telemetry", "tracing"]
