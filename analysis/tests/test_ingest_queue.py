"""results/ingest_queue.py: a device call's queue output filed into the study folders: finished
items only (their blocks gzip-compressed, the companions as they came), unfinished ones named and
left out, files already there with the same content left alone, a conflicting one refused with
nothing written; from a folder or a .tgz; and on this repository's own committed studies, every
file of this session's kind already in place."""
import gzip
import os
import tarfile

import pytest

from conftest import ROOT, load_results_script


@pytest.fixture()
def mod(tmp_path, monkeypatch):
    m = load_results_script("ingest_queue")
    monkeypatch.setattr(m, "ROOT", str(tmp_path / "repo"))
    return m


def _item(src, tag, blocks=True, instruments=False):
    src.mkdir(exist_ok=True)
    (src / f"summary_{tag}.csv").write_text(f"run_id,group\nr_{tag},fp32\n")
    if blocks:
        (src / f"blocks_{tag}.csv").write_text(f"run_id,seed,trajectory\nr_{tag},1,fp32\n")
    if instruments:
        with gzip.open(src / f"instruments_{tag}.csv.gz", "wt") as f:
            f.write("run_id,step\nx,0\n")
    (src / f"logs_{tag}.tgz").write_bytes(b"not filed")


def test_finished_items_are_filed_and_unfinished_ones_left_out(mod, tmp_path, capsys):
    src = tmp_path / "q"
    _item(src, "why_mx_e3_0of120")
    _item(src, "flash_study_5of40", instruments=True)
    _item(src, "why_mx_e3_1of120", blocks=False)  # cut by the deadline
    assert mod.main([str(src)]) == 0
    out = capsys.readouterr().out
    assert "why_mx_e3: 1 finished item(s) -> results/why_mx/e3" in out
    assert "unfinished, left out: why_mx_e3_1of120" in out and "wrote 5 file(s)" in out
    e3 = tmp_path / "repo" / "results" / "why_mx" / "e3"
    assert sorted(os.listdir(e3)) == ["blocks_why_mx_e3_0of120.csv.gz", "summary_why_mx_e3_0of120.csv"]
    blob = (e3 / "blocks_why_mx_e3_0of120.csv.gz").read_bytes()
    assert gzip.decompress(blob) == (src / "blocks_why_mx_e3_0of120.csv").read_bytes()
    assert blob == mod.gzip_bytes((src / "blocks_why_mx_e3_0of120.csv").read_bytes())  # no name, no time
    fs = tmp_path / "repo" / "results" / "flash_study"
    assert sorted(os.listdir(fs)) == ["blocks_flash_study_5of40.csv.gz", "instruments_flash_study_5of40.csv.gz",
                                      "summary_flash_study_5of40.csv"]
    # the same source again: everything is there with the same content, nothing written
    assert mod.main([str(src)]) == 0
    assert "wrote 0 file(s)" in capsys.readouterr().out


def test_a_conflicting_file_is_refused_and_nothing_is_written(mod, tmp_path, capsys):
    src = tmp_path / "q"
    _item(src, "why_mx_e3_0of120")
    _item(src, "why_mx_e3_2of120")
    e3 = tmp_path / "repo" / "results" / "why_mx" / "e3"
    e3.mkdir(parents=True)
    # a plain committed copy of item 0's blocks with other content (a different binary's bits)
    (e3 / "blocks_why_mx_e3_0of120.csv").write_text("run_id,seed,trajectory\nr_other,1,fp32\n")
    assert mod.main([str(src)]) == 2
    err = capsys.readouterr().err
    assert "results/why_mx/e3/blocks_why_mx_e3_0of120.csv is there with other content" in err, err
    assert os.listdir(e3) == ["blocks_why_mx_e3_0of120.csv"]  # item 2 was not written either


def test_a_tgz_an_unknown_experiment_and_dest(mod, tmp_path, capsys):
    src = tmp_path / "w" / "q"
    src.parent.mkdir()
    _item(src, "my_sweep_0of2")
    tgz = tmp_path / "q.tgz"
    with tarfile.open(tgz, "w:gz") as t:
        t.add(src, arcname="q")
    assert mod.main([str(tgz)]) == 2
    assert "no folder for experiment my_sweep: give --dest my_sweep=DIR" in capsys.readouterr().err
    assert mod.main([str(tgz), "--dest", "my_sweep=results/mine", "--dry-run"]) == 0
    assert "would write results/mine/blocks_my_sweep_0of2.csv.gz" in capsys.readouterr().out
    assert not (tmp_path / "repo" / "results" / "mine").exists()
    assert mod.main([str(tgz), "--dest", "my_sweep=results/mine"]) == 0
    assert sorted(os.listdir(tmp_path / "repo" / "results" / "mine")) == ["blocks_my_sweep_0of2.csv.gz",
                                                                           "summary_my_sweep_0of2.csv"]
    assert mod.main([str(tmp_path / "nothing.txt")]) == 2
    assert "neither a folder nor a .tgz" in capsys.readouterr().err


def test_blocks_without_their_summary_are_refused(mod, tmp_path, capsys):
    src = tmp_path / "q"
    _item(src, "why_mx_e3_0of120")
    os.remove(src / "summary_why_mx_e3_0of120.csv")
    assert mod.main([str(src)]) == 2
    assert "summary_why_mx_e3_0of120.csv is missing" in capsys.readouterr().err


def test_every_committed_study_folder_is_a_destination():
    # each folder the script files into that exists in the repository holds a study's blocks
    m = load_results_script("ingest_queue")
    assert m.ROOT == ROOT
    for exp, folder in m.DESTINATIONS.items():
        path = os.path.join(ROOT, folder)
        if os.path.isdir(path):
            assert any(f.startswith("blocks_") for f in os.listdir(path)), (exp, folder)
        assert os.path.isfile(os.path.join(ROOT, "experiments", "paper", exp + ".yaml")), exp
