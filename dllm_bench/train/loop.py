"""Train a tiny masked-diffusion model of either family (LLaDA; Dream, whose logits carry its
shift) on a generated task (`synth`, `synth-cot`) on CPU and save it as an HF-layout checkpoint
of its family the engine loads unchanged (`dllm-bench train`).

The model is `engine.models.DenseLM` itself, trained through its own blocks with a
batched, padding-masked attention, so the saved weights mean exactly what the engine computes.
The objective is the family's masked-diffusion loss (`diffusion_loss`: LLaDA's SFT with 1/t,
Dream's CART weights, on the rows the family's shift gives); a seeded data stream (the task's train
split), AdamW with warmup + cosine decay, a learning curve on the dev split (CSV + PNG), a step
budget (the same seed, steps and thread count give the same weights) and a wall-clock safety cap
`minutes`. Tokenizer: dllm_bench.train.tokenizer; batches: dllm_bench.train.batches; probe and
curve: dllm_bench.train.curve. Options and results: docs/ACCURACY.md ("`dllm-bench train`").
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from dllm_bench.checkpoints.token_layouts import LAYOUTS
from dllm_bench.errors import UserError
from dllm_bench.train.batches import ANSWER_DELIM, Encoded, batched_logits, collate, encode_examples
from dllm_bench.train.curve import probe_accuracy, write_curve
from dllm_bench.train.tokenizer import build_task_tokenizer, save_task_tokenizer
from engine.config import DTYPES
from engine.models import DenseLM, ModelConfig, build_model, config_from_dict, hf_state_dict
from workloads.tasks import generated, synth

OBJECTIVES = ("llada", "cart", "plain")
# each family's own objective (--objective's default), by model_type: LLaDA's SFT (1/t), Dream's CART
FAMILY_OBJECTIVES = {"llada": "llada", "Dream": "cart"}
CART_GEO_P = 0.3             # Dream's default `loss_weight_type: cart[geo_p:0.3]`


@dataclass
class TrainConfig:
    out: str = ""
    task: str = "synth"                                  # a generated task (synth | synth-cot)
    # --- data (task knobs) ---
    train_facts: tuple[int, ...] = (4, 8, 16)           # context_facts drawn per batch (uniformly)
    eval_facts: int = 16                                 # context_facts of the held-out probe
    ops: tuple[str, ...] = synth.DEFAULT_OPS            # synth only
    needles: int = 3                                     # synth-cot only: events in the chain
    max_value: int = synth.DEFAULT_MAX_VALUE
    window: int | None = None            # answer region = answer + EOS padding (None: the task's)
    # --- tokenizer ---
    vocab_size: int = 512                # embedding rows; learned BPE tokens + fillers + 12 specials
    tokenizer_corpus: int = 4000         # train examples the BPE is trained on
    # --- model ---
    model_type: str = "llada"            # the family (config.json's model_type): llada | Dream
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    mlp_hidden_size: int = 344
    max_sequence_length: int = 4096      # LLaDA's (RoPE: a config field only)
    rope_theta: float = 10000.0          # LLaDA-8B uses 500000 for head_dim 128 / 4k context; a
                                         # 32-dim head over ~150 tokens needs faster rotations
    # --- optimisation ---
    objective: str | None = None         # None: the family's (FAMILY_OBJECTIVES)
    eps: float = 1e-3                    # LLaDA: t ~ U(eps, 1)
    t_min: float = 0.1                   # plain objective: t ~ U(t_min, 1)
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    steps: int = 3000
    minutes: float | None = None         # wall-clock safety cap (None = no cap)
    stop_after: int | None = None        # end after this many steps (deterministic early stop;
                                         # the LR schedule still spans `steps`)
    seed: int = 0
    threads: int | None = None
    # --- learning curve ---
    eval_every: int = 300
    eval_n: int = 48
    eval_seed: int = 1                   # probe = the task's dev split, this seed
    save_dtype: str = "float32"

    def __post_init__(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        check(self.task in generated.TASKS, f"task must be one of {generated.TASKS}, got {self.task!r}")
        self.window = self.window or generated.WINDOWS[self.task]
        self.objective = self.objective or FAMILY_OBJECTIVES.get(self.model_type, "llada")
        check(self.objective in OBJECTIVES, f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        check(bool(self.train_facts) and all(1 <= k <= len(synth.NAMES) for k in self.train_facts),
              f"train_facts must be in 1..{len(synth.NAMES)}")
        check(1 <= self.eval_facts <= len(synth.NAMES), "eval_facts out of range")
        check(self.steps > 0 and self.batch_size > 0 and self.window > 0, "steps, batch_size, window must be positive")
        check(self.minutes is None or self.minutes > 0, "minutes must be positive")
        check(self.stop_after is None or self.stop_after > 0, "stop_after must be positive")
        check(min(self.d_model, self.n_layers, self.n_heads, self.n_kv_heads, self.mlp_hidden_size) > 0,
              "d_model, n_layers, n_heads, n_kv_heads and mlp_hidden_size must be positive")
        check(self.model_type in LAYOUTS, f"model_type must be one of {', '.join(LAYOUTS)}, got {self.model_type!r}")
        check(min(LAYOUTS[self.model_type].ids(self.vocab_size).values()) > 256,
              f"vocab_size {self.vocab_size} leaves no room for the 256 byte tokens")
        check(self.lr > 0 and self.rope_theta > 0 and math.isfinite(self.lr * self.rope_theta),
              "lr and rope_theta must be positive numbers")
        check(self.warmup >= 0 and self.weight_decay >= 0, "warmup and weight_decay must be >= 0")
        check(self.d_model % self.n_heads == 0 and self.n_heads % self.n_kv_heads == 0,
              "d_model must divide by n_heads and n_heads by n_kv_heads")
        check((self.d_model // self.n_heads) % 2 == 0, "head_dim must be even (RoPE)")
        check(0 < self.eps < 1 and 0 < self.t_min < 1, "eps and t_min must be in (0, 1)")
        check(self.save_dtype in ("float32", "bfloat16"), "save_dtype must be float32 or bfloat16")
        check(self.eval_every > 0 and self.eval_n > 0, "eval_every and eval_n must be positive")
        self.train_facts = tuple(int(k) for k in self.train_facts)
        self.ops = tuple(self.ops)
        self.betas = tuple(self.betas)


# ------------------------------------------------------------------------------------ tokenizer
def task_knobs(cfg: TrainConfig) -> dict:
    """The task's own knobs of a training config (e.g. ops for synth, needles for synth-cot)."""
    return generated.knobs_of(cfg.task, asdict(cfg))


