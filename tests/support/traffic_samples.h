// Parsers for measured memory traffic and its pairing with the traffic model (docs/traffic.md):
// valgrind cachegrind summaries of bench/traffic/traffic_run on one thread, and Nsight Compute
// CSV of the CUDA forward and of PyTorch's MATH path. Header-only and Catch2-free (in the
// test-support layer, ioattn_test_support_core) so that the Catch2 test
// (tests/test_traffic_measured.cc) and the report tool (bench/traffic/traffic_report) share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_tiles.h"
#include "common/hardware.h"
#include "common/planner.h"
#include "common/problem.h"
#include "common/traffic.h"

namespace ioattn::measured {

using Fields = std::map<std::string, std::string>;

// "tag key=value key=value ..." on the first line of `text` that starts with `tag`.
inline bool find_tagged_line(const std::string& text, const std::string& tag, Fields* out) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    std::istringstream words(line.substr(tag.size() + 1));
    std::string w;
    out->clear();
    while (words >> w) {
      const size_t eq = w.find('=');
      if (eq != std::string::npos) (*out)[w.substr(0, eq)] = w.substr(eq + 1);
    }
    return true;
  }
  return false;
}

inline bool field_int(const Fields& f, const std::string& key, int64_t* v, std::string* error) {
  const auto it = f.find(key);
  char* end = nullptr;
  if (it == f.end() || it->second.empty() || (*v = std::strtoll(it->second.c_str(), &end, 10), *end != '\0')) {
    *error = "field '" + key + "' missing or not an integer";
    return false;
  }
  return true;
}

// "1,234,567" -> 1234567.
inline bool parse_grouped(const std::string& s, double* v) {
  std::string digits;
  for (char c : s) {
    if (c == ',') continue;
    if (c < '0' || c > '9') return false;
    digits += c;
  }
  if (digits.empty()) return false;
  *v = std::strtod(digits.c_str(), nullptr);
  return true;
}

// ---- cachegrind ---------------------------------------------------------------------------
// The summary valgrind prints to stderr, e.g.
//   ==123== D1  misses:     15,843,825  ( 14,574,090 rd   +  1,269,735 wr)
//   ==123== LLd misses:        861,927  (    578,142 rd   +    283,785 wr)
// Misses are lines filled into the simulated level, demand reads and write-allocates alike;
// cachegrind simulates no write-backs and no prefetcher (docs/traffic.md).
struct CachegrindCounts {
  double d1_read_misses = 0, d1_write_misses = 0;
  double lld_read_misses = 0, lld_write_misses = 0;
  int64_t d1_bytes = 0, ll_bytes = 0, line = 0;  // simulated geometry, from the command line
  int64_t ways = 0;                              // associativity (D1's and LL's must agree)
};

inline bool parse_cachegrind_line(const std::string& text, const std::string& label, double* rd, double* wr) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(label);
    if (line.rfind("==", 0) != 0 || at == std::string::npos) continue;
    const size_t open = line.find('(', at), plus = line.find('+', at), close = line.find(')', at);
    if (open == std::string::npos || plus == std::string::npos || close == std::string::npos) return false;
    std::istringstream a(line.substr(open + 1, plus - open - 1)), b(line.substr(plus + 1, close - plus - 1));
    std::string na, nb, ta, tb;
    a >> na >> ta;
    b >> nb >> tb;
    return ta == "rd" && tb == "wr" && parse_grouped(na, rd) && parse_grouped(nb, wr);
  }
  return false;
}

