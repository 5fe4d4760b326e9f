#!/usr/bin/env bash
# Regenerates bench/results/traffic-report.md and the two figures from the recorded samples.
#   bench/traffic/make_report.sh BUILD_DIR    (needs traffic_report built; python3-matplotlib)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: make_report.sh BUILD_DIR}" && pwd)
csv=$(mktemp -d)
cd "$root"
"$build/bench/traffic/traffic_report" --samples bench/traffic/samples --csv-dir "$csv" >bench/results/traffic-report.md
rc=$?
python3 bench/traffic/plot_traffic.py "$csv" bench/results || rc=2
rm -rf "$csv"
echo "bench/results/traffic-report.md, traffic-measured.png, traffic-savings.png (traffic_report exit $rc: 1 = some points outside ±15%)"
