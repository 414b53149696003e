"""The Kubernetes API, as vramgate calls it: the only package that imports the client.

    client.py      client construction (the operator's `api_client`, the agent's
                   `default_api_client`), the errors in our terms (`Conflict`, `Gone`,
                   `ApiError`, `NoCredentials`), one raw `request`, and `Kube`: the typed calls
                   of the operator (status writes, workloads, events, leases, dry runs)
    configmaps.py  a job's model config from the ConfigMap it names
    webhooks.py    the webhook configurations `--webhook managed` writes
    gpunodes.py    the agent's GPUNode and the Node that owns it

The operator, the webhook and the agent reach the API through here (kopf's own watches
aside), so that every request's failure is said in vramgate's terms in one place: a caller
catches `Conflict`, `Gone` or `ApiError`, never the client's exception. Callers hold an
`ApiClient` only to hand it back to the calls here.
"""

from controller.kube.client import (
    ApiClient,
    ApiError,
    Conflict,
    Gone,
    Kube,
    NoCredentials,
    StaleWrite,
    api_client,
    default_api_client,
    request,
)
from controller.kube.configmaps import ConfigMapReader, read_model_config
from controller.kube.gpunodes import GpuNodes
from controller.kube.webhooks import Registered, WebhookConfigurations

__all__ = [
    "ApiClient",
    "ApiError",
    "ConfigMapReader",
    "Conflict",
    "Gone",
    "GpuNodes",
    "Kube",
    "NoCredentials",
    "Registered",
    "StaleWrite",
    "WebhookConfigurations",
    "api_client",
    "default_api_client",
    "read_model_config",
    "request",
]
