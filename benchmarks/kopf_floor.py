"""kopf's own cost of the operator's watches: a process that watches what the operator
watches, with the same filters and kopf settings, and whose handlers do nothing.

    python -m benchmarks.kopf_floor      # $KUBECONFIG's cluster, until stopped

Why: "operator CPU per decided job" mixes vramgate's work (estimates, passes, writes,
webhooks) with what kopf spends receiving every watch event (decoding it, building a cause,
calling an index and an event handler). Run beside the operator through a decisions run
(`bench_operator --kopf-floor`), its CPU per job is what any kopf operator watching those
resources pays for the same event stream: the part no change inside vramgate's handlers can
remove. The registry mirrors `controller.operator.caches.register` and
`controller.operator.handlers.register` (resource, filter, one index and one event handler
per resource; not the Kueue ones), each handler returning at once.
"""

from __future__ import annotations

import gc
import logging
from typing import Any, cast

import kopf

from controller.api.base import GROUP, VERSION
from controller.api.finetunejob import PLURAL
from controller.api.gpunode import PLURAL as GPUNODE_PLURAL
from controller.api.learnedcorrection import PLURAL as LEARNED_PLURAL
from controller.operator import caches
from controller.operator.run import operator_settings
from controller.operator.settings import OperatorOptions, WebhookMode

#: (resource, the keyword filters kopf gets): the operator's watches, as `caches` names them.
WATCHES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    ((GROUP, VERSION, PLURAL), {}),
    ((GROUP, VERSION, GPUNODE_PLURAL), {}),
    (("v1", "nodes"), {}),
    (("v1", "pods"), {"when": caches.gpu_or_job_pod}),
    (("batch", "v1", "jobs"), {"labels": caches.WORKLOAD_LABELS}),
    (caches.PRIORITY_CLASS_RESOURCE, {}),
    ((GROUP, VERSION, LEARNED_PLURAL), {}),
]


def registry() -> kopf.OperatorRegistry:
    """One no-op index and one no-op event handler per watched resource."""
    out = kopf.OperatorRegistry()
    kopf.on.login(registry=out)(kopf.login_via_client)

    async def index(body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {}

    async def event(**_: Any) -> None:
        return None

    for resource, only in WATCHES:
        name = resource[-1]
        kopf.index(*resource, id=f"floor-{name}", registry=out, **only)(cast(Any, index))
        kopf.on.event(*resource, id=f"floor-wake-{name}", registry=out, **only)(event)
    return out


def settings() -> kopf.OperatorSettings:
    """The operator's own kopf settings, without its webhook server."""
    return operator_settings(OperatorOptions(webhook=WebhookMode.OFF))


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    gc.collect()  # as the operator does (run.py): no full collections over its imports
    gc.freeze()
    kopf.run(registry=registry(), settings=settings(), clusterwide=True, standalone=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
