"""The learning loop's wiring to the API: jobs and LearnedCorrection objects in, records,
corrections and the key objects to write out. Pure: the scheduler hands in what its caches hold.

**What a job teaches, and when.** A job teaches once it ends, in the status write that ends it
(`sample`, into `status.learnedSample`), or earlier while it runs past its first steps:

* Succeeded with `status.observed` peaks: a **Steady** sample, observed per-GPU peak over the
  estimator's own per-GPU figure at the NVML level (`status.estimate.perGpuLevels.nvmlBytes`,
  never the corrected figure: a ratio to a corrected figure would correct twice).
* Running, with its highest peak not grown past the write threshold for
  `LearningSettings.steady_seconds` (`status.observed.peakSince`): a Steady sample marked
  `running` (`running_sample`). The first optimizer step, which allocates the optimizer
  states, comes minutes into a run at most, so a peak steady for longer is the step's. The
  job's end files its sample **in place of** the running one (`revised`: revision 1, counted
  as `<uid>/1`, and `replaces` names the running sample, which the leader takes out of each
  key the new one is filed under), so no job weighs twice and the end has the last word (a
  peak that grew in an evaluation pass, a GPU OOM after all).
* Failed with reason `GPUOutOfMemory` (`controller.workload.state`: a trainer container's
  termination message or log tail names `CUDA out of memory` / `OutOfMemoryError`): an
  **OutOfMemory** sample, `controller.learning.record_oom`'s need (the larger of what it was
  reserved and what it was seen using, bumped by VPA's 20 % / 100 MiB) over its prediction;
  its key is raised at once, so the job applied again is reserved more.

Anything else (a host OOMKilled, a failure of the trainer's own) teaches nothing.

**The image in a key** (`controller.learning.keys`) is the trainer image's digest wherever
one is known, so that a moved tag does not mix two images' samples and two tags of one image
share theirs:

* A sample is filed under the digest the job's pods reported (`status.observed.imageDigest`,
  `sample_key`), else under the template's image string.
* A job not yet running has no pod to ask (`job_key`, `image_digests`): it is keyed by the
  digest most recently reported by a job of the same template image string (the latest
  `imageDigestTime` among the jobs the caches hold, rebuilt each pass: no extra reads, and
  `vramgate plan` reads the same statuses from its dump); else by the digest its template
  pins (`name@sha256:...`); else by the string itself (a tag never run here: the coarser keys
  still apply through the ladder). A reported digest goes before the pin because it is the
  runtime's name for what the pin gave, the name the samples are filed under (Docker reports
  a locally built image by its config digest, not its repository digest).
* **A tag that moves**: the next job of the tag is keyed by the old digest until a pod of the
  new image reports; until then it gets the old image's correction, where the old image's
  finest key has k samples, else the coarser keys'. Acceptable: a new build of one trainer
  mostly allocates as the old one did (the reason the image is the first field the ladder
  drops), its own samples start the new digest's key from its first job, and an OOM of it is
  filed under the new digest, which its re-run is keyed by once that pod reported.

**Counted once.** The sample goes into the job's own status with its end, atomically. The
leader then files each job's sample under every key of its ladder whose object has not counted
the job (`countedUIDs`, the latest `MAX_COUNTED_UIDS`, plus `countedThrough`: any sample taken
at or before it is counted), and writes the key's status with the uid added, carrying the
object's resourceVersion: a restart, a failover or a stale cache finds the uid counted (or its
write refused) and files nothing twice. A key object deleted (a reset) is rebuilt from the
jobs still in the API that carry a sample; `spec.resetAt` rebuilds it from the samples taken
since (`countedThrough` = resetAt). Samples are filed oldest first, so an OOM's raise is
cleared only by a job of its key that succeeded after it.

**Forgotten.** A key naming a configuration is one object per configuration a cluster ever
ran; one that no job has taught for `FORGET_AFTER_HALF_LIVES` half-lives (to the next whole
half-life), that no person pinned and that holds no OOM raise answers for nothing its kind's
keys do not (its samples weigh at most 1/256 of a new one's), and the leader deletes it
(`forgotten`), as VPA's recommender drops an aggregation whose last sample is older than its
aggregation window. The jobs still in the API that taught it do not make it again: a
configuration's key is not created of samples that old (`file_samples`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from controller.admission import observed
from controller.admission.cluster import parse_time
from controller.admission.metric_view import Gauge
from controller.api import conditions as cond
from controller.api.enums import EstimateCorrection
from controller.api.learnedcorrection import MAX_COUNTED_UIDS, object_name
from controller.base.units import format_gib
from controller.estimator import Estimate
from controller.jobs.spec import JobPlan, config_digest
from controller.learning import (
    ANY,
    Correction,
    DecayingHistogram,
    JobKey,
    KeyRecord,
    LearningSettings,
    Policy,
    Source,
    correct,
    image_digest,
    record_oom,
    record_steady,
)
from controller.learning.histogram import format_time
from controller.learning.keys import FIELDS
from controller.learning.record import own_keys
from controller.packing.view import ClusterView

STEADY = "Steady"
OUT_OF_MEMORY = "OutOfMemory"
#: The per-job spelling of each policy (`spec.estimateCorrection`).
POLICIES = {
    EstimateCorrection.OFF.value: Policy.OFF,
    EstimateCorrection.RAISE_ONLY.value: Policy.RAISE_ONLY,
    EstimateCorrection.ADJUST.value: Policy.ADJUST,
}
#: Sources whose correction is said in the Estimated condition (the others change nothing).
SAID = (Source.LEARNED, Source.PINNED, Source.OUT_OF_MEMORY)

#: Half-lives without a sample after which a configuration's key is deleted (`forgotten`): 16
#: to 18 weeks at the default 14 days (the last sample's time is known to a half-life).
FORGET_AFTER_HALF_LIVES = 8


# -- a job's key and its correction ---------------------------------------------------------


def job_key(
    job: Mapping[str, Any],
    estimate: Mapping[str, Any],
    digests: Mapping[str, str] | None = None,
) -> JobKey:
    """The finest key a job is corrected by before it runs, from its spec and `estimate` (its
    `status.estimate`: the profile that made the prediction, the parallelism it assumes and
    the configuration it was made of, `config_digest`; the spec's digest where it has none).
    The family is config.json's model_type as read without I/O (`observed.spec_family`; a
    model in a ConfigMap is `*`: such jobs share the coarser keys). The image is
    `admission_image` of `digests` (`image_digests` of the jobs the pass sees)."""
    spec = job.get("spec") or {}
    return _key(spec, estimate, admission_image(spec, digests or {}))


def sample_key(
    job: Mapping[str, Any], estimate: Mapping[str, Any], observed_status: object
) -> JobKey:
    """The key a job's sample is filed under: `job_key`'s fields, the image the digest its
    pods reported (`status.observed.imageDigest`, `observed_status`), else the template's
    image string. The configuration is the one its estimate was made of
    (`status.estimate.config`): a spec edited while the job runs is not what ran."""
    spec = job.get("spec") or {}
    seen = observed.image_seen(observed_status)
    return _key(spec, estimate, seen.digest if seen is not None else _image(spec))


def _key(spec: Mapping[str, Any], estimate: Mapping[str, Any], image: str | None) -> JobKey:
    training = spec.get("training") if isinstance(spec.get("training"), Mapping) else {}
    family = observed.spec_family(spec)
    return JobKey.of(
        family=None if family == observed.UNKNOWN_FAMILY else family,
        method=_clean(spec.get("method")),
        parallelism=_clean(estimate.get("parallelism")),
        profile=_clean(estimate.get("profile")),
        framework=_clean((training or {}).get("framework")),
        image=image,
        config=_clean(estimate.get("config")) or config_digest(spec),
    )


def _clean(value: object) -> str | None:
    return value.replace(",", "").replace("=", "") if isinstance(value, str) else None


def _image(spec: Mapping[str, Any]) -> str | None:
    """The trainer container's image as the template names it."""
    trainer = observed.trainer_container(spec)
    return None if trainer is None else _clean(trainer.get("image"))


