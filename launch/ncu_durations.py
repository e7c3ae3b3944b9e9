#!/usr/bin/env python3
"""ncu_durations.py: the kernels' durations from an ncu --csv run with the metric
gpu__time_duration.sum (launch/h200-suite.sh profile, launch/ab_call.sh profile).

  ncu_durations.py CSV           per kernel name: count and median in us, largest total first
  ncu_durations.py --order CSV   every launch in launch order: name and us
  ncu_durations.py --metrics     the metrics --stalls reads, for ncu --metrics
  ncu_durations.py --stalls CSV  every launch in launch order from a run with STALL_METRICS (launch/ab_call.sh
                                 stages ncustall, layerstall): name, us, warp instructions, then the cycles a warp
                                 waits per issued instruction on instruction fetch (no_instruction) and the
                                 three largest other reasons
"""
import csv
import statistics
import sys


STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
# the metrics --stalls reads (ncu --metrics takes the regex: form)
STALL_METRICS = "gpu__time_duration.sum,smsp__inst_executed.sum,regex:%s.*%s" % (STALL_PREFIX, STALL_SUFFIX.replace(".", "\\."))


def ncu_rows(path):
    """The CSV's header and data rows (ncu's own lines before them have fewer fields)."""
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        sys.exit(f"no ncu rows in {path} (see the run's stderr)")
    return rows


def stalls(path):
    rows = ncu_rows(path)
    head = rows[0]
    ii, ki, ni, vi = (head.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Value"))
    launches = {}
    for r in rows[1:]:
        try:
            launches.setdefault(int(r[ii]), [r[ki], {}])[1][r[ni]] = float(r[vi].replace(",", ""))
        except ValueError:  # n/a
            pass
    for i in sorted(launches):
        name, m = launches[i]
        st = {k[len(STALL_PREFIX):-len(STALL_SUFFIX)]: v for k, v in m.items() if k.startswith(STALL_PREFIX)}
        top = sorted(((v, k) for k, v in st.items() if k != "no_instruction"), reverse=True)[:3]
        print("%-48s %8.2f %9d  no_instr %5.2f  %s" % (name[:48], m.get("gpu__time_duration.sum", 0) / 1000,
              m.get("smsp__inst_executed.sum", 0), st.get("no_instruction", 0),
              "  ".join("%s %.2f" % (k, v) for v, k in top)))


def main(argv):
    if argv[1:2] == ["--metrics"]:  # the --stalls metrics, for ncu's command line
        print(STALL_METRICS)
        return
    if argv[1:2] == ["--stalls"]:
        stalls(argv[2])
        return
    order = argv[1:2] == ["--order"]
    path = argv[2] if order else argv[1]
    rows = ncu_rows(path)
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