def corpus_lines(cfg: TrainConfig) -> list[str]:
    """Prompt + answer texts of train-split examples, spread over the context sizes."""
    per = max(1, cfg.tokenizer_corpus // len(cfg.train_facts))
    out = []
    for k in cfg.train_facts:
        for e in generated.examples(cfg.task, "train", per, seed=cfg.seed, context_facts=k, **task_knobs(cfg)):
            out.append(generated.format_prompt(e["question"]) + ANSWER_DELIM + e["answer"])
    return out


# ------------------------------------------------------------------------------------ data
class TrainStream:
    """Seeded, endless batches of train-split examples; one context size per batch (drawn
    uniformly from `facts`) so a batch's sequences have nearly equal lengths."""

    def __init__(self, cfg: TrainConfig, tok, eos: int, chunk: int = 2048):
        self.cfg, self.tok, self.eos, self.chunk = cfg, tok, eos, chunk
        self.rng = random.Random(f"dllm-bench-train:{cfg.seed}")
        self.buffers: dict[int, list[Encoded]] = {k: [] for k in cfg.train_facts}
        self.chunks: dict[int, int] = {k: 0 for k in cfg.train_facts}
        self.examples = 0

    def _refill(self, k: int) -> None:
        c = self.cfg
        seed = (c.seed * 1_000_003 + k * 10_007 + self.chunks[k]) % (2**31)
        rows = generated.examples(c.task, "train", self.chunk, seed=seed, context_facts=k, **task_knobs(c))
        self.chunks[k] += 1
        enc = encode_examples(self.tok, rows, c.window, self.eos)
        self.rng.shuffle(enc)
        self.buffers[k] = enc

    def next(self) -> list[Encoded]:
        k = self.rng.choice(self.cfg.train_facts)
        buf = self.buffers[k]
        if len(buf) < self.cfg.batch_size:
            self._refill(k)
            buf = self.buffers[k]
        batch, self.buffers[k] = buf[: self.cfg.batch_size], buf[self.cfg.batch_size:]
        self.examples += len(batch)
        return batch


# ------------------------------------------------------------------------------------ model
def model_config(cfg: TrainConfig, special_ids: dict[str, int]) -> ModelConfig:
    """The model of `cfg` as its family reads it back from config.json (biases, shift: the family's)."""
    base = ModelConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                       n_layers=cfg.n_layers, mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=cfg.vocab_size,
                       embedding_size=cfg.vocab_size, max_sequence_length=cfg.max_sequence_length,
                       rope_theta=cfg.rope_theta, model_type=cfg.model_type, **special_ids)
    return config_from_dict(base.family.to_hf(base))


