"""The client, the errors in vramgate's terms, and the operator's calls to the API server.

A thin layer over the official client: blocking calls, run by the scheduler in a bounded
thread pool so the event loop (and the webhook on it) never waits for the API server. Every
call of `Kube` says which way it failed in our terms: `Conflict` (the object changed since we
read it: the decision was made on a stale snapshot), `Gone` (deleted meanwhile), `ApiError`
(any other refusal, with its HTTP status), anything else (no answer) raised as it is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from controller.api.base import GROUP, VERSION
from controller.api.finetunejob import PLURAL
from controller.api.learnedcorrection import PLURAL as LEARNED_PLURAL
from controller.base.errors import DeploymentError

#: Seconds to connect and to wait for an answer: a request that hangs (an API server gone
#: quiet mid-request) must free its worker thread, or a few of them stop every write.
REQUEST_TIMEOUT_S = (10.0, 60.0)
#: A dry run made for the webhook answers within the API server's wait for the webhook (the
#: chart's timeoutSeconds, 5 s), or is given up: the webhook then lets the job through.
DRY_RUN_TIMEOUT_S = (2.0, 2.5)


#: Kueue's API, whose AdmissionChecks vramgate answers (`controller.admission.kueue`).
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
#: Kubeflow Trainer's API, whose TrainJobs the TrainJob webhook sizes and holds GPUs for.
TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
#: The field manager of vramgate's entries in Kueue's objects (server-side apply).
CHECK_MANAGER = "vramgate-check"
APPLY = "application/apply-patch+yaml"
#: Kueue's admission gate annotation on a job (`controller.admission.kueue.GATE_ANNOTATION`).
KUEUE_GATE = "kueue.x-k8s.io/admission-gated-by"
GPU = "nvidia.com/gpu"


class Conflict(Exception):
    """409: the object's resourceVersion moved on, or it already exists."""


class Gone(Exception):
    """404: the object (or its namespace) no longer exists."""


class StaleWrite(Exception):
    """A JSON patch's test failed: the object is not as it was read (read it again)."""


class ApiError(Exception):
    """The API server refused a request: its HTTP `status`, its `reason` (the API server's
    message where `Kube` raises it, the HTTP reason phrase where a typed call of the client
    did), and the response `body` when kept. Said as the client's own exception says its
    status, reason and body, so a log line that quotes one reads as it did."""

    def __init__(self, status: int, reason: str | None, body: str | None = None) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.body = body

    def __str__(self) -> str:
        said = f"({self.status})\nReason: {self.reason}\n"
        return said + (f"HTTP response body: {self.body}\n" if self.body else "")


class NoCredentials(Exception):
    """Neither in-cluster credentials nor a usable kubeconfig; the message says why."""


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    """The client's typed calls made inside raise `ApiError` where they raised the client's
    exception (status, reason and body kept)."""
    try:
        yield
    except ApiException as error:
        raise ApiError(error.status, error.reason, error.body) from None


#: Where each kind the workload builder returns lives in the API: (path prefix, plural).
_KINDS = {
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("resource.k8s.io/v1", "ResourceClaim"): ("/apis/resource.k8s.io/v1", "resourceclaims"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): (
        "/apis/resource.k8s.io/v1",
        "resourceclaimtemplates",
    ),
}


