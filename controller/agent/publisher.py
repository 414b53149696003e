"""Keeps this node's GPUNode in the API: created once, owned by the Node, status applied.

Why server-side apply for the status: the agent owns ``status.gpus[]``' measured fields
(memory, ``driverReservedBytes``, ``mig``, ``pods``), the summary columns, ``heartbeatTime``
and the ``Ready`` condition, while the operator may own other fields of the same object
(``reservedBytes`` of a GPU, conditions of its own). The lists are list-maps in the CRD
(GPUs keyed by ``uuid``, pods by ``uid``, conditions by ``type``), so an apply by field
manager ``vramgate-agent`` changes only what the agent owns; a merge patch would replace
whole lists and wipe the operator's fields.

Why the Node as owner: deleting a Node (scale-down, replacement) garbage-collects its GPUNode,
so the controller never packs onto a node that is gone. No ``blockOwnerDeletion``: setting it
needs update permission on nodes/finalizers, which an agent should not hold.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import urllib3

from controller.agent.status import Observation, build_status
from controller.api.base import API_VERSION
from controller.api.conditions import READY, find_condition
from controller.api.gpunode import KIND
from controller.base.errors import TemporaryError
from controller.kube import ApiClient, ApiError, GpuNodes

FIELD_MANAGER = "vramgate-agent"
APPLY = "application/apply-patch+yaml"
REQUEST_TIMEOUT_S = 10  # one slow API call must not stall the poll loop for long

log = logging.getLogger(__name__)


class PublishError(TemporaryError):
    """The GPUNode could not be written; retried with backoff. The message says why."""


class GpuNodePublisher:
    """Writes the GPUNode named ``node_name`` through ``api_client``."""

    def __init__(self, api_client: ApiClient, node_name: str) -> None:
        self.node_name = node_name
        self.gpunodes = GpuNodes(api_client, REQUEST_TIMEOUT_S)
        self._ensured = False
        self._generation: int | None = None
        self._ready: list[dict[str, Any]] = []  # the Ready condition last written

    def publish(self, observation: Observation, now: datetime) -> None:
        """Create the GPUNode if missing, then apply its status; PublishError on failure."""
        try:
            if not self._ensured:
                self._ensure()
            try:
                self._apply(observation, now)
            except ApiError as error:
                if error.status != 404:
                    raise
                # Deleted under us (by hand, or GC of a Node re-registering): create again.
                self._ensured = False
                self._ensure()
                self._apply(observation, now)
        except ApiError as error:
            raise PublishError(
                f"GPUNode {self.node_name}: API server answered {error.status} {error.reason}"
                f"{_detail(error)}"
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:  # refused, TLS, DNS, timeout
            raise PublishError(
                f"GPUNode {self.node_name}: cannot reach the API server: {error}"
            ) from None

    def _apply(self, observation: Observation, now: datetime) -> None:
        status = build_status(observation, now, self._ready, self._generation)
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": self.node_name},
            "status": status,
        }
        self.gpunodes.apply_status(self.node_name, body, FIELD_MANAGER, APPLY)
        self._ready = [c for c in status["conditions"] if c["type"] == READY]

    def _ensure(self) -> None:
        try:
            existing = self.gpunodes.get(self.node_name)
        except ApiError as error:
            if error.status != 404:
                raise
            existing = self._create()
        self._remember(existing)
        self._ensured = True

    def _create(self) -> Any:
        try:
            uid = self.gpunodes.node_uid(self.node_name)
        except ApiError as error:
            if error.status == 404:
                raise PublishError(
                    f"Node {self.node_name} not found: --node-name must be this node's name "
                    "(in a DaemonSet, set it from spec.nodeName)"
                ) from None
            raise
        if not uid:
            raise PublishError(f"Node {self.node_name} has no UID yet; retrying")
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": self.node_name,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": uid,
                    }
                ],
            },
            "spec": {"nodeName": self.node_name},
        }
        try:
            created = self.gpunodes.create(body)
            log.info("created GPUNode %s owned by Node %s", self.node_name, uid)
            return created
        except ApiError as error:
            if error.status != 409:
                raise
            return self.gpunodes.get(self.node_name)

    def _remember(self, obj: Any) -> None:
        """The object's generation, and a Ready condition a previous agent run left."""
        self._generation = obj.get("metadata", {}).get("generation")
        ready = find_condition(obj.get("status", {}).get("conditions") or [], READY)
        self._ready = [dict(ready)] if ready else []


def _detail(error: ApiError) -> str:
    """The API server's own message from a Status body, when it sent one."""
    try:
        message = json.loads(error.body or "").get("message")
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if message else ""
