"""What a fault schedule (``fault_schedule.py``) recorded, and the checks of the
Resume Contract over it: no double fire, no run on a session a fault had ended, no
fire after the kept answer, no lost output, no fork, no stranded thread, no lost
checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fault_plan import Plan

# a fault of these kinds cuts the path of a racer it overlaps (by proxy, or all)
CUTS_ITS_PROXY = ("kill", "partition")
CUTS_EVERY_PATH = ("pg_restart", "terminate")


@dataclass
class History:
    """One schedule's run: the racers' results, the faults as injected (times in
    seconds after the start), each thread's fires, final state and parked checkpoint."""

    plan: Plan
    thread_ids: list[str]
    results: dict[str, dict] = field(default_factory=dict)        # racer -> result
    faults: list[dict] = field(default_factory=list)               # as executed
    fires: dict[str, list[str]] = field(default_factory=dict)      # thread -> racers
    fire_at: dict[str, list[float]] = field(default_factory=dict)  # when each ran (s)
    t0: float = 0.0                                                # the start (epoch)
    final: dict[str, dict] = field(default_factory=dict)           # thread -> state
    parked: dict[str, str] = field(default_factory=dict)           # thread -> checkpoint id
    children: dict[str, int] = field(default_factory=dict)         # of the parked checkpoint
    counts_fell: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)       # seconds each took


# a fault counts as before a fire this much after it (two readings of one host clock)
CLOCK_SLACK_S = 0.05
# a read granted just before a fault starts its gated node within this (a loaded host)
NODE_START_S = 1.0


def ended_before_its_fire(h: History, racer: str, at: float) -> dict | None:
    """The fault that ended ``racer``'s server session (PostgreSQL restarted, its
    backend terminated) after it connected and well before its gated node ran at
    ``at``: a session that can commit nothing was served the parked head."""
    r = h.results.get(racer)
    if r is None or r.get("ok"):
        return None
    for f in h.faults:
        if f["note"].startswith("NOT INJECTED") or f["kind"] not in CUTS_EVERY_PATH:
            continue
        if f["kind"] == "terminate" and f["which"] == "claims":
            continue
        if r["t_start"] < f["start"] and f["start"] + NODE_START_S < at:
            return f
    return None


def cut_by_fault(h: History, racer: str, before: float | None = None) -> dict | None:
    """The fault that cut the path of ``racer``'s run (begun by ``before``, seconds
    after the start, when given), if its run did not complete and one did: its proxy
    killed or partitioned, PostgreSQL restarted, the relayed sessions' backends ended."""
    r = h.results.get(racer)
    if r is None or r.get("ok"):
        return None
    for f in h.faults:
        if f["note"].startswith(("NOT INJECTED", "skipped")):
            continue
        if f["kind"] == "terminate" and f["which"] == "claims":
            continue  # the claims connections are replaced, the liveness lock retaken
        if before is not None and f["start"] > before + CLOCK_SLACK_S:
            continue
        hits = f["kind"] in CUTS_EVERY_PATH or (f["kind"] in CUTS_ITS_PROXY
                                                 and f["proxy"] == r.get("proxy"))
        if hits and f["start"] - 0.5 <= r["t_end"] and r["t_start"] <= f["end"] + 0.5:
            return f
    return None


def check(h: History) -> list[str]:
    """The violations of the Resume Contract in a recorded history."""
    out = [f"lost checkpoint: {x}" for x in h.counts_fell]
    for thread in h.thread_ids:
        fires, final = h.fires.get(thread, []), h.final.get(thread, {})
        fire_at = h.fire_at.get(thread, [])
        if final.get("next"):
            last = h.results.get(f"s{h.plan.index}t{h.thread_ids.index(thread)}final", {})
            out.append(f"stranded: {thread} still at {final['next']} after the final resume "
                       f"({last.get('error')})")
        committed = final.get("approved")
        if not final.get("next") and committed not in fires:
            out.append(f"lost output: {thread} finished with answer {committed!r}, fires {fires}")
        elif not final.get("next") and fires[-1] != committed:
            out.append(f"fired after the answer: {thread}'s gate ran for "
                       f"{fires[fires.index(committed) + 1:]} after {committed}'s run, whose "
                       f"answer the thread kept")
        # a gate runs again only once the previous run's holder was cut by a fault
        for prev, nxt, at in zip(fires, fires[1:], fire_at[1:]):
            if cut_by_fault(h, prev, before=at) is None:
                why = ("was cut by a fault only later" if cut_by_fault(h, prev) else
                       "completed" if h.results.get(prev, {}).get("ok") else
                       "was not cut by a fault")
                out.append(f"double fire: {thread}'s gate ran for {nxt} at {at:.2f} s after "
                           f"{prev}'s run, which {why} (fires {list(zip(fires, fire_at))})")
        for racer, at in zip(fires, fire_at):
            f = ended_before_its_fire(h, racer, at)
            if f is not None:
                out.append(f"served after its session ended: {thread}'s gate ran for {racer} at "
                           f"{at:.2f} s, though {describe_fault(f)} had ended its server session")
        if h.children.get(thread, 0) > 1:
            out.append(f"forked: {thread}'s parked checkpoint has {h.children[thread]} children")
    return out


def describe_fault(f: dict) -> str:
    what = {"kill": f"SIGKILL proxy {f.get('proxy')}, down {f.get('down_s')} s",
            "term": f"SIGTERM proxy {f.get('proxy')}, down {f.get('down_s')} s",
            "pg_restart": "pg_ctl restart -m fast",
            "terminate": f"pg_terminate_backend ({f.get('which')})",
            "partition": f"partition proxy {f.get('proxy')} from PostgreSQL {f.get('down_s')} s"}
    times = f"t={f['at']:.2f}s"
    if "start" in f:
        times += f" (ran {f['start']:.2f}-{f['end']:.2f}s)"
    return f"{times} {what[f['kind']]}" + (f": {f['note']}" if f.get("note") else "")
