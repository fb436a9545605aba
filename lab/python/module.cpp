// mxlab._core: the lab's MX quantizer (lab/mx/quantize.h) for Python, through nanobind.
// Arrays come in as DLPack/buffer views (NumPy arrays and PyTorch tensors alike, no copy): the
// caller (analysis/mxlab/_quant.py) checks dtype, device and layout first so that its errors
// name the fix, allocates the output of the same kind (on the same device) and passes both here.
// Built with CUDA (MXLAB_PYTHON_CUDA, lab/python/cuda_quant.h), CUDA tensors go through the
// lab's CUDA quantize kernels on their own memory and stream, and host arrays can be sent
// through them too (copied); `built_with_cuda` tells Python which build this is.
// The options are parsed with the same tables as `mxlab quantize` (lab/mx/format.h) and
// refused under the same conditions as the CLI's (lab/cli/cmd_quantize.cpp, make_spec),
// worded with the Python argument names.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lab/core/error.h"
#include "lab/mx/format.h"
#include "lab/mx/quantize.h"
#ifdef MXLAB_PYTHON_CUDA
#include "lab/python/cuda_quant.h"
#endif

namespace nb = nanobind;

namespace {

using mxlab::Error;
using mxlab::msg;

using Array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<float, nb::c_contig, nb::device::cpu>;

std::string quantize_format_list() {
  std::string list;
  for (const std::string& n : mxlab::numfmt_names())
    if (n != "fp32") list += (list.empty() ? "" : ", ") + n;
  return list;
}

mxlab::QuantSpec make_spec(const std::string& format, int block_size, const std::string& scale_rule,
                           const std::string& rounding, const std::string& bump, bool bump_given, uint64_t seed) {
  mxlab::QuantSpec s;
  mxlab::NumFmt f;
  try {
    f = mxlab::parse_numfmt(format);
  } catch (const Error&) {
    throw Error(msg("unknown format ", mxlab::quoted_excerpt(format), " (valid: ", quantize_format_list(), ")"));
  }
  if (f == mxlab::NumFmt::fp32)
    throw Error(msg("format 'fp32' would leave the data unchanged; choose one of ", quantize_format_list()));
  s.fmt = f;
  s.rule = mxlab::parse_scale_rule(scale_rule);
  s.rounding = mxlab::parse_rounding(rounding);
  s.bump = mxlab::parse_bump(bump);
  s.block = block_size;
  s.seed = seed;
  if (mxlab::is_mx(f)) {
    if (block_size <= 0) throw Error(msg("block_size must be positive (got ", block_size, ")"));
    if (bump_given && s.rule != mxlab::ScaleRule::floor_bump)
      throw Error(msg("bump applies only to scale_rule='floor_bump' (got scale_rule='", scale_rule, "')"));
  } else if (s.rounding != mxlab::Rounding::nearest_even && s.rounding != mxlab::Rounding::nearest_away) {
    throw Error(msg("format '", format, "' supports rounding 'nearest_even' or 'nearest_away' only (got '", rounding,
                    "')"));
  }
  return s;
}

// The array as the (rows x cols) matrix of quantize.h and the direction of its blocks: the last
// axis (contiguous: rows = product of the leading dims) or the first (strided: cols = product of
// the trailing dims). Other axes would need a batch of strided matrices: refused.
struct Layout {
  int64_t rows = 1, cols = 1;
  mxlab::Axis axis = mxlab::Axis::contiguous;
};

template <typename A>
Layout layout_of(const A& x, int axis) {
  const int nd = static_cast<int>(x.ndim());
  if (nd < 1) throw Error("quantize needs an array of rank >= 1 (got a 0-d array): pass x.reshape(1)");
  const int a = axis < 0 ? axis + nd : axis;
  if (a < 0 || a >= nd) throw Error(msg("axis ", axis, " is out of range for an array of rank ", nd));
  Layout l;
  if (a == nd - 1) {
    for (int i = 0; i < nd - 1; ++i) l.rows *= static_cast<int64_t>(x.shape(i));
    l.cols = static_cast<int64_t>(x.shape(nd - 1));
  } else if (a == 0) {
    l.rows = static_cast<int64_t>(x.shape(0));
    for (int i = 1; i < nd; ++i) l.cols *= static_cast<int64_t>(x.shape(i));
    l.axis = mxlab::Axis::strided;
  } else {
    throw Error(msg("axis ", axis, ": blocks run along the last axis (-1) or the first (0) only; move the axis "
                    "there first (x.movedim / np.moveaxis, then make it contiguous)"));
  }
  return l;
}

nb::dict stats_dict(const mxlab::QuantStats& st, const mxlab::QuantError* qe) {
  nb::dict d;
  d["elements"] = st.n;
  d["blocks"] = st.blocks;
  d["nan_blocks"] = st.nan_blocks;
  d["lastbin"] = st.lastbin;
  d["clamped"] = st.clamped;
  d["lastbin_frac"] = st.lastbin_frac();
  d["clamped_frac"] = st.clamped_frac();
  if (qe) {
    d["nonfinite"] = qe->nonfinite;
    d["rel_error"] = qe->rel;
  }
  return d;
}

// Quantize-dequantize x into out (out may be x itself); returns the statistics of
// `mxlab quantize --stats` (rel_error/nonfinite included when with_error).
nb::dict quantize_into(Array x, OutArray out, const std::string& format, int block_size, const std::string& scale_rule,
                       const std::string& rounding, int axis, const std::string& bump, bool bump_given, uint64_t seed,
                       bool with_error) {
  const mxlab::QuantSpec spec = make_spec(format, block_size, scale_rule, rounding, bump, bump_given, seed);
  if (out.size() != x.size()) throw Error(msg("quantize: output has ", out.size(), " elements, input ", x.size()));
  const Layout l = layout_of(x, axis);
  mxlab::QuantStats st;
  mxlab::QuantError qe;
  {
    nb::gil_scoped_release release;
    mxlab::quantize_dequantize(x.data(), out.data(), l.rows, l.cols, l.axis, spec, &st);
    if (with_error) qe = mxlab::quant_error(x.data(), out.data(), static_cast<int64_t>(x.size()));
  }
  return stats_dict(st, with_error ? &qe : nullptr);
}

#ifdef MXLAB_PYTHON_CUDA
using CudaArray = nb::ndarray<const float, nb::c_contig, nb::device::cuda>;
using CudaOutArray = nb::ndarray<float, nb::c_contig, nb::device::cuda>;

// quantize_into for a CUDA tensor: the CUDA kernels on its memory, enqueued on `stream` (the
// tensor's current stream, as an integer). Without with_stats nothing waits; with it the call
// waits for the stream and returns the statistics (rel_error too when with_error).
nb::object quantize_cuda_into(CudaArray x, CudaOutArray out, const std::string& format, int block_size,
                              const std::string& scale_rule, const std::string& rounding, int axis,
                              const std::string& bump, bool bump_given, uint64_t seed, uintptr_t stream,
                              bool with_stats, bool with_error) {
  const mxlab::QuantSpec spec = make_spec(format, block_size, scale_rule, rounding, bump, bump_given, seed);
  if (out.size() != x.size()) throw Error(msg("quantize: output has ", out.size(), " elements, input ", x.size()));
  if (out.device_id() != x.device_id())
    throw Error(msg("quantize: output on cuda:", out.device_id(), ", input on cuda:", x.device_id()));
  const Layout l = layout_of(x, axis);
  mxlab::QuantStats st;
  mxlab::QuantError qe;
  {
    nb::gil_scoped_release release;
    mxlab::python::quantize_device(x.data(), out.data(), l.rows, l.cols, l.axis, spec, x.device_id(), stream,
                                   with_stats ? &st : nullptr, with_stats && with_error ? &qe : nullptr);
  }
  if (!with_stats) return nb::none();
  return stats_dict(st, with_error ? &qe : nullptr);
}

// quantize_into for host memory through the CUDA kernels of device `device` (-1: the current
// one): copied there and back, synchronous.
nb::dict quantize_host_cuda_into(Array x, OutArray out, const std::string& format, int block_size,
                                 const std::string& scale_rule, const std::string& rounding, int axis,
                                 const std::string& bump, bool bump_given, uint64_t seed, int device,
                                 bool with_error) {
  const mxlab::QuantSpec spec = make_spec(format, block_size, scale_rule, rounding, bump, bump_given, seed);
  if (out.size() != x.size()) throw Error(msg("quantize: output has ", out.size(), " elements, input ", x.size()));
  const Layout l = layout_of(x, axis);
  mxlab::QuantStats st;
  mxlab::QuantError qe;
  {
    nb::gil_scoped_release release;
    mxlab::python::quantize_host_on_device(x.data(), out.data(), l.rows, l.cols, l.axis, spec, device, &st,
                                           with_error ? &qe : nullptr);
  }
  return stats_dict(st, with_error ? &qe : nullptr);
}
#endif

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "mxlab's MX quantizer (lab/mx/quantize.h); use mxlab.quantize / mxlab.quantize_stats";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mxlab::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
#ifdef MXLAB_PYTHON_CUDA
    catch (const mxlab::python::CudaFailure& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
#endif
  });
  m.def("quantize_into", &quantize_into, nb::arg("x"), nb::arg("out"), nb::arg("format"), nb::arg("block_size"),
        nb::arg("scale_rule"), nb::arg("rounding"), nb::arg("axis"), nb::arg("bump"), nb::arg("bump_given"),
        nb::arg("seed"), nb::arg("with_error"));
  m.def("formats", []() {
    std::vector<std::string> v;
    for (const std::string& n : mxlab::numfmt_names())
      if (n != "fp32") v.push_back(n);
    return v;
  });
  m.def("scale_rules", &mxlab::scale_rule_names);
#ifdef MXLAB_PYTHON_CUDA
  m.attr("built_with_cuda") = true;
  m.def("cuda_device_count", []() {
    std::string why;
    const int n = mxlab::python::cuda_device_count(&why);
    return nb::make_tuple(n, why);
  });
  m.def("quantize_cuda_into", &quantize_cuda_into, nb::arg("x"), nb::arg("out"), nb::arg("format"),
        nb::arg("block_size"), nb::arg("scale_rule"), nb::arg("rounding"), nb::arg("axis"), nb::arg("bump"),
        nb::arg("bump_given"), nb::arg("seed"), nb::arg("stream"), nb::arg("with_stats"), nb::arg("with_error"));
  m.def("quantize_host_cuda_into", &quantize_host_cuda_into, nb::arg("x"), nb::arg("out"), nb::arg("format"),
        nb::arg("block_size"), nb::arg("scale_rule"), nb::arg("rounding"), nb::arg("axis"), nb::arg("bump"),
        nb::arg("bump_given"), nb::arg("seed"), nb::arg("device"), nb::arg("with_error"));
#else
  m.attr("built_with_cuda") = false;
#endif
  m.def("roundings", &mxlab::rounding_names);
}
