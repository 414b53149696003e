"""`status.observed`: the GPU memory an admitted job's pods were seen using, at its peak.

Why: the estimator's accuracy is measured where it matters, on the cluster's own jobs. The
node agents report the bytes each pod's processes use on each GPU (GPUNode
`status.gpus[].pods`); an admitted job's peak per GPU is the most its pods used there at once.
Pure: the admission pass (`admission.py`) calls these with what the caches hold.

**Only up.** A peak is the maximum of what the job's status says, what this operator saw
earlier (it keeps peaks between passes, so a peak between two status writes is not lost) and
what the agents say now.

**Throttled.** The agents' figures change with every heartbeat; a status write per heartbeat
per job would cost the API server more than the job's own pods. A peak is written when it
grew by more than `GROWTH_BYTES` or `GROWTH_PERCENT` (whichever is larger), when a GPU is seen
for the first time, and along with any other write of the job's status (its end among them),
so the figure written last is exact.

**The trainer image's digest.** The first of the job's pods whose trainer container (the
template's first, matched by name) reports an `imageID` gives `status.observed.imageDigest`
(`reported_digest`), written once, with the write that records the pod running: what the
job's learned sample is filed under, and what a later job of the same template image is
keyed by (`controller.admission.learned`), across restarts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from controller.admission.cluster import parse_time
from controller.api.finetunejob import ObservedGpu, ObservedStatus
from controller.base.units import MIB, format_gib
from controller.estimator import SpecError, load_preset
from controller.jobs.spec import config_map_ref
from controller.learning import image_digest

#: A peak is rewritten once it grew by more than this or `GROWTH_PERCENT`, whichever is larger:
#: 256 MiB is below any estimate's resolution worth reading, 5 % keeps a 70 GiB job's writes
#: to a handful.
GROWTH_BYTES = 256 * MIB
GROWTH_PERCENT = 5
#: The family label of a job whose model family cannot be read without I/O.
UNKNOWN_FAMILY = "unknown"


@dataclass(frozen=True, slots=True)
class GpuPeak:
    """The most one job's pods used on one GPU at once."""

    node: str
    index: int
    uuid: str
    peak_bytes: int


Peaks = Mapping[str, GpuPeak]  # by GPU UUID


#: Where one pod's processes are seen: (node, GPU index, GPU UUID, bytes).
_Seen = tuple[str, int, str, int]
#: Per pod uid, everywhere it is seen.
PodUsage = Mapping[str, tuple[_Seen, ...]]


def pod_usage(gpunodes: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[_Seen, ...]]:
    """Every pod's usage on every GPU, read once per pass: a walk of the cluster's GPUs per
    running job would cost minutes a pass on 5,000 nodes with a thousand jobs."""
    found: dict[str, list[_Seen]] = {}
    for name, gpunode in gpunodes.items():
        for gpu in (gpunode.get("status") or {}).get("gpus") or []:
            for pod in gpu.get("pods") or []:
                if pod.get("uid") is None or pod.get("usedBytes") is None:
                    continue
                where = (name, int(gpu.get("index") or 0), str(gpu.get("uuid")))
                found.setdefault(str(pod["uid"]), []).append((*where, int(pod["usedBytes"])))
    return {uid: tuple(seen) for uid, seen in found.items()}


def seen_now(pod_uids: Collection[str], usage: PodUsage) -> dict[str, GpuPeak]:
    """What the pods `pod_uids` use on each GPU now, summed per GPU (the GPUs they are seen
    on, wherever that is: the device plugin, not vramgate, picks a node's GPU)."""
    out: dict[str, GpuPeak] = {}
    for uid in pod_uids:
        for node, index, uuid, used in usage.get(uid, ()):
            before = out.get(uuid)
            total = used + (before.peak_bytes if before is not None else 0)
            out[uuid] = GpuPeak(node, index, uuid, total)
    return out


def from_status(observed: object) -> dict[str, GpuPeak]:
    """The peaks a job's `status.observed` holds."""
    if not isinstance(observed, Mapping):
        return {}
    out = {}
    for gpu in observed.get("gpus") or []:
        if isinstance(gpu, Mapping) and gpu.get("uuid"):
            uuid = str(gpu["uuid"])
            out[uuid] = GpuPeak(
                str(gpu.get("node") or ""),
                int(gpu.get("index") or 0),
                uuid,
                int(gpu.get("peakBytes") or 0),
            )
    return out


def merged(*sources: Peaks) -> dict[str, GpuPeak]:
    """The highest peak of each GPU across `sources`."""
    out: dict[str, GpuPeak] = {}
    for peaks in sources:
        for uuid, peak in peaks.items():
            best = out.get(uuid)
            if best is None or peak.peak_bytes > best.peak_bytes:
                out[uuid] = peak
    return out


def due(written: Peaks, peaks: Peaks) -> bool:
    """Whether `peaks` must be written over `written` now: a GPU seen for the first time, or
    a peak that grew by more than the larger of GROWTH_BYTES and GROWTH_PERCENT."""
    for uuid, peak in peaks.items():
        before = written.get(uuid)
        if before is None or grew(before.peak_bytes, peak.peak_bytes):
            return True
    return False


