"""The HTTPS endpoint of the FineTuneJob webhooks: kopf's server, answering reviews itself.

kopf's `WebhookServer` keeps what a webhook endpoint needs and is hard to get right: TLS from
the certificate files, a restart when they change (renewal), and, in `managed` mode, the
webhook configurations kopf keeps pointing at it. What it calls on each request, kopf's
handler machinery (a cause, a diff of old and new object, a memo, per-handler outcomes and
logging, a JSON patch from a copy of the body), cost about two thirds of the operator's CPU
per request in the webhook benchmark (BENCHMARKS.md), on the event loop the decisions share.
For two handlers that are one function call each, `ReviewServer` answers the
AdmissionReview directly: the URL's last segment names the webhook (kopf's handler id, the
path the chart's configurations use too), and the response is what the API server reads:
`allowed`, a `status` with the refusal's message and code, `warnings`, and a JSON patch.

A check that fails with an unexpected error answers HTTP 500, so the API server applies the
configurations' `failurePolicy`, as for an unreachable webhook: `Ignore` (the chart's
default) lets the write through, and the operator still decides every job and reports
what is wrong in its status; `Fail` refuses it.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import kopf
from aiohttp import web

from controller.api.base import GROUP
from controller.api.finetunejob import PLURAL
from controller.webhook.admission import AdmissionWebhook

VALIDATE_HANDLER = "validate-finetunejob"
MUTATE_HANDLER = "mutate-finetunejob"

log = logging.getLogger("vramgate.webhook")


class ReviewServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server with `hook` answering its reviews (set before kopf runs)."""

    hook: AdmissionWebhook | None = None

    def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve with `review` in place of kopf's `fn` (its handler machinery)."""
        return super().__call__(cast(kopf.WebhookFn, self.review))

    async def review(
        self, request: Mapping[str, Any], *, webhook: str | None = None, **_: Any
    ) -> dict[str, Any]:
        """The AdmissionReview response to `request`, sent to the webhook named `webhook`."""
        if self.hook is None:
            raise web.HTTPServiceUnavailable(reason="the webhooks are not registered yet")
        return await answer(self.hook, webhook, request)


async def answer(
    hook: AdmissionWebhook, webhook: str | None, request: Mapping[str, Any]
) -> dict[str, Any]:
    """The AdmissionReview response of `hook`'s `webhook` (a handler id) to `request`."""
    payload = request.get("request") if isinstance(request, Mapping) else None
    if not isinstance(payload, Mapping):
        raise web.HTTPBadRequest(reason="not an AdmissionReview: no request")
    resource = payload.get("resource")
    if not isinstance(resource, Mapping):
        raise web.HTTPBadRequest(reason="not an AdmissionReview: no request.resource")
    if (resource.get("group"), resource.get("resource")) != (GROUP, PLURAL):
        raise web.HTTPNotFound(reason=f"no webhook for {resource}")
    if webhook not in (VALIDATE_HANDLER, MUTATE_HANDLER):
        raise web.HTTPNotFound(reason=f"no webhook {webhook!r}")
    response: dict[str, Any] = {"uid": payload.get("uid", ""), "allowed": True}
    obj = payload.get("object")
    if isinstance(obj, Mapping):
        warnings: list[str] = []
        try:
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
    if operation != "CREATE":
        return
    resources = await hook.resized(spec, warnings)
    if resources is not None:
        patch = [{"op": "add", "path": "/spec/resources", "value": resources}]
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode("ascii")
