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
import traceback
from collections.abc import Sequence
from pathlib import Path

from controller.api.base import PRODUCT_LABEL
from e2e.suite import layout
from e2e.suite.scenarios import SCENARIOS
from e2e.suite.target import ScenarioFailed, Target


def suite_nodes(kubectl_bin: str, kubeconfig: Path, product: str) -> list[str]:
    """The nodes labelled with the suite's product, sorted by name as the packer ties them."""
    probe = Target(kubectl_bin, kubeconfig, nodes=(), product=product)
    done = probe.kubectl("get", "nodes", "-l", f"{PRODUCT_LABEL}={product}",
                         "-o", "jsonpath={.items[*].metadata.name}")  # fmt: skip
    return sorted(done.stdout.split())


def run_all(target: Target) -> tuple[int, int]:
    """Every scenario in order; (passed, failed). A failure is reported and the next runs."""
    expect_nodes = layout.NODES
    if len(target.nodes) != expect_nodes:
        target.log(f"[e2e] the layout needs {expect_nodes} nodes labelled "
                   f"{PRODUCT_LABEL}={target.product}, found {len(target.nodes)}")  # fmt: skip
        return 0, len(SCENARIOS)
    passed = failed = 0
    for scenario in SCENARIOS:
        try:
            scenario(target)
        except ScenarioFailed as error:
            failed += 1
            target.log(f"[e2e] {scenario.__name__}: FAILED: {error}")
        except Exception:  # a broken scenario is reported, and the rest still run
            failed += 1
            target.log(f"[e2e] {scenario.__name__}: ERROR:\n{traceback.format_exc()}")
        else:
            passed += 1
            target.log(f"[e2e] {scenario.__name__}: passed")
    target.log(f"{passed} passed, {failed} failed")
    return passed, failed


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
    _, failed = run_all(Target(args.kubectl, args.kubeconfig, nodes, args.product))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
