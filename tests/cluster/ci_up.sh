#!/usr/bin/env bash
# CI: install the Debian packages a real SLURM needs (if missing), then bring the cluster up.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
packages=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null
  # any services the packages start do not collide with ours (own sockets, ports, state dir)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${packages[@]}" >/dev/null
  echo "ci_up.sh: installed ${packages[*]} in $(( $(date +%s) - start )) s"
fi
"$HERE/slurm_up.sh"
