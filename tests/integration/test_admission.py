"""Admission end to end: `kubectl apply` -> decision -> workload on the GPUs that hold it.

The operator runs as `vramgate operator` against the real local control plane; nodes are
kwok nodes with `nvidia.com/gpu` capacity, their GPUNodes written by the test as the agent
writes them (tests/integration/gpunodes.py), so each test chooses its GPUs' free memory.
Every test gets nodes of its own GPU product and selects them with `gpuSelector`, so tests
sharing the cluster and the operator never see each other's GPUs.

Reference jobs (calibrated profile): llama-3.1-8b QLoRA r=16 needs 11.64 GiB on one GPU;
llama-3.1-8b Full needs 86.09 GiB on one GPU, 45.49 GiB per GPU on 2 with FSDP.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from controller.api.base import GPU_RESOURCE, GROUP, JOB_LABEL, PRODUCT_LABEL, VERSION
from e2e.cluster import Cluster
from e2e.nodes import RUN_FOR_ANNOTATION
from e2e.wait import wait_until
from tests.integration.gpunodes import gpu_status, publish
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    PLURAL,
    OperatorProcess,
    condition,
    crds,
    events_for,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0
HOSTNAME_LABEL = "kubernetes.io/hostname"
WEBHOOK_CONFIG = "vramgate-admission.vramgate.dev"
QLORA = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
FULL = {"model": {"preset": "llama-3.1-8b"}, "method": "Full"}
QLORA_BYTES = 12_498_463_756  # 11.64 GiB, status.estimate.perGpuBytes of QLORA
DECIDED = {"Fits", "Resized", "Advised", "WaitingForVRAM", "WaitingForNodes", "WaitingForGPUs",
           "WaitingInQueue", "InsufficientVRAM", "NoMatchingGPU", "InsufficientGPUs",
           "SpecLocked"}  # fmt: skip


@pytest.fixture(scope="module")
def admitting(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster,
        api_client,
        tmp_path_factory.mktemp("admitting"),
        extra=("--resync-seconds", "2", "--heartbeat-ttl-seconds", "30",
               "--lease-name", "vramgate-admission-tests"),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=True)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


class Gpus:
    """Nodes of one test: their own GPU product, GPUNodes with the free memory asked for,
    kept fresh every few seconds as agents keep them (except those told to go silent)."""

    def __init__(self, cluster: Cluster, api: client.ApiClient) -> None:
        self.cluster, self.api = cluster, api
        self.tag = uuid.uuid4().hex[:8]
        self.product = f"TEST-{self.tag}-80GB"
        self.nodes: list[str] = []
        self.published: dict[str, tuple[list[float], float]] = {}
        #: Per node, the GPU indices a pod outside vramgate holds (its processes use what is
        #: not free): with the device plugin no other pod gets them.
        self.held: dict[str, set[int]] = {}
        self.silent: set[str] = set()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeats, daemon=True)
        self._beat.start()

    def _heartbeats(self) -> None:
        api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        try:
            while not self._stop.wait(5):
                for name, (frees, total) in list(self.published.items()):
                    if name not in self.silent:
                        self.publish(name, frees, total, api=api)
        finally:
            api.close()

    def close(self) -> None:
        self._stop.set()
        self._beat.join()

    @property
    def selector(self) -> dict[str, str]:
        return {PRODUCT_LABEL: self.product}

    def add(
        self, *frees: list[float], total: float = 80, held: dict[int, list[int]] | None = None
    ) -> list[str]:
        """One node per list, GPU i with frees[i] GiB free of `total` (as GPU feature
        discovery labels the Node too: until its GPUNode is seen, the GPUs count as large);
        `held`: per node (its position in this call), the GPUs a pod outside vramgate holds."""
        prefix = f"n{self.tag}-{len(self.nodes)}"
        names = self.cluster.create_gpu_nodes(
            len(frees), gpus_per_node=len(frees[0]), product=self.product, name_prefix=prefix,
            memory_mib=int(total * 1024),
        )  # fmt: skip
        for position, (name, free) in enumerate(zip(names, frees, strict=True)):
            self.held[name] = set((held or {}).get(position, []))
            self.publish(name, free, total)
        self.nodes += names
        self._wait_until_seen()
        return names

    def _wait_until_seen(self) -> None:
        """Until the webhook's view holds these GPUs (a dry run selecting them passes), as a
        user who just added nodes would see after a moment."""
        probe = job(f"probe-{self.tag}", self)
        wait_until(lambda: webhook_sees(self.api, probe), timeout=DEADLINE_S,
                   what=f"the operator to see {self.product}")  # fmt: skip

    def publish(
        self, name: str, frees: list[float], total: float = 80, api: Any = None, **kw: Any
    ) -> None:
        held = self.held.get(name, set())
        gpus = [
            gpu_status(name, i, total, f, self.product,
                       pods={f"other-{i}": total - f} if i in held else None)
            for i, f in enumerate(frees)
        ]  # fmt: skip
        publish(api or self.api, name, gpus, **kw)
        self.published[name] = (frees, total)


def wait_seen(gpus: Gpus, nodes: list[str]) -> None:
    """Until the operator's view holds every one of `nodes` (a dry run selecting each one by
    hostname passes the webhook), so a best fit is judged on all of them, not the first."""
    for node in nodes:
        probe = job(f"probe-{gpus.tag}", gpus, resources={
            "gpuSelector": {**gpus.selector, HOSTNAME_LABEL: node}})  # fmt: skip
        wait_until(lambda probe=probe: webhook_sees(gpus.api, probe), timeout=DEADLINE_S,
                   what=f"the operator to see {node}")  # fmt: skip


def webhook_sees(api: client.ApiClient, probe: dict[str, Any]) -> bool:
    """Whether a dry run of `probe` passes the webhook: False while the operator's view has
    no GPU matching its selector (NoMatchingGPU)."""
    try:
        objects(api).create_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, probe, dry_run="All"
        )
    except ApiException as error:
        if error.status == 422 and "NoMatchingGPU" in str(error.body):
            return False
        raise
    return True


@pytest.fixture
def gpus(cluster: Cluster, api_client: client.ApiClient) -> Iterator[Gpus]:
    made = Gpus(cluster, api_client)
    yield made
    made.close()
    core = client.CoreV1Api(api_client)
    for name in made.nodes:
        try:
            core.delete_node(name)
        except ApiException as error:
            if error.status != 404:
                raise


def job(name: str, gpus: Gpus, runs_for: str = "600s", **spec: Any) -> dict[str, Any]:
    resources = {"gpuSelector": gpus.selector, **spec.pop("resources", {})}
    template = {
        "metadata": {"annotations": {RUN_FOR_ANNOTATION: runs_for}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:v1"}]},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {**QLORA, "template": template, **spec, "resources": resources},
    }


def objects(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> None:
    objects(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(objects(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def admitted(
    api: client.ApiClient,
    namespace: str,
    name: str,
    status: str,
    reason: str | None = None,
    timeout: float = DEADLINE_S,
) -> dict[str, Any]:
    """Wait for Admitted=`status` (and `reason`); returns the job."""

    def met() -> dict[str, Any] | None:
        obj = get(api, namespace, name)
        found = condition(obj, "Admitted")
        if found and found["status"] == status and reason in (None, found["reason"]):
            return obj
        return None

    return wait_until(met, timeout=timeout, what=f"{name} Admitted={status} {reason or ''}")


def batch_job(api: client.ApiClient, namespace: str, name: str) -> client.V1Job:
    return wait_until(
        lambda: _read_job(api, namespace, name), timeout=DEADLINE_S, what=f"Job {name}"
    )


def _read_job(api: client.ApiClient, namespace: str, name: str) -> client.V1Job | None:
    try:
        return client.BatchV1Api(api).read_namespaced_job(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def placed(obj: dict[str, Any]) -> list[tuple[str, list[int]]]:
    return [(p["node"], p["gpuIndices"]) for p in obj["status"]["placement"]["nodes"]]


def env(container: client.V1Container) -> dict[str, str]:
    return {e.name: e.value for e in container.env or [] if e.value is not None}


# -- admit, resize, queue, reject ----------------------------------------------------------


def _wide_column(cluster: Cluster, namespace: str, name: str, column: str) -> str:
    """`column`'s cell of `kubectl get ftj NAME -o wide` (the server's table, as users see it)."""
    done = cluster.kubectl("get", "ftj", name, "-n", namespace, "-o", "wide")
    header, row = done.stdout.splitlines()
    return row[header.index(column) :].split()[0]


def test_a_job_is_admitted_onto_the_best_fitting_gpu_and_runs_there(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus,
    cluster: Cluster,
) -> None:  # fmt: skip
    # A pod outside vramgate holds GPU 3 of node. Of other's GPUs, free of pods, 13 GiB is the
    # tightest that holds 11.64 GiB, but the pod asks other for one GPU and its device plugin
    # may hand it GPU 2, of 10 GiB: other takes no such job.
    node, other = gpus.add([80, 30, 14, 10], [13, 80, 10, 80], held={0: [3]})
    wait_seen(gpus, [node, other])
    create(api_client, namespace, job("best-fit", gpus))
    obj = admitted(api_client, namespace, "best-fit", "True", "Fits")
    # 14 GiB is the least free memory of the GPUs node may hand out, and it holds 11.64 GiB.
    assert placed(obj) == [(node, [2])]
    assert _wide_column(cluster, namespace, "best-fit", "NODE") == node
    assert "GPU it may get (" in condition(obj, "Admitted")["message"]  # type: ignore[index]
    assert obj["status"]["placement"]["perGpuBytes"] == QLORA_BYTES
    assert obj["status"]["placement"]["nodes"][0]["gpuUUIDs"] == [f"GPU-{node}-2"]
    workload = batch_job(api_client, namespace, "best-fit")
    ref = _job_uid_recorded(api_client, namespace, "best-fit")  # recorded once it is made
    assert get(api_client, namespace, "best-fit")["status"]["workloadRef"] == {
        "apiVersion": "batch/v1", "kind": "Job", "name": "best-fit", "uid": ref,
    }  # fmt: skip
    assert ref == workload.metadata.uid
    pod_spec = workload.spec.template.spec
    trainer = pod_spec.containers[0]
    assert trainer.resources.limits == {"nvidia.com/gpu": "1"}
    assert env(trainer)["VRAMGATE_GPU_UUIDS"] == f"GPU-{node}-2"
    assert env(trainer)["VRAMGATE_PER_GPU_BYTES"] == str(QLORA_BYTES)
    assert workload.metadata.owner_references[0].kind == "FineTuneJob"
    pods = wait_until(
        lambda: (
            client.CoreV1Api(api_client)
            .list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}=best-fit")
            .items
        ),
        timeout=DEADLINE_S,
        what="the trainer pod",
    )
    assert wait_until(
        lambda: client.CoreV1Api(api_client).read_namespaced_pod(
            pods[0].metadata.name, namespace).spec.node_name,
        timeout=DEADLINE_S, what="the pod to be scheduled",
    ) == node  # fmt: skip
    running = wait_until(
        lambda: (c := condition(get(api_client, namespace, "best-fit"), "Running"))
        and c["status"] == "True" and c,
        timeout=DEADLINE_S, what="Running=True",
    )  # fmt: skip
    assert node in running["message"]


def test_resize_at_apply_rewrites_the_count_with_a_warning_kubectl_prints(
    admitting: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    gpus.add([80, 80, 80, 80])
    body = job("needs-two", gpus, admissionPolicy="Resize", **FULL, resources={"gpus": 1})

    # The operator's view must hold these nodes before the webhook can judge: retry dry runs.
    def applied() -> Any:
        done = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                               stdin=json.dumps(body))  # fmt: skip
        return done if "spec.resources.gpus 1 -> 2" in done.stderr else None

    wait_until(applied, timeout=DEADLINE_S, what="the mutating webhook to resize")
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    assert done.returncode == 0, done.stderr
    assert "Warning: vramgate: needs 2 GPUs with FSDP (45.49 GiB each): " \
        "spec.resources.gpus 1 -> 2" in done.stderr  # fmt: skip
    obj = admitted(api_client, namespace, "needs-two", "True", "Fits")
    assert obj["spec"]["resources"]["gpus"] == 2
    assert obj["status"]["placement"]["admittedGPUs"] == 2
    workload = batch_job(api_client, namespace, "needs-two")
    assert workload.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
    # The same manifest applied again (GitOps, `kubectl apply -f dir/` in a loop) is no edit
    # of the locked spec, though the stored count is the webhook's.
    again = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
    assert again.returncode == 0, again.stderr
    stored = get(api_client, namespace, "needs-two")
    assert stored["spec"]["resources"]["gpus"] == 2
    assert stored["metadata"]["annotations"]["vramgate.dev/requested-gpus"] == "1"

    # The cluster grew a GPU the job fits on as asked: resized afresh, the manifest's count
    # would now stay 1 and change the locked spec. The count annotated at create keeps it 2,
    # with kubectl's client-side apply and with server-side apply (the annotation, added by
    # the webhook after the API server assigned field owners, is owned by no applier).
    gpus.add([160], total=160)

    def fits_as_asked() -> Any:
        probe = {**body, "metadata": {**body["metadata"], "name": "probe-160"}}
        done = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                               stdin=json.dumps(probe))  # fmt: skip
        return done.returncode == 0 and "->" not in done.stderr

    wait_until(fits_as_asked, timeout=DEADLINE_S, what="the webhook to see the 160 GiB GPU")
    for how in ([], ["--server-side", "--force-conflicts"]):
        again = cluster.kubectl("apply", *how, "-n", namespace, "-f", "-", stdin=json.dumps(body))
        assert again.returncode == 0, (how, again.stderr)
        assert "spec.resources.gpus 1 -> 2, as resized when the job was created" in again.stderr
        stored = get(api_client, namespace, "needs-two")
        assert stored["spec"]["resources"]["gpus"] == 2, how
        assert stored["metadata"]["annotations"]["vramgate.dev/requested-gpus"] == "1", how


def test_resize_down_to_what_fits_now(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    gpus.add([80, 80, 5, 5], held={0: [2, 3]})  # two GPUs held by pods outside vramgate
    body = job("shrinks", gpus, admissionPolicy="Resize", resources={"gpus": 4, "minGPUs": 1})
    create(api_client, namespace, body)
    obj = admitted(api_client, namespace, "shrinks", "True", "Resized")
    assert obj["status"]["placement"]["requestedGPUs"] == 4
    assert obj["status"]["placement"]["admittedGPUs"] == 2
    assert "4 -> 2" in condition(obj, "Admitted")["message"]  # type: ignore[index]
    workload = batch_job(api_client, namespace, "shrinks")
    assert workload.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}


def test_a_queued_job_is_admitted_by_itself_when_another_finishes_or_is_deleted(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    gpus.add([80])
    create(api_client, namespace, job("first", gpus, runs_for="8s"))
    admitted(api_client, namespace, "first", "True", "Fits")
    create(api_client, namespace, job("second", gpus))
    waiting = admitted(api_client, namespace, "second", "False", "WaitingForVRAM")
    assert "needs 11.64 GiB per GPU on 1 GPU" in condition(waiting, "Admitted")["message"]  # type: ignore[index]
    # first's pod completes after 8 s (kwok); its Job succeeds; second takes the GPU.
    done = wait_until(
        lambda: (c := condition(get(api_client, namespace, "first"), "Succeeded"))
        and c["status"] == "True" and c,
        timeout=40, what="first to succeed",
    )  # fmt: skip
    assert done["reason"] == "Succeeded"
    admitted(api_client, namespace, "second", "True", "Fits", timeout=DEADLINE_S)

    create(api_client, namespace, job("third", gpus))
    admitted(api_client, namespace, "third", "False", "WaitingForVRAM")
    objects(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "second")
    # Its reservation goes at once, but its pod holds the GPU until the garbage collector has
    # deleted it (seconds; tens of seconds on a busy machine).
    admitted(api_client, namespace, "third", "True", "Fits", timeout=90)


@pytest.fixture
def tenant(api_client: client.ApiClient) -> Iterator[str]:
    """A second namespace: another team's, whose jobs share the queue."""
    core = client.CoreV1Api(api_client)
    name = f"tenant-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def high_class(api_client: client.ApiClient) -> Iterator[str]:
    """The name of a PriorityClass the test creates (cluster-scoped: deleted after it)."""
    name = f"high-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        client.SchedulingV1Api(api_client).delete_priority_class(name)
    except ApiException as error:
        if error.status != 404:
            raise


