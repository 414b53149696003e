"""Trainer's runtimes in the caches (`trainJobSizing`): what the TrainJob webhook looks up."""

from __future__ import annotations

from typing import Any

from controller.admission.trainer_runtime import RuntimeRef
from controller.operator.caches import (
    CLUSTER_TRAINING_RUNTIMES,
    INDEXES,
    TRAINING_RUNTIMES,
    Caches,
)


def test_a_runtime_is_found_by_its_kind_name_and_namespace_and_none_before_it_is_cached() -> None:
    cluster_wide, namespaced = {"name": "cluster"}, {"name": "namespaced"}
    kwargs: dict[str, Any] = {name: {} for name in INDEXES}
    kwargs[CLUSTER_TRAINING_RUNTIMES] = {"tune": [cluster_wide]}
    kwargs[TRAINING_RUNTIMES] = {"ml/tune": [namespaced]}
    caches = Caches.of(kwargs)
    assert caches.runtime(RuntimeRef("ClusterTrainingRuntime", "tune")) is cluster_wide
    assert caches.runtime(RuntimeRef("TrainingRuntime", "tune", "ml")) is namespaced
    assert caches.runtime(RuntimeRef("TrainingRuntime", "tune", "other")) is None
    assert caches.runtime(RuntimeRef("ClusterTrainingRuntime", "else")) is None
    # Without trainJobSizing the indexes are not registered: nothing is found, nothing fails.
    assert Caches.of({name: {} for name in INDEXES}).runtime(RuntimeRef("K", "tune")) is None
