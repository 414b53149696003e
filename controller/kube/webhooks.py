"""The webhook configurations `--webhook managed` writes: created, read, replaced, deleted.

The client's typed calls (the requests the registrar has always made), each refusal raised as
`ApiError` with its status: the registrar weighs it (409: another writer came first, 404:
deleted meanwhile, 5xx: tried again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient

from controller.kube.client import api_errors

#: The client's method suffix for each kind.
_METHODS = {
    "ValidatingWebhookConfiguration": "validating_webhook_configuration",
    "MutatingWebhookConfiguration": "mutating_webhook_configuration",
}


@dataclass(frozen=True)
class Registered:
    """What the registrar reads of a configuration that is there."""

    resource_version: str | None
    #: Each webhook's clientConfig.url (None: it calls a Service instead).
    urls: tuple[str | None, ...]


class WebhookConfigurations:
    """The cluster's validating and mutating webhook configurations, by kind and name."""

    def __init__(self, api: ApiClient) -> None:
        self.admission = client.AdmissionregistrationV1Api(api)

    def create(self, kind: str, body: Mapping[str, Any]) -> None:
        with api_errors():
            getattr(self.admission, f"create_{_METHODS[kind]}")(body)

    def read(self, kind: str, name: str) -> Registered:
        with api_errors():
            there = getattr(self.admission, f"read_{_METHODS[kind]}")(name)
        return Registered(
            there.metadata.resource_version,
            tuple(w.client_config.url for w in there.webhooks or []),
        )

    def replace(self, kind: str, name: str, body: Mapping[str, Any]) -> None:
        """PUT `body`: with its resourceVersion, 409 if another wrote it since."""
        with api_errors():
            getattr(self.admission, f"replace_{_METHODS[kind]}")(name, body)

    def delete(self, kind: str, name: str, resource_version: str | None) -> None:
        """Delete only while the configuration is still at `resource_version` (else 409)."""
        precondition = client.V1Preconditions(resource_version=resource_version)
        with api_errors():
            getattr(self.admission, f"delete_{_METHODS[kind]}")(
                name, body=client.V1DeleteOptions(preconditions=precondition)
            )
