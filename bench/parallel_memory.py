"""Per-rank memory of `train.parallel: ddp` against `fsdp`: what each rank keeps between steps
(weights, gradients, AdamW moments, counted tensor by tensor over what the rank holds locally) and its
peak RSS over a few real `step.train_step` calls on short synthetic batches (so the persistent state,
not activations, dominates). Both modes run as torchrun ranks with gloo on this CPU.

    .venv/bin/python bench/parallel_memory.py --nproc 2 --out bench/results/parallel_memory_cpu.json

The drafter shape defaults to a 2048-hidden Llama-style target (enough to make state dominate, small
enough for a CPU host); `--hidden 7168 ...` gives the large case on a machine with the memory for it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank
    return local.numel() * local.element_size()


def rank_main(args: argparse.Namespace) -> None:
    """One torchrun rank: build, spread, step; rank 0 writes the per-rank figures gathered to it."""
    import torch.distributed as dist

    from eyas.config import TrainSettings
    from eyas.model.drafter import DrafterConfig, Eagle3Drafter
    from eyas.train.distributed import init_from_env
    from eyas.train.loader import Batch
    from eyas.train.parallel import spread_over_ranks
    from eyas.train.step import Teacher, train_step
    from eyas.train.trainer import param_groups

    torch.set_num_threads(1)
    world = init_from_env("cpu")
    cfg = DrafterConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.hidden // 128,
        num_key_value_heads=min(8, args.hidden // 128),
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        vocab_size=args.vocab,
        draft_vocab_size=args.draft,
        aux_layer_ids=[1, 2, 3],
    )
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg).train()
    device = torch.device("cpu")
    spread = spread_over_ranks(drafter, args.mode, world, device)
    optimizer = torch.optim.AdamW(param_groups(spread.objective, 0.0), lr=1e-4)
    head = torch.randn(args.vocab, args.hidden) * 0.02
    d2t = torch.zeros(args.draft, dtype=torch.int64)
    t2d = torch.zeros(args.vocab, dtype=torch.bool)
    t2d[: args.draft] = True
    teacher = Teacher(head, d2t, t2d, device, torch.float32)
    del head
    settings = TrainSettings(ttt_steps=3, select_by_tau=False)
    g = torch.Generator().manual_seed(world.rank)
    n, h = args.tokens, args.hidden
    batch = Batch(
        aux=torch.randn(1, n, 3 * h, generator=g).bfloat16(),  # [1, T, 3H]
        final=torch.randn(1, n, h, generator=g).bfloat16(),  # [1, T, H]
        input_ids=torch.randint(0, args.vocab, (1, n), generator=g),
        loss_mask=torch.ones(1, n, dtype=torch.int64),
        valid=torch.ones(1, n, dtype=torch.bool),
        lengths=torch.full((1,), n),
    )
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=False)  # keep gradients allocated: the between-steps state
        train_step(spread, teacher, [batch], settings, None, device)
        spread.clip_gradients(1.0)
        optimizer.step()
    params = list(spread.objective.parameters())
    moments = [t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t) and t.ndim]
    mine = {
        "weights_gb": sum(_local_bytes(p) for p in params) / 1e9,
        "gradients_gb": sum(_local_bytes(p.grad) for p in params if p.grad is not None) / 1e9,
        "adamw_moments_gb": sum(_local_bytes(t) for t in moments) / 1e9,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
    }
    mine["state_gb"] = mine["weights_gb"] + mine["gradients_gb"] + mine["adamw_moments_gb"]
    gathered = [None] * world.size
    dist.all_gather_object(gathered, mine)
    if world.main:
        Path(args.result).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def run_mode(mode: str, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="eyas-parmem-") as tmp:
        result = Path(tmp) / "ranks.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
            __file__, "--rank-main", "--mode", mode, "--result", str(result),
            "--hidden", str(args.hidden), "--intermediate", str(args.intermediate),
            "--vocab", str(args.vocab), "--draft", str(args.draft),
            "--tokens", str(args.tokens), "--steps", str(args.steps),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode:
            raise RuntimeError(f"{mode}: torchrun failed\n{proc.stderr[-3000:]}")
        return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="JSON results path")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--draft", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=64, help="tokens of each rank's synthetic batch")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        return rank_main(args)
    results = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "torch": torch.__version__,
        "shape": {k: getattr(args, k) for k in ("hidden", "intermediate", "vocab", "draft", "nproc")},
        "modes": {mode: run_mode(mode, args) for mode in ("ddp", "fsdp")},
    }
    print(f"# {results['command']}")
    head = ("mode", 5), ("rank", 4), ("weights", 8), ("grads", 8), ("moments", 8), ("state GB", 9)
    print(" ".join(f"{name:>{width}}" for name, width in head), f"{'peak RSS':>9}")
    for mode, ranks in results["modes"].items():
        for r, m in enumerate(ranks):
            print(
                f"{mode:5} {r:>4} {m['weights_gb']:8.3f} {m['gradients_gb']:8.3f} "
                f"{m['adamw_moments_gb']:8.3f} {m['state_gb']:9.3f} {m['peak_rss_gb']:9.3f}"
            )
    ddp, fsdp = (max(m["state_gb"] for m in results["modes"][k]) for k in ("ddp", "fsdp"))
    results["fsdp_over_ddp_state"] = fsdp / ddp
    print(f"fsdp / ddp state per rank: {fsdp / ddp:.3f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
