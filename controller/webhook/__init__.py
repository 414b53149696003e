"""The admission webhooks (shell): validating and mutating FineTuneJobs at `kubectl apply`.

admission.py     the two handlers: validate (every error with its field, what can never
                 fit, the workload's dry run) and mutate (Resize at create)
trainjob.py      Kubeflow Trainer's TrainJobs sized at create (`trainJobSizing`)
validating.py    the one spec validator the operator's InvalidSpec also uses
dry_run.py       a server-side dry run of the batch Job the operator would create
server.py        answers the API server's reviews on a thread of its own, over TLS
registration.py  registers the chart's webhook configurations (`--webhook managed`)
certs.py, cert_secret.py  the serving certificate: made, kept in a Secret, renewed
"""
