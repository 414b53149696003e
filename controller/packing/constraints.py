"""Where a job's pods may run besides GPU memory, matched as kube-scheduler matches them.

The workload's pods carry the job's pod template: its nodeSelector, its required node
affinity and its tolerations, ANDed with the pin to the chosen nodes. A GPU on a node the
template excludes is one the pods can never run on: placed there, a job would hold the GPU
while its pods stay Pending (Unschedulable). So a job is placed only on nodes its template
admits, and refused (NoMatchingGPU) where none does, as for spec.resources.gpuSelector.

Taints keep a job off a node now, not for good: one comes and goes as a cordon does
(maintenance, a node being drained or scaled down), so a job whose template tolerates no
node's taint waits (WaitingForNodes, naming the taint), where a nodeSelector or affinity
that no node matches refuses it. The taints the node lifecycle controller sets for what
packing judges itself (not ready, unreachable, cordoned) are left to those checks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.packing.inventory import NodeState, Taint

#: Taints that keep pods off a node; PreferNoSchedule only steers the scheduler.
REPELLING = ("NoSchedule", "NoExecute")
#: The node's health and cordon, as taints: judged by `placeable`, not here.
JUDGED_ELSEWHERE = frozenset({
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
})  # fmt: skip
#: What kube-scheduler parses a Gt/Lt value and label as: a decimal int64.
_INT64 = re.compile(r"^-?[0-9]{1,19}$")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions (a label) or matchFields (metadata.name) entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()
    on_name: bool = False

    def matches(self, node: NodeState) -> bool:
        value = node.name if self.on_name else node.labels.get(self.key)
        match self.operator:
            case "In":
                return value is not None and value in self.values
            case "NotIn":
                return value is None or value not in self.values
            case "Exists":
                return value is not None
            case "DoesNotExist":
                return value is None
            case "Gt" | "Lt" if value is not None and len(self.values) == 1:
                have, bound = _int64(value), _int64(self.values[0])
                if have is None or bound is None:
                    return False
                return have > bound if self.operator == "Gt" else have < bound
        return False


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


#: What the ExtendedResourceToleration admission plugin adds to a pod requesting
#: nvidia.com/gpu, and what the workload carries itself in devicePlugin mode.
GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


@dataclass(frozen=True, slots=True)
class NodeConstraints:
    """The pod template's node selection: hashable, so a view matches each distinct one
    once per pass."""

    node_selector: tuple[tuple[str, str], ...] = ()
    #: Required node affinity: any term, each of all its requirements; () when none.
    terms: tuple[tuple[Requirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    #: Its pods are pinned by one nodeSelector (a Kueue Workload's podSetUpdates): a job of
    #: several pods must still run on one node.
    one_node: bool = False
    #: Its GPUs are split evenly over this many pods, each on one node (a TrainJob's
    #: numNodes): a count it does not divide has no placement, and a node takes whole pods
    #: only (its GPU count a multiple of the pod's). 0: the workload's own pods, any shape.
    pods: int = 0

    def admits(self, node: NodeState, tolerated: Iterable[Toleration] = ()) -> bool:
        return self.selects(node) and not self.repelled_by(node, tolerated)

    def selects(self, node: NodeState) -> bool:
        if any(node.labels.get(k) != v for k, v in self.node_selector):
            return False
        # A term without requirements matches no node, as the scheduler reads it.
        return not self.terms or any(
            term and all(r.matches(node) for r in term) for term in self.terms
        )

    def repelled_by(self, node: NodeState, tolerated: Iterable[Toleration] = ()) -> list[Taint]:
        """The node's taints that keep these pods off it."""
        tolerations = (*self.tolerations, *tolerated)
        return [
            taint
            for taint in node.taints
            if taint.effect in REPELLING
            and taint.key not in JUDGED_ELSEWHERE
            and not any(t.tolerates(taint) for t in tolerations)
        ]

    def describe(self) -> str:
        """The parts the template sets, for messages ("" when it sets none)."""
        parts = []
        if self.node_selector:
            shown = ", ".join(f"{k}={v}" for k, v in self.node_selector)
            parts.append(f"nodeSelector {{{shown}}}")
        if self.terms:
            parts.append("required node affinity")
        return " and ".join(parts)


def from_pod_template(template: object) -> NodeConstraints:
    """The constraints of a FineTuneJob's spec.template. The template's shape is checked
    where it is accepted (the webhook, the workload build): here, whatever does not read as
    a selector, a term or a toleration is skipped, never an error."""
    spec = _map(_map(template).get("spec"))
    selector = tuple(sorted((str(k), str(v)) for k, v in _map(spec.get("nodeSelector")).items()))
    affinity = _map(_map(spec.get("affinity")).get("nodeAffinity"))
    required = _map(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = tuple(_term(term) for term in _list(required.get("nodeSelectorTerms")))
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in _list(spec.get("tolerations"))
        if isinstance(t, Mapping)
    )
    return NodeConstraints(selector, terms, tolerations)


def _term(term: object) -> tuple[Requirement, ...]:
    found = _map(term)
    return tuple(
        Requirement(
            key=str(r.get("key") or ""),
            operator=str(r.get("operator") or ""),
            values=tuple(str(v) for v in _list(r.get("values"))),
            on_name=on_name,
        )
        for field, on_name in (("matchExpressions", False), ("matchFields", True))
        for r in map(_map, _list(found.get(field)))
        # matchFields selects by metadata.name only (the API refuses another field).
        if not on_name or r.get("key") == "metadata.name"
    )


def _int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64): Python's int() also takes '1_0', '+5', other
    scripts' digits and any size."""
    if not _INT64.match(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
