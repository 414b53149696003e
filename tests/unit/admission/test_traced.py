"""A traced estimate kept in a job's status is read back only where it was computed from what
the reader would trace (its digest), by a trace of the reader's libraries, and is a trace."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from controller.admission.status import Stored
from controller.admission.traced import NotReadBack, read_back
from controller.estimator import Estimate, codec

TRACED = Estimate(
    profile="trace",
    components={"weights": 2_471_000_064, "activations": 900_000_001},
    total_params=1_235_814_400,
    trainable_params=5_636_096,
    sharded_bytes=2_471_000_064,
    replicated_bytes=900_000_001,
    margin=Fraction(11433, 8042),
    moments=((1, 2),),
)
LIBRARIES = "torch 2.15; transformers 5.25; peft 0.21"


def _job(digest: str, traced: Any) -> dict[str, Any]:
    return {"status": {"estimate": {"profile": "trace", "digest": digest, "traced": traced}}}


def test_a_trace_of_the_same_digest_and_libraries_is_read_back_whole() -> None:
    text = codec.encode(TRACED, LIBRARIES)
    found = read_back(_job("d1", text), "d1", LIBRARIES)
    assert found == (TRACED, Stored("d1", text))


def test_a_reader_that_cannot_trace_takes_a_trace_of_any_libraries() -> None:
    text = codec.encode(TRACED, "torch 1.0; transformers 1.0; peft 0.1")
    assert read_back(_job("d1", text), "d1") == (TRACED, Stored("d1", text))
    other = read_back(_job("d1", text), "d1", LIBRARIES)
    assert isinstance(other, NotReadBack) and not other.suspect
    assert "traced with torch 1.0" in other.why


def test_another_digest_or_none_is_traced_again_without_a_word() -> None:
    text = codec.encode(TRACED, LIBRARIES)
    assert read_back(_job("old", text), "new", LIBRARIES) == NotReadBack()
    assert read_back({"status": {}}, "new", LIBRARIES) == NotReadBack()
    assert read_back({}, "new") == NotReadBack()


def test_what_no_operator_writes_is_suspect() -> None:
    edited = codec.encode(TRACED, LIBRARIES).replace("1235814400", '"1235814400"')
    formula = codec.encode(Estimate("calibrated", {"weights": 1}, 1, 0, 1, 0), LIBRARIES)
    for text in (edited, formula, "{", None):
        found = read_back(_job("d1", text), "d1", LIBRARIES)
        assert isinstance(found, NotReadBack) and found.suspect and found.why
