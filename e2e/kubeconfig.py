"""Write kubeconfig files with the certificates embedded.

Embedded (``*-data``) rather than file paths so that a printed ``KUBECONFIG=`` keeps working
when copied elsewhere, and so that kubectl, helm, kwok and the Python client all read it.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from e2e.certs import CertPair


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: CertPair, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "vramgate-e2e",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": _b64(client.cert),
                    "client-key-data": _b64(client.key),
                },
            }
        ],
        "contexts": [
            {"name": "vramgate-e2e", "context": {"cluster": "vramgate-e2e", "user": user}}
        ],
        "current-context": "vramgate-e2e",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
