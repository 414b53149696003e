"""Trainer's runtimes in the caches (`trainJobSizing`): what the TrainJob webhook looks up,
indexed by the handlers `caches.register` registers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kopf

from controller.admission.trainer_runtime import RuntimeRef, slim
from controller.operator import caches
from controller.operator.caches import (
    CLUSTER_TRAINING_RUNTIMES,
    INDEXES,
    TRAINER_INDEXES,
    TRAINING_RUNTIMES,
    Caches,
)


def runtime(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": name, **({} if namespace is None else {"namespace": namespace})}
    return {"metadata": meta, "spec": {"mlPolicy": {"numNodes": 2}}}


def indexed(*bodies: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The indexes as kopf hands them to a handler, filled by the registered index handlers
    from (index id, body) events: key -> the values of every object indexed under it."""
    registry: Any = kopf.OperatorRegistry()  # its handler lists are kopf's internals
    caches.register(registry, with_trainer=True)
    handlers = {h.id: h.fn for h in registry._indexing.get_all_handlers()}
    assert set(TRAINER_INDEXES) <= set(handlers)
    kwargs: dict[str, Any] = {name: {} for name in (*INDEXES, *TRAINER_INDEXES)}
    for index, body in bodies:
        meta = body["metadata"]
        found = asyncio.run(
            handlers[index](name=meta["name"], namespace=meta.get("namespace"), body=body)
        )
        for key, value in found.items():
            kwargs[index].setdefault(key, []).append(value)
    return kwargs


def test_a_runtime_is_found_by_its_kind_name_and_namespace_and_none_before_it_is_cached() -> None:
    cluster_wide, namespaced = runtime("tune"), runtime("tune", "ml")
    found = Caches.of(
        indexed((CLUSTER_TRAINING_RUNTIMES, cluster_wide), (TRAINING_RUNTIMES, namespaced))
    )
    assert found.runtime(RuntimeRef("ClusterTrainingRuntime", "tune")) == slim(cluster_wide)
    assert found.runtime(RuntimeRef("TrainingRuntime", "tune", "ml")) == slim(namespaced)
    assert found.runtime(RuntimeRef("TrainingRuntime", "tune", "other")) is None
    assert found.runtime(RuntimeRef("ClusterTrainingRuntime", "else")) is None
    # Without trainJobSizing the indexes are not registered: nothing is found, nothing fails.
    bare: Any = kopf.OperatorRegistry()
    caches.register(bare)
    assert not {h.id for h in bare._indexing.get_all_handlers()} & set(TRAINER_INDEXES)
    assert Caches.of({name: {} for name in INDEXES}).runtime(RuntimeRef("K", "tune")) is None


class _Changing:
    """A kopf store that kopf's loop changes while the review server's thread iterates it,
    the first `times` times."""

    def __init__(self, value: Any, times: int) -> None:
        self.value, self.times = value, times

    def __iter__(self) -> Iterator[Any]:
        if self.times > 0:
            self.times -= 1
            raise RuntimeError("dictionary changed size during iteration")
        return iter([self.value])


def test_a_store_changed_while_it_is_read_is_read_again_then_given_up() -> None:
    """`Caches.runtime` runs on the review server's thread, kopf's loop writes the index."""
    kwargs = indexed((CLUSTER_TRAINING_RUNTIMES, runtime("tune")))
    value = kwargs[CLUSTER_TRAINING_RUNTIMES]["tune"][0]
    ref = RuntimeRef("ClusterTrainingRuntime", "tune")
    kwargs[CLUSTER_TRAINING_RUNTIMES] = {"tune": _Changing(value, times=2)}
    assert Caches.of(kwargs).runtime(ref) is value
    kwargs[CLUSTER_TRAINING_RUNTIMES] = {"tune": _Changing(value, times=99)}
    assert Caches.of(kwargs).runtime(ref) is None  # the TrainJob: "not in the cache" warning
