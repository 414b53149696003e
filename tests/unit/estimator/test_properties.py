"""Invariants that must hold for any valid job, checked on generated inputs (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.estimator import (
    Checkpointing,
    Method,
    Optimizer,
    Parallelism,
    Profile,
    TrainingSettings,
    load_shape,
)
from controller.estimator.model import PEFT_REFUSED_MODULES, peft_adaptable_modules
from controller.estimator.presets import hand_read_preset_names
from controller.jobs.profiles import estimate
from controller.packing.fit import fit

GIB = 2**30
SHAPES = {name: load_shape(name) for name in hand_read_preset_names()}
presets = st.sampled_from(sorted(SHAPES))
# trace runs a real training step (seconds each); its own tests cover it.
profiles = st.sampled_from([Profile.ANALYTIC, Profile.UNSLOTH])
gc = st.sampled_from(list(Checkpointing))
optimizers = st.sampled_from(list(Optimizer))


@st.composite
def jobs(draw: st.DrawFn) -> tuple[str, TrainingSettings]:
    name = draw(presets)
    limit = SHAPES[name].max_position_embeddings or 8192
    s = TrainingSettings(
        method=draw(st.sampled_from(list(Method))),
        rank=draw(st.integers(1, 256)),
        batch=draw(st.integers(1, 16)),
        seq_len=draw(st.integers(1, min(limit, 32768) // 2)),
        gradient_checkpointing=draw(gc),
        optimizer=draw(optimizers),
        profile=draw(profiles),
    )
    if name.endswith("bnb-4bit") and s.method is Method.FULL:
        s = replace(s, method=Method.QLORA)
    if SHAPES[name].model_type in PEFT_REFUSED_MODULES:  # all-linear is refused there
        s = replace(s, targets=peft_adaptable_modules(SHAPES[name]))
    return name, s


def total(name: str, s: TrainingSettings) -> int:
    return estimate(SHAPES[name], s).total_bytes


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_components_sum_to_the_total_and_are_non_negative(
    job: tuple[str, TrainingSettings],
) -> None:
    name, s = job
    e = estimate(SHAPES[name], s)
    assert all(v >= 0 for v in e.components.values())
    assert sum(e.components.values()) == e.total_bytes
    assert e.sharded_bytes + e.replicated_bytes <= e.total_bytes
    assert 0 < e.trainable_params <= max(e.total_params, e.trainable_params)


@settings(max_examples=150, deadline=None)
@given(jobs(), st.integers(1, 4))
def test_monotone_in_sequence_length_and_batch(
    job: tuple[str, TrainingSettings], factor: int
) -> None:
    name, s = job
    base = total(name, s)
    assert total(name, replace(s, batch=s.batch * factor)) >= base
    assert total(name, replace(s, seq_len=s.seq_len * 2)) >= base


@settings(max_examples=150, deadline=None)
@given(jobs(), st.integers(1, 128))
def test_monotone_in_rank(job: tuple[str, TrainingSettings], extra: int) -> None:
    name, s = job
    if not s.is_adapter:
        return
    assert total(name, replace(s, rank=(s.rank or 1) + extra)) >= total(name, s)


@settings(max_examples=150, deadline=None)
@given(jobs())
def test_qlora_le_lora_le_full(job: tuple[str, TrainingSettings]) -> None:
    name, s = job
    if name.endswith("bnb-4bit"):
        return  # a pre-quantised checkpoint cannot be fully fine-tuned
    q = total(name, replace(s, method=Method.QLORA))
    lo = total(name, replace(s, method=Method.LORA))
    full = total(name, replace(s, method=Method.FULL))
    assert q <= lo <= full


@settings(max_examples=100, deadline=None)
@given(jobs(), st.integers(2, 64))
def test_gradient_accumulation_changes_nothing(
    job: tuple[str, TrainingSettings], steps: int
) -> None:
    name, s = job
    assert total(name, replace(s, gradient_accumulation=steps)) == total(name, s)


@settings(max_examples=100, deadline=None)
@given(jobs())
def test_checkpointing_never_costs_memory(job: tuple[str, TrainingSettings]) -> None:
    name, s = job
    off = total(name, replace(s, gradient_checkpointing=Checkpointing.OFF))
    assert total(name, replace(s, gradient_checkpointing=Checkpointing.ON)) <= off


@settings(max_examples=200, deadline=None)
@given(
    jobs(),
    st.lists(st.integers(1 * GIB, 200 * GIB), min_size=1, max_size=8),
    st.sampled_from(list(Parallelism)),
)
def test_fit_picks_gpus_that_hold_their_share(
    job: tuple[str, TrainingSettings], free: list[int], parallelism: Parallelism
) -> None:
    name, s = job
    e = estimate(SHAPES[name], s)
    n = len(free)
    result = fit(e, free, parallelism, gpus=n)
    if result.fits:
        assert len(set(result.chosen)) == n
        if parallelism is not Parallelism.DEVICE_MAP:
            assert all(free[i] >= result.per_gpu_bytes for i in result.chosen)
        assert result.min_gpus is not None and result.min_gpus <= n
    else:
        assert result.reason and result.chosen == ()
    if result.min_gpus is not None:
        # The smallest count fits, and one GPU fewer does not.
        assert fit(e, free, parallelism, gpus=result.min_gpus).fits
        if result.min_gpus > 1:
            assert not fit(e, free, parallelism, gpus=result.min_gpus - 1).fits
    # More free memory never turns a fit into a non-fit.
    if result.fits:
        assert fit(e, [f * 2 for f in free], parallelism, gpus=n).fits
