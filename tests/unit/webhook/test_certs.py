"""Certificates the operator did not make: when the API server could not use them."""

from __future__ import annotations

import datetime as dt

from controller.webhook.certs import VALIDITY, generate, unusable_reason

SERVICE = ["vg-webhook", "vg-webhook.vg", "vg-webhook.vg.svc", "vg-webhook.vg.svc.cluster.local"]
NOW = dt.datetime.now(dt.UTC)


def test_a_certificate_for_the_service_name_alone_is_usable() -> None:
    """cert-manager's Certificate in the chart names only the .svc forms: no false alarm."""
    material = generate(["vg-webhook.vg.svc"], NOW)
    assert unusable_reason(material, SERVICE, NOW) is None


def test_a_certificate_for_other_names_or_expired_is_said() -> None:
    other = generate(["someone-else.vg.svc"], NOW)
    reason = unusable_reason(other, SERVICE, NOW)
    assert reason is not None and reason.startswith("its certificate covers none of vg-webhook")
    later = NOW + VALIDITY + dt.timedelta(days=1)
    expired = unusable_reason(generate(SERVICE, NOW), SERVICE, later)
    assert expired is not None and expired.startswith("its certificate expired")
