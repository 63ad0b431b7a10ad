#!/bin/bash
# cookbook doctor probe: one task per node, each writes node-<hostname>.txt (key=value lines) into the probe folder.
# Contains no secrets: only presence checks.
set -u
dir="$1"; marker="$2"; shift 2
host=$(hostname)
gpus=-1; gpu_names=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_names=$(nvidia-smi -L 2>/dev/null | tr '\n' ';'); gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
libs=$(ldconfig -p 2>/dev/null)
nccl=$(echo "$libs" | grep -o 'libnccl\.so[.0-9]*' | head -1)
[ -z "$nccl" ] && nccl=$(find "$PYTHON_SITE/nvidia/nccl/lib" -maxdepth 1 -name 'libnccl.so*' 2>/dev/null | sort | head -1)
efa=$(echo "$libs" | grep -o 'libfabric\.so[.0-9]*' | head -1)
[ -d /opt/amazon/efa ] && efa="$efa /opt/amazon/efa"
efa_dev=$(find /dev/infiniband -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort | tr '\n' ' ')
seen=$(cat "$marker" 2>/dev/null || echo "")
python_ok=no; [ -x "$PYTHON_EXE" ] && python_ok=yes
# the venv's own answer (standard library, nothing imported): machine and the pinned packages' versions; an
# "Exec format error" here is a venv built for another architecture (an x86 login node, aarch64 GB200 nodes)
# shellcheck disable=SC2086  # PYTHON_NEEDS: one word per package
pyenv=$("$PYTHON_EXE" -m cookbook_runtime.pyenv $PYTHON_NEEDS 2>&1 | tail -n 1 | tr -d '\n')
nccl_net=$( (echo "$libs"; ls /opt/amazon/ofi-nccl/lib /opt/aws-ofi-nccl/lib 2>/dev/null) | grep -o 'libnccl-net[^ ]*\.so[.0-9]*' | head -1)
{
  echo "host=$host"; echo "gpus=$gpus"; echo "gpu_names=$gpu_names"; echo "nccl=$nccl"
  echo "efa=$efa"; echo "efa_devices=$efa_dev"; echo "marker=$seen"; echo "python=$python_ok"
  echo "pyenv=$pyenv"; echo "nccl_net=$nccl_net"
  for p in "$@"; do
    q="$p"; while [ ! -e "$q" ]; do q=$(dirname "$q"); done
    echo "disk_kib:$p=$(df -Pk "$q" | awk 'NR==2{print $4}')"
  done
} > "$dir/node-$host.txt"
