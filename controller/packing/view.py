"""The cluster as one decision pass sees it: free memory now, and the cluster when empty.

`now` is what a job can be placed on at this moment; `empty` is the same GPUs with no work
at all, against which Reject is judged (never fits even when empty); `resting` is the cluster
now as if the nodes that take no work did (cordoned, not Ready, a silent agent, GPUs not yet
reported, a taint the template does not tolerate), which tells a job that waits for those
nodes from one that waits for memory. Selectors are matched once per distinct selector and
pass, not once per decision.

With `devicePlugin` the device plugin picks which of a node's free GPUs a pod gets, so `now`
(and `resting`) holds each node to its least free such GPU (`index.bound`). `empty` does not:
a node whose small GPUs other pods hold hands a pod only its big ones, so what its big GPUs
hold may fit some day, and only what no state of the cluster holds is rejected.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property

from controller.estimator import Estimate, Parallelism
from controller.packing.constraints import GPU_TOLERATION, NodeConstraints
from controller.packing.index import FreeIndex, NodeFilter, bound
from controller.packing.inventory import (
    GpuMode,
    NodeGpus,
    NodeState,
    PackingSettings,
    Reservation,
    Snapshot,
    Taint,
    placeable,
    working_nodes,
)
from controller.packing.placement import Placed, closest, place, place_by_count


def _everywhere(pos: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Selection:
    """The nodes a selector matches, in both views."""

    now: NodeFilter
    empty: NodeFilter
    #: GPUs with reported memory on matching nodes, and those of matching nodes not yet
    #: reported (as many as their Node says).
    gpus: int
    products: tuple[str, ...]
    #: (node, why) for each matching GPU node that takes no new work now: not Ready,
    #: cordoned, its GPUs not yet reported, its agent not Ready or silent, a taint the
    #: template does not tolerate.
    resting: tuple[tuple[str, str], ...] = ()
    #: The names of the matching nodes; None: every node.
    names: frozenset[str] | None = None
    #: The job must run on one node (`NodeConstraints.one_node`), whatever the GPU mode.
    one_node: bool = False
    #: Its GPUs come as this many equal pods, whole on their nodes (`NodeConstraints.pods`).
    pods: int = 0


#: Distinct (selector, constraints) a view keeps: templates repeat, but a long-lived view
#: (the webhook's) must not grow with every distinct one it is asked about.
MAX_SELECTIONS = 1024


class ClusterView:
    def __init__(self, snapshot: Snapshot, settings: PackingSettings) -> None:
        exclusive = settings.gpu_mode is not GpuMode.VISIBLE_DEVICES
        self.counts_slots = settings.gpu_mode is GpuMode.DEVICE_PLUGIN
        # visibleDevices pins by UUIDs in one pod's environment: one node per job.
        self.one_node = not exclusive
        #: The device plugin, not the placement, picks which of a node's free GPUs a pod gets.
        self.unpinned = self.counts_slots
        self.now = FreeIndex(
            working_nodes(snapshot, settings),
            exclusive=exclusive,
            one_node=self.one_node,
            unpinned=self.unpinned,
        )
        self._snapshot, self._settings = snapshot, settings
        self.gpu_mode = settings.gpu_mode
        self._selections: dict[
            tuple[tuple[tuple[str, str], ...], NodeConstraints | None], Selection
        ] = {}
        # The workload tolerates the GPU taint itself where it requests nvidia.com/gpu.
        self.tolerated = (GPU_TOLERATION,) if self.counts_slots else ()
        #: Nodes not yet reported whose GPUs' size no label gives: never "the largest GPU".
        self._unknown = frozenset(
            node.name
            for node in snapshot.nodes
            if not node.reported and any(gpu.total_bytes is None for gpu in node.gpus)
        )
        #: What this pass charged and held in `now`, by node name, replayed onto `resting`
        #: when it is built: (node, GPU positions, bytes each holds or None for a hold).
        self._changes: list[tuple[str, tuple[int, ...], tuple[int, ...] | None]] = []

    def with_reservations(
        self, extra: Iterable[Reservation], without: Collection[str] = ()
    ) -> ClusterView:
        """This cluster with `extra` charged too (holds made after it was built), leaving
        out those whose job it charges already, and with the reservations of the jobs
        `without` taken off (a create's own earlier hold, charged when the view was built);
        itself where nothing changes. A new view: this one may be read by others meanwhile,
        and is never changed. Its `empty` index, where built, is shared: reservations do not
        change the empty cluster, and it is only read (about half of what a view costs to
        build)."""
        kept = tuple(r for r in self._snapshot.reservations if r.job not in without)
        have = {r.job for r in kept}
        new = tuple(r for r in extra if r.job not in have and r.job not in without)
        if not new and len(kept) == len(self._snapshot.reservations):
            return self
        charged = replace(self._snapshot, reservations=(*kept, *new))
        view = ClusterView(charged, self._settings)
        if "empty" in self.__dict__:  # cached_property: built already
            view.__dict__["empty"] = self.__dict__["empty"]
        return view

    @cached_property
    def empty(self) -> FreeIndex:
        """Built on first use: a pass in which every job fits now never needs it."""
        return FreeIndex(
            working_nodes(self._snapshot, self._settings, empty=True), one_node=self.one_node
        )

    @cached_property
    def resting(self) -> FreeIndex:
        """Built on first use, for a job that waits while a node it matches takes no work:
        in a healthy cluster, never."""
        index = FreeIndex(
            working_nodes(self._snapshot, self._settings, resting=True),
            exclusive=self.gpu_mode is not GpuMode.VISIBLE_DEVICES,
            one_node=self.one_node,
            unpinned=self.unpinned,
        )
        for name, gpus, held in self._changes:
            self._change(index, name, gpus, held)
        return index

    def _change(
        self, index: FreeIndex, name: str, gpus: tuple[int, ...], held: tuple[int, ...] | None
    ) -> None:
        pos = index.position[name]  # a node that takes work now is in every view of it
        if held is None:
            index.hold(pos, gpus)
        else:
            index.assume(pos, gpus, held, slots=self.counts_slots)

    def select(
        self, selector: Mapping[str, str], constraints: NodeConstraints | None = None
    ) -> Selection:
        """The nodes that match `selector` (spec.resources.gpuSelector) and the pod
        template's node selection (`constraints`: its nodeSelector and node affinity, in both
        views; its tolerations against the nodes' taints, now only: a taint comes and goes,
        as a cordon does, so it makes a job wait, never refuses it). No `constraints`: a job
        that runs no pods of its own, whatever the taints."""
        key = (tuple(sorted(selector.items())), constraints)
        found = self._selections.get(key)
        if found is None:
            if len(self._selections) >= MAX_SELECTIONS:
                self._selections.pop(next(iter(self._selections)))
            found = self._selections[key] = self._select(selector, constraints)
        return found

    def _select(
        self, selector: Mapping[str, str], constraints: NodeConstraints | None
    ) -> Selection:
        """Matched on the snapshot, so that a pass in which every job fits never builds the
        empty view."""
        matched = [
            node
            for node in self._snapshot.nodes
            if all(node.labels.get(k) == v for k, v in selector.items())
            and (constraints is None or constraints.selects(node))
        ]
        repelled: dict[str, Taint] = {}
        if constraints is not None:
            for node in matched:
                taints = constraints.repelled_by(node, self.tolerated)
                if taints:
                    repelled[node.name] = taints[0]
        gpus = [gpu for node in matched for gpu in node.counted()]
        products = tuple(sorted({gpu.product for gpu in gpus if gpu.product}))
        resting = self._resting(matched, repelled)
        one_node = constraints is not None and constraints.one_node
        pods = 0 if constraints is None else constraints.pods
        if len(matched) == len(self._snapshot.nodes) and not repelled:
            return Selection(
                _everywhere, _everywhere, len(gpus), products, resting, one_node=one_node,
                pods=pods,
            )  # fmt: skip
        names = frozenset(node.name for node in matched)
        now = {self.now.position[n] for n in names - repelled.keys() if n in self.now.position}

        def in_empty(pos: int) -> bool:
            return self.empty.nodes[pos].name in names

        return Selection(
            now.__contains__, in_empty, len(gpus), products, resting, names, one_node, pods
        )

    def _resting(
        self, matched: list[NodeState], repelled: Mapping[str, Taint]
    ) -> tuple[tuple[str, str], ...]:
        found = []
        for node in matched:
            if node.reported and not node.counted():
                continue
            why = placeable(node, self._snapshot.now, self._settings.heartbeat_ttl)
            taint = repelled.get(node.name)
            if why is None and taint is not None:
                shown = f"{taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"
                why = f"taint {shown}, which its pod template does not tolerate"
            if why is not None:
                found.append((node.name, why))
        return tuple(sorted(found))  # by name, as every tie breaks: whatever the input order

    def place_now(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> Placed | None:
        return place(self.now, estimate, parallelism, n, where.now, where.one_node, where.pods)

    def fits_empty(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> bool:
        return (
            place(self.empty, estimate, parallelism, n, where.empty, where.one_node, where.pods)
            is not None
        )

    def shapes_empty(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> bool:
        """Whether the empty cluster has n GPUs in a shape the parallelism can use (one node
        for a device map and with visibleDevices; otherwise k nodes x g GPUs for DDP and
        FSDP), whatever their memory."""
        found = place_by_count(
            self.empty, estimate, parallelism, n, where.empty, where.one_node, where.pods
        )
        return found is not None

    def widest_empty(self, where: Selection) -> int:
        """The most GPUs one matching node has."""
        nodes = self.empty.nodes
        return max((len(nodes[p].gpus) for p in range(len(nodes)) if where.empty(p)), default=0)

    def place_by_count(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> Placed | None:
        return place_by_count(
            self.now, estimate, parallelism, n, where.now, where.one_node, where.pods
        )

    def place_resting(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> Placed | None:
        """`place_now` as if every matching node took work (the `resting` view)."""
        if not where.resting:
            return None  # every matching node takes work: `resting` would be `now`
        index = self.resting
        names = where.names

        def matching(pos: int) -> bool:
            return names is None or index.nodes[pos].name in names

        return place(index, estimate, parallelism, n, matching, where.one_node, where.pods)

    def resting_nodes(self, placed: Placed, where: Selection) -> tuple[tuple[str, str], ...]:
        """(node, why) for each node of a `place_resting` placement that takes no work now."""
        used = {self.resting.nodes[pos].name for pos, _ in placed.parts}
        return tuple((name, why) for name, why in where.resting if name in used)

    def unknown_size(self, name: str) -> bool:
        """Whether the node's GPUs are not yet reported and no label gives their size."""
        return name in self._unknown

    def assume(self, placed: Placed) -> None:
        """Charge an admission before the next decision reads the free memory."""
        for pos, gpus, held in placed.charges():
            self.now.assume(pos, gpus, held, slots=self.counts_slots)
            self._log(self.now.nodes[pos].name, gpus, held)

    def _log(self, name: str, gpus: tuple[int, ...], held: tuple[int, ...] | None) -> None:
        self._changes.append((name, gpus, held))
        if "resting" in self.__dict__:  # built: keep it current, as `now` is
            self._change(self.resting, name, gpus, held)

    def hold_closest(
        self, estimate: Estimate, parallelism: Parallelism, n: int, where: Selection
    ) -> None:
        """Keep the GPUs a starving job is closest to fitting from later jobs of this pass."""
        held = closest(self.now, estimate, parallelism, n, where.now, where.one_node, where.pods)
        for pos, gpus in held.parts if held else ():
            self.now.hold(pos, gpus)
            self._log(self.now.nodes[pos].name, gpus, None)

    def node_gpus(self, placed: Placed) -> tuple[NodeGpus, ...]:
        """The placement in API terms: node names, GPU indices and UUIDs."""
        out = []
        for pos, gpus in placed.parts:
            node = self.now.nodes[pos]
            slots = [node.gpus[i] for i in gpus]
            out.append(
                NodeGpus(node.name, tuple(s.index for s in slots), tuple(s.uuid for s in slots))
            )
        return tuple(out)

    def tightest(self, placed: Placed) -> tuple[int, str, int]:
        """(free, node, GPU index) of the GPU with the least free memory the placement may
        get: one of its GPUs, or with `devicePlugin` the least free GPU its nodes' device
        plugins may hand out (`index.bound`), which may be a GPU the placement does not name.
        Before the placement is assumed; ties by node name, then index."""
        found = []
        for pos, gpus in placed.parts:
            node = self.now.nodes[pos]
            least = bound(node) if self.unpinned else None
            if least is not None:
                found.append((least[0], pos, least[1]))
            else:
                found.extend((node.gpus[i].free, pos, node.gpus[i].index) for i in gpus)
        free, pos, index = min(found)
        return free, self.now.nodes[pos].name, index

    def largest_now(self, where: Selection) -> tuple[int, str, int] | None:
        """(free, node, GPU index) of the matching GPU with the most free memory now; for
        messages, so never below 0 (effective free is, past a headroom larger than the GPU)."""
        found = self.now.largest_free(where.now)
        if found is None:
            return None
        return max(0, found[0]), self.now.nodes[found[1]].name, found[2]

    def count_now(self, where: Selection, need: int, enough: int) -> int:
        """How many matching GPUs take work and have `need` free now, up to `enough`."""
        return self.now.count_free(need, where.now, enough)

    def count_empty(self, where: Selection, need: int, enough: int) -> int:
        """How many matching GPUs hold `need` when the cluster is empty, up to `enough`."""
        return self.empty.count_free(need, where.empty, enough)

    def largest_empty(self, where: Selection) -> tuple[int, str, int] | None:
        """`largest_now` in the empty cluster: what a GPU holds at most, less headroom, of
        the GPUs whose size is known."""
        if self._unknown:
            nodes, unknown = self.empty.nodes, self._unknown
            found = self.empty.largest_free(
                lambda pos: where.empty(pos) and nodes[pos].name not in unknown
            )
        else:
            found = self.empty.largest_free(where.empty)
        if found is None:
            return None
        return max(0, found[0]), self.empty.nodes[found[1]].name, found[2]
