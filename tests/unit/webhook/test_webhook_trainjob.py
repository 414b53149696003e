"""The TrainJob webhook (`trainJobSizing`): the review server's answer, the configuration a
managed operator registers for it, and kopf's patch; the sizing itself is
tests/unit/admission/test_trainjob.py's."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
import yaml
from aiohttp import web

from controller.admission.kueue import SPEC_ANNOTATION
from controller.admission.trainer_runtime import RuntimeRef
from controller.admission.trainjob import POLICY_ANNOTATION
from controller.api.base import REQUESTED_GPUS_ANNOTATION
from controller.packing.inventory import PackingSettings
from controller.packing.view import ClusterView
from controller.webhook.registration import (
    MATCH_CONDITIONS,
    MUTATE_HANDLER,
    MUTATE_TRAINJOB_HANDLER,
    VALIDATE_HANDLER,
    configurations,
)
from controller.webhook.server import answer
from controller.webhook.trainjob import TRAINJOB, TrainJobWebhook
from tests.unit.builders.packing import node, view
from tests.unit.builders.webhook import cluster, hook

RESOURCE = {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": "trainjobs"}
FULL = "model: {preset: llama-3.1-8b}\nmethod: Full\n"
GPU = "nvidia.com/gpu"
DATA = Path(__file__).parents[1] / "admission" / "data"


def trainjob(per_node: int = 8, spec: str = FULL, policy: str = "Resize") -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama", "namespace": "ml",
                     "annotations": {SPEC_ANNOTATION: spec, POLICY_ANNOTATION: policy}},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"numNodes": 1, "resourcesPerNode": {"limits": {GPU: per_node}}}},
    }  # fmt: skip


def review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "resource": RESOURCE, "operation": operation,
                        "object": obj}}  # fmt: skip


def sizer(view: ClusterView | None, seen: list[tuple[str, str]] | None = None) -> TrainJobWebhook:
    async def current() -> ClusterView | None:
        return view

    said = seen if seen is not None else []
    return TrainJobWebhook(current, lambda w, r, _: said.append((w, r)))


def ask(request: dict[str, Any], trainjobs: TrainJobWebhook | None) -> Any:
    return asyncio.run(answer(hook(cluster()), MUTATE_TRAINJOB_HANDLER, request, trainjobs))


def test_more_gpus_than_a_node_has_are_answered_with_a_patch_and_a_warning() -> None:
    seen: list[tuple[str, str]] = []
    obj = trainjob()  # cluster(): one node of 4 x 80 GiB
    response = ask(review(obj), sizer(cluster(), seen))["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    stored = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    assert stored["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 4}}
    assert stored["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "8"
    (warning,) = response["warnings"]
    assert warning.startswith("vramgate: resized 8 -> 4 GPUs (policy Resize): 8 GPUs can never")
    assert seen == [(TRAINJOB, "allowed")]


def test_a_refusal_is_422_with_the_field_and_counted_as_denied() -> None:
    seen: list[tuple[str, str]] = []
    response = ask(review(trainjob(spec="method: Partial")), sizer(cluster(), seen))["response"]
    assert response["allowed"] is False and response["status"]["code"] == 422
    assert f"metadata.annotations[{SPEC_ANNOTATION}].method" in response["status"]["message"]
    assert seen == [(TRAINJOB, "denied")]


def test_only_a_create_is_sized() -> None:
    """Its trainer is immutable: an update is none of the webhook's business."""
    assert ask(review(trainjob(), "UPDATE"), sizer(cluster()))["response"] == {
        "uid": "u-1", "allowed": True
    }  # fmt: skip


def test_without_trainjob_sizing_a_trainjob_review_is_not_ours() -> None:
    with pytest.raises(web.HTTPNotFound):
        ask(review(trainjob()), None)
    for webhook in (VALIDATE_HANDLER, MUTATE_HANDLER):  # FineTuneJobs' paths: not a TrainJob's
        with pytest.raises(web.HTTPNotFound):
            asyncio.run(answer(hook(cluster()), webhook, review(trainjob()), sizer(cluster())))


def test_a_failing_sizing_is_an_http_error_so_the_failure_policy_decides() -> None:
    async def broken() -> ClusterView | None:
        raise RuntimeError("no view")

    seen: list[str] = []
    with pytest.raises(web.HTTPInternalServerError):
        ask(review(trainjob()), TrainJobWebhook(broken, lambda w, r, _: seen.append(r)))
    assert seen == ["error"]


