"""The policy line of figure titles (common.precision_text) names every backward role that does
not follow its forward one, the wgrad GEMMs' gradient (precision.grad_wgrad) included, from the
configuration text `mxlab dump-config` prints."""

import os
import subprocess
import types

import pytest

from mxlab import common, yamlcfg


def run_of(flat):
    return types.SimpleNamespace(config=flat)


def test_backward_roles_are_named_when_they_do_not_follow():
    base = {"precision.weight": "mxfp8_e4m3", "precision.activation": "mxfp8_e4m3",
            "precision.grad": "mxfp8_e4m3", "precision.weight_bwd": "same",
            "precision.activation_bwd": "same", "precision.scale_rule": "floor"}
    assert common.precision_text(run_of(base)) == "mxfp8_e4m3 (W/A/G), scale rule floor"
    # Files written before the role existed have no grad_wgrad key: nothing changes.
    assert "Gwgrad" not in common.precision_text(run_of({**base, "precision.grad_wgrad": "same"}))
    split = {**base, "precision.grad_wgrad": "bf16", "precision.activation_bwd": "bf16"}
    assert common.precision_text(run_of(split)) == "mxfp8_e4m3 (W/A/G) [Abwd bf16, Gwgrad bf16], scale rule floor"


def test_from_the_binarys_config_text(tmp_path):
    binary = os.environ.get("MXLAB_BINARY")
    if not binary:
        pytest.skip("MXLAB_BINARY (built mxlab) not set: scripts/test.sh sets it")
    exp = tmp_path / "g.yaml"
    exp.write_text("precision: {gemm: {wgrad: bf16}}\n")
    text = subprocess.run([binary, "dump-config", str(exp)], check=True, capture_output=True, text=True).stdout
    flat = yamlcfg.parse_flat(text)
    assert flat["precision.grad_wgrad"] == "bf16" and flat["precision.activation_bwd"] == "bf16"
    assert "gemm" not in text
    assert common.precision_text(run_of(flat)).startswith("mxfp8_e4m3 (W/A/G) [Abwd bf16, Gwgrad bf16]")
