"""The TrainJob webhook (operator setting `trainJobSizing`): Kubeflow Trainer's TrainJobs
sized at create, the one time their trainer may change (`controller.admission.trainjob`).

Mutating, called for a TrainJob's CREATE when it carries the annotation
`vramgate.dev/finetune` or `vramgate.dev/admission-policy`, and for the UPDATE of one it
resized, whose manifest applied again asks for the count asked at create (`restore` keeps the
stored one; the configurations' matchConditions). Its view is the caches' cluster at most
`VIEW_MAX_AGE_S` old: a TrainJob is sized on the free memory now, which the FineTuneJob
webhooks' view, rebuilt only when a node's GPUs or readiness change, does not follow. The
runtime the TrainJob names comes from the caches too (`runtime`: None where it is not in
them, and the TrainJob is then sized only as far as it says its training itself). It fails
open like the others (`ignore_failures`; the review server answers 500 on an error, and the
configuration's failurePolicy is Ignore).

**Holds** (`TrainJobHolds`, operator setting `trainJobHoldSeconds`): a TrainJob create it
sizes onto GPUs that fit now, unless a dry run or suspended (`spec.suspend`: Kueue starts
it, maybe much later, and it could not use a hold until then), leaves a hold on them
(`controller.admission.holds`) that the next TrainJob's sizing and the scheduling pass
charge, so TrainJobs created in the same second are not all sized onto the same free
memory. A create of a name already held (the same TrainJob again, after the API server
refused it or called the webhook twice) is sized without that hold, and its hold replaces
it. The review server answers on a thread of its own, and concurrently: the view is awaited
outside any lock, and the holds charged, the sizing and the new hold are one step under the
sizing lock, which only the review server takes, so two creates never both count on memory
neither has held yet. The ledger's own lock guards its dict only, for microseconds, so kopf's
loop (the scheduling pass, the view) never waits on a sizing.

The ledger is this replica's memory only, and the chart runs 2 replicas: the creates of a
burst spread over both, each replica holds only what it sized, so two creates that reach
different replicas may be sized onto the same memory; and the scheduling pass (the
leader's) charges only the leader's holds, so a FineTuneJob may be admitted onto memory
the other replica holds. The TrainJob is labelled with its hold's token
(`holds.HOLD_LABEL`): a create the API server then refuses (a later webhook, a name taken),
or a TrainJob deleted before its pods run, ends its hold once the operator's listing by that
label, and for a named one a look by its name, finds nothing (`Scheduler.check_holds`), and
a `generateName` create's hold is named by the listing.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import kopf

from controller.admission import holds
from controller.admission.holds import Hold
from controller.admission.trainer_runtime import RuntimeRef, runtime_ref
from controller.admission.trainjob import Sizing, restore, size
from controller.packing.view import ClusterView
from controller.webhook.admission import ALLOWED, DENIED, ERROR
from controller.webhook.validating import INVALID

#: The `webhook` label of its requests' durations (`vramgate_webhook_request_duration_seconds`).
TRAINJOB = "trainjob"
#: How old a view a TrainJob is sized on may be, in seconds: the caches' GPU readings move
#: every heartbeat, and a burst of creates (a sweep) shares one view.
VIEW_MAX_AGE_S = 1.0


def _ignore(webhook: str, result: str, seconds: float) -> None:
    pass


def _no_runtime(ref: RuntimeRef) -> Mapping[str, Any] | None:
    return None


def held_key(body: Mapping[str, Any], namespace: str | None = None) -> tuple[str, str]:
    """The (namespace, name) a TrainJob's hold is known by; name "" for a generateName."""
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or namespace or "default"), str(meta.get("name") or "")


class TrainJobHolds:
    """The ledger of holds (`controller.admission.holds`), by hold job name: what sized
    TrainJob creates counted on, for `hold_s` seconds of `clock` at most. Thread-safe: the
    review server's thread adds and reads, kopf's loop reads and ends."""

    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        #: Held by the review server around a sizing and its hold (`TrainJobWebhook.sizing`),
        #: for as long as a sizing takes (up to a second on a large cluster). Never taken on
        #: kopf's loop: the methods below do not take it.
        self.sizing_lock = threading.Lock()
        #: Guards `_holds` and `_serial` only, for microseconds at a time.
        self._lock = threading.Lock()
        self._holds: dict[str, Hold] = {}
        self._serial = 0
        #: Tells this process's tokens (`HOLD_LABEL`) from another replica's, or a former
        #: process's whose TrainJobs still carry theirs.
        self._prefix = secrets.token_hex(4)

    def active(self) -> tuple[Hold, ...]:
        """The holds not expired now; the expired ones are forgotten."""
        with self._lock:
            kept = holds.live(self._holds.values(), self.clock())
            if len(kept) != len(self._holds):
                self._holds = {hold.job: hold for hold in kept}
            return kept

    def add(self, body: Mapping[str, Any], found: Sizing, namespace: str | None = None) -> Hold:
        """A hold on what `found` counted on (its `counted`), for the TrainJob `body`; it
        replaces any hold of the same namespace and name (that TrainJob's create again)."""
        assert found.counted is not None
        where, name = held_key(body, namespace)
        with self._lock:
            if name:
                self._holds = {
                    job: hold
                    for job, hold in self._holds.items()
                    if (hold.namespace, hold.name) != (where, name)
                }
            self._serial += 1
            now = self.clock()
            hold = Hold(
                namespace=where,
                name=name,
                placement=found.counted.placement,
                per_gpu_bytes=found.counted.per_gpu_bytes,
                pods=found.counted.pods,
                expires_s=now + self.hold_s,
                serial=self._serial,
                token=f"{self._prefix}-{self._serial}",
                made_s=now,
            )
            self._holds[hold.job] = hold
            return hold

    def name(self, named: Mapping[str, str]) -> None:
        """Give the holds of these jobs their TrainJob's name (created with generateName,
        found by its label: `holds.looked_up`), so their pods are found."""
        with self._lock:
            for job, name in named.items():
                hold = self._holds.pop(job, None)
                if hold is not None:
                    renamed = replace(hold, name=name)
                    self._holds[renamed.job] = renamed

    def end(self, jobs: Iterable[str]) -> None:
        """Forget the holds of these jobs (their pods' memory shows in the readings, or
        their TrainJob is not there)."""
        with self._lock:
            for job in jobs:
                self._holds.pop(job, None)


