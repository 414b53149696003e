"""The vramgate.dev/v1alpha1 API: pydantic models of the CRDs, their conditions, and the CRD
manifests rendered from them. Pure data: no Kubernetes client, no kopf."""

from controller.api.base import API_VERSION, GROUP, VERSION

__all__ = ["API_VERSION", "GROUP", "VERSION"]