// "--D1=32768,8,64" in valgrind's "Command:"-less option echo is not printed, so the run script
// records the geometry on its own tagged line: "ioattn-cachegrind D1=32768,8,64 LL=524288,8,64".
inline bool parse_cachegrind(const std::string& text, CachegrindCounts* c, std::string* error) {
  if (!parse_cachegrind_line(text, "D1  misses:", &c->d1_read_misses, &c->d1_write_misses) ||
      !parse_cachegrind_line(text, "LLd misses:", &c->lld_read_misses, &c->lld_write_misses)) {
    *error = "no cachegrind 'D1  misses' / 'LLd misses' summary (was it run with --cache-sim=yes?)";
    return false;
  }
  Fields g;
  if (!find_tagged_line(text, "ioattn-cachegrind", &g) || !g.count("D1") || !g.count("LL")) {
    *error = "no 'ioattn-cachegrind D1=... LL=...' geometry line";
    return false;
  }
  auto geometry = [](const std::string& s, int64_t* size, int64_t* ways, int64_t* line) {
    long long a = 0, b = 0, l = 0;
    if (std::sscanf(s.c_str(), "%lld,%lld,%lld", &a, &b, &l) != 3 || a <= 0 || b <= 0 || l <= 0) return false;
    *size = a;
    *ways = b;
    *line = l;
    return true;
  };
  int64_t l1_line = 0, ll_line = 0, l1_ways = 0, ll_ways = 0;
  if (!geometry(g["D1"], &c->d1_bytes, &l1_ways, &l1_line) || !geometry(g["LL"], &c->ll_bytes, &ll_ways, &ll_line) ||
      l1_line != ll_line || l1_ways != ll_ways) {
    *error = "malformed cache geometry '" + g["D1"] + "' / '" + g["LL"] + "'";
    return false;
  }
  c->line = l1_line;
  c->ways = l1_ways;
  return true;
}

// One recorded cachegrind run of traffic_run (bench/traffic/samples/cpu/*.txt).
struct CpuRun {
  std::string file;
  Fields run;  // the driver's "ioattn-traffic-run" line
  CachegrindCounts counts;
};

inline bool parse_cpu_run(const std::string& file, const std::string& text, CpuRun* r, std::string* error) {
  r->file = file;
  if (!find_tagged_line(text, "ioattn-traffic-run", &r->run)) {
    *error = file + ": no 'ioattn-traffic-run' line from the driver";
    return false;
  }
  std::string why;
  if (!parse_cachegrind(text, &r->counts, &why)) {
    *error = file + ": " + why;
    return false;
  }
  return true;
}

inline std::string shape_key(const Fields& f) {
  auto g = [&](const char* k) { return f.count(k) ? f.at(k) : std::string("?"); };
  return "h" + g("heads") + "_s" + g("seqlen") + "_d" + g("dim") + "_" + g("dtype");
}

// A one-call run minus the `none` run of the same shape: a cold call's own fills. Or a two-call
// run minus the one-call run of the same kernel and shape: the second call's, the steady state.
struct CpuPoint {
  std::string name;  // e.g. "flash h1_s1024_d64_f32 causal", "flash h1_s1024_d64_f32 steady"
  std::string kernel;
  std::string hardware;  // the profile the library planned for ("zen3"; "host": detected)
  bool cold = true;      // a cold call; false: the steady state of repeated calls
  Problem problem;
  Plan plan;
  int simd_bits = 256;
  int64_t l1_bytes = 0, l2_bytes = 0, line = 64, ways = 8;
  double measured_l1_l2 = 0;      // (D1 read + write misses) x line
  double measured_l2_beyond = 0;  // (LLd read + write misses) x line
};

