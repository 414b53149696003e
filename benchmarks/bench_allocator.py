"""Allocator replay speed: events per second on a generated training-like sequence.

    python -m benchmarks.bench_allocator [--events 1000000] [--json]

The sequence mixes the three segment rules (requests up to 1 MiB, 1-10 MiB, 10-100 MiB),
mostly last-in-first-out frees with some out of order, up to 3,000 live blocks, and a fifth
of the mallocs on two side streams: the shape of a traced step's storages. Each allocator
setting is replayed once over the same sequence. Target (issue 33): 10^6 events in a few
seconds on one core.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from controller.allocator import AllocatorConfig, Event, replay

MIB = 2**20
GIB = 2**30
CONFIGS = {
    "default": AllocatorConfig(),
    "expandable_segments": AllocatorConfig(expandable_segments=True),
    "max_split_size_mb:256 + gc 0.6 of 80 GiB": AllocatorConfig(
        max_split_size=256 * MIB, capacity=80 * GIB, garbage_collection_threshold=0.6
    ),
}


def training_like(count: int, seed: int = 0) -> list[Event]:
    rng = random.Random(seed)
    live: list[tuple[int, int, int]] = []
    events: list[Event] = []
    next_id = 0
    while len(events) < count:
        if live and (len(live) > 3000 or rng.random() < 0.5):
            index = rng.randrange(len(live)) if rng.random() < 0.3 else len(live) - 1
            block, size, stream = live[index]
            live[index] = live[-1]
            live.pop()
            events.append(Event(block, size, stream, free=True))
            continue
        draw = rng.random()
        if draw < 0.5:
            size = rng.randint(1, MIB)
        elif draw < 0.8:
            size = rng.randint(MIB, 10 * MIB)
        else:
            size = rng.randint(10 * MIB, 100 * MIB)
        stream = 0 if rng.random() < 0.8 else rng.randint(1, 2)
        live.append((next_id, size, stream))
        events.append(Event(next_id, size, stream, free=False))
        next_id += 1
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    events = training_like(args.events)
    rows = []
    for name, config in CONFIGS.items():
        start = time.perf_counter()
        result = replay(events, config)
        seconds = time.perf_counter() - start
        rows.append(
            {
                "config": name,
                "events": len(events),
                "seconds": round(seconds, 3),
                "events_per_second": round(len(events) / seconds),
                "peak_allocated_gib": round(result.peak_allocated / GIB, 2),
                "peak_reserved_gib": round(result.peak_reserved / GIB, 2),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{row['config']:<42} {row['events']:>9,} events {row['seconds']:>6.2f} s "
            f"({row['events_per_second']:>9,}/s)  allocated {row['peak_allocated_gib']} GiB, "
            f"reserved {row['peak_reserved_gib']} GiB"
        )


if __name__ == "__main__":
    main()
