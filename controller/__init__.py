"""vramgate: training-VRAM estimation and GPU admission for LLM fine-tuning on Kubernetes.

The folders split the pure core from the shells (the README's "Layout" draws the tree):
`cli/`, `operator/`, `webhook/`, `agent/` and `kube/` do the I/O; `admission/`,
`decision/`, `workload/`, `jobs/`, `api/`, `packing/`, `estimator/` and `base/` take plain data
and return plain data; `trace/` is the torch-based profile (an optional extra), and
`calibration/` the offline tools that fit the calibrated profile to it.
"""

__version__ = "0.1.0"
