// `mxlab export RUN.h5 --csv DIR`: the datasets of one run file as flat CSV files.
#pragma once
#include <string>
#include <vector>

namespace mxlab {

// Per trajectory/branch T (fp32, mx, branch-<name>)
//   DIR/<run_id>_<T>.csv           step, then one column per metric dataset (loss first, the
//                                  rest by name); [n, L] per-layer datasets as <metric>_layer<k>,
//                                  per-group datasets (attribute `names`) as <metric>_<group>
//   DIR/<run_id>_<T>_loss_all.csv  step, loss for every step run
// and DIR/<run_id>_summary.csv: one row per trajectory/branch with the summary values.
// Numbers: csv_number (lab/io/table_text.h). Each file is written atomically. Returns the
// paths.
std::vector<std::string> export_run_csv(const std::string& run_path, const std::string& out_dir);

}  // namespace mxlab