def test_a_raw_priority_jumps_no_queue_and_a_higher_priority_class_does(
    admitting: OperatorProcess, cluster: Cluster, api_client: client.ApiClient, namespace: str,
    tenant: str, high_class: str, gpus: Gpus,
) -> None:  # fmt: skip
    """One GPU, held for 30 s; then, one after the other, jobs of one shape: `older` in one
    namespace, `jumper` (spec.priority 1,000,000,000) and `classy` (a PriorityClass of value
    1000, created only once classy waits for it) in another. classy goes first, then older;
    jumper's number ranks nothing."""
    gpus.add([80])
    create(api_client, namespace, job("blocker", gpus, runs_for="30s"))
    admitted(api_client, namespace, "blocker", "True", "Fits")
    create(api_client, namespace, job("older", gpus, runs_for="8s"))
    admitted(api_client, namespace, "older", "False", "WaitingForVRAM")

    jumper = job("jumper", gpus, priority=1_000_000_000)
    done = cluster.kubectl("create", "-n", tenant, "-f", "-", stdin=json.dumps(jumper))
    assert done.returncode == 0, done.stderr
    assert (
        f"Warning: vramgate: spec.priority 1000000000 is ignored: only the namespaces an "
        f"administrator lists in the operator's rawPriorityNamespaces may set a raw priority, "
        f"and {tenant} is not one"
    ) in done.stderr

    def said(ns: str, name: str) -> dict[str, Any]:
        return condition(get(api_client, ns, name), "Admitted") or {}

    admitted(api_client, tenant, "jumper", "False", "WaitingForVRAM")
    assert "warning: spec.priority 1000000000 is ignored" in said(tenant, "jumper")["message"]

    create(api_client, tenant, job("classy", gpus, runs_for="8s", priorityClassName=high_class))
    admitted(api_client, tenant, "classy", "False", "PriorityClassUnavailable")
    assert f"no PriorityClass named '{high_class}'" in said(tenant, "classy")["message"]
    client.SchedulingV1Api(api_client).create_priority_class(
        {"metadata": {"name": high_class}, "value": 1000}
    )
    admitted(api_client, tenant, "classy", "False", "WaitingForVRAM")

    # The blocker ends after 30 s: classy, though created last, takes the GPU.
    admitted(api_client, tenant, "classy", "True", "Fits", timeout=90)
    for ns, name in ((namespace, "older"), (tenant, "jumper")):
        assert said(ns, name)["reason"] == "WaitingForVRAM", name
    # classy ends after 8 s: then the older job, whatever the other's spec.priority.
    admitted(api_client, namespace, "older", "True", "Fits", timeout=90)
    assert said(tenant, "jumper")["reason"] == "WaitingForVRAM"


