# syntax=docker/dockerfile:1
# One image for both parts of vramgate: `vramgate operator` (a Deployment) and
# `vramgate agent` (a DaemonSet on GPU nodes). Build:
#
#   docker build -t vramgate:dev .
#   docker build -t vramgate:dev-trace --build-arg EXTRAS=trace .   # + the Trace profile (torch)
#
# The base is pinned by version (never `latest`), the same in both stages, so the virtual
# environment built in the first runs unchanged in the second.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# -- build: the package and its dependencies into a virtual environment -----------------------
FROM ${PYTHON_IMAGE} AS build
# Optional extras of the package: "trace" adds torch, transformers and peft for the Trace
# estimator profile (a much larger image); empty: the operator and agent only. Each has its
# lock, every package pinned with its hashes: requirements/runtime.txt, requirements/trace.txt
# (`make lock` refreshes them).
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/vramgate
WORKDIR /src
# Only what the package needs (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY requirements/runtime.txt requirements/trace.txt ./requirements/
COPY controller ./controller
# The locked versions, each file checked against its hash; then the package alone, built by the
# locked setuptools; `pip check` fails the build if the lock lacks a dependency.
RUN lock="requirements/${EXTRAS:-runtime}.txt" \
    && { [ -f "$lock" ] || { echo "EXTRAS: must be empty or trace, not $EXTRAS" >&2; exit 1; }; } \
    && /opt/vramgate/bin/pip install --require-hashes --no-deps -r "$lock" \
    && /opt/vramgate/bin/pip install --no-deps --no-build-isolation ".${EXTRAS:+[$EXTRAS]}" \
    && /opt/vramgate/bin/pip check \
    && /opt/vramgate/bin/vramgate --help > /dev/null

# -- runtime: the environment alone, as an unprivileged user -------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="vramgate" \
      org.opencontainers.image.description="LLM fine-tuning VRAM admission for Kubernetes: operator and node agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/vramgate/vramgate"
COPY --from=build /opt/vramgate /opt/vramgate
# Unbuffered logs reach `kubectl logs` at once; no .pyc writes (the chart mounts the root
# filesystem read-only; pip compiled them at build time).
ENV PATH=/opt/vramgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A numeric non-root user (the chart's runAsUser), so runAsNonRoot can verify it without
# an /etc/passwd entry.
USER 65532:65532
WORKDIR /tmp
# Exec form: no shell between the kubelet and the process, so SIGTERM reaches vramgate.
ENTRYPOINT ["/opt/vramgate/bin/vramgate"]
CMD ["--help"]
