# Summarise an Nsight Compute CSV (gpu__time_duration.sum per kernel) by kernel name:
# total microseconds and launches per name, largest first; with a second argument, every
# launch in order. Usage: python3 bench/ncu_summary.py ncu.csv [seq]
# read_launches() is what bench/ncu_arms.py reads the same CSVs with.
import collections
import csv
import re
import sys


def kernel_key(name):
    """A kernel's name without its return type, its argument list and mxlab's namespaces (template
    arguments kept; at most 100 characters)."""
    k = re.sub(r'mxlab::(cuda::)?((<unnamed>|\(anonymous namespace\))::)?', '', name)
    k = re.sub(r'^void ', '', k)
    depth = 0
    for i, c in enumerate(k):
        depth += (c == '<') - (c == '>')
        if c == '(' and depth == 0:
            k = k[:i]
            break
    return k[:100]


def read_launches(path):
    """[(microseconds, kernel key, grid, block)] of an ncu --csv log of gpu__time_duration.sum, in
    launch order (ncu's own lines before the table are skipped)."""
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    hdr, out = None, []
    for r in rows:
        if r and r[0] == 'ID':
            hdr = r
            continue
        if hdr and len(r) == len(hdr):
            d = dict(zip(hdr, r))
            v, unit = float(d['Metric Value'].replace(',', '')), d['Metric Unit']
            v = v / 1000 if unit in ('ns', 'nsecond') else (v * 1000 if unit in ('ms', 'msecond') else v)
            out.append((v, kernel_key(d['Kernel Name']), d.get('Grid Size', ''), d.get('Block Size', '')))
    return out


def main(argv):
    seq = read_launches(argv[1])
    tot = collections.OrderedDict()
    for v, k, _, _ in seq:
        tot.setdefault(k, [0, 0])
        tot[k][0] += v
        tot[k][1] += 1
    s = 0
    for k, (v, c) in sorted(tot.items(), key=lambda x: -x[1][0]):
        print(f"{v:9.1f} us  {c:4d}  {k}")
        s += v
    print("total", s, "kernels", len(seq))
    if len(argv) > 2:
        for v, k, g, b in seq:
            print(f"{v:8.1f} {g:>14} {b:>12} {k}")


if __name__ == '__main__':
    main(sys.argv)
