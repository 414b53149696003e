"""A Trace job in the operator, on the real local control plane: traced off the loop while
other jobs are decided, shown as Tracing, kept in status, and not traced again after a
restart.

The model is a 4-layer Llama config in a ConfigMap (`tests.unit.trace_support.TINY_LLAMA`)
at world size 2 under FSDP, so the operator traces one step on one GPU and one rank of two:
seconds, not a minute. Its jobs have no template, so each is decided (NoTemplate) and keeps
waiting: a restarted operator estimates it again, which is what is tested.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    OperatorProcess,
    condition,
    crds,
    create,
    events_for,
    expect_condition,
    finetunejob,
    forget_webhook_configs,
    get,
)
from tests.unit.trace_support import TINY_LLAMA

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-trace-tests.vramgate.dev"
FORMULA_JOBS = ("formula-a", "formula-b", "formula-c")
#: The first trace imports torch and transformers in the operator, then traces twice.
TRACE_DEADLINE_S = 120.0
TRACING = re.compile(
    r"tracing one training step of configmaps/tiny\[config\.json\] at world size 2 \(FSDP\): "
    r"about \d+ s \(a default: no trace has ended here yet\), started \d\d:\d\d:\d\dZ"
)


@pytest.fixture
def operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path: object,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster, api_client, tmp_path,  # type: ignore[arg-type]
        extra=("--lease-name", "vramgate-trace-tests"), webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=False)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def estimates(process: OperatorProcess, source: str) -> float:
    """vramgate_estimates_total{profile="trace",source=...} of the running operator."""
    url = f"http://127.0.0.1:{process.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vramgate_estimates_total" and s.labels == {
                "profile": "trace", "source": source,
            }:  # fmt: skip
                return float(s.value)
    return 0.0


def test_a_trace_job_is_traced_off_the_loop_kept_in_status_and_not_traced_again(
    operator: OperatorProcess, api_client: client.ApiClient, namespace: str
) -> None:
    started = time.monotonic()
    client.CoreV1Api(api_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": "tiny"}, "data": {"config.json": json.dumps(TINY_LLAMA)}}
    )
    traced = finetunejob(
        "traced",
        model={"configMapRef": {"name": "tiny"}},
        method="LoRA",
        lora={"rank": 8},
        training={"sequenceLength": 1024, "microBatchSize": 1},
        estimator={"profile": "Trace"},
        resources={"gpus": 2},
    )
    create(api_client, namespace, traced)
    for name in FORMULA_JOBS:  # applied right after it
        create(api_client, namespace, finetunejob(name))

    # Every formula job is estimated and decided while the trace job is still Tracing (read
    # right after: its Tracing status may land a moment after the formula jobs' decisions,
    # which do not wait for it).
    def formula_jobs_decided() -> bool:
        return all(
            (condition(get(api_client, namespace, name), "Admitted") or {}).get("reason")
            == "NoTemplate"
            for name in FORMULA_JOBS
        )

    wait_until(formula_jobs_decided, timeout=30, what="the formula jobs' decisions")
    decided_s = time.monotonic() - started
    during = get(api_client, namespace, "traced")
    estimated = condition(during, "Estimated")
    assert estimated is not None, "the trace job says nothing while traced"
    assert (estimated["status"], estimated["reason"]) == ("False", "Tracing"), (
        f"the trace ended before the formula jobs were decided ({decided_s:.1f} s)"
    )
    assert TRACING.fullmatch(estimated["message"]), estimated["message"]
    admitted = condition(during, "Admitted")
    assert admitted is not None and (admitted["status"], admitted["reason"]) == (
        "Unknown", "Tracing",
    )  # fmt: skip

    # Then the trace job is estimated and decided.
    done = expect_condition(api_client, namespace, "traced", "Admitted", "False", "NoTemplate",
                            timeout=TRACE_DEADLINE_S)  # fmt: skip
    traced_s = time.monotonic() - started
    estimate = done["status"]["estimate"]
    assert condition(done, "Estimated")["reason"] == "Estimated"  # type: ignore[index]
    assert estimate["profile"] == "trace" and estimate["gpus"] == 2
    assert re.fullmatch(r"[0-9a-f]{64}", estimate["digest"])
    assert json.loads(estimate["traced"])["profile"] == "trace"
    assert estimates(operator, "computed") == 1
    tracing_events = wait_until(
        lambda: [e for e in events_for(api_client, namespace, "traced") if e.reason == "Tracing"],
        timeout=10, what="the Tracing event",
    )  # fmt: skip
    assert [e.type for e in tracing_events] == ["Normal"]

    # A restarted operator reads the trace back from status: no trace, nothing written.
    operator.stop()
    operator.start(webhook=False)
    wait_until(lambda: estimates(operator, "status") == 1, timeout=30,
               what="the traced estimate read back from status")  # fmt: skip
    operator.await_passes(2)
    assert estimates(operator, "computed") == 0, "traced again after the restart"
    assert "traced estimate reused from status" in operator.log_since_start()
    after = get(api_client, namespace, "traced")
    assert after["status"] == done["status"]
    assert after["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"]
    print(
        f"\nformula jobs decided {decided_s:.1f} s after the trace job's apply; trace job "
        f"decided after {traced_s:.1f} s; test {time.monotonic() - started:.1f} s"
    )