def refused_at_apply(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str:
    """The webhook's 422 message for `body`, once the operator's view holds the test's GPUs
    (until then the webhook lets it through: the job is deleted and tried again)."""
    name = body["metadata"]["name"]

    def refused() -> str | None:
        try:
            create(api, namespace, body)
        except ApiException as error:
            return str(error.body) if error.status == 422 else None
        objects(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return None

    return str(wait_until(refused, timeout=DEADLINE_S, what="the webhook to refuse"))


def test_a_job_that_never_fits_is_refused_at_apply_with_the_numbers(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    gpus.add([80, 80])
    body = job("too-big", gpus, model={"preset": "llama-3.1-70b"}, method="Full")
    message = refused_at_apply(api_client, namespace, body)
    assert "InsufficientVRAM" in message
    assert "needs 745.02 GiB per GPU on 1 GPU with FSDP; the largest GPU holds 80.00 GiB" in message
    assert "at least 10 GPUs of that size would hold it with FSDP" in message


def test_a_template_the_workload_cannot_use_is_refused_at_apply(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """The operator would record InvalidSpec (it builds the workload before any GPU is
    promised); the webhook says so at `kubectl apply` time instead."""
    gpus.add([80])
    body = job("pinned", gpus)
    body["spec"]["template"]["spec"]["nodeName"] = "somewhere"
    message = refused_at_apply(api_client, namespace, body)
    assert "spec.template.spec.nodeName: must not be set; admission chooses the node" in message


def test_a_pod_template_the_job_api_refuses_is_refused_at_apply_with_its_message(
    admitting: OperatorProcess,
    cluster: Cluster,
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,
) -> None:
    """The CRD keeps any template; the Job API refused it only once the job was admitted
    and its GPU promised. The webhook's dry run of the batch Job gets the API server's own
    words at `kubectl apply`."""
    gpus.add([80])
    bad_name = job("bad-name", gpus)
    bad_name["spec"]["template"]["spec"]["containers"][0]["name"] = "Trainer_1"
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(bad_name))
    assert applied.returncode != 0, applied
    assert "spec.template: the Job API refuses the batch Job the operator would create" in (
        applied.stderr
    )
    said = 'Job.batch "bad-name" is invalid: spec.template.spec.containers[0].name: Invalid value'
    assert f'{said}: "Trainer_1"' in applied.stderr, applied.stderr
    bad_quantity = job("bad-quantity", gpus)
    bad_quantity["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "abc"}
    }
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(bad_quantity))
    assert applied.returncode != 0, applied
    assert "cannot be handled as a Job: quantities must match" in applied.stderr, applied.stderr
    assert "spec.template.spec.containers[0].resources.limits.memory: 'abc'" in applied.stderr
    assert _read_job(api_client, namespace, "bad-name") is None
    # What the operator puts in place of the template's own nvidia.com/gpu is what is judged:
    # a count the device plugin cannot read is replaced by the admitted one.
    own_count = job("own-count", gpus)
    own_count["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {GPU_RESOURCE: "abc"}
    }
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(own_count))
    assert applied.returncode == 0, applied.stderr
    admitted(api_client, namespace, "own-count", "True", "Fits")
    container = batch_job(api_client, namespace, "own-count").spec.template.spec.containers[0]
    assert container.resources.limits[GPU_RESOURCE] == "1"


def test_the_namespaces_own_policies_never_refuse_a_job_through_the_dry_run(
    admitting: OperatorProcess,
    cluster: Cluster,
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,
) -> None:
    """A ValidatingAdmissionPolicy that denies every Job in the namespace answers the dry run
    422 too; it is not the template's fault (and may change before the job is admitted): the
    job is let through, the operator reports what happens at the real create."""
    gpus.add([80])
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"no-jobs-{namespace}"
    admission.create_validating_admission_policy({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["jobs"]}]},
            "validations": [{"expression": "false", "message": "no Jobs here"}],
        },
    })  # fmt: skip
    admission.create_validating_admission_policy_binding({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    })  # fmt: skip
    try:
        probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"},
                 "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                     {"name": "c", "image": "c:v1"}]}}}}  # fmt: skip

        def denied() -> bool:  # policies take effect a moment after they are created
            try:
                client.BatchV1Api(api_client).create_namespaced_job(namespace, probe, dry_run="All")
            except ApiException as error:
                return error.status == 422 and "no Jobs here" in str(error.body)
            return False

        wait_until(denied, timeout=DEADLINE_S, what="the policy to deny Jobs")
        body = job("policed", gpus)
        applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(body))
        assert applied.returncode == 0, applied.stderr
        assert "dry run of Job " + namespace + "/policed answered 422 Invalid" in (
            admitting.log_since_start()
        )
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_without_the_webhook_a_job_that_never_fits_is_rejected_in_status(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    gpus.add([80, 80])
    admitting.restart(webhook=False)
    try:
        body = job("too-big", gpus, model={"preset": "llama-3.1-70b"}, method="Full")
        create(api_client, namespace, body)
        obj = admitted(api_client, namespace, "too-big", "False", "InsufficientVRAM")
    finally:
        admitting.restart(webhook=True)
    message = condition(obj, "Admitted")["message"]  # type: ignore[index]
    assert "needs 745.02 GiB per GPU on 1 GPU with FSDP; the largest GPU holds 80.00 GiB" in message
    assert "placement" not in obj["status"]
    assert _read_job(api_client, namespace, "too-big") is None


def test_a_silent_agent_or_a_cordoned_node_gets_nothing(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    silent, cordoned, good = gpus.add([20], [16], [80])
    gpus.silent.add(silent)
    gpus.publish(silent, [20], heartbeat=datetime.now(UTC) - timedelta(seconds=120))
    client.CoreV1Api(api_client).patch_node(cordoned, {"spec": {"unschedulable": True}})
    admitting.await_passes()  # passes see the stale heartbeat and the cordon
    create(api_client, namespace, job("avoids", gpus))
    obj = admitted(api_client, namespace, "avoids", "True", "Fits")
    # The two tighter GPUs (20 and 16 GiB free) are on nodes that may take nothing.
    assert placed(obj) == [(good, [0])]


def test_a_deleted_gpunode_is_waited_for_never_taken_for_a_smaller_cluster(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """b's GPUNode is deleted (its agent would make it again in a moment) while a is full:
    a job that fits b waits for it, naming it; an 8-GPU job, more than a alone has, is
    neither refused at apply nor rejected; and once b reports again, the first is admitted
    there."""
    _, b = gpus.add([5] * 4, [80] * 4)
    gpus.silent.add(b)
    objects(api_client).delete_cluster_custom_object(GROUP, VERSION, "gpunodes", b)
    create(api_client, namespace, job("one", gpus))
    waits = admitted(api_client, namespace, "one", "False", "WaitingForNodes")
    said = condition(waits, "Admitted")["message"]  # type: ignore[index]
    assert f"it would fit now on {b}, which takes no work now (GPUs not yet reported by its " \
        "vramgate agent)" in said  # fmt: skip

    eight = job("eight", gpus, **FULL, resources={"gpus": 8})
    create(api_client, namespace, eight)  # through the webhook, which sees what the loop sees
    queued = admitted(api_client, namespace, "eight", "False", "WaitingForVRAM")
    message = condition(queued, "Admitted")["message"]  # type: ignore[index]
    assert f"{b}: GPUs not yet reported by its vramgate agent" in message, message

    gpus.silent.discard(b)
    gpus.publish(b, [80] * 4)
    obj = admitted(api_client, namespace, "one", "True", "Fits")
    assert placed(obj)[0][0] == b


def test_a_job_is_placed_only_where_its_pod_template_lets_its_pods_run(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """The tighter GPUs are on a node the template's nodeSelector excludes and on one whose
    taint it does not tolerate. Placed on either, the real scheduler would leave its pod
    Pending (Unschedulable) with the GPU held for nothing."""
    tainted, unselected, good = gpus.add([16], [20], [80])
    core = client.CoreV1Api(api_client)
    pool = {"pool": f"p{gpus.tag}"}
    for name in (tainted, good):
        core.patch_node(name, {"metadata": {"labels": pool}})
    taint = {"key": "dedicated", "value": "team-x", "effect": "NoSchedule"}
    core.patch_node(tainted, {"spec": {"taints": [taint]}})
    admitting.await_passes()  # passes see the labels and the taint

    body = job("selects", gpus)
    body["spec"]["template"]["spec"]["nodeSelector"] = pool
    create(api_client, namespace, body)
    assert placed(admitted(api_client, namespace, "selects", "True", "Fits")) == [(good, [0])]
    pod = wait_until(
        lambda: [p for p in core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}=selects").items
            if p.status.phase == "Running"],
        timeout=DEADLINE_S, what="the trainer to run",
    )[0]  # fmt: skip
    assert pod.spec.node_name == good

    body = job("tolerates", gpus)
    body["spec"]["template"]["spec"] |= {
        "nodeSelector": pool,
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
    }
    create(api_client, namespace, body)
    assert placed(admitted(api_client, namespace, "tolerates", "True", "Fits")) == [(tainted, [0])]
    assert unselected not in {p.spec.node_name for p in core.list_namespaced_pod(namespace).items}


def test_an_oom_killed_trainer_is_reported_as_such(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus,
    cluster: Cluster,
) -> None:  # fmt: skip
    gpus.add([80])
    create(api_client, namespace, job("ooms", gpus))
    admitted(api_client, namespace, "ooms", "True", "Fits")
    core = client.CoreV1Api(api_client)
    pod = wait_until(
        lambda: [p for p in core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}=ooms")
                 .items if p.status.phase == "Running"],
        timeout=DEADLINE_S, what="the trainer to run",
    )[0]  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "trainer", "image": "trainer:v1", "imageID": "", "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                     "startedAt": now, "finishedAt": now}},
        }],
    }})  # fmt: skip
    failed = wait_until(
        lambda: (c := condition(get(api_client, namespace, "ooms"), "Failed"))
        and c["status"] == "True" and c,
        timeout=DEADLINE_S, what="Failed=True",
    )  # fmt: skip
    assert failed["reason"] == "OOMKilled"
    assert "OOMKilled" in failed["message"] and pod.metadata.name in failed["message"]
    # `kubectl get ftj` tells it from a running job (Admitted stays True, as in Kueue).
    header, row = cluster.kubectl("get", "ftj", "ooms", "-n", namespace).stdout.splitlines()
    assert row[header.index("WORKLOAD") :].split()[0] == "OOMKilled", (header, row)
    # The fix its message suggests is a new job: an edit of the finished one is refused.
    edited = cluster.kubectl("patch", "ftj", "ooms", "-n", namespace, "--type", "merge",
                             "-p", '{"spec": {"training": {"microBatchSize": 2}}}')  # fmt: skip
    assert edited.returncode != 0 and "delete it and apply it again" in edited.stderr, edited


