"""Read a model's config.json from the ConfigMap a FineTuneJob names.

The only API read the estimation path needs. Failures are not spec errors: the ConfigMap may
be created or fixed after the job, so they raise `ConfigMapUnavailable`, which the handler
records and retries.
"""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from controller.base.errors import ConfigMapUnavailable
from controller.estimator import SpecError
from controller.jobs.spec import ConfigMapKey


class ConfigMapReader(Protocol):
    """What this module needs of `kubernetes.client.CoreV1Api`, so tests can pass a fake."""

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any: ...


FIELD = "spec.model.configMapRef"


def read_model_config(core: ConfigMapReader, namespace: str, ref: ConfigMapKey) -> dict[str, Any]:
    """The JSON object stored under `ref.key` of ConfigMap `ref.name` in `namespace`."""
    try:
        config_map = core.read_namespaced_config_map(ref.name, namespace)
    except ApiException as error:
        if error.status != 404:
            raise ConfigMapUnavailable(
                f"{FIELD}: cannot read ConfigMap {namespace}/{ref.name}: "
                f"{error.status} {error.reason}"
            ) from None
        config_map = None
    try:
        return ref.config_in(namespace, None if config_map is None else config_map.data or {})
    except SpecError as error:
        raise ConfigMapUnavailable(str(error)) from None
