"""vramgate: training-VRAM estimation and GPU admission for LLM fine-tuning on Kubernetes.

The folders split the pure core from the shell: `estimator/` (and later `packing`, `decision`)
take plain data and return plain data; `operator/`, `webhook/`, `agent/` and `cli` do the I/O.
"""

__version__ = "0.1.0"
