"""The HTTPS endpoint of the FineTuneJob webhooks (and of the TrainJob one, with
`trainJobSizing`): kopf's server, answering reviews itself.

kopf's `WebhookServer` keeps what a webhook endpoint needs and is hard to get right: TLS from
the certificate files and a restart when they change (renewal); in `managed` mode the server
also registers the configurations calling it (`registration.py`). What kopf calls on each
request, its handler machinery (a cause, a diff of old and new object, a memo, per-handler
outcomes and logging, a JSON patch from a copy of the body), cost about two thirds of the
operator's CPU per request in the webhook benchmark (BENCHMARKS.md), on the event loop the
decisions share.
For handlers that are one function call each, `ReviewServer` answers the
AdmissionReview directly: the URL's last segment names the webhook (kopf's handler id, the
path the chart's configurations use too), and the response is what the API server reads:
`allowed`, a `status` with the refusal's message and code, `warnings`, and a JSON patch.

The server runs on a thread of its own, with its own event loop: on kopf's loop a review
waited behind every watch event queued before it (1,000 jobs arriving set off thousands),
which put the webhook's p99 in the hundreds of milliseconds. The checks read the latest
cluster view as it is; a new one is built on kopf's loop (`Scheduler.current_view`).

A check that fails with an unexpected error answers HTTP 500, so the API server applies the
configurations' `failurePolicy`, as for an unreachable webhook: `Ignore` (the chart's
default) lets the write through, and the operator still decides every job and reports
what is wrong in its status; `Fail` refuses it.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import logging
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web

from controller.admission import trainjob
from controller.admission.trainjob import restore
from controller.api.base import GROUP, REQUESTED_GPUS_ANNOTATION
from controller.api.finetunejob import PLURAL
from controller.base.errors import DeploymentError
from controller.jobs.profiles import warm_generic_reading
from controller.webhook.admission import AdmissionWebhook, Mutation
from controller.webhook.registration import (
    MUTATE_HANDLER,
    MUTATE_TRAINJOB_HANDLER,
    VALIDATE_HANDLER,
    Registrar,
)
from controller.webhook.trainjob import TrainJobWebhook

log = logging.getLogger("vramgate.webhook")


class ReviewServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server with `hook` answering its reviews (set before kopf runs),
    and `trainjobs` the TrainJobs' (`trainJobSizing`); with a `registrar` (`--webhook
    managed`), it registers the configurations calling it."""

    hook: AdmissionWebhook | None = None
    trainjobs: TrainJobWebhook | None = None
    registrar: Registrar | None = None

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve with `review` in place of kopf's `fn` (its handler machinery), on a thread
        of its own; as kopf's server does, yield the configuration the API server calls it
        by, and start again with the new files when the certificate files change."""
        self.warm()
        paths = [Path(p) for p in (self.certfile, self.pkeyfile, self.cafile) if p is not None]
        served = _digest(paths)  # before they are read: a renewal from now on counts
        cadata, context = self._build_ssl()  # unreadable at start: the operator cannot serve
        registering: asyncio.Future[None] | None = None
        try:
            while True:
                # No port: any free one, bound at once and read back (kopf's own choice,
                # a port found free and bound later, may be taken meanwhile).
                thread = ServingThread(
                    self._serve_review, self.addr or None, self.port or 0, self.path, context
                )
                try:
                    await asyncio.to_thread(thread.start)
                    port = thread.port
                    scheme = "http" if context is None else "https"
                    host = self.host or self.DEFAULT_HOST or self._get_accessible_addr(self.addr)
                    url = self._build_url(scheme, host, port, self.path or "")
                    log.info("webhook listening on port %d, called at %s", port, url)
                    config = kopf.WebhookClientConfig(url=url)
                    ca_bundle = None if cadata is None else base64.b64encode(cadata).decode()
                    if ca_bundle is not None:
                        config["caBundle"] = ca_bundle
                    if self.registrar is not None:
                        # Shielded: a thread cannot be stopped, and a registration still
                        # landing after the exit's deletion would outlive the operator.
                        registering = asyncio.ensure_future(
                            asyncio.to_thread(self.registrar.register, url, ca_bundle)
                        )
                        try:
                            await asyncio.shield(registering)
                        except DeploymentError as error:
                            if self.registrar.url is None:
                                raise  # at start: nothing calls this operator's webhooks
                            log.warning("%s; the API server keeps calling the last one", error)
                    yield config
                    served, cadata, context = await self._renewed(paths, served)
                    log.info("restarting the webhook server with the renewed certificate files")
                finally:
                    await asyncio.to_thread(thread.stop)
        finally:
            if self.registrar is not None:  # a clean exit: no configuration left calling it
                if registering is not None and not registering.done():
                    await asyncio.wait({registering})
                await asyncio.to_thread(self.registrar.unregister)

    def warm(self) -> None:
        """Load ahead what the reviews will need (the generic reading), off the webhook's
        loop; a server whose `review` needs nothing (the benchmark's no-op) loads nothing."""
        warm_generic_reading()

    async def _renewed(
        self, paths: list[Path], served: bytes
    ) -> tuple[bytes, bytes | None, ssl.SSLContext | None]:
        """Once the files changed and load: their digest, CA bundle and TLS context. Files
        caught mid-renewal (a key without its certificate yet) keep the old server serving
        until the next check, instead of stopping the operator."""
        while True:
            await asyncio.sleep(self.file_check_interval)
            now = _digest(paths)
            if now == served:
                continue
            try:
                cadata, context = self._build_ssl()
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                log.warning("renewed certificate files do not load yet (%s); retrying", error)
                continue
            return now, cadata, context

    async def _serve_review(self, request: web.Request) -> web.Response:
        try:
            data = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(reason="not an AdmissionReview: not JSON") from None
        return web.json_response(await self.review(data, webhook=request.match_info.get("id")))

    async def review(
        self, request: Mapping[str, Any], *, webhook: str | None = None, **_: Any
    ) -> dict[str, Any]:
        """The AdmissionReview response to `request`, sent to the webhook named `webhook`."""
        if self.hook is None:
            raise web.HTTPServiceUnavailable(reason="the webhooks are not registered yet")
        return await answer(self.hook, webhook, request, self.trainjobs)


#: How long a stopping server waits for the reviews it is answering (each takes milliseconds).
SHUTDOWN_TIMEOUT_S = 5.0


class ServingThread:
    """An aiohttp server on a daemon thread with its own event loop."""

    def __init__(
        self,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        addr: str | None,
        port: int,
        path: str | None,
        context: ssl.SSLContext | None,
    ) -> None:
        self.handler, self.addr, self.port, self.context = handler, addr, port, context
        self.path = (path or "").rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="vramgate-webhook", daemon=True)
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()

    def start(self) -> None:
        """Listening when this returns, on `port` (the one bound, for a port 0); the bind's
        error raised here."""
        self._thread.start()
        self._ready.result()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=SHUTDOWN_TIMEOUT_S + 5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner: web.AppRunner | None = None
        try:
            app = web.Application()
            app.add_routes([web.post(f"{self.path}/{{id:.*}}", self.handler)])
            runner = web.AppRunner(
                app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
            )
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(
                runner, self.addr, self.port, ssl_context=self.context,
                reuse_port=True, reuse_address=True,
            )  # fmt: skip
            self._loop.run_until_complete(site.start())
            self.port = int(runner.addresses[0][1])  # port 0: the one the system gave
        except BaseException as error:
            self._ready.set_exception(error)
            if runner is not None:
                self._loop.run_until_complete(runner.cleanup())
            self._loop.close()
            return
        self._ready.set_result(None)
        try:
            self._loop.run_forever()
        finally:
            self._loop.run_until_complete(runner.cleanup())
            left = asyncio.all_tasks(self._loop)
            for task in left:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self._loop.close()


