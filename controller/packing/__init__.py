"""Packing: where a job's GPU memory can go. Pure: plain data in, plain data out.

    inventory.py   the cluster as measured (Snapshot), effective free memory, reservations
    index.py       free memory indexed by GPU and by node, kept current as jobs are assumed
    placement.py   best-fit placement: one node first, then k nodes x g GPUs; device maps
    view.py        one decision pass: the cluster now and the cluster when empty
    fit.py         the same question for a list of free bytes (`vramgate estimate`)

The decision of what to do with a job (admit, resize, queue, reject) is in
`controller.decision`, which asks these modules where it fits.
"""