def highest(peaks: Iterable[GpuPeak]) -> int:
    return max((peak.peak_bytes for peak in peaks), default=0)


def grew(before: int, after: int) -> bool:
    """Whether a peak of `before` bytes grew to `after` by more than the write threshold (the
    larger of GROWTH_BYTES and GROWTH_PERCENT): less is the same peak, read again."""
    return after - before > max(GROWTH_BYTES, before * GROWTH_PERCENT // 100)


def peak_since(observed: object, peaks: Peaks, now: datetime) -> datetime:
    """`status.observed.peakSince` once `peaks` are written over `observed`: now where the
    highest peak is new or grew past the write threshold, else the time written before."""
    before_top, since = 0, None
    if isinstance(observed, Mapping):
        before_top = int(observed.get("peakBytes") or 0)
        since = _time(observed.get("peakSince"))
    if since is None or before_top <= 0 or grew(before_top, highest(peaks.values())):
        return now
    return since


def steady_since(observed: object) -> datetime | None:
    """`status.observed.peakSince` as written, or None."""
    return _time(observed.get("peakSince")) if isinstance(observed, Mapping) else None


def _time(value: object) -> datetime | None:
    try:
        at = parse_time(value)
    except ValueError:  # edited by hand into nonsense: the wait starts again
        return None
    return at if at is None or at.tzinfo is not None else None  # no zone: not comparable


@dataclass(frozen=True, slots=True)
class ImageSeen:
    """The trainer image's digest a job's pods reported, and when it was first read."""

    digest: str
    at: datetime


def status(
    peaks: Peaks, since: datetime | None = None, image: ImageSeen | None = None
) -> dict[str, Any]:
    """`status.observed` of `peaks`, GPUs in node and index order, their highest peak last
    grown at `since`, and the trainer image's digest where a pod reported it."""
    top = highest(peaks.values())
    return ObservedStatus(
        peak_bytes=top,
        peak_gib=format_gib(top),
        peak_since=since,
        gpus=[
            ObservedGpu(node=p.node, index=p.index, uuid=p.uuid, peak_bytes=p.peak_bytes)
            for p in sorted(peaks.values(), key=lambda p: (p.node, p.index, p.uuid))
        ],
        image_digest=None if image is None else image.digest,
        image_digest_time=None if image is None else image.at,
    ).model_dump(mode="json", by_alias=True, exclude_none=True)


def trainer_container(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The trainer container: the template's first (the one vramgate sizes), or None."""
    template = spec.get("template") if isinstance(spec, Mapping) else None
    if not isinstance(template, Mapping):
        return None
    containers = (template.get("spec") or {}).get("containers") or []
    return containers[0] if containers and isinstance(containers[0], Mapping) else None


def reported_digest(spec: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The digest of the trainer image the job's pods report (the trainer container's
    `status.containerStatuses[].imageID`, normalized by `image_digest`), from the first pod
    by name that reports one; None before any does (a pod still pulling, a runtime that
    says none). Pods of one job that report two digests (a tag moved between two nodes'
    pulls) ran two images; the first one names the job, as well as any."""
    trainer = trainer_container(spec)
    name = None if trainer is None else trainer.get("name")
    if not name:
        return None
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name") or "")):
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            if isinstance(container, Mapping) and container.get("name") == name:
                found = image_digest(container.get("imageID"))
                if found is not None:
                    return found
    return None


def image_seen(observed: object) -> ImageSeen | None:
    """`status.observed.imageDigest` and its time, as written (None: none yet, or edited by
    hand into something that is no digest; a digest without a readable time counts as seen
    at the epoch, the oldest)."""
    if not isinstance(observed, Mapping):
        return None
    digest = image_digest(observed.get("imageDigest"))
    if digest is None:
        return None
    return ImageSeen(digest, _time(observed.get("imageDigestTime")) or _EPOCH)


_EPOCH = datetime.fromtimestamp(0, UTC)


def spec_family(spec: Mapping[str, Any]) -> str:
    """The model family (config.json's `model_type`) of a spec, read without I/O: the
    preset's, or the inline config's (Llama-style when it says none, as the estimator reads
    it); UNKNOWN_FAMILY for a model in a ConfigMap or a spec that names no model."""
    model = spec.get("model") if isinstance(spec, Mapping) else None
    if not isinstance(model, Mapping) or config_map_ref(spec) is not None:
        return UNKNOWN_FAMILY
    config = model.get("config")
    if isinstance(config, Mapping):
        found = config.get("model_type")
        return found if isinstance(found, str) and found else "llama"
    preset = model.get("preset")
    if isinstance(preset, str):
        try:
            found = load_preset(preset).config.get("model_type")
        except SpecError:  # an unknown preset: the job is InvalidSpec, never admitted
            return UNKNOWN_FAMILY
        return found if isinstance(found, str) and found else "llama"
    return UNKNOWN_FAMILY
