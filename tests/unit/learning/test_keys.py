"""A key's image by digest: every spelling of a digest a pod or a template gives reads as one."""

from __future__ import annotations

import pytest

from controller.learning import ANY, JobKey, image_digest

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


@pytest.mark.parametrize(
    "reference",
    [
        f"docker.io/library/trainer@{DIGEST}",  # containerd, CRI-O
        f"docker-pullable://trainer@{DIGEST}",  # Docker, a pulled image
        f"docker://{DIGEST}",  # Docker, a local image
        DIGEST,  # bare
        f"registry.invalid:5000/team/trainer:v1@{DIGEST}",  # a template's pin, port and tag
        f"  docker.io/library/trainer@sha256:{HEX.upper()}\n",  # spaces, upper-case hex
    ],
)
def test_every_spelling_of_a_digest_reads_as_sha256_hex(reference: str) -> None:
    assert image_digest(reference) == DIGEST


def test_sha512_is_kept_as_it_is() -> None:
    long = "ab" * 64
    assert image_digest(f"trainer@sha512:{long}") == f"sha512:{long}"


@pytest.mark.parametrize(
    "reference",
    [
        "trainer:v1",
        "docker.io/library/trainer:latest",
        "",
        None,
        42,
        f"sha256:{HEX[:-1]}",  # too short
        f"sha256:{HEX}0",  # too long
        f"trainer@md5:{HEX}",  # no algorithm a registry uses
        f"sha256:{HEX[:-1]}g",  # not hex
        f"{DIGEST}:v1",  # a digest inside, not at the end
    ],
)
def test_a_reference_without_a_digest_names_none(reference: object) -> None:
    assert image_digest(reference) is None


def test_a_digest_is_a_valid_key_field_and_the_first_one_the_ladder_drops() -> None:
    key = JobKey.of(family="llama", method="LoRA", profile="calibrated", image=DIGEST)
    assert JobKey.parse(key.name) == key
    assert key.ladder()[1].image == ANY


def test_the_configuration_is_the_finest_rung_and_the_first_the_ladder_drops() -> None:
    key = JobKey.of(family="llama", method="LoRA", profile="calibrated", image=DIGEST,
                    config="3f2a9c0d1e2b")  # fmt: skip
    ladder = key.ladder()
    assert ladder[0] == key and ladder[1] == JobKey.of(
        family="llama", method="LoRA", profile="calibrated", image=DIGEST
    )
    assert ladder[2].image == ANY and all(r.config == ANY for r in ladder[1:])
    assert JobKey.parse(key.name) == key
    assert key.name.endswith(",config=3f2a9c0d1e2b")
    assert key.describe() == f"llama LoRA calibrated {DIGEST} config 3f2a9c0d1e2b"


def test_a_key_without_a_configuration_keeps_the_name_it_had_before_there_was_one() -> None:
    """Keys filed before the configuration existed (their LearnedCorrections are named from
    these names) read back as the same key and name."""
    old = "family=llama,method=LoRA,parallelism=FSDP,profile=calibrated,framework=trl,image=*"
    key = JobKey.parse(old)
    assert key.config == ANY and key.name == old
    with pytest.raises(ValueError, match="must name family"):
        JobKey.parse("family=llama,method=LoRA,config=abc")
