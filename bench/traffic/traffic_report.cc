// The measured-against-predicted report (docs/traffic.md): reads the recorded samples in
// bench/traffic/samples, pairs each with predict_traffic for the same shape, plan and hierarchy,
// and prints markdown tables; with --csv-dir also writes the CSV files plot_traffic.py draws.
//
//   traffic_report [--samples DIR] [--csv-dir DIR]
//
// Exit status 1 when any point misses the ±15% bar, 2 on unreadable samples.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/traffic_samples.h"

namespace {

using namespace ioattn;
using namespace ioattn::measured;

constexpr double kBar = 0.15;

std::string mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / 1e6);
  return buf;
}

std::string pct(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * e);
  return buf;
}

// One of --csv-dir's files, its header row written; without --csv-dir a stream that is not open.
std::ofstream open_csv(const std::string& dir, const std::string& name, const char* header) {
  std::ofstream f;
  if (!dir.empty()) {
    f.open(dir + "/" + name);
    f << header;
  }
  return f;
}

// A markdown table's header row and its separator, which then always has one cell per column.
void print_table_head(const std::vector<std::string>& columns) {
  std::string head = "|", rule = "|";
  for (const std::string& c : columns) {
    head += " " + c + " |";
    rule += "---|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string samples = "bench/traffic/samples", csv_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if ((f == "--samples" || f == "--csv-dir") && i + 1 < argc) {
      (f == "--samples" ? samples : csv_dir) = argv[++i];
    } else {
      std::fprintf(stderr, "traffic_report: unknown flag '%s'\nusage: traffic_report [--samples DIR] [--csv-dir DIR]\n",
                   f.c_str());
      return 2;
    }
  }
  std::string error;
  const auto unreadable = [&error] {
    std::fprintf(stderr, "traffic_report: %s\n", error.c_str());
    return 2;
  };
  std::vector<CpuPoint> cpu;
  if (!load_cpu_points(samples + "/cpu", &cpu, &error)) return unreadable();
  int misses = 0;
  std::ofstream csv =
      open_csv(csv_dir, "cpu_measured.csv", "point,kernel,seqlen,dim,causal,boundary,predicted_bytes,measured_bytes\n");
  std::printf("## CPU: cachegrind (D1 %lld KiB, LL %lld KiB, 1 thread) against predict_traffic\n\n",
              cpu.empty() ? 0LL : (long long)cpu[0].l1_bytes / 1024,
              cpu.empty() ? 0LL : (long long)cpu[0].l2_bytes / 1024);
  print_table_head(
      {"point", "plan (bq x bkv)", "L1d-L2 pred MB", "meas MB", "err", "L2-beyond pred MB", "meas MB", "err"});
  for (const CpuPoint& p : cpu) {
    const std::vector<Comparison> c = compare_cpu(p);
    std::printf("| %s | %dx%d | %s | %s | %s | %s | %s | %s |\n", p.name.c_str(), p.plan.block_q, p.plan.block_kv,
                mb(c[0].predicted).c_str(), mb(c[0].measured).c_str(), pct(c[0].error()).c_str(),
                mb(c[1].predicted).c_str(), mb(c[1].measured).c_str(), pct(c[1].error()).c_str());
    for (const Comparison& x : c) {
      misses += std::fabs(x.error()) > kBar;
      if (csv.is_open())
        csv << p.name << ',' << p.kernel << ',' << p.problem.seqlen_q << ',' << p.problem.head_dim << ','
            << int(p.problem.causal) << ',' << x.boundary << ',' << x.predicted << ',' << x.measured << '\n';
    }
  }

  std::vector<GpuPoint> gpu;
  if (!load_gpu_points(samples + "/gpu", &gpu, &error)) return unreadable();
  HardwareProfile h200;
  if (!find_profile("h200-sxm", &h200, &error)) return unreadable();
  std::ofstream gcsv =
      open_csv(csv_dir, "gpu_measured.csv", "point,impl,seqlen,dim,causal,boundary,predicted_bytes,measured_bytes\n");
  std::printf("\n## GPU: Nsight Compute on the H200 against predict_traffic --hw h200-sxm\n\n");
  print_table_head({"point", "HBM read MB", "HBM write MB", "predicted L2-HBM MB", "measured MB", "err",
                    "lts__t_bytes MB", "predicted smem-L2 MB", "predicted L2 lookups MB", "err"});
  for (const GpuPoint& g : gpu) {
    const PointPrediction pp = predict_for_point(g, h200);
    const std::vector<Comparison> c = compare_gpu(g, pp);
    const bool lookups = c.size() > 1;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", g.name.c_str(), mb(g.dram_read).c_str(),
                mb(g.dram_write).c_str(), mb(c[0].predicted).c_str(), mb(c[0].measured).c_str(),
                pct(c[0].error()).c_str(), lookups ? mb(c[1].measured).c_str() : "-", mb(pp.smem_l2).c_str(),
                lookups ? mb(c[1].predicted).c_str() : "-", lookups ? pct(c[1].error()).c_str() : "-");
    for (const Comparison& x : c) {
      misses += std::fabs(x.error()) > kBar;
      if (gcsv.is_open())
        gcsv << g.name << ',' << g.impl << ',' << g.problem.seqlen_q << ',' << g.problem.head_dim << ','
             << int(g.problem.causal) << ',' << x.boundary << ',' << x.predicted << ',' << x.measured << '\n';
    }
  }

  // The SPLIT=1 recordings: the same points measured again with the lookups by source, held to the
  // bar on lts__t_bytes as the grid is, and shown by source against the model's split.
  std::vector<GpuPoint> split;
  if (!load_split_points(samples + "/gpu", &split, &error)) return unreadable();
  if (!split.empty()) {
    std::printf(
        "\n## GPU: L2 lookups by source (gpu_ncu.sh SPLIT=1), against the model's split\n\n"
        "requested: the model's smem-L2 reads; SMs: lts__t_sectors_srcunit_tex, fabric: "
        "srcunit_ltcfabric (x 32 bytes); xbar read, L1 ld: l1tex__m_xbar2l1tex_read_sectors and "
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld over requested; SM writes: srcunit_tex_op_write, "
        "global st: l1tex__t_sectors_pipe_lsu_mem_global_op_st.\n\n");
    print_table_head({"point", "L2-HBM err", "lts__t_bytes MB", "predicted MB", "err", "requested MB", "SMs MB",
                      "predicted", "err", "SM reads MB", "xbar read / req", "L1 ld / req", "SM writes MB",
                      "global st MB", "fabric MB (read + write)", "predicted", "err"});
  }
  for (const GpuPoint& g : split) {
    const PointPrediction pp = predict_for_point(g, h200);
    const std::vector<Comparison> c = compare_gpu(g, pp);
    L2Split m;
    const bool by_source = l2_split(g, &m);
    const std::vector<Comparison> by = compare_split(g, pp);
    const double req = pp.smem_l2_reads, fabric = pp.fabric;
    const double lookups = c.size() > 1 ? c[1].predicted : 0, measured = c.size() > 1 ? c[1].measured : 0;
    char ratios[64] = "-";
    if (by_source) std::snprintf(ratios, sizeof ratios, "%.3f | %.3f", m.xbar_read / req, m.l1_ld / req);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s + %s) | %s | %s |\n",
                g.name.c_str(), pct(c[0].error()).c_str(), mb(measured).c_str(), mb(lookups).c_str(),
                c.size() > 1 ? pct(c[1].error()).c_str() : "-", mb(req).c_str(), by_source ? mb(m.tex).c_str() : "-",
                mb(lookups - fabric).c_str(), by_source ? pct(by[0].error()).c_str() : "-",
                by_source ? mb(m.tex_read).c_str() : "-", by_source ? ratios : "- | -",
                by_source ? mb(m.tex_write).c_str() : "-", by_source ? mb(m.l1_st).c_str() : "-",
                by_source ? mb(m.fabric).c_str() : "-", by_source ? mb(m.fabric_read).c_str() : "-",
                by_source ? mb(m.fabric_write).c_str() : "-", mb(fabric).c_str(),
                by_source ? pct(by[1].error()).c_str() : "-");
    // The totals are held; the split is shown (its misses are docs/traffic.md's, asserted by
    // tests/test_traffic_measured.cc).
    for (const Comparison& x : c) misses += std::fabs(x.error()) > kBar;
  }
  std::printf("\n%d comparison(s) outside ±%.0f%%\n", misses, 100 * kBar);

  // Predicted saving of flash over standard attention (the textbook baseline: S written and read
  // twice in fp32) per boundary on every built-in profile, and the roofline time each implies.
  Problem pr;
  pr.heads_q = pr.heads_kv = 16;
  pr.seqlen_q = pr.seqlen_k = 4096;
  pr.head_dim = pr.head_dim_v = 128;
  std::ofstream scsv =
      open_csv(csv_dir, "savings.csv",
               "profile,kind,boundary,flash_bytes,standard_bytes,flash_roofline_s,standard_roofline_s\n");
  std::printf(
      "\n## Predicted flash vs standard, B=1 H=16 S=4096 D=128 (CPU fp32, GPU bf16), every built-in profile\n\n");
  print_table_head({"profile", "boundary", "flash MB", "standard MB", "standard / flash", "roofline flash ms",
                    "roofline standard ms"});
  for (const HardwareProfile& hw : builtin_profiles()) {
    Problem p = pr;
    p.dtype = p.kv_dtype = hw.kind == DeviceKind::gpu ? DType::bf16 : DType::f32;
    const TrafficReport r = predict_traffic(p, plan_for(p, hw), hw);
    for (size_t i = 0; i < r.levels.size(); ++i) {
      const BoundaryTraffic& b = r.levels[i];
      const bool last = i + 1 == r.levels.size();
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.1fx", b.flash_bytes > 0 ? b.standard_bytes / b.flash_bytes : 0.0);
      char tf[32] = "", ts[32] = "";
      if (last) {
        std::snprintf(tf, sizeof tf, "%.3f", r.flash_roofline_s * 1e3);
        std::snprintf(ts, sizeof ts, "%.3f", r.standard_roofline_s * 1e3);
      }
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", i == 0 ? hw.name.c_str() : "", b.name.c_str(),
                  mb(b.flash_bytes).c_str(), mb(b.standard_bytes).c_str(), ratio, tf, ts);
      if (scsv.is_open())
        scsv << hw.name << ',' << (hw.kind == DeviceKind::gpu ? "gpu" : "cpu") << ',' << b.name << ',' << b.flash_bytes
             << ',' << b.standard_bytes << ',' << r.flash_roofline_s << ',' << r.standard_roofline_s << '\n';
    }
  }
  return misses == 0 ? 0 : 1;
}
