"""The bench's command line (``python -m bench``) and the typed options it yields."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass, fields

from worker.config import declared, variable_of

#: the bench's options that set a worker setting: option -> the setting's field (worker/config/settings.py);
#: they override the environment as `worker run`'s options do, and spawned workers get the same values
SETTING_OPTIONS = {
    "postgres_dsn": "postgres_dsn",
    "redis_url": "redis_url",
    "prefetch": "prefetch",
    "concurrency": "concurrency",
    "pool_size": "postgres_pool_size",
}
#: the settings the bench reads from the environment, as `worker run` does (the epilog lists them)
_READS = (
    "postgres_dsn",
    "rabbitmq_url",
    "redis_url",
    "max_server_memories",
    "max_personal_memories",
    "max_memory_length",
    "prefetch",
    "concurrency",
    "postgres_pool_size",
)


def _environment() -> str:
    """The epilog's paragraph on the variables the bench reads, named from the settings' declaration."""
    pg, amqp, *rest = (variable_of(field) for field in _READS)
    return textwrap.fill(
        f"environment: {pg} (a server where the bench may CREATE DATABASE), {amqp} (its host and credentials "
        f"are used to make the vhost), {', '.join(rest)}: as for `worker run`; spawned workers get the same "
        "values.",
        105,
    )


def _setting_help(text: str, field: str) -> str:
    """``text (env LTM_PREFETCH, 64)``: the variable and default of the setting ``field``, declared once."""
    setting = next(s for s in declared() if s.path[-1] == field)
    return f"{text} (env {setting.var}, {setting.shown_default})"


DESCRIPTION = """\
Load generator and measuring instrument for the worker.

Seeds a fresh database (ltm_bench_<hex>) with servers, personas and users, starts W `worker run`
processes against it and a fresh RabbitMQ vhost, and plays S shards that publish tool-call events as
CONTRACT.md defines them (a realistic mix: server-wide and personal saves, target names resolved through
every stage of the ladder, limit hits, races for the last free slot, bad arguments, unknown and
ambiguous users, disabled servers) and consume their own results. Latency is measured from publish (or,
with --rate, from the scheduled send time) to result.

Then measures the ceilings of this machine for the same work: (a) RabbitMQ alone (same bodies, shards
and window; echo consumers that publish a same-size result and notice, confirmed, and ack), (b) Postgres
alone (the worker's store path, batches included, driven directly with the fleet's concurrency
on a second database seeded identically), and prints the worker's throughput as a ratio of each.

Prints one table (or --json): events, duration, throughput, latency p50/p95/p99/max, CPU seconds per
1,000 events by process group (worker, postgres, rabbitmq, redis, the bench itself), and the counts by
status next to the counts the workload must produce. A progress line goes to stderr while it runs.
Exit status: 0 when every event got its expected status, 1 when not, 2 when the bench could not run.
"""

EPILOG = f"""\
safety: the bench works in a database and a vhost of its own, created for the run and removed after it
(unless --keep). The vhost is made with rabbitmqctl, so the broker must be on this machine; for any other
broker pass --rabbitmq-url naming an existing vhost set aside for the bench. A vhost whose work queue
holds messages (or, for a spawned fleet, has consumers) is refused. Spawned workers publish their cache
invalidations to --redis-url on the usual channel: do not point it at a production Redis.

--fleet external measures workers you started yourself. Give them an empty database and a vhost of their
own, then point the bench at the same two:
  createdb ltm_bench_x && LTM_POSTGRES_DSN=postgresql://.../ltm_bench_x worker migrate
  LTM_POSTGRES_DSN=... LTM_RABBITMQ_URL=amqp://.../bench worker run   (one or more, anywhere)
  python -m bench --fleet external --workers N --postgres-dsn postgresql://.../ltm_bench_x \\
                  --rabbitmq-url amqp://.../bench
The bench seeds that database (it must hold no rows yet) and leaves it in place; there is no CPU figure
for an external fleet, and its limits must match this shell's MAX_* variables.

