"""Decision messages: one line each, with the numbers a person needs to act on it.

They name the need (per GPU, at which count, with which parallelism), what the cluster has
now and when empty, and what to change (`spec.resources.gpus`, `admissionPolicy`), since the
message is what `kubectl describe ftj` shows. With the `visibleDevices` GPU mode a job never
spans nodes (its GPUs' UUIDs go into one pod's environment), and a count no node has says so.
With `devicePlugin` the device plugin picks which of a node's free GPUs the pod gets, so the
figures are each node's least free such GPU, and the messages say so.
"""

from __future__ import annotations

from controller.decision.types import Decision, JobRequest, Outcome
from controller.estimator import Parallelism
from controller.packing.fit import fewest_fsdp_gpus, gib, plural
from controller.packing.placement import Placed
from controller.packing.view import ClusterView, Selection


def need(job: JobRequest, n: int) -> str:
    """`47.33 GiB per GPU on 2 GPUs with FSDP`."""
    per_gpu = job.estimate.per_gpu_bytes(n, job.parallelism)
    return f"{gib(per_gpu)} per GPU on {plural(n)} with {job.parallelism.api}"


def where(view: ClusterView, placed: Placed) -> str:
    """`node-a GPU 0, 1` or `2 nodes x 4 GPUs (node-a, node-b)`."""
    parts = view.node_gpus(placed)
    if len(parts) == 1:
        (part,) = parts
        label = "GPU" if len(part.indices) == 1 else "GPUs"
        return f"{part.node} {label} {', '.join(map(str, part.indices))}"
    per_node = len(parts[0].indices)
    names = ", ".join(part.node for part in parts[:4]) + (", ..." if len(parts) > 4 else "")
    return f"{len(parts)} nodes x {plural(per_node)} ({names})"


def picks(placed: Placed | None = None) -> str:
    """Why, with `devicePlugin`, a node is judged by its least free GPU."""
    if placed is None:
        whose = "a node's free GPUs a pod"
    elif len(placed.parts) == 1:
        whose = "the node's free GPUs the pod"
    else:
        whose = "each node's free GPUs its pod"
    return f"in GPU mode devicePlugin the device plugin picks which of {whose} gets"


def fits(job: JobRequest, view: ClusterView, placed: Placed, resized: bool) -> str:
    least, node, index = view.tightest(placed)
    left = least - placed.per_gpu_bytes
    text = f"needs {need(job, placed.gpus)}; placed on {where(view, placed)}"
    text += f", {gib(left)} left on the tightest"
    if view.unpinned:
        text += f" GPU it may get ({node} GPU {index}; {picks(placed)})"
    if resized:
        text = (
            # The spec keeps the request (the operator never writes it): say the count only.
            f"resized {job.gpus} -> {plural(placed.gpus)} (policy Resize): "
            f"{plural(job.gpus)} {'does' if job.gpus == 1 else 'do'} not fit now; {text}"
        )
    return text


def advised(job: JobRequest, view: ClusterView, placed: Placed) -> str:
    least, node, index = view.tightest(placed)
    tightest = "the tightest of them"
    if view.unpinned:
        tightest = f"the least free GPU it may get ({node} GPU {index}; {picks(placed)})"
    return (
        f"admitted by GPU count (policy Advise) on {where(view, placed)}, but it needs "
        f"{need(job, placed.gpus)} and {tightest} has {gib(least)} free: it may run "
        "out of memory"
    )


def waiting_for_gpus(job: JobRequest) -> str:
    return (
        f"waits for {plural(job.gpus)} free of other jobs (policy Advise admits by GPU count); "
        f"it needs {need(job, job.gpus)}"
    )


