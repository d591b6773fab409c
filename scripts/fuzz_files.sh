#!/bin/sh
# Long coverage-guided runs of both model-file targets (atheris). Crashers land in the printed work
# directories; keep each as a seed mutation in tests/fuzz/seeds.py's CRASHER_GGUFS (the repository tracks no
# model files) or in tests/data/fuzz/hf_config/ (the JSON `fuzz_hf_config.py --show FILE` prints).
#   scripts/fuzz_files.sh [SECONDS_EACH]   (default 600)
set -e
seconds=${1:-600}
here=$(dirname "$0")/..
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}"
python "$here/tests/fuzz/fuzz_gguf.py" -max_total_time="$seconds" -seed=1
python "$here/tests/fuzz/fuzz_hf_config.py" -max_total_time="$seconds" -seed=1