inline bool make_problem_plan(const Fields& f, Problem* pr, Plan* plan, int* simd_bits, std::string* error) {
  int64_t heads, heads_kv, seqlen, dim, causal, bq, bkv, dp, rr, rc, splits, workers, ws, bits;
  if (!field_int(f, "heads", &heads, error) || !field_int(f, "heads_kv", &heads_kv, error) ||
      !field_int(f, "seqlen", &seqlen, error) || !field_int(f, "dim", &dim, error) ||
      !field_int(f, "causal", &causal, error) || !field_int(f, "block_q", &bq, error) ||
      !field_int(f, "block_kv", &bkv, error) || !field_int(f, "head_dim_padded", &dp, error) ||
      !field_int(f, "reg_rows", &rr, error) || !field_int(f, "reg_cols", &rc, error) ||
      !field_int(f, "kv_splits", &splits, error) || !field_int(f, "workers", &workers, error) ||
      !field_int(f, "working_set", &ws, error) || !field_int(f, "simd_bits", &bits, error))
    return false;
  const std::string dt = f.count("dtype") ? f.at("dtype") : "";
  DType t;
  if (dt == "f32")
    t = DType::f32;
  else if (dt == "bf16")
    t = DType::bf16;
  else if (dt == "f16")
    t = DType::f16;
  else {
    *error = "unknown dtype '" + dt + "'";
    return false;
  }
  *pr = Problem{};
  pr->batch = 1;
  pr->heads_q = heads;
  pr->heads_kv = heads_kv;
  pr->seqlen_q = pr->seqlen_k = seqlen;
  pr->head_dim = pr->head_dim_v = dim;
  pr->dtype = pr->kv_dtype = t;
  pr->causal = causal != 0;
  *plan = Plan{};
  plan->backend = BackendKind::cpu;
  plan->block_q = int(bq);
  plan->block_kv = int(bkv);
  plan->head_dim_padded = int(dp);
  plan->reg_rows = int(rr);
  plan->reg_cols = int(rc);
  plan->kv_splits = int(splits);
  plan->workers = int(workers);
  plan->working_set_bytes = ws;
  plan->units = heads_kv;
  plan->rows_per_unit = heads / std::max<int64_t>(1, heads_kv) * seqlen;
  *simd_bits = int(bits);
  return true;
}

inline std::string run_field(const Fields& f, const char* key, const char* fallback) {
  return f.count(key) ? f.at(key) : std::string(fallback);
}

// The run to subtract from `r`: the kernel's run with one call fewer, or for one call the `none`
// run of the shape.
inline std::string base_key(const Fields& r) {
  const int64_t calls = std::strtoll(run_field(r, "calls", "1").c_str(), nullptr, 10);
  if (calls <= 1) return "none " + shape_key(r);
  return run_field(r, "kernel", "") + " " + shape_key(r) + " c" + run_field(r, "causal", "0") + " n" +
         std::to_string(calls - 1);
}

// Pairs every flash/standard run with its base run (base_key) and subtracts.
inline bool cpu_points(const std::vector<CpuRun>& runs, std::vector<CpuPoint>* out, std::string* error) {
  std::map<std::string, const CpuRun*> by_key;
  for (const CpuRun& r : runs) {
    const std::string kernel = run_field(r.run, "kernel", "");
    by_key[kernel == "none" ? "none " + shape_key(r.run)
                            : kernel + " " + shape_key(r.run) + " c" + run_field(r.run, "causal", "0") + " n" +
                                  run_field(r.run, "calls", "1")] = &r;
  }
  for (const CpuRun& r : runs) {
    const std::string kernel = run_field(r.run, "kernel", "");
    if (kernel == "none") continue;
    const auto base = by_key.find(base_key(r.run));
    if (base == by_key.end()) {
      *error = r.file + ": no '" + base_key(r.run) + "' run to subtract";
      return false;
    }
    const CachegrindCounts &k = r.counts, &n = base->second->counts;
    if (k.d1_bytes != n.d1_bytes || k.ll_bytes != n.ll_bytes) {
      *error = r.file + ": cache geometry differs from its base run";
      return false;
    }
    CpuPoint p;
    p.kernel = kernel;
    p.hardware = run_field(r.run, "hardware", "host");
    p.cold = run_field(r.run, "calls", "1") == "1";
    const bool causal = run_field(r.run, "causal", "0") == "1";
    p.name = kernel + " " + shape_key(r.run) + (causal ? " causal" : "") + (p.cold ? "" : " steady");
    if (!make_problem_plan(r.run, &p.problem, &p.plan, &p.simd_bits, error)) {
      *error = r.file + ": " + *error;
      return false;
    }
    p.l1_bytes = k.d1_bytes;
    p.l2_bytes = k.ll_bytes;
    p.line = k.line;
    p.ways = k.ways;
    p.measured_l1_l2 = double(k.line) * (k.d1_read_misses + k.d1_write_misses - n.d1_read_misses - n.d1_write_misses);
    p.measured_l2_beyond =
        double(k.line) * (k.lld_read_misses + k.lld_write_misses - n.lld_read_misses - n.lld_write_misses);
    out->push_back(p);
  }
  return true;
}

