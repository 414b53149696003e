"""The admission webhooks' cluster checks, against a view of plain data (no API server)."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonpatch
import kopf
import pytest

from controller.admission.cluster import ClusterObjects, snapshot
from controller.api.base import REQUESTED_GPUS_ANNOTATION
from controller.base.units import GIB
from controller.packing.inventory import GpuDevice, NodeState, PackingSettings, Snapshot, Taint
from controller.packing.view import ClusterView
from controller.webhook.admission import AdmissionWebhook
from tests.unit.builders.webhook import FULL, admitted, body, cluster, hook


def validate(webhook: AdmissionWebhook, obj: dict[str, Any], old: Any = None) -> None:
    operation = "UPDATE" if old is not None else "CREATE"
    asyncio.run(webhook.validate(body=obj, spec=obj["spec"], old=old, operation=operation))


def mutate(
    webhook: AdmissionWebhook, obj: dict[str, Any], old: Any = None
) -> tuple[kopf.Patch, list[str]]:
    patch, warnings = kopf.Patch(), []
    operation = "UPDATE" if old is not None else "CREATE"
    asyncio.run(webhook.mutate(
        body=obj, spec=obj["spec"], patch=patch, warnings=warnings, old=old, operation=operation
    ))  # fmt: skip
    return patch, warnings


def applied(obj: dict[str, Any], patch: kopf.Patch) -> dict[str, Any]:
    """`obj` as the API server stores it after the mutating webhook's patch."""
    return jsonpatch.apply_patch(obj, patch.as_json_patch(obj))


def test_a_job_that_never_fits_the_empty_cluster_is_refused_with_the_numbers() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(hook(cluster()), body(**FULL))
    message = str(refused.value)
    assert "InsufficientVRAM" in message
    assert "needs 2 GPUs with FSDP (45.49 GiB each); requested 1; policy Enforce" in message
    with pytest.raises(kopf.AdmissionError) as refused:
        validate(hook(cluster(gpus=1)), body(**FULL, resources={"gpus": 1, "maxGPUs": 1}))
    assert "needs 86.09 GiB per GPU on 1 GPU" in str(refused.value)


def test_a_job_that_fits_when_empty_passes_even_if_the_cluster_is_full_now() -> None:
    validate(hook(cluster()), body(**FULL, resources={"gpus": 2}))
    validate(hook(cluster()), body())


def test_nothing_is_refused_before_the_operator_has_seen_a_gpu() -> None:
    validate(hook(None), body(**FULL))
    validate(hook(cluster(nodes=0)), body(**FULL))


def test_whether_a_job_waits_for_nodes_is_left_to_the_operator() -> None:
    """The webhook refuses only what never fits: it does not build the view of the cluster
    as if every node took work (a second index of every GPU) on its request path."""
    cordoned = NodeState(
        "n1", tuple(GpuDevice(f"GPU-1-{i}", i, "H100", 80 * GIB, 80 * GIB) for i in range(4)),
        cordoned=True,
    )  # fmt: skip
    view = cluster()
    view = ClusterView(Snapshot((*view._snapshot.nodes, cordoned), (), None), PackingSettings())
    validate(hook(view), body(**FULL, resources={"gpus": 8}))
    assert "resting" not in view.__dict__


def test_a_gpu_node_whose_gpunode_is_gone_still_counts_so_a_job_that_fits_passes() -> None:
    """n1's GPUNode was deleted (its agent makes it again in a moment): 8 GPUs asked for,
    with n0's 4 reported and n1's 4 in its Node, pass; more than both have is refused."""
    objects = ClusterObjects()
    for name in ("n0", "n1"):
        objects.add(
            {
                "kind": "Node",
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
                "status": {"capacity": {"nvidia.com/gpu": "4"}},
            },
            name,
        )
    gpus = [
        {"uuid": f"GPU-0-{i}", "index": i, "totalBytes": 80 * GIB, "freeBytes": 80 * GIB}
        for i in range(4)
    ]
    objects.add({"kind": "GPUNode", "metadata": {"name": "n0"}, "status": {"gpus": gpus}}, "g")
    view = ClusterView(snapshot(objects, None), PackingSettings())
    validate(hook(view), body(**FULL, resources={"gpus": 8}))
    with pytest.raises(kopf.AdmissionError, match="InsufficientGPUs: requests 9 GPUs; the "
                       "cluster has 8 matching GPUs"):  # fmt: skip
        validate(hook(view), body(**FULL, resources={"gpus": 9}))