def waiting_for_vram(job: JobRequest, view: ClusterView, at: Selection, n: int) -> str:
    now = view.largest_now(at)
    empty = view.largest_empty(at)
    most = (
        f"the most free GPU has {gib(max(now[0], 0))} ({now[1]} GPU {now[2]})"
        if now is not None
        else "no matching GPU takes work now (nodes not Ready, cordoned, stale agents or GPUs "
        "in use)"
    )
    if now is not None and view.unpinned:
        most = (
            f"{picks()}, and the best node's least free one has {gib(max(now[0], 0))} "
            f"({now[1]} GPU {now[2]})"
        )
    resting = at.resting
    if resting:
        # Their free memory is in `kubectl get gpunodes`: say why it is not counted here.
        shown = "; ".join(f"{name}: {why}" for name, why in resting[:3])
        more = "; ..." if len(resting) > 3 else ""
        verb = "takes" if len(resting) == 1 else "take"
        most += f" ({plural(len(resting), 'matching node')} {verb} no work now: {shown}{more})"
    largest = f"; the cluster's largest holds {gib(empty[0])} usable" if empty else ""
    per_gpu = job.estimate.per_gpu_bytes(n, job.parallelism)
    if now is not None and now[0] >= per_gpu and n > 1:
        # The most free GPU holds it: the blocker is how many others do, or where they are.
        have = view.count_now(at, per_gpu, enough=n)  # counted up to n: enough to say why
        verb = "has" if have == 1 else "have"
        holding = f"{verb} {gib(per_gpu)} free now"
        if view.unpinned:
            verb = "is" if have == 1 else "are"
            holding = f"{verb} on nodes whose free GPUs all have {gib(per_gpu)} free now"
        if have >= n:
            most = (
                f"{n} or more matching GPUs that take work {holding}, but "
                f"no {n} of them in a placement it can use ({_shape(job, view, at)})"
            )
        else:
            most = f"only {have} of the matching GPUs that take work {holding}"
            if view.unpinned:
                most += f" ({picks()})"
    never = "never fits" if job.gpus == 1 else "never fit"
    prefix = "" if n == job.gpus else f"{plural(job.gpus)} {never}; "
    return f"{prefix}needs {need(job, n)}; {most}{largest}, so it waits for memory"


def waiting_for_nodes(
    job: JobRequest, view: ClusterView, at: Selection, n: int, placed: Placed
) -> str:
    """A job that would fit now on nodes that take no work now: which, and why they take
    none. Of a node whose GPUs' size is unknown, only that it may."""
    resting = view.resting_nodes(placed, at)
    unknown = any(view.unknown_size(name) for name, _ in resting)

    def why(name: str, reason: str) -> str:
        return f"{reason}{', their size unknown' if view.unknown_size(name) else ''}"

    if len(resting) == 1:
        ((name, reason),) = resting
        nodes, pronoun = f"{name}, which takes no work now ({why(name, reason)})", "it"
    else:
        shown = "; ".join(f"{name}: {why(name, reason)}" for name, reason in resting[:3])
        shown += "; ..." if len(resting) > 3 else ""
        nodes, pronoun = f"{plural(len(resting), 'node')} that take no work now ({shown})", "them"
    count = "" if n == job.gpus else f" (policy Resize: the count nearest {job.gpus} there)"
    would = "may" if unknown else "would"
    return f"needs {need(job, n)}{count}; it {would} fit now on {nodes}, so it waits for {pronoun}"


def _one_node(view: ClusterView, at: Selection) -> bool:
    """Whether the job must run on one node: visibleDevices, or its own pinning (Kueue)."""
    return view.one_node or at.one_node


def _shape(job: JobRequest, view: ClusterView, at: Selection) -> str:
    """The placements a job's GPUs may form."""
    if job.parallelism is Parallelism.DEVICE_MAP or _one_node(view, at):
        return "all on one node"
    return "k nodes x g GPUs, the same g on every node"


def never_fits(
    job: JobRequest, view: ClusterView, at: Selection, high: int, other: int | None
) -> str:
    empty = view.largest_empty(at)
    largest = f"the largest GPU holds {gib(empty[0])} usable" if empty else "no GPU reports memory"
    if other is not None:
        return (
            f"needs {plural(other)} with {job.parallelism.api} "
            f"({gib(job.estimate.per_gpu_bytes(other, job.parallelism))} each); requested "
            f"{job.gpus}; policy {job.policy.value}: set spec.resources.gpus to {other} or "
            "admissionPolicy Resize"
        )
    if high != job.gpus:
        # One node per job (visibleDevices): counts above the widest node are no shape at all.
        top = min(high, view.widest_empty(at)) if _one_node(view, at) else high
        notes = [_one_node_note(view, at, high), _too_few_or_apart(job, view, at, top, empty)]
        note = "; ".join(part for part in notes if part)
        return (
            f"no count in [{job.min_gpus}, {high}] fits even when the cluster is empty: it needs "
            f"{need(job, top)} at the most; {largest}{'; ' + note if note else ''}"
        )
    apart = _too_few_or_apart(job, view, at, job.gpus, empty)
    if apart:  # the largest GPU holds the need: saying so alone would contradict the refusal
        return f"needs {need(job, job.gpus)}; {largest}, but even when the cluster is empty {apart}"
    hint = ""
    if empty and job.parallelism is Parallelism.FSDP:
        enough = fewest_fsdp_gpus(job.estimate, empty[0])
        if enough:
            note = _one_node_note(view, at, enough)
            but = f", but {note}" if note else ""
            with_fsdp = " with FSDP" if enough > 1 else ""
            hint = f" (at least {plural(enough)} of that size would hold it{with_fsdp}{but})"
    return f"needs {need(job, job.gpus)}; {largest}, even when the cluster is empty{hint}"


