"""The kopf operator: FineTuneJob estimation now; GPU inventory and workloads to follow.

`status` is pure (what the status should say); `handlers` wires it to kopf; `run` configures
and starts kopf (`vramgate operator`)."""
