"""Running the scenarios against a cluster: its suite nodes, then every scenario in order."""

from __future__ import annotations

import traceback
from pathlib import Path

from controller.api.base import PRODUCT_LABEL
from e2e.suite import layout
from e2e.suite.scenarios import SCENARIOS, wait_for_the_webhook
from e2e.suite.target import ScenarioFailed, Target


def suite_nodes(kubectl_bin: str, kubeconfig: Path, product: str) -> list[str]:
    """The nodes labelled with the suite's product, sorted by name as the packer ties them."""
    probe = Target(kubectl_bin, kubeconfig, nodes=(), product=product)
    done = probe.kubectl("get", "nodes", "-l", f"{PRODUCT_LABEL}={product}",
                         "-o", "jsonpath={.items[*].metadata.name}")  # fmt: skip
    return sorted(done.stdout.split())


def run_all(target: Target) -> tuple[int, int]:
    """Every scenario in order, once the webhook judges the layout; (passed, failed). A
    failure is reported and the next runs; a webhook that never answers raises."""
    if len(target.nodes) != layout.NODES:
        target.log(f"[e2e] the layout needs {layout.NODES} nodes labelled "
                   f"{PRODUCT_LABEL}={target.product}, found {len(target.nodes)}")  # fmt: skip
        return 0, len(SCENARIOS)
    wait_for_the_webhook(target)
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
