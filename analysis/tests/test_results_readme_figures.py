"""Every figure results/README.md names exists in results/figures/.

A figure is named as an image (`![...](figures/x.png)`), as a path in the text (`figures/x.png`,
`results/figures/x.png`), or as the `--figure PATH` of a command. A command with `--split KEY`
writes one figure per value, `<stem>_KEY=<value>.png`, and never PATH itself: there PATH must not
exist on its own and at least two such files must (and the README must name each of them)."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")
FIGURE = re.compile(r"(?:results/)?figures/[\w.=+-]+\.png")


def resolve(ref):
    return os.path.join(ROOT, ref) if ref.startswith("results/") else os.path.join(RESULTS, ref)


def readme():
    with open(os.path.join(RESULTS, "README.md"), encoding="utf-8") as f:
        return f.read()


def split_stems(text):
    """{figure path: split key} for every `--figure PATH` of a code span that also has `--split KEY`."""
    stems = {}
    for span in re.findall(r"`([^`]*)`", text, flags=re.S):
        words = span.split()
        if "--figure" in words and "--split" in words:
            stems[words[words.index("--figure") + 1]] = words[words.index("--split") + 1]
    return stems


def test_every_figure_the_results_readme_names_exists():
    text = readme()
    stems = split_stems(text)
    refs = sorted(set(FIGURE.findall(text)))
    assert len(refs) >= 20, refs  # the README's figures are found at all
    missing = []
    for ref in refs:
        if ref in stems:
            continue
        if not os.path.isfile(resolve(ref)):
            missing.append(ref)
    assert not missing, f"results/README.md names figures that are not committed: {missing}"


def test_split_figures_exist_per_value_and_are_named():
    text = readme()
    stems = split_stems(text)
    assert stems, "the --split commands of section 10 are found"
    for stem, key in stems.items():
        base, ext = os.path.splitext(resolve(stem))
        assert not os.path.exists(resolve(stem)), f"{stem}: with --split no file has the stem's own name"
        per_value = sorted(glob.glob(glob.escape(f"{base}_{key}=") + "*" + ext))
        assert len(per_value) >= 2, f"{stem} --split {key}: no per-value figures {base}_{key}=*{ext}"
        for path in per_value:
            assert "figures/" + os.path.basename(path) in text, f"the README does not name {path}"
