#!/usr/bin/env python3
"""File what a device call brought back into the committed study folders.

experiments/paper/run_queue.sh (and run_why_mx.sh) leave, per item EXP=K/N, files named with the
tag EXP_KofN in one folder: summary_TAG.csv, blocks_TAG.csv (written last: the item finished),
branchpoints_TAG.csv, instruments_TAG.csv.gz, spectral_TAG.csv.gz, logs_TAG.tgz. This script
copies, for every item whose loss blocks came back, its CSVs into the experiment's folder under
results/ (the loss blocks gzip-compressed, as the studies commit them: results/README.md), and
leaves out the items that did not finish (a summary without blocks: a run cut by the deadline,
or one whose extraction failed) and the logs.

    python3 results/ingest_queue.py SRC [SRC ...] [--dest EXP=DIR ...] [--dry-run]

SRC is a folder of such files or a .tgz holding one (a device call's q.tgz). EXP's folder is the
one of DESTINATIONS below unless --dest names another (relative paths from the repository root).
A file already there with the same content (compressed or not) is left as it is; one with other
content is an error and nothing is written (the same item run twice gives the same bits: a
difference means a different binary or configuration, which needs a person's look). Exit 0 when
every finished item is filed (or was already there), 2 on an error (one line).
"""
import argparse
import collections
import gzip
import os
import re
import shutil
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The experiments of experiments/paper/ that run through the queue, and their committed folders
DESTINATIONS = {
    "why_mx_e1": "results/why_mx/e1",
    "why_mx_e2": "results/why_mx/e2",
    "why_mx_e3": "results/why_mx/e3",
    "why_mx_e4": "results/why_mx/e4",
    "why_mx_e1_paper_emulator": "results/why_mx/paper_emulator",
    "why_mx_confirm_adam": "results/why_mx/confirm_adam",
    "flash_pilot": "results/flash_pilot",
    "flash_study": "results/flash_study",
    "flash_mxfp8_lr": "results/flash_mxfp8_lr_gpu",
    "flash_mxfp8_roles": "results/flash_mxfp8_roles_gpu",
}
TAG = re.compile(r"^blocks_(?P<exp>[A-Za-z0-9_]+?)_(?P<k>\d+)of(?P<n>\d+)\.csv$")
# what comes with an item besides its blocks: (source name pattern, committed name), TAG filled in
COMPANIONS = (("summary_{}.csv", "summary_{}.csv"), ("branchpoints_{}.csv", "branchpoints_{}.csv"),
              ("instruments_{}.csv.gz", "instruments_{}.csv.gz"), ("spectral_{}.csv.gz", "spectral_{}.csv.gz"))


class IngestError(Exception):
    """One line for the user: what is wrong and what to do."""


def _content(path):
    """A file's bytes, decompressed when its name ends in .gz."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def gzip_bytes(data):
    """`data` gzip-compressed without a name or time stamp (gzip -n): the same bytes every time."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def _existing(dest_dir, name):
    """The committed file for `name` (plain, or .gz for a .csv), None when there is none."""
    for cand in (name, name + ".gz") if name.endswith(".csv") else (name,):
        p = os.path.join(dest_dir, cand)
        if os.path.exists(p):
            return p
    return None


def plan(src, dest_of):
    """([(source path, destination path, compress)], [unfinished tags], {exp: items}) of one folder:
    what filing it would write (files already there with the same content are left out)."""
    names = set(os.listdir(src))
    writes, items = [], {}
    for name in sorted(names):
        m = TAG.match(name)
        if not m:
            continue
        exp = m.group("exp")
        tag = f"{exp}_{m.group('k')}of{m.group('n')}"
        if exp not in dest_of:
            raise IngestError(f"{name}: no folder for experiment {exp}: give --dest {exp}=DIR")
        dest_dir = os.path.join(ROOT, dest_of[exp])
        items.setdefault(exp, []).append(tag)
        pairs = [(name, f"blocks_{tag}.csv.gz", True)]
        pairs += [(s.format(tag), d.format(tag), False) for s, d in COMPANIONS if s.format(tag) in names]
        if f"summary_{tag}.csv" not in names:
            raise IngestError(f"{name}: its summary_{tag}.csv is missing from {src}: an incomplete copy?")
        for s_name, d_name, compress in pairs:
            s_path = os.path.join(src, s_name)
            there = _existing(dest_dir, d_name[:-3] if compress else d_name)
            if there is not None:
                if _content(there) != _content(s_path):
                    raise IngestError(f"{os.path.relpath(there, ROOT)} is there with other content than "
                                      f"{s_name} of {src}: not overwritten (a different binary or configuration?)")
                continue
            writes.append((s_path, os.path.join(dest_dir, d_name), compress))
    finished = {t for ts in items.values() for t in ts}
    unfinished = sorted(n[len("summary_"):-len(".csv")] for n in names
                        if n.startswith("summary_") and n.endswith(".csv")
                        and n[len("summary_"):-len(".csv")] not in finished)
    return writes, unfinished, items