def test_models_it_cannot_estimate_in_microseconds_pass_to_the_operator() -> None:
    # A Trace estimate takes seconds: never on the webhook's path (this would be refused).
    validate(hook(cluster()), body(**FULL, estimator={"profile": "Trace"}))
    spec = {**FULL, "model": {"configMapRef": {"name": "c"}}}
    validate(hook(cluster()), {"metadata": {"name": "j"}, "spec": spec})


def test_an_admitted_jobs_spec_is_locked_but_suspend_may_change() -> None:
    old = admitted(body())
    with pytest.raises(kopf.AdmissionError, match=r"only spec\.suspend may change"):
        validate(hook(cluster()), body(training={"sequenceLength": 4096}), old=old)
    validate(hook(cluster()), body(suspend=True), old=old)


def test_a_finished_jobs_spec_may_not_change_and_the_refusal_says_how_to_run_it_again() -> None:
    """A failed job's message suggests another batch or more GPUs: an edit of the finished
    job was accepted and ignored (nothing runs a finished job again)."""
    old = admitted(body())
    old["status"]["conditions"].append(
        {"type": "Failed", "status": "True", "reason": "GPUOutOfMemory"}
    )
    with pytest.raises(kopf.AdmissionError, match="delete it and apply it again"):
        validate(hook(cluster()), body(training={"sequenceLength": 1024}), old=old)
    # Not even suspend: the operator would say the change is ignored, as it is.
    with pytest.raises(kopf.AdmissionError, match="a finished job is final"):
        validate(hook(cluster()), body(suspend=True), old=old)
    validate(hook(cluster()), body(), old=old)  # metadata writes: the spec as it was


def test_an_admitted_job_stored_before_a_rule_can_still_be_suspended() -> None:
    """gpus below minGPUs was accepted before the bounds rule: suspend must still work, since
    the spec lock forbids fixing the spec first."""
    stored = {"resources": {"gpus": 1, "minGPUs": 2}}
    old = admitted(body(**stored))
    validate(hook(cluster()), body(**stored, suspend=True), old=old)
    with pytest.raises(kopf.AdmissionError, match="minGPUs"):
        validate(hook(cluster()), body(**stored))


def test_a_template_the_workload_cannot_be_built_from_is_refused_at_apply() -> None:
    """The operator records it InvalidSpec before admission: say so at `kubectl apply`."""
    pinned = {"spec": {"nodeName": "n0", "containers": [{"name": "t", "image": "t:v1"}]}}
    with pytest.raises(kopf.AdmissionError, match=r"spec\.template\.spec\.nodeName: must not"):
        validate(hook(cluster()), body(template=pinned))
    with pytest.raises(kopf.AdmissionError, match="at least one container"):
        validate(hook(cluster()), body(template={"spec": {"containers": []}}))
    validate(hook(cluster()), body(template={"spec": {"containers": [{"name": "t"}]}}))
    validate(hook(None), body(template=pinned))  # no view yet: the operator decides
    # An empty template is NoTemplate to the operator (advice only): not refused here either.
    validate(hook(cluster()), body(template={}))
    with pytest.raises(kopf.AdmissionError, match=r"^spec\.template"):
        validate(hook(cluster()), body(template={"spec": {"containers": [
            {"name": "t", "resources": "x"}]}}))  # fmt: skip


def test_resize_rewrites_a_count_that_never_fits_to_the_nearest_that_does() -> None:
    patch, warnings = mutate(hook(cluster()), body(**FULL, admissionPolicy="Resize"))
    assert patch["spec"]["resources"]["gpus"] == 2
    assert warnings == [
        "vramgate: needs 2 GPUs with FSDP (45.49 GiB each): spec.resources.gpus 1 -> 2"
    ]


SMALL = {"model": {"preset": "llama-3.2-1b"}, "method": "QLoRA", "lora": {"rank": 16}}