// The hierarchy cachegrind simulates: one core's L1d and a private L2 standing for its "LL", then
// memory. Nothing is shared, there is no L3, one worker.
inline HardwareProfile cachegrind_profile(int64_t l1, int64_t l2, int line, int simd_bits) {
  HardwareProfile hw;
  hw.name = "cachegrind";
  hw.description = "cachegrind's simulated L1d and LL, one core";
  hw.kind = DeviceKind::cpu;
  hw.cores = 1;
  hw.simd_bits = simd_bits;
  MemoryLevel a, b, m;
  a.name = "L1d";
  a.size_bytes = l1;
  a.line_bytes = line;
  b.name = "L2";
  b.size_bytes = l2;
  b.line_bytes = line;
  m.name = "DRAM";
  m.line_bytes = line;
  hw.levels = {a, b, m};
  return hw;
}

struct Comparison {
  std::string boundary;
  double predicted = 0, measured = 0;
  double error() const { return measured > 0 ? predicted / measured - 1.0 : 0.0; }
};

inline std::vector<Comparison> compare_cpu(const CpuPoint& p) {
  const HardwareProfile hw = cachegrind_profile(p.l1_bytes, p.l2_bytes, int(p.line), p.simd_bits);
  // cachegrind counts the lines brought into a level: the model's reads plus its writes, every
  // written line being filled first (write-allocate); a one-call point is a cold call, a
  // second call's the steady state (scratch warm, TrafficOptions' default).
  TrafficOptions opt;
  opt.cold_scratch = p.cold;
  opt.cache_ways = int(p.ways);
  const TrafficReport rep = predict_traffic(p.problem, p.plan, hw, cpu_baseline_passes(), opt);
  const bool flash = p.kernel == "flash";
  auto bytes = [&](size_t i) { return flash ? rep.levels[i].flash_bytes : rep.levels[i].standard_bytes; };
  return {{"L1d-L2", bytes(0), p.measured_l1_l2}, {"L2-beyond", bytes(1), p.measured_l2_beyond}};
}

inline bool read_text(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

// Every *.txt under dir, sorted by name.
inline std::vector<std::string> list_files(const std::string& dir, const std::string& ext) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ext) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

inline bool load_cpu_points(const std::string& dir, std::vector<CpuPoint>* out, std::string* error) {
  std::vector<CpuRun> runs;
  for (const std::string& f : list_files(dir, ".txt")) {
    std::string text;
    CpuRun r;
    if (!read_text(f, &text) || !parse_cpu_run(f, text, &r, error)) return false;
    runs.push_back(r);
  }
  if (runs.empty()) {
    *error = "no cachegrind samples (*.txt) in " + dir;
    return false;
  }
  return cpu_points(runs, out, error);
}

// ---- Nsight Compute ----------------------------------------------------------------------
// `ncu --csv --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum` prints one
// row per (kernel launch, metric): ..."Metric Name","Metric Unit","Metric Value". A forward may be
// several kernels (PyTorch's MATH path is about ten), so the rows are summed per metric. Each
// recorded sample starts with "ioattn-ncu impl=... batch=... heads=... seqlen=... dim=...
// causal=... dtype=..." written by bench/traffic/gpu_ncu.sh. Samples transcribed from
// bench/results/reference-figures.md carry "dram_read=BYTES dram_write=BYTES" on that line instead of CSV rows.
struct GpuPoint {
  std::string file, name, impl;  // impl: "ioattn", "fa2" (PyTorch's FlashAttention-2), "math"
  Problem problem;
  GpuTile tile{0, 0, 0, 0, false};  // the measured kernel's tile, when the sample names it
  bool sm90 = false;  // the sm_90a kernel's name (FwdTraits): tile = its block_q x block_kv, warps, stages
  double dram_read = 0, dram_write = 0, l2_bytes = -1;  // l2_bytes < 0: not measured
  // MATH: the output tiles cuBLAS ran for Q K^T and P V ("tilesize{M}x{N}x" in the kernel names;
  // 0 when the sample has no kernel list), M along the queries.
  int qk_tile[2] = {0, 0}, pv_tile[2] = {0, 0};
  // Every metric of the CSV summed over the kernels, in its base unit (bytes, sectors,
  // requests): the per-source split of gpu_ncu.sh SPLIT=1 (l2_split reads it).
  std::map<std::string, double> metrics;
};

