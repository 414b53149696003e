"""`python -m e2e.kind` (`make kind`): the chart and the image on a real kind cluster.

Creates a kind cluster (e2e/kind/kind-config.yaml), builds the image from the repository's
Dockerfile and loads it into the nodes, gives the two workers simulated GPUs (nvidia.com/gpu
capacity for the scheduler, the agents' static backend for the memory: the end-to-end
suite's layout, `e2e/suite/layout.py`), installs the chart with e2e/kind/values.yaml, waits
for the agents' GPUNodes, and runs the end-to-end suite (`e2e/suite`), the same scenarios
the test suite runs on the local control plane: best fit, refusal at apply through the
webhook's Service, resize at apply with FSDP across nodes, queue until a job finishes, a
cordoned node. The cluster is deleted at the end unless --keep.

Where Docker or kind is missing (CI here has neither) it says so in one line and exits 0:
skipped, not failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from e2e.suite import layout
from e2e.suite.run import run_all
from e2e.suite.target import ScenarioFailed, Target

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHART = REPO / "charts" / "vramgate"
IMAGE = "vramgate:e2e"
NAMESPACE = "vramgate-system"
RELEASE = "vramgate"


class E2EError(Exception):
    """A step failed; the message says which and why."""


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """Why this run cannot happen here, or None. Docker must also answer, not only exist."""
    for tool in ("docker", "kind", "kubectl", "helm"):
        if which(tool) is None and not (tool in ("kubectl", "helm") and _cached(tool)):
            return f"{tool} not found"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return "the Docker daemon does not answer (`docker info` failed)"
    return None


def _cached(tool: str) -> Path | None:
    """kubectl and helm as `make binaries` builds them, when not on PATH."""
    from e2e.build import BuildError, ensure_binaries

    try:
        return ensure_binaries([tool])[tool]
    except (BuildError, KeyError):
        return None


def _tool(name: str) -> str:
    return shutil.which(name) or str(_cached(name))


def run(argv: Sequence[str], *, stdin: str | None = None, what: str = "") -> str:
    print(f"[kind] $ {' '.join(argv)}", flush=True)
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise E2EError(f"{what or argv[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def wait_for(check: Callable[[], bool], what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise E2EError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(2)
    print(f"[kind] {what}: ok", flush=True)


class Kind:
    def __init__(self, name: str, kubeconfig: Path) -> None:
        self.name, self.kubeconfig = name, kubeconfig
        self.kubectl_bin, self.helm_bin = _tool("kubectl"), _tool("helm")

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return run([self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args], stdin=stdin)

    def helm(self, *args: str) -> str:
        return run([self.helm_bin, "--kubeconfig", str(self.kubeconfig), *args])

    def create(self) -> None:
        config = str(HERE / "kind-config.yaml")
        run(["kind", "create", "cluster", "--name", self.name, "--config", config,
             "--kubeconfig", str(self.kubeconfig), "--wait", "120s"])  # fmt: skip

    def delete(self) -> None:
        subprocess.run(["kind", "delete", "cluster", "--name", self.name], check=False)

    def build_and_load(self) -> None:
        run(["docker", "build", "-t", IMAGE, str(REPO)], what="docker build")
        run(["kind", "load", "docker-image", IMAGE, "--name", self.name])

    def simulate_gpus(self) -> list[str]:
        """nvidia.com/gpu capacity on the labelled workers, as a device plugin would
        advertise it (a status patch: the kubelet keeps extended resources it did not set)."""
        names = self.kubectl("get", "nodes", "-l", "vramgate.dev/simulated-gpus=true",
                             "-o", "jsonpath={.items[*].metadata.name}").split()  # fmt: skip
        capacity = str(layout.GPUS_PER_NODE)
        patch = json.dumps([
            {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": capacity},
        ])  # fmt: skip
        for name in names:
            self.kubectl("patch", "node", name, "--subresource=status", "--type=json", "-p", patch)
        return names

    def install(self) -> None:
        self.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                  "--values", str(HERE / "values.yaml"),
                  "--set-json", f"agent.static.gpus={json.dumps(layout.static_gpus())}",
                  "--wait", "--timeout", "5m")  # fmt: skip

    def jsonpath(self, *args: str) -> str:
        try:
            return self.kubectl(*args)
        except E2EError:
            return ""


def check(cluster: Kind, nodes: list[str]) -> bool:
    """The end-to-end suite through the installed chart; True when every scenario passed."""

    def gpunodes() -> list[str]:
        names = cluster.jsonpath("get", "gpunodes", "-o", "jsonpath={.items[*].metadata.name}")
        return sorted(names.split())

    wait_for(lambda: gpunodes() == sorted(nodes), "a GPUNode per simulated GPU node")
    target = Target(cluster.kubectl_bin, cluster.kubeconfig, sorted(nodes), layout.PRODUCT,
                    timeout_s=180)  # fmt: skip
    try:
        _, failed = run_all(target)
    except ScenarioFailed as error:  # the webhook never answered through its Service
        print(f"e2e/kind: {error}", file=sys.stderr)
        failed = 1
    if failed:  # what the operator said while the scenarios ran
        print(cluster.jsonpath("logs", "-n", NAMESPACE, f"deployment/{RELEASE}-operator",
                               "--tail", "200"), flush=True)  # fmt: skip
    return failed == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind", description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="vramgate-e2e", help="kind cluster name")
    parser.add_argument("--keep", action="store_true", help="keep the cluster afterwards")
    args = parser.parse_args(argv)
    why = missing_tools()
    if why:
        print(f"e2e/kind: skipped: {why}")
        return 0
    kubeconfig = Path.home() / ".cache" / "vramgate" / f"kind-{args.name}.kubeconfig"
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    cluster = Kind(args.name, kubeconfig)
    try:
        cluster.create()
        cluster.build_and_load()
        nodes = cluster.simulate_gpus()
        cluster.install()
        if not check(cluster, nodes):
            print("e2e/kind: failed: see the scenarios above", file=sys.stderr)
            return 1
    except E2EError as error:
        print(f"e2e/kind: failed: {error}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            cluster.delete()
    print("e2e/kind: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
