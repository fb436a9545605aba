"""mxlab for Python: the lab's MX quantizer on NumPy arrays and PyTorch tensors, and the analysis
of mxlab HDF5 run files (lab/train/SCHEMA.md) with the paper's figures.

- `mxlab.quantize`, `mxlab.quantize_stats`: `mxlab quantize` without files (needs the compiled
  extension: `pip install .`; CUDA tensors need it built with CUDA, `mxlab.built_with_cuda()`,
  `mxlab.cuda_available()`); `mxlab.nn`: the fake-quant op `mxlab::fake_quant` and `MXLinear`.
- The analysis modules (schema, metrics, panel, ...; `python3 -m mxlab <command>`) read run files
  through `schema.load_run`; the figure builders return a matplotlib Figure (no pyplot, no
  display) so tests can inspect it before anything is saved. They work from a source checkout
  too (PYTHONPATH=analysis), without the extension.
"""

__version__ = "0.1.0"

from ._quant import built_with_cuda, cuda_available, quantize, quantize_stats  # noqa: E402,F401


def load(path):
    """A results directory (or one run file) as one long pandas DataFrame: `mxlab.tidy.load`
    (`mxlab export DIR --long`'s table, row for row)."""
    from . import tidy
    return tidy.load(path)


def to_xarray(df, metric, dims=None):
    """One metric of `mxlab.load`'s table as an xarray DataArray: `mxlab.tidy.to_xarray`."""
    from . import tidy
    return tidy.to_xarray(df, metric, dims)


class AnalysisError(Exception):
    """Bad input the user can fix (missing file, not an mxlab run, unknown key): the CLI
    prints the message on one line and exits non-zero."""