inline std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"')
      quoted = !quoted;
    else if (c == ',' && !quoted) {
      cells.push_back(cur);
      cur.clear();
    } else
      cur += c;
  }
  cells.push_back(cur);
  return cells;
}

inline bool unit_scale(const std::string& unit, double* scale) {
  static const std::map<std::string, double> units = {{"byte", 1.0},  {"Kbyte", 1e3},  {"Mbyte", 1e6},
                                                      {"Gbyte", 1e9}, {"Tbyte", 1e12}, {"KB", 1e3},
                                                      {"MB", 1e6},    {"GB", 1e9},     {"B", 1.0}};
  const auto it = units.find(unit);
  if (it == units.end()) return false;
  *scale = it->second;
  return true;
}

// Sums the metric rows of ncu's CSV, every metric into `all` (when given); counts (sectors,
// requests) are taken as they are, byte units scaled to bytes. false when a DRAM metric is
// missing or a value unreadable.
inline bool parse_ncu_csv(const std::string& text, double* read, double* write, double* l2, std::string* error,
                          std::map<std::string, double>* all = nullptr) {
  std::istringstream in(text);
  std::string line;
  int name_col = -1, unit_col = -1, value_col = -1;
  double sums[3] = {0, 0, 0};
  bool seen[3] = {false, false, false};
  const char* metrics[3] = {"dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"};
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] != '"') continue;
    const std::vector<std::string> cells = split_csv(line);
    if (name_col < 0) {
      for (size_t i = 0; i < cells.size(); ++i) {
        if (cells[i] == "Metric Name") name_col = int(i);
        if (cells[i] == "Metric Unit") unit_col = int(i);
        if (cells[i] == "Metric Value") value_col = int(i);
      }
      continue;
    }
    if (int(cells.size()) <= std::max({name_col, unit_col, value_col})) continue;
    const std::string& name = cells[size_t(name_col)];
    const std::string& unit = cells[size_t(unit_col)];
    const std::string& val = cells[size_t(value_col)];
    double scale = 0, v = 0;
    const bool count = unit == "sector" || unit == "request";
    if ((!count && !unit_scale(unit, &scale)) || !parse_grouped(val.substr(0, val.find('.')), &v)) {
      *error = "unreadable value '" + val + "' '" + unit + "' of " + name;
      return false;
    }
    const size_t dot = val.find('.');
    if (dot != std::string::npos) v += std::strtod(("0" + val.substr(dot)).c_str(), nullptr);
    v *= count ? 1.0 : scale;
    if (all) (*all)[name] += v;
    for (int m = 0; m < 3; ++m) {
      if (name != metrics[m]) continue;
      sums[m] += v;
      seen[m] = true;
    }
  }
  if (name_col < 0 || !seen[0] || !seen[1]) {
    *error = "no ncu CSV rows for dram__bytes_read.sum and dram__bytes_write.sum";
    return false;
  }
  *read = sums[0];
  *write = sums[1];
  *l2 = seen[2] ? sums[2] : -1;
  return true;
}