def init_model(mcfg: ModelConfig, seed: int) -> DenseLM:
    """LLaDA's init: N(0, 0.02) for every matrix (output projections scaled by 1/sqrt(2L), GPT-2
    style, for a stable start), RMSNorm weights 1, biases (Dream's q/k/v) 0."""
    g = torch.Generator().manual_seed(seed)
    model = build_model(mcfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(0.0 if name.endswith(".bias") else 1.0)
                continue
            std = 0.02
            if name.endswith("attn_out.weight") or (".blocks." in name and name.endswith("ff_out.weight")):
                std = 0.02 / math.sqrt(2 * mcfg.n_layers)
            p.normal_(0.0, std, generator=g)
    return model.float().train()


def cart_weights(masked: torch.Tensor, valid: torch.Tensor, p: float = CART_GEO_P) -> torch.Tensor:
    """Dream's context-adaptive token weights (CART): a masked position's weight is half the sum,
    over the clean (unmasked, non-padding) positions at distance d >= 2, of the geometric
    p (1 - p)^(d - 2); zero elsewhere (ZHZisZZ/dllm dllm/pipelines/dream/trainer.py `cart_weight`
    @c85042c, there over every unmasked position, padding included)."""
    T = masked.shape[1]
    idx = torch.arange(T)
    d = (idx[:, None] - idx[None, :]).abs()
    geo = torch.where(d >= 2, 0.5 * p * (1 - p) ** (d - 2).clamp(min=0).float(), 0.0)
    return ((valid & ~masked).float() @ geo) * masked


def diffusion_loss(model: DenseLM, ids, valid, region, mask_id: int, objective: str = "llada",
                   eps: float = 1e-3, t_min: float = 0.1, generator: torch.Generator | None = None):
    """The masked-diffusion loss of one batch -> (loss, stats). The logits are the model's own rows
    (`batched_logits`: row p predicts token p, the family's shift applied).

    llada (LLaDA's SFT, Nie et al. 2025, Alg. 2 / eq. 5): t ~ U(eps, 1) per sequence, mask each
    answer-region token (answer + EOS, EOS-padded to a fixed window; prompt tokens never) with
    probability t, sum over masked tokens of CE / t, divided by the answer-region length, mean
    over the batch. cart (Dream's, ZHZisZZ/dllm dllm/pipelines/dream/trainer.py and
    dllm/core/trainers/mdlm.py @c85042c): the same masking and per-sequence normalisation, each
    masked token's CE weighted by `cart_weights` instead of 1/t. plain (an option only; lower
    variance for short windows): t ~ U(t_min, 1), mean CE over all masked tokens of the batch."""
    B = ids.shape[0]
    lo = t_min if objective == "plain" else eps
    t = torch.rand(B, 1, generator=generator) * (1 - lo) + lo
    m = (torch.rand(ids.shape, generator=generator) < t) & region
    noisy = torch.where(m, torch.full_like(ids, mask_id), ids)
    logits = batched_logits(model, noisy, valid)
    ce = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten(), reduction="none").view(ids.shape)
    if objective == "plain":
        loss = (ce * m).sum() / m.sum().clamp(min=1)
    else:
        w = m / t if objective == "llada" else cart_weights(m, valid)
        loss = ((ce * w).sum(1) / region.sum(1).clamp(min=1)).mean()
    return loss, {"masked_ce": float((ce.detach() * m).sum() / m.sum().clamp(min=1))}


