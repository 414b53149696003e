"""Fixtures for tests against the real local control plane from ``e2e/``.

The control plane is started once per pytest session: starting it takes seconds once the
binaries are cached, while the first build takes many minutes. Missing binaries are built
here, and an impossible build fails the run with one clear line: it never skips, so a
machine without Go cannot report a green integration suite that ran nothing.
"""

from __future__ import annotations

import atexit
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from e2e.build import BuildError, ensure_binaries
from e2e.cluster import CLIENT_TOOLS, COMPONENTS, Cluster, ClusterError
from e2e.kueue import Kueue, KueueError
from e2e.prometheus import PrometheusMissing, find_binaries
from e2e.wait import wait_until

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder needs the control plane: mark it, so that
    ``-m "not integration"`` leaves them all out at once."""
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A started control plane; stopped at session end, on failure, and at interpreter exit."""
    problem = ""
    try:
        ensure_binaries((*COMPONENTS, *CLIENT_TOOLS))
    except BuildError as err:
        problem = f"cannot build the local control plane: {err}"
    if problem:  # failed outside the except block, so the report is just this line
        pytest.fail(problem, pytrace=False)
    # Under pytest's basetemp, so the logs of the last runs stay around for debugging.
    instance = Cluster(tmp_path_factory.mktemp("cluster"), die_with_parent=True)
    atexit.register(instance.stop)
    try:
        instance.start()
    except ClusterError as err:
        problem = f"cannot start the local control plane: {err}"
    if problem:
        instance.stop()
        pytest.fail(problem, pytrace=False)
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def kueue(cluster: Cluster) -> Iterator[Kueue]:
    """Kueue's controller on the control plane, its CRDs installed (e2e/kueue.py); the
    binary is built if missing, and a failed build or start fails the run in one line."""
    problem = ""
    try:
        ensure_binaries(["kueue"])
    except BuildError as err:
        problem = f"cannot build Kueue: {err}"
    if problem:
        pytest.fail(problem, pytrace=False)
    instance = Kueue(cluster)
    try:
        instance.start()
    except (KueueError, BuildError) as err:
        problem = f"cannot start Kueue: {err}"
    if problem:
        pytest.fail(problem, pytrace=False)
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="session")
def prometheus_binaries() -> None:
    """prometheus and promtool (`make prometheus` installs them): missing, the run fails in
    one line, never skips."""
    problem = ""
    try:
        find_binaries()
    except PrometheusMissing as error:
        problem = str(error)
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def gpu_nodes(cluster: Cluster) -> list[str]:
    """Two simulated 8 x H100 nodes, shared by the whole session."""
    return cluster.create_gpu_nodes(2)


@pytest.fixture
def namespace(api_client: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, ready for pods (its `default` ServiceAccount exists)."""
    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_until(
        lambda: any(
            sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items
        ),
        timeout=30,
        what=f"the default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)