inline bool parse_gpu_sample(const std::string& file, const std::string& text, GpuPoint* g, std::string* error) {
  Fields f;
  if (!find_tagged_line(text, "ioattn-ncu", &f)) {
    *error = file + ": no 'ioattn-ncu' line";
    return false;
  }
  int64_t b, h, s, d, c;
  if (!field_int(f, "batch", &b, error) || !field_int(f, "heads", &h, error) || !field_int(f, "seqlen", &s, error) ||
      !field_int(f, "dim", &d, error) || !field_int(f, "causal", &c, error)) {
    *error = file + ": " + *error;
    return false;
  }
  g->file = file;
  g->impl = f.count("impl") ? f.at("impl") : "";
  if (g->impl != "ioattn" && g->impl != "fa2" && g->impl != "math") {
    *error = file + ": impl must be ioattn, fa2 or math, got '" + g->impl + "'";
    return false;
  }
  g->problem = Problem{};
  g->problem.batch = b;
  g->problem.heads_q = g->problem.heads_kv = h;
  g->problem.seqlen_q = g->problem.seqlen_k = s;
  g->problem.head_dim = g->problem.head_dim_v = d;
  g->problem.dtype = g->problem.kv_dtype = (f.count("dtype") && f.at("dtype") == "f16") ? DType::f16 : DType::bf16;
  g->problem.causal = c != 0;
  g->name = g->impl + " b" + std::to_string(b) + "_h" + std::to_string(h) + "_s" + std::to_string(s) + "_d" +
            std::to_string(d) + (c ? " causal" : "");
  // The tile the measured kernel ran: "tile=BQxBKVxWARPSxSTAGES" on the tagged line, or ioattn's
  // kernel name in the CSV, "FwdShape<D, BQ, BKV, WARPS, STAGES>" (sm_80) or "FwdTraits<Elem, D,
  // BQ, BKV, CONSUMER_WGS, STAGES>" (sm_90a, one producer warpgroup more), so the comparison does
  // not follow later edits of the tile tables.
  int bq = 0, bkv = 0, warps = 0, stages = 0, dd = 0;
  const size_t shape = text.find("FwdShape<");
  const size_t traits = text.find("FwdTraits<");
  const size_t traits_args = traits == std::string::npos ? traits : text.find(", ", traits);
  if (f.count("tile") && std::sscanf(f.at("tile").c_str(), "%dx%dx%dx%d", &bq, &bkv, &warps, &stages) == 4) {
    g->tile = GpuTile{bq, bkv, warps, stages, true};
  } else if (shape != std::string::npos &&
             std::sscanf(text.c_str() + shape, "FwdShape<%d, %d, %d, %d, %d>", &dd, &bq, &bkv, &warps, &stages) == 5) {
    g->tile = GpuTile{bq, bkv, warps, stages, true};
  } else if (int wgs = 0;
             traits_args != std::string::npos &&
             std::sscanf(text.c_str() + traits_args, ", %d, %d, %d, %d, %d", &dd, &bq, &bkv, &wgs, &stages) == 5) {
    g->tile = GpuTile{bq, bkv, 4 * (wgs + 1), stages, true};
    g->sm90 = true;
  }
  // cuBLAS's GEMMs: the "tn" kernel computes S = Q K^T (both operands row-major over the head
  // dim), the "nn" one O = P V; their grids put M along the queries (P V at S = 1024, D = 128:
  // tile 64x128, grid 16 x 1 per head).
  for (const auto& [tag, dst] : {std::pair<const char*, int*>{"_tn_n_tilesize", g->qk_tile},
                                 std::pair<const char*, int*>{"_nn_n_tilesize", g->pv_tile}}) {
    const size_t at = text.find(tag);
    if (at != std::string::npos && std::sscanf(text.c_str() + at + std::strlen(tag), "%dx%d", &dst[0], &dst[1]) != 2)
      dst[0] = dst[1] = 0;
  }
  if (f.count("dram_read") && f.count("dram_write")) {
    if (!parse_grouped(f.at("dram_read"), &g->dram_read) || !parse_grouped(f.at("dram_write"), &g->dram_write)) {
      *error = file + ": dram_read / dram_write must be whole byte counts";
      return false;
    }
    return true;
  }
  std::string why;
  if (!parse_ncu_csv(text, &g->dram_read, &g->dram_write, &g->l2_bytes, &why, &g->metrics)) {
    *error = file + ": " + why;
    return false;
  }
  return true;
}