def _digest(paths: list[Path]) -> bytes:
    """One digest of the files' contents (kopf's rule: a renewed Secret's mount changes no
    metadata a watcher would see, only the bytes); a file missing mid-renewal counts too."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"missing")
    return digest.digest()


async def answer(
    hook: AdmissionWebhook,
    webhook: str | None,
    request: Mapping[str, Any],
    trainjobs: TrainJobWebhook | None = None,
) -> dict[str, Any]:
    """The AdmissionReview response of `hook`'s `webhook` (a handler id) to `request`; a
    TrainJob's, of `trainjobs` (None: not served)."""
    payload = request.get("request") if isinstance(request, Mapping) else None
    if not isinstance(payload, Mapping):
        raise web.HTTPBadRequest(reason="not an AdmissionReview: no request")
    resource = payload.get("resource")
    if not isinstance(resource, Mapping):
        raise web.HTTPBadRequest(reason="not an AdmissionReview: no request.resource")
    served = (resource.get("group"), resource.get("resource"))
    if served == (trainjob.GROUP, trainjob.PLURAL) and trainjobs is not None:
        if webhook != MUTATE_TRAINJOB_HANDLER:
            raise web.HTTPNotFound(reason=f"no webhook {webhook!r} for TrainJobs")
    elif served != (GROUP, PLURAL):
        raise web.HTTPNotFound(reason=f"no webhook for {resource}")
    elif webhook not in (VALIDATE_HANDLER, MUTATE_HANDLER):
        raise web.HTTPNotFound(reason=f"no webhook {webhook!r}")
    response: dict[str, Any] = {"uid": payload.get("uid", ""), "allowed": True}
    obj = payload.get("object")
    if isinstance(obj, Mapping):
        warnings: list[str] = []
        try:
            if webhook == MUTATE_TRAINJOB_HANDLER and trainjobs is not None:
                await _size(trainjobs, payload, obj, warnings, response)
            else:
                await _check(hook, webhook, payload, obj, warnings, response)
        except kopf.AdmissionError as refused:
            response["allowed"] = False
            response["status"] = {"message": str(refused), "code": refused.code or 400}
        except Exception:  # the check's own failure: the configured failurePolicy decides
            log.exception("webhook %s failed", webhook)
            raise web.HTTPInternalServerError(reason=f"vramgate: {webhook} failed") from None
        if warnings:
            response["warnings"] = warnings
    return {
        "apiVersion": request.get("apiVersion", "admission.k8s.io/v1"),
        "kind": request.get("kind", "AdmissionReview"),
        "response": response,
    }


