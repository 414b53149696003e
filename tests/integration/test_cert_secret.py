"""The webhook certificate Secret and caBundle injection against the real API server.

Each test uses a fresh namespace for the Secret and its own pair of webhook configurations
(cluster-scoped, named after the namespace), as the chart renders them: caBundle empty.
Time is injected through the clock, so an expiring certificate needs no waiting.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException

from controller.webhook.cert_secret import CertSecret, CertSecretError, Synced
from controller.webhook.certs import VALIDITY, covered_hosts
from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.test_operator import OperatorProcess, crds, forget_webhook_configs

__all__ = ["crds"]  # the CRDs fixture, for the operator's own test

pytestmark = pytest.mark.integration

SECRET = "vramgate-webhook-tls"
HOSTS = ["vramgate-webhook.vramgate.svc"]
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
KINDS = ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")


def _raw(api: client.ApiClient, method: str, path: str, body: object = None) -> dict:  # type: ignore[type-arg]
    serialized = api.param_serialize(
        method=method, resource_path=path, body=body, auth_settings=["BearerToken"],
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
    )  # fmt: skip
    response = api.call_api(*serialized)
    data = response.read()
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=data.decode())
    return dict(json.loads(data or b"{}"))


def _webhook(name: str) -> dict:  # type: ignore[type-arg]
    return {
        "name": name,
        "clientConfig": {"service": {"namespace": "vramgate", "name": "vramgate-webhook",
                                     "path": "/validate", "port": 443}},
        # A group nobody serves: these configurations never intercept a request.
        "rules": [{"apiGroups": ["nothing.example.test"], "apiVersions": ["v1"],
                   "operations": ["CREATE"], "resources": ["widgets"]}],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    }  # fmt: skip


@pytest.fixture
def configs(api_client: client.ApiClient, namespace: str) -> Iterator[str]:
    """A Validating- and a MutatingWebhookConfiguration named after the test's namespace,
    two webhooks each, no caBundle, as the chart renders them."""
    name = f"{namespace}.vramgate.dev"
    for kind in KINDS:
        body = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration"
            if kind.startswith("validating")
            else "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [_webhook(f"one.{name}"), _webhook(f"two.{name}")],
        }
        _raw(api_client, "POST", f"{ADMISSION}/{kind}", body)
    try:
        yield name
    finally:
        for kind in KINDS:
            _raw(api_client, "DELETE", f"{ADMISSION}/{kind}/{name}")


def _secret(api: client.ApiClient, namespace: str) -> dict:  # type: ignore[type-arg]
    return _raw(api, "GET", f"/api/v1/namespaces/{namespace}/secrets/{SECRET}")


def _data(secret: dict, key: str) -> bytes:  # type: ignore[type-arg]
    return base64.b64decode(secret["data"][key])


def _bundles(api: client.ApiClient, name: str) -> list[str | None]:
    found = []
    for kind in KINDS:
        for webhook in _raw(api, "GET", f"{ADMISSION}/{kind}/{name}")["webhooks"]:
            found.append(webhook["clientConfig"].get("caBundle"))
    return found


def _certs(
    api: client.ApiClient, namespace: str, cert_dir: Path, config: str | None,
    clock: dt.datetime | None = None,
) -> CertSecret:  # fmt: skip
    """A replica's CertSecret; `clock`: the moment it believes it is (default: now)."""
    if clock is None:
        return CertSecret(api, namespace, SECRET, HOSTS, cert_dir, config)
    return CertSecret(api, namespace, SECRET, HOSTS, cert_dir, config, clock=lambda: clock)


def test_a_missing_secret_is_created_and_its_ca_injected_into_both_configurations(
    api_client: client.ApiClient, namespace: str, configs: str, tmp_path: Path
) -> None:
    synced = _certs(api_client, namespace, tmp_path, configs).sync()
    assert synced.secret_written and synced.files_written
    assert synced.patched == ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    secret = _secret(api_client, namespace)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    ca, cert = _data(secret, "ca.crt"), _data(secret, "tls.crt")
    assert x509.load_pem_x509_certificate(cert).issuer == x509.load_pem_x509_certificate(ca).subject
    assert _bundles(api_client, configs) == [base64.b64encode(ca).decode()] * 4
    # The files kopf serves are the Secret's, and cover the Service and loopback.
    assert (tmp_path / "tls.crt").read_bytes() == cert
    assert (tmp_path / "ca.crt").read_bytes() == ca
    assert (tmp_path / "tls.key").read_bytes() == _data(secret, "tls.key")
    assert not (tmp_path / "ca.key").exists(), "the CA key stays in the Secret"
    assert {*HOSTS, "127.0.0.1", "localhost"} <= covered_hosts(tmp_path / "tls.crt")
    # Only caBundle changed: the chart's rules and policy are as they were.
    config = _raw(api_client, "GET", f"{ADMISSION}/{KINDS[0]}/{configs}")
    assert config["webhooks"][1]["failurePolicy"] == "Ignore"
    assert config["webhooks"][1]["clientConfig"]["service"]["path"] == "/validate"


