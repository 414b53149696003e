"""What computes an estimate besides the spec and the model: the part of a traced estimate's
digest (`controller.jobs.spec.estimate_digest`) that says which estimator made it, and the
trace libraries' versions kept beside the traced estimate.

A version string alone is not enough: "0.1.0" stays the same across every change of the
estimator until a release, so a traced estimate kept in status would be read back after an
upgrade that changes what it is. The digest therefore holds a hash of the estimator's and the
trace's own code and data (read once, at import: ~100 small files, a few milliseconds).

The trace libraries' versions (torch, transformers: their model code is what the trace runs)
are not in the digest: an operator without the trace extra must still read back what an
operator with it stored, and it cannot know the versions that operator had. They travel in
the stored payload instead (`controller.estimator.codec.encode`'s `made_by`), and an operator
that can trace traces again where its own libraries differ.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from controller import __version__
from controller.estimator import codec

#: The packages whose code and data compute an estimate: the formulas and their tables, the
#: trace, the allocator model the trace replays and calibrated's fixed costs come from, the
#: translation of a spec into what they take, the API types that translation reads, and the
#: units and errors under all of them.
_PACKAGE = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("estimator", "trace", "allocator", "jobs", "api", "base")
CODE_SUFFIXES = frozenset({".py", ".json", ".yaml", ".yml"})
#: The libraries the trace runs; their versions are kept with a traced estimate.
TRACE_LIBRARIES = ("torch", "transformers", "peft")


def code_digest(root: Path = _PACKAGE) -> str:
    """sha256 (hex, first 16) of the estimator's, the trace's and the spec translation's
    files under `root`: each file's path relative to `root` and its bytes, in path order."""
    digest = hashlib.sha256()
    for folder in CODE_FOLDERS:
        files = sorted(p for p in (root / folder).rglob("*") if p.suffix in CODE_SUFFIXES)
        for path in files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


CODE_DIGEST = code_digest()


def estimate_identity() -> str:
    """The estimator's part of a digest: vramgate's version, its code's hash and the codec's
    version. A digest includes it, so an upgrade that changes the estimator traces again."""
    return f"vramgate {__version__} ({CODE_DIGEST}); codec {codec.VERSION}"


def trace_libraries() -> str:
    """The trace libraries' versions here ("torch none" where one is missing)."""
    parts = []
    for name in TRACE_LIBRARIES:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} none")
    return "; ".join(parts)