// The H200 profile's L2-HBM boundary for the point's implementation: the CUDA kernel's plan for
// ioattn and FA2 (whose 128-row tiles and L2 behaviour it shares), PyTorch's MATH passes for math.
// plan_gpu with the measured kernel's tile in place of the table's, resident CTAs by the planner's
// arithmetic (common/planner.cc: shared memory with the runtime's 1 KiB per CTA, 2048 threads and
// 255 registers per thread per SM).
// An sm_90a sample keeps the planner's sm_90a plan (the caller checks that its tile is the one
// measured).
inline Plan plan_for_point(const GpuPoint& g, const HardwareProfile& hw) {
  Plan plan = plan_gpu(g.problem, hw);
  if (!g.tile.supported || g.sm90) return plan;
  // An sm_80 kernel's sample (the H200 grid predates the sm_90a kernel the planner now picks there).
  plan.kernel = "sm80";
  plan.block_q = g.tile.block_q;
  plan.block_kv = g.tile.block_kv;
  plan.warps = g.tile.warps;
  plan.stages = g.tile.stages;
  plan.working_set_bytes = gpu_tile_smem_bytes(g.tile, plan.head_dim_padded);
  const int64_t threads = int64_t(g.tile.warps) * 32;
  const int64_t by_smem = hw.levels.front().size_bytes / (plan.working_set_bytes + 1024);
  const int64_t by_regs = hw.regs_per_sm > 0 ? hw.regs_per_sm / (threads * 255) : 2048 / threads;
  plan.ctas_per_sm = int(std::max<int64_t>(1, std::min({by_smem, 2048 / threads, by_regs})));
  const int64_t tasks = g.problem.batch * g.problem.heads_q * ((g.problem.seqlen_q + plan.block_q - 1) / plan.block_q);
  plan.work_items = tasks * plan.kv_splits;
  plan.workers = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(hw.cores) * plan.ctas_per_sm, plan.work_items)));
  return plan;
}

// The model's passes for the point: PyTorch MATH's, with the GEMM tiles the sample ran where it
// names them; the CUDA kernel's plan otherwise.
inline StandardPasses passes_for_point(const GpuPoint& g) {
  StandardPasses sp = pytorch_math_passes(g.problem.causal);
  if (g.qk_tile[0] > 0) {
    sp.qk_tile_q = g.qk_tile[0];
    sp.qk_tile_k = g.qk_tile[1];
  }
  if (g.pv_tile[0] > 0) {
    sp.pv_tile_q = g.pv_tile[0];
    sp.pv_tile_d = g.pv_tile[1];
  }
  return sp;
}

inline TrafficReport predict_point(const GpuPoint& g, const HardwareProfile& hw) {
  const Plan plan = plan_for_point(g, hw);
  return g.impl == "math" ? predict_traffic(g.problem, plan, hw, passes_for_point(g))
                          : predict_traffic(g.problem, plan, hw);
}

// The model's figures for one point, for the implementation it measured (flash for ioattn's
// kernel, standard for MATH), from one run of the model.
struct PointPrediction {
  double hbm = 0;            // L2-HBM bytes
  double smem_l2 = 0;        // smem-L2 bytes: what the SMs request, reads and writes
  double smem_l2_reads = 0;  // the sectors its tiles (or MATH's passes) read
  double lookups = 0;        // L2 lookups (lts__t_bytes)
  double fabric = 0;         // of those, forwarded between partitions (srcunit_ltcfabric)
};

inline PointPrediction predict_for_point(const GpuPoint& g, const HardwareProfile& hw) {
  const TrafficReport rep = predict_point(g, hw);
  const BoundaryTraffic &inner = rep.levels.front(), &hbm = rep.levels.back();
  if (g.impl == "math")
    return {hbm.standard_bytes, inner.standard_bytes, inner.standard_read_bytes, rep.standard_l2_lookup_bytes,
            rep.standard_l2_fabric_bytes};
  return {hbm.flash_bytes, inner.flash_bytes, inner.flash_read_bytes, rep.flash_l2_lookup_bytes,
          rep.flash_l2_fabric_bytes};
}

// HBM bytes always; L2 lookups (lts__t_bytes, every byte the L2 slices look up: docs/traffic.md)
// where the sample measured them.
inline std::vector<Comparison> compare_gpu(const GpuPoint& g, const PointPrediction& pp) {
  std::vector<Comparison> c = {{"L2-HBM", pp.hbm, g.dram_read + g.dram_write}};
  if (g.l2_bytes >= 0) c.push_back({"L2 lookups", pp.lookups, g.l2_bytes});
  return c;
}