{_environment()}
"""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Everything ``python -m bench`` is told; the defaults are the command's."""

    events: int = 20000
    warmup: int = 1000
    shards: int = 8
    window: int = 64
    rate: float | None = None
    workers: int = 1
    fleet: str = "spawn"
    servers: int = 100
    personas: int = 2
    users: int = 2000
    members: int = 25
    seed: int = 1
    json: bool = False
    skip_ceilings: bool = False
    keep: bool = False
    postgres_dsn: str | None = None
    rabbitmq_url: str | None = None
    redis_url: str | None = None
    prefetch: int | None = None
    concurrency: int | None = None
    pool_size: int | None = None
    timeout: float = 60.0
    progress: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    def problems(self) -> list[str]:
        """What is wrong with these options (empty when they can run)."""
        found = []
        for name in ("events", "shards", "window", "workers", "servers", "personas", "members"):
            if getattr(self, name) < 1:
                found.append(f"--{name} must be at least 1")
        if self.users < 4:
            found.append("--users must be at least 4")
        if self.warmup < 0:
            found.append("--warmup must be 0 or more")
        if self.rate is not None and self.rate <= 0:
            found.append("--rate must be more than 0 events/s")
        for name in ("prefetch", "concurrency", "pool_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                found.append(f"--{name.replace('_', '-')} must be at least 1")
        if self.fleet == "external" and not (self.postgres_dsn and self.rabbitmq_url):
            found.append(
                "--fleet external needs --postgres-dsn and --rabbitmq-url: the fleet's database and vhost"
            )
        return found


def bench_parser(prog: str = "python -m bench") -> argparse.ArgumentParser:
    """The parser of ``python -m bench``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_arguments(parser)
    return parser


def add_bench_arguments(bench: argparse.ArgumentParser) -> None:
    """The bench's options (``python -m bench``)."""
    d = BenchOptions()
    load = bench.add_argument_group("load")
    load.add_argument(
        "--events", type=int, default=d.events, help=f"events in the measured window ({d.events})"
    )
    load.add_argument(
        "--warmup",
        type=int,
        default=d.warmup,
        help=f"events played before the measured window, same mix, not timed ({d.warmup})",
    )
    load.add_argument(
        "--shards",
        type=int,
        default=d.shards,
        help=f"shards publishing in parallel, one connection each ({d.shards})",
    )
    load.add_argument(
        "--window",
        type=int,
        default=d.window,
        help=f"closed loop: unanswered events allowed per shard ({d.window})",
    )
    load.add_argument(
        "--rate",
        type=float,
        help="open loop instead: offer this many events/s in total, whatever the worker does; latency is "
        "measured from each event's scheduled send time (no coordinated omission)",
    )
    load.add_argument(
        "--timeout",
        type=float,
        default=d.timeout,
        help="give up when no result came for this many seconds after the last publish (in a closed loop, "
        f"also while every window is full) ({d.timeout:g})",
    )
    workers = bench.add_argument_group("workers")
    workers.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help=f"worker processes to start; with --fleet external, how many the running fleet has (sizes the "
        f"ceilings) ({d.workers})",
    )
    workers.add_argument(
        "--fleet",
        choices=("spawn", "external"),
        default=d.fleet,
        help="spawn: start the workers (CPU is measured); external: measure a fleet already running on "
        "--postgres-dsn and --rabbitmq-url (see below) (spawn)",
    )
    workers.add_argument("--prefetch", type=int, help=_setting_help("worker prefetch", "prefetch"))
    workers.add_argument(
        "--concurrency", type=int, help=_setting_help("events a worker processes at once", "concurrency")
    )
    workers.add_argument(
        "--pool-size", type=int, help=_setting_help("Postgres connections per worker", "postgres_pool_size")
    )
    world = bench.add_argument_group("seeded world")
    world.add_argument("--servers", type=int, default=d.servers, help=f"servers (guilds) ({d.servers})")
    world.add_argument(
        "--personas",
        type=int,
        default=d.personas,
        help=f"personas per server: one main, the rest alters ({d.personas})",
    )
    world.add_argument(
        "--users",
        type=int,
        default=d.users,
        help=f"Discord users; about 92%% have a users row, some private, some with saved names ({d.users})",
    )
    world.add_argument(
        "--members",
        type=int,
        default=d.members,
        help=f"guild members per server, sent with every event ({d.members})",
    )
    world.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help=f"seed of the world and the event mix: same seed, same run ({d.seed})",
    )
    where = bench.add_argument_group("services")
    where.add_argument(
        "--postgres-dsn",
        help=f"spawn: a server where the bench may create its databases (env {variable_of('postgres_dsn')}); "
        "external: the fleet's (empty, migrated) database",
    )
    where.add_argument(
        "--rabbitmq-url",
        help="an existing vhost set aside for the bench (required for a broker on another machine or an "
        "external fleet); without it, a fresh vhost is made with rabbitmqctl on the broker of "
        f"{variable_of('rabbitmq_url')}",
    )
    where.add_argument(
        "--redis-url", help=f"Redis for the spawned workers' invalidations (env {variable_of('redis_url')})"
    )
    output = bench.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    output.add_argument(
        "--skip-ceilings",
        action="store_true",
        help="measure the worker only, not RabbitMQ alone and Postgres alone",
    )
    output.add_argument(
        "--keep",
        action="store_true",
        help="keep the bench databases and vhost (and say where) instead of removing them",
    )
    output.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress line on stderr"
    )
