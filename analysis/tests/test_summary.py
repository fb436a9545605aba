"""summary: one row per trajectory and branch, swept keys as columns, text and CSV."""

import csv
import io

import h5py

from conftest import BRANCHES
from mxlab import schema as S
from mxlab import summary
from mxlab.__main__ import main


def test_rows_and_swept_columns(sweep_dir):
    rows, columns = summary.collect(S.find_runs([sweep_dir]))
    assert len(rows) == 4 * 2  # fp32 + mx per run
    assert "model.width" in columns and "model.depth" in columns
    assert "seed" not in columns and "interventions" not in columns  # the same in every run
    assert columns.index("status") < columns.index(S.SUM_DIVERGENCE) < \
        columns.index(S.SUM_FIRST_NONFINITE) < columns.index(S.SUM_SPIKE_COUNT)
    for key in S.SUMMARY_ATTRS:
        assert key in columns
    diverged = [r for r in rows if r[S.SUM_DIVERGENCE] != S.NO_STEP]
    assert len(diverged) == 1
    assert (diverged[0]["group"], diverged[0]["model.width"], diverged[0]["model.depth"]) == ("mx", 512, 4)
    assert all(r[S.SUM_MAX_BIAS_RATIO] is None for r in rows if r["group"] == "fp32")
    assert all(r["source"] == "file" for r in rows)


def test_branches_get_rows(branches_run):
    rows, columns = summary.collect([branches_run])
    assert [r["group"] for r in rows] == ["fp32", "mx"] + [b["name"] for b in BRANCHES]
    assert [r["at"] for r in rows[2:]] == [b["at"] for b in BRANCHES]
    with h5py.File(branches_run, "r") as f:
        for r in rows[2:]:
            assert r[S.SUM_DIVERGENCE] == f["branches"][r["group"]].attrs[S.SUM_DIVERGENCE]


def test_csv_columns_and_values(sweep_dir, killed_ragged, tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_text("not hdf5")
    rows, columns = summary.collect(S.find_runs([sweep_dir]) + [killed_ragged, str(junk)])
    parsed = list(csv.DictReader(io.StringIO(summary.to_csv(rows, columns))))
    assert list(parsed[0].keys()) == list(columns)
    assert len(parsed) == 4 * 2 + 2 + 1
    mx = next(r for r in parsed if r["group"] == "mx" and r["model.width"] == "512" and r["model.depth"] == "4")
    assert int(mx[S.SUM_DIVERGENCE]) > 0 and float(mx[S.SUM_MAX_BIAS_RATIO]) > 1.5
    fp32 = parsed[0]
    assert fp32[S.SUM_DIVERGENCE] == "-1" and fp32[S.SUM_MAX_BIAS_RATIO] == ""
    killed = [r for r in parsed if r["status"] == S.STATUS_RUNNING]
    assert len(killed) == 2 and all(r["source"] == "computed" for r in killed)
    assert parsed[-1]["status"].startswith("unreadable") and parsed[-1]["group"] == ""


def test_text_table_is_aligned(sweep_dir, capsys):
    assert main(["summary", sweep_dir]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 8
    header = lines[0]
    status_col = header.index("status")
    assert all(line[status_col:].split()[0] in S.STATUSES for line in lines[1:])
    at_col = header.index(" at ") + 1
    assert all(line[at_col] == "-" for line in lines[1:])  # no branches: not applicable


def test_cli_csv_to_file(sweep_dir, tmp_path):
    out = tmp_path / "s.csv"
    assert main(["summary", sweep_dir, "--csv", "-o", str(out)]) == 0
    assert out.read_text().startswith("run_id,group,at,")