def test_a_second_start_reuses_the_secret_and_writes_nothing(
    api_client: client.ApiClient, namespace: str, configs: str, tmp_path: Path
) -> None:
    _certs(api_client, namespace, tmp_path / "first", configs).sync()
    before = _secret(api_client, namespace)
    again = _certs(api_client, namespace, tmp_path / "second", configs).sync()
    after = _secret(api_client, namespace)
    assert not again.secret_written and again.patched == ()
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert (tmp_path / "second" / "tls.crt").read_bytes() == _data(before, "tls.crt")


def _race(makers: list[CertSecret]) -> list[Synced]:
    """Run each one's sync at the same moment; their results in order."""
    barrier = threading.Barrier(len(makers))
    results: list[Synced | BaseException | None] = [None] * len(makers)

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = makers[i].sync()
        except BaseException as error:  # reported below, in the test's thread
            results[i] = error

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(makers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for result in results:
        assert isinstance(result, Synced), result
    return [r for r in results if isinstance(r, Synced)]


def test_two_replicas_starting_at_once_end_with_one_secret_both_serve(
    api_client: client.ApiClient, namespace: str, configs: str, tmp_path: Path
) -> None:
    replicas = [
        _certs(_replica_client(api_client), namespace, tmp_path / f"r{i}", configs)
        for i in range(2)
    ]
    results = _race(replicas)
    assert sum(r.secret_written for r in results) == 1, "exactly one replica creates it"
    secret = _secret(api_client, namespace)
    for i in range(2):
        assert (tmp_path / f"r{i}" / "tls.crt").read_bytes() == _data(secret, "tls.crt")
    assert _bundles(api_client, configs) == [secret["data"]["ca.crt"]] * 4
    listed = _raw(api_client, "GET", f"/api/v1/namespaces/{namespace}/secrets")["items"]
    assert [s["metadata"]["name"] for s in listed if s["type"] == "kubernetes.io/tls"] == [SECRET]


def test_an_expiring_certificate_is_renewed_once_from_the_same_ca(
    api_client: client.ApiClient, namespace: str, configs: str, tmp_path: Path
) -> None:
    _certs(api_client, namespace, tmp_path / "r0", configs).sync()
    _certs(api_client, namespace, tmp_path / "r1", configs).sync()
    old = _secret(api_client, namespace)
    # 340 days on: within 30 days of the one-year certificate's end.
    later = dt.datetime.now(dt.UTC) + VALIDITY - dt.timedelta(days=25)
    replicas = [
        _certs(_replica_client(api_client), namespace, tmp_path / f"r{i}", configs, later)
        for i in range(2)
    ]
    results = _race(replicas)
    assert sum(r.secret_written for r in results) == 1, "exactly one replica renews it"
    assert all(r.files_written for r in results), "both now serve the renewed certificate"
    assert all(r.patched == () for r in results), "same CA: the caBundle stays"
    new = _secret(api_client, namespace)
    assert _data(new, "tls.crt") != _data(old, "tls.crt")
    assert _data(new, "ca.crt") == _data(old, "ca.crt")
    assert _data(new, "ca.key") == _data(old, "ca.key")
    renewed = x509.load_pem_x509_certificate(_data(new, "tls.crt"))
    assert renewed.not_valid_after_utc > later + dt.timedelta(days=300)
    for i in range(2):
        assert (tmp_path / f"r{i}" / "tls.crt").read_bytes() == _data(new, "tls.crt")


def test_a_caBundle_reset_by_an_upgrade_is_put_back(
    api_client: client.ApiClient, namespace: str, configs: str, tmp_path: Path
) -> None:
    certs = _certs(api_client, namespace, tmp_path, configs)
    certs.sync()
    path = f"{ADMISSION}/{KINDS[1]}/{configs}"
    config = _raw(api_client, "GET", path)
    config["webhooks"][0]["clientConfig"].pop("caBundle")
    _raw(api_client, "PUT", path, config)
    assert certs.sync().patched == ("MutatingWebhookConfiguration",)
    assert len(set(_bundles(api_client, configs))) == 1


def test_missing_configurations_are_logged_not_fatal(
    api_client: client.ApiClient, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="vramgate.webhook.certs")
    synced = _certs(api_client, namespace, tmp_path, f"absent-{namespace}.vramgate.dev").sync()
    assert synced.secret_written and synced.patched == ()
    assert "no ValidatingWebhookConfiguration absent-" in caplog.text


def test_someone_elses_secret_is_used_as_it_is_and_a_wrong_type_refused(
    api_client: client.ApiClient, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    generated = _certs(api_client, namespace, tmp_path / "gen", None).sync().material
    core = client.CoreV1Api(api_client)
    core.delete_namespaced_secret(SECRET, namespace)
    foreign = {k: base64.b64encode(v).decode() for k, v in
               (("tls.crt", generated.cert), ("tls.key", generated.key),
                ("ca.crt", generated.ca_cert))}  # fmt: skip
    _raw(api_client, "POST", f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET}, "data": foreign,
    })  # fmt: skip
    later = dt.datetime.now(dt.UTC) + VALIDITY - dt.timedelta(days=1)
    with caplog.at_level(logging.WARNING, logger="vramgate.webhook.certs"):
        synced = _certs(api_client, namespace, tmp_path / "use", None, later).sync()
    assert not synced.secret_written, "without ca.key it is not vramgate's to renew"
    assert synced.material.cert == generated.cert
    assert caplog.records == []  # valid a day longer: nothing to say
    # Expired (a leftover of cert-manager, say): still not ours, but the webhooks fail open
    # without a word unless the operator says it.
    expired = dt.datetime.now(dt.UTC) + VALIDITY + dt.timedelta(days=1)
    with caplog.at_level(logging.WARNING, logger="vramgate.webhook.certs"):
        synced = _certs(api_client, namespace, tmp_path / "old", None, expired).sync()
    assert not synced.secret_written
    (record,) = caplog.records
    assert "its certificate expired" in record.getMessage()
    assert "delete it and the operator makes its own" in record.getMessage()
    core.delete_namespaced_secret(SECRET, namespace)
    _raw(api_client, "POST", f"/api/v1/namespaces/{namespace}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET}, "data": foreign,
    })  # fmt: skip
    with pytest.raises(CertSecretError, match=r"has type 'Opaque'; it must be kubernetes\.io/tls"):
        _certs(api_client, namespace, tmp_path / "bad", None).sync()