def _unpacked(src, tmp):
    """The folder of SRC's files: SRC itself, or for a .tgz the one folder in it that holds them."""
    if os.path.isdir(src):
        return src
    if not (src.endswith(".tgz") or src.endswith(".tar.gz")) or not os.path.isfile(src):
        raise IngestError(f"{src}: neither a folder nor a .tgz file")
    target = tempfile.mkdtemp(dir=tmp)
    with tarfile.open(src, "r:gz") as t:
        for member in t.getmembers():
            if member.name.startswith("/") or ".." in member.name.split("/"):
                raise IngestError(f"{src}: member {member.name} points outside the archive")
        t.extractall(target)
    folders = {os.path.dirname(os.path.join(dirpath, f)) for dirpath, _, files in os.walk(target)
               for f in files if TAG.match(f) or f.startswith("summary_")}
    if len(folders) > 1:
        raise IngestError(f"{src}: item files in several folders ({len(folders)}): unpack it and give the folder")
    return folders.pop() if folders else target


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Folders: " + ", ".join(f"{k} -> {v}" for k, v in DESTINATIONS.items()))
    ap.add_argument("src", nargs="+", help="a folder of a queue's files, or a .tgz holding one")
    ap.add_argument("--dest", action="append", default=[], metavar="EXP=DIR",
                    help="file experiment EXP into DIR (relative to the repository root) instead")
    ap.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    a = ap.parse_args(argv)
    dest_of = dict(DESTINATIONS)
    try:
        for d in a.dest:
            exp, sep, folder = d.partition("=")
            if not sep or not exp or not folder:
                raise IngestError(f"--dest {d}: give EXP=DIR")
            dest_of[exp] = folder
        with tempfile.TemporaryDirectory() as tmp:
            writes, items, unfinished = [], {}, []
            for src in a.src:
                w, u, it = plan(_unpacked(src, tmp), dest_of)
                writes += w
                unfinished += u
                for exp, tags in it.items():
                    items.setdefault(exp, []).extend(tags)
            finished = {t for tags in items.values() for t in tags}
            unfinished = sorted(set(unfinished) - finished)  # cut in one call, finished in a later one
            dup = sorted(d for d, n in collections.Counter(d for _, d, _ in writes).items() if n > 1)
            if dup:
                raise IngestError(f"{os.path.relpath(dup[0], ROOT)}: two sources bring it: give one")
            for s_path, d_path, compress in writes:
                rel = os.path.relpath(d_path, ROOT)
                if a.dry_run:
                    print(f"would write {rel}")
                    continue
                os.makedirs(os.path.dirname(d_path), exist_ok=True)
                tmp_path = d_path + ".tmp"
                if compress:
                    with open(tmp_path, "wb") as f:
                        f.write(gzip_bytes(_content(s_path)))
                else:
                    shutil.copyfile(s_path, tmp_path)
                os.replace(tmp_path, d_path)
    except (IngestError, OSError, tarfile.TarError) as e:
        print(f"ingest_queue: {e}", file=sys.stderr)
        return 2
    for exp, tags in sorted(items.items()):
        print(f"{exp}: {len(tags)} finished item(s) -> {dest_of[exp]}")
    print(f"{'would write' if a.dry_run else 'wrote'} {len(writes)} file(s); "
          f"{'unfinished, left out: ' + ', '.join(unfinished) if unfinished else 'no unfinished item'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
