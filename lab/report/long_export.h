// `mxlab export DIR --long OUT.csv`: every run file of a results directory as one long ("tidy")
// CSV table, one row per logged value, for pandas / R / a spreadsheet.
//
// Columns, in this order:
//   run_id                 the run's id (root attribute)
//   <swept keys>           every configuration key whose value differs between the readable runs
//                          (swept_keys, lab/runs/run_records.h; `seed` has its own column), the
//                          value as the canonical configuration prints it, empty where a run's
//                          configuration lacks the key
//   seed                   the run's seed (root attribute `seed`)
//   trajectory             fp32, mx, an arm's name, or a branch's name
//   kind                   fp32 | arm | branch
//   arm                    fp32 for the FP32 trajectory, the arm's name, or the arm a branch forks
//                          from (its attribute `from`; mx when absent)
//   step                   the row's step on the dataset's own axis (`step`, `shadow_step`,
//                          `curvature_step`: lab/train/SCHEMA.md); for loss_all every step run,
//                          from 0 or a branch's `at`
//   metric                 the dataset's name (loss, bias_ratio, gamma_lastbin, shadow_cosine,
//                          loss_all, ...)
//   column                 empty for a one-value-per-step dataset; for [n, k] datasets the
//                          group's name (attribute `names`, e.g. layer0.gamma) or layer<k>: the
//                          per-trajectory export's column is <metric>_<column>
//   value                  csv_number (lab/io/table_text.h): float32 values with %.9g, others
//                          with %.17g, nan / inf / -inf as such
// Rows: runs by run id; in a run, its groups as RunRecord::groups orders them (fp32, the arms,
// the branches by `at`); in a group the datasets of the `step` axis (loss first, then by name),
// then the other axes' series by axis name, then loss_all; in a dataset column by column, step
// by step. Datasets of one axis are cut to the rows that all of them have (a killed run), as the
// per-trajectory export does.
//
// Rows are written as they are read (one dataset in memory at a time) into a temp file beside
// OUT that is renamed over it at the end (a link at OUT is replaced, never written through).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace mxlab {

struct LongExportResult {
  size_t runs = 0;                    // runs written
  size_t rows = 0;                    // data rows (without the header)
  std::vector<std::string> left_out;  // "<file>: <why>" for each run file that could not be read
};

// `input`: a results directory (every *.h5 file in it, not recursive) or one run file. Run files
// that cannot be read are left out (listed in the result); none readable throws mxlab::Error.
// OUT's directory is created if missing. Throws IoError when OUT cannot be written.
LongExportResult export_long_csv(const std::string& input, const std::string& out_path);

}  // namespace mxlab