def test_resize_down_says_the_count_asked_for_can_never_fit_not_that_the_job_needs_less() -> None:
    """20 GPUs asked of a cluster of 8: 8 is the most that can fit, not what the job needs
    (one GPU holds it)."""
    asked = body(**SMALL, admissionPolicy="Resize", resources={"gpus": 20, "minGPUs": 1})
    patch, warnings = mutate(hook(cluster(nodes=2)), asked)
    assert patch["spec"]["resources"]["gpus"] == 8
    (warning,) = warnings
    assert warning.startswith(
        "vramgate: 20 GPUs can never fit this cluster, which has 8; the most that can is 8 ("
    ), warning
    assert warning.endswith(" GiB each with FSDP): spec.resources.gpus 20 -> 8")
    assert "needs" not in warning


def test_resize_down_names_the_template_that_narrows_the_cluster() -> None:
    """Two 4-GPU nodes, one in the pool the pod template selects: 4 is the most its pods
    can use, though the cluster has 8. A taint, which may be lifted, narrows nothing here."""

    def node(name: str, **kw: Any) -> NodeState:
        gpus = tuple(GpuDevice(f"{name}-{i}", i, "H100", 80 * GIB, 80 * GIB) for i in range(4))
        return NodeState(name, gpus, gpu_allocatable=4, **kw)

    maintenance = Taint("maintenance", "true", "NoSchedule")
    nodes = (node("a", labels={"pool": "x"}), node("b", taints=(maintenance,)))
    view = ClusterView(Snapshot(nodes, (), None), PackingSettings())
    template = {"spec": {"nodeSelector": {"pool": "x"}, "containers": [{"name": "t"}]}}
    asked = body(**SMALL, admissionPolicy="Resize", template=template,
                 resources={"gpus": 6, "minGPUs": 1})  # fmt: skip
    patch, warnings = mutate(hook(view), asked)
    assert patch["spec"]["resources"]["gpus"] == 4
    assert warnings[0].startswith(
        "vramgate: 6 GPUs can never fit this cluster, which has 4 that match its pod "
        "template's nodeSelector {pool=x}; the most that can is 4"
    ), warnings[0]
    untemplated = body(**SMALL, admissionPolicy="Resize", resources={"gpus": 8, "minGPUs": 1})
    patch, warnings = mutate(hook(view), untemplated)
    assert not patch and not warnings, "8 GPUs exist once the taint is lifted"


def test_resize_down_names_the_placement_the_parallelism_cannot_have() -> None:
    """Two nodes of 4 GPUs: a device map of 6 would need one node of 6; FSDP on 7 of 9 GPUs
    (3 nodes of 3) would need 7 nodes of 1. The nearest count that fits is below."""
    device_map = body(admissionPolicy="Resize", parallelism="DeviceMap", resources={"gpus": 6})
    patch, warnings = mutate(hook(cluster(nodes=2)), device_map)
    assert patch["spec"]["resources"]["gpus"] == 4
    assert warnings[0].startswith(
        "vramgate: 6 GPUs can never fit this cluster: a device map keeps a job on one node, and "
        "its nodes have at most 4 GPUs each; the nearest count that can is 4 ("
    ), warnings
    assert warnings[0].endswith(" each with DeviceMap): spec.resources.gpus 6 -> 4")

    fsdp = body(admissionPolicy="Resize", resources={"gpus": 7})
    patch, warnings = mutate(hook(cluster(nodes=3, gpus=3)), fsdp)
    assert patch["spec"]["resources"]["gpus"] == 6
    assert warnings[0].startswith(
        "vramgate: 7 GPUs can never fit this cluster: FSDP runs them as k nodes x g GPUs, the "
        "same g on every node, and no k of its nodes have g GPUs each with k x g = 7; the "
        "nearest count that can is 6 ("
    ), warnings


def test_resize_down_for_memory_says_how_much_each_gpu_asked_for_would_need() -> None:
    """4 GPUs of 80 GiB and 4 of 10: full llama-3.1-8b on all 8 needs more than 10 GiB each,
    on the 4 large ones it fits."""
    mixed = ClusterView(Snapshot(tuple(
        NodeState(name, tuple(GpuDevice(f"GPU-{name}-{i}", i, "H100", gib * GIB, gib * GIB)
                              for i in range(4)), gpu_allocatable=4)
        for name, gib in (("big", 80), ("small", 10))
    ), (), None), PackingSettings())  # fmt: skip
    patch, warnings = mutate(hook(mixed), body(**FULL, admissionPolicy="Resize",
                                               resources={"gpus": 8}))  # fmt: skip
    assert patch["spec"]["resources"]["gpus"] == 4
    (warning,) = warnings
    assert warning.startswith("vramgate: 8 GPUs can never fit this cluster: with FSDP each "), (
        warning
    )
    assert (
        "and no 8 of its GPUs that FSDP can use together hold that, even when they are idle; "
        "the nearest count that can is 4 (" in warning
    )


