"""Conditions keep their transition time while their status holds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from controller.api import conditions as cond
from controller.api.enums import ConditionStatus

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def _set(
    conditions: list[dict[str, Any]],
    status: ConditionStatus,
    reason: str,
    message: str = "m",
    generation: int = 1,
    now: datetime = T0,
) -> list[dict[str, Any]]:
    return cond.set_condition(conditions, cond.ESTIMATED, status, reason, message, generation, now)


def test_a_new_condition_starts_now() -> None:
    (c,) = _set([], ConditionStatus.TRUE, cond.REASON_ESTIMATED)
    assert c == {
        "type": "Estimated",
        "status": "True",
        "observedGeneration": 1,
        "lastTransitionTime": "2025-03-01T12:00:00Z",
        "reason": "Estimated",
        "message": "m",
    }


def test_same_status_keeps_the_transition_time_and_updates_the_rest() -> None:
    first = _set([], ConditionStatus.TRUE, cond.REASON_ESTIMATED)
    (again,) = _set(first, ConditionStatus.TRUE, "Other", message="new", generation=2, now=T1)
    assert again["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert (again["reason"], again["message"], again["observedGeneration"]) == ("Other", "new", 2)


def test_a_status_flip_moves_the_transition_time() -> None:
    first = _set([], ConditionStatus.TRUE, cond.REASON_ESTIMATED)
    (flipped,) = _set(first, ConditionStatus.FALSE, cond.REASON_INVALID_SPEC, now=T1)
    assert flipped["lastTransitionTime"] == "2025-03-01T12:05:00Z"


def test_a_recorded_time_is_kept_verbatim() -> None:
    """Whatever another writer stored stays byte for byte, so status compares equal."""
    recorded = [
        {
            "type": "Estimated",
            "status": "True",
            "lastTransitionTime": "2025-03-01T12:00:00+00:00",
            "reason": "Estimated",
            "message": "m",
        }
    ]
    (kept,) = _set(recorded, ConditionStatus.TRUE, cond.REASON_ESTIMATED, now=T1)
    assert kept["lastTransitionTime"] == "2025-03-01T12:00:00+00:00"


def test_other_conditions_are_kept_in_place() -> None:
    admitted = {
        "type": "Admitted",
        "status": "Unknown",
        "reason": "Pending",
        "message": "",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }
    out = _set([admitted], ConditionStatus.TRUE, cond.REASON_ESTIMATED)
    assert out[0] == admitted and out[1]["type"] == "Estimated"
    assert cond.find_condition(out, "Admitted") == admitted
    assert cond.find_condition(out, "Missing") is None


def test_now_has_whole_seconds() -> None:
    assert cond.now_utc().microsecond == 0


@pytest.mark.parametrize("reason", ["", "two words", "9Lives", "Trailing-"])
def test_reasons_must_be_camel_case_words(reason: str) -> None:
    with pytest.raises(ValidationError):
        _set([], ConditionStatus.TRUE, reason)


def test_every_reason_constant_is_a_valid_reason() -> None:
    reasons = [v for k, v in vars(cond).items() if k.startswith("REASON_")]
    assert len(reasons) == len(set(reasons)) >= 12
    for reason in reasons:
        _set([], ConditionStatus.FALSE, reason)


def test_the_agents_condition_and_reasons_are_the_shared_constants() -> None:
    assert (cond.READY, cond.REASON_GPUS_READ, cond.REASON_BACKEND_FAILED) == (
        "Ready",
        "GPUsRead",
        "BackendFailed",
    )


def _documented_constants() -> dict[str, str]:
    """Each upper-case string constant of conditions.py -> the `#:` comment above it."""
    lines = Path(cond.__file__).read_text(encoding="utf-8").splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = re.match(r'^([A-Z_]+) = "', line)
        if not match:
            continue
        comment: list[str] = []
        j = i - 1
        while j >= 0 and lines[j].startswith("#:"):
            comment.insert(0, lines[j][2:].strip())
            j -= 1
        out[match.group(1)] = " ".join(comment)
    return out


def test_every_type_and_reason_is_documented_with_what_it_indicates() -> None:
    documented = _documented_constants()
    assert {"READY", "REASON_GPUS_READ", "REASON_BACKEND_FAILED"} <= documented.keys()
    for name, comment in documented.items():
        value = getattr(cond, name)
        assert comment.startswith(f"{value} indicates "), name
    for name in ("REASON_GPUS_READ", "REASON_BACKEND_FAILED"):
        assert " because " in documented[name], name


def test_the_readme_explains_every_reason_admitted_can_have() -> None:
    """The README's table of what a job can end as, and the paragraph after it, name every
    Admitted reason (those from Pending to SpecLocked in conditions.py, and the estimation's)."""
    readme = (Path(__file__).parents[3] / "README.md").read_text(encoding="utf-8")
    start = readme.index("What a job can end as")
    section = readme[start : readme.index("\n#", start)]
    names = list(_documented_constants())
    admitted = names[names.index("REASON_PENDING") : names.index("REASON_SPEC_LOCKED") + 1]
    reasons = {getattr(cond, name) for name in admitted} | set(cond.BEFORE_ADMISSION)
    assert "WaitingForGPUs" in reasons
    missing = sorted(r for r in reasons if f"`{r}`" not in section)
    assert missing == []
