"""What every layer may use, and which uses nothing of vramgate's.

units.py     sizes: GiB, MiB, parsing and formatting of byte counts
errors.py    the error tree (permanent / temporary / deployment)
backoff.py   jittered exponential backoff
settings.py  one settings loader for the operator and the agent: flag > env > file >
             default
clock.py     the injected clock (monotonic and wall time), with its fake for tests
"""
