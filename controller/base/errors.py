"""The errors vramgate raises on purpose, classified by what happens next.

One root, three branches, because each caller acts on the branch, not on the error:

* `PermanentError`: the input is wrong (a bad spec, a model that cannot be traced); the same
  input fails the same way however often it is tried. Record it, never retry.
* `TemporaryError`: something the work needs is unavailable now (the API server, a ConfigMap,
  a GPU backend); the same input may succeed later. Retry with a delay.
* `DeploymentError`: the installation cannot do this (an optional extra not installed, no
  credentials, a bad setting of the operator or agent); fixed by changing the deployment,
  not the job, and not a vramgate bug.

Anything else escaping vramgate code is a bug. `controller.admission.failures` maps the branches
to condition reasons and kopf's retries; the CLI exits 2 on permanent errors. A leaf module,
so that every layer, the pure core included, can raise these.
"""

from __future__ import annotations


class VramgateError(Exception):
    """The root: an error vramgate raised on purpose, with a one-line message for people."""


class PermanentError(VramgateError):
    """The input is wrong: retrying the same input cannot help."""


class TemporaryError(VramgateError):
    """Something the work needs is unavailable now: the same input may succeed later."""


class DeploymentError(VramgateError):
    """The installation cannot do this; the message says what to install or configure."""


class ConfigMapUnavailable(TemporaryError):
    """The ConfigMap a job's model config is in, or its key, is missing or does not hold a
    JSON object (`controller.kube.configmaps`); message: one line naming the field and the
    ConfigMap."""


class ProfileUnavailable(DeploymentError):
    """An estimator profile the job asks for is not installed here (the trace profile
    without the `trace` extra): neither the spec's fault nor an estimator bug."""
