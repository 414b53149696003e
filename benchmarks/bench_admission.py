"""Admission decisions on a 10,000-node x 8-GPU cluster with realistic fragmentation.

    python -m benchmarks.bench_admission [--nodes 10000] [--decisions 2000] [--jobs 10000]

Targets (design): one decision p99 < 2 ms for a 1-GPU job and < 10 ms for an 8-GPU FSDP job
that must span nodes; `plan` of 10,000 queued jobs < 30 s; `vramgate plan` end to end (YAML
files in, decisions out) on the same cluster and queue. The process pins itself to one CPU.

Fragmentation: every node runs other work, so each GPU's free memory is drawn from what a
busy cluster shows (full, half, a sliver); on every node at most four GPUs have room for the
8-GPU job's per-GPU share, so it cannot fit on one node and must take k nodes x g GPUs. On
the other four a pod holds the GPU it uses, as under the device plugin (the default GPU mode,
which hands a pod any GPU of its node that no pod holds); the four with room are free of
pods, some partly used by processes outside any pod, so what each node's device plugin may
hand out (its least free such GPU) differs from node to node. `--gpu-mode dra` times the same
cluster with the exact GPUs pinned.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from controller.api.enums import AdmissionPolicy
from controller.base.units import GIB
from controller.decision import AdmissionSettings, JobRequest, decide, plan
from controller.estimator import Method, Parallelism, TrainingSettings, load_shape
from controller.estimator.settings import Profile
from controller.jobs.profiles import estimate
from controller.packing.inventory import GpuDevice, GpuMode, NodeState, PackingSettings, Snapshot
from controller.packing.view import ClusterView

GPU_BYTES = 80 * GIB


def _estimate(preset: str, method: Method, seq_len: int = 2048):  # type: ignore[no-untyped-def]
    rank = None if method is Method.FULL else 16
    settings = TrainingSettings(
        method=method, rank=rank, seq_len=seq_len, profile=Profile.CALIBRATED
    )
    return estimate(load_shape(preset), settings)


def cluster(nodes: int, big_need: int, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        frees: list[tuple[int, bool]] = []  # (free, held by a pod)
        for i in range(8):
            if i < 4:  # room for the big job's share on at most four GPUs of a node
                roomy = rng.choice([GPU_BYTES, big_need + rng.randrange(0, 20 * GIB)])
                frees.append((roomy, False))
            else:  # a pod's work
                frees.append((rng.choice([0, 2 * GIB, 9 * GIB, rng.randrange(0, big_need)]), True))
        rng.shuffle(frees)
        name = f"node-{n:05d}"
        gpus = []
        for i, (free, held) in enumerate(frees):
            pods = {f"pod-{n:05d}-{i}": GPU_BYTES - free} if held else {}
            gpus.append(
                GpuDevice(f"GPU-{n:05d}-{i}", i, "NVIDIA H100 80GB HBM3", GPU_BYTES, free, pods)
            )
        held = sum(1 for g in gpus if g.pod_used_bytes)
        out.append(NodeState(name, tuple(gpus), gpu_allocatable=8, gpu_allocated=held))
    return Snapshot(tuple(out))


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


def time_decisions(view: ClusterView, jobs: list[JobRequest], count: int) -> list[float]:
    out = []
    for i in range(count):
        job = jobs[i % len(jobs)]
        start = time.perf_counter()
        decide(job, view)
        out.append((time.perf_counter() - start) * 1000)
    return out


def queue(size: int, seed: int = 1) -> list[JobRequest]:
    """A mixed queue: mostly small LoRA/QLoRA jobs, some multi-GPU full fine-tunes."""
    rng = random.Random(seed)
    kinds = [
        ("llama-3.1-8b", Method.QLORA, Parallelism.FSDP, 1),
        ("llama-3.1-8b", Method.LORA, Parallelism.FSDP, 1),
        ("qwen2.5-7b", Method.LORA, Parallelism.DDP, 2),
        ("llama-3.1-8b", Method.FULL, Parallelism.FSDP, 2),
        ("qwen2.5-32b", Method.FULL, Parallelism.FSDP, 8),
        ("llama-3.1-70b", Method.QLORA, Parallelism.FSDP, 1),
    ]
    estimates = {k: _estimate(k[0], k[1]) for k in kinds}
    jobs = []
    for i in range(size):
        kind = rng.choices(kinds, weights=[10, 10, 10, 5, 60, 5])[0]
        policy = rng.choice(list(AdmissionPolicy)[:2])
        jobs.append(
            JobRequest(f"team/job-{i:05d}", estimates[kind], kind[2], kind[3], policy=policy)
        )
    return jobs


def end_to_end(snapshot: Snapshot, jobs: int, gpu_mode: str) -> float:
    """`vramgate plan --cluster FILE JOBS` on the same cluster, as a subprocess (the cluster
    as JSON, as `kubectl get -o json` writes it; the jobs as YAML manifests)."""
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [
            {
                "name": node.name,
                "gpus": [
                    {"memory": f"{g.total_bytes}B", "free": f"{g.free_bytes}B"}
                    | ({"allocated": True} if g.pod_used_bytes else {})
                    for g in node.gpus
                ],
            }
            for node in snapshot.nodes
        ]
        Path(tmp, "cluster.json").write_text(json.dumps({"nodes": nodes}))
        documents = []
        rng = random.Random(2)
        for i in range(jobs):
            method, rank = rng.choice([("QLoRA", 16), ("LoRA", 16), ("Full", None)])
            spec = {"model": {"preset": "llama-3.1-8b"}, "method": method, "resources": {"gpus": 1}}
            if rank:
                spec["lora"] = {"rank": rank}
            documents.append(
                {
                    "apiVersion": "vramgate.dev/v1alpha1",
                    "kind": "FineTuneJob",
                    "metadata": {"name": f"job-{i:05d}", "namespace": "team"},
                    "spec": spec,
                }
            )
        Path(tmp, "jobs.yaml").write_text(yaml.safe_dump_all(documents))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "controller.cli", "plan", "--json", "--cluster",
             f"{tmp}/cluster.json", f"{tmp}/jobs.yaml", "--gpu-mode", gpu_mode],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=2_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--gpu-mode", choices=[m.value for m in GpuMode], default="devicePlugin")
    args = parser.parse_args()
    packing = PackingSettings(gpu_mode=GpuMode(args.gpu_mode))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    big = _estimate("qwen2.5-32b", Method.FULL)
    big_need = big.per_gpu_bytes(8, Parallelism.FSDP)
    snapshot = cluster(args.nodes, big_need)
    start = time.perf_counter()
    view = ClusterView(snapshot, packing)
    built = time.perf_counter() - start
    print(
        f"cluster: {args.nodes} nodes x 8 GPUs, GPU mode {args.gpu_mode}; view built in "
        f"{built * 1000:.0f} ms"
    )

    small = [
        JobRequest("team/small", _estimate("llama-3.1-8b", Method.QLORA, s), Parallelism.FSDP, 1)
        for s in (512, 2048, 8192, 16384)
    ]
    p50, p99 = percentiles(time_decisions(view, small, args.decisions))
    print(f"1-GPU decision:             p50 {p50:.3f} ms   p99 {p99:.3f} ms   (target p99 < 2)")

    wide = [JobRequest("team/wide", big, Parallelism.FSDP, 8)]
    check = decide(wide[0], view)
    spans = len(check.placement)
    assert check.admitted and spans > 1, check
    p50, p99 = percentiles(time_decisions(view, wide, args.decisions))
    print(
        f"8-GPU FSDP across {spans} nodes: p50 {p50:.3f} ms   p99 {p99:.3f} ms   (target p99 < 10;"
        f" {big_need / GIB:.1f} GiB per GPU)"
    )

    jobs = queue(args.jobs)
    start = time.perf_counter()
    decisions = plan(snapshot, jobs, AdmissionSettings(packing=packing))
    took = time.perf_counter() - start
    admitted = sum(d.admitted for d in decisions)
    print(
        f"plan of {len(jobs)} queued jobs:  {took:.2f} s ({admitted} admitted, "
        f"{len(jobs) - admitted} queued or rejected)   (target < 30 s)"
    )
    if not args.skip_end_to_end:
        took = end_to_end(snapshot, args.jobs, args.gpu_mode)
        print(f"vramgate plan end to end ({args.jobs} jobs, YAML in, JSON out): {took:.2f} s")


if __name__ == "__main__":
    main()
