"""RabbitMQ through aio-pika: `topology` (what is declared and checked), `envelope` and `content_header`
(reading a delivery, hostile properties included), `headers` (names, readers, the one message copy), `events`,
`publisher` (confirmed publishing of results, notices, retries, dead letters), `acks` (acks that leave
together), `blocking` (connection.blocked), `urls` (node lists)."""

__all__ = [
    "acks",
    "blocking",
    "content_header",
    "envelope",
    "events",
    "headers",
    "publisher",
    "topology",
    "urls",
]
