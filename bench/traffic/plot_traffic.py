"""Plots for docs/traffic.md from the CSV files `traffic_report --csv-dir DIR` writes:
predicted against measured bytes (CPU cachegrind, H200 Nsight Compute), and the predicted saving
of flash over standard attention per boundary and the roofline time on every built-in profile.

    python3 bench/traffic/plot_traffic.py CSV_DIR OUT_DIR
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def scatter(ax, data, group_key, title):
    groups = defaultdict(list)
    for r in data:
        groups[(r[group_key], r["boundary"])].append((float(r["measured_bytes"]), float(r["predicted_bytes"])))
    lo = min(min(m, p) for pts in groups.values() for m, p in pts) / 1.5
    hi = max(max(m, p) for pts in groups.values() for m, p in pts) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=0.8)
    ax.fill_between(xs, [x * 0.85 for x in xs], [x * 1.15 for x in xs], color="grey", alpha=0.2, label="±15%")
    markers = "osD^v<>px"
    for i, ((kind, boundary), pts) in enumerate(sorted(groups.items())):
        ax.scatter([m for m, _ in pts], [p for _, p in pts], s=18, marker=markers[i % len(markers)],
                   label=f"{kind} {boundary}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured bytes")
    ax.set_ylabel("predicted bytes")
    ax.set_title(title)
    ax.legend(fontsize=7)


def main():
    csv_dir, out = sys.argv[1], sys.argv[2]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    scatter(axes[0], rows(f"{csv_dir}/cpu_measured.csv"), "kernel",
            "CPU: cachegrind fills (L1d 32 KiB, LL 512 KiB, 1 thread)")
    scatter(axes[1], rows(f"{csv_dir}/gpu_measured.csv"), "impl", "H200: Nsight Compute DRAM bytes and L2 lookups")
    fig.tight_layout()
    fig.savefig(f"{out}/traffic-measured.png", dpi=110)

    sav = rows(f"{csv_dir}/savings.csv")
    profiles = list(dict.fromkeys(r["profile"] for r in sav))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    ax = axes[0]
    width = 0.25
    for j, pos in enumerate(("inner", "middle", "off-chip")):
        vals, names = [], []
        for p in profiles:
            bs = [r for r in sav if r["profile"] == p]
            pick = {"inner": bs[0], "off-chip": bs[-1], "middle": bs[1] if len(bs) == 3 else None}[pos]
            vals.append(float(pick["standard_bytes"]) / float(pick["flash_bytes"]) if pick else 0)
            names.append(pick["boundary"] if pick else "")
        ax.bar([i + (j - 1) * width for i in range(len(profiles))], vals, width, label=pos + " boundary")
    ax.axhline(1, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(profiles)))
    ax.set_xticklabels(profiles, rotation=45, ha="right")
    ax.set_ylabel("standard bytes / flash bytes (predicted)")
    ax.set_title("Saving per boundary, B=1 H=16 S=4096 D=128")
    ax.legend(fontsize=8)
    ax = axes[1]
    last = {}
    for r in sav:
        last[r["profile"]] = r
    ax.bar([i - 0.2 for i in range(len(profiles))], [float(last[p]["flash_roofline_s"]) * 1e3 for p in profiles], 0.4,
           label="flash")
    ax.bar([i + 0.2 for i in range(len(profiles))], [float(last[p]["standard_roofline_s"]) * 1e3 for p in profiles],
           0.4, label="standard")
    ax.set_yscale("log")
    ax.set_xticks(range(len(profiles)))
    ax.set_xticklabels(profiles, rotation=45, ha="right")
    ax.set_ylabel("roofline time, ms")
    ax.set_title("max(FLOPs / peak, off-chip bytes / bandwidth)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(f"{out}/traffic-savings.png", dpi=110)


if __name__ == "__main__":
    main()
