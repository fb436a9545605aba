// Checkpoint files (format in checkpoint.h).
#include "lab/runs/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <map>
#include <sstream>

#include "lab/core/error.h"
#include "lab/io/out_file.h"

namespace mxlab {

namespace {

constexpr char kMagic[8] = {'M', 'X', 'L', 'A', 'B', 'C', 'K', 'P'};
constexpr char kEndMagic[8] = {'M', 'X', 'L', 'A', 'B', 'E', 'N', 'D'};

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hexfloat(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

class Buffer {
 public:
  void put(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    data.insert(data.end(), c, c + n);
  }
  template <typename T>
  void put_pod(T v) { put(&v, sizeof v); }
  std::vector<unsigned char> data;
};

void write_atomic(const std::string& path, const std::vector<unsigned char>& bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = create_fresh_file(tmp, path);  // never through a link (lab/io/out_file.h)
  size_t off = 0;
  int err = 0;
  while (off < bytes.size() && err == 0) {
    const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w <= 0) err = w < 0 ? errno : ENOSPC;
    else off += static_cast<size_t>(w);
  }
  // A network file system may report a full disk only here; other fsync refusals (EINVAL on a
  // file system without it) are not failures of the write.
  if (err == 0 && ::fsync(fd) != 0 && (errno == ENOSPC || errno == EDQUOT || errno == EIO)) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());  // a partial temp file would only hold on to the space that ran out
    throw_io_error("write checkpoint", path, err);
  }
}

struct Parsed {
  std::map<std::string, std::string> header;
  size_t payload_offset = 0;
  std::vector<unsigned char> bytes;
};

Parsed read_verified(const std::string& path, const std::string& config_hash) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error(msg("cannot read checkpoint ", path, ": ", std::strerror(errno)));
  Parsed p;
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) p.bytes.insert(p.bytes.end(), buf, buf + n);
  std::fclose(f);
  const auto& b = p.bytes;
  const std::string fix = " (delete it to start the run from its previous checkpoint or from scratch)";
  if (b.size() < 8 + 8 + 8 + 8 || std::memcmp(b.data(), kMagic, 8) != 0)
    throw Error(msg("checkpoint ", path, " is not an mxlab checkpoint or is truncated", fix));
  if (std::memcmp(b.data() + b.size() - 8, kEndMagic, 8) != 0)
    throw Error(msg("checkpoint ", path, " is truncated (end marker missing)", fix));
  uint64_t stored;
  std::memcpy(&stored, b.data() + b.size() - 16, 8);
  if (fnv1a(b.data(), b.size() - 16) != stored)
    throw Error(msg("checkpoint ", path, " is corrupted (checksum mismatch)", fix));
  uint32_t version, hlen;
  std::memcpy(&version, b.data() + 8, 4);
  std::memcpy(&hlen, b.data() + 12, 4);
  if (version != kCheckpointVersion)
    throw Error(msg("checkpoint ", path, " has format version ", version, ", this mxlab reads version ",
                    kCheckpointVersion, fix));
  if (16 + static_cast<size_t>(hlen) > b.size() - 16) throw Error(msg("checkpoint ", path, " is truncated", fix));
  std::istringstream hs(std::string(reinterpret_cast<const char*>(b.data() + 16), hlen));
  std::string line;
  while (std::getline(hs, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) p.header[line.substr(0, eq)] = line.substr(eq + 1);
  }
  p.payload_offset = 16 + hlen;
  if (p.header["config_hash"] != config_hash)
    throw Error(msg("checkpoint ", path, " belongs to a different configuration (config hash ",
                    p.header["config_hash"], ", this run ", config_hash,
                    "); it was not made by this run: move it away or use the matching config"));
  return p;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, const std::string& run_id, int64_t step) {
  return msg(dir, "/", run_id, ".step", step, ".ckpt");
}

std::vector<int64_t> list_checkpoints(const std::string& dir, const std::string& run_id) {
  std::vector<int64_t> steps;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return steps;
  const std::string prefix = run_id + ".step";
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 6) continue;
    if (name.substr(name.size() - 5) != ".ckpt") continue;
    const std::string num = name.substr(prefix.size(), name.size() - prefix.size() - 5);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
    steps.push_back(std::stoll(num));
  }
  ::closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