def test_resize_remembers_the_count_asked_for_in_an_annotation() -> None:
    manifest = body(**FULL, admissionPolicy="Resize")
    stored = applied(manifest, mutate(hook(cluster()), manifest)[0])
    assert stored["spec"]["resources"]["gpus"] == 2
    assert stored["metadata"]["annotations"] == {REQUESTED_GPUS_ANNOTATION: "1"}
    fits = body(admissionPolicy="Resize")
    fits["metadata"]["annotations"] = {REQUESTED_GPUS_ANNOTATION: "1", "team": "a"}
    forgot = applied(fits, mutate(hook(cluster()), fits)[0])
    assert forgot["metadata"]["annotations"] == {"team": "a"}, (
        "copied from another job: a count that fits as asked has nothing to remember"
    )


def test_the_manifest_applied_again_keeps_the_count_given_at_create_whatever_the_cluster() -> None:
    """The cluster changed since the create: on 2 x 160 GiB the job would now fit as asked (1
    GPU), on 80 GiB GPUs still 2. Either way the stored count comes back, and the admitted
    job's locked spec is unchanged."""
    manifest = body(**FULL, admissionPolicy="Resize")
    stored = admitted(applied(manifest, mutate(hook(cluster()), manifest)[0]))
    for now in (cluster(gib=160), cluster(), cluster(nodes=2, gpus=8, gib=40)):
        # kubectl apply: the manifest's count (the annotation is the old object's that counts)
        sent = {**manifest, "metadata": {**stored["metadata"], "annotations": {}}}
        patch, warnings = mutate(hook(now), sent, old=stored)
        again = applied(sent, patch)
        assert again["spec"]["resources"]["gpus"] == 2
        assert again["metadata"]["annotations"] == {REQUESTED_GPUS_ANNOTATION: "1"}
        assert warnings == [
            "vramgate: spec.resources.gpus 1 -> 2, as resized when the job was created "
            f"(annotation {REQUESTED_GPUS_ANNOTATION})"
        ]
        validate(hook(now), again, stored)


def test_another_count_or_another_spec_is_resized_afresh() -> None:
    manifest = body(**FULL, admissionPolicy="Resize")
    stored = applied(manifest, mutate(hook(cluster()), manifest)[0])  # waiting, not admitted
    three = {**stored, "spec": {**stored["spec"], "resources": {"gpus": 3}}}
    again = applied(three, mutate(hook(cluster()), three, old=stored)[0])
    assert again["spec"]["resources"]["gpus"] == 3, "3 fits as asked"
    assert REQUESTED_GPUS_ANNOTATION not in (again["metadata"].get("annotations") or {})

    # The same count asked for, with a smaller model: 1 GPU fits now, so it stays 1.
    smaller = {**stored, "spec": {**stored["spec"], "resources": {"gpus": 1},
                                  "model": {"preset": "llama-3.2-1b"}}}  # fmt: skip
    patch, _ = mutate(hook(cluster()), smaller, old=stored)
    assert applied(smaller, patch)["spec"]["resources"]["gpus"] == 1


def test_only_a_locked_resize_job_keeps_its_annotated_count() -> None:
    """A waiting job is not locked: the manifest applied again is resized afresh (1 GPU fits
    now). A hand-set annotation on an Enforce job rewrites nothing."""
    manifest = body(**FULL, admissionPolicy="Resize", resources={"gpus": 1})
    waiting = applied(manifest, mutate(hook(cluster()), manifest)[0])
    patch, _ = mutate(hook(cluster(gib=160)), manifest, old=waiting)
    assert applied(manifest, patch)["spec"]["resources"]["gpus"] == 1

    enforce = admitted(body(resources={"gpus": 2}))
    enforce["metadata"]["annotations"] = {REQUESTED_GPUS_ANNOTATION: "3"}
    asks = body(resources={"gpus": 3})
    assert mutate(hook(cluster()), asks, old=enforce) == ({}, [])