def admission_image(spec: Mapping[str, Any], digests: Mapping[str, str]) -> str | None:
    """A job's image before its pods report one (module docstring): the digest last reported
    for its template's image string, else the digest the string pins, else the string."""
    image = _image(spec)
    if image is None:
        return None
    return digests.get(image) or image_digest(image) or image


def image_digests(jobs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each template image string's digest as most recently reported (the latest
    `status.observed.imageDigestTime` of the jobs that name it; the larger digest on a tie,
    so every replica and `vramgate plan` read one answer): what a tag means now."""
    latest: dict[str, tuple[datetime, str]] = {}
    for job in jobs:
        seen = observed.image_seen((job.get("status") or {}).get("observed"))
        if seen is None:
            continue
        image = _image(job.get("spec") or {})
        if image is None:
            continue
        found = (seen.at, seen.digest)
        if image not in latest or found > latest[image]:
            latest[image] = found
    return {image: digest for image, (_, digest) in latest.items()}


def job_policy(spec: Mapping[str, Any]) -> Policy | None:
    """`spec.estimateCorrection` as a policy; None: the cluster's. The API server's schema
    refuses any other value."""
    return POLICIES.get(str(spec.get("estimateCorrection") or ""))


def correction(
    estimate_bytes: int,
    key: JobKey,
    records: Mapping[str, KeyRecord],
    settings: LearningSettings,
    spec: Mapping[str, Any],
    now: datetime | None = None,
) -> Correction:
    return correct(estimate_bytes, key, records, settings, job_policy(spec), now)


def corrected(
    job: Mapping[str, Any],
    plan: JobPlan,
    est: Estimate,
    gpus: int,
    records: Mapping[str, KeyRecord],
    settings: LearningSettings,
    view: ClusterView | None = None,
    now: datetime | None = None,
    digests: Mapping[str, str] | None = None,
) -> Correction:
    """What was learned of jobs like `job`, applied to its estimator's figure at `gpus`:
    the one rule the operator's pass and `vramgate plan` share, so a plan on a dump decides
    on the operator's figures. `digests`: `image_digests` of the jobs seen (the job's key).

    A margin must not refuse a job its own estimate fits: a figure raised past what the
    largest matching GPU holds (empty, less headroom; `view`) is capped there (`capped`),
    unless it was raised after a job like it ran out of memory, whose need it is."""
    made_of = {"profile": est.profile, "parallelism": plan.parallelism.api, "config": plan.config}
    key = job_key(job, made_of, digests)
    figure = est.per_gpu_bytes(gpus, plan.parallelism)
    found = correction(figure, key, records, settings, job.get("spec") or {}, now)
    if view is None or found.per_gpu_bytes <= figure:
        return found
    largest = view.largest_empty(view.select(plan.gpu_selector or {}))
    return found if largest is None else capped(found, largest[0])


def capped(found: Correction, largest_bytes: int) -> Correction:
    """`found`, its factor lowered (whole percent, never below 1.00) so that its figure fits
    a GPU of `largest_bytes` where the estimate itself does. An OOM's raise is never capped:
    the job died below it, and waiting for a larger GPU beats dying again."""
    if found.source is Source.OUT_OF_MEMORY or found.per_gpu_bytes <= largest_bytes:
        return found
    if found.estimate_bytes > largest_bytes:
        return found  # refused either way; the learned figure says by how much
    percent = max(100, largest_bytes * 100 // found.estimate_bytes)
    figure = -(-found.estimate_bytes * percent // 100)
    message = found.message.rsplit(" = ", 1)[0].replace(
        f" x {found.factor_percent / 100:.2f} ", f" x {percent / 100:.2f} ", 1
    )
    message += f", capped to fit the largest GPU ({format_gib(largest_bytes)}) = "
    message += f"{format_gib(figure)} per GPU"
    return replace(found, per_gpu_bytes=figure, factor_percent=percent, message=message)


def correction_status(found: Correction) -> dict[str, Any] | None:
    """`status.estimate.correction`; None where learning changed nothing and says nothing new
    (off, too few samples): a job's status is not rewritten as a key gathers its first k."""
    return found.to_dict() if found.source in SAID else None