def _too_few_or_apart(
    job: JobRequest, view: ClusterView, at: Selection, n: int, empty: tuple[int, str, int] | None
) -> str:
    """Why n GPUs fail the empty cluster although its largest GPU (`empty`) holds their
    per-GPU need: too few GPUs hold it, or those that do are in no placement the job can use
    ('' when the largest GPU is too small, which the message says already)."""
    each = job.estimate.per_gpu_bytes(n, job.parallelism)
    if empty is None or each > empty[0]:
        return ""
    have = view.count_empty(at, each, enough=n)
    if have >= n:
        return (
            f"the {n} or more GPUs that hold {gib(each)} are in no placement it can use "
            f"({_shape(job, view, at)})"
        )
    return f"only {plural(have)} {'holds' if have == 1 else 'hold'} {gib(each)}"


def _one_node_note(view: ClusterView, at: Selection, n: int, why: bool = False) -> str:
    """Why n GPUs are no shape with `visibleDevices` (one node per job), or '' if they can be."""
    widest = view.widest_empty(at)
    if not _one_node(view, at) or n <= widest:
        return ""
    if not view.one_node:  # the job's own pinning
        because = " (one nodeSelector per podSet pins its pods)" if why else ""
        return (
            f"a Kueue Workload runs on one node{because}, and the matching nodes have at most "
            f"{plural(widest)} each"
        )
    because = " (its GPUs' UUIDs go into one pod's NVIDIA_VISIBLE_DEVICES)" if why else ""
    return (
        f"GPU mode visibleDevices keeps a job on one node{because}, and the matching nodes "
        f"have at most {plural(widest)} each"
    )


def no_matching_gpu(job: JobRequest, view: ClusterView) -> str:
    every = view.select({})
    if every.gpus == 0:
        return "no GPU node has reported its GPUs (is the vramgate agent running on them?)"
    products = ", ".join(every.products) or "not yet reported"
    wanted = []
    if job.selector:
        selector = ", ".join(f"{k}={v}" for k, v in sorted(job.selector.items()))
        wanted.append(f"spec.resources.gpuSelector {{{selector}}}")
    if job.constraints is not None and (template := job.constraints.describe()):
        wanted.append(f"the pod template's {template}")
    message = "no GPU node " + (f"matches {' and '.join(wanted)}" if wanted else "takes its pods")
    return f"{message}; the cluster's GPUs are: {products}"


def too_few_gpus(job: JobRequest, at: Selection, low: int) -> str:
    return (
        f"requests {plural(low)}; the cluster has {plural(at.gpus, 'matching GPU')} "
        "(with reported memory, or on nodes whose agent has not reported them yet)"
    )


def no_shape(job: JobRequest, view: ClusterView, at: Selection) -> str:
    widest = view.widest_empty(at)
    if job.parallelism is Parallelism.DEVICE_MAP:
        shape = "on one node (a device map)"
    elif at.one_node and not view.one_node:
        return (
            f"needs {plural(job.gpus)} with {job.parallelism.api}; "
            f"{_one_node_note(view, at, job.gpus, why=True)}, so no such placement exists; "
            f"ask for {widest} or fewer GPUs"
        )
    elif view.one_node:
        return (
            f"needs {plural(job.gpus)} with {job.parallelism.api}; "
            f"{_one_node_note(view, at, job.gpus, why=True)}, so no such placement exists; set "
            f"spec.resources.gpus to {widest} or fewer (the devicePlugin and dra GPU modes can "
            "span nodes with DDP or FSDP)"
        )
    else:
        shape = f"as k nodes x g GPUs with the same g on every node ({job.parallelism.api})"
    return (
        f"needs {plural(job.gpus)} {shape}; the matching nodes have at most "
        f"{plural(widest)} each, so no such placement exists"
    )


def no_template(decision: Decision) -> str:
    """A job without a pod template is told what admission would do, and holds nothing."""
    if decision.admitted:
        would = "would be admitted"
    elif decision.outcome is Outcome.QUEUE:
        would = "would wait"
    else:
        would = "would be rejected"
    return (
        f"spec.template is empty, so there is nothing to run and nothing is reserved; the job "
        f"{would} ({decision.reason}: {decision.message})"
    )
