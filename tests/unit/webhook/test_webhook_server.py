"""The review server's answers: AdmissionReview in, the response the API server reads out."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import ssl
import threading
from pathlib import Path
from typing import Any, cast

import aiohttp
import jsonpatch
import pytest
from aiohttp import web

from controller.packing.view import ClusterView
from controller.webhook.admission import AdmissionWebhook, Mutation
from controller.webhook.certs import generate, write_files
from controller.webhook.server import (
    MUTATE_HANDLER,
    VALIDATE_HANDLER,
    ReviewServer,
    ServingThread,
    answer,
    json_patch,
)
from tests.unit.builders.webhook import FULL, admitted, body, cluster, hook

RESOURCE = {"group": "vramgate.dev", "version": "v1alpha1", "resource": "finetunejobs"}


def review(obj: dict[str, Any] | None, old: Any = None, **request: Any) -> dict[str, Any]:
    payload = {"uid": "u-1", "resource": RESOURCE, "object": obj, "oldObject": old}
    payload["operation"] = "UPDATE" if old is not None else "CREATE"
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {**payload, **request}}  # fmt: skip


def ask(webhook: str, request: dict[str, Any], view: AdmissionWebhook | None = None) -> Any:
    return asyncio.run(answer(view or hook(cluster()), webhook, request))["response"]


def test_a_refusal_carries_the_operators_message_and_422() -> None:
    out = asyncio.run(answer(hook(cluster()), VALIDATE_HANDLER, review(body(**FULL))))
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "u-1" and response["allowed"] is False
    assert response["status"]["code"] == 422
    assert response["status"]["message"].startswith("vramgate: InsufficientVRAM: needs 2 GPUs")
    invalid = ask(VALIDATE_HANDLER, review(body(method="Partial")))
    assert invalid["allowed"] is False and "spec.method" in invalid["status"]["message"]


def test_a_job_that_fits_is_allowed_without_a_patch() -> None:
    for webhook in (VALIDATE_HANDLER, MUTATE_HANDLER):
        assert ask(webhook, review(body())) == {"uid": "u-1", "allowed": True}


def test_resize_answers_with_a_json_patch_and_the_warning() -> None:
    response = ask(MUTATE_HANDLER, review(body(**FULL, admissionPolicy="Resize")))
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == [
        {"op": "add", "path": "/spec/resources", "value": {"gpus": 2}},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"vramgate.dev/requested-gpus": "1"}},
    ]  # fmt: skip
    assert response["warnings"] == [
        "vramgate: needs 2 GPUs with FSDP (45.49 GiB each): spec.resources.gpus 1 -> 2"
    ]


def test_the_json_patch_adds_to_annotations_there_and_removes_only_what_is_there() -> None:
    """Applied as the API server applies it: an op on a missing path fails the request."""
    found = Mutation({"gpus": 2}, requested=1)
    bare = body(**FULL)
    for present in (None, {}, {"team": "a"}, {"vramgate.dev/requested-gpus": "4"}):
        obj = body(**FULL)
        if present is not None:
            obj["metadata"]["annotations"] = dict(present)
        out = jsonpatch.apply_patch(obj, json_patch(obj, found))
        assert out["spec"]["resources"] == {"gpus": 2}
        assert out["metadata"]["annotations"] == {
            **(present or {}),
            "vramgate.dev/requested-gpus": "1",
        }
        forgotten = jsonpatch.apply_patch(obj, json_patch(obj, Mutation(forget=True)))
        assert "vramgate.dev/requested-gpus" not in (forgotten["metadata"].get("annotations") or {})
        assert forgotten["spec"] == bare["spec"]


def test_the_lock_on_an_admitted_spec_is_enforced_on_update() -> None:
    old = admitted(body())
    locked = ask(VALIDATE_HANDLER, review(body(training={"sequenceLength": 4096}), old=old))
    assert (
        locked["allowed"] is False and "only spec.suspend may change" in locked["status"]["message"]
    )
    assert ask(VALIDATE_HANDLER, review(body(suspend=True), old=old))["allowed"] is True
    # The mutating webhook rewrites new jobs only.
    resize = body(**FULL, admissionPolicy="Resize")
    assert "patch" not in ask(MUTATE_HANDLER, review(resize, old=admitted(resize)))


def test_a_failing_check_is_an_http_error_so_the_failure_policy_decides() -> None:
    async def broken() -> ClusterView | None:
        raise RuntimeError("no view")

    for webhook in (VALIDATE_HANDLER, MUTATE_HANDLER):
        with pytest.raises(web.HTTPInternalServerError):
            asyncio.run(answer(AdmissionWebhook(broken), webhook, review(body(**FULL))))


def test_a_spec_that_is_not_an_object_is_left_to_the_schema() -> None:
    obj = {"metadata": {"name": "j"}, "spec": "x"}
    assert ask(MUTATE_HANDLER, review(obj)) == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    ("webhook", "request_", "error"),
    [
        ("validate-pods", review(body()), web.HTTPNotFound),
        (
            VALIDATE_HANDLER,
            review(body(), resource={**RESOURCE, "resource": "pods"}),
            web.HTTPNotFound,
        ),
        (VALIDATE_HANDLER, {"kind": "AdmissionReview"}, web.HTTPBadRequest),
        (VALIDATE_HANDLER, [1, 2], web.HTTPBadRequest),
        (VALIDATE_HANDLER, review(body(), resource="finetunejobs"), web.HTTPBadRequest),
    ],
)
def test_requests_that_are_not_ours_are_http_errors(
    webhook: str, request_: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        asyncio.run(answer(hook(cluster()), webhook, request_))


# -- the server itself: TLS on its own thread, restarted on renewed files -------------------


def test_the_server_answers_over_tls_off_the_callers_loop_and_restarts_on_renewal(
    tmp_path: Path,
) -> None:
    """Reviews are answered on the server's own thread (not the loop that runs kopf, which
    stays free to block here); renewed certificate files restart it with the new CA, files
    caught mid-renewal (a certificate that does not match the key yet) leave the old server
    serving, and closing it stops the thread."""
    now = dt.datetime.now(dt.UTC)
    first = generate(["127.0.0.1"], now)
    cert = write_files(tmp_path, first)
    server = ReviewServer(
        addr="127.0.0.1", host="127.0.0.1", certfile=str(cert.cert), pkeyfile=str(cert.key),
        cafile=str(cert.ca), file_check_interval=0.05,
    )  # fmt: skip
    threads: list[str] = []

    class Recording(AdmissionWebhook):
        async def validate(self, **kwargs: Any) -> None:
            threads.append(threading.current_thread().name)

    server.hook = Recording(_no_view, lambda *_: None)

    class Registrations:
        """`--webhook managed`: what the server registers, and when it unregisters."""

        def __init__(self) -> None:
            self.url: str | None = None
            self.calls: list[tuple[str, ...]] = []

        def register(self, url: str, ca_bundle: str | None) -> None:
            self.url = url
            self.calls.append(("register", url, str(ca_bundle)))

        def unregister(self) -> None:
            self.calls.append(("unregister",))

    registrations = Registrations()
    server.registrar = cast(Any, registrations)

    async def kopf_fn(*_: Any, **__: Any) -> Any:
        raise AssertionError("kopf's handlers were called")

    async def post(config: Any, ca: bytes) -> int:
        context = ssl.create_default_context(cadata=ca.decode())
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
            url = f"{config['url'].rstrip('/')}/{VALIDATE_HANDLER}"
            async with http.post(url, json=review({"spec": {}})) as response:
                return response.status

    renewed = generate(["127.0.0.1"], now)

    alive: list[bool] = []

    async def steps(iterator: Any) -> tuple[int, int, int, str, str]:
        config = await iterator.__anext__()
        before = await post(config, first.ca_cert)
        cert.cert.write_bytes(renewed.cert)  # its key is not written yet
        following = asyncio.ensure_future(iterator.__anext__())
        await asyncio.sleep(0.5)  # ten checks of the files
        assert not following.done(), "no restart on files that do not load"
        meanwhile = await post(config, first.ca_cert)
        write_files(tmp_path, renewed)
        config2 = await asyncio.wait_for(following, timeout=10)
        after = await post(config2, renewed.ca_cert)
        return before, meanwhile, after, config["caBundle"], config2["caBundle"]

    async def scenario() -> tuple[int, int, int, str, str]:
        async with server:  # as kopf runs it: leaving closes the generators it handed out
            found = await steps(server(kopf_fn).__aiter__())
        alive.append(any(t.name == "vramgate-webhook" for t in threading.enumerate()))
        return found

    before, meanwhile, after, bundle, bundle2 = asyncio.run(scenario())
    assert (before, meanwhile, after) == (200, 200, 200)
    assert alive == [False], "closing the server stops its thread"
    assert base64.b64decode(bundle) == first.ca_cert
    assert base64.b64decode(bundle2) == renewed.ca_cert != first.ca_cert, "the new CA is out"
    assert threads == ["vramgate-webhook"] * 3
    # registered at each start with the CA it serves, deleted once, at the close
    assert [c[0] for c in registrations.calls] == ["register", "register", "unregister"]
    assert [c[2] for c in registrations.calls[:2]] == [bundle, bundle2]


async def _no_view() -> None:
    return None


def test_port_0_binds_a_free_port_at_once_and_reports_it() -> None:
    """A port found free and bound later (kopf's choice) may be taken meanwhile by another
    program; port 0 is bound by the server itself, which reads back the one it got."""

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"path": request.path})

    thread = ServingThread(ok, "127.0.0.1", 0, "/hooks", None)
    thread.start()
    try:
        assert thread.port > 0

        async def get() -> Any:
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{thread.port}/hooks/{VALIDATE_HANDLER}"
                async with http.post(url) as response:
                    return await response.json()

        assert asyncio.run(get()) == {"path": f"/hooks/{VALIDATE_HANDLER}"}
    finally:
        thread.stop()