# -- LearnedCorrection objects -> records -----------------------------------------------------


@dataclass(frozen=True)
class KeyState:
    """One key's object as the operator reads and writes it."""

    key: JobKey
    record: KeyRecord
    counted: tuple[str, ...] = ()
    counted_through: datetime | None = None
    reset_at: datetime | None = None
    #: The object's resourceVersion (None: not created yet) and whether its spec pins.
    resource_version: str | None = None
    exists: bool = False
    #: The uids counted, with their samples' times, as far as the jobs in the API tell.
    times: Mapping[str, datetime] = field(default_factory=dict)


def key_state(obj: Mapping[str, Any], settings: LearningSettings) -> KeyState | None:
    """A LearnedCorrection as a key's state; None for one whose key does not read (edited by
    hand into nonsense: it is left alone, and corrects nothing)."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    try:
        key = JobKey(**{f: str(spec.get(f) or "*") for f in FIELDS})
    except (TypeError, ValueError):
        return None
    reset_at = _time(spec.get("resetAt"))
    stale = reset_at is not None and reset_at != _time(status.get("resetAt"))
    histogram = DecayingHistogram(half_life_seconds=settings.half_life_seconds)
    oom = None
    if not stale and isinstance(status.get("histogram"), Mapping):
        try:
            histogram = histogram_from_status(status["histogram"])
        except ValueError:
            pass  # rebuilt from the jobs' samples, as if deleted
        else:
            oom = status.get("oomFactorPercent")
    pinned = spec.get("pinnedPercent")
    record = KeyRecord(
        key,
        histogram,
        oom if isinstance(oom, int) and oom >= 1 else None,
        pinned if isinstance(pinned, int) and pinned >= 1 else None,
    )
    counted = () if stale or histogram.samples == 0 else tuple(status.get("countedUIDs") or ())
    through = reset_at if stale else _time(status.get("countedThrough"))
    if reset_at is not None and (through is None or through < reset_at):
        through = reset_at
    meta = obj.get("metadata") or {}
    return KeyState(
        key,
        record,
        counted,
        through,
        reset_at,
        meta.get("resourceVersion"),
        exists=True,
    )


def key_states(
    objects: Iterable[Mapping[str, Any]], settings: LearningSettings
) -> dict[str, KeyState]:
    """Every readable key object, by key name."""
    out = {}
    for obj in objects:
        state = key_state(obj, settings)
        if state is not None:
            out[state.key.name] = state
    return out


def records(states: Mapping[str, KeyState]) -> dict[str, KeyRecord]:
    return {name: state.record for name, state in states.items()}


def histogram_to_status(histogram: DecayingHistogram) -> dict[str, Any]:
    """The histogram with its real numbers as exact decimal strings (the API has no floats)."""
    data = histogram.to_dict()
    return {
        "halfLifeSeconds": data["halfLifeSeconds"],
        "scale": {k: repr(float(v)) for k, v in data["scale"].items()},
        **({"referenceTime": data["referenceTime"]} if data["referenceTime"] else {}),
        "samples": data["samples"],
        "totalWeight": repr(float(data["totalWeight"])),
        "bucketWeights": {k: repr(float(v)) for k, v in data["bucketWeights"].items()},
    }


def histogram_from_status(data: Mapping[str, Any]) -> DecayingHistogram:
    try:
        scale = {k: float(v) for k, v in (data.get("scale") or {}).items()}
        weights = {k: float(v) for k, v in (data.get("bucketWeights") or {}).items()}
    except (TypeError, ValueError) as error:
        raise ValueError(f"histogram: {error}") from None
    return DecayingHistogram.from_dict({**data, "scale": scale, "bucketWeights": weights})


# -- a job's end -> its sample ----------------------------------------------------------------


def sample(
    job_status: Mapping[str, Any], ended: str, key: JobKey, peak_bytes: int, now: datetime
) -> dict[str, Any] | None:
    """`status.learnedSample` of a job that ended with the condition reason `ended` (module
    docstring), or None where it teaches nothing. Where a sample was filed while the job ran,
    the end's sample takes its place (`revised`); where the end teaches nothing, that one
    stands."""
    taught = _sample(job_status, ended, key, peak_bytes, now)
    prior = job_status.get("learnedSample")
    if not isinstance(prior, Mapping):
        return taught
    return revised(prior, taught) or dict(prior)


def running_sample(
    job_status: Mapping[str, Any],
    key: JobKey,
    peak_bytes: int,
    now: datetime,
    settings: LearningSettings,
) -> dict[str, Any] | None:
    """The Steady sample of a running job whose highest peak has not grown for
    `settings.steady_seconds` (module docstring), or None (too soon, none yet, off)."""
    if settings.steady_seconds <= 0 or job_status.get("learnedSample") is not None:
        return None
    since = observed.steady_since(job_status.get("observed"))
    if since is None or (now - since).total_seconds() < settings.steady_seconds:
        return None
    taught = _sample(job_status, cond.REASON_SUCCEEDED, key, peak_bytes, now)
    return None if taught is None else {**taught, "running": True}


def revised(prior: Mapping[str, Any], taught: dict[str, Any] | None) -> dict[str, Any] | None:
    """The end's sample `taught` in place of the running sample `prior` (None where the end
    teaches nothing, or `prior` is no running sample): the end knows the whole run (a peak
    that grew after, a GPU OOM after all, a run resumed as another kind), and a job that
    succeeded clears its key's OOM raise, which a running sample does not."""
    if taught is None or not prior.get("running") or prior.get("revision"):
        return None
    replaces = {
        "observedBytes": int(prior.get("observedBytes") or 0),
        "predictedBytes": int(prior.get("predictedBytes") or 0),
        "time": prior.get("time"),
    }
    # `running` written false, not left out: the status is merge-patched over the running one
    return {**taught, "running": False, "revision": 1, "replaces": replaces}


