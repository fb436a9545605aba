#!/usr/bin/env python3
"""Digest every dataset and attribute of mxlab run files, one line each, to check that a change
of code leaves a run's numbers bit for bit as they were:

    python3 bench/dataset_digest.py runs/a/*.h5 > before.txt
    ... (new code) ...
    python3 bench/dataset_digest.py runs/b/*.h5 > after.txt
    diff before.txt after.txt            # empty: byte-identical datasets and attributes

A line is `FILE:PATH dataset DTYPE SHAPE SHA256-OF-THE-RAW-BYTES` or
`FILE:PATH@ATTR attr SHA256-OF-THE-VALUE`. FILE is the run file's name (the run id, which the
configuration determines). The attributes that record when or by which build a run was made
(start_time, end_time, git_commit, mxlab_version, build_type) are left out: they differ
between two builds of the same numbers. Exit 2 when a file cannot be read.
"""
import hashlib
import os
import sys

import numpy as np

try:
    import h5py
except ImportError:  # pragma: no cover - environment problem, said plainly
    sys.exit("dataset_digest: needs h5py (apt-get install python3-h5py)")

WHEN_AND_WHO = {"start_time", "end_time", "git_commit", "mxlab_version", "build_type"}


def _value_digest(value) -> str:
    if isinstance(value, bytes):
        raw = value
    elif isinstance(value, str):
        raw = value.encode()
    else:
        arr = np.asarray(value)
        if arr.dtype.kind == "O":
            raw = repr(arr.tolist()).encode()
        else:
            raw = arr.dtype.str.encode() + repr(arr.shape).encode() + arr.tobytes()
    return hashlib.sha256(raw).hexdigest()


def digest_file(path: str) -> list:
    name = os.path.basename(path)
    lines = []

    def attrs(obj, where):
        for key in sorted(obj.attrs.keys()):
            if where == "/" and key in WHEN_AND_WHO:
                continue
            lines.append(f"{name}:{where}@{key} attr {_value_digest(obj.attrs[key])}")

    with h5py.File(path, "r") as f:
        attrs(f, "/")

        def visit(sub, obj):
            where = "/" + sub
            if isinstance(obj, h5py.Dataset):
                data = obj[()]
                arr = np.asarray(data)
                lines.append(f"{name}:{where} dataset {arr.dtype.str} {'x'.join(map(str, arr.shape)) or 'scalar'} "
                             f"{_value_digest(data)}")
            attrs(obj, where)

        f.visititems(visit)
    return lines


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    out = []
    for path in argv:
        try:
            out.extend(digest_file(path))
        except OSError as err:
            print(f"dataset_digest: cannot read {path}: {err}", file=sys.stderr)
            return 2
    print("\n".join(sorted(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