async def _check(
    hook: AdmissionWebhook,
    webhook: str,
    payload: Mapping[str, Any],
    obj: Mapping[str, Any],
    warnings: list[str],
    response: dict[str, Any],
) -> None:
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        return  # the CRD's schema refuses it, after the mutating webhooks
    operation = payload.get("operation")
    if webhook == VALIDATE_HANDLER:
        await hook.validate(
            body=obj, spec=spec, old=payload.get("oldObject"), operation=operation,
            warnings=warnings,
        )  # fmt: skip
        return
    if operation not in ("CREATE", "UPDATE"):
        return
    old = payload.get("oldObject") if operation == "UPDATE" else None
    found = await hook.mutation(obj, warnings, old or None)
    if found:
        patch = json_patch(obj, found)
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode("ascii")


async def _size(
    trainjobs: TrainJobWebhook,
    payload: Mapping[str, Any],
    obj: Mapping[str, Any],
    warnings: list[str],
    response: dict[str, Any],
) -> None:
    if payload.get("operation") == "UPDATE":  # its manifest applied again, after a resize
        old = payload.get("oldObject")
        found = restore(old if isinstance(old, Mapping) else {}, obj)
        warnings.extend(found.warnings)
    elif payload.get("operation") == "CREATE":
        namespace = payload.get("namespace")
        found = await trainjobs.sizing(
            obj, warnings, dry_run=payload.get("dryRun") is True,
            namespace=namespace if isinstance(namespace, str) else None,
        )  # fmt: skip
    else:
        return
    if found.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(found.patch).encode()).decode("ascii")


def json_patch(obj: Mapping[str, Any], found: Mutation) -> list[dict[str, Any]]:
    """`found` as JSON Patch operations on `obj` (RFC 6902: a map is added whole where it is
    missing, and only a key that is there can be removed)."""
    ops: list[dict[str, Any]] = []
    if found.resources is not None:
        ops.append({"op": "add", "path": "/spec/resources", "value": found.resources})
    metadata = obj.get("metadata") or {}
    annotations = metadata.get("annotations")
    key = "/metadata/annotations/" + REQUESTED_GPUS_ANNOTATION.replace("~", "~0").replace("/", "~1")
    if found.requested is not None:
        value = str(found.requested)
        if isinstance(annotations, Mapping):
            ops.append({"op": "add", "path": key, "value": value})
        else:
            ops.append(
                {"op": "add", "path": "/metadata/annotations",
                 "value": {REQUESTED_GPUS_ANNOTATION: value}}
            )  # fmt: skip
    elif found.forget and REQUESTED_GPUS_ANNOTATION in (annotations or {}):
        ops.append({"op": "remove", "path": key})
    return ops
