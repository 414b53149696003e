"""The TrainJob webhook (`trainJobSizing`): the review server's answer, the configuration a
managed operator registers for it, and kopf's patch; the sizing itself is
tests/unit/admission/test_trainjob.py's."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from pathlib import Path
from typing import Any

import jsonpatch
import kopf
import pytest
import yaml
from aiohttp import web

from controller.admission import holds
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
from controller.webhook.trainjob import TRAINJOB, TrainJobHolds, TrainJobWebhook
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


# -- holds: TrainJobs created together are not sized onto the same memory ------------------


def four_gpus() -> ClusterView:
    """One node of four 80 GiB GPUs, none given to a pod (the device plugin's slots)."""
    return view(node("n0", [80, 80, 80, 80], gpu_allocatable=4), settings=PackingSettings())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def holding(base: ClusterView, clock: Clock | None = None) -> TrainJobWebhook:
    async def current() -> ClusterView | None:
        await asyncio.sleep(0)  # as the operator's, which hops to kopf's loop: others run
        return base

    return TrainJobWebhook(current, holds=TrainJobHolds(120, clock or Clock()))


def create(obj: dict[str, Any], trainjobs: TrainJobWebhook, dry_run: bool = False) -> Any:
    request = review(obj)
    request["request"]["dryRun"] = dry_run
    return ask(request, trainjobs)["response"]


def ops(response: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def hold_label(response: dict[str, Any]) -> str | None:
    """The token the answer labels the TrainJob with (its hold's), or None."""
    found = [op["value"] for op in ops(response) if op["path"] == "/metadata/labels"]
    return found[0][holds.HOLD_LABEL] if found else None


def sized(response: dict[str, Any]) -> tuple[Any, ...]:
    """The answer but for its hold's label: what two sizings alike have alike."""
    kept = [op for op in ops(response) if op["path"] != "/metadata/labels"]
    return response["allowed"], response.get("warnings"), kept


def named(name: str, per_node: int) -> dict[str, Any]:
    obj = trainjob(per_node=per_node)
    obj["metadata"]["name"] = name
    return obj


def test_a_second_create_is_sized_on_what_the_first_left_free() -> None:
    """The first asks 2 of the node's 4 GPUs, which fit: held. The second asks 4, which the
    same view fits too (23.76 GiB each), but 2 are held: resized to the other 2."""
    sizer = holding(four_gpus())
    first = create(named("first", 2), sizer)
    assert sized(first) == (True, None, []), "as asked; only labelled with its hold"
    second = create(named("second", 4), sizer)
    assert second["allowed"] is True and second["patchType"] == "JSONPatch"
    assert second["warnings"][0].startswith("vramgate: resized 4 -> 2 GPUs (policy Resize): 4 "
                                            "GPUs do not fit now")  # fmt: skip
    assert sizer.holds is not None
    one, two = sizer.holds.active()
    assert (one.name, two.name) == ("first", "second") and one.namespace == "ml"
    assert (hold_label(first), hold_label(second)) == (one.token, two.token)
    assert one.token != two.token
    used = [set(h.placement[0].uuids) for h in (one, two)]
    assert used[0].isdisjoint(used[1]) and len(used[0] | used[1]) == 4
    # A third finds nothing free now: it stays as asked, with the does-not-fit warning.
    third = create(named("third", 2), sizer)
    assert third["warnings"][0].startswith("vramgate: does not fit now (policy Resize)")
    assert len(sizer.holds.active()) == 2


def test_a_dry_run_holds_nothing() -> None:
    sizer = holding(four_gpus())
    assert "patch" not in create(named("dry", 2), sizer, dry_run=True), "nor labelled"
    assert sizer.holds is not None and sizer.holds.active() == ()
    assert sized(create(named("real", 4), sizer)) == (True, None, [])  # all 4 still free


def test_a_hold_is_gone_after_its_seconds() -> None:
    clock = Clock()
    sizer = holding(four_gpus(), clock)
    create(named("first", 4), sizer)
    assert create(named("second", 4), sizer)["warnings"][0].startswith("vramgate: does not fit now")
    clock.now += 120  # the first's hold expires at its create + 120 s exactly
    assert "warnings" not in create(named("third", 4), sizer)


def test_holds_made_concurrently_never_share_gpus() -> None:
    """Creates answered concurrently on the server's loop each await the view, then charge,
    size and hold under the ledger's lock."""
    sizer = holding(four_gpus())

    async def burst() -> list[Any]:
        return await asyncio.gather(*(
            answer(hook(cluster()), MUTATE_TRAINJOB_HANDLER, review(named(f"j{i}", 1)), sizer)
            for i in range(6)
        ))  # fmt: skip

    asyncio.run(burst())
    assert sizer.holds is not None
    held = [uuid for h in sizer.holds.active() for uuid in h.placement[0].uuids]
    assert len(held) == 4 and len(set(held)) == 4  # 4 held once each; 2 did not fit now


def test_kopfs_handler_holds_nothing_for_a_dry_run() -> None:
    sizer = holding(four_gpus())
    asyncio.run(sizer.mutate(body=named("dry", 2), patch=kopf.Patch(), operation="CREATE",
                             dryrun=True))  # fmt: skip
    assert sizer.holds is not None and sizer.holds.active() == ()
    asyncio.run(sizer.mutate(body=named("real", 2), patch=kopf.Patch(), operation="CREATE"))
    assert [h.name for h in sizer.holds.active()] == ["real"]


def test_a_create_of_the_same_name_again_is_sized_as_the_first_was() -> None:
    """The API server refused the first create after the webhook answered (Trainer's own
    validation, a name taken, or it called the webhook again): the second create of that
    name is the same TrainJob, sized without its own earlier hold, which it replaces."""
    sizer = holding(four_gpus())
    first = create(named("llama", 4), sizer)
    again = create(named("llama", 4), sizer)
    assert sized(first) == sized(again) == (True, None, [])
    assert sizer.holds is not None
    (held,) = sizer.holds.active()
    assert held.name == "llama" and len(held.placement[0].uuids) == 4
    # Another name is still sized on what that hold leaves: nothing.
    other = create(named("other", 4), sizer)
    assert other["warnings"][0].startswith("vramgate: does not fit now")


def test_a_create_again_is_not_charged_its_own_hold_by_a_view_built_after_it() -> None:
    """The operator's view is rebuilt from the caches with every active hold charged (a
    second later, or after an inventory change): the same TrainJob created again must find
    its own earlier hold taken off that view too, not only left out of the new charges."""
    base = four_gpus()
    sizer = holding(base)
    first = create(named("llama", 4), sizer)
    assert sizer.holds is not None
    (held,) = sizer.holds.active()
    rebuilt = base.with_reservations([holds.reservation(held)])  # as the next build charges it

    async def current() -> ClusterView | None:
        return rebuilt

    sizer.view = current
    again = create(named("llama", 4), sizer)
    assert sized(again) == sized(first) == (True, None, []), again
    other = create(named("other", 4), sizer)  # another name: still charged
    assert other["warnings"][0].startswith("vramgate: does not fit now")


def test_the_ledger_answers_kopfs_loop_while_a_sizing_holds_its_lock() -> None:
    """A sizing on a large cluster takes up to a second under the sizing lock; the scheduler's
    pass and view read the ledger meanwhile (`active`, `end`), on kopf's loop: they never
    wait for it."""
    ledger = TrainJobHolds(120, Clock())
    taken, release = threading.Event(), threading.Event()

    def sizing() -> None:
        with ledger.sizing_lock:
            taken.set()
            release.wait(10)

    other = threading.Thread(target=sizing)
    other.start()
    try:
        assert taken.wait(5)
        answered: list[object] = []
        reader = threading.Thread(target=lambda: answered.append((ledger.active(), ledger.end([]))))
        reader.start()
        reader.join(1)
        assert answered == [((), None)], "active() waited for the sizing lock"
    finally:
        release.set()
        other.join(5)


def test_a_suspended_trainjob_holds_nothing() -> None:
    """spec.suspend: true (Kueue starts it, maybe much later): sized, but it could not use
    a hold until it starts, so the next create is sized on the whole node."""
    sizer = holding(four_gpus())
    suspended = named("queued", 4)
    suspended["spec"]["suspend"] = True
    assert "warnings" not in create(suspended, sizer)
    assert sizer.holds is not None and sizer.holds.active() == ()
    assert "warnings" not in create(named("next", 4), sizer)


def test_the_trainjob_is_labelled_with_its_holds_token_beside_its_own_labels() -> None:
    """The label is how the operator finds the TrainJob of a hold (`holds.looked_up`): added
    beside labels it has, and written by kopf's handler too; a generateName create's hold
    has no name until the operator's listing gives it one (`TrainJobHolds.name`)."""
    sizer = holding(four_gpus())
    body = named("labelled", 2)
    body["metadata"]["labels"] = {"team": "nlp"}
    answered = create(body, sizer)
    stored = jsonpatch.apply_patch(body, ops(answered))
    assert sizer.holds is not None
    (held,) = sizer.holds.active()
    assert stored["metadata"]["labels"] == {"team": "nlp", holds.HOLD_LABEL: held.token}
    patch = kopf.Patch()
    generated = trainjob(per_node=2)
    generated["metadata"] = {"generateName": "sweep-", "namespace": "ml",
                             "annotations": generated["metadata"]["annotations"]}  # fmt: skip
    asyncio.run(sizer.mutate(body=generated, patch=patch, operation="CREATE"))
    unnamed = next(h for h in sizer.holds.active() if not h.name)
    assert patch["metadata"]["labels"] == {holds.HOLD_LABEL: unnamed.token}
    sizer.holds.name({unnamed.job: "sweep-x7k2p"})
    assert sorted(h.name for h in sizer.holds.active()) == ["labelled", "sweep-x7k2p"]
