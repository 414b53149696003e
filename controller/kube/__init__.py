"""The Kubernetes API, as vramgate calls it: the only package that imports the client.

    client.py      client construction, the Conflict / Gone translation, and the typed calls
                   the operator makes (status writes, workloads, events, leases)
    configmaps.py  a job's model config from the ConfigMap it names

The operator, the webhook and the agent reach the API through here (kopf's own watches
aside), so that every request's failure is said in vramgate's terms in one place.
"""
