#!/usr/bin/env bash
# Stop the daemons slurm_up.sh started, by their pid files (nothing else), and remove our config link.
set -uo pipefail
STATE=${EYAS_SLURM_DIR:-/tmp/eyas-slurm}
stop() {  # stop NAME: the pid in $STATE/run/NAME.pid, only if that process is NAME
  local pidfile=$STATE/run/$1.pid pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "$1" ]]; then
    kill "$pid"
    for _ in $(seq 50); do [[ -e /proc/$pid ]] || break; sleep 0.2; done
    [[ -e /proc/$pid ]] && kill -9 "$pid"
  fi
  rm -f "$pidfile"
}
for name in slurmd slurmctld slurmdbd mariadbd munged; do stop "$name"; done
if [[ $(readlink /etc/slurm/slurm.conf 2>/dev/null) == "$STATE/etc/slurm.conf" ]]; then
  rm -f /etc/slurm/slurm.conf
fi
echo "slurm_down.sh: stopped"