class TrainJobWebhook:
    def __init__(
        self,
        view: Callable[[], Awaitable[ClusterView | None]],
        observe: Callable[[str, str, float], None] = _ignore,
        runtime: Callable[[RuntimeRef], Mapping[str, Any] | None] = _no_runtime,
        holds: TrainJobHolds | None = None,
    ) -> None:
        self.view = view
        self.observe = observe
        self.runtime = runtime
        #: None: nothing held (`trainJobHoldSeconds` 0).
        self.holds = holds

    async def sizing(
        self,
        body: Mapping[str, Any],
        warnings: list[str] | None = None,
        *,
        dry_run: bool = False,
        namespace: str | None = None,
    ) -> Sizing:
        """The TrainJob's sizing; kopf.AdmissionError (422) when it is refused. Sized onto
        GPUs that fit now, not a dry run and not suspended: those GPUs held
        (`TrainJobHolds`)."""
        started, result = time.perf_counter(), ERROR
        try:
            ref = runtime_ref(body)
            runtime = None if ref is None else self.runtime(ref)
            view = await self.view()
            if self.holds is None:
                found = size(body, view, runtime=runtime)
            else:
                own = held_key(body, namespace)
                with self.holds.sizing_lock:  # charged, sized and held as one step
                    if view is not None:  # not its own earlier hold: it is that create again
                        active = self.holds.active()
                        mine = {h.job for h in active if own[1] and (h.namespace, h.name) == own}
                        held = [holds.reservation(h) for h in active if h.job not in mine]
                        # The view may charge it already (built after it was made).
                        view = view.with_reservations(held, without=mine)
                    found = size(body, view, runtime=runtime)
                    if (
                        found.counted is not None
                        and found.refusal is None
                        and not dry_run
                        and not _suspended(body)
                    ):
                        hold = self.holds.add(body, found, namespace)
                        found = replace(found, patch=(*found.patch, _label(body, hold.token)))
            if warnings is not None:
                warnings.extend(found.warnings)
            if found.refusal is not None:
                result = DENIED
                raise kopf.AdmissionError(found.refusal, code=INVALID)
            result = ALLOWED
            return found
        finally:
            self.observe(TRAINJOB, result, time.perf_counter() - started)

    async def mutate(
        self,
        body: Mapping[str, Any],
        patch: kopf.Patch,
        warnings: list[str] | None = None,
        operation: str | None = None,
        old: Mapping[str, Any] | None = None,
        dryrun: bool = False,
        **_: Any,
    ) -> None:
        """kopf's mutating handler: `sizing`'s operations written into kopf's patch (the
        review server answers with them as they are); on an UPDATE, `restore`'s."""
        if operation == "UPDATE":
            found = restore(old or {}, body)
            if warnings is not None:
                warnings.extend(found.warnings)
            ops = found.patch
        elif operation in (None, "CREATE"):
            ops = (await self.sizing(body, warnings, dry_run=dryrun)).patch
        else:
            return
        for op in ops:
            *parents, leaf = [_unescape(p) for p in op["path"].strip("/").split("/")]
            into: Any = patch
            for key in parents:
                into = into.setdefault(key, {})
            into[leaf] = op["value"]


def _label(body: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The JSON Patch operation that labels the TrainJob with its hold's token."""
    labels = (body.get("metadata") or {}).get("labels")
    if isinstance(labels, Mapping):
        path = "/metadata/labels/" + holds.HOLD_LABEL.replace("~", "~0").replace("/", "~1")
        return {"op": "add", "path": path, "value": token}
    return {"op": "add", "path": "/metadata/labels", "value": {holds.HOLD_LABEL: token}}


def _suspended(body: Mapping[str, Any]) -> bool:
    """`spec.suspend: true`: Kueue (or its author) starts it later, so it holds nothing now."""
    return (body.get("spec") or {}).get("suspend") is True


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")
