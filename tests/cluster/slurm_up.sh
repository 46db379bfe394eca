#!/usr/bin/env bash
# Bring up a real single-node SLURM on this machine, as root, without systemd:
# munged, mariadb + slurmdbd (so `sacct` works), slurmctld, slurmd, with two fake GPUs as GRES.
# Every daemon runs from the state dir with its own pid file; slurm_down.sh stops exactly those.
# Needs the Debian packages: munge slurmctld slurmd slurm-client slurmdbd mariadb-server.
set -euo pipefail
STATE=${EYAS_SLURM_DIR:-/tmp/eyas-slurm}       # short: the munge socket path must stay < 108 chars
DB_PORT=${EYAS_SLURM_DB_PORT:-13306}
HERE=$(cd "$(dirname "$0")" && pwd)
HOST=$(hostname -s)
MUNGE_SOCK=$STATE/munge/munge.socket.2
start=$(date +%s)

[[ $(id -u) == 0 ]] || { echo "slurm_up.sh: must run as root" >&2; exit 1; }
for cmd in munged mariadbd mariadb-install-db slurmdbd slurmctld slurmd sbatch sacctmgr; do
  command -v "$cmd" >/dev/null || { echo "slurm_up.sh: $cmd not found (apt-get install munge slurmctld slurmd slurm-client slurmdbd mariadb-server)" >&2; exit 1; }
done
# The executor plugin's job step drops SLURM_CONF, so clients must find the config at the default path.
if [[ -e /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) != "$STATE/etc/slurm.conf" ]]; then
  echo "slurm_up.sh: /etc/slurm/slurm.conf exists and is not ours; refusing to replace it" >&2; exit 1
fi
"$HERE/slurm_down.sh" >/dev/null 2>&1 || true   # a previous run of ours that was not stopped
rm -rf "$STATE"
mkdir -p "$STATE"/{etc,run,log,ctld,d,dev,munge,db}
chmod 755 "$STATE" "$STATE/munge"

# munge: our own key and socket, beside (not instead of) any system munged.
dd if=/dev/urandom of="$STATE/etc/munge.key" bs=1024 count=1 status=none
chmod 400 "$STATE/etc/munge.key"
munged --force --socket="$MUNGE_SOCK" --key-file="$STATE/etc/munge.key" --pid-file="$STATE/run/munged.pid" \
  --log-file="$STATE/log/munged.log" --seed-file="$STATE/run/munged.seed"

# mariadb for slurmdbd: a private datadir on a private port.
mariadb-install-db --no-defaults --datadir="$STATE/db" --user=root --auth-root-authentication-method=socket \
  --skip-test-db >"$STATE/log/mariadb-install.log" 2>&1
mariadbd --no-defaults --datadir="$STATE/db" --socket="$STATE/run/mariadb.sock" --port="$DB_PORT" \
  --bind-address=127.0.0.1 --pid-file="$STATE/run/mariadbd.pid" --user=root \
  --log-error="$STATE/log/mariadb.log" >/dev/null 2>&1 &
for _ in $(seq 60); do [[ -S $STATE/run/mariadb.sock ]] && break; sleep 0.5; done
mariadb --no-defaults -S "$STATE/run/mariadb.sock" -u root -e "
  CREATE USER 'slurm'@'localhost' IDENTIFIED BY 'eyas'; CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'eyas';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

# Two fake GPUs: GRES needs a device file per GPU; any character device will do.
for i in 0 1; do mknod "$STATE/dev/nvidia$i" c 1 3; done
node=$(slurmd -C | head -1)   # NodeName=... CPUs=... RealMemory=... as this machine reports them
cat >"$STATE/etc/slurm.conf" <<CONF
ClusterName=eyas
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# keep finished jobs visible to squeue long enough for the executor's status checks
MinJobAge=600
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
# slurmdbd's munge socket (the dbd connection authenticates through it, not through AuthInfo)
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/none
$node NodeAddr=127.0.0.1 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$STATE/etc/gres.conf" <<CONF
AutoDetect=off
NodeName=$HOST Name=gpu File=$STATE/dev/nvidia[0-1]
CONF
cat >"$STATE/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=eyas
StorageLoc=slurm_acct_db
CONF
chmod 600 "$STATE/etc/slurmdbd.conf"
mkdir -p /etc/slurm
ln -sfn "$STATE/etc/slurm.conf" /etc/slurm/slurm.conf
export SLURM_CONF=$STATE/etc/slurm.conf   # daemons find gres.conf and slurmdbd.conf beside it

slurmdbd
for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
sacctmgr -i add cluster eyas >/dev/null
sacctmgr -i add account eyas Description=eyas-ci Organization=eyas >/dev/null
sacctmgr -i add user root Account=eyas >/dev/null
slurmctld
slurmd
for _ in $(seq 120); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -1)
  [[ $state == idle ]] && break
  sleep 0.5
done
if [[ $state != idle ]]; then
  echo "slurm_up.sh: node state '${state:-none}' after 60 s; logs in $STATE/log" >&2
  tail -n 20 "$STATE"/log/slurm*.log >&2
  exit 1
fi
echo "slurm_up.sh: SLURM up in $(( $(date +%s) - start )) s: $(sinfo -h -N -o '%N %c CPUs %m MB %G %T')"
