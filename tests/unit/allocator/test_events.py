"""Lifetimes to events: ticks in order, frees first at a tick."""

from __future__ import annotations

import pytest

from controller.allocator import Event, events_from_intervals


def test_events_come_in_tick_order_with_frees_first() -> None:
    events = events_from_intervals([(100, 0, 2, 0), (200, 2, None, 1), (300, 1, 2, 0)])
    assert events == [
        Event(0, 100, 0, free=False),
        Event(2, 300, 0, free=False),
        Event(0, 100, 0, free=True),
        Event(2, 300, 0, free=True),
        Event(1, 200, 1, free=False),
    ]


def test_a_storage_dead_at_birth_is_freed_after_its_malloc() -> None:
    assert events_from_intervals([(64, 3, 3, 0)]) == [
        Event(0, 64, 0, free=False),
        Event(0, 64, 0, free=True),
    ]


def test_a_death_before_birth_is_an_error() -> None:
    with pytest.raises(ValueError, match="before it was born"):
        events_from_intervals([(64, 3, 2, 0)])
