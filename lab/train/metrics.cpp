// The metric declarations' helpers (see metrics.h).
#include "lab/train/metrics.h"

#include <map>

#include "lab/core/error.h"
#include "lab/model/mlp.h"

namespace mxlab {

namespace {

constexpr const char* kTensor = "{tensor}";

// The parameter kinds of the norm_gain family's members, in dataset order.
constexpr ParamGroup::Kind kNormGains[] = {ParamGroup::gamma, ParamGroup::beta};

const char* gain_name(ParamGroup::Kind kind) { return kind == ParamGroup::gamma ? "gamma" : "beta"; }

}  // namespace

const Metric& series_axis(MetricSeries series) {
  switch (series) {
    case MetricSeries::logged: return metric::step;
    case MetricSeries::shadow: return metric::shadow_step;
    case MetricSeries::curvature: return metric::curvature_step;
    case MetricSeries::history: break;
  }
  MXLAB_ASSERT(false, "series_axis: the loss history has no step axis");
  return metric::step;
}

std::string member_name(const Metric& family, const std::string& tensor) {
  std::string out = family.name;
  const size_t at = out.find(kTensor);
  MXLAB_ASSERT(family.family != MetricFamily::none && at != std::string::npos, "metric '", family.name,
               "' is not a {tensor} family");
  return out.replace(at, std::char_traits<char>::length(kTensor), tensor);
}

std::string member_name(const Metric& family, StatTensor tensor) { return member_name(family, name(tensor)); }

std::vector<std::string> family_tensors(MetricFamily family) {
  std::vector<std::string> out;
  if (family == MetricFamily::stat_tensor)
    for (int t = 0; t < kStatTensors; ++t) out.push_back(name(static_cast<StatTensor>(t)));
  if (family == MetricFamily::norm_gain)
    for (const ParamGroup::Kind kind : kNormGains) out.push_back(gain_name(kind));
  return out;
}

const Metric* find_metric(const std::string& dataset) {
  // Every dataset name a declaration can have (each family member), built once.
  static const std::map<std::string, const Metric*> by_name = [] {
    std::map<std::string, const Metric*> out;
    for (const Metric* m : metric::kAll) {
      if (m->family == MetricFamily::none) out.emplace(m->name, m);
      for (const std::string& t : family_tensors(m->family)) out.emplace(member_name(*m, t), m);
    }
    return out;
  }();
  const auto it = by_name.find(dataset);
  return it == by_name.end() ? nullptr : it->second;
}

std::vector<std::string> dataset_names(const Metric& m, const NetShape& shape, bool mx, bool curvature) {
  if (m.holders == MetricHolders::mx && !mx) return {};
  switch (m.when) {
    case MetricWhen::always: break;
    case MetricWhen::norm_gain:
      if (m.family == MetricFamily::none && !shape.find(0, ParamGroup::gamma)) return {};
      break;
    case MetricWhen::attention:
      if (!shape.attention()) return {};
      break;
    case MetricWhen::curvature:
      if (!curvature) return {};
      break;
  }
  std::vector<std::string> out;
  switch (m.family) {
    case MetricFamily::none: out.push_back(m.name); break;
    case MetricFamily::stat_tensor:
      for (const StatTensor t : stat_tensors(shape)) out.push_back(member_name(m, t));
      break;
    case MetricFamily::norm_gain:
      for (const ParamGroup::Kind kind : kNormGains)
        if (shape.find(0, kind)) out.push_back(member_name(m, gain_name(kind)));
      break;
  }
  return out;
}

const char* shape_text(MetricShape shape) {
  switch (shape) {
    case MetricShape::scalar: return "[n]";
    case MetricShape::per_layer: return "[n, L]";
    case MetricShape::per_group: return "[n, G]";
    case MetricShape::per_weight: return "[n, 2L]";
    case MetricShape::per_step_run: return "[steps_run]";
  }
  return "?";
}

}  // namespace mxlab
