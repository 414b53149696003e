"""The operator (`vramgate operator`): the shell around the pure admission pass.

run.py        configures and starts kopf: settings, leader election, the webhook server,
              the metrics server
handlers.py   the kopf handlers: keep the caches and wake the scheduler, nothing else
caches.py     kopf indexes of what admission reads (slim copies)
scheduler.py  the one scheduling loop: snapshot, estimate, decide (`controller.admission`),
              persist, create and delete workloads, read what a missing workload left
leader.py     the Lease: one replica decides, the others keep their caches warm
metrics.py    the Prometheus metrics; memory.py, the process's own footprint
settings.py   its settings (flag > env > file > default), and the options run takes
"""
