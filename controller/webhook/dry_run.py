"""The pod template judged by the Job API itself at `kubectl apply` time: a server-side dry run.

The CRD keeps `spec.template` as it is written (preserve-unknown-fields), and
`workload_problem` checks only what building the workload needs. Everything else the Job
API validates (a container name `Trainer_1`, a quantity `abc`, a bad probe) used to surface
only when the operator created the Job, after the job was admitted and its GPUs promised. So
the validating webhook builds the batch Job the operator would create, on a stand-in
placement (the requested GPU count on one node, in the configured GPU mode), and creates it
with `dryRun=All` in the job's namespace: decoded, defaulted and validated as the real create
would be, and stored nowhere. The Job is the one object built from the template; the DRA
claim and the headless Service are built from the placement alone.

Only the API server's own refusal refuses the FineTuneJob: its validation (422 Invalid, the
`details` of the Job kind with a field in every cause) or its decoding (400 "... cannot be
handled as a Job"). Anything else lets it through, logged: no answer in time, RBAC (403),
the namespace's admission webhooks (their refusal starts "admission webhook"; one that does
not support dry runs answers 400) and policies (a ValidatingAdmissionPolicy answers 422 too,
with no field in its cause and the plural resource as its kind), a quota, a Job of that name
already there (409), a server error. Those may change by the time the job is admitted, are
not the template's fault, or are the operator's to report when it creates the workload.

A spec that passed is remembered per namespace and GPU mode (the Job API's answer does not
depend on the job's name: workload names are always valid), so that a thousand jobs of one
spec cost one dry run; a refusal is not remembered, as its message names the job.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from controller.estimator import MAX_GPUS
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import Admission, WorkloadError, build_workload

log = logging.getLogger("vramgate.webhook")

#: Creates one object with `dryRun=All`: None when it would be created, else the API
#: server's Status object (`Kube.create_dry_run`); raises when no answer came.
CreateDryRun = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]

#: The stand-in node and GPU UUIDs of the placement the Job is built on: the Job API checks
#: their form (a node name in a field selector, UUIDs in the environment), never that they
#: exist, and no pod is ever made of a dry run.
TRIAL_NODE = "vramgate-dry-run"
TRIAL_UUID = "GPU-00000000-0000-0000-0000-{:012d}"
#: Stand-ins of what a job not created yet may lack (a uid is set before the validating
#: webhooks are called, a name too, even with generateName; a caller may send neither).
TRIAL_NAME, TRIAL_UID = "dry-run", "00000000-0000-0000-0000-000000000000"
_CACHE_SIZE = 1024
#: The API server's decoding error (k8s.io/apiserver endpoints/handlers/rest.go).
_UNDECODABLE = re.compile(r"^\w+ in version \"[^\"]*\" cannot be handled as a \w+: ")
#: A resource quantity (k8s.io/apimachinery resource.Quantity's own pattern).
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")


def trial_job(job: Mapping[str, Any], mode: GpuMode) -> dict[str, Any] | None:
    """The batch Job the operator would create for `job` (a FineTuneJob) on the stand-in
    placement, or None when none can be built (`workload_problem` says why)."""
    meta = dict(job.get("metadata") or {})
    meta["name"] = meta.get("name") or TRIAL_NAME
    meta["uid"] = meta.get("uid") or TRIAL_UID
    meta["namespace"] = meta.get("namespace") or "default"
    gpus = ((job.get("spec") or {}).get("resources") or {}).get("gpus")
    count = gpus if type(gpus) is int and 1 <= gpus <= MAX_GPUS else 1
    node = NodeGpus(
        TRIAL_NODE, tuple(range(count)), tuple(TRIAL_UUID.format(i) for i in range(count))
    )
    try:
        objects = build_workload({**job, "metadata": meta}, Admission((node,), 0, mode))
    except WorkloadError:
        return None
    return next((obj for obj in objects if obj["kind"] == "Job"), None)


def api_refusal(answer: Mapping[str, Any], obj: Mapping[str, Any]) -> str | None:
    """The API server's own refusal of `obj` in the Status `answer` of a dry run (its
    validation's or its decoding's message), or None when something else refused it."""
    message = str(answer.get("message") or "")
    if message.startswith("admission webhook"):
        return None  # a webhook of the namespace: not the Job API
    code, reason = answer.get("code"), answer.get("reason")
    if code == 400 and reason == "BadRequest" and _UNDECODABLE.match(message):
        return _with_quantities(message, obj)
    if code != 422 or reason != "Invalid":
        return None
    details = answer.get("details") or {}
    causes = details.get("causes") or []
    # A ValidatingAdmissionPolicy's 422 names the resource ("jobs") and its cause no field.
    if details.get("kind") != obj.get("kind") or not causes:
        return None
    if not all(isinstance(c, Mapping) and c.get("field") for c in causes):
        return None
    return message


def _with_quantities(message: str, obj: Mapping[str, Any]) -> str:
    """A decoding error about a quantity does not say where it is: say which are not. The
    Job was built by `build_workload`, which checked that each container, its resources and
    their limits and requests are objects."""
    if "quantities must match" not in message:
        return message
    pod_spec = obj["spec"]["template"]["spec"]
    found = []
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(pod_spec.get(kind) or []):
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                for name, value in (resources.get(part) or {}).items():
                    if not isinstance(value, int | float) and not _QUANTITY.match(str(value)):
                        path = f"spec.template.spec.{kind}[{i}].resources.{part}.{name}"
                        found.append(f"{path}: {value!r}")
    return f"{message} ({'; '.join(found)})" if found else message


class WorkloadDryRun:
    """The webhook's dry run of a job's batch Job, through `create` (`Kube.create_dry_run`),
    in GPU mode `mode`."""

    def __init__(self, create: CreateDryRun, mode: GpuMode) -> None:
        self.create, self.mode = create, mode
        self._passed: dict[tuple[str, str], None] = {}

    async def refusal(self, job: Mapping[str, Any], key: str) -> str | None:
        """Why the Job API refuses the workload of `job` (its spec's digest `key`), as the
        webhook's message, or None: it would be created, or the answer is not the Job
        API's own (the webhook then fails open)."""
        obj = trial_job(job, self.mode)
        if obj is None:
            return None  # the local check refuses it, or the operator records it
        namespace = obj["metadata"]["namespace"]
        cached = (key, namespace)
        if cached in self._passed:
            return None
        try:
            answer = await asyncio.to_thread(self.create, obj)
        except Exception as error:  # no answer in time, no connection: let it through
            log.warning("dry run of Job %s/%s failed (%s); not checked at apply",
                        namespace, obj["metadata"]["name"], error)  # fmt: skip
            return None
        if answer is None:
            if len(self._passed) >= _CACHE_SIZE:
                self._passed.pop(next(iter(self._passed)))
            self._passed[cached] = None
            return None
        refused = api_refusal(answer, obj)
        if refused is None:
            log.info("dry run of Job %s/%s answered %s %s (%s); not the Job API's own "
                     "refusal: let through", namespace, obj["metadata"]["name"],
                     answer.get("code"), answer.get("reason"), answer.get("message"))  # fmt: skip
            return None
        return (
            "spec.template: the Job API refuses the batch Job the operator would create from "
            f"this pod template (a server-side dry run): {refused}"
        )
