"""What admission reads of a pod, in one place: whether it has finished, and the
`nvidia.com/gpu` it holds. `cluster` (the snapshot's allocated GPUs) and `holds` (a held
TrainJob's scheduled pods) count a pod the same way; both import this, neither the other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from controller.api.base import GPU_RESOURCE

#: The phases of a pod that holds nothing any more.
FINISHED = frozenset({"Succeeded", "Failed"})

_QUANTITY = re.compile(r"^\d+$")


def quantity(value: object) -> int | None:
    """A whole-number resource quantity (`"8"`); None when absent or not whole."""
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _QUANTITY.match(value):
        return int(value)
    return None


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """nvidia.com/gpu a pod holds: the most of its init containers, or the sum of the rest."""
    spec = pod.get("spec") or {}

    def requested(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            amount = quantity((resources.get(part) or {}).get(GPU_RESOURCE))
            if amount is not None:
                return amount
        return 0

    main = sum(requested(c) for c in spec.get("containers") or [])
    init = max((requested(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has succeeded or failed: it holds no GPU any more."""
    return (pod.get("status") or {}).get("phase") in FINISHED


def live_pods(pods: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """The pods not finished."""
    return (pod for pod in pods if not finished(pod))
