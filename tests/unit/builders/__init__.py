"""What the unit tests build their inputs with, shared instead of a builder per file.

packing.py    NodeStates, GPUs, estimates, views and reservations of the packing core
decision.py   job requests and the message check of the decision core
admission.py  the API's objects as dicts (Nodes, GPUNodes, FineTuneJobs), one admission
              pass and what it wrote
"""