def test_a_workload_the_api_server_refuses_for_now_is_retried_with_backoff_and_said_on_the_job(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """A ResourceQuota that allows no Job (403, which may pass): the operator says why in a
    Warning Event and retries after 1, 2, 4 ... s, not on every pass (it retried ten times a
    second, a traceback each time); the job keeps its GPU, and its workload follows once the
    quota allows it."""
    gpus.add([80])
    core = client.CoreV1Api(api_client)
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-jobs"),
        spec=client.V1ResourceQuotaSpec(hard={"count/jobs.batch": "0"}),
    )
    core.create_namespaced_resource_quota(namespace, quota)
    create(api_client, namespace, job("over-quota", gpus))
    admitted(api_client, namespace, "over-quota", "True", "Fits")
    warned = wait_until(
        lambda: [e for e in events_for(api_client, namespace, "over-quota")
                 if e.reason == "WorkloadNotCreated"],
        timeout=DEADLINE_S, what="a WorkloadNotCreated event",
    )  # fmt: skip
    assert warned[0].type == "Warning"
    assert "cannot create Job over-quota" in warned[0].message
    assert "exceeded quota" in warned[0].message and "retrying in" in warned[0].message
    time.sleep(6)  # tries 0.5-1, 1-2, 2-4 s apart: five at most, where every pass retried
    log = admitting.log_path.read_text(errors="replace")
    tries = [line for line in log.splitlines() if "cannot create Job over-quota" in line]
    assert 1 <= len(tries) <= 5, tries
    assert "Traceback" not in log[log.find(tries[0]) :], "a refusal is one line, not a traceback"
    assert condition(get(api_client, namespace, "over-quota"), "Admitted")["status"] == "True"  # type: ignore[index]
    core.delete_namespaced_resource_quota("no-jobs", namespace)
    wait_until(lambda: _read_job(api_client, namespace, "over-quota"), timeout=30,
               what="the workload once the quota allows it")  # fmt: skip


