#!/usr/bin/env python3
"""schedule_sim.py: a step-level model of gdp-run's scheduler on the mixed workload of
docs/performance.md (256 requests arriving at once, prompts uniform in 128..2048, 128 new tokens
each, 64 slots, a budget of 2048 tokens per step, prefill slices of 1024), used to estimate what a
scheduling change does before measuring it on the GPU (docs/gdp-run.md, "A step"): the admission
order (--schedule) and the preemption policy (--preempt-wait-ms with the cost of a swap: pinned
host memory, where each swap waits for its copies, or device memory, where none does).

The model follows src/engine_sched.c's compose: preemption when a waiter (queued or swapped) has
waited preempt_wait_ms and no slot is free, of at most a quarter of the slots a step, the longest
running decoders that ran >= 16 steps since their (re)admission; resumes (in preemption order)
into slots free before the step; every running request decodes; running prefills, then new
requests (in the schedule's order) while slots (this step's releases included) and budget last.
A step takes a + b * prefill tokens + c * decode rows + the swaps' cost seconds (a rough fit of the
H200's 8-layer step, not a measurement). It ignores drafts and the age bound (the whole run is
shorter than the 2 s default). Only ratios between rows are meant to carry over.
"""
import random
import statistics


def simulate(order="shortest", wait_s=None, swap_s=0.0, seed=7, slots=64, budget=2048, chunk=1024, n=256,
             new=128, a=0.6e-3, b=1.45e-6, c=2e-6, preempt_after=16):
    """Returns wall time, TTFT p50 and p99 (s) and the swaps (out and in); wait_s None: no preemption."""
    rnd = random.Random(seed)
    prompts = [rnd.randint(128, 2048) for _ in range(n)]
    # state: Q queued, P prefilling, G decoding, S swapped out, D done
    R = [dict(p=p, fed=0, gen=0, st="Q", ttft=None, since=0.0, run=0, order=i) for i, p in enumerate(prompts)]
    seq, t, swaps = n, 0.0, 0
    admit = (lambda i: (R[i]["p"], i)) if order == "shortest" else (lambda i: i)
    while any(r["st"] != "D" for r in R):
        free = slots - sum(1 for r in R if r["st"] in ("P", "G"))
        due = 0 if wait_s is None else sum(1 for r in R if r["st"] in ("Q", "S") and t - r["since"] >= wait_s)
        n_swaps = 0
        if due > 0 and free == 0:  # preemption: victims' slots go to this step's admissions
            for _ in range(min(max(slots // 4, 1), due)):
                cands = [i for i in range(n) if R[i]["st"] == "G" and R[i]["run"] >= preempt_after]
                if not cands:
                    break
                v = max(cands, key=lambda i: R[i]["run"])
                R[v].update(st="S", since=t, order=seq)
                seq, n_swaps = seq + 1, n_swaps + 1
        while free > 0:  # resumes into slots free before this step
            swapped = [i for i in range(n) if R[i]["st"] == "S"]
            if not swapped:
                break
            R[min(swapped, key=lambda i: R[i]["order"])].update(st="G", run=0)
            free, n_swaps = free - 1, n_swaps + 1
        dec = [i for i in range(n) if R[i]["st"] == "G"]
        left, pre = budget - len(dec), 0
        slots_left = slots - sum(1 for r in R if r["st"] in ("P", "G"))
        for i in sorted((i for i in range(n) if R[i]["st"] == "P"), key=lambda i: R[i]["order"]):
            s = min(chunk, R[i]["p"] - R[i]["fed"])
            if s <= left:
                R[i]["fed"] += s
                left, pre = left - s, pre + s
        for i in sorted((i for i in range(n) if R[i]["st"] == "Q"), key=admit):
            s = min(chunk, R[i]["p"])
            if slots_left <= 0 or s > left:
                break
            R[i].update(st="P", fed=s, order=seq)
            seq, left, pre, slots_left = seq + 1, left - s, pre + s, slots_left - 1
        t += a + b * pre + c * len(dec) + swap_s * n_swaps
        swaps += n_swaps
        for i in dec:
            R[i]["gen"] += 1
            R[i]["run"] += 1
            if R[i]["gen"] >= new:
                R[i]["st"] = "D"
        for r in R:
            if r["st"] == "P" and r["fed"] >= r["p"]:
                r.update(st="G", ttft=t, gen=1, run=0)
    ttft = sorted(r["ttft"] for r in R)
    return t, statistics.median(ttft), ttft[int(0.99 * n)], swaps


if __name__ == "__main__":
    base = simulate("fcfs")
    for order in ("fcfs", "shortest"):
        wall, p50, p99, _ = simulate(order)
        print(f"{order:9s} wall {wall:.3f} s  TTFT p50 {p50 * 1e3:.0f} ms ({p50 / base[1]:.2f}x)  p99 {p99 * 1e3:.0f} ms")
    # a swap's cost: pinned host memory about 1.6 ms (the H200's mixed runs: 3.68 - 1.09 s over 1601
    # swaps with the waits and the lost overlap), device memory about 50 us (8.4 MB each way at
    # device-to-device speed, queued: an upper bound)
    ref = simulate("shortest")
    for wait, after in ((0.5, 16), (0.2, 16), (0.1, 16), (0.2, 32)):
        for where, cost in (("host", 1.6e-3), ("device", 5e-5)):
            wall, p50, p99, swaps = simulate("shortest", wait, cost, preempt_after=after)
            print(f"shortest, --preempt-wait-ms {int(wait * 1e3):4d} --preempt-after {after}, {where:6s} swaps: "
                  f"wall {wall:.3f} s ({wall / ref[0]:.2f}x)  TTFT p50 {p50 * 1e3:.0f} ms ({p50 / ref[1]:.2f}x)  "
                  f"p99 {p99 * 1e3:.0f} ms  {swaps} swaps")
