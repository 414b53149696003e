"""The node agent (`vramgate agent`): measured GPU memory into the node's GPUNode and Prometheus.

A backend (``nvml``, ``dcgm``, ``static``; see ``readings.GpuBackend``) reads the GPUs; the
poll loop (``loop``) maps GPU processes to pods (``pods``), decides whether the change is worth
a write (``change``), applies the GPUNode status (``publisher``) and serves the metrics
(``metrics``). ``fake_nvml`` stands in for pynvml in tests.
"""