def test_a_template_the_job_api_refuses_releases_the_gpus_until_the_spec_is_fixed(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """A pod template the CRD keeps but the Job API refuses (422, an invalid container name)
    held its GPU for good behind a stream of Warnings; now the job gives it back at once with
    the API server's message (InvalidTemplate), and a fixed spec is admitted again. (The
    webhook is off: it refuses such a template at apply time.)"""
    gpus.add([80])
    admitting.restart(webhook=False)
    try:
        body = job("bad-template", gpus)
        body["spec"]["template"]["spec"]["containers"] = [{"name": "Bad_Name", "image": "x"}]
        create(api_client, namespace, body)
        refused = admitted(api_client, namespace, "bad-template", "False", "InvalidTemplate")
        message = condition(refused, "Admitted")["message"]  # type: ignore[index]
        assert "refuses the workload built from spec.template" in message
        assert "containers[0].name" in message, message
        assert "placement" not in refused["status"]
        create(api_client, namespace, job("next-in-line", gpus))
        admitted(api_client, namespace, "next-in-line", "True", "Fits")
        assert _read_job(api_client, namespace, "bad-template") is None
        warnings = [e.reason for e in events_for(api_client, namespace, "bad-template")]
        assert "InvalidTemplate" in warnings, warnings
        admitting.await_passes()  # not decided again at the same spec
        again = get(api_client, namespace, "bad-template")
        assert condition(again, "Admitted")["reason"] == "InvalidTemplate"  # type: ignore[index]

        objects(api_client).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "next-in-line"
        )
        fixed = {**body["spec"]["template"], "spec": {"containers": [
            {"name": "trainer", "image": "trainer:v1"}]}}  # fmt: skip
        objects(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "bad-template", {"spec": {"template": fixed}}
        )
        admitted(api_client, namespace, "bad-template", "True", "Fits", timeout=90)
        batch_job(api_client, namespace, "bad-template")
    finally:
        admitting.restart(webhook=True)


