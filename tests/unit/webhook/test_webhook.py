"""The validating webhook's handler and the certificates it is served with."""

from __future__ import annotations

import datetime as dt
import ssl
from pathlib import Path

import kopf
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from controller.jobs.profiles import trace_extra_installed
from controller.webhook import certs
from controller.webhook.validating import INVALID, validate_finetunejob
from tests.unit.conftest import NOT_A_FAMILY, PYTHIA_69B

VALID = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
INVALID_SPEC = {"model": {"preset": "llama-8b"}, "method": "QLoRA", "lora": {"rank": 0}}


def test_a_valid_spec_passes() -> None:
    validate_finetunejob(spec=VALID, old=None, operation="CREATE")


def test_an_invalid_spec_is_refused_with_every_field() -> None:
    with pytest.raises(kopf.AdmissionError) as caught:
        validate_finetunejob(spec=INVALID_SPEC, old=None, operation="CREATE")
    message = str(caught.value)
    assert message.startswith("spec.model.preset: unknown preset 'llama-8b'; closest: ")
    assert "; spec.lora.rank: must be greater than or equal to 1, got 0" in message
    assert caught.value.code == INVALID


def test_a_model_family_only_the_generic_reading_reads_is_left_to_the_operator() -> None:
    """The webhook never builds a model: where the trace extra would read the family, the
    operator does, off its event loop; without the extra the refusal stays, saying so."""
    spec = {**VALID, "model": {"config": PYTHIA_69B}}
    if trace_extra_installed():
        validate_finetunejob(spec=spec, old=None, operation="CREATE")
    else:
        with pytest.raises(kopf.AdmissionError) as caught:
            validate_finetunejob(spec=spec, old=None, operation="CREATE")
        assert str(caught.value).startswith(f"spec.model.config.{NOT_A_FAMILY} (its layers may")
        assert "trace extra" in str(caught.value)
        assert "\n" not in str(caught.value) and caught.value.code == INVALID
    validate_finetunejob(
        spec={**spec, "model": {"config": PYTHIA_69B | {"model_type": "llama"}}},
        old=None,
        operation="CREATE",
    )


def test_an_update_that_keeps_an_invalid_spec_is_allowed() -> None:
    """Labels, annotations and kopf's own bookkeeping must not fail on an old object."""
    old = {"metadata": {"labels": {}}, "spec": dict(INVALID_SPEC)}
    validate_finetunejob(spec=dict(INVALID_SPEC), old=old, operation="UPDATE")


def test_an_update_to_an_invalid_spec_is_refused() -> None:
    with pytest.raises(kopf.AdmissionError, match=r"spec\.lora\.rank"):
        validate_finetunejob(spec=INVALID_SPEC, old={"spec": VALID}, operation="UPDATE")


def test_an_update_of_suspend_alone_is_allowed_even_if_the_spec_is_invalid() -> None:
    """A job stored before a rule existed (here gpus below minGPUs) can still be suspended;
    any other change must make the spec valid."""
    stored = {**VALID, "resources": {"gpus": 1, "minGPUs": 2}}
    validate_finetunejob(spec={**stored, "suspend": True}, old={"spec": stored}, operation="UPDATE")
    resumed = {"spec": {**stored, "suspend": True}}
    validate_finetunejob(spec=stored, old=resumed, operation="UPDATE")  # suspend key removed
    with pytest.raises(kopf.AdmissionError, match="minGPUs") as caught:
        validate_finetunejob(
            spec={**stored, "suspend": True, "priority": 5},
            old={"spec": stored},
            operation="UPDATE",
        )
    assert str(caught.value).startswith("spec.resources.gpus: must be greater than or equal")
    with pytest.raises(kopf.AdmissionError, match="minGPUs"):
        validate_finetunejob(spec=stored, old=None, operation="CREATE")


# -- certificates --------------------------------------------------------------------------


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_generated_certificate_covers_loopback_and_the_service(tmp_path: Path) -> None:
    paths = certs.ensure_serving_cert(tmp_path, ["vramgate-webhook.vramgate.svc"])
    assert certs.covered_hosts(paths.cert) == {
        "127.0.0.1",
        "localhost",
        "vramgate-webhook.vramgate.svc",
    }
    serving, ca = _cert(paths.cert), _cert(paths.ca)
    serving.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert oct(paths.key.stat().st_mode & 0o777) == "0o600"


def test_python_ssl_accepts_the_pair(tmp_path: Path) -> None:
    """What kopf's server does with the files: load them into a server context."""
    paths = certs.ensure_serving_cert(tmp_path, [])
    context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(paths.cert, paths.key)
    client = ssl.create_default_context(cafile=str(paths.ca))
    assert client.cert_store_stats()["x509_ca"] == 1


def test_an_existing_certificate_is_reused(tmp_path: Path) -> None:
    first = certs.ensure_serving_cert(tmp_path, ["a.example"])
    before = first.cert.read_bytes()
    certs.ensure_serving_cert(tmp_path, ["a.example"])
    assert first.cert.read_bytes() == before


def test_a_new_host_renews_a_generated_certificate(tmp_path: Path) -> None:
    paths = certs.ensure_serving_cert(tmp_path, ["a.example"])
    certs.ensure_serving_cert(tmp_path, ["b.example", "10.0.0.7"])
    assert {"b.example", "10.0.0.7"} <= certs.covered_hosts(paths.cert)


def test_a_certificate_near_its_end_is_renewed(tmp_path: Path) -> None:
    paths = certs.ensure_serving_cert(tmp_path, [])
    expires = _cert(paths.cert).not_valid_after_utc
    late = expires - certs.RENEW_BEFORE + dt.timedelta(hours=1)
    certs.ensure_serving_cert(tmp_path, [], now=late)
    assert _cert(paths.cert).not_valid_after_utc > expires


def test_a_provided_certificate_is_used_as_is(tmp_path: Path) -> None:
    """A mounted Secret (no ca.key) is someone else's to renew; never overwrite it."""
    generated = certs.ensure_serving_cert(tmp_path / "gen", [])
    provided = tmp_path / "provided"
    provided.mkdir()
    for name in (certs.CA_CERT, certs.TLS_CERT, certs.TLS_KEY):
        (provided / name).write_bytes((tmp_path / "gen" / name).read_bytes())
    paths = certs.ensure_serving_cert(provided, ["not-covered.example"])
    assert paths.cert.read_bytes() == generated.cert.read_bytes()


def test_keys_are_p256(tmp_path: Path) -> None:
    paths = certs.ensure_serving_cert(tmp_path, [])
    key = _cert(paths.cert).public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"


def test_a_sequence_beyond_the_context_is_allowed_with_a_warning() -> None:
    long = dict(VALID, training={"sequenceLength": 200_000})
    warnings: list[str] = []
    validate_finetunejob(spec=long, old=None, operation="CREATE", warnings=warnings)
    assert len(warnings) == 1
    assert warnings[0].startswith("vramgate: spec.training.sequenceLength: 200000 is longer")
    quiet: list[str] = []
    validate_finetunejob(spec=VALID, old=None, operation="CREATE", warnings=quiet)
    assert quiet == []
