"""Shared pieces of the fault tests: the extraction setup and a child process paused at a named point."""

from __future__ import annotations

LAYER_IDS = [0, 1, 2]


def random_store_rows(storage: str, tokens: int, taps: int, hidden: int):
    """aux [T, K*H], final [T, H] as stored (bits) and scale [T, K+1] (fp8) or None, of random states
    spread over four decades across the hidden dimension."""
    import torch

    from eyas.store import bf16_to_uint16
    from eyas.store.quant import fp8_quantize

    states = torch.randn(tokens, taps + 1, hidden) * torch.logspace(-2, 2, hidden)
    if storage == "bf16":
        return bf16_to_uint16(states[:, :taps].reshape(tokens, -1)), bf16_to_uint16(states[:, taps]), None
    bits, scales = fp8_quantize(states)
    return bits[:, :taps].reshape(tokens, -1).numpy(), bits[:, taps].numpy(), scales.numpy()


EXTRACT_KW = {"layer_ids": LAYER_IDS, "model_id": "tiny", "progress": False, "token_budget": 96, "threads": 1}
CONVERSATIONS = [
    ("Hi", "Hello! How can I help you today?"),
    ("What is the capital of France?", "The capital of France is Paris, on the Seine."),
    (
        "Write a haiku about rain.",
        "Soft rain on the roof,\nthe garden drinks in silence,\nclouds drift east.",
    ),
    ("2+2?", "4"),
    ("Name three colours.", "Red, green and blue are three primary colours of light."),
    ("Explain recursion briefly.", "A function that calls itself on a smaller problem until a base case."),
    ("Translate 'cat' to French.", "Chat."),
    ("Give me a prime above 100.", "101 is prime: no integer from 2 to 10 divides it."),
]

# One "zygote" child imports torch, transformers and eyas once, then forks one victim per job; each
# victim patches its point, runs its eyas call and, at the point, writes its pid to `ready` and waits
# there for the test's SIGKILL. The zygote reaps the victims and prints their exit codes as JSON.
# The points are reached through public names only (zarr's Array.__setitem__,
# HiddenStoreWriter.finish, eyas.core.atomic's shutil, torch.save, eyas.extract.hf_backend.stage_batch).
ZYGOTE = r"""
import io, json, os, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import zarr
import eyas.core.atomic as atomic
import eyas.extract.hf_backend as hf
from eyas.config import TrainSettings
from eyas.store import HiddenStoreWriter
from eyas.train.trainer import train

def run(job):
    ready, calls = Path(job["ready"]), {"n": 0}

    def pause():
        ready.write_text(str(os.getpid()))
        time.sleep(300)  # the test kills us here

    def nth(n):
        calls["n"] += 1
        return calls["n"] == n

    point = job["point"]
    if point == "mid_batch":  # the forward of batch 3 is done, its states not yet staged for writing
        stage = hf.stage_batch
        hf.stage_batch = lambda *a: pause() if nth(3) else stage(*a)
    elif point == "mid_write":  # chunk 1 of aux is on disk, chunk 1 of final not yet
        write_chunk = HiddenStoreWriter.write_chunk
        def patched(self, name, chunk, data):
            if name == "final" and nth(2):
                pause()
            return write_chunk(self, name, chunk, data)
        HiddenStoreWriter.write_chunk = patched
    elif point == "finalize":  # every chunk and the attrs are written, the rename not yet done
        finish = HiddenStoreWriter.finish
        def patched(self, *a, **k):
            finish(self, *a, **k)
            pause()
        HiddenStoreWriter.finish = patched
    elif point == "replace_old":  # an old store at the output path is being deleted, half gone
        rmtree = atomic.shutil.rmtree
        class Shutil:
            def rmtree(self, path, *a, **k):
                path = Path(path)
                if path.exists() and ".tmp-" not in path.name:
                    files = sorted(p for p in path.rglob("*") if p.is_file())
                    for f in files[: len(files) // 2]:
                        f.unlink()
                    pause()
                return rmtree(path, *a, **k)
        atomic.shutil = Shutil()
    elif point == "mid_checkpoint":  # the 2nd checkpoint's train_state.pt is half written
        save = torch.save
        def patched(obj, f, *a, **k):
            if nth(2):
                buf = io.BytesIO()
                save(obj, buf, *a, **k)
                half = buf.getvalue()[: len(buf.getvalue()) // 2]
                if hasattr(f, "write"):  # eyas saves through a file object of its own
                    f.write(half)
                    f.flush()
                else:
                    with open(f, "wb") as fh:
                        fh.write(half)
                pause()
            return save(obj, f, *a, **k)
        torch.save = patched
    else:
        raise SystemExit(f"unknown point {point}")
    if job["call"] == "extract":
        hf.extract_shard(*job["args"], **job["kwargs"])
    else:
        train(TrainSettings(**job["settings"]), **job["kwargs"])

victims = {}
for job in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        code = 3  # the pause point was never reached
        try:
            run(job)
        except BaseException as exc:
            print(f"{job['point']}: {exc!r}", file=sys.stderr)
            code = 4
        finally:
            os._exit(code)
    victims[pid] = job["point"]
codes = {point: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid, point in victims.items()}
print(json.dumps(codes))
"""
