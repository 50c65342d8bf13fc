#!/usr/bin/env bash
# Installs what the Slurm tests and the simulated cluster (tests/cluster/) need:
# Debian's Slurm daemons, client and munge, and iproute2 (ip, tc); quiet when
# they are present. Separate from scripts/setup.sh: training needs none of them.
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "tests/slurm/setup.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start their daemons with the system's configuration; the test
# runs its own, so stop those (a container without systemd has none running).
for s in slurmctld slurmd munge; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$s" 2>/dev/null; then
    systemctl stop "$s" || true
  fi
done
