"""Command lines of the control-plane components, kept apart from process handling.

Everything listens on 127.0.0.1 only. The virtual ranges (service IPs, pod IPs, node IPs)
are on loopback too, so that a mistake — say, a webhook registered by Service instead of
by URL — can only ever send traffic to this machine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from e2e.certs import CertPair

LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "127.96.0.0/16"
POD_CIDR = "127.244.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_ANNOTATION_VALUE = "fake"
FRONT_PROXY_CLIENT = "front-proxy-client"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
CLIENT_QPS = 200
CLIENT_BURST = 400
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")


def first_service_ip() -> str:
    """ClusterIP of the `kubernetes` Service; the serving cert names it like kubeadm does."""
    return str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Pki:
    """Files the components need; produced by ``Cluster`` with ``e2e.certs``."""

    ca: CertPair
    serving: CertPair
    service_account: CertPair
    front_proxy_ca: CertPair
    front_proxy_client: CertPair


def etcd_args(binary: Path, data_dir: Path, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=vramgate",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=vramgate={peer}",
        "--initial-cluster-state=new",
        # Test data is thrown away; fsync only makes every API write slower on a VM disk.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def apiserver_args(binary: Path, pki: Pki, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        # Both webhook plugins are on by default; naming them guards against a default change.
        # OwnerReferencesPermissionEnforcement (on in OpenShift and many hardened clusters)
        # makes blockOwnerDeletion need update on the owner's finalizers: the chart's RBAC
        # must grant it.
        "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,"
        "ValidatingAdmissionWebhook,OwnerReferencesPermissionEnforcement",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-key-file={pki.service_account.cert}",
        f"--service-account-signing-key-file={pki.service_account.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Endpoints may not hold loopback addresses, so the `kubernetes` Service would only
        # log reconcile errors forever; nothing in-cluster needs it.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
        # Aggregation layer, as kubeadm sets it up: without it every component that
        # delegates authentication logs errors about a missing requestheader CA.
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
    ]


def _delegated_auth(kubeconfig: Path) -> list[str]:
    return [
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


def controller_manager_args(binary: Path, pki: Pki, ports: Ports, kubeconfig: Path) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        *_delegated_auth(kubeconfig),
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.controller_manager}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",
        # All default controllers: service-account token and `default` SA, garbage
        # collector, job, namespace, node lifecycle (taints off NotReady fake nodes).
        "--controllers=*",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account.key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--leader-elect=false",
        f"--kube-api-qps={CLIENT_QPS}",
        f"--kube-api-burst={CLIENT_BURST}",
    ]


def scheduler_config(kubeconfig: Path) -> str:
    """KubeSchedulerConfiguration: client QPS is only settable here, not by flag."""
    return "\n".join(
        [
            "apiVersion: kubescheduler.config.k8s.io/v1",
            "kind: KubeSchedulerConfiguration",
            "clientConnection:",
            f"  kubeconfig: {kubeconfig}",
            f"  qps: {CLIENT_QPS}",
            f"  burst: {CLIENT_BURST}",
            "leaderElection:",
            "  leaderElect: false",
            "",
        ]
    )


def scheduler_args(
    binary: Path, pki: Pki, ports: Ports, config: Path, kubeconfig: Path
) -> list[str]:
    return [
        str(binary),
        f"--config={config}",
        *_delegated_auth(kubeconfig),
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.scheduler}",
        f"--tls-cert-file={pki.serving.cert}",
        f"--tls-private-key-file={pki.serving.key}",
        f"--client-ca-file={pki.ca.cert}",
    ]


def kwok_args(binary: Path, kubeconfig: Path) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={KWOK_STAGES}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector="
        f"{FAKE_NODE_ANNOTATION}={FAKE_NODE_ANNOTATION_VALUE}",
        f"--node-ip={LOOPBACK}",
        f"--cidr={POD_CIDR}",
        "--node-lease-duration-seconds=40",
    ]