// The L2 lookups of a SPLIT=1 sample by source and operation, and what the SMs' L1TEX sent and
// received, in bytes (sectors x 32). `requested`: the tiles' sectors the model counts as smem-L2
// reads, for the ratios docs/traffic.md quotes.
struct L2Split {
  double total = 0;                                                       // lts__t_sectors
  double tex = 0, tex_read = 0, tex_write = 0, tex_miss = 0;              // srcunit_tex: the SMs
  double fabric = 0, fabric_read = 0, fabric_write = 0, fabric_miss = 0;  // srcunit_ltcfabric
  double xbar_read = 0, xbar_write = 0;  // l1tex__m_xbar2l1tex_read / l1tex2xbar_write sectors
  double l1_ld = 0, l1_st = 0;           // l1tex__t_sectors_pipe_lsu_mem_global_op_ld / _st
};

inline bool l2_split(const GpuPoint& g, L2Split* s) {
  const std::pair<const char*, double*> fields[] = {
      {"lts__t_sectors.sum", &s->total},
      {"lts__t_sectors_srcunit_tex.sum", &s->tex},
      {"lts__t_sectors_srcunit_tex_op_read.sum", &s->tex_read},
      {"lts__t_sectors_srcunit_tex_op_write.sum", &s->tex_write},
      {"lts__t_sectors_srcunit_tex_lookup_miss.sum", &s->tex_miss},
      {"lts__t_sectors_srcunit_ltcfabric.sum", &s->fabric},
      {"lts__t_sectors_srcunit_ltcfabric_op_read.sum", &s->fabric_read},
      {"lts__t_sectors_srcunit_ltcfabric_op_write.sum", &s->fabric_write},
      {"lts__t_sectors_srcunit_ltcfabric_lookup_miss.sum", &s->fabric_miss},
      {"l1tex__m_xbar2l1tex_read_sectors.sum", &s->xbar_read},
      {"l1tex__m_l1tex2xbar_write_sectors.sum", &s->xbar_write},
      {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum", &s->l1_ld},
      {"l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", &s->l1_st}};
  for (const auto& [name, dst] : fields) {
    const auto it = g.metrics.find(name);
    if (it == g.metrics.end()) return false;
    *dst = 32 * it->second;
  }
  return true;
}

inline bool load_gpu_points(const std::string& dir, std::vector<GpuPoint>* out, std::string* error) {
  const std::vector<std::string> files = list_files(dir, ".txt");
  if (files.empty()) {
    *error = "no Nsight Compute samples (*.txt) in " + dir;
    return false;
  }
  for (const std::string& f : files) {
    std::string text;
    GpuPoint g;
    if (!read_text(f, &text) || !parse_gpu_sample(f, text, &g, error)) return false;
    out->push_back(g);
  }
  return true;
}

// A SPLIT=1 sample's lookups by source against the model's: from the SMs (srcunit_tex) and
// through the fabric (srcunit_ltcfabric). Empty when the sample has no split.
inline std::vector<Comparison> compare_split(const GpuPoint& g, const PointPrediction& pp) {
  L2Split m;
  if (!l2_split(g, &m)) return {};
  return {{"L2 from SMs", pp.lookups - pp.fabric, m.tex}, {"L2 fabric", pp.fabric, m.fabric}};
}

// The SPLIT=1 recordings, one subdirectory of gpu/ each (split-DATE): points of the grid measured
// again with the per-source counters, held to the bar as the grid's are.
inline bool load_split_points(const std::string& gpu_dir, std::vector<GpuPoint>* out, std::string* error) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(gpu_dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind("split-", 0) == 0) dirs.push_back(e.path().string());
  std::sort(dirs.begin(), dirs.end());
  for (const std::string& d : dirs)
    if (!load_gpu_points(d, out, error)) return false;
  return true;
}

}  // namespace ioattn::measured
