"""kopf's own cost of the operator's watches: a process that watches what the operator
watches, with the same filters and kopf settings, and whose handlers do nothing.

    python -m benchmarks.kopf_floor [--kueue]   # $KUBECONFIG's cluster, until stopped

Why: "operator CPU per decided job" mixes vramgate's work (estimates, passes, writes,
webhooks) with what kopf spends receiving every watch event (decoding it, building a cause,
calling an index and an event handler). Run beside the operator through a decisions run
(`bench_operator --kopf-floor`), its CPU per job is what any kopf operator watching those
resources pays for the same event stream: the part no change inside vramgate's handlers can
remove. The registry mirrors `controller.operator.caches.register` and
`controller.operator.handlers.register` (resource, filter, one index and one event handler
per resource; with `--kueue`, those of `--kueue-admission-check` too, as `bench_kueue
--kopf-floor` runs it), each handler returning at once.
"""

from __future__ import annotations

import argparse
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
#: The Kueue check's watches (AdmissionChecks have a second event handler: `activate`).
KUEUE_WATCHES: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (caches.KUEUE_WORKLOAD_RESOURCE, {}),
    (caches.ADMISSION_CHECK_RESOURCE, {}),
    (caches.RESOURCE_FLAVOR_RESOURCE, {}),
]


def registry(with_kueue: bool = False) -> kopf.OperatorRegistry:
    """One no-op index and one no-op event handler per watched resource."""
    out = kopf.OperatorRegistry()
    kopf.on.login(registry=out)(kopf.login_via_client)

    async def index(body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {}

    async def event(**_: Any) -> None:
        return None

    for resource, only in WATCHES + (KUEUE_WATCHES if with_kueue else []):
        name = resource[-1]
        kopf.index(*resource, id=f"floor-{name}", registry=out, **only)(cast(Any, index))
        kopf.on.event(*resource, id=f"floor-wake-{name}", registry=out, **only)(event)
    if with_kueue:
        resource = caches.ADMISSION_CHECK_RESOURCE
        kopf.on.event(*resource, id="floor-activate", registry=out)(event)
    return out


def settings() -> kopf.OperatorSettings:
    """The operator's own kopf settings, without its webhook server."""
    return operator_settings(OperatorOptions(webhook=WebhookMode.OFF))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kueue", action="store_true", help="the Kueue check's watches too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    gc.collect()  # as the operator does (run.py): no full collections over its imports
    gc.freeze()
    kopf.run(registry=registry(args.kueue), settings=settings(), clusterwide=True, standalone=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
