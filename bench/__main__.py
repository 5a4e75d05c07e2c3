"""``python -m bench``: the load generator from a source checkout (the same command as ``worker bench``)."""

from __future__ import annotations

import sys

from bench.options import bench_parser
from bench.run import main

if __name__ == "__main__":
    sys.exit(main(bench_parser().parse_args()))