def api_client(pool_size: int) -> ApiClient:
    """A client from in-cluster credentials, else $KUBECONFIG, with room for `pool_size`
    concurrent requests."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as error:
            raise DeploymentError(f"no Kubernetes credentials: {error}") from None
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def default_api_client(kubeconfig: Path | None = None) -> ApiClient:
    """The agent's client: from `kubeconfig` when given, else in-cluster credentials, else
    $KUBECONFIG (the client's process-wide default configuration then). `NoCredentials`
    when none can be used."""
    try:
        if kubeconfig is not None:
            api = config.new_client_from_config(config_file=str(kubeconfig))
            return cast(ApiClient, api)
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return client.ApiClient()
    except (config.ConfigException, OSError) as error:
        raise NoCredentials(str(error)) from None


def request(
    api: ApiClient,
    method: str,
    path: str,
    body: object = None,
    query: Sequence[tuple[str, str]] = (),
    timeout: tuple[float, float] | None = None,
    content: str = "application/json",
) -> Any:
    """One request of `body` as `content` to `path`; the client's response (`.status`,
    `.reason`, `.read()`), whatever its status. Raises only when no answer came."""
    serialized = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query),
        header_params={"Accept": "application/json", "Content-Type": content},
        body=body,
        auth_settings=["BearerToken"],
    )
    return api.call_api(*serialized, _request_timeout=timeout)


class Kube:
    """The calls the operator makes, each one request."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)  # ConfigMap reads (configmaps.read_model_config)

    def _request(
        self,
        method: str,
        path: str,
        body: object = None,
        query: Sequence[tuple[str, str]] = (),
        timeout: tuple[float, float] = REQUEST_TIMEOUT_S,
        content: str | None = None,
    ) -> Any:
        """One request; the client's response (`.status`, `.reason`, `.read()`), whatever
        its status."""
        if content is None:
            content = "application/merge-patch+json" if method == "PATCH" else "application/json"
        return request(self.api, method, path, body, query, timeout, content)

    def _call(
        self,
        method: str,
        path: str,
        body: object = None,
        query: Sequence[tuple[str, str]] = (),
        content: str | None = None,
        decode: bool = True,
    ) -> Any:
        """The answer's JSON (None without `decode`: a write whose answer is not read skips
        decoding the whole object it returns)."""
        response = self._request(method, path, body, query, content=content)
        data = response.read()
        if response.status == 409:
            raise Conflict(_message(data, response.reason))
        if response.status == 404:
            raise Gone(_message(data, response.reason))
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _message(data, response.reason))
        return json.loads(data or b"null") if decode else None

    def create_dry_run(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create `obj` with `dryRun=All`: decoded, defaulted, validated and admitted (the
        namespace's admission webhooks and policies too) as a create is, but not stored.
        None when it would be created; else the API server's Status object of the refusal,
        whatever its code (its `code`, `reason`, `message` and `details`). Raises only when
        no answer came (a timeout, a refused connection)."""
        prefix, plural = _KINDS[(obj["apiVersion"], obj["kind"])]
        path = f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}"
        response = self._request(
            "POST", path, obj, query=[("dryRun", "All")], timeout=DRY_RUN_TIMEOUT_S
        )
        data = response.read()
        if 200 <= response.status < 300:
            return None
        try:
            found = json.loads(data or b"{}")
        except ValueError:
            found = None
        if not isinstance(found, dict) or found.get("kind") != "Status":
            found = {"message": str(response.reason)}
        return {**found, "code": found.get("code") or response.status}

    def patch_job_status(
        self, namespace: str, name: str, patch: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch a FineTuneJob's status; with `resource_version`, only if the job is
        still at that version (the API server answers 409 otherwise)."""
        body: dict[str, Any] = {"status": dict(patch)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        return dict(self._call("PATCH", path, body))

    def record_workload_uid(self, namespace: str, name: str, workload: str, uid: str) -> None:
        """Set status.workloadRef.uid of a FineTuneJob, only while its workloadRef still names
        `workload` (a JSON patch's test: a job suspended meanwhile gets no stale reference)."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        ops = [
            {"op": "test", "path": "/status/workloadRef/name", "value": workload},
            {"op": "add", "path": "/status/workloadRef/uid", "value": uid},
        ]
        self._call("PATCH", path, ops, content="application/json-patch+json", decode=False)

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        prefix, plural = _KINDS[(obj["apiVersion"], obj["kind"])]
        namespace = obj["metadata"]["namespace"]
        return dict(self._call("POST", f"{prefix}/namespaces/{namespace}/{plural}", obj))

    def owners(self, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The ownerReferences of the object that exists under `obj`'s name: a create answered
        409 made it earlier (ours) or someone else did (a name taken, never ours to use)."""
        existing = self._call("GET", _object_path(obj))
        return list(existing.get("metadata", {}).get("ownerReferences") or [])

    def delete(self, obj: Mapping[str, Any]) -> None:
        """Delete with background propagation (the Job's pods follow); gone already is fine."""
        with contextlib.suppress(Gone):
            self._call("DELETE", _object_path(obj), {"propagationPolicy": "Background"})

    def workload_remains(
        self, namespace: str, name: str, job_uid: str, workload_uid: str
    ) -> tuple[bool, list[Any]]:
        """Whether the batch Job `name`, owned by the FineTuneJob of `job_uid`, exists (the
        cache may lag), and the Events about the Job of `workload_uid`: what a missing
        workload left behind (`controller.workload.lost`)."""
        try:
            found = self._call("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
        except Gone:
            exists = False
        else:
            meta = found.get("metadata") or {}
            owners = {str(ref.get("uid")) for ref in meta.get("ownerReferences") or []}
            exists = job_uid in owners and not meta.get("deletionTimestamp")
        selector = ",".join(
            f"involvedObject.{field}={value}"
            for field, value in (("kind", "Job"), ("name", name), ("uid", workload_uid))
        )
        events = self._call(
            "GET", f"/api/v1/namespaces/{namespace}/events", query=[("fieldSelector", selector)]
        )
        return exists, list(events.get("items") or [])

    def create_learned(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create a LearnedCorrection (cluster-scoped); Conflict when it exists already."""
        return dict(self._call("POST", f"/apis/{GROUP}/{VERSION}/{LEARNED_PLURAL}", obj))

    def patch_learned_status(
        self, name: str, status: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """Merge-patch a LearnedCorrection's status, only if the object is still at
        `resource_version` (409 otherwise: a sample filed on a stale copy is filed again)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        path = f"/apis/{GROUP}/{VERSION}/{LEARNED_PLURAL}/{name}/status"
        return dict(self._call("PATCH", path, body))

    def delete_learned(self, name: str, resource_version: str) -> None:
        """Delete a LearnedCorrection only if it is still at `resource_version` (409 if a
        sample was filed into it since); gone already is fine."""
        body = {"preconditions": {"resourceVersion": resource_version}}
        with contextlib.suppress(Gone):
            self._call("DELETE", f"/apis/{GROUP}/{VERSION}/{LEARNED_PLURAL}/{name}", body)

    def apply_check(
        self,
        namespace: str,
        name: str,
        entry: Mapping[str, Any],
        resource_version: str | None,
    ) -> dict[str, Any]:
        """Server-side apply one entry of a Kueue Workload's status.admissionChecks (a list
        keyed by name), as `CHECK_MANAGER`: the other checks' entries are not touched. With
        `resource_version`, only if the Workload is still at that version (409 otherwise: a
        decision made on a stale snapshot is made again)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": meta,
            "status": {"admissionChecks": [dict(entry)]},
        }
        path = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/namespaces/{namespace}/workloads/{name}/status"
        query = [("fieldManager", CHECK_MANAGER), ("force", "true")]
        return dict(self._call("PATCH", path, body, query, content=APPLY))

    def apply_check_condition(self, name: str, condition: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply one condition of an AdmissionCheck's status (`Active`, which
        Kueue reads before it uses the check), as `CHECK_MANAGER`."""
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [dict(condition)]},
        }
        path = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/admissionchecks/{name}/status"
        query = [("fieldManager", CHECK_MANAGER), ("force", "true")]
        return dict(self._call("PATCH", path, body, query, content=APPLY))

    def resize_job(
        self,
        namespace: str,
        name: str,
        uid: str,
        gates_before: str,
        gates: str | None,
        container: int | None = None,
        gpus: int | None = None,
        parts: Sequence[str] = (),
    ) -> None:
        """Rewrite a suspended batch Job's GPU count (`gpus` in each of `parts` of the
        container at `container`; None: leave it) and its Kueue admission gate annotation
        (`gates`; None: remove it), in one JSON patch whose tests make it land only while the
        Job is the one of `uid`, still suspended and still gated `gates_before`: a Job
        changed meanwhile is read again (`StaleWrite`), never patched blind."""
        gate = "/metadata/annotations/" + KUEUE_GATE.replace("~", "~0").replace("/", "~1")
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/spec/suspend", "value": True},
            {"op": "test", "path": gate, "value": gates_before},
        ]
        if container is not None and gpus is not None:
            base = f"/spec/template/spec/containers/{container}/resources"
            ops += [
                {"op": "add", "path": f"{base}/{part}/{GPU.replace('/', '~1')}",
                 "value": str(gpus)}
                for part in parts
            ]  # fmt: skip
        ops.append({"op": "remove", "path": gate} if gates is None else
                   {"op": "replace", "path": gate, "value": gates})  # fmt: skip
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
        response = self._request("PATCH", path, ops, content="application/json-patch+json")
        data = response.read()
        if response.status == 422 and b"test" in (data or b"").lower():
            raise StaleWrite(_message(data, response.reason))
        if response.status == 404:
            raise Gone(_message(data, response.reason))
        if not 200 <= response.status < 300:
            raise ApiError(response.status, _message(data, response.reason))

    def list_kueue_workloads(self, namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every Kueue Workload of `namespaces` (none: of every namespace), read now."""
        base = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}"
        paths = [f"{base}/namespaces/{ns}/workloads" for ns in namespaces]
        items: list[dict[str, Any]] = []
        for path in paths or [f"{base}/workloads"]:
            items.extend(self._call("GET", path).get("items") or [])
        return items

    def held_trainjobs(self, namespace: str, label: str, tokens: Sequence[str]) -> dict[str, str]:
        """The TrainJobs of `namespace` whose `label` is one of `tokens`, and not being
        deleted: their names by token (`controller.admission.holds.looked_up`)."""
        path = f"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}/namespaces/{namespace}/trainjobs"
        selector = f"{label} in ({','.join(sorted(set(tokens)))})"
        items = self._call("GET", path, query=[("labelSelector", selector)]).get("items") or []
        found = {}
        for item in items:
            meta = item.get("metadata") or {}
            token = (meta.get("labels") or {}).get(label)
            if token and not meta.get("deletionTimestamp"):
                found[str(token)] = str(meta.get("name"))
        return found

    def trainjob_exists(self, namespace: str, name: str) -> bool:
        """Whether the TrainJob `name` is there (and not being deleted)."""
        path = f"/apis/{TRAINER_GROUP}/{TRAINER_VERSION}/namespaces/{namespace}/trainjobs/{name}"
        try:
            found = self._call("GET", path)
        except Gone:
            return False
        return not (found.get("metadata") or {}).get("deletionTimestamp")

    def list_jobs(self, namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Every FineTuneJob of `namespaces` (none: of every namespace), read from the API
        server now (not from a cache). Per namespace when named, since an operator confined
        to some namespaces has no right to list the others."""
        paths = [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in namespaces]
        items: list[dict[str, Any]] = []
        for path in paths or [f"/apis/{GROUP}/{VERSION}/{PLURAL}"]:
            items.extend(self._call("GET", path).get("items") or [])
        return items

    def read_lease(self, namespace: str, name: str) -> dict[str, Any]:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        return dict(self._call("GET", path))

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return dict(self._call("POST", path, body))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT with the body's resourceVersion: 409 if another replica wrote it first."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        return dict(self._call("PUT", path, body))


def _object_path(obj: Mapping[str, Any]) -> str:
    """The API path of one of the workload objects the operator creates, by its name."""
    prefix, plural = _KINDS[(obj["apiVersion"], obj["kind"])]
    meta = obj["metadata"]
    return f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def _message(data: bytes | None, reason: object) -> str:
    """The API server's own message (a Status object's), else the HTTP reason."""
    try:
        return str(json.loads(data or b"{}").get("message") or reason)
    except (ValueError, AttributeError):
        return str(reason)
