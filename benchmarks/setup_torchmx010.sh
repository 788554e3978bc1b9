#!/usr/bin/env bash
# A separate environment with torchmx 0.1.0 (it pins torchao==0.6.1), for the benchmarks'
# side-by-side baseline. Usage: bash benchmarks/setup_torchmx010.sh [DIR] (default /tmp/torchmx010)
set -euo pipefail
dir="${1:-/tmp/torchmx010}"
python3 -m venv "$dir"
"$dir/bin/pip" install -q torch==2.13.0 numpy
"$dir/bin/pip" install -q --no-deps torchao==0.6.1 torchmx==0.1.0
echo "$dir/bin/python"
