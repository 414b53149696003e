"""The cluster a scenario runs against, reached only through kubectl, as a user reaches it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from controller.api import conditions as cond

T = TypeVar("T")


class ScenarioFailed(AssertionError):
    """What the cluster did differs from what the scenario expects; the message says both."""


def expect(holds: bool, message: str) -> None:
    """An assertion that survives `python -O` (the kind run is no pytest run)."""
    if not holds:
        raise ScenarioFailed(message)


@dataclass
class Target:
    """A cluster with vramgate installed and the layout's GPU nodes (`nodes`, sorted by name,
    the only nodes labelled with `product`)."""

    kubectl_bin: str
    kubeconfig: Path
    nodes: Sequence[str]
    product: str
    #: How long a scenario waits for one thing the operator or the cluster does.
    timeout_s: float = 90.0
    log: Callable[[str], None] = print

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
                input=stdin, capture_output=True, text=True, check=False, timeout=120,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise ScenarioFailed(f"kubectl {' '.join(args)} did not answer in 120 s") from None
        if check and done.returncode != 0:
            raise ScenarioFailed(f"kubectl {' '.join(args)} failed: {last_line(done.stderr)}")
        return done

    def apply(
        self, namespace: str, manifest: Mapping[str, Any]
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply` of one object, as a user applies a file; not checked: a refusal
        is what some scenarios expect."""
        return self.kubectl(
            "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(dict(manifest)), check=False
        )

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as JSON, or None when it does not exist."""
        scope = ("-n", namespace) if namespace else ()
        done = self.kubectl("get", kind, name, *scope, "-o", "json", check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr or "not found" in done.stderr:
                return None
            raise ScenarioFailed(f"kubectl get {kind} {name} failed: {last_line(done.stderr)}")
        return dict(json.loads(done.stdout))

    def wait(self, check: Callable[[], T | None], what: str, timeout: float | None = None) -> T:
        """Poll `check` until it returns something truthy; fail naming `what` at the deadline."""
        deadline = time.monotonic() + (timeout or self.timeout_s)
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"timed out after {timeout or self.timeout_s:.0f}s "
                                     f"waiting for {what}")  # fmt: skip
            time.sleep(0.5)

    @contextlib.contextmanager
    def namespace(self, scenario: str) -> Iterator[str]:
        """A namespace of the scenario's own, deleted afterwards with everything in it; the
        next scenario starts once it is gone, so every reservation and pod in it is gone."""
        name = f"vg-e2e-{scenario.replace('_', '-')[:30]}-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        self.wait(lambda: self.get("serviceaccount", "default", name), f"{name}'s default SA")
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)
            self.wait(lambda: self.get("namespace", name) is None,
                      f"namespace {name} to be deleted", timeout=180)  # fmt: skip

    def admitted(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job once its Admitted condition has a decision (True, or a reason admission
        gave), else None: a job not estimated yet (ConfigMapUnavailable ...) is undecided."""
        job = self.get("finetunejob", name, namespace)
        found = condition(job, "Admitted")
        if found is None or (
            found["status"] != "True" and found["reason"] in cond.BEFORE_ADMISSION
        ):
            return None
        return job


def last_line(text: str) -> str:
    """kubectl's last word on stderr (retries and warnings come before it)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def condition(job: Mapping[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for found in ((job or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return None
