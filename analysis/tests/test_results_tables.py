"""results/tabulate.py: the README's tables recomputed from the committed summary CSVs."""

import pytest
from conftest import load_results_script


@pytest.fixture(scope="module")
def tab():
    return load_results_script("tabulate")


def test_every_configured_csv_exists_and_has_paired_trajectories(tab):
    for label, files, where in tab.CONFIGS:
        seeds = tab.pairs(files, where)
        assert seeds, label
        for seed, p in seeds.items():
            assert "fp32" in p and "mx" in p, (label, seed)


def test_lr5e4_counts_match_the_readme(tab):
    c = tab.config_counts(["summary_lr_search.csv"], {"optimizer.lr": "0.0005"})
    assert c["n"] == 5 and c["fp32_div"] == [] and c["fp32_deg"] == []
    assert c["mx_div"] == [(0, 4817), (1, 8753), (4, 9724)]
    assert [s for s, _ in c["mx_deg"]] == [0, 1, 4]


def test_degraded_is_relative_to_the_fp32_minimum(tab):
    assert tab.degraded({"final_loss": "0.0041"}, 0.002)
    assert not tab.degraded({"final_loss": "0.0039"}, 0.002)


def test_tables_render_and_unknown_table_is_an_error(tab, capsys):
    assert tab.main(["configs", "seeds", "branches"]) == 0
    out = capsys.readouterr().out
    assert "| lr 5e-4, floor | 5 | 0/5 | 0/5 | 3/5" in out and "to_fp32_4200" in out
    assert tab.main(["nope"]) == 2
    assert "unknown table 'nope'" in capsys.readouterr().err
