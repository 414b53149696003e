"""The API's refusals said in vramgate's terms, as the client's own exception said them."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from controller.kube import ApiError
from controller.kube.client import api_errors


def test_an_api_error_reads_as_the_clients_exception_did_in_a_log_line() -> None:
    for body in (None, '{"kind": "Status", "message": "no"}'):
        said = ApiException(status=500, reason="etcdserver: request timed out")
        said.body = body
        assert str(ApiError(500, "etcdserver: request timed out", body)) == str(said)


def test_a_typed_call_refused_raises_an_api_error_with_status_reason_and_body() -> None:
    refused = ApiException(status=409, reason="Conflict")
    refused.body = '{"message": "the object has been modified"}'
    with pytest.raises(ApiError) as raised, api_errors():
        raise refused
    assert (raised.value.status, raised.value.reason, raised.value.body) == (
        409,
        "Conflict",
        refused.body,
    )