void save_checkpoint(Trainer& tr, const std::string& config_hash, const std::string& path) {
  const RunConfig& cfg = tr.config();
  const size_t np = static_cast<size_t>(tr.shape().num_params);
  const size_t steps = static_cast<size_t>(std::max(cfg.steps, 1));
  // Branches that have not started hold only the initial weights: leaving them out keeps the
  // checkpoints before the intervention steps small. (A branch whose baseline stopped before
  // its `at` never starts but is marked stopped: it is kept, that mark is state.)
  std::vector<Trajectory*> saved;
  for (size_t i = 0; i < tr.num_trajectories(); ++i)
    if (tr.trajectory(i).started || tr.trajectory(i).stopped) saved.push_back(&tr.trajectory(i));
  std::ostringstream h;
  h << "config_hash=" << config_hash << "\nstep=" << tr.step() << "\nsteps=" << cfg.steps
    << "\nnum_params=" << np << "\ntrajectories=";
  for (size_t i = 0; i < saved.size(); ++i) h << (i ? "," : "") << saved[i]->name;
  h << "\n";
  for (size_t i = 0; i < saved.size(); ++i) {
    const Trajectory& t = *saved[i];
    const std::string k = msg("t", i, ".");
    h << k << "name=" << t.name << "\n" << k << "started=" << t.started << "\n" << k << "stopped=" << t.stopped
      << "\n" << k << "start_step=" << t.start_step << "\n" << k << "bias_avg=" << hexfloat(t.bias_avg) << "\n"
      << k << "bias_avg_weight=" << hexfloat(t.bias_avg_weight) << "\n" << k << "cross_sq_avg=" << hexfloat(t.cross_sq_avg)
      << "\n" << k << "cross_sq_avg_weight=" << hexfloat(t.cross_sq_avg_weight) << "\n" << k << "rows_logged=" << t.rows_logged
      << "\n" << k << "last_loss=" << hexfloat(t.last_loss) << "\n" << k << "max_bias_ratio="
      << hexfloat(t.max_bias_ratio) << "\n" << k << "max_gamma_lastbin=" << hexfloat(t.max_gamma_lastbin) << "\n";
    if (!t.delta_bias_cumsum.empty()) {  // added later: absent while empty
      h << k << "delta_bias_cumsum=";
      for (size_t l = 0; l < t.delta_bias_cumsum.size(); ++l) h << (l ? "," : "") << hexfloat(t.delta_bias_cumsum[l]);
      h << "\n";
    }
    // Added later, absent while empty: its floats follow every trajectory's fixed part.
    if (!t.dwq_err_prev.empty()) h << k << "dwq_err_prev=" << t.dwq_err_prev.size() << "\n";
    h << k << "group=" << t.h5_group << "\n";  // what load_checkpoint matches (kind and name)
  }
  const std::string header = h.str();
  Buffer b;
  b.put(kMagic, 8);
  b.put_pod<uint32_t>(kCheckpointVersion);
  b.put_pod<uint32_t>(static_cast<uint32_t>(header.size()));
  b.put(header.data(), header.size());
  for (Trajectory* tp : saved) {
    Trajectory& t = *tp;
    for (const float* p : {t.params, t.m, t.v}) {
      const std::vector<float> host = tr.download(p, np);
      b.put(host.data(), np * sizeof(float));
    }
    const std::vector<float> hist = tr.download(t.loss_hist, steps);
    b.put(hist.data(), steps * sizeof(float));
  }
  for (Trajectory* tp : saved) b.put(tp->dwq_err_prev.data(), tp->dwq_err_prev.size() * sizeof(float));
  b.put_pod<uint64_t>(fnv1a(b.data.data(), b.data.size()));
  b.put(kEndMagic, 8);
  write_atomic(path, b.data);
}

