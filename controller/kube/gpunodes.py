"""The agent's calls: its node's GPUNode (cluster-scoped), and the Node that owns it.

The client's typed calls (the requests the agent has always made), each within `timeout_s`
so one slow answer does not stall the poll loop. A refusal raises `ApiError` with its status
and body (the publisher weighs 404 and 409 and quotes the API server's message); no answer
raises as the client raises it (urllib3's errors, `OSError`).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client import ApiClient

from controller.api.base import GROUP, VERSION
from controller.api.gpunode import PLURAL
from controller.kube.client import api_errors


class GpuNodes:
    """GPUNode objects, and the Node a GPUNode is named after."""

    def __init__(self, api: ApiClient, timeout_s: float) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.timeout_s = timeout_s

    def get(self, name: str) -> Any:
        with api_errors():
            return self.custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=self.timeout_s
            )

    def create(self, body: dict[str, Any]) -> Any:
        with api_errors():
            return self.custom.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, body, _request_timeout=self.timeout_s
            )

    def apply_status(
        self, name: str, body: dict[str, Any], field_manager: str, content: str
    ) -> None:
        """Patch the status of GPUNode `name` with `body` as `content` (a server-side apply,
        forced: the fields `field_manager` owns are its to set)."""
        with api_errors():
            self.custom.patch_cluster_custom_object_status(
                GROUP,
                VERSION,
                PLURAL,
                name,
                body,
                field_manager=field_manager,
                force=True,
                _content_type=content,
                _request_timeout=self.timeout_s,
            )

    def node_uid(self, name: str) -> str | None:
        """The uid of Node `name` (None while it has none); 404 when there is no such Node."""
        with api_errors():
            node = self.core.read_node(name, _request_timeout=self.timeout_s)
        return node.metadata.uid if node.metadata else None
