#!/usr/bin/env python3
"""ncu_durations.py: the kernels' durations from an ncu --csv run with the metric
gpu__time_duration.sum (launch/h200-suite.sh profile, launch/ab_call.sh profile).

  ncu_durations.py CSV           per kernel name: count and median in us, largest total first
  ncu_durations.py --order CSV   every launch in launch order: name and us
"""
import csv
import statistics
import sys


def main(argv):
    order = argv[1:2] == ["--order"]
    path = argv[2] if order else argv[1]
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        sys.exit(f"no ncu rows in {path} (see the run's stderr)")
    head = rows[0]
    ki, vi = head.index("Kernel Name"), head.index("Metric Value")
    launches = [(r[ki], float(r[vi].replace(",", "")) / 1000.0) for r in rows[1:]]
    if order:
        for name, us in launches:
            print(f"{name[:64]:64s} {us:8.2f}")
        return
    by = {}
    for name, us in launches:
        by.setdefault(name[:70], []).append(us)
    print(f"{'kernel':70s} {'count':>6s} {'median us':>10s}")
    for name, v in sorted(by.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
        print(f"{name:70s} {len(v):6d} {statistics.median(v):10.1f}")


if __name__ == "__main__":
    main(sys.argv)