# ------------------------------------------------------------------------------------ training
def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train(cfg: TrainConfig, log: Callable[[str], None] = print, command: str | None = None) -> dict:
    """Train and save into cfg.out; returns the training summary (also written as training.json,
    with `command`, the command line that ran it, when given)."""


    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out).expanduser()

    corpus = corpus_lines(cfg)
    tok = build_task_tokenizer(corpus, cfg.vocab_size, cfg.model_type)
    probe_rows = generated.examples(cfg.task, "dev", cfg.eval_n, seed=cfg.eval_seed, context_facts=cfg.eval_facts,
                                    **task_knobs(cfg))
    try:  # the probe's answers in the window, checked before --out is made
        probe = encode_examples(tok, probe_rows, cfg.window,
                                LAYOUTS[cfg.model_type].config_ids(tok.get_vocab_size())["eos_token_id"])
    except ValueError as e:
        raise UserError(f"--window {cfg.window}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    special = save_task_tokenizer(tok, out, cfg.max_sequence_length, cfg.model_type)
    mask_id, eos = special["mask_token_id"], special["eos_token_id"]
    mcfg = model_config(cfg, special)
    model = init_model(mcfg, cfg.seed)
    log(f"model: {mcfg.family.name} d{cfg.d_model} L{cfg.n_layers} h{cfg.n_heads}/kv{cfg.n_kv_heads} ff{cfg.mlp_hidden_size} "
        f"V{cfg.vocab_size}: {n_params(model) / 1e6:.2f} M params; objective {cfg.objective}; "
        f"threads {torch.get_num_threads()}")
    stream = TrainStream(cfg, tok, eos)
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    gen = torch.Generator().manual_seed(cfg.seed + 1)

    curve: list[dict] = []
    train_s = eval_s = 0.0
    run_loss, run_n = 0.0, 0
    step = 0
    stopped = "steps"

    def evaluate() -> None:
        nonlocal eval_s
        t0 = time.perf_counter()
        acc, tok_acc = probe_accuracy(model, tok, probe, eos)
        model.train()
        eval_s += time.perf_counter() - t0
        row = {"step": step, "examples": stream.examples, "train_seconds": round(train_s, 1),
               "loss": round(run_loss / max(1, run_n), 4), "lr": lr_at(max(0, step - 1), cfg),
               "probe_accuracy": acc, "probe_token_accuracy": round(tok_acc, 4)}
        curve.append(row)
        log(f"step {step:5d}  {train_s / 60:5.1f} min  loss {row['loss']:.4f}  probe acc "
            f"{acc:.3f} tokens {tok_acc:.3f} (n={len(probe)}, K={cfg.eval_facts})")

    last = min(cfg.steps, cfg.stop_after or cfg.steps)
    while step < last:
        if cfg.minutes is not None and (time.perf_counter() - t_start) / 60 >= cfg.minutes:
            stopped = "minutes"
            break
        t0 = time.perf_counter()
        ids, valid, region = collate(stream.next(), eos)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, _ = diffusion_loss(model, ids, valid, region, mask_id, cfg.objective, cfg.eps, cfg.t_min, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        run_loss += float(loss.detach())
        run_n += 1
        train_s += time.perf_counter() - t0
        if step % cfg.eval_every == 0:
            evaluate()
            run_loss, run_n = 0.0, 0
    if not curve or curve[-1]["step"] != step:
        evaluate()

    # ---- save (the family's HF layout)
    state = {k: v.detach().to(DTYPES[cfg.save_dtype]).contiguous() for k, v in hf_state_dict(model).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)
    hf = mcfg.family.to_hf(mcfg) | {"torch_dtype": cfg.save_dtype}
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_curve(curve, out, f"tiny {mcfg.family.name} on {cfg.task}")
    summary = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "params": n_params(model), "steps_done": step, "stopped_by": stopped,
        "examples_seen": stream.examples, "train_seconds": round(train_s, 1), "eval_seconds": round(eval_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "final_probe_accuracy": curve[-1]["probe_accuracy"],
        "probe": {"split": "dev", "seed": cfg.eval_seed, "n": len(probe), "context_facts": cfg.eval_facts,
                  "decoding": f"greedy low-confidence, gen_length=steps=block={cfg.window}",
                  "metric": "strict-match"},
        "learned_tokens": sum(1 for t in tok.get_vocab() if not t.startswith("<|")),
        "curve": curve,
        "command": command,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log(f"saved {out} ({step} steps, {train_s / 60:.1f} min training + {eval_s / 60:.1f} min probes)")
    return summary
