"""The names vramgate gives what it creates for a FineTuneJob, derived from the job's name.

One place, because three readers must agree: the workload builder names the Job and labels
its pods, and the operator and `vramgate plan` find a job's pods by that label. FineTuneJob
names may have 253 characters; a Job name used in pod hostnames and a label value may not.
"""

from __future__ import annotations

import hashlib
import re

#: Indexed Job pods are named for DNS `<job>-<index>` (a 63-character label): 56 leaves room
#: for indices up to 999,999 and keeps `<name>-gpus` a valid name too.
MAX_WORKLOAD_NAME = 56
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_MAX_LABEL_VALUE = 63


def workload_name(job_name: str) -> str:
    """The Job's (and Service's) name for a FineTuneJob: a DNS-1035 label of at most
    `MAX_WORKLOAD_NAME` characters, the job's own name whenever it is one.

    Else a sanitized prefix of the name and 8 hex digits of its SHA-256, so that two long
    names sharing a prefix still get two workloads, and the same name always the same one.
    """
    if len(job_name) <= MAX_WORKLOAD_NAME and _DNS_1035.match(job_name):
        return job_name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9]+", "-", job_name.lower()).strip("-")
    if not base[:1].isalpha():  # DNS-1035 starts with a letter; `7b-lora` -> `ftj-7b-lora-...`
        base = f"ftj-{base}"
    prefix = base[: MAX_WORKLOAD_NAME - 1 - len(digest)].rstrip("-")
    return f"{prefix}-{digest}"


def job_label_value(job_name: str) -> str:
    """The value of `JOB_LABEL` for a job: its name, unless the name cannot be a label
    value (over 63 characters; FineTuneJob names may have 253), then its workload name."""
    if len(job_name) <= _MAX_LABEL_VALUE and _LABEL_VALUE.match(job_name):
        return job_name
    return workload_name(job_name)
