"""Admission: the pure pass the operator runs, and the cluster view it decides on.

    admission_pass.py  one pass: a snapshot of the cluster in; status writes, workloads to
                       create and delete, and look-ups out (the scheduler carries them out)
    status.py          what the status of a job should say: estimate, conditions, events
    traced.py          a traced estimate read back from a job's status, not traced again
    observed.py        each admitted job's observed peak per GPU, from the agents' readings
    metric_view.py     the state gauges' view of the jobs, as the pass left them
    failures.py        an estimation's error -> the condition reason and retry it gets
    cluster.py         Nodes, GPUNodes, Pods, FineTuneJobs (dicts) -> a packing snapshot and
                       the jobs' requests
    compact.py         `vramgate plan`'s compact description of a cluster not built yet
    priority.py        a job's queue priority, from the PriorityClasses an administrator made
    config.py          the admission settings the operator and `vramgate plan` share
    dump_checks.py     the fields admission reads of a cluster dump, checked as the API
                       server would have
    kueue.py           Kueue Workloads as admission reads them (the AdmissionCheck, Resize)
    trainjob.py        a TrainJob read as a FineTuneJob and sized at create: the patch
    holds.py           the short holds on what a sized TrainJob counted on, and their end
    pods.py            what admission reads of a pod: finished or not, its nvidia.com/gpu

Pure: plain data in, plain data out; no Kubernetes client, no kopf, no HTTP. The operator
(`controller.operator`) and `vramgate plan` (`controller.cli`) both decide through it.
"""
