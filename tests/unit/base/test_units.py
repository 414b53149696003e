"""Sizes as people write them: vendors' decimal GB, NVML's binary GiB, plain bytes."""

from __future__ import annotations

import pytest

from controller.base.units import GIB, format_gib, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GB", 80 * 10**9),
        ("80 GB", 80 * 10**9),
        ("80GiB", 80 * GIB),
        ("24G", 24 * 10**9),
        ("24gib", 24 * GIB),
        ("1.5GiB", 3 * GIB // 2),
        ("81559MiB", 81559 * 2**20),
        ("17179869184", 16 * GIB),
        ("1TB", 10**12),
        ("80Gi", 80 * GIB),  # Kubernetes quantities' binary suffixes, as in Helm values
        ("256Mi", 256 * 2**20),
        ("0.5Ti", 2**39),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "80XB", "-1GB", "0", "GB", "５GiB", "٨٠GB"])
def test_parse_size_rejects_with_the_allowed_forms(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["9" * 400 + ".5GB", "1" + "0" * 5000, "2EiB", "2000000TB"])
def test_parse_size_refuses_absurd_sizes_with_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


def test_a_bare_number_can_be_refused_where_people_mean_gigabytes() -> None:
    assert parse_size("80") == 80  # files written by programs: plain bytes
    with pytest.raises(ValueError, match=r"invalid size '80': needs a unit, e.g. 80GB or 80GiB"):
        parse_size("80", require_unit=True)
    assert parse_size("80GB", require_unit=True) == 80 * 10**9
    with pytest.raises(ValueError, match=r"\(binary\)$"):
        parse_size("", require_unit=True)


@pytest.mark.parametrize("text", ["0", "0GiB", "0.0", "00 Gi", "0B"])
def test_zero_in_any_unit_where_a_size_may_be_nothing(text: str) -> None:
    assert parse_size(text, require_unit=True, allow_zero=True) == 0
    with pytest.raises(ValueError, match=r"must be greater than 0|needs a unit"):
        parse_size(text, require_unit=True)


@pytest.mark.parametrize("text", ["0x", "0foo", "０GiB", "0.000001B"])
def test_zero_with_a_unit_that_is_none_or_a_fraction_of_a_byte_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text, allow_zero=True)


def test_format() -> None:
    assert format_gib(7_780_056_064) == "7.25 GiB"
