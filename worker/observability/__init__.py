"""What the worker tells the people running it: JSON logs (`logs`), Prometheus metrics (`metrics`) and the
periodic broker/outbox readings behind some of them (`sampler`), OpenTelemetry spans (`tracing`), what
handling one event reports through them (`telemetry`), the dependency probes (`probes`) and the HTTP server
for /metrics, /healthz and /readyz (`http_server`), and what each worker saw of each shard, written to
Postgres for `worker shards` (`activity`)."""

__all__ = ["activity", "http_server", "logs", "metrics", "probes", "sampler", "telemetry", "tracing"]
