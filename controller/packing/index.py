"""Free memory indexed for placement, so a decision never scans 80,000 GPUs.

Two sorted views of the working state, both kept current as reservations are assumed:

* every placeable GPU as `(free, node, index)`: a bisect finds the GPU with the least free
  memory that still holds a need (best fit for one GPU), and walking on from there finds
  the next ones;
* per count g, every node that can give g GPUs as `(cap_g, node)`, where `cap_g` is the
  g-th largest effective free memory on the node: the node can take g GPUs of a need exactly
  when `cap_g >= need`, so a bisect finds the tightest such node, and counts them, so that a
  placement that cannot be made is refused without walking the candidates.

With the device plugin (`unpinned`) a pod gets whichever of its node's free GPUs the device
plugin picks, so a GPU's own free memory promises nothing: a node holds a need on g GPUs only
when every GPU the device plugin may still hand out holds it. Both views then key a node by
its bound, the least free memory among those GPUs (`bound`), for every g up to its open GPUs
and device slots: best fit across nodes is the tightest bound, and the GPUs a placement names
are the node's least free open ones, the worst the pod may get.

Nodes sort by name (their position in the name-sorted list), so every tie breaks by node name
and then GPU index, and the same snapshot always gives the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from sortedcontainers import SortedList

from controller.packing.inventory import NodeSlots, Slot

NodeFilter = Callable[[int], bool]


def bound(node: NodeSlots) -> tuple[int, int] | None:
    """(free, GPU index) of the least free GPU the device plugin may hand a new pod on the
    node: of those no pod's process is on, including GPUs that reservations name but whose
    pods do not run yet (whoever gets one gets it whole, so no reservation is charged). None
    when a pod holds every one."""
    found = [(s.whole_free, s.index) for s in node.gpus if s.whole_free is not None]
    return min(found) if found else None


def schedulable(node: NodeSlots, *, exclusive: bool, unpinned: bool) -> list[int]:
    """Per GPU of the node, the bytes a new job may plan on there: its effective free memory;
    0 on a GPU handed out whole to a job or a pod (`exclusive`); with the device plugin
    (`unpinned`) the node's bound on each GPU it may hand out, and 0 on all of them when the
    node has no device slot left."""
    if not exclusive:
        return [slot.free for slot in node.gpus]
    least = bound(node) if unpinned else None
    out = []
    for slot in node.gpus:
        if slot.taken or (unpinned and (node.slots < 1 or least is None)):
            out.append(0)
        else:
            out.append(least[0] if least is not None else slot.free)
    return out


class FreeIndex:
    """The packer's mutable working state over `nodes` (sorted by name)."""

    def __init__(
        self,
        nodes: Sequence[NodeSlots],
        *,
        exclusive: bool = False,
        one_node: bool = False,
        unpinned: bool = False,
    ) -> None:
        self.nodes = list(nodes)
        self.position = {node.name: pos for pos, node in enumerate(self.nodes)}
        #: GPUs are handed out whole (device plugin, DRA): a reserved GPU takes no more work.
        self.exclusive = exclusive
        #: Every job on one node (visibleDevices: the UUIDs go into one pod's environment).
        self.one_node = one_node
        #: The device plugin picks which of a node's free GPUs a pod gets: a node holds a need
        #: only as far as its bound does (the module's docstring).
        self.unpinned = unpinned
        self.max_gpus = max((len(node.gpus) for node in self.nodes), default=0)
        self._held: list[set[int]] = [
            {i for i, slot in enumerate(node.gpus) if slot.taken} for node in self.nodes
        ]
        self._gpu_keys: list[list[tuple[int, int, int, int]]] = [[] for _ in self.nodes]
        self._cap_keys: list[dict[int, tuple[int, int]]] = [{} for _ in self.nodes]
        gpus: list[tuple[int, int, int, int]] = []
        caps: dict[int, list[tuple[int, int]]] = {g: [] for g in range(1, self.max_gpus + 1)}
        for pos in range(len(self.nodes)):
            self._gpu_keys[pos], self._cap_keys[pos] = self._keys(pos)
            gpus.extend(self._gpu_keys[pos])
            for g, key in self._cap_keys[pos].items():
                caps[g].append(key)
        # Sorted lists of sorted chunks: O(log n) inserts and removals as jobs are assumed,
        # where a plain list would move 80,000 entries for each.
        self._gpus = SortedList(gpus)
        self._caps = {g: SortedList(keys) for g, keys in caps.items()}

    # -- reading ----------------------------------------------------------------------------

    def open_gpus(self, pos: int) -> list[tuple[int, Slot]]:
        """The node's GPUs that take work now: (position on the node, slot)."""
        held = self._held[pos]
        return [(i, slot) for i, slot in enumerate(self.nodes[pos].gpus) if i not in held]

    def frees_desc(self, pos: int, g: int) -> list[int]:
        """The node's g largest effective free memories, largest first; unpinned, the g least
        free GPUs the device plugin may hand out (the worst a pod may get), largest first."""
        if self.unpinned:
            frees = sorted(s.whole_free for s in self.nodes[pos].gpus if s.whole_free is not None)
            return frees[:g][::-1]
        return sorted((slot.free for _, slot in self.open_gpus(pos)), reverse=True)[:g]

    def tightest(self, pos: int, g: int, need: int) -> list[int]:
        """The node's g GPUs with the least free memory that still holds `need`."""
        fitting = sorted(
            (slot.free, slot.index, i) for i, slot in self.open_gpus(pos) if slot.free >= need
        )
        return [i for _, _, i in fitting[:g]]

    def by_count(self, pos: int, g: int) -> list[int]:
        """The g GPUs a placement by count names on the node: those with the most free memory
        (ties by index); unpinned, where the device plugin picks the GPUs, the g least free
        open ones (the worst the pod may get, as `tightest` names), most free first."""
        if self.unpinned:
            least = sorted((slot.free, slot.index, i) for i, slot in self.open_gpus(pos))[:g]
            return [i for _, _, i in sorted(least, key=lambda t: (-t[0], t[1]))]
        ranked = sorted((-slot.free, slot.index, i) for i, slot in self.open_gpus(pos))
        return [i for _, _, i in ranked[:g]]

    def nodes_fitting(self, g: int, need: int, ok: NodeFilter) -> Iterator[int]:
        """Nodes that can give g GPUs of `need` each, tightest first (best fit)."""
        if g == 1:
            seen: set[int] = set()
            for _, pos, _, _ in self._from(self._gpus, need):
                if pos not in seen and ok(pos):
                    seen.add(pos)
                    yield pos
            return
        for _, pos in self._from(self._caps.get(g, _EMPTY), need):
            if ok(pos):
                yield pos

    def nodes_by_free(self, g: int, ok: NodeFilter) -> Iterator[int]:
        """Nodes that can give g GPUs, the most free first (whatever the need); equal ones
        by node name, as everywhere else."""
        tied: list[int] = []
        tied_cap = None
        for cap, pos in reversed(self._caps.get(g, _EMPTY)):
            if cap != tied_cap:
                yield from (p for p in reversed(tied) if ok(p))
                tied, tied_cap = [], cap
            tied.append(pos)
        yield from (p for p in reversed(tied) if ok(p))

    def count_gpus(self, need: int) -> int:
        """How many GPUs take work and hold `need` (on any node, before selectors)."""
        return len(self._gpus) - self._gpus.bisect_left((need,))  # type: ignore[no-any-return]

    def count_nodes(self, g: int, need: int) -> int:
        """How many nodes can give g GPUs of `need` each (before selectors)."""
        caps = self._caps.get(g, _EMPTY)
        return len(caps) - caps.bisect_left((need,))  # type: ignore[no-any-return]

    def count_free(self, need: int, ok: NodeFilter, enough: int) -> int:
        """How many GPUs of the nodes `ok` admits take work and hold `need`, at most as many
        per node as it has device slots open (GPUs allocated to other pods take no work),
        counted up to `enough`: a message needs "fewer than n" or "n", and a pass must not
        walk every GPU of a large cluster for each waiting job."""
        found = 0
        per_node: dict[int, int] = {}
        for entry in self._gpus.irange((need,)):
            pos = entry[1]
            if per_node.get(pos, 0) < self.nodes[pos].slots and ok(pos):
                per_node[pos] = per_node.get(pos, 0) + 1
                found += 1
                if found >= enough:
                    break
        return found

    def largest_free(self, ok: NodeFilter) -> tuple[int, int, int] | None:
        """(free, node position, GPU index) of the GPU with the most free memory; unpinned,
        of the GPU that bounds the node with the highest bound."""
        for free, pos, index, _ in reversed(self._gpus):
            if ok(pos):
                least = bound(self.nodes[pos]) if self.unpinned else None
                return free, pos, index if least is None else least[1]
        return None

    # -- changing ---------------------------------------------------------------------------

    def assume(self, pos: int, gpus: Sequence[int], held: Sequence[int], slots: bool) -> None:
        """Charge a new reservation to the node's GPUs (by their position on the node): each
        GPU holds the matching bytes of `held`."""
        node = self.nodes[pos]
        for i, each in zip(gpus, held, strict=True):
            node.gpus[i].free -= each
            if self.exclusive:
                self._held[pos].add(i)
        if slots:
            node.slots -= len(gpus)
        self._refresh(pos)

    def hold(self, pos: int, gpus: Sequence[int]) -> None:
        """Keep these GPUs from later jobs of this pass (a starving job waits for them)."""
        self._held[pos].update(gpus)
        self._refresh(pos)

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _from(keys: SortedList, need: int) -> Iterator[tuple[int, ...]]:
        return keys.islice(keys.bisect_left((need,)))  # type: ignore[no-any-return]

    def _keys(self, pos: int) -> tuple[list[tuple[int, int, int, int]], dict[int, tuple[int, int]]]:
        node = self.nodes[pos]
        if node.slots < 1:
            return [], {}
        open_gpus = self.open_gpus(pos)
        limit = min(node.slots, len(open_gpus))
        least = bound(node) if self.unpinned else None
        if least is not None:
            # Any GPU it may get is what the node promises: every key is the node's bound.
            gpu_keys = [(least[0], pos, slot.index, i) for i, slot in open_gpus]
            return gpu_keys, {g: (least[0], pos) for g in range(1, limit + 1)}
        gpu_keys = [(slot.free, pos, slot.index, i) for i, slot in open_gpus]
        frees = sorted((slot.free for _, slot in open_gpus), reverse=True)
        cap_keys = {g: (frees[g - 1], pos) for g in range(1, limit + 1)}
        return gpu_keys, cap_keys

    def _refresh(self, pos: int) -> None:
        """Re-key one node, touching only the entries that changed."""
        gpu_keys, cap_keys = self._keys(pos)
        old_gpus, new_gpus = set(self._gpu_keys[pos]), set(gpu_keys)
        for key in old_gpus - new_gpus:
            self._gpus.remove(key)
        for key in new_gpus - old_gpus:
            self._gpus.add(key)
        old_caps = self._cap_keys[pos]
        for g in old_caps.keys() | cap_keys.keys():
            before, after = old_caps.get(g), cap_keys.get(g)
            if before == after:
                continue
            if before is not None:
                self._caps[g].remove(before)
            if after is not None:
                self._caps[g].add(after)
        self._gpu_keys[pos], self._cap_keys[pos] = gpu_keys, cap_keys


_EMPTY: SortedList = SortedList()