def test_kopfs_handler_writes_the_same_change_into_its_patch() -> None:
    obj, patch, warnings = trainjob(), kopf.Patch(), []
    asyncio.run(sizer(cluster()).mutate(body=obj, patch=patch, warnings=warnings,
                                        operation="CREATE"))  # fmt: skip
    stored = jsonpatch.apply_patch(obj, patch.as_json_patch(obj))
    assert stored["spec"]["trainer"]["resourcesPerNode"]["limits"] == {GPU: 4}
    assert stored["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "8"
    assert len(warnings) == 1


def test_a_managed_operator_registers_the_trainjob_webhook_only_with_trainjob_sizing() -> None:
    plain = configurations("vg", "https://h:1", "Y2E=")
    assert len(plain["MutatingWebhookConfiguration"]["webhooks"]) == 1
    made = configurations("vg", "https://h:1", "Y2E=", namespaces=["team-a"], trainjobs=True)
    assert [w["name"] for w in made["ValidatingWebhookConfiguration"]["webhooks"]] == [
        f"{VALIDATE_HANDLER}.vg"
    ]
    finetunejobs, trainjobs = made["MutatingWebhookConfiguration"]["webhooks"]
    assert finetunejobs == plain["MutatingWebhookConfiguration"]["webhooks"][0] | {
        "namespaceSelector": trainjobs["namespaceSelector"]
    }
    assert trainjobs["name"] == f"{MUTATE_TRAINJOB_HANDLER}.vg"
    assert trainjobs["clientConfig"] == {"url": f"https://h:1/{MUTATE_TRAINJOB_HANDLER}",
                                         "caBundle": "Y2E="}  # fmt: skip
    assert trainjobs["rules"] == [{"apiGroups": ["trainer.kubeflow.org"],
                                   "apiVersions": ["v1alpha1"], "resources": ["trainjobs"],
                                   "operations": ["CREATE", "UPDATE"],
                                   "scope": "Namespaced"}]  # fmt: skip
    assert trainjobs["matchConditions"] == MATCH_CONDITIONS[MUTATE_TRAINJOB_HANDLER]
    assert SPEC_ANNOTATION in trainjobs["matchConditions"][0]["expression"]
    assert trainjobs["failurePolicy"] == "Ignore" and trainjobs["reinvocationPolicy"] == "Never"
    assert trainjobs["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]


def test_the_runtime_a_trainjob_names_is_looked_up_and_its_trainer_written_by_kopfs_patch() -> None:
    """Only the policy annotation: the model, method and GPUs are its runtime's (the
    built-in torchtune-llama3.2-1b: 2 GPUs, where one of the node's two is another pod's),
    looked up by the TrainJob's runtimeRef."""
    runtime = yaml.safe_load((DATA / "torchtune_llama3_2_1b.yaml").read_text())
    asked: list[RuntimeRef] = []

    def lookup(ref: RuntimeRef) -> dict[str, Any] | None:
        asked.append(ref)
        return runtime

    async def current() -> ClusterView | None:
        return view(node("n0", [80, 80], gpu_allocatable=2, gpu_allocated=1),
                    settings=PackingSettings())  # fmt: skip

    obj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "tune", "namespace": "ml",
                        "annotations": {POLICY_ANNOTATION: "Resize"}},
           "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"}}}  # fmt: skip
    patch, warnings = kopf.Patch(), []
    hook = TrainJobWebhook(current, runtime=lookup)
    asyncio.run(hook.mutate(body=obj, patch=patch, warnings=warnings, operation="CREATE"))
    assert asked == [RuntimeRef("ClusterTrainingRuntime", "torchtune-llama3.2-1b")]
    stored = jsonpatch.apply_patch(obj, patch.as_json_patch(obj))
    assert stored["spec"]["trainer"] == {"numNodes": 1, "resourcesPerNode": {"limits": {GPU: 1}}}
    assert len(warnings) == 2 and "torchtune-llama3.2-1b" in warnings[0]


def test_the_policy_annotation_alone_calls_the_webhook() -> None:
    (says, _) = MATCH_CONDITIONS[MUTATE_TRAINJOB_HANDLER]
    assert f"'{POLICY_ANNOTATION}' in object.metadata.annotations" in says["expression"]
