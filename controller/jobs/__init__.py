"""A FineTuneJob spec -> the estimator's inputs and the estimate, every error with its path.

    spec.py      the spec's translation (`translate`, `JobPlan`), shared by the webhook, the
                 operator and the CLI; `estimate_plan`
    profiles.py  the profile dispatch: formula profiles here, the trace through a lazy import

Pure: no Kubernetes, no kopf; torch only through the trace profile, imported on first use.
"""
