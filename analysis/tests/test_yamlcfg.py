"""The block-YAML subset reader for config_yaml."""

import math

import pytest

import make_fixtures as F
from mxlab import AnalysisError, yamlcfg


def test_dump_config_text_parses_with_types():
    text = F.config_yaml({"optimizer.lr": 6e-4, "model.width": 384},
                         [{"name": "fp32_early", "at": 4500, "apply": "to_fp32"}])
    flat = yamlcfg.parse_flat(text)
    assert flat["optimizer.lr"] == pytest.approx(6e-4) and isinstance(flat["optimizer.lr"], float)
    assert flat["model.width"] == 384 and isinstance(flat["model.width"], int)
    assert flat["model.layernorm"] is True
    assert flat["precision.weight_bwd"] == "same"
    assert flat["interventions.0.name"] == "fp32_early" and flat["interventions.0.at"] == 4500


def test_scalars_comments_flow_and_sequences():
    text = """# resolved config
steps: 6000   # trailing comment
name: "a # not a comment"
lr: 1e-5
eps: 1.0e-08
big: .inf
missing: ~
model:
  depth: 4
  note: 'x: y'
list:
- 1
- two
interventions:
  - name: custom
    at: 10
    set: {activation: bf16, backward: false}
  - {name: other, at: 20}
empty: []
"""
    tree = yamlcfg.parse(text)
    assert tree["steps"] == 6000
    assert tree["name"] == "a # not a comment"
    assert tree["lr"] == pytest.approx(1e-5) and tree["eps"] == pytest.approx(1e-8)
    assert math.isinf(tree["big"]) and tree["missing"] is None
    assert tree["model"] == {"depth": 4, "note": "x: y"}
    assert tree["list"] == [1, "two"]
    assert tree["interventions"][0] == {"name": "custom", "at": 10,
                                        "set": {"activation": "bf16", "backward": False}}
    assert tree["interventions"][1] == {"name": "other", "at": 20}
    assert tree["empty"] == []
    flat = yamlcfg.flatten(tree)
    assert flat["interventions.0.set.backward"] is False and flat["model.depth"] == 4


def test_bad_indentation_is_an_error():
    with pytest.raises(AnalysisError, match="line 3"):
        yamlcfg.parse("a:\n    b: 1\n  c: 2\n")
