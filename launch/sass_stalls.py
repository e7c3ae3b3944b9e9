#!/usr/bin/env python3
"""sass_stalls.py: warp stall samples of one kernel launch by SASS instruction, from the CSV of
`ncu -i REPORT --page source --csv --print-source sass` (launch/bin_call.sh stage hcard, gzipped or not).

For the Hopper chunk kernel the code splits at its `setmaxnreg` instructions into the two roles:
the aux warpgroup's code follows USETMAXREG.DEALLOC, the state warpgroups' USETMAXREG.TRY_ALLOC (the
role branch puts each after its own). It prints each role's samples, the hottest instructions of
each with their stall reasons, and the samples summed between consecutive barriers (BAR, SYNCS,
DEPBAR, HMMA/HGMMA marks) so that a phase of a role's chunk can be read as one number.

usage: sass_stalls.py CSV[.gz] [--top N]
"""
import csv
import gzip
import re
import sys


def open_any(path):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    rows = list(csv.reader(open_any(path)))
    head = None
    for i, r in enumerate(rows):
        if any(c.strip().startswith("Address") or c.strip() == "# Address" for c in r) and any("Source" in c for c in r):
            head, body = r, rows[i + 1:]
            break
    if head is None:
        sys.exit("sass_stalls: no header with Address and Source in %s" % path)
    col = {c.strip(): j for j, c in enumerate(head)}
    addr_c = next(j for c, j in col.items() if c.endswith("Address"))
    src_c = col["Source"]
    samp_c = next((j for c, j in col.items() if c.startswith("Warp Stall Sampling (All")), None)
    exe_c = next((j for c, j in col.items() if c == "Instructions Executed"), None)
    reason_cols = [(c, j) for c, j in col.items() if c.startswith("stall_") and "Not Issued" not in c]
    if samp_c is None:
        sys.exit("sass_stalls: no 'Warp Stall Sampling (All Samples)' column; columns: %s" % ", ".join(col))

    def num(r, j):
        try:
            return float(r[j].replace(",", "")) if j is not None and r[j].strip() else 0.0
        except ValueError:
            return 0.0

    ins = []
    for r in body:
        if len(r) <= max(addr_c, src_c, samp_c):
            continue
        try:
            a = int(r[addr_c], 16) if r[addr_c].startswith("0x") else int(r[addr_c])
        except ValueError:
            continue
        reasons = {c: num(r, j) for c, j in reason_cols}
        ins.append((a, r[src_c].strip(), num(r, samp_c), num(r, exe_c), reasons))
    ins.sort()
    total = sum(x[2] for x in ins)
    aux0 = next((i for i, x in enumerate(ins) if "USETMAXREG.DEALLOC" in x[1]), None)
    st0 = next((i for i, x in enumerate(ins) if "USETMAXREG.TRY_ALLOC" in x[1]), None)
    # a role runs from its setmaxnreg to the other's (or the end)
    spans = {}
    if aux0 is not None and st0 is not None:
        if aux0 < st0:
            spans = {"aux": (aux0, st0), "state": (st0, len(ins))}
        else:
            spans = {"state": (st0, aux0), "aux": (aux0, len(ins))}
        spans["prologue"] = (0, min(aux0, st0))
    else:
        spans = {"all": (0, len(ins))}
    print("# %s: %d instructions, %.0f stall samples; reason columns: %d" % (path, len(ins), total, len(reason_cols)))
    for role, (lo, hi) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        part = ins[lo:hi]
        s = sum(x[2] for x in part)
        print("\n## %s: instructions %d-%d, %.0f samples (%.1f %%)" % (role, lo, hi, s, 100.0 * s / max(total, 1)))
        if role == "prologue":
            continue
        why = {}
        for x in part:
            for c, v in x[4].items():
                why[c] = why.get(c, 0.0) + v
        print("### by reason (%% of the role's samples; %.0f warp instructions executed)" % sum(x[3] for x in part))
        print("  " + ", ".join("%s %.1f" % (c.replace("stall_", ""), 100.0 * v / max(s, 1))
                               for c, v in sorted(why.items(), key=lambda kv: -kv[1])[:10]))
        # samples between marks: a mark ends a segment
        seg, seg_start = 0.0, lo
        print("### by segment (ending at a barrier, an mbarrier wait, a tensor-core wait or an MMA)")
        for i in range(lo, hi):
            seg += ins[i][2]
            t = ins[i][1]
            if re.search(r"BAR\.SYNC|BAR\.ARV|SYNCS\.PHASECHK|DEPBAR|HMMA|EXIT|WARPSYNC", t) or i == hi - 1:
                if seg >= 0.005 * total:
                    print("  %6.2f %%  [%5d-%5d] ... %s" % (100.0 * seg / max(total, 1), seg_start - lo, i - lo, t[:60]))
                seg, seg_start = 0.0, i + 1
        print("### hottest instructions")
        for a, t, smp, exe, reasons in sorted(part, key=lambda x: -x[2])[:top]:
            rs = sorted(((v, c) for c, v in reasons.items() if v > 0), reverse=True)[:3]
            print("  %6.2f %%  0x%05x  %-58s exec %8.0f  %s" % (100.0 * smp / max(total, 1), a, t[:58], exe,
                                                             ", ".join("%s %.0f" % (c.replace("stall_", ""), v) for v, c in rs)))


if __name__ == "__main__":
    main()
