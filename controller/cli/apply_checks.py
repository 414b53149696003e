"""What `kubectl apply` would refuse in a FineTuneJob manifest that `translate` accepts.

`vramgate plan` decides job files as they would be applied, so it refuses what the API server
would: `translate` is lenient where the CLI wants it (`method: lora`), and the API server also
checks the apiVersion, the metadata and the CRD's schema. The schema is the pydantic models the
CRD is rendered from, so the two cannot drift.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from controller.api.base import API_VERSION
from controller.api.finetunejob import DNS_SUBDOMAIN_PATTERN, FineTuneJobSpec

#: A DNS-1123 subdomain (object names, label key prefixes) and label (namespaces).
_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: A label value, and the name part of a label or annotation key.
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


#: The fields of an object, and of its metadata (ObjectMeta), that the API server knows:
#: kubectl's strict field validation (its default) refuses any other.
_OBJECT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
_META_FIELDS = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
)  # fmt: skip


def refused_at_apply(job: Mapping[str, Any]) -> str | None:
    """The first thing the API server would refuse, as `field: what is allowed`, or None."""
    if job.get("apiVersion") != API_VERSION:
        return f"apiVersion: {job.get('apiVersion')!r} must be {API_VERSION}"
    meta = job.get("metadata") or {}
    unknown = _unknown(job, _OBJECT_FIELDS, "") or _unknown(meta, _META_FIELDS, "metadata.")
    if unknown:
        return unknown
    name, namespace = meta.get("name"), meta.get("namespace")
    if not (isinstance(name, str) and len(name) <= 253 and _SUBDOMAIN.match(name)):
        return (
            f"metadata.name: {name!r} must be a DNS-1123 subdomain (lower-case letters, digits, "
            "'-' and '.', at most 253 characters)"
        )
    if namespace is not None and not (
        isinstance(namespace, str) and len(namespace) <= 63 and _DNS_LABEL.match(namespace)
    ):
        return (
            f"metadata.namespace: {namespace!r} must be a DNS-1123 label (lower-case letters, "
            "digits and '-', at most 63 characters)"
        )
    problem = _map_problem(meta, "labels") or _map_problem(meta, "annotations")
    if problem:
        return problem
    # default=str: YAML reads an unquoted date (an annotation, an env value) as a date, which
    # kubectl sends as the string it was written as.
    return _schema_problem(json.dumps(job.get("spec"), sort_keys=True, default=str))


def _unknown(obj: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> str | None:
    extra = next((key for key in obj if key not in known), None)
    if extra is None:
        return None
    return f"{prefix}{extra}: unknown field; allowed: {', '.join(known)}"


def _map_problem(meta: Mapping[str, Any], field: str) -> str | None:
    """Labels and annotations: qualified-name keys and string values (labels' values short
    names too)."""
    found = meta.get(field)
    if found is None:
        return None
    if not isinstance(found, Mapping):
        return f"metadata.{field}: must be a map of strings to strings"
    for key, value in found.items():
        if not _qualified(key):
            return (
                f"metadata.{field}: key {key!r} must be a name of at most 63 letters, digits, "
                "'-', '_' or '.' (starting and ending alphanumeric), with an optional "
                "DNS-1123 subdomain prefix and '/'"
            )
        if not isinstance(value, str | dt.date):  # a YAML date is sent as its string
            return f"metadata.{field}.{key}: must be a string, got {value!r} (quote it)"
        value = str(value)
        if field == "labels" and not (value == "" or (len(value) <= 63 and _NAME.match(value))):
            return (
                f"metadata.labels.{key}: {value!r} must be at most 63 letters, digits, '-', "
                "'_' or '.', starting and ending alphanumeric (or empty)"
            )
    return None


def _qualified(key: object) -> bool:
    if not isinstance(key, str):
        return False
    prefix, _, name = key.rpartition("/")
    if prefix and not (len(prefix) <= 253 and _SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME.match(name))


@lru_cache(maxsize=4096)
def _schema_problem(spec: str) -> str | None:
    """The CRD schema's first complaint about a spec (JSON): cached, since a queue of
    10,000 manifests holds few distinct specs."""
    try:
        FineTuneJobSpec.model_validate_json(spec, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        path = ".".join(["spec", *(str(part) for part in first["loc"])])
        return f"{path}: {first['msg']}"
    return None
