"""Read a model's config.json from the ConfigMap a FineTuneJob names.

The only API read the estimation path needs. Failures are not spec errors: the ConfigMap may
be created or fixed after the job, so they raise `ConfigMapUnavailable`, which the handler
records and retries.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from controller.errors import TemporaryError
from controller.jobspec import ConfigMapKey


class ConfigMapUnavailable(TemporaryError):
    """The ConfigMap or its key is missing or does not hold a JSON object; message: one line
    naming the field and the ConfigMap."""


class ConfigMapReader(Protocol):
    """What this module needs of `kubernetes.client.CoreV1Api`, so tests can pass a fake."""

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any: ...


FIELD = "spec.model.configMapRef"


def read_model_config(core: ConfigMapReader, namespace: str, ref: ConfigMapKey) -> dict[str, Any]:
    """The JSON object stored under `ref.key` of ConfigMap `ref.name` in `namespace`."""
    where = f"ConfigMap {namespace}/{ref.name}"
    try:
        config_map = core.read_namespaced_config_map(ref.name, namespace)
    except ApiException as error:
        if error.status == 404:
            raise ConfigMapUnavailable(f"{FIELD}.name: {where} not found") from None
        raise ConfigMapUnavailable(
            f"{FIELD}: cannot read {where}: {error.status} {error.reason}"
        ) from None
    data = config_map.data or {}
    if ref.key not in data:
        keys = ", ".join(sorted(data)) or "none"
        raise ConfigMapUnavailable(f"{FIELD}.key: {where} has no key {ref.key!r} (keys: {keys})")
    try:
        config = json.loads(data[ref.key])
    except json.JSONDecodeError as error:
        raise ConfigMapUnavailable(
            f"{FIELD}.key: {where} key {ref.key!r} is not valid JSON ({error})"
        ) from None
    if not isinstance(config, dict):
        raise ConfigMapUnavailable(
            f"{FIELD}.key: {where} key {ref.key!r} must hold a JSON object (a config.json)"
        )
    return config