def _job_uid_recorded(api: client.ApiClient, namespace: str, name: str) -> str:
    def recorded() -> str | None:
        ref = (get(api, namespace, name).get("status") or {}).get("workloadRef") or {}
        return ref.get("uid")

    return wait_until(recorded, timeout=DEADLINE_S, what=f"{name}'s workload uid in status")


def test_deleting_a_running_jobs_workload_stops_it_for_good_and_frees_its_gpu(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """`kubectl delete job` under a running FineTuneJob made a fresh Job within seconds: the
    training silently started again. Deleting the workload now stops the job."""
    gpus.add([80])
    create(api_client, namespace, job("stoppable", gpus))
    admitted(api_client, namespace, "stoppable", "True", "Fits")
    first = batch_job(api_client, namespace, "stoppable")
    assert _job_uid_recorded(api_client, namespace, "stoppable") == first.metadata.uid
    assert first.metadata.labels["vramgate.dev/finetunejob"] == "stoppable"
    wait_until(
        lambda: (c := condition(get(api_client, namespace, "stoppable"), "Running"))
        and c["status"] == "True",
        timeout=40, what="stoppable to run",
    )  # fmt: skip
    create(api_client, namespace, job("behind", gpus))
    admitted(api_client, namespace, "behind", "False", "WaitingForVRAM")

    client.BatchV1Api(api_client).delete_namespaced_job(
        "stoppable", namespace, propagation_policy="Background"
    )
    failed = wait_until(
        lambda: (c := condition(get(api_client, namespace, "stoppable"), "Failed"))
        and c["status"] == "True" and c,
        timeout=DEADLINE_S, what="stoppable to fail",
    )  # fmt: skip
    assert failed["reason"] == "WorkloadDeleted"
    assert "delete this FineTuneJob and apply it again" in failed["message"]
    # The Event goes out once the status write has landed: a moment after the condition.
    wait_until(
        lambda: "WorkloadDeleted" in {
            e.reason for e in events_for(api_client, namespace, "stoppable")},
        timeout=DEADLINE_S, what="the WorkloadDeleted Event",
    )  # fmt: skip
    admitted(api_client, namespace, "behind", "True", "Fits", timeout=90)  # the GPU is free
    admitting.await_passes()  # no Job of the stopped job comes back
    again = _read_job(api_client, namespace, "stoppable")
    assert again is None or again.metadata.uid == first.metadata.uid, "it never runs again"


def test_a_job_that_finished_and_was_cleaned_up_while_the_operator_was_down_never_runs_again(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """The operator down while the completed Job is deleted (what ttlSecondsAfterFinished
    does): the restarted operator created it again, and the whole training ran twice. Now
    the Job controller's Events of the recorded uid say it completed."""
    gpus.add([80])
    create(api_client, namespace, job("once", gpus, runs_for="3s"))
    admitted(api_client, namespace, "once", "True", "Fits")
    uid = _job_uid_recorded(api_client, namespace, "once")
    admitting.kill()
    try:
        batch = client.BatchV1Api(api_client)
        wait_until(
            lambda: any(c.type == "Complete" and c.status == "True"
                        for c in (batch_job(api_client, namespace, "once").status.conditions
                                  or [])),
            timeout=60, what="the Job to complete",
        )  # fmt: skip
        batch.delete_namespaced_job("once", namespace, propagation_policy="Background")
        wait_until(lambda: _read_job(api_client, namespace, "once") is None, timeout=DEADLINE_S,
                   what="the Job to go")  # fmt: skip
    finally:
        admitting.start(webhook=True)
    succeeded = wait_until(
        lambda: (c := condition(get(api_client, namespace, "once"), "Succeeded"))
        and c["status"] == "True" and c,
        timeout=DEADLINE_S, what="once to succeed",
    )  # fmt: skip
    assert "its Events say so" in succeeded["message"]
    admitting.await_passes()
    assert _read_job(api_client, namespace, "once") is None, "the training never runs twice"
    runs = [e for e in events_for(api_client, namespace, "once") if e.reason == "SuccessfulCreate"]
    assert {e.involved_object.uid for e in runs} == {uid}, "one Job, one run"


def test_a_workload_name_taken_by_another_job_is_said_and_the_workload_follows_once_free(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    """A batch Job of the FineTuneJob's name that it does not own: the 409 on create meant
    "made by an earlier pass", so the job held its GPU for good with no workload and no word
    (`Job  is created`). Now a Warning says whose name it is, and once that Job is gone the
    operator's own is created on the next try."""
    gpus.add([80])
    foreign = client.V1Job(
        metadata=client.V1ObjectMeta(name="taken"),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[client.V1Container(name="other", image="other:v1")],
                node_selector={"no-such-node": "true"},
            )),
        ),
    )  # fmt: skip
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, foreign)
    create(api_client, namespace, job("taken", gpus))
    admitted(api_client, namespace, "taken", "True", "Fits")
    warned = wait_until(
        lambda: [e for e in events_for(api_client, namespace, "taken")
                 if e.reason == "WorkloadNotCreated"],
        timeout=DEADLINE_S, what="a WorkloadNotCreated event",
    )  # fmt: skip
    assert "a Job named taken already exists" in warned[0].message, warned[0].message
    assert "is not this FineTuneJob's" in warned[0].message
    running = wait_until(
        lambda: next((c for c in get(api_client, namespace, "taken")["status"]["conditions"]
                      if c["type"] == "Running"), None),
        timeout=DEADLINE_S, what="a Running condition",
    )  # fmt: skip
    assert "Job  is" not in running["message"], running
    batch.delete_namespaced_job("taken", namespace, propagation_policy="Background")
    workload = wait_until(
        lambda: (found := _read_job(api_client, namespace, "taken")) is not None
        and any(ref.kind == "FineTuneJob" for ref in found.metadata.owner_references or [])
        and found,
        timeout=30, what="the FineTuneJob's own Job, once the name is free",
    )  # fmt: skip
    assert workload.metadata.owner_references[0].name == "taken"


