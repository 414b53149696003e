"""The chart and the image end to end on a kind cluster: `python -m e2e.kind`."""
