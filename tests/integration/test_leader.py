"""The Lease on the real API server: renewals change only its spec, so the chart's labels and
Helm's ownership annotations on a chart-made Lease survive leader election."""

from __future__ import annotations

from kubernetes import client

from controller.kube import Kube
from controller.operator.leader import Leader


def test_acquiring_and_renewing_keep_the_leases_labels_and_annotations(
    api_client: client.ApiClient, namespace: str
) -> None:
    coordination = client.CoordinationV1Api(api_client)
    coordination.create_namespaced_lease(namespace, {
        "metadata": {
            "name": "vramgate-operator",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "vramgate"},
        },
        "spec": {},
    })  # fmt: skip
    leader = Leader(Kube(api_client), namespace, "vramgate-operator", "replica-a")
    assert leader._try(), "an empty Lease is free to take"
    assert leader._try(), "and renewed by its holder"
    lease = coordination.read_namespaced_lease("vramgate-operator", namespace)
    assert lease.spec.holder_identity == "replica-a"
    assert lease.metadata.labels == {"app.kubernetes.io/managed-by": "Helm"}
    assert lease.metadata.annotations == {"meta.helm.sh/release-name": "vramgate"}
    other = Leader(Kube(api_client), namespace, "vramgate-operator", "replica-b")
    assert not other._try(), "held: another replica waits"
