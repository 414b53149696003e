"""`--webhook managed`: the operator registers its webhook configurations itself.

kopf's managed mode writes configurations of its own making, which cannot carry
`matchConditions`: the API server then calls both webhooks on every FineTuneJob create and
update, where the chart's configurations (`templates/webhook-configurations.yaml`) call the
mutating one only for a Resize job (or one whose count it rewrote) and the validating one
only for a create or a changed spec. A webhook call costs the API server milliseconds of CPU
(BENCHMARKS.md), and local runs, the tests and the benchmarks should see what a cluster
installed by the chart sees. So the configurations here are the chart's, pointing at the URL
the server listens on: written each time the server starts (or restarts with renewed
certificate files), and deleted at a clean exit if they still call this server, so that none
sends the API server to a port nobody serves. The webhooks keep kopf's names
(`validate-finetunejob.<config name>`), which the API server quotes in a refusal. With
`trainJobSizing`, the mutating configuration has a second webhook, `mutate-trainjob`: a
TrainJob's CREATE, when it carries the annotation `vramgate.dev/finetune` or
`vramgate.dev/admission-policy` (its runtime then says its training), and the UPDATE of one
it resized (its manifest applied again keeps the count it was sized to).

Needs, cluster-wide: validatingwebhookconfigurations and mutatingwebhookconfigurations
get, create, update and delete (local runs use an administrator's kubeconfig).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from controller.admission import trainjob
from controller.admission.kueue import SPEC_ANNOTATION
from controller.api.base import GROUP, REQUESTED_GPUS_ANNOTATION, VERSION
from controller.api.finetunejob import PLURAL
from controller.base.errors import DeploymentError
from controller.kube import ApiClient, ApiError, WebhookConfigurations

#: The webhooks' kopf handler ids: the last segment of their URLs (the chart's paths too).
VALIDATE_HANDLER = "validate-finetunejob"
MUTATE_HANDLER = "mutate-finetunejob"
MUTATE_TRAINJOB_HANDLER = "mutate-trainjob"

#: A create, or an update that changes the spec: an update with the spec as it was (labels,
#: annotations, finalizers) is nothing either webhook would refuse or rewrite.
_CREATE_OR_SPEC_CHANGED = {
    "name": "create-or-spec-changed",
    "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
}
#: When the API server calls each webhook: the chart's conditions (a test holds them equal).
MATCH_CONDITIONS: dict[str, list[dict[str, str]]] = {
    VALIDATE_HANDLER: [_CREATE_OR_SPEC_CHANGED],
    MUTATE_HANDLER: [
        _CREATE_OR_SPEC_CHANGED,
        {
            "name": "resize-or-rewritten",
            "expression": "has(object.spec) && (has(object.spec.admissionPolicy) && "
            "object.spec.admissionPolicy == 'Resize') || (has(object.metadata.annotations) && "
            f"'{REQUESTED_GPUS_ANNOTATION}' in object.metadata.annotations)",
        },
    ],
    # A TrainJob that says its training, or asks for a policy (its runtime says the rest):
    # every other one is none of vramgate's business.
    # An UPDATE only of one it resized at create (its manifest applied again).
    MUTATE_TRAINJOB_HANDLER: [
        {
            "name": "says-its-training",
            "expression": "has(object.metadata.annotations) && "
            f"('{SPEC_ANNOTATION}' in object.metadata.annotations || "
            f"'{trainjob.POLICY_ANNOTATION}' in object.metadata.annotations)",
        },
        {
            "name": "created-or-resized",
            "expression": "request.operation == 'CREATE' || (oldObject != null && "
            "has(oldObject.metadata.annotations) && "
            f"'{REQUESTED_GPUS_ANNOTATION}' in oldObject.metadata.annotations)",
        },
    ],
}
#: What each webhook is called for: (API group, version, resource, operations).
_RULES = {
    VALIDATE_HANDLER: (GROUP, VERSION, PLURAL, ["CREATE", "UPDATE"]),
    MUTATE_HANDLER: (GROUP, VERSION, PLURAL, ["CREATE", "UPDATE"]),
    # Its trainer is immutable once created: sized at CREATE, its size kept at an UPDATE.
    MUTATE_TRAINJOB_HANDLER: (
        trainjob.GROUP,
        trainjob.VERSION,
        trainjob.PLURAL,
        ["CREATE", "UPDATE"],
    ),
}
#: The handler each kind of configuration calls.
_HANDLERS = {
    "ValidatingWebhookConfiguration": VALIDATE_HANDLER,
    "MutatingWebhookConfiguration": MUTATE_HANDLER,
}
#: A local run shares a busy machine with its API server: kopf's timeout, the most allowed.
TIMEOUT_S = 30

log = logging.getLogger("vramgate.webhook")


def configurations(
    name: str,
    url: str,
    ca_bundle: str | None = None,
    namespaces: Sequence[str] = (),
    trainjobs: bool = False,
) -> dict[str, dict[str, Any]]:
    """The validating and mutating configuration named `name`, by kind, calling the server
    at `url` (the handler id appended) with the base64 `ca_bundle`; listed `namespaces` only;
    with `trainjobs`, the TrainJob webhook too (in the mutating one)."""

    def webhook(handler: str) -> dict[str, Any]:
        called = {"url": f"{url.rstrip('/')}/{handler}"}
        if ca_bundle:
            called["caBundle"] = ca_bundle
        group, version, resource, operations = _RULES[handler]
        found: dict[str, Any] = {
            "name": f"{handler}.{name}",
            "clientConfig": called,
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": [version],
                    "resources": [resource],
                    "operations": operations,
                    "scope": "Namespaced",
                }
            ],
            "matchConditions": MATCH_CONDITIONS[handler],
            # Fast feedback, not the gate: the operator decides every job anyway.
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": TIMEOUT_S,
            "admissionReviewVersions": ["v1"],
        }
        if namespaces:
            found["namespaceSelector"] = {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "In",
                        "values": sorted(set(namespaces)),
                    }
                ]
            }
        if handler != VALIDATE_HANDLER:
            found["reinvocationPolicy"] = "Never"
        return found

    meta = {"name": name, "labels": {"app.kubernetes.io/managed-by": "vramgate-operator"}}
    found: dict[str, dict[str, Any]] = {
        kind: {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": meta,
            "webhooks": [webhook(handler)],
        }
        for kind, handler in _HANDLERS.items()
    }
    if trainjobs:
        found["MutatingWebhookConfiguration"]["webhooks"].append(webhook(MUTATE_TRAINJOB_HANDLER))
    return found


class Registrar:
    """Writes and deletes the two configurations named `name` (blocking calls: run them in
    a thread)."""

    #: Tries of one write (create, or read and replace) before giving up, with a growing pause
    #: between them: another writer in between, a configuration deleted meanwhile, the API
    #: server briefly unreachable.
    ATTEMPTS = 5

    def __init__(
        self, api: ApiClient, name: str, namespaces: Sequence[str] = (), trainjobs: bool = False
    ) -> None:
        self.configs = WebhookConfigurations(api)
        self.name = name
        self.namespaces = tuple(namespaces)
        self.trainjobs = trainjobs
        self.url: str | None = None  # what this server registered last

    def register(self, url: str, ca_bundle: str | None) -> None:
        """Create both, or replace what is there (an earlier run's, another replica's)."""
        made = configurations(self.name, url, ca_bundle, self.namespaces, self.trainjobs)
        for kind, body in made.items():
            try:
                self._write(kind, body)
            except Exception as error:
                reason = f"{error.status} {error.reason}" if isinstance(error, ApiError) else error
                raise DeploymentError(
                    f"--webhook managed: cannot register the {kind} {self.name}: {reason}"
                ) from None
        self.url = url
        log.info("registered the webhooks %s at %s", self.name, url)

    def unregister(self) -> None:
        """Delete the configurations that still call this server: another replica, or the
        next pod of a rolling update, may have registered its own since."""
        if self.url is None:
            return
        for kind in _HANDLERS:
            try:
                there = self.configs.read(kind, self.name)
                urls = set(there.urls)
                if not urls or not all(u and u.startswith(self.url) for u in urls):
                    continue
                self.configs.delete(kind, self.name, there.resource_version)
            except ApiError as error:
                if error.status not in (404, 409):  # gone, or rewritten by another meanwhile
                    log.warning("cannot delete the %s %s: %s", kind, self.name, error.reason)
            except Exception as error:  # the API server gone first (a local run's teardown)
                log.warning("cannot delete the %s %s: %s", kind, self.name, error)

    def _write(self, kind: str, body: dict[str, Any]) -> None:
        for attempt in range(self.ATTEMPTS):
            if attempt:
                time.sleep(0.2 * 2**attempt)
            try:
                self.configs.create(kind, body)
                return
            except ApiError as error:
                if error.status != 409:
                    if attempt + 1 < self.ATTEMPTS and error.status >= 500:
                        continue
                    raise
            try:
                there = self.configs.read(kind, self.name)
                version = {"resourceVersion": there.resource_version}
                self.configs.replace(
                    kind, self.name, {**body, "metadata": {**body["metadata"], **version}}
                )
                return
            except ApiError as error:
                # 404: deleted since (create again); 409: replaced since (read again)
                if error.status not in (404, 409) or attempt + 1 == self.ATTEMPTS:
                    raise