def test_fsdp_across_nodes_runs_as_an_indexed_job_with_the_torchrun_rendezvous(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus,
    cluster: Cluster,
) -> None:  # fmt: skip
    first, second = gpus.add([80, 80], [80, 80])
    create(api_client, namespace, job("spread", gpus, **FULL, resources={"gpus": 4}))
    obj = admitted(api_client, namespace, "spread", "True", "Fits")
    assert placed(obj) == [(first, [0, 1]), (second, [0, 1])]
    # A column holds one value: the API server prints a path's first match.
    assert _wide_column(cluster, namespace, "spread", "NODE") == first
    workload = batch_job(api_client, namespace, "spread")
    assert (workload.spec.completion_mode, workload.spec.completions,
            workload.spec.parallelism) == ("Indexed", 2, 2)  # fmt: skip
    service = client.CoreV1Api(api_client).read_namespaced_service("spread", namespace)
    assert service.spec.cluster_ip == "None"
    trainer = workload.spec.template.spec.containers[0]
    values = env(trainer)
    assert (values["NNODES"], values["NPROC_PER_NODE"]) == ("2", "2")
    assert values["MASTER_ADDR"] == "spread-0.spread"
    rank = next(e for e in trainer.env if e.name == "NODE_RANK")
    assert "job-completion-index" in rank.value_from.field_ref.field_path
    assert trainer.resources.limits == {"nvidia.com/gpu": "2"}
    core = client.CoreV1Api(api_client)
    nodes = wait_until(
        lambda: (found := {p.spec.node_name for p in core.list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}=spread").items}) == {first, second}
        and found,
        timeout=DEADLINE_S, what="one pod on each chosen node",
    )  # fmt: skip
    assert nodes == {first, second}


def test_suspend_releases_the_gpus_and_resume_admits_again_and_the_spec_is_locked(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    gpus.add([80])
    create(api_client, namespace, job("pausable", gpus))
    admitted(api_client, namespace, "pausable", "True", "Fits")
    with pytest.raises(ApiException) as refused:
        objects(api_client).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "pausable", {"spec": {"training": {
                "sequenceLength": 4096}}},
        )  # fmt: skip
    assert "only spec.suspend may change" in str(refused.value.body)

    create(api_client, namespace, job("waits", gpus))
    admitted(api_client, namespace, "waits", "False", "WaitingForVRAM")
    objects(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "pausable", {"spec": {"suspend": True}}
    )
    obj = admitted(api_client, namespace, "pausable", "False", "Suspended")
    assert "placement" not in obj["status"]
    admitted(api_client, namespace, "waits", "True", "Fits")
    wait_until(lambda: _read_job(api_client, namespace, "pausable") is None,
               timeout=DEADLINE_S, what="the suspended workload to go")  # fmt: skip


# -- reliability ---------------------------------------------------------------------------


def _sizes(api: client.ApiClient, nodes: list[str]) -> dict[tuple[str, int], int]:
    """Free bytes of each GPU as published."""
    out = {}
    for name in nodes:
        gpunode = objects(api).get_cluster_custom_object(GROUP, VERSION, "gpunodes", name)
        for g in gpunode["status"]["gpus"]:
            out[(name, g["index"])] = g["freeBytes"]
    return out


def _check_ledger(
    api: client.ApiClient, namespace: str, free: dict[tuple[str, int], int]
) -> list[dict[str, Any]]:
    """Every job decided, no GPU promised more than it had free, no GPU given twice
    (whole GPUs: devicePlugin), and one workload per admitted job; returns the jobs."""
    listed = objects(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    jobs = listed["items"]
    undecided = [j["metadata"]["name"] for j in jobs
                 if (condition(j, "Admitted") or {}).get("reason") not in DECIDED]  # fmt: skip
    assert not undecided, f"{len(undecided)} jobs undecided, e.g. {undecided[:5]}"
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    charged: dict[tuple[str, int], int] = defaultdict(int)
    for j in jobs:
        if (condition(j, "Admitted") or {}).get("status") != "True":
            continue
        placement = j["status"]["placement"]
        for part in placement["nodes"]:
            for index in part["gpuIndices"]:
                holders[(part["node"], index)].append(j["metadata"]["name"])
                charged[(part["node"], index)] += placement["perGpuBytes"]
    twice = {gpu: names for gpu, names in holders.items() if len(names) > 1}
    assert not twice, f"GPUs given to several jobs: {twice}"
    over = {gpu: (b, free[gpu]) for gpu, b in charged.items() if b > free[gpu]}
    assert not over, f"GPUs promised more than they had free: {over}"
    workloads = client.BatchV1Api(api).list_namespaced_job(namespace).items
    per_job: dict[str, int] = defaultdict(int)
    for w in workloads:
        per_job[w.metadata.labels.get(JOB_LABEL, "")] += 1
    admitted_names = {j["metadata"]["name"] for j in jobs
                      if (condition(j, "Admitted") or {}).get("status") == "True"}  # fmt: skip
    assert {n for n, c in per_job.items() if c > 1} == set(), "a workload was duplicated"
    assert set(per_job) <= admitted_names, "a workload exists for a job not admitted"
    wait_until(
        lambda: admitted_names <= {
            w.metadata.labels.get(JOB_LABEL) for w in client.BatchV1Api(api)
            .list_namespaced_job(namespace).items},
        timeout=DEADLINE_S, what="a workload for every admitted job",
    )  # fmt: skip
    return list(jobs)


def _drain(api: client.ApiClient, namespace: str) -> None:
    """Delete every job of a big test and wait for their pods to go, so the next tests do
    not run while the garbage collector works through hundreds of objects."""
    objects(api).delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    core = client.CoreV1Api(api)
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, timeout=120,
               what="the big test's pods to go")  # fmt: skip


def _mixed_cluster(gpus: Gpus) -> list[str]:
    a = gpus.add([80] * 8, [80, 80, 80, 80, 40, 40, 40, 40])
    b = gpus.add([24] * 8, [48] * 8, total=48)
    return a + b


def _random_job(rng: random.Random, name: str, gpus: Gpus) -> dict[str, Any]:
    kind = rng.choice(["qlora", "qlora", "qlora-ddp", "full-fsdp", "resize"])
    if kind == "qlora":
        return job(name, gpus)
    if kind == "qlora-ddp":
        return job(name, gpus, parallelism="DDP", resources={"gpus": 2})
    if kind == "full-fsdp":
        return job(name, gpus, **FULL, resources={"gpus": rng.choice([2, 4, 8])})
    return job(name, gpus, **FULL, admissionPolicy="Resize", resources={"gpus": 1, "maxGPUs": 8})


def test_200_jobs_from_20_clients_never_overbook_a_gpu(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus,
    cluster: Cluster,
) -> None:  # fmt: skip
    nodes = _mixed_cluster(gpus)
    free = _sizes(api_client, nodes)
    rng = random.Random(200)
    bodies = [_random_job(rng, f"j{i:03d}", gpus) for i in range(200)]
    errors: list[BaseException] = []

    def client_thread(k: int) -> None:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        try:
            for body in bodies[k::20]:
                create(api, namespace, body)
        except BaseException as error:
            errors.append(error)
        finally:
            api.close()

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    wait_until(lambda: _all_decided(api_client, namespace, 200), timeout=90,
               what="every job decided")  # fmt: skip
    jobs = _check_ledger(api_client, namespace, free)
    assert sum((condition(j, "Admitted") or {}).get("status") == "True" for j in jobs) >= 8
    _drain(api_client, namespace)


def _all_decided(api: client.ApiClient, namespace: str, count: int) -> bool:
    jobs = objects(api).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
    decided = [j for j in jobs if (condition(j, "Admitted") or {}).get("reason") in DECIDED]
    return len(jobs) == count and len(decided) == count


def test_sigkill_ten_times_during_300_jobs_loses_nothing_and_duplicates_nothing(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus
) -> None:
    nodes = _mixed_cluster(gpus)
    free = _sizes(api_client, nodes)
    rng = random.Random(300)
    created = 0
    for _ in range(10):
        for _job in range(30):
            create(api_client, namespace, _random_job(rng, f"k{created:03d}", gpus))
            created += 1
        time.sleep(rng.uniform(0.0, 1.5))
        admitting.kill()
        admitting.start(webhook=True)
    wait_until(lambda: _all_decided(api_client, namespace, 300), timeout=120,
               what="every job decided")  # fmt: skip
    _check_ledger(api_client, namespace, free)
    assert admitting.starts >= 11
    _drain(api_client, namespace)


def test_two_replicas_elect_one_leader_and_the_standby_takes_over_when_it_dies(
    admitting: OperatorProcess, api_client: client.ApiClient, namespace: str, gpus: Gpus,
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    gpus.add([80, 80])
    standby = OperatorProcess(
        cluster, api_client, tmp_path_factory.mktemp("standby"),
        extra=admitting.extra, webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    standby.start(webhook=False)
    try:
        create(api_client, namespace, job("before", gpus))
        admitted(api_client, namespace, "before", "True", "Fits")
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
            "vramgate-admission-tests", "default"
        )
        assert lease.spec.holder_identity.startswith("admitting")
        assert "holding the Lease" not in standby.log_since_start()

        admitting.kill()  # the leader dies without handing the Lease back
        create(api_client, namespace, job("after", gpus))
        # The standby waits out the Lease (15 s), lists every job, then decides.
        obj = admitted(api_client, namespace, "after", "True", "Fits", timeout=45)
        assert placed(obj) != placed(get(api_client, namespace, "before")), "GPU given twice"
        assert "holding the Lease" in standby.log_since_start()
    finally:
        standby.stop()
        if admitting.proc is None:
            admitting.start(webhook=True)
