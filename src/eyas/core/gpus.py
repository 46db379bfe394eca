"""GPU slots for local runs: each GPU job gets devices of its own.

Local Snakemake counts a `gpu` resource but never says which device a job should use (it is a plain counted
resource), so two GPU jobs would both land on device 0. A job calls `claim_gpus(n)` before it touches CUDA:
it takes an exclusive `flock` on one lock file per device among the devices visible to it, and narrows
`CUDA_VISIBLE_DEVICES` to the ones it holds. The kernel drops a lock when its process ends, however it ends,
so a killed job frees its slot. Under SLURM the visible devices are the job's own allocation (GRES sets
`CUDA_VISIBLE_DEVICES`) and the lock directory is per SLURM job, so jobs never contend across allocations
but several jobs of one interactive allocation (`salloc`) still share it fairly.

`profiles/default/` caps concurrent GPU jobs at `len(visible_gpus())` for local runs (`local_run()`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import time
from pathlib import Path

_HELD: list[int] = []  # lock file descriptors held for the life of this process


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The device ids this process may use: `CUDA_VISIBLE_DEVICES` if set, else the NVIDIA devices present."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = []
        for item in environ["CUDA_VISIBLE_DEVICES"].split(","):
            item = item.strip()
            if not item or item.startswith("-"):  # CUDA stops at the first invalid entry ("-1" = none)
                break
            ids.append(item)
        return ids
    proc = Path("/proc/driver/nvidia/gpus")  # one directory per GPU while the NVIDIA driver is loaded
    if proc.is_dir():
        return [str(i) for i in range(len(list(proc.iterdir())))]
    devices = [p.name for p in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)]
    return [str(i) for i in range(len(devices))]


def local_run(argv: list[str] | None = None) -> bool:
    """True when this snakemake command runs jobs on this machine (no `--executor`/`--profile` given).

    The local GPU cap in `profiles/default/` must not apply to a cluster run: a login node's GPU count
    says nothing about the cluster's.
    """
    argv = sys.argv if argv is None else argv
    flags = ("--executor", "-e", "--profile")
    return not any(a in flags or a.startswith(tuple(f + "=" for f in flags)) for a in argv)


def lock_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the slot locks live: `$EYAS_GPU_LOCK_DIR`, else /tmp/eyas-gpu-locks[/slurm-<job id>]."""
    environ = os.environ if environ is None else environ
    base = Path(environ.get("EYAS_GPU_LOCK_DIR", "/tmp/eyas-gpu-locks"))
    job = environ.get("SLURM_JOB_ID")
    return base / f"slurm-{job}" if job else base


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking at a stuck run
    return fd


def claim_gpus(
    n: int,
    *,
    timeout: float | None = None,
    poll: float = 1.0,
    log: logging.Logger | None = None,
) -> list[str]:
    """Take `n` free GPUs for this process and set `CUDA_VISIBLE_DEVICES` to them; [] when n == 0.

    Waits (polling every `poll` s; `timeout` None = forever) while fewer than `n` are free; holds nothing
    while waiting, so two waiting jobs cannot deadlock. Call before CUDA is initialised.
    """
    if n <= 0:
        return []
    devices = visible_gpus()
    if n > len(devices):
        raise RuntimeError(
            f"this job asks for {n} GPU(s) (resource gpu={n}) but {len(devices)} are visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
            "set the stage's device to cpu or run where GPUs are present"
        )
    directory = lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    start, waited = time.monotonic(), False
    while True:
        held: list[tuple[str, int]] = []
        for device in devices:
            fd = _try_lock(directory / f"gpu-{device}.lock")
            if fd is not None:
                held.append((device, fd))
                if len(held) == n:
                    break
        if len(held) == n:
            _HELD.extend(fd for _, fd in held)
            claimed = [device for device, _ in held]
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(claimed)
            if log:
                log.info("GPU slot(s) %s of %s (locks in %s)", claimed, devices, directory)
            return claimed
        for _, fd in held:
            os.close(fd)
        if timeout is not None and time.monotonic() - start >= timeout:
            raise TimeoutError(f"no {n} free GPU(s) among {devices} after {timeout} s (locks in {directory})")
        if log and not waited:
            log.info("waiting for %d free GPU(s) among %s (locks in %s)", n, devices, directory)
            waited = True
        time.sleep(poll)
