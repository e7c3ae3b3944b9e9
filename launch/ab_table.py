#!/usr/bin/env python3
"""ab_table.py LOG [TREES_LOG]: the hopperab stage's prefill rows (launch/h200-suite.sh) as one table a
segment setting: the median time(us) of each row over the rounds, for each tree, and each tree's
ratio to this tree's (the build without a suffix: main). TREES_LOG (hopper_ab_trees.log beside LOG by
default) names the patch or source each build-abN was made from."""
import os
import re
import statistics
import sys
from collections import defaultdict

HEADER = re.compile(r"^## (\S+): GDP_CHUNK_PATH=([^\s,]+)(?: GDP_CHUNK_SEGMENT=([^\s,]+))?")
# the shape may end in a number ("mixed 16300"): tokens are an integer, the times have a decimal point
ROW = re.compile(r"^prefill\s+(.+?)\s+(\d+)\s+(\d+\.\d+)\s+\d+\.\d+\s+\d+\.\d+\s")


def parse(lines):
    """{(path, segment): {row: {tree: [times]}}} in the order the rows first appear."""
    runs = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    key = tree = None
    for line in lines:
        m = HEADER.match(line)
        if m:
            tree, key = m.group(1), (m.group(2), m.group(3) or "-")
            continue
        m = ROW.match(line)
        if m and key is not None:
            runs[key][m.group(1)][tree].append(float(m.group(3)))
    return runs


def names(trees_log):
    out = {}
    if trees_log and os.path.exists(trees_log):
        for line in open(trees_log):
            m = re.match(r"hopperab: (\S+) is built from (\S+)", line)
            if m:
                out[m.group(1)] = os.path.basename(m.group(2)).replace("build-src-", "")
    return out


def main():
    log = sys.argv[1]
    trees_log = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(log), "hopper_ab_trees.log")
    label = names(trees_log)
    for (path, seg), rows in parse(open(log)).items():
        trees = []
        for per_tree in rows.values():
            for t in per_tree:
                if t not in trees:
                    trees.append(t)
        base = next((t for t in trees if "-ab" not in t), trees[-1])
        cols = [t for t in trees if t != base] + [base]
        print(f"### GDP_CHUNK_PATH={path} GDP_CHUNK_SEGMENT={seg}: median us over the rounds (ratio to {base})")
        print("| row | " + " | ".join(label.get(t, t) for t in cols) + " |")
        print("| --- |" + " --- |" * len(cols))
        for row, per_tree in rows.items():
            cells = []
            ref = statistics.median(per_tree[base]) if per_tree.get(base) else None
            for t in cols:
                if not per_tree.get(t):
                    cells.append("-")
                    continue
                v = statistics.median(per_tree[t])
                cells.append(f"{v:.1f}" + (f" ({v / ref:.3f})" if ref and t != base else ""))
            print(f"| {row} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
