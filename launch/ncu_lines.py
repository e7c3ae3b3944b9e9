#!/usr/bin/env python3
"""ncu_lines.py: where a kernel's stall samples and instructions go, by source line.

ncu's source page (`ncu -i REP --page source --csv --print-source sass`) gives per-SASS-instruction
counters without source lines; `nvdisasm -g -c` of the same build gives the SASS with its
`//## File ..., line N` marks. This joins them by instruction index (the two listings hold the
same instructions in the same order: checked by opcode) and prints the lines with the most stall
samples and the most executed instructions, and the instructions with the most samples with their
top stall reasons. Used for the decode row kernel's card (kernels/NOTES-ops.md, eleventh session).

usage: ncu_lines.py SOURCE_PAGE.csv DISASM.sass MANGLED_NAME_SUBSTRING [--top N]
"""
import argparse
import collections
import csv
import re
import sys


def disasm_function(path, name_part):
    """[(opcode text, (file, line))] of the first function whose .text section name holds name_part."""
    lines = open(path).read().split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith(".text.") and name_part in l and l.endswith(":")), None)
    if start is None:
        sys.exit(f"no function matching {name_part!r} in {path}")
    out, where = [], None
    for l in lines[start + 1:]:
        if l.startswith("//---------------------"):
            break
        m = re.search(r'//## File "([^"]+)", line (\d+)', l)
        if m:
            where = (m.group(1).split("/")[-1], int(m.group(2)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
        if m:
            out.append((m.group(2).strip(), where))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("sass")
    ap.add_argument("name")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    h, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    i_src, i_exec = h.index("Source"), h.index("Instructions Executed")
    i_samp = h.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, x in enumerate(h) if x.startswith("stall_") and "Not Issued" not in x]
    insts = disasm_function(a.sass, a.name)
    op = lambda t: t.split()[1] if t.startswith("@") else t.split()[0]
    mismatch = sum(1 for (t, _), r in zip(insts, data) if op(t) != op(r[i_src].strip()))
    print(f"{len(data)} instructions in the source page, {len(insts)} in the listing, {mismatch} opcode mismatches")
    if mismatch or len(insts) != len(data):
        print("the listing is not the profiled build: the table below would be wrong")
        return 1
    num = lambda x: int(x) if x.strip() else 0
    by = collections.defaultdict(lambda: [0, 0])
    for (t, where), r in zip(insts, data):
        by[where][0] += num(r[i_exec])
        by[where][1] += num(r[i_samp])
    te = sum(v[0] for v in by.values()) or 1
    ts = sum(v[1] for v in by.values()) or 1
    print(f"\nlines by stall samples (of {ts}): exec %, samples %")
    for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"  {k}: {100 * v[0] / te:5.1f} {100 * v[1] / ts:5.1f}")
    print(f"\nlines by executed warp instructions (of {te})")
    for k, v in sorted(by.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"  {k}: {100 * v[0] / te:5.1f} {100 * v[1] / ts:5.1f}")
    print("\ninstructions by stall samples: index, line, executed, samples, text, top reasons")
    ranked = sorted(range(len(data)), key=lambda n: -num(data[n][i_samp]))[:a.top]
    for n in ranked:
        r = data[n]
        top = sorted(((num(r[i]), h[i][6:]) for i in reasons if num(r[i])), reverse=True)[:3]
        print(f"  {n} {insts[n][1]} {num(r[i_exec])} {num(r[i_samp])} {insts[n][0][:60]} {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
