"""`python -m e2e.suite --kubeconfig K`: the end-to-end scenarios against an installed vramgate.

The cluster needs GPU nodes labelled with `--product` whose agents publish the suite's
layout (`e2e/suite/layout.py`); `e2e.kind` sets that up and calls `run_all`. Prints a line
per scenario and a closing `N passed, N failed`; exits 1 when one failed, 2 (one line) when
the cluster cannot be reached.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from e2e.suite import layout
from e2e.suite.run import run_all, suite_nodes
from e2e.suite.target import ScenarioFailed, Target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.suite", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--product", default=layout.PRODUCT,
                        help="the GPU product label of the suite's nodes")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        nodes = suite_nodes(args.kubectl, args.kubeconfig, args.product)
    except (ScenarioFailed, OSError) as error:  # no cluster, or no kubectl
        print(f"e2e.suite: cannot list the suite's nodes: {error}", file=sys.stderr)
        return 2
    try:
        _, failed = run_all(Target(args.kubectl, args.kubeconfig, nodes, args.product))
    except ScenarioFailed as error:  # the webhook never answered
        print(f"e2e.suite: {error}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
