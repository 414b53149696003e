"""Errors a user can cause, classified by what happens next.

A `SpecError` is permanent: the same spec fails the same way however often it is retried, so
the operator records it (condition reason `InvalidSpec`) instead of retrying, the webhook
refuses it, and the CLI exits 2. Its text is one line that names the field and what is allowed.
It is a `PermanentError` of `controller.base.errors`, and a `ValueError`: a value the field refuses.
"""

from __future__ import annotations

from controller.base.errors import PermanentError


class SpecError(PermanentError, ValueError):
    """One invalid field: `field` is its path (e.g. `spec.lora.rank`), `message` what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnreadFamily(SpecError):
    """A config whose `model_type` no hand-written reading reads: the shells read it
    generically from the model transformers builds, where the trace extra is installed."""


class SpecErrors(SpecError):
    """Several invalid fields at once, so a user fixes all of them in one round trip."""

    def __init__(self, errors: list[SpecError]) -> None:
        if not errors:
            raise ValueError("SpecErrors needs at least one error")
        self.errors = errors
        first = errors[0]
        super().__init__(first.field, first.message)
        self.args = ("; ".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return "; ".join(str(e) for e in self.errors)


def shown(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters: an error quotes what it refuses, and a
    megabyte string where a number belongs must not become a megabyte error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