def _replica_client(api: client.ApiClient) -> client.ApiClient:
    """A second ApiClient on the same configuration: a replica has its own connections."""
    return client.ApiClient(api.configuration)


def test_the_operator_serves_the_secrets_certificate(
    cluster: Cluster, api_client: client.ApiClient, crds: None, namespace: str, tmp_path: Path
) -> None:
    """`vramgate operator --cert-secret-name` end to end: the API server reaches the webhook
    over TLS with the Secret's CA (managed mode: the operator registers the caBundle it serves)."""
    config = f"{namespace}.vramgate.dev"
    process = OperatorProcess(
        cluster, api_client, tmp_path,
        extra=("--cert-secret-name", SECRET, "--lease-namespace", namespace,
               "--lease-name", f"lease-{namespace}", "--no-leader-election"),
        webhook_config=config,
    )  # fmt: skip
    try:
        process.start(webhook=True)
        secret = _secret(api_client, namespace)
        assert (tmp_path / "certs" / "tls.crt").read_bytes() == _data(secret, "tls.crt")
        served = _raw(api_client, "GET", f"{ADMISSION}/{KINDS[0]}/{config}")
        assert served["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    finally:
        process.stop()
        forget_webhook_configs(api_client, config)


def test_a_created_secret_is_owned_by_the_lease_kept_on_renewal_and_goes_with_it(
    api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """The chart makes the Lease: `helm uninstall` deletes it, and with it the Secret."""
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    lease = _raw(api_client, "POST", leases, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "vramgate-operator"}, "spec": {},
    })  # fmt: skip
    CertSecret(api_client, namespace, SECRET, HOSTS, tmp_path / "a", None,
               owner_lease="vramgate-operator").sync()  # fmt: skip
    owners = _secret(api_client, namespace)["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
        ("Lease", "vramgate-operator", lease["metadata"]["uid"])
    ]
    later = dt.datetime.now(dt.UTC) + VALIDITY - dt.timedelta(days=25)
    renewed = CertSecret(api_client, namespace, SECRET, HOSTS, tmp_path / "b", None,
                         clock=lambda: later, owner_lease="vramgate-operator").sync()  # fmt: skip
    assert renewed.secret_written
    assert _secret(api_client, namespace)["metadata"]["ownerReferences"] == owners
    _raw(api_client, "DELETE", f"{leases}/vramgate-operator")

    def gone() -> bool:
        try:
            _secret(api_client, namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_until(gone, timeout=60, what="the garbage collector to delete the Secret")


def test_a_secret_made_before_its_lease_existed_is_adopted_by_the_next_check(
    api_client: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    certs = CertSecret(api_client, namespace, SECRET, HOSTS, tmp_path, None,
                       owner_lease="vramgate-operator")  # fmt: skip
    certs.sync()
    assert not _secret(api_client, namespace)["metadata"].get("ownerReferences")
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    lease = _raw(api_client, "POST", leases, {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "vramgate-operator"}, "spec": {},
    })  # fmt: skip
    before = _secret(api_client, namespace)
    certs.sync()
    after = _secret(api_client, namespace)
    assert [o["uid"] for o in after["metadata"]["ownerReferences"]] == [lease["metadata"]["uid"]]
    assert after["data"] == before["data"], "the certificate itself is unchanged"
