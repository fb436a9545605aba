"""The pre-registrations are pinned: their text may not change except by appending amendments,
and each must have entered git before any of its study's results.
  results/prereg/why_mx.md     the causal study; results in results/why_mx/
  results/prereg/flash_bf16.md the flash-attention study; its pilot's results in
                               results/flash_pilot/, the study's in results/flash_study/ (the
                               pilot's choice rule is pre-registered too)"""
import hashlib
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "## Amendments"
# (pre-registration, SHA-256 of its text before the "## Amendments" heading as committed before the
# first run, the result folders that must come after it)
PREREGS = [
    ("results/prereg/why_mx.md", "284cbbf39fb0b92f5a619e9894fba2d4df0d0ba2747a292c42f7dc7e59bb1f71",
     ("results/why_mx",)),
    ("results/prereg/flash_bf16.md", "a0a135e7366664647e9258d4e055ac21d39988d3599c3d59f19a8576223c67dd",
     ("results/flash_pilot", "results/flash_study")),
]
IDS = [os.path.basename(p) for p, _, _ in PREREGS]


def _body(path):
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    assert MARK in text, f"{path}: the pre-registration must keep its Amendments section"
    return text[:text.index(MARK)]


@pytest.mark.parametrize("path,pinned,_results", PREREGS, ids=IDS)
def test_prereg_body_is_pinned(path, pinned, _results):
    digest = hashlib.sha256(_body(path).encode("utf-8")).hexdigest()
    assert digest == pinned, (f"{path} changed above its Amendments section: "
                              "pre-registered text is frozen, append an amendment instead")


def _git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("path,_pinned,results", PREREGS, ids=IDS)
def test_prereg_predates_every_result(path, _pinned, results):
    if shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")):
        pytest.skip("no git checkout: the commit order cannot be checked here")
    shallow = _git("rev-parse", "--is-shallow-repository").strip()
    if shallow == "true":
        pytest.skip("shallow clone: the pre-registration's commit may be outside the history")
    added = _git("log", "--diff-filter=A", "--format=%H", "--", path).split()
    assert added, f"{path} is not committed"
    prereg_commit = added[-1]  # the commit that first added it
    commits = _git("log", "--format=%H", "--", *results).split()
    for commit in commits:
        # every commit touching the study's results must have the pre-registration as an ancestor
        r = subprocess.run(["git", "-C", ROOT, "merge-base", "--is-ancestor", prereg_commit, commit])
        assert r.returncode == 0 and commit != prereg_commit, (
            f"commit {commit[:10]} adds results of {path} without the pre-registration before it")
