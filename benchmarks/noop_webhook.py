"""A webhook that does nothing, served the way the operator serves vramgate's: the reference
the webhook latency target is measured against (`bench_operator --only webhook`).

    python -m benchmarks.noop_webhook --cert-dir DIR [--config-name NAME]   # $KUBECONFIG

The same server as the operator's (`controller.webhook.server.ReviewServer`: kopf's TLS from
a certificate made by `controller.webhook.certs`, aiohttp on a thread of its own with its own
event loop, in a Python process of its own), registered by the same `Registrar` under its own
configuration names: the chart's rules, matchConditions, failurePolicy, timeout and
`sideEffects: None` (so dry-run creates reach it too). Its `review` answers `allowed: true`
at once, with no patch; only the request's uid is read, which the API server requires back.
As the operator, it freezes what exists at start out of the garbage collector's reach.

It prints `READY <url>` once registered, and deletes its configurations at SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import kopf

from controller.kube import api_client
from controller.webhook.certs import ensure_serving_cert
from controller.webhook.registration import Registrar
from controller.webhook.server import ReviewServer

#: The line it prints once the API server may call it.
READY = "READY"
CONFIG_NAME = "vramgate-noop.vramgate.dev"


class NoopServer(ReviewServer):
    """`ReviewServer` answering every review `allowed: true`, at once."""

    def warm(self) -> None:
        pass  # its reviews need nothing

    async def review(
        self, request: Mapping[str, Any], *, webhook: str | None = None, **_: Any
    ) -> dict[str, Any]:
        payload = request.get("request")
        uid = payload.get("uid", "") if isinstance(payload, Mapping) else ""
        return {
            "apiVersion": request.get("apiVersion", "admission.k8s.io/v1"),
            "kind": request.get("kind", "AdmissionReview"),
            "response": {"uid": uid, "allowed": True},
        }


async def _unused(request: Any, **_: Any) -> Any:
    raise AssertionError("ReviewServer answers its reviews itself")


async def serve(server: NoopServer) -> None:
    """Serve until SIGTERM or SIGINT; the registrar then deletes the configurations."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        async for config in server(cast(kopf.WebhookFn, _unused)):
            print(f"{READY} {config['url']}", flush=True)
    except asyncio.CancelledError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cert-dir", type=Path, required=True)
    parser.add_argument("--config-name", default=CONFIG_NAME)
    parser.add_argument("--addr", default="127.0.0.1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # as the operator
    cert = ensure_serving_cert(args.cert_dir, [args.addr])
    server = NoopServer(
        addr=args.addr, port=0, certfile=str(cert.cert), pkeyfile=str(cert.key),
        cafile=str(cert.ca),
    )  # fmt: skip
    server.registrar = Registrar(api_client(pool_size=4), args.config_name)
    gc.collect()
    gc.freeze()
    asyncio.run(serve(server))


if __name__ == "__main__":
    main()