void load_checkpoint(Trainer& tr, const std::string& config_hash, const std::string& path) {
  Parsed p = read_verified(path, config_hash);
  const RunConfig& cfg = tr.config();
  const size_t np = static_cast<size_t>(tr.shape().num_params);
  const size_t steps = static_cast<size_t>(std::max(cfg.steps, 1));
  auto& h = p.header;
  if (h["num_params"] != std::to_string(np) || h["steps"] != std::to_string(cfg.steps))
    throw Error(msg("checkpoint ", path, " does not match this run's shapes (num_params ", h["num_params"],
                    ", steps ", h["steps"], ")"));
  // Trajectories are matched by their group (trajectories/<name> or branches/<name>: the kind
  // and the name), so that a branch never takes the state of the FP32 trajectory or of an arm;
  // checkpoints written before the group was saved are matched by name (names are unique across
  // kinds in every configuration this build accepts). A branch the checkpoint does not hold must
  // not have started yet (it is a branch added after the fact, starting at or after the checkpoint).
  std::vector<std::string> names;
  {
    std::string cur;
    for (char c : h["trajectories"] + ",") {
      if (c == ',') { names.push_back(cur); cur.clear(); } else cur += c;
    }
  }
  bool by_group = !names.empty();
  for (size_t i = 0; i < names.size(); ++i) by_group = by_group && h.count(msg("t", i, ".group")) > 0;
  if (by_group)
    for (size_t i = 0; i < names.size(); ++i) names[i] = h[msg("t", i, ".group")];
  const int64_t step = std::stoll(h["step"]);
  const size_t per_traj = (3 * np + steps) * sizeof(float);
  // The variable part after the fixed one: each trajectory's dwq_err_prev floats, in header order.
  std::vector<size_t> err_len(names.size(), 0), err_at(names.size(), 0);
  size_t extra = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string key = msg("t", i, ".dwq_err_prev");
    if (h.count(key)) {
      const std::string& n = h[key];
      if (n.empty() || n.size() > 15 || n.find_first_not_of("0123456789") != std::string::npos)
        throw Error(msg("checkpoint ", path, " has a malformed ", key, " (", n, ")"));
      err_len[i] = static_cast<size_t>(std::stoull(n));
      const NetShape& shape = tr.shape();
      if (!shape.attention() || err_len[i] != static_cast<size_t>(shape.depth) * shape.d * shape.d)
        throw Error(msg("checkpoint ", path, " does not match this run's shapes (", key, " ", n, ")"));
    }
    err_at[i] = p.payload_offset + per_traj * names.size() + extra;
    extra += err_len[i] * sizeof(float);
  }
  if (p.payload_offset + per_traj * names.size() + extra + 16 != p.bytes.size())
    throw Error(msg("checkpoint ", path, " has the wrong size for this run"));
  for (size_t j = 0; j < tr.num_trajectories(); ++j) {
    Trajectory& t = tr.trajectory(j);
    const auto it = std::find(names.begin(), names.end(), by_group ? t.h5_group : t.name);
    if (it == names.end()) {
      if (t.start_step < step || (t.start_step == 0))
        throw Error(msg("checkpoint ", path, " holds no state for trajectory '", t.name, "'"));
      continue;
    }
    const size_t i = static_cast<size_t>(it - names.begin());
    size_t off = p.payload_offset + i * per_traj;
    auto take = [&](size_t n) {
      std::vector<float> v(n);
      std::memcpy(v.data(), p.bytes.data() + off, n * sizeof(float));
      off += n * sizeof(float);
      return v;
    };
    const std::string k = msg("t", i, ".");
    t.started = h[k + "started"] == "1";
    t.stopped = h[k + "stopped"] == "1";
    t.bias_avg = std::strtod(h[k + "bias_avg"].c_str(), nullptr);
    t.bias_avg_weight = std::strtod(h[k + "bias_avg_weight"].c_str(), nullptr);
    // Added after format 1's first files: a checkpoint without them starts the averages afresh.
    t.cross_sq_avg = h.count(k + "cross_sq_avg") ? std::strtod(h[k + "cross_sq_avg"].c_str(), nullptr) : 0.0;
    t.cross_sq_avg_weight =
        h.count(k + "cross_sq_avg_weight") ? std::strtod(h[k + "cross_sq_avg_weight"].c_str(), nullptr) : 0.0;
    t.rows_logged = std::stoll(h[k + "rows_logged"]);
    t.last_loss = std::strtod(h[k + "last_loss"].c_str(), nullptr);
    t.max_bias_ratio = std::strtod(h[k + "max_bias_ratio"].c_str(), nullptr);
    t.max_gamma_lastbin = std::strtod(h[k + "max_gamma_lastbin"].c_str(), nullptr);
    t.delta_bias_cumsum.clear();
    if (h.count(k + "delta_bias_cumsum")) {
      const std::string& list = h[k + "delta_bias_cumsum"];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        t.delta_bias_cumsum.push_back(std::strtod(list.substr(at, comma - at).c_str(), nullptr));
        at = comma + 1;
      }
    }
    t.dwq_err_prev.assign(err_len[i], 0.0f);
    if (err_len[i]) std::memcpy(t.dwq_err_prev.data(), p.bytes.data() + err_at[i], err_len[i] * sizeof(float));
    tr.upload(t.params, take(np));
    tr.upload(t.m, take(np));
    tr.upload(t.v, take(np));
    tr.upload(t.loss_hist, take(steps));
  }
  tr.set_step(std::stoll(h["step"]));
}

int64_t checkpoint_step(const std::string& path, const std::string& config_hash) {
  Parsed p = read_verified(path, config_hash);
  return std::stoll(p.header["step"]);
}

}  // namespace mxlab
