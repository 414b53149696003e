"""The scenarios: what `kubectl apply` of a FineTuneJob ends in, on the layout's GPUs.

Each one takes a `Target`, runs in a namespace of its own and raises `ScenarioFailed` with
what it saw when the cluster does something else. Trainers only sleep: a container that
runs `sleep N` on a real node (kind), and kwok's pod-completion delay annotation on a
simulated one (the local control plane), so the same manifest runs N seconds on either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import yaml

from controller.api.base import GPU_RESOURCE, PRODUCT_LABEL
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.suite.target import Target, condition, expect

API_VERSION = "vramgate.dev/v1alpha1"
QLORA = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
FULL = {"model": {"preset": "llama-3.1-8b"}, "method": "Full", "parallelism": "FSDP"}
#: A full fine-tune no 80 GB GPU of the layout ever holds on one GPU.
HUGE = {"model": {"preset": "qwen2.5-72b"}, "method": "Full"}


def finetunejob(
    target: Target,
    name: str,
    model: Mapping[str, Any],
    *,
    gpus: int,
    run_s: int = 600,
    resources: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A FineTuneJob on the layout's GPUs whose trainer runs `run_s` seconds."""
    template = {
        "metadata": {"annotations": {RUN_FOR_ANNOTATION: f"{run_s}s"}},
        "spec": {"containers": [{
            "name": "trainer", "image": "busybox:1.36",
            # exec: sleep is PID 1 then, which a pod's deletion stops at once (a shell would
            # ignore SIGTERM and hold the namespace's deletion for the 30 s grace period)
            "command": ["sh", "-c", f"echo training; exec sleep {run_s}"],
        }]},
    }  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            **model,
            **spec,
            "resources": {
                "gpus": gpus,
                "gpuSelector": {PRODUCT_LABEL: target.product},
                **(resources or {}),
            },
            "template": template,
        },
    }


def _applied(target: Target, namespace: str, manifest: Mapping[str, Any]) -> str:
    """Apply, expecting the API server to accept it; kubectl's stderr (warnings) returned."""
    done = target.apply(namespace, manifest)
    name = manifest["metadata"]["name"]
    expect(done.returncode == 0, f"kubectl apply of {name} failed: {done.stderr.strip()}")
    return done.stderr


def _decided(target: Target, namespace: str, name: str) -> dict[str, Any]:
    return target.wait(lambda: target.admitted(namespace, name), f"a decision on {name}")


def _admitted_as(job: Mapping[str, Any], reasons: set[str]) -> Mapping[str, Any]:
    found = condition(job, "Admitted") or {}
    name = job["metadata"]["name"]
    expect(
        found.get("status") == "True" and found.get("reason") in reasons,
        f"{name}: expected Admitted=True ({' or '.join(sorted(reasons))}), got "
        f"{found.get('status')} {found.get('reason')}: {found.get('message')}",
    )
    return dict(job["status"]["placement"])


