"""The names the package reads are exactly those of lab/train/SCHEMA.md: parse the markdown
tables so that a column renamed on one side fails here instead of in a plot."""

import os
import re

import pytest

from mxlab import schema as S

SCHEMA_MD = os.path.join(os.path.dirname(__file__), "..", "..", "lab", "train", "SCHEMA.md")


def _cells(line):
    """Cells of a table row; `\\|` inside a cell (e.g. `running` \\| `complete`) is text."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _read():
    with open(SCHEMA_MD, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def tables():
    """{heading: [table, ...]}, each table its body rows (header and separator dropped)."""
    if not os.path.exists(SCHEMA_MD):
        pytest.skip(f"{SCHEMA_MD} not found (analysis/ outside the mxlab repo)")
    out, heading, table = {}, None, None
    for line in _read().splitlines():
        if line.startswith("#"):
            heading, table = line.lstrip("#").strip(), None
        elif line.startswith("|") and heading:
            if table is None:
                table = []
                out.setdefault(heading, []).append(table)
            table.append(_cells(line))
        else:
            table = None
    return {h: [t[2:] for t in ts] for h, ts in out.items()}


@pytest.fixture(scope="module")
def text():
    if not os.path.exists(SCHEMA_MD):
        pytest.skip(f"{SCHEMA_MD} not found")
    return _read()


def _names(rows):
    """First column: `a, b, c` lists several names; `{tensor}_x` expands over the
    `tensor ∈ ...` list given in that row's notes."""
    names = set()
    for row in rows:
        first, notes = row[0].replace("`", ""), row[-1]
        for name in (n.strip() for n in first.split(",")):
            if "{tensor}" in name:
                m = re.search(r"tensor \u2208 ([a-z_, ]+)", notes)
                assert m, f"no tensor list in the notes of row {row}"
                tensors = [t.strip() for t in m.group(1).split(",") if t.strip()]
                names.update(name.replace("{tensor}", t) for t in tensors)
            else:
                names.add(name)
    return names


def _tables(tables, prefix, count, at_least=False):
    matches = [k for k in tables if k.startswith(prefix)]
    assert len(matches) == 1, f"SCHEMA.md section '{prefix}' not found: {list(tables)}"
    found = len(tables[matches[0]])
    assert found >= count if at_least else found == count, \
        f"expected {'at least ' if at_least else ''}{count} table(s) under '{prefix}'"
    return tables[matches[0]]


def _dataset_names(tables):
    """Every name in the first column of a table under a heading that says "datasets"."""
    return set().union(*(_names(t) for h, ts in tables.items() if "datasets" in h.lower() for t in ts))


def test_root_attributes(tables):
    assert _names(_tables(tables, "Root attributes", 1)[0]) == set(S.ROOT_ATTRS)


def test_status_values(tables):
    row = next(r for r in _tables(tables, "Root attributes", 1)[0] if r[0] == "status")
    assert re.findall(r"`([a-z]+)`", row[2]) == list(S.STATUSES)


def test_row_datasets(tables):
    every_group, mx_only = _tables(tables, "Datasets", 2, at_least=True)[:2]
    assert set(S.SCALAR_SERIES + S.GAMMA_STATS + S.LASTBIN_DATASETS + (S.DS_LOSS_ALL,)) <= \
        _names(every_group)
    assert set(S.MX_DATASETS) <= _names(mx_only)
    unknown = _dataset_names(tables) - set(S.ALL_DATASETS)
    assert not unknown, f"SCHEMA.md documents datasets analysis/ does not know: {sorted(unknown)} " \
        "(add them to mxlab/schema.py)"


# Names this package reads that came after schema 1 (arms, clamp debt, curvature, the squared
# cross ratio). A SCHEMA.md that documents none of a family predates it: skip; one that
# documents some of a family must document all of them under these names.
NEW_FAMILIES = {
    "arms (attributes)": (S.ATTR_ARMS, S.ATTR_ARM, S.ATTR_FROM),
    "clamp debt": S.DEBT_DATASETS + S.WEIGHT_DEBT_DATASETS,
    "shadow series": S.MX_SERIES_V2,
    "curvature": S.CURVATURE_DATASETS,
}


@pytest.mark.parametrize("family", sorted(NEW_FAMILIES))
def test_new_names_are_documented_together(tables, text, family):
    names = NEW_FAMILIES[family]
    in_tables = _dataset_names(tables)  # expands `{tensor}_gap_mean` rows
    documented = [n for n in names if n in in_tables or
                  re.search(rf"(?<![a-z_]){re.escape(n)}(?![a-z_])", text)]
    if family == "arms (attributes)":  # `from`/`arm`/`arms` are common words: want backticks
        documented = [n for n in names if f"`{n}`" in text]
    if not documented:
        pytest.skip(f"SCHEMA.md predates the {family} names")
    missing = sorted(set(names) - set(documented))
    assert not missing, f"SCHEMA.md documents {family} without {missing}: rename in schema.py?"


def test_attention_datasets(tables):
    (rows,) = _tables(tables, "Attention networks only", 1)
    assert _names(rows) == set(S.ATTN_DATASETS)


def test_summary_attributes(tables):
    assert _names(_tables(tables, "Summary attributes", 1)[0]) == set(S.SUMMARY_ATTRS)


def test_group_names_and_attributes_in_prose(text):
    groups = text[text.index("## Groups"):text.index("### Datasets")]
    for path in (f"{S.GROUP_TRAJECTORIES}/{S.TRAJ_FP32}", f"{S.GROUP_TRAJECTORIES}/{S.TRAJ_MX}",
                 f"{S.GROUP_BRANCHES}/<name>"):
        assert f"`{path}`" in groups
    for attr in S.GROUP_ATTRS + S.BRANCH_ATTRS:
        assert f"`{attr}`" in groups
    assert f"attribute `{S.DATASET_ATTR_QUANTIZED}`" in text
    assert f"(attribute `{S.DATASET_ATTR_NAMES}`)" in text
    assert f"| {S.SCHEMA_VERSION} |" in text
    assert "MX trajectory and branches only" in text  # what the second Datasets table is
