"""The configurations `--webhook managed` registers (against the API server and the chart:
tests/integration/test_operator.py and test_chart.py)."""

from __future__ import annotations

from controller.webhook.registration import MUTATE_HANDLER, VALIDATE_HANDLER, configurations


def test_each_webhook_calls_its_handler_at_the_servers_url_with_its_ca() -> None:
    made = configurations("vg.example", "https://10.0.0.1:9443/", "Y2E=")
    (validating,) = made["ValidatingWebhookConfiguration"]["webhooks"]
    (mutating,) = made["MutatingWebhookConfiguration"]["webhooks"]
    assert validating["clientConfig"] == {
        "url": f"https://10.0.0.1:9443/{VALIDATE_HANDLER}", "caBundle": "Y2E="
    }  # fmt: skip
    assert mutating["clientConfig"]["url"] == f"https://10.0.0.1:9443/{MUTATE_HANDLER}"
    # kopf's names: the API server quotes them in a refusal, and tests and people look for them
    assert (validating["name"], mutating["name"]) == (
        f"{VALIDATE_HANDLER}.vg.example", f"{MUTATE_HANDLER}.vg.example"
    )  # fmt: skip
    assert "namespaceSelector" not in validating
    plain = configurations("vg.example", "http://127.0.0.1:8080")
    assert "caBundle" not in plain["ValidatingWebhookConfiguration"]["webhooks"][0]["clientConfig"]


def test_listed_namespaces_narrow_both_webhooks_to_them() -> None:
    made = configurations("vg", "https://h:1", namespaces=["team-b", "team-a", "team-b"])
    for config in made.values():
        (webhook,) = config["webhooks"]
        assert webhook["namespaceSelector"] == {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                  "values": ["team-a", "team-b"]}]
        }  # fmt: skip
