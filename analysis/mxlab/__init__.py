"""mxlab analysis: read mxlab HDF5 run files (lab/train/SCHEMA.md) and draw the paper's figures.

Every module reads run files through `schema.load_run`; the figure builders return a
matplotlib Figure (no pyplot, no display) so tests can inspect it before anything is saved.
"""

__version__ = "0.1.0"


class AnalysisError(Exception):
    """Bad input the user can fix (missing file, not an mxlab run, unknown key): the CLI
    prints the message on one line and exits non-zero."""
