"""Admission webhooks: the FineTuneJob validator, and the TLS it is served with."""