def _where(placement: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
    return [(n["node"], list(n["gpuIndices"])) for n in placement["nodes"]]


def _condition_is(target: Target, namespace: str, name: str, kind: str) -> Callable[[], bool]:
    def check() -> bool:
        found = condition(target.get("finetunejob", name, namespace), kind)
        return found is not None and found["status"] == "True"

    return check


def _trainer(workload: Mapping[str, Any]) -> Mapping[str, Any]:
    return dict(workload["spec"]["template"]["spec"]["containers"][0])


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def admits_onto_the_tightest_gpu_that_holds_it(target: Target) -> None:
    """A small job goes to the first node (the nodes tie; best fit by name), GPU 1, the one
    GPU its device plugin may hand out (a pod holds GPU 0); its batch Job asks for one GPU on
    that node, tells the trainer what it got, runs, and goes when the FineTuneJob is
    deleted."""
    with target.namespace("best-fit") as namespace:
        _applied(target, namespace, finetunejob(target, "small", QLORA, gpus=1))
        placement = _admitted_as(_decided(target, namespace, "small"), {"Fits"})
        expect(_where(placement) == [(target.nodes[0], [1])],
               f"small: expected {target.nodes[0]} GPU 1, got {_where(placement)}")  # fmt: skip
        workload = target.wait(lambda: target.get("job", "small", namespace), "small's Job")
        owner = workload["metadata"]["ownerReferences"][0]
        expect((owner["kind"], owner["name"]) == ("FineTuneJob", "small"),
               f"small's Job is owned by {owner['kind']} {owner['name']}")  # fmt: skip
        trainer = _trainer(workload)
        gpus = trainer["resources"]["limits"].get(GPU_RESOURCE)
        expect(gpus == "1", f"small's trainer asks for {GPU_RESOURCE}: {gpus}, not 1")
        env = _env(trainer)
        expect(env.get("VRAMGATE_GPUS") == "1"
               and env.get("VRAMGATE_PER_GPU_BYTES") == str(placement["perGpuBytes"]),
               f"small's trainer env: {env}")  # fmt: skip
        affinity = str(workload["spec"]["template"]["spec"].get("affinity"))
        expect(target.nodes[0] in affinity and target.nodes[1] not in affinity,
               f"small's pod is not pinned to {target.nodes[0]} alone: {affinity}")  # fmt: skip
        target.wait(_condition_is(target, namespace, "small", "Running"), "small Running=True")
        target.kubectl("delete", "finetunejob", "small", "-n", namespace)
        target.wait(lambda: target.get("job", "small", namespace) is None,
                    "small's Job to go with it")  # fmt: skip


def refuses_at_apply_what_never_fits(target: Target) -> None:
    """The validating webhook, reached through the chart's Service with the CA the operator
    injected, refuses at `kubectl apply` a job no GPU holds and one no GPU matches, with
    the numbers; nothing is created."""
    with target.namespace("refused") as namespace:
        huge = finetunejob(target, "huge", HUGE, gpus=1)
        nowhere = finetunejob(target, "nowhere", QLORA, gpus=1)
        nowhere["spec"]["resources"]["gpuSelector"] = {PRODUCT_LABEL: "NO-SUCH-GPU"}
        # the refusal's reason, and for huge its numbers
        for manifest, reason, words in ((huge, "InsufficientVRAM", "GiB per GPU"),
                                         (nowhere, "NoMatchingGPU", None)):  # fmt: skip
            name = manifest["metadata"]["name"]
            done = target.apply(namespace, manifest)
            expect(done.returncode != 0 and "denied the request" in done.stderr
                   and f"vramgate: {reason}:" in done.stderr,
                   f"{name}: expected the webhook to refuse it with {reason}, got exit "
                   f"{done.returncode}: {done.stderr.strip() or done.stdout.strip()}")  # fmt: skip
            if words is not None:
                expect(words in done.stderr, f"the refusal of {name} gives no numbers")
            expect(target.get("finetunejob", name, namespace) is None, f"{name} was created")


def resizes_at_apply_and_spreads_fsdp_across_nodes(target: Target) -> None:
    """A full fine-tune asking for 1 GPU with policy Resize is rewritten to 2 at apply, with
    a warning kubectl prints; no node has two GPUs that hold 45.5 GiB, so it runs as an
    Indexed Job of one pod per node with a headless Service and torchrun's rendezvous."""
    with target.namespace("resize") as namespace:
        manifest = finetunejob(target, "full", FULL, gpus=1, run_s=5,
                               resources={"maxGPUs": 4}, admissionPolicy="Resize")  # fmt: skip
        warnings = _applied(target, namespace, manifest)
        expect("spec.resources.gpus 1 -> 2" in warnings,
               f"full: no resize warning at apply; kubectl said: {warnings.strip()}")  # fmt: skip
        job = _decided(target, namespace, "full")
        gpus = job["spec"]["resources"]["gpus"]
        expect(gpus == 2, f"full: spec.resources.gpus is {gpus}, not 2")
        placement = _admitted_as(job, {"Fits", "Resized"})
        expected = [(target.nodes[0], [1]), (target.nodes[1], [1])]
        expect(_where(placement) == expected and placement["admittedGPUs"] == 2,
               f"full: expected {expected}, got {_where(placement)}")  # fmt: skip
        workload = target.wait(lambda: target.get("job", "full", namespace), "full's Job")
        spec = workload["spec"]
        expect((spec.get("completionMode"), spec.get("completions"), spec.get("parallelism"))
               == ("Indexed", 2, 2), f"full's Job is not Indexed over 2 pods: {spec}")  # fmt: skip
        service = target.get("service", "full", namespace)
        expect(service is not None and service["spec"].get("clusterIP") == "None",
               "full has no headless Service")  # fmt: skip
        env = _env(_trainer(workload))
        expect(env.get("NNODES") == "2" and env.get("NPROC_PER_NODE") == "1"
               and env.get("MASTER_ADDR") == "full-0.full",
               f"full's torchrun env: {env}")  # fmt: skip
        target.wait(_condition_is(target, namespace, "full", "Succeeded"),
                    "full's two pods to finish: Succeeded=True", timeout=180)  # fmt: skip


def queues_until_a_job_finishes_then_admits_it(target: Target) -> None:
    """A second full fine-tune waits (WaitingForVRAM: it fits the empty cluster, not now)
    while the first holds the free GPUs, and is admitted by itself once the first's
    workload finishes, without anyone touching it."""
    with target.namespace("queue") as namespace:
        # 60 s: long enough that second is applied and decided while first runs
        _applied(target, namespace, finetunejob(target, "first", FULL, gpus=2, run_s=60))
        _admitted_as(_decided(target, namespace, "first"), {"Fits"})
        _applied(target, namespace, finetunejob(target, "second", FULL, gpus=2, run_s=5))
        queued = condition(_decided(target, namespace, "second"), "Admitted") or {}
        expect((queued.get("status"), queued.get("reason")) == ("False", "WaitingForVRAM"),
               f"second: expected queued (WaitingForVRAM), got {queued}")  # fmt: skip
        expect("waits for memory" in str(queued.get("message")),
               f"second's message does not say it waits: {queued.get('message')}")  # fmt: skip
        target.wait(_condition_is(target, namespace, "second", "Admitted"),
                    "second to be admitted once first finishes", timeout=180)  # fmt: skip
        expect(_condition_is(target, namespace, "first", "Succeeded")(),
               "second was admitted before first finished")  # fmt: skip


def a_cordoned_node_gets_nothing(target: Target) -> None:
    """With the first node cordoned, the small job that would go there goes to the second."""
    target.kubectl("cordon", target.nodes[0])
    try:
        with target.namespace("cordon") as namespace:
            _wait_until_the_operator_sees(target, namespace, f"placed on {target.nodes[1]} GPU 1")
            _applied(target, namespace, finetunejob(target, "small", QLORA, gpus=1))
            placement = _admitted_as(_decided(target, namespace, "small"), {"Fits"})
            expect(_where(placement) == [(target.nodes[1], [1])],
                   f"small: expected {target.nodes[1]} GPU 1, got {_where(placement)}")  # fmt: skip
    finally:
        target.kubectl("uncordon", target.nodes[0])


def _wait_until_the_operator_sees(target: Target, namespace: str, placement: str) -> None:
    """Until a job without a trainer template, which admission only tells what it would
    decide, is told `placement`: the operator's view has the change (a cordon) then, and
    decides every later job with it. (A watch event on Nodes and one on FineTuneJobs may
    reach the operator in either order; the webhook judges the empty cluster and cannot
    tell.) Its message is rewritten at most every 30 s, hence the longer wait."""
    probe = finetunejob(target, "probe", QLORA, gpus=1)
    del probe["spec"]["template"]
    _applied(target, namespace, probe)

    def told() -> bool:
        found = condition(target.get("finetunejob", "probe", namespace), "Admitted") or {}
        return found.get("reason") == "NoTemplate" and placement in str(found.get("message"))

    target.wait(told, f"the operator to tell a probe job it would be {placement}", timeout=120)


def wait_for_the_webhook(target: Target) -> None:
    """Before the scenarios: until the webhook answers (through its Service) and judges the
    layout's GPUs, which it does once the operator has seen their GPUNodes: a server-side
    dry run of a job no GPU of the product holds is refused with InsufficientVRAM."""
    huge = finetunejob(target, "probe", HUGE, gpus=1)

    def judged() -> bool:
        done = target.kubectl("apply", "--dry-run=server", "-n", "default", "-f", "-",
                              stdin=yaml.safe_dump(huge), check=False)  # fmt: skip
        return "vramgate: InsufficientVRAM" in done.stderr

    target.wait(judged, "the webhook to judge the layout's GPUs")


#: In the order they run: each leaves the layout empty for the next.
SCENARIOS: tuple[Callable[[Target], None], ...] = (
    admits_onto_the_tightest_gpu_that_holds_it,
    refuses_at_apply_what_never_fits,
    resizes_at_apply_and_spreads_fsdp_across_nodes,
    queues_until_a_job_finishes_then_admits_it,
    a_cordoned_node_gets_nothing,
)
