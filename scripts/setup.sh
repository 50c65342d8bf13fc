#!/usr/bin/env bash
# Installs the Debian packages ncf_dist builds and tests with, and any package named on
# the command line (a benchmark's extras).
# Idempotent: prints nothing and touches nothing when every package is already present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev
  libprotobuf-dev protobuf-compiler
  libopenblas-dev
  libdnnl-dev  # oneDNN: the tower's CPU matrix products (src/model/cpu_matmul.h)
  libgtest-dev
  libcli11-dev
  zlib1g-dev
  nlohmann-json3-dev
  libonnx-dev
  python3 python3-matplotlib python3-numpy
  # tests/tfmg/make_tfmg.py: TF Model Garden shards (protobuf runtime, CRC-32C)
  python3-protobuf python3-crcmod
  # bench/pytorch_variants.py's CPU tests (tests/CMakeLists.txt) and the PyTorch baselines
  # (bench/pytorch_neumf.py): Debian's torch 1.13 for /usr/bin/python3. Installing it on the
  # 2-core development machine, busy with a build, took 315 s (apt-get with recommends: 200
  # packages, 77 MB downloaded; this script skips recommends)
  python3-torch
)
# The export test runs ONNX Runtime under Node (tests/onnx/install.sh): Debian's
# Node and npm unless the machine has its own.
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
