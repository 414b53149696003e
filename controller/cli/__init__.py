"""The `vramgate` command: estimate, plan, trace, presets, crds, operator, agent.

main.py          the argument parser and the subcommands (`vramgate = controller.cli:main`)
plan.py          `vramgate plan`: the operator's decisions, offline
report.py        how `vramgate estimate` renders an estimate
apply_checks.py  what `kubectl apply` would refuse in a job file (pure)
"""

from controller.cli.main import main

__all__ = ["main"]
