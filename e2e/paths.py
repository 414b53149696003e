"""Where the e2e harness keeps its cache and cluster state.

One place decides this so that the builder, the cluster and the tests agree. Order:
``$VRAMGATE_CACHE``, then ``$XDG_CACHE_HOME/vramgate``, then ``~/.cache/vramgate``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    explicit = os.environ.get("VRAMGATE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "vramgate"


def default_cluster_dir() -> Path:
    """State dir for ``python -m e2e.cluster`` (overridable with ``$VRAMGATE_CLUSTER_DIR``)."""
    explicit = os.environ.get("VRAMGATE_CLUSTER_DIR")
    return Path(explicit).expanduser() if explicit else cache_root() / "cluster"
