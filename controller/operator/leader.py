"""Leader election on a `coordination.k8s.io/v1` Lease: of the operator's replicas, only the
holder decides admissions. The others keep their caches warm and serve the webhook.

Why a Lease and not kopf's peering: peering pauses lower-priority operators but lets
equal-priority ones run side by side, and two replicas deciding at once could promise the
same GPU memory twice. The Lease is what client-go's leader election uses: the holder
renews it every `renew_s`; another replica takes it over only once it has gone unrenewed for
`duration_s` (by a write that carries the Lease's resourceVersion, so two replicas cannot
both win). A holder that cannot renew considers itself deposed `renew_s` before the Lease
expires, so the old and the new leader never decide at the same time, clocks permitting.

A clean stop hands the Lease back (holder cleared), so a rolling update fails over at once;
a killed replica's Lease expires after `duration_s`. A restarted process with the same
identity (the pod's name) takes its own Lease back at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from controller.base.clock import Clock, SystemClock
from controller.kube import ApiError, Conflict, Gone, Kube

log = logging.getLogger("vramgate.leader")


def _micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Leader:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        duration_s: float = 15.0,
        renew_s: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.kube = kube
        #: When the Lease was renewed (wall time, written into it) and how long this replica
        #: may decide since (monotonic): injected, so a test can move time.
        self.clock = clock or SystemClock()
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s, self.renew_s = duration_s, renew_s
        self._held_until = 0.0  # clock.monotonic() until which this replica may decide
        self.on_change: list[Any] = []

    def is_leader(self) -> bool:
        return self.clock.monotonic() < self._held_until

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            was = self.is_leader()
            started = self.clock.monotonic()
            try:
                held = await loop.run_in_executor(None, self._try)
            except Exception as error:  # an API hiccup: try again next round
                log.warning("cannot reach the Lease %s/%s: %s", self.namespace, self.name, error)
                held = False
            if held:
                self._held_until = started + self.duration_s - self.renew_s
            if self.is_leader() != was:
                log.info(
                    "%s the Lease %s/%s as %s",
                    "holding" if self.is_leader() else "lost",
                    self.namespace,
                    self.name,
                    self.identity,
                )
                for callback in self.on_change:
                    callback()
            await asyncio.sleep(self.renew_s if held or was else min(self.renew_s, 2.0))

    def _try(self) -> bool:
        """One acquire-or-renew round trip; True if this replica holds the Lease now."""
        now = self.clock.wall()
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
        except Gone:
            try:
                self.kube.create_lease(self.namespace, self._body(now, transitions=0))
            except Conflict:
                return False  # another replica created it first
            except ApiError as error:
                if error.status != 403:
                    raise
                # The chart creates the Lease and grants no `create`: deleted by hand, it is
                # back with `helm upgrade`. Until then no replica decides; say so plainly.
                log.error("the Lease %s/%s is missing and this ServiceAccount may not create "
                          "it: no admission decisions until it exists again (helm upgrade "
                          "re-creates it)", self.namespace, self.name)  # fmt: skip
                return False
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or self.duration_s))
        expired = holder in (None, "") or renewed is None or renewed + duration < now
        if holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        body = self._body(now, transitions)
        if holder == self.identity and spec.get("acquireTime"):
            body["spec"]["acquireTime"] = spec["acquireTime"]
        # The Lease as read, only its spec changed: the chart's labels and Helm's ownership
        # annotations must survive every renewal (or `helm upgrade` no longer owns it).
        body["metadata"] = {**lease["metadata"], "name": self.name, "namespace": self.namespace}
        try:
            self.kube.replace_lease(self.namespace, self.name, body)
        except (Conflict, Gone):
            return False
        return True

    def _body(self, now: datetime, transitions: int) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration_s),
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
                "leaseTransitions": transitions,
            },
        }

    def release(self) -> None:
        """Hand the Lease back (blocking; at a clean stop) so another replica need not wait."""
        if not self.is_leader():
            return
        self._held_until = 0.0
        try:
            lease = self.kube.read_lease(self.namespace, self.name)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            self.kube.replace_lease(self.namespace, self.name, lease)
        except Exception as error:  # it expires by itself
            log.warning("cannot release the Lease: %s", error)
