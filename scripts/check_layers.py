#!/usr/bin/env python3
"""The rooms of the house and who may include whom (README, "Architecture").

Reads every #include "lab/ROOM/..." and "kernels/..." in lab/ and kernels/ and fails, naming
the file, the line and the rule, when a room includes one it may not: an include that runs
back up the layers (e.g. lab/model including lab/config) or a room that does not exist in the
table below (a new folder must be placed in the table first). Run from anywhere:

    python3 scripts/check_layers.py [REPO_ROOT]

Exit 0 when every include follows the table, 1 otherwise (ctest: include_layers).
"""
import os
import re
import sys

# Each room and the rooms it may include (besides itself), bottom to top.
ALLOWED = {
    "core": set(),                                  # errors, exit codes, shared scalar math, RNG
    "mx": {"core"},                                 # MX formats and quantization
    "io": {"core"},                                 # HDF5 and text files, locks
    "stats": {"core"},                              # estimators, tests, events of a loss series
    "model": {"core", "mx"},                        # the model, its configuration, the Backend interface
    "cpu": {"core", "mx", "model"},                 # the CPU reference backend
    "kernels": {"core", "mx", "model"},             # the CUDA backend
    "config": {"core", "mx", "model"},              # the run's YAML: schema, presets, sweeps
    "train": {"core", "mx", "io", "stats", "model", "config"},           # the step loop, metrics
    "runs": {"core", "mx", "io", "stats", "model", "config", "train"},   # driver, run files, sweeps
    "report": {"core", "mx", "io", "stats", "model", "config", "train", "runs"},  # tables, exports
    "backends": {"core", "mx", "model", "cpu", "kernels"},               # make_backend
    "python": {"core", "mx", "kernels"},            # the Python extension mxlab._core (kernels: its CUDA build)
    "cli": {"core", "mx", "io", "stats", "model", "cpu", "kernels", "config", "train", "runs",
            "report", "backends"},                  # the mxlab commands
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:lab/([A-Za-z0-9_]+))|kernels)/[^"]+"')
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".in")


def room_of(rel):
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "lab" and len(parts) > 2:
        return parts[1]
    return None  # lab/README.md and the like


def check(root):
    problems = []
    for top in ("lab", "kernels"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                room = room_of(rel)
                if room is None:
                    continue
                if room not in ALLOWED:
                    problems.append(f"{rel}: room '{room}' is not in scripts/check_layers.py's table: "
                                    "place it there (which rooms it may include) and in the README's Architecture")
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(2) or "kernels"
                        if target == room or target in ALLOWED[room]:
                            continue
                        if target not in ALLOWED:
                            why = f"'{target}' is no room of the table"
                        else:
                            why = f"'{room}' may include only {', '.join(sorted(ALLOWED[room])) or 'itself'}"
                        problems.append(f"{rel}:{lineno}: includes {m.group(1)}/...: {why}")
    return problems


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layering (README, Architecture)")
        return 1
    print("check_layers: every include of lab/ and kernels/ follows the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
