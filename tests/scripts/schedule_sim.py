#!/usr/bin/env python3
"""schedule_sim.py: a step-level model of gdp-run's admission order on the mixed workload of
docs/performance.md (256 requests arriving at once, prompts uniform in 128..2048, 128 new tokens
each, 64 slots, a budget of 2048 tokens per step, prefill slices of 1024), used to estimate what
--schedule shortest changes before measuring it on the GPU (docs/gdp-run.md, "A step").

The model: every step decodes each running request once, then running prefills continue, then
waiting requests are admitted (arrival order, or shortest prompt first) while slots and budget
last; a step takes a + b * prefill tokens + c * decode rows seconds (a rough fit of the H200's
8-layer step, not a measurement). It ignores preemption, drafts and the age bound (the whole run
is shorter than the 2 s default). It prints wall time, TTFT p50 and p99 for both orders; only
their ratio is meant to carry over.
"""
import random
import statistics


def simulate(order, seed=7, slots=64, budget=2048, chunk=1024, n=256, new=128, a=0.6e-3, b=1.45e-6, c=2e-6):
    rnd = random.Random(seed)
    prompts = [rnd.randint(128, 2048) for _ in range(n)]
    reqs = [dict(p=p, fed=0, gen=0, state="Q", ttft=None) for p in prompts]
    queue = sorted(range(n), key=lambda i: prompts[i]) if order == "shortest" else list(range(n))
    t, running = 0.0, []
    while any(r["state"] != "D" for r in reqs):
        dec = [i for i in running if reqs[i]["state"] == "G"]
        left, pre = budget - len(dec), 0
        for i in running:  # running prefills first
            r = reqs[i]
            if r["state"] == "P":
                s = min(chunk, r["p"] - r["fed"])
                if s <= left:
                    r["fed"] += s
                    left -= s
                    pre += s
        while queue and len(running) < slots:  # then admissions
            r = reqs[queue[0]]
            s = min(chunk, r["p"])
            if s > left:
                break
            running.append(queue.pop(0))
            r["state"], r["fed"] = "P", s
            left -= s
            pre += s
        t += a + b * pre + c * len(dec)
        for i in dec:
            reqs[i]["gen"] += 1
            if reqs[i]["gen"] >= new:
                reqs[i]["state"] = "D"
        for i in running:
            r = reqs[i]
            if r["state"] == "P" and r["fed"] >= r["p"]:
                r["state"], r["ttft"], r["gen"] = "G", t, 1
        running = [i for i in running if reqs[i]["state"] != "D"]
    ttft = sorted(r["ttft"] for r in reqs)
    return t, statistics.median(ttft), ttft[int(0.99 * n)]


if __name__ == "__main__":
    base = simulate("fcfs")
    for order in ("fcfs", "shortest"):
        wall, p50, p99 = simulate(order)
        print(f"{order:9s} wall {wall:.3f} s  TTFT p50 {p50 * 1e3:.0f} ms ({p50 / base[1]:.2f}x)  p99 {p99 * 1e3:.0f} ms")
