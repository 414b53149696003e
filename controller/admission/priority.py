"""A job's place in the queue: the value of a PriorityClass an administrator defined, never a
number the job's author writes.

Resolved as Kubernetes resolves a pod's priority: the class `spec.priorityClassName` names
(else the one its pod template names: the class its pods run with), else the cluster's
globalDefault class (the lowest, should there be several), else 0. A class that does not
exist leaves the job without a place: it is not decided, and says so, until the class is
created. The system classes (values above 1,000,000,000: system-cluster-critical and
system-node-critical, in every cluster whether an administrator made them or not) are the
cluster's own components', not a job's to name: they would put any author first again.

`spec.priority`, the raw number, is an administrator's setting: honoured only in the
namespaces the operator's `rawPriorityNamespaces` lists (none by default), where a nonzero
value takes the place of the class's; elsewhere it is ignored, and every decision of the job
says so. Pure: the classes come in as the API serves them (plain dicts).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from controller.api.finetunejob import MAX_PRIORITY

#: The rawPriorityNamespaces setting, as messages name it.
RAW_PRIORITY_SETTING = "rawPriorityNamespaces"


@dataclass(frozen=True, slots=True)
class JobPriority:
    """The job's rank in the queue, higher first (`value`), or why it has none (`problem`:
    the job is not decided), and what was ignored on the way (`warnings`)."""

    value: int = 0
    problem: str | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Priorities:
    """The cluster's PriorityClasses by name (the API's objects: `value`, `globalDefault`),
    and the namespaces whose jobs may set a raw `spec.priority`."""

    classes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    raw_namespaces: Set[str] = frozenset()

    def of(
        self,
        namespace: str,
        raw: int,
        class_name: str | None,
        template: Mapping[str, Any] | None = None,
    ) -> JobPriority:
        """The priority of a job in `namespace` whose spec says `priority: raw` and
        `priorityClassName: class_name`, with this pod template."""
        warnings: tuple[str, ...] = ()
        if raw != 0:
            said = ignored_priority(namespace, raw, self.raw_namespaces)
            if said is None:
                return JobPriority(raw)
            warnings = (said,)
        named = _named(class_name, template)
        if named is None:
            return JobPriority(self.default(), warnings=warnings)
        path, name = named
        found = self.classes.get(name)
        if found is None:
            problem = (
                f"{path}: no PriorityClass named {name!r}; the job is decided once it exists "
                "(kubectl get priorityclasses lists those that do)"
            )
            return JobPriority(problem=problem, warnings=warnings)
        value = class_value(found)
        if value > MAX_PRIORITY:
            problem = (
                f"{path}: {name} ({value}) is a system class, kept for the cluster's own "
                f"components; name a class of at most {MAX_PRIORITY}"
            )
            return JobPriority(problem=problem, warnings=warnings)
        return JobPriority(value, warnings=warnings)

    def default(self) -> int:
        """The globalDefault class's value, the lowest of several (as Kubernetes takes it),
        else 0."""
        defaults = [class_value(c) for c in self.classes.values() if c.get("globalDefault") is True]
        return min(defaults, default=0)


def ignored_priority(namespace: str, raw: int, raw_namespaces: Set[str]) -> str | None:
    """What is said of a nonzero `spec.priority` in a namespace not allowed to set one; None
    where it is honoured (or zero: unset)."""
    if raw == 0 or namespace in raw_namespaces:
        return None
    return (
        f"spec.priority {raw} is ignored: only the namespaces an administrator lists in the "
        f"operator's {RAW_PRIORITY_SETTING} may set a raw priority, and {namespace} is not "
        "one; name a PriorityClass in spec.priorityClassName"
    )


def class_value(priority_class: Mapping[str, Any]) -> int:
    """A PriorityClass's value (an int32 the API server requires; 0 if a dump lacks it)."""
    value = priority_class.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _named(class_name: str | None, template: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The class the job names and where: its own field, else its pod template's."""
    if class_name:
        return "spec.priorityClassName", class_name
    pod = (template or {}).get("spec") if isinstance(template, Mapping) else None
    name = pod.get("priorityClassName") if isinstance(pod, Mapping) else None
    if isinstance(name, str) and name:
        return "spec.template.spec.priorityClassName", name
    return None
