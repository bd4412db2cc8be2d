"""The plans of fault schedules (``fault_schedule.py``): which threads park, which
racers resume them through which proxy when, and which faults land when — a
function of ``(seed, index, seconds)`` alone, so a seed plans the same schedules on
any machine and a failing run is reproduced by its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

GATES_MS = (0, 300, 1000)
FAULT_KINDS = ("kill", "term", "pg_restart", "terminate", "partition")


@dataclass
class Job:
    racer: str
    thread: int          # index of the thread
    proxy: int           # 0 or 1
    at: float            # seconds after the schedule's start
    gate_ms: int


@dataclass
class Fault:
    kind: str
    at: float
    proxy: int | None = None
    down_s: float = 0.0  # kill/term: until the restart; partition: how long
    which: str = ""      # terminate: claims | sessions | all


@dataclass
class Plan:
    seed: int
    index: int
    seconds: float
    threads: int
    skew: tuple[int, float] | None      # (proxy, seconds) or None
    jobs: list[Job]
    faults: list[Fault]


def plan(seed: int, index: int, seconds: float) -> Plan:
    """The schedule ``index`` of ``seed``: a function of its arguments only."""
    seconds = float(seconds)  # 8 and 8.0 plan the same schedule
    rng = random.Random(f"resumeguard-faults:{seed}:{index}:{seconds}")
    threads = rng.randint(2, 4)
    skew = None
    if rng.random() < 0.6:
        skew = (rng.randrange(2), round(rng.choice((-1, 1)) * rng.uniform(15, 30), 1))
    faults: list[Fault] = []
    at = rng.uniform(0.2, 1.5)
    while at < seconds:
        kind = rng.choice(FAULT_KINDS)
        f = Fault(kind=kind, at=round(at, 2))
        if kind in ("kill", "term", "partition"):
            f.proxy = rng.randrange(2)
            f.down_s = round(rng.uniform(2.0, 5.0) if kind == "partition" else
                             rng.uniform(0.3, 2.0), 2)
        elif kind == "terminate":
            f.which = rng.choice(("claims", "sessions", "all"))
        faults.append(f)
        at += f.down_s + rng.uniform(1.0, 3.0)
    jobs: list[Job] = []
    for t in range(threads):
        racers = rng.randint(2, 4)
        # a race (racers arriving together), a race just before a fault (the fault
        # lands while the winner runs its gate), or racers spread over the window
        arrival = rng.choice(("race", "race_into_fault", "spread"))
        base = rng.uniform(0, seconds * 0.8)
        if arrival == "race_into_fault" and faults:
            base = max(0.0, rng.choice(faults).at - rng.uniform(0.0, 1.0))
        for r in range(racers):
            at = rng.uniform(0, seconds * 0.8) if arrival == "spread" else base + rng.uniform(0, 0.3)
            jobs.append(Job(racer=f"s{index}t{t}r{r}", thread=t, proxy=rng.randrange(2),
                            at=round(at, 2), gate_ms=rng.choice(GATES_MS)))
    jobs.sort(key=lambda j: j.at)
    return Plan(seed, index, seconds, threads, skew, jobs, faults)
