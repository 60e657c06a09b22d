"""``python -m benchmarks NAME [--quick] [--json FILE]``: run one benchmark.

Every benchmark measures its baselines in the same run and reports ratios (ours / baseline),
because absolute numbers drift on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from pathlib import Path

BENCHMARKS = {
    "put_get": "benchmarks.put_get",
    "tiers": "benchmarks.tiers",
    "hedging": "benchmarks.hedging",
    "concurrency": "benchmarks.concurrency",
    "tenancy": "benchmarks.tenancy",
    "ingest": "benchmarks.ingest",
    "p2p": "benchmarks.p2p",
    "checkpoint": "benchmarks.checkpoint",
    "metadata": "benchmarks.metadata",
    "write_availability": "benchmarks.write_availability",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark to run")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    module = importlib.import_module(BENCHMARKS[args.name])
    report = asyncio.run(module.run(quick=args.quick))
    report.print_table(sys.stdout)
    if args.json:
        report.write_json(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