def test_an_annotated_count_is_forgotten_when_the_rest_of_the_spec_changes() -> None:
    manifest = body(**FULL, admissionPolicy="Resize")
    stored = applied(manifest, mutate(hook(cluster()), manifest)[0])
    edited = {**stored, "spec": {**stored["spec"], "training": {"sequenceLength": 1024}}}
    after = applied(edited, mutate(hook(cluster()), edited, old=stored)[0])
    assert REQUESTED_GPUS_ANNOTATION not in (after["metadata"].get("annotations") or {})
    relabelled = {**stored, "metadata": {**stored["metadata"], "labels": {"a": "b"}}}
    assert mutate(hook(cluster()), relabelled, old=stored) == ({}, []), "the spec as it was"


def test_the_manifest_resized_at_create_can_be_applied_again() -> None:
    """`kubectl apply` of the same manifest sends the count it asks for (1); the stored job
    holds the webhook's (2). The UPDATE's count is rewritten as at create, so the locked spec
    of the admitted job is unchanged and the validation lets it through."""
    manifest = body(**FULL, admissionPolicy="Resize")
    stored = admitted(body(**FULL, admissionPolicy="Resize", resources={"gpus": 2}))
    patch, warnings = mutate(hook(cluster()), manifest, old=stored)
    assert patch["spec"]["resources"]["gpus"] == 2 and warnings
    validate(hook(cluster()), {**manifest, "spec": {**manifest["spec"], **patch["spec"]}}, stored)
    # An UPDATE that leaves the count alone is not looked at (a label, a suspend).
    assert mutate(hook(cluster()), body(**FULL, admissionPolicy="Resize"), old=body(
        **FULL, admissionPolicy="Resize")) == ({}, [])  # fmt: skip


def test_suspending_a_job_the_cluster_no_longer_fits_is_allowed() -> None:
    """The cluster shrank after the create: the job cannot fit any more, but suspending it (or
    resuming it) is no new request to refuse; any other change is judged as before."""
    waiting = body(resources={"gpus": 8})
    small = hook(cluster(gpus=4))
    validate(small, body(resources={"gpus": 8}, suspend=True), old=waiting)
    with pytest.raises(kopf.AdmissionError, match="InsufficientGPUs"):
        validate(small, body(resources={"gpus": 8}, training={"sequenceLength": 1024}), waiting)


def test_resize_leaves_a_count_that_fits_and_other_policies_alone() -> None:
    assert mutate(hook(cluster()), body(admissionPolicy="Resize")) == ({}, [])
    assert mutate(hook(cluster()), body(**FULL)) == ({}, [])  # Enforce: refused, not rewritten
    assert mutate(hook(None), body(**FULL, admissionPolicy="Resize")) == ({}, [])


def test_a_raw_priority_outside_the_allowed_namespaces_is_allowed_with_a_warning() -> None:
    """The manifest stays valid everywhere; its author learns at apply that the number
    ranks nothing in this namespace."""

    def warned(webhook: AdmissionWebhook, obj: dict[str, Any], old: Any = None) -> list[str]:
        said: list[str] = []
        operation = "UPDATE" if old is not None else "CREATE"
        asyncio.run(webhook.validate(
            body=obj, spec=obj["spec"], old=old, operation=operation, warnings=said
        ))  # fmt: skip
        return said

    async def current() -> ClusterView | None:
        return cluster()

    allowing = AdmissionWebhook(current, raw_priority_namespaces=frozenset({"platform"}))
    assert warned(allowing, body(priority=1_000_000_000)) == [
        "vramgate: spec.priority 1000000000 is ignored: only the namespaces an administrator "
        "lists in the operator's rawPriorityNamespaces may set a raw priority, and ns is not "
        "one; name a PriorityClass in spec.priorityClassName"
    ]
    platform = body(priority=5)
    platform["metadata"]["namespace"] = "platform"
    assert warned(allowing, platform) == []
    assert warned(allowing, body()) == [] and warned(allowing, body(priority=0)) == []
    # Said when the write sets it, not at every later update of the job.
    stored = body(priority=7)
    assert warned(allowing, body(priority=7, suspend=True), old=stored) == []
    assert warned(allowing, body(priority=8), old=stored) != []
