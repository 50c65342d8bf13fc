#!/usr/bin/env bash
# Installs the Debian packages ncf_dist builds and tests with, and any package named on
# the command line (the tests' and benchmarks' extras, e.g. python3-torch).
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
