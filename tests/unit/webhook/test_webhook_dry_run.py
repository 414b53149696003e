"""The webhook's dry run of the batch Job: which answers refuse a job, and which let it pass.

The Status objects are the API server's, as kube-apiserver 1.36 writes them (apimachinery's
`errors.NewInvalid`, the handlers' decoding error, `webhookerrors.ToStatusErr`, the
ValidatingAdmissionPolicy dispatcher); tests/integration/test_admission.py gets them from a
real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
import pytest

from controller.api.base import GPU_RESOURCE
from controller.packing.inventory import GpuMode
from controller.webhook.admission import AdmissionWebhook
from controller.webhook.dry_run import TRIAL_NODE, WorkloadDryRun, api_refusal, trial_job

QLORA = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
INVALID_NAME = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "message": 'Job.batch "demo" is invalid: spec.template.spec.containers[0].name: Invalid '
    'value: "Trainer_1": a lowercase RFC 1123 label must consist of lower case alphanumeric '
    "characters or '-'",
    "reason": "Invalid",
    "details": {
        "name": "demo",
        "group": "batch",
        "kind": "Job",
        "causes": [{"reason": "FieldValueInvalid", "message": "Invalid value: ...",
                    "field": "spec.template.spec.containers[0].name"}],
    },
    "code": 422,
}  # fmt: skip
BAD_QUANTITY = {
    "kind": "Status",
    "status": "Failure",
    "message": 'Job in version "v1" cannot be handled as a Job: quantities must match the '
    "regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    "reason": "BadRequest",
    "code": 400,
}
POLICY = {
    "kind": "Status",
    "status": "Failure",
    "message": 'jobs.batch "demo" is forbidden: ValidatingAdmissionPolicy \'no-jobs\' with '
    "binding 'no-jobs' denied request: failed expression: false",
    "reason": "Invalid",
    "details": {"name": "demo", "group": "batch", "kind": "jobs",
                "causes": [{"message": "ValidatingAdmissionPolicy 'no-jobs' ..."}]},
    "code": 422,
}  # fmt: skip
WEBHOOK = {
    "kind": "Status",
    "status": "Failure",
    "message": 'admission webhook "jobs.example.com" denied the request: no',
    "reason": "Invalid",
    "details": {"kind": "Job", "causes": [{"field": "spec", "message": "no"}]},
    "code": 422,
}
NO_DRY_RUN = {
    "kind": "Status",
    "status": "Failure",
    "message": 'admission webhook "audit.example.com" does not support dry run',
    "reason": "BadRequest",
    "code": 400,
}
FORBIDDEN = {"kind": "Status", "message": 'jobs.batch is forbidden: User "x" cannot create',
             "reason": "Forbidden", "code": 403}  # fmt: skip
EXISTS = {"kind": "Status", "message": 'jobs.batch "demo" already exists',
          "reason": "AlreadyExists", "code": 409}  # fmt: skip


def finetunejob(*containers: dict[str, Any], gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "demo", "namespace": "team", "uid": "u-1"},
        "spec": {**QLORA, "resources": {"gpus": gpus},
                 "template": {"spec": {"containers": list(containers)}}},
    }  # fmt: skip


def trainer(**fields: Any) -> dict[str, Any]:
    return {"name": "trainer", "image": "trainer:v1", **fields}


class FakeApi:
    """`Kube.create_dry_run` answering `answer` (a Status, None, or an exception to raise)."""

    def __init__(self, answer: Mapping[str, Any] | Exception | None = None) -> None:
        self.answer = answer
        self.created: list[Mapping[str, Any]] = []

    def __call__(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self.created.append(obj)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


# -- which answers are the Job API's own refusal ----------------------------------------------


def test_the_job_apis_validation_and_decoding_refuse() -> None:
    job = trial_job(finetunejob(trainer()), GpuMode.DEVICE_PLUGIN)
    assert job is not None
    assert api_refusal(INVALID_NAME, job) == INVALID_NAME["message"]
    assert api_refusal(BAD_QUANTITY, job) == BAD_QUANTITY["message"]


OTHERS = [
    POLICY,
    WEBHOOK,
    NO_DRY_RUN,
    FORBIDDEN,
    EXISTS,
    {"code": 500, "message": "etcdserver: timeout"},
    {"code": 422, "reason": "Invalid", "message": "x"},
]


@pytest.mark.parametrize("answer", OTHERS)
def test_the_namespaces_webhooks_policies_rbac_and_errors_do_not_refuse(
    answer: Mapping[str, Any],
) -> None:
    job = trial_job(finetunejob(trainer()), GpuMode.DEVICE_PLUGIN)
    assert job is not None
    assert api_refusal(answer, job) is None


def test_a_quantity_the_api_cannot_decode_is_named_with_its_field() -> None:
    """The decoding error names no field: say which quantities are not quantities."""
    bad = trainer(resources={"limits": {"memory": "abc", "cpu": 2}, "requests": {"cpu": "1x"}})
    job = trial_job(finetunejob(bad), GpuMode.DEVICE_PLUGIN)
    assert job is not None
    assert api_refusal(BAD_QUANTITY, job) == (
        f"{BAD_QUANTITY['message']} (spec.template.spec.containers[0].resources.limits.memory: "
        "'abc'; spec.template.spec.containers[0].resources.requests.cpu: '1x')"
    )


# -- the Job dry-run ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(GpuMode))
def test_the_dry_run_is_the_operators_job_on_a_stand_in_node_with_the_gpus_asked_for(
    mode: GpuMode,
) -> None:
    job = trial_job(finetunejob(trainer(), gpus=4), mode)
    assert job is not None and job["kind"] == "Job"
    assert job["metadata"]["name"] == "demo" and job["metadata"]["namespace"] == "team"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    pod_spec = job["spec"]["template"]["spec"]
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [TRIAL_NODE]
    limits = (pod_spec["containers"][0].get("resources") or {}).get("limits") or {}
    assert limits.get(GPU_RESOURCE) == ("4" if mode is GpuMode.DEVICE_PLUGIN else None)


def test_a_job_not_created_yet_gets_stand_ins_for_its_name_and_uid() -> None:
    bare = {"metadata": {"namespace": "team"}, "spec": finetunejob(trainer())["spec"]}
    job = trial_job(bare, GpuMode.DEVICE_PLUGIN)
    assert job is not None
    owner = job["metadata"]["ownerReferences"][0]
    assert owner["name"] and owner["uid"]  # the API checks they are set, not that they exist


def test_a_refused_template_gets_the_apis_message_and_a_spec_that_passed_is_remembered() -> None:
    api = FakeApi(INVALID_NAME)
    check = WorkloadDryRun(api, GpuMode.DEVICE_PLUGIN)
    job = finetunejob(trainer(name="Trainer_1"))
    said = asyncio.run(check.refusal(job, "k1"))
    assert said == (
        "spec.template: the Job API refuses the batch Job the operator would create from this "
        f"pod template (a server-side dry run): {INVALID_NAME['message']}"
    )
    assert asyncio.run(check.refusal(job, "k1")) == said  # a refusal is asked again
    assert len(api.created) == 2
    api.answer = None
    assert asyncio.run(check.refusal(job, "k2")) is None
    assert asyncio.run(check.refusal(job, "k2")) is None  # a thousand jobs of one spec
    assert len(api.created) == 3
    other = {**job, "metadata": {**job["metadata"], "namespace": "elsewhere"}}
    assert asyncio.run(check.refusal(other, "k2")) is None  # another namespace's admission
    assert len(api.created) == 4


@pytest.mark.parametrize("answer", [TimeoutError("read timed out"), FORBIDDEN, POLICY])
def test_no_answer_or_an_answer_not_the_job_apis_lets_the_job_through(
    answer: Mapping[str, Any] | Exception,
) -> None:
    api = FakeApi(answer)
    check = WorkloadDryRun(api, GpuMode.DEVICE_PLUGIN)
    assert asyncio.run(check.refusal(finetunejob(trainer()), "k")) is None
    assert asyncio.run(check.refusal(finetunejob(trainer()), "k")) is None
    assert len(api.created) == 2  # not remembered as passed: asked again


def test_a_template_that_cannot_be_built_is_not_dry_run() -> None:
    api = FakeApi()
    check = WorkloadDryRun(api, GpuMode.DEVICE_PLUGIN)
    pinned = finetunejob(trainer())
    pinned["spec"]["template"]["spec"]["nodeName"] = "n0"
    assert asyncio.run(check.refusal(pinned, "k")) is None
    assert api.created == []


# -- in the validating webhook ------------------------------------------------------------------


def hook(api: FakeApi) -> AdmissionWebhook:
    async def no_view() -> None:
        return None

    return AdmissionWebhook(no_view, dry_run=WorkloadDryRun(api, GpuMode.DEVICE_PLUGIN))


def validate(webhook: AdmissionWebhook, obj: dict[str, Any], old: Any = None) -> None:
    operation = "UPDATE" if old is not None else "CREATE"
    asyncio.run(webhook.validate(body=obj, spec=obj["spec"], old=old, operation=operation))


def test_the_validating_webhook_refuses_a_create_or_a_spec_change_the_job_api_refuses() -> None:
    api = FakeApi(INVALID_NAME)
    webhook = hook(api)
    job = finetunejob(trainer(name="Trainer_1"))
    with pytest.raises(kopf.AdmissionError, match=r"^spec\.template: the Job API refuses") as e:
        validate(webhook, job)
    assert e.value.code == 422
    old = finetunejob(trainer())
    with pytest.raises(kopf.AdmissionError, match="Trainer_1"):
        validate(webhook, job, old=old)
    assert len(api.created) == 2


def test_no_dry_run_for_an_update_that_only_suspends_nor_for_a_job_without_template() -> None:
    api = FakeApi(INVALID_NAME)
    webhook = hook(api)
    stored = finetunejob(trainer(name="Trainer_1"))  # stored while the webhook was down
    suspended = {**stored, "spec": {**stored["spec"], "suspend": True}}
    validate(webhook, suspended, old=stored)
    validate(webhook, {"metadata": stored["metadata"], "spec": {**QLORA}})
    validate(webhook, {"metadata": stored["metadata"], "spec": {**QLORA, "template": {}}})
    assert api.created == []
