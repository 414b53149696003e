"""The end-to-end suite: admission as a user sees it, on any cluster vramgate is installed on.

Each scenario talks to the cluster only as a user does, through `kubectl` (apply, get,
delete, cordon): it never reaches into the operator. So the same scenarios run

* in the test suite (`tests/integration/test_e2e_suite.py`), on the local control plane with
  the chart installed by helm, the operator and the agents running as the chart's
  ServiceAccounts, and the webhooks reached through the chart's Service;
* in `e2e/kind` (`make kind`), on a kind cluster with the image and the chart installed.

What a cluster must offer (`layout.py`): GPU nodes whose agents publish the layout's GPUs
(the static backend's file, `layout.static_gpus`), labelled with one GPU product that no
other node has. The scenarios run one after the other, each in a namespace of its own that
it deletes (and waits for) before the next starts, so each starts from the empty layout.
"""