def _sample(
    job_status: Mapping[str, Any], ended: str, key: JobKey, peak_bytes: int, now: datetime
) -> dict[str, Any] | None:
    if ended == cond.REASON_SUCCEEDED:
        kind = STEADY
    elif ended == cond.REASON_GPU_OUT_OF_MEMORY:
        kind = OUT_OF_MEMORY
    else:
        return None
    estimate = job_status.get("estimate") or {}
    levels = estimate.get("perGpuLevels") or {}
    predicted = int(levels.get("nvmlBytes") or estimate.get("perGpuBytes") or 0)
    reserved = int((job_status.get("placement") or {}).get("perGpuBytes") or 0)
    if predicted <= 0 or (kind == STEADY and peak_bytes <= 0):
        return None
    return {
        "key": key.name,
        "kind": kind,
        "observedBytes": peak_bytes,
        "predictedBytes": predicted,
        "reservedBytes": reserved,
        "time": format_time(now),
    }


@dataclass(frozen=True)
class Sample:
    """One job's sample; `uid` is the sample's id as keys count it (`sample_id`)."""

    uid: str
    key: JobKey
    kind: str
    observed_bytes: int
    predicted_bytes: int
    reserved_bytes: int
    at: datetime
    #: The running sample this one replaces: (its id, observed, predicted, time).
    replaces: tuple[str, int, int, datetime] | None = None
    #: Taken while the job ran: it does not clear its key's OOM raise (the job may still die).
    running: bool = False


