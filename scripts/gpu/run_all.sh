#!/bin/sh
# Real-GPU proof of the isolation shim. Run from the repository root on a machine with an NVIDIA GPU and
# driver (PyTorch optional: without it the torch checks are skipped and the PTX/driver-API checks still run).
#   sh scripts/gpu/run_all.sh          results: $OUT (or /tmp/gpushare-gpu)/*.jsonl and summary.txt
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpushare-gpu}"
export OUT
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
make native >"$OUT/build.log" 2>&1 || { echo "build failed: see $OUT/build.log"; exit 1; }
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
status=0
for script in driver_checks.py runtime_devices.py lifetime_checks.py context_charge.py spin_share.py share_containers.py nvml_samples.py torch_oom.py torch_matmul_share.py; do
    echo "== $script"
    # One check that hangs (a wedged context, a kernel that never ends) must not eat the others' time.
    timeout "${GPU_CHECK_TIMEOUT_S:-180}" "$PY" "scripts/gpu/$script"
    rc=$?
    [ $rc -eq 124 ] && echo "FAIL $script did not finish within ${GPU_CHECK_TIMEOUT_S:-180} s"
    [ $rc -eq 1 ] && status=1
done 2>&1 | tee "$OUT/summary.txt"
grep -q '^FAIL' "$OUT/summary.txt" && status=1
exit $status
