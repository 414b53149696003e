"""What makes two jobs alike enough to learn from each other, and the coarser kinds a job
falls back to while its own kind has too few samples.

A key names seven things that decide how far a job's real peak strays from its prediction:

    config       the job's own configuration: a digest of what in its spec decides its
                 memory (model, method, adapters, training settings, parallelism,
                 estimator; `controller.jobs.spec.config_digest`): the same job
                 run again, VPA's unit
    family       config.json's model_type (llama, qwen2, mistral ...)
    method       Full, LoRA, QLoRA
    parallelism  DDP, FSDP, DeviceMap
    profile      the estimator profile that made the prediction (calibrated, analytic ...)
    framework    the trainer (transformers, torchtune, trl ...)
    image        the trainer image: its digest where known (`image_digest`), else the
                 template's image string (a tag)

**Fallback order** (`JobKey.ladder`), finest first; a job's correction comes from the first
key with at least k samples:

    1. config, family, method, parallelism, profile, framework, image
    2. drop the config       (other models, lengths and batches of the same kind)
    3. drop the image        (one trainer's versions mostly allocate alike)
    4. drop the framework    (frameworks differ in loss and checkpointing, less than models)
    5. drop the parallelism  (FSDP's gathers and DDP's buckets are in the estimate already)
    6. drop the family       (what is left: one method under one profile)

**Why the configuration comes first.** The estimator's error is a property of a
configuration far more than of a family: two Llama LoRA jobs of other lengths and batches
stray from their estimates by different amounts (activations' share of the peak differs), while
one configuration run again (a new learning rate, new data of the same shape) strays alike
each time. A key of the family alone mixes them, and its p95 must cover the worst of them; the
configuration's own key, once it has k samples, needs only its own spread. A configuration
seen fewer than k times falls back to the family's key, as before.

The profile and the method are never dropped. A ratio is relative to one profile's figure, so
ratios of two profiles do not mix; and Full and LoRA jobs differ by the optimizer states of the
whole model, the estimate's largest term, so one method's error says little of the other's.
A field vramgate does not know (a model read from a ConfigMap, a template without a
container) is `ANY` from the start: those jobs share the coarser key rather than a key of
their own.

**The image is named by digest** (`sha256:<hex>`), not by tag: a tag moves (`trainer:v1`
pushed again is another image, whose samples must not mix with the old one's), and two tags
of one image (`trainer:v1`, `trainer:latest`) are one trainer, whose samples belong
together. Only a pod knows which image its tag gave it (`status.containerStatuses[].imageID`),
so `controller.admission.learned` files a sample under the digest the job's pods reported,
and keys a job not yet running by the digest its template pins, or the one most recently
reported for its image string; it falls back to the string itself where no digest is known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

#: A field left out of a key: any value matches.
ANY = "*"
#: The fields of a key, in the order its name writes them.
FIELDS = ("family", "method", "parallelism", "profile", "framework", "image", "config")
#: The fields every key name writes; `config` is written only where it is not `ANY`, so the
#: keys (and `LearnedCorrection` names) filed before it existed read back unchanged.
NAMED_ALWAYS = FIELDS[:-1]
#: What each fallback step drops, in order (see the module's docstring).
DROP_ORDER = ("config", "image", "framework", "parallelism", "family")

#: A content digest at the end of an image reference: after `@` (`repo@sha256:...`, a pod's
#: `docker-pullable://repo@sha256:...`), after `://` (`docker://sha256:...`), or alone.
_DIGEST = re.compile(r"(?:^|@|://)((?:sha256:[0-9a-f]{64})|(?:sha512:[0-9a-f]{128}))$")


def image_digest(reference: object) -> str | None:
    """The content digest an image reference names, as `sha256:<hex>` (OCI's sha512 kept as
    it is), or None where it names none (a tag, "", not a string).

    Every spelling a pod's `imageID` or a template's image takes reads the same:
    `docker.io/library/trainer@sha256:<hex>` (containerd, CRI-O),
    `docker-pullable://trainer@sha256:<hex>` and `docker://sha256:<hex>` (Docker),
    `sha256:<hex>`, and a template's pin `trainer:v1@sha256:<hex>`."""
    if not isinstance(reference, str):
        return None
    found = _DIGEST.search(reference.strip().lower())
    return found.group(1) if found is not None else None


@dataclass(frozen=True, slots=True, order=True)
class JobKey:
    """A kind of job. Plain strings: the wiring fills them from the job's spec and status,
    so this package needs none of the API's types."""

    family: str = ANY
    method: str = ANY
    parallelism: str = ANY
    profile: str = ANY
    framework: str = ANY
    image: str = ANY
    config: str = ANY

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or any(c in value for c in ",="):
                raise ValueError(f"{f.name}: must be a string without ',' or '='")

    @classmethod
    def of(cls, **values: str | None) -> JobKey:
        """A key from what is known: None or "" is `ANY`."""
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown key fields {sorted(unknown)}; use {', '.join(FIELDS)}")
        return cls(**{k: (v if v else ANY) for k, v in values.items()})

    def ladder(self) -> tuple[JobKey, ...]:
        """This key and each coarser one, finest first, without repeats (a field already
        `ANY` drops nothing)."""
        keys = [self]
        key = self
        for name in DROP_ORDER:
            key = replace(key, **{name: ANY})
            if key != keys[-1]:
                keys.append(key)
        return tuple(keys)

    @property
    def name(self) -> str:
        """The canonical name: `family=llama,method=LoRA,...,image=*` (and `,config=...` where
        the key names one); what a store files the key under, and what `parse` reads back."""
        return ",".join(
            f"{f}={getattr(self, f)}"
            for f in FIELDS
            if f in NAMED_ALWAYS or getattr(self, f) != ANY
        )

    @classmethod
    def parse(cls, name: str) -> JobKey:
        pairs: Mapping[str, str] = dict(
            part.split("=", 1) for part in name.split(",") if "=" in part
        )
        if not set(NAMED_ALWAYS) <= set(pairs) <= set(FIELDS):
            raise ValueError(
                f"key {name!r}: must name {', '.join(NAMED_ALWAYS)} (and may name config)"
            )
        return cls(**pairs)

    def describe(self) -> str:
        """The fields it names, for people: `llama LoRA FSDP calibrated transformers` (and
        `config 3f2a...` where it names a configuration)."""
        words = [getattr(self, f) for f in NAMED_ALWAYS if getattr(self, f) != ANY]
        if self.config != ANY:
            words.append(f"config {self.config}")
        return " ".join(words) or "any job"