def sample_id(job: Mapping[str, Any]) -> str:
    """The id keys count a job's sample by: its uid, `<uid>/1` for the sample its end filed
    in place of a running one."""
    uid = str((job.get("metadata") or {}).get("uid"))
    data = (job.get("status") or {}).get("learnedSample")
    revision = data.get("revision") if isinstance(data, Mapping) else 0
    return f"{uid}/{revision}" if isinstance(revision, int) and revision > 0 else uid


def samples_of(jobs: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """Every job's `status.learnedSample` that reads, oldest first."""
    out = []
    for job in jobs:
        data = (job.get("status") or {}).get("learnedSample")
        if not isinstance(data, Mapping):
            continue
        try:
            replaces = None
            old = data.get("replaces")
            if isinstance(old, Mapping):
                replaces = (
                    str((job.get("metadata") or {}).get("uid")),
                    int(old.get("observedBytes") or 0),
                    int(old["predictedBytes"]),
                    _required_time(old["time"]),
                )
            out.append(
                Sample(
                    sample_id(job),
                    JobKey.parse(str(data["key"])),
                    str(data["kind"]),
                    int(data.get("observedBytes") or 0),
                    int(data["predictedBytes"]),
                    int(data.get("reservedBytes") or 0),
                    _required_time(data["time"]),
                    replaces,
                    data.get("running") is True,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue  # edited by hand into nonsense: teaches nothing
    return sorted(out, key=lambda s: (s.at, s.uid))


# -- samples -> key objects to write --------------------------------------------------------


def file_samples(
    states: Mapping[str, KeyState],
    found: Iterable[Sample],
    settings: LearningSettings,
    now: datetime | None = None,
) -> dict[str, KeyState]:
    """The key states that change when every sample in `found` not counted yet is filed under
    each key of its ladder that has not counted it (module docstring), by key name.

    Linear in the samples: records and counted uids are kept as they change, not rebuilt
    per sample (a rebuilt key refiles every job still in the API at once). With `now`, a
    configuration's key that does not exist is not made of samples that `forgotten` would
    delete at once."""
    records = {name: st.record for name, st in states.items()}
    counted: dict[str, set[str]] = {}  # per key name, built on first use
    added: dict[str, list[str]] = {}
    times: dict[str, datetime] = {}

    def is_counted(name: str, uid: str, at: datetime) -> bool:
        state = states.get(name)
        if state is not None and state.counted_through is not None and at <= state.counted_through:
            return True
        if name not in counted:
            counted[name] = set(state.counted) if state is not None else set()
        return uid in counted[name]

    def holds(name: str, replaced: tuple[str, int, int, datetime]) -> bool:
        """Whether the key's histogram holds the replaced sample: counted, and not before a
        reset (a reset's `countedThrough` marks samples left out, not kept)."""
        uid, _, predicted, at = replaced
        state = states.get(name)
        if predicted <= 0 or (
            state is not None and state.reset_at is not None and at <= state.reset_at
        ):
            return False
        return is_counted(name, uid, at)

    for s in found:
        times[s.uid] = s.at
        todo = [rung for rung in s.key.ladder() if not is_counted(rung.name, s.uid, s.at)]
        if not todo or s.predicted_bytes <= 0:
            continue
        try:
            if s.kind == OUT_OF_MEMORY:
                had = max(s.reserved_bytes, 1)
                filed = record_oom(
                    records, s.key, had, had, s.observed_bytes, s.predicted_bytes, s.at, settings
                )
            elif s.observed_bytes > 0:
                filed = record_steady(
                    records,
                    s.key,
                    s.observed_bytes,
                    s.predicted_bytes,
                    s.at,
                    settings,
                    clears_oom=not s.running,
                    judged_on=_without_the_job(records, s, todo, holds),
                )
            else:
                continue
        except ValueError:
            continue
        for rung in [r for r in todo if r.name in filed]:  # an OOM files its own key only
            kept = records.get(rung.name)
            pinned = kept.pinned_percent if kept is not None else None
            record = replace(filed[rung.name], pinned_percent=pinned)
            if s.replaces is not None and holds(rung.name, s.replaces):
                # The running sample this one replaces, out of the key: only where the new
                # one is filed (and counted), so it is taken out once.
                old_uid, old_observed, old_predicted, old_at = s.replaces
                times.setdefault(old_uid, old_at)
                removed = record.histogram.remove(old_observed / old_predicted, old_at)
                record = replace(record, histogram=removed)
            records[rung.name] = record
            counted[rung.name].add(s.uid)
            added.setdefault(rung.name, []).append(s.uid)
    out = {}
    for name, uids in added.items():
        start = states.get(name) or KeyState(records[name].key, records[name])
        record = records[name]
        if not start.exists and now is not None and record.key.config != ANY and _idle(record, now):
            # Old samples of a forgotten configuration: not a key to make again (not even
            # for an OOM's raise, which the success that cleared it may no longer be here to
            # clear again).
            continue
        state = replace(start, record=record, counted=(*start.counted, *uids))
        out[name] = _bounded(state, times)
    return out


def forgotten(states: Mapping[str, KeyState], now: datetime) -> list[KeyState]:
    """The configurations' keys to delete (module docstring): no sample for
    `FORGET_AFTER_HALF_LIVES` half-lives, no pin, no OOM raise."""
    found = [
        state
        for state in states.values()
        if state.exists
        and state.resource_version is not None
        and _forgettable(state.record)
        and _idle(state.record, now)
    ]
    return sorted(found, key=lambda state: state.key.name)


def _forgettable(record: KeyRecord) -> bool:
    """A configuration's key that nobody pinned and no OOM raised: what it learned is in its
    kind's keys too."""
    return (
        record.key.config != ANY
        and record.pinned_percent is None
        and record.oom_factor_percent is None
    )


def _idle(record: KeyRecord, now: datetime) -> bool:
    """No sample for `FORGET_AFTER_HALF_LIVES` half-lives. A histogram's reference is its
    latest sample's time rounded down to a whole half-life (`histogram.add` moves it to each
    newer sample's), so that sample is less than a half-life after it."""
    histogram = record.histogram
    if histogram.reference is None:
        return False  # no sample at all: a person's object, or one reset
    idle = (now - histogram.reference).total_seconds() / histogram.half_life_seconds
    return idle >= FORGET_AFTER_HALF_LIVES + 1


def _without_the_job(
    records: Mapping[str, KeyRecord],
    s: Sample,
    todo: list[JobKey],
    holds: Callable[[str, tuple[str, int, int, datetime]], bool],
) -> Mapping[str, KeyRecord]:
    """`records` without `s`'s job in them, for `record_steady` to judge its OOM raise on:
    the running sample it replaces taken out where a key holds it, and `s` itself where a
    key counted it already (a rebuilt key's coarser keys). Only for a job whose key holds a
    raise: else nothing is judged."""
    own = [records.get(k.name) for k in own_keys(s.key)]
    if s.running or not any(r is not None and r.oom_factor_percent for r in own):
        return records
    out = dict(records)
    for rung in s.key.ladder():
        found = out.get(rung.name)
        if found is None:
            continue
        histogram = found.histogram
        if rung not in todo:
            # counted it already: its running sample, if any, was replaced there then
            histogram = histogram.remove(s.observed_bytes / s.predicted_bytes, s.at)
        elif s.replaces is not None and holds(rung.name, s.replaces):
            _, observed, predicted, at = s.replaces
            histogram = histogram.remove(observed / predicted, at)
        out[rung.name] = replace(found, histogram=histogram)
    return out


_EPOCH = datetime.fromtimestamp(0, UTC)


def _bounded(state: KeyState, times: Mapping[str, datetime]) -> KeyState:
    """At most MAX_COUNTED_UIDS uids: the oldest samples' give way, and `countedThrough`
    moves to the latest of their times (uids of jobs gone from the API count as oldest)."""
    if len(state.counted) <= MAX_COUNTED_UIDS:
        return state
    ordered = sorted(state.counted, key=lambda uid: (times.get(uid) or _EPOCH, uid))
    dropped = ordered[: len(ordered) - MAX_COUNTED_UIDS]
    kept = set(ordered[len(dropped) :])
    through = state.counted_through
    for uid in dropped:
        at = times.get(uid)
        if at is not None and (through is None or at > through):
            through = at
    return replace(
        state, counted=tuple(u for u in state.counted if u in kept), counted_through=through
    )


def key_object(
    state: KeyState, settings: LearningSettings, now: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LearnedCorrection to create for a key (metadata and spec) and its status."""
    key = state.key
    obj = {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "LearnedCorrection",
        "metadata": {"name": object_name(key)},
        "spec": {f: getattr(key, f) for f in FIELDS},
    }
    return obj, key_status(state, settings, now)


def key_patch(state: KeyState, settings: LearningSettings, now: datetime) -> dict[str, Any]:
    """`key_status` as a merge patch: every bucket of the scale that holds no weight now is
    written null, so the API server drops what the stored status had there (a replaced
    sample taken out, a decayed one dropped, a reset's old samples, which the state was read
    back without)."""
    status = key_status(state, settings, now)
    histogram = state.record.histogram
    weights = status["histogram"]["bucketWeights"]
    for bucket in range(histogram.scale.buckets):
        if bucket not in histogram.weights:
            weights[str(bucket)] = None
    return status


#: The reference figure a key object's own correction is worked out on: its factor does not
#: depend on the figure (integers of percent), only its message's GiB do.
_REFERENCE_BYTES = 1 << 30


def key_status(state: KeyState, settings: LearningSettings, now: datetime) -> dict[str, Any]:
    record = state.record
    histogram = record.histogram
    own = {state.key.name: record}
    yields = correct(_REFERENCE_BYTES, state.key, own, replace(settings, policy=Policy.ADJUST))
    p95 = histogram.percentile(0.95)
    status: dict[str, Any] = {
        "key": state.key.name,
        "samples": histogram.samples,
        "correction": f"{yields.factor_percent / 100:.2f}",
        "correctionPercent": yields.factor_percent,
        "source": yields.source.value,
        "message": _key_message(yields, settings),
        "oomFactorPercent": record.oom_factor_percent,
        "histogram": histogram_to_status(histogram),
        "countedUIDs": list(state.counted),
        "countedThrough": None
        if state.counted_through is None
        else format_time(state.counted_through),
        "resetAt": None if state.reset_at is None else format_time(state.reset_at),
        "updateTime": format_time(now),
    }
    if p95 is not None:
        status["p95Ratio"] = f"{p95:.2f}"
    return status


#: The label names of a key's series: its fields (`*` where it matches any).
KEY_LABELS = FIELDS


def gauges(states: Mapping[str, KeyState], settings: LearningSettings) -> tuple[Gauge, ...]:
    """What each key learned, for Prometheus: its samples, its p95 ratio (the alert's:
    above 1.0 the estimator under-predicts that kind of job) and the correction it yields.

    A key naming a configuration has series only once it answers for its jobs (k samples, a
    pin or an OOM raise): every configuration a cluster ever ran is a key, and a series (or
    an alert) per configuration seen once or twice says nothing its kind's key does not."""
    samples = Gauge(
        "vramgate_learned_samples",
        "Jobs a LearnedCorrection key learned from (every sample ever filed, before decay).",
        KEY_LABELS,
    )
    p95 = Gauge(
        "vramgate_learned_p95_ratio",
        "95th percentile of observed / predicted per-GPU peaks of a key's jobs, decayed: "
        "above 1, the estimator under-predicts that kind of job.",
        KEY_LABELS,
    )
    factor = Gauge(
        "vramgate_learned_correction_ratio",
        "The factor a key yields on the estimate of a job of exactly that kind under policy "
        "adjust (1: the estimate stands).",
        KEY_LABELS,
    )
    for state in sorted(states.values(), key=lambda s: s.key.name):
        values = tuple(getattr(state.key, f) for f in KEY_LABELS)
        histogram = state.record.histogram
        record = state.record
        if (
            state.key.config != ANY
            and histogram.samples < settings.min_samples
            and record.pinned_percent is None
            and record.oom_factor_percent is None
        ):
            continue
        samples.add(values, float(histogram.samples))
        ratio = histogram.percentile(0.95)
        if ratio is not None:
            p95.add(values, ratio)
        own = {state.key.name: state.record}
        yields = correct(_REFERENCE_BYTES, state.key, own, replace(settings, policy=Policy.ADJUST))
        factor.add(values, yields.factor_percent / 100)
    return samples, p95, factor


def _key_message(yields: Correction, settings: LearningSettings) -> str:
    """What the key yields, without a job's figures: `x 0.86, learned (p95 of 12 jobs)`."""
    factor = f"x {yields.factor_percent / 100:.2f}"
    if yields.source is Source.LEARNED:
        return f"{factor}, learned (p{settings.percentile} of {yields.samples} jobs)"
    if yields.source is Source.PINNED:
        return f"{factor}, pinned by hand"
    if yields.source is Source.OUT_OF_MEMORY:
        return f"{factor}, raised after a job of this kind ran out of GPU memory"
    return f"x 1.00: {yields.samples} jobs, {settings.min_samples} needed to learn"


def _time(value: object) -> datetime | None:
    try:
        found = parse_time(value)
    except ValueError:
        return None
    return None if found is None or found.tzinfo is None else found


def _required_time(value: object) -> datetime:
    found = _time(value)
    if found is None:
        raise ValueError("time: must be an RFC 3339 time")
    return found
