"""``python -m bench``: the load generator from a source checkout."""

from __future__ import annotations

import sys

from bench.options import bench_parser
from bench.run import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["latency"]:  # python -m bench latency: the shard's round trip (bench/latency.py)
        from bench.latency import main as latency

        sys.exit(latency(sys.argv[2:]))
    if sys.argv[1:2] == ["shard-queues"]:  # python -m bench shard-queues: the broker's cost of shard queues
        from bench.shard_queues import main as shard_queues

        sys.exit(shard_queues(sys.argv[2:]))
    if sys.argv[1:2] == ["noisy"]:  # python -m bench noisy: one shard's flood beside another's trickle
        from bench.noisy import main as noisy

        sys.exit(noisy(sys.argv[2:]))
    if sys.argv[1:2] == ["memory"]:  # python -m bench memory: the worker's RSS while Postgres stalls
        from bench.memory import main as memory

        sys.exit(memory(sys.argv[2:]))
    if sys.argv[1:2] == ["replay"]:  # python -m bench replay: worker dlq replay --rate beside live saves
        from bench.replay import main as replay

        sys.exit(replay(sys.argv[2:]))
    sys.exit(main(bench_parser().parse_args()))
