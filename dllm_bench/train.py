"""Train a tiny LLaDA-architecture masked-diffusion model on the `synth` task, on CPU, and save
it as an HF-layout LLaDA checkpoint the engine loads unchanged (`dllm-bench train`).

Pieces (each a function below):

* a task tokenizer: byte-level BPE trained on synth text (digits split one by one, names and
  items end up as single tokens), learned tokens first and LLaDA's special tokens at the top of
  the vocab in LLaDA's relative order (the small-vocab layout of tokenizer_build.py);
* the model: `engine.models.llada.LLaDAModelLM` itself, trained through its own blocks with a
  batched, padding-masked attention (so the saved weights mean exactly what the engine computes);
* the objective, as LLaDA's SFT trains (Nie et al. 2025, Alg. 2 / eq. 5): per sequence
  t ~ U(eps, 1); every token of the *answer region* (answer + EOS, EOS-padded to a fixed window)
  is masked with probability t, prompt tokens never; cross-entropy on the masked tokens weighted
  1/t, normalised by the answer-region length. `objective="plain"` (unweighted CE over masked
  tokens, t ~ U(t_min, 1); lower variance for short windows) exists as an option only;
* a seeded data stream (train split of synth; the held-out probe uses the test split), AdamW with
  warmup + cosine decay, a learning curve (probe accuracy on held-out synth every `eval_every`
  steps, greedy LLaDA low-confidence decoding with one token per step), CSV + PNG;
* the budget: `steps` (deterministic: the same seed, steps and thread count give the same
  weights) and a wall-clock cap `minutes` (a safety stop; the step count reached is recorded).
"""
from __future__ import annotations

import csv
import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models.llada import LLaDAConfig, LLaDAModelLM
from workloads.tasks import synth

OBJECTIVES = ("llada", "plain")
ANSWER_DELIM = " "                      # lm-eval's target_delimiter: prompt "...Answer:" + " " + answer


@dataclass
class TrainConfig:
    out: str = ""
    task: str = "synth"
    # --- data (synth knobs) ---
    train_facts: tuple[int, ...] = (4, 8, 12, 16, 20)   # context_facts drawn per batch (uniformly)
    eval_facts: int = 16                                 # context_facts of the held-out probe
    ops: tuple[str, ...] = synth.OPS
    max_value: int = synth.DEFAULT_MAX_VALUE
    window: int = 32                     # answer region = answer + EOS padding to this length
    # --- tokenizer ---
    vocab_size: int = 512                # embedding rows; learned BPE tokens + fillers + 12 specials
    tokenizer_corpus: int = 4000         # synth examples the BPE is trained on
    # --- model (LLaDA architecture) ---
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    mlp_hidden_size: int = 688
    max_sequence_length: int = 4096      # LLaDA's (RoPE: a config field only)
    rope_theta: float = 10000.0          # LLaDA-8B uses 500000 for head_dim 128 / 4k context; a
                                         # 32-dim head over ~150 tokens needs faster rotations
    # --- optimisation ---
    objective: str = "llada"
    eps: float = 1e-3                    # LLaDA: t ~ U(eps, 1)
    t_min: float = 0.1                   # plain objective: t ~ U(t_min, 1)
    batch_size: int = 32
    lr: float = 5e-4
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    steps: int = 2000
    minutes: float | None = None         # wall-clock safety cap (None = no cap)
    stop_after: int | None = None        # end after this many steps (deterministic early stop;
                                         # the LR schedule still spans `steps`)
    seed: int = 0
    threads: int | None = None
    # --- learning curve ---
    eval_every: int = 250
    eval_n: int = 64
    eval_seed: int = 1                   # probe = synth test split, this seed (reports use seed 0)
    save_dtype: str = "float32"

    def __post_init__(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        check(self.task == "synth", f"only task 'synth' can be trained, got {self.task!r}")
        check(self.objective in OBJECTIVES, f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        check(bool(self.train_facts) and all(1 <= k <= len(synth.NAMES) for k in self.train_facts),
              f"train_facts must be in 1..{len(synth.NAMES)}")
        check(1 <= self.eval_facts <= len(synth.NAMES), "eval_facts out of range")
        check(self.steps > 0 and self.batch_size > 0 and self.window > 0, "steps, batch_size, window must be positive")
        check(self.minutes is None or self.minutes > 0, "minutes must be positive")
        check(self.stop_after is None or self.stop_after > 0, "stop_after must be positive")
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
def corpus_lines(n: int, seed: int, facts: Sequence[int], ops, max_value: int) -> list[str]:
    """Prompt + answer texts of train-split synth examples, spread over the context sizes."""
    per = max(1, n // len(facts))
    out = []
    for k in facts:
        for e in synth.synth_examples("train", per, seed=seed, context_facts=k, ops=ops, max_value=max_value):
            out.append(synth.format_prompt(e["question"]) + ANSWER_DELIM + e["answer"])
    return out


def build_task_tokenizer(corpus: Sequence[str], vocab_size: int):
    """A `tokenizers.Tokenizer` of exactly `vocab_size` dense ids: BPE learned on `corpus` (as many
    merges as min_frequency 2 allows, up to the budget), `<|reserved_N|>` fillers, then LLaDA's
    12 special tokens at the top in LLaDA's relative order (tokenizer_build's small-vocab layout)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from dllm_bench.tokenizer_build import _pre_tokenizer, special_token_ids

    specials = special_token_ids(vocab_size)
    budget = min(specials.values())
    if budget <= 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for the 256 byte tokens")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = _pre_tokenizer()
    bpe.train_from_iterator(list(corpus), trainers.BpeTrainer(
        vocab_size=budget, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    learned = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    vocab = {t: i for i, t in enumerate(learned)}
    by_id = {i: t for t, i in specials.items()}
    for i in range(len(learned), vocab_size):
        vocab[by_id.get(i, f"<|reserved_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]]))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in sorted(specials, key=specials.get)])
    if {t: tok.token_to_id(t) for t in specials} != specials or tok.get_vocab_size() != vocab_size:
        raise AssertionError("special token ids moved")
    return tok


def save_task_tokenizer(tok, out: Path, model_max_length: int) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json exactly as tokenizer_build.save_tokenizer writes
    them (AutoTokenizer-loadable offline); returns the config.json special ids."""
    from dllm_bench.tokenizer_build import _NAMED, BOS, CHAT_TEMPLATE, EOS, MASK, special_token_ids

    specials = special_token_ids(tok.get_vocab_size())
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False), encoding="utf-8")
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for t, i in sorted(specials.items(), key=lambda kv: kv[1])}
    config = {
        "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in sorted(specials, key=specials.get) if t not in _NAMED],
        "bos_token": BOS, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "eos_token": EOS, "mask_token": MASK, "model_max_length": model_max_length, "pad_token": EOS,
        "padding_side": "left", "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return {"bos_token_id": specials[BOS], "eos_token_id": specials[EOS], "pad_token_id": specials[EOS],
            "mask_token_id": specials[MASK]}


# ------------------------------------------------------------------------------------ data
@dataclass
class Encoded:
    prompt: list[int]
    answer: list[int]        # the answer region: answer tokens + EOS padding, len == window
    target: str


def encode_examples(tok, rows: Sequence[dict], window: int, eos: int) -> list[Encoded]:
    prompts = tok.encode_batch([synth.format_prompt(r["question"]) for r in rows], add_special_tokens=False)
    answers = tok.encode_batch([ANSWER_DELIM + r["answer"] for r in rows], add_special_tokens=False)
    out = []
    for r, p, a in zip(rows, prompts, answers, strict=True):
        if len(a.ids) >= window:
            raise ValueError(f"answer of {len(a.ids)} tokens does not fit window {window} with an EOS")
        out.append(Encoded(list(p.ids), list(a.ids) + [eos] * (window - len(a.ids)), r["target"]))
    return out


class TrainStream:
    """Seeded, endless batches of train-split synth examples; one context size per batch (drawn
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
        rows = synth.synth_examples("train", self.chunk, seed=seed, context_facts=k, ops=c.ops, max_value=c.max_value)
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


def collate(batch: Sequence[Encoded], pad_id: int, mask_answer: bool = False, mask_id: int = 0):
    """-> ids [B, T] (prompt, answer region, right padding), valid [B, T] (not padding),
    region [B, T] (answer region). With mask_answer the answer region holds mask_id."""
    T = max(len(e.prompt) + len(e.answer) for e in batch)
    B = len(batch)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    valid = torch.zeros((B, T), dtype=torch.bool)
    region = torch.zeros((B, T), dtype=torch.bool)
    for i, e in enumerate(batch):
        p, a = len(e.prompt), len(e.answer)
        ids[i, :p] = torch.tensor(e.prompt)
        ids[i, p:p + a] = mask_id if mask_answer else torch.tensor(e.answer)
        valid[i, :p + a] = True
        region[i, p:p + a] = True
    return ids, valid, region


# ------------------------------------------------------------------------------------ model
def model_config(cfg: TrainConfig, special_ids: dict[str, int]) -> LLaDAConfig:
    return LLaDAConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                       n_layers=cfg.n_layers, mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=cfg.vocab_size,
                       embedding_size=cfg.vocab_size, max_sequence_length=cfg.max_sequence_length,
                       rope_theta=cfg.rope_theta, **special_ids)


def init_model(mcfg: LLaDAConfig, seed: int) -> LLaDAModelLM:
    """LLaDA's init: N(0, 0.02) for every matrix (output projections scaled by 1/sqrt(2L), GPT-2
    style, for a stable start), RMSNorm weights 1."""
    g = torch.Generator().manual_seed(seed)
    model = LLaDAModelLM(mcfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
                continue
            std = 0.02
            if name.endswith("attn_out.weight") or (".blocks." in name and name.endswith("ff_out.weight")):
                std = 0.02 / math.sqrt(2 * mcfg.n_layers)
            p.normal_(0.0, std, generator=g)
    return model.float().train()


def batched_logits(model: LLaDAModelLM, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[B, T] ids -> [B, T, V] logits through the engine's own blocks (differentiable), keys
    restricted to each row's valid (non-padding) positions; bidirectional like LLaDA."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device).repeat(B)
    keep = valid[:, None, None, :]                                    # [B, 1, 1, T]

    def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q4, k4, v4 = (x.view(B, T, x.shape[1], x.shape[2]).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=keep, enable_gqa=q4.shape[1] != k4.shape[1])
        return o.transpose(1, 2).reshape(B * T, q.shape[1], q.shape[2])

    h = model.hidden_states(ids.reshape(-1), pos, attn)
    return model.lm_head(h).view(B, T, -1)


def diffusion_loss(model: LLaDAModelLM, ids, valid, region, mask_id: int, objective: str = "llada",
                   eps: float = 1e-3, t_min: float = 0.1, generator: torch.Generator | None = None):
    """The masked-diffusion loss of one batch -> (loss, stats).

    llada: t ~ U(eps, 1) per sequence, mask each answer-region token with probability t,
    sum over masked tokens of CE / t, divided by the answer-region length, mean over the batch
    (LLaDA SFT). plain: t ~ U(t_min, 1), mean CE over all masked tokens of the batch."""
    B = ids.shape[0]
    lo = eps if objective == "llada" else t_min
    t = torch.rand(B, 1, generator=generator) * (1 - lo) + lo
    m = (torch.rand(ids.shape, generator=generator) < t) & region
    noisy = torch.where(m, torch.full_like(ids, mask_id), ids)
    logits = batched_logits(model, noisy, valid)
    ce = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten(), reduction="none").view(ids.shape)
    if objective == "llada":
        loss = ((ce * m / t).sum(1) / region.sum(1).clamp(min=1)).mean()
    else:
        loss = (ce * m).sum() / m.sum().clamp(min=1)
    return loss, {"masked_ce": float((ce.detach() * m).sum() / m.sum().clamp(min=1))}


# ------------------------------------------------------------------------------------ probe
@torch.no_grad()
def probe_generate(model: LLaDAModelLM, batch: Sequence[Encoded], mask_id: int, pad_id: int) -> list[list[int]]:
    """Greedy LLaDA decoding of each example's answer region (gen_length = steps = block =
    window: one token per step, low-confidence remasking), batched with padding masks.
    Same decisions as the engine's exact mode up to float summation order."""
    model.eval()
    ids, valid, region = collate(batch, pad_id, mask_answer=True, mask_id=mask_id)
    steps = len(batch[0].answer)
    for _ in range(steps):
        masked = (ids == mask_id) & region
        if not masked.any():
            break
        logits = batched_logits(model, ids, valid).float()
        probs = logits.softmax(-1)
        conf, pred = probs.max(-1)
        conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
        best = conf.argmax(1)                                           # one token per row per step
        rows = torch.nonzero(masked.any(1)).squeeze(-1)
        ids[rows, best[rows]] = pred[rows, best[rows]]
    out = []
    for i, e in enumerate(batch):
        p = len(e.prompt)
        out.append(ids[i, p:p + len(e.answer)].tolist())
    return out


def probe_accuracy(model, tok, probe: Sequence[Encoded], mask_id: int, pad_id: int,
                   batch: int = 32) -> tuple[float, float]:
    """(strict-match accuracy, token accuracy over the answer tokens before the EOS padding)."""
    from workloads.tasks.scoring import score_gsm8k

    hits = tok_hits = tok_n = 0
    for s in range(0, len(probe), batch):
        chunk = list(probe[s:s + batch])
        for e, toks in zip(chunk, probe_generate(model, chunk, mask_id, pad_id), strict=True):
            text = tok.decode(toks[: toks.index(pad_id)] if pad_id in toks else toks, skip_special_tokens=True)
            hits += score_gsm8k(text, e.target)["strict-match"]
            n = e.answer.index(pad_id) if pad_id in e.answer else len(e.answer)
            tok_hits += sum(int(a == b) for a, b in zip(toks[:n], e.answer[:n], strict=True))
            tok_n += n
    return hits / max(1, len(probe)), tok_hits / max(1, tok_n)


# ------------------------------------------------------------------------------------ training
def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> dict:
    """Train and save into cfg.out; returns the training summary (also written as training.json)."""
    from safetensors.torch import save_file

    from dllm_bench.presets import LLADA_8B_CONFIG

    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)

    corpus = corpus_lines(cfg.tokenizer_corpus, cfg.seed, cfg.train_facts, cfg.ops, cfg.max_value)
    tok = build_task_tokenizer(corpus, cfg.vocab_size)
    special = save_task_tokenizer(tok, out, cfg.max_sequence_length)
    mask_id, eos = special["mask_token_id"], special["eos_token_id"]
    mcfg = model_config(cfg, special)
    model = init_model(mcfg, cfg.seed)
    log(f"model: d{cfg.d_model} L{cfg.n_layers} h{cfg.n_heads}/kv{cfg.n_kv_heads} ff{cfg.mlp_hidden_size} "
        f"V{cfg.vocab_size}: {n_params(model) / 1e6:.2f} M params; objective {cfg.objective}; "
        f"threads {torch.get_num_threads()}")

    probe_rows = synth.synth_examples("test", cfg.eval_n, seed=cfg.eval_seed, context_facts=cfg.eval_facts,
                                      ops=cfg.ops, max_value=cfg.max_value)
    probe = encode_examples(tok, probe_rows, cfg.window, eos)
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
        acc, tok_acc = probe_accuracy(model, tok, probe, mask_id, eos)
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

    # ---- save (HF LLaDA layout)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.save_dtype]
    state = {k: v.detach().to(dt).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)
    hf = dict(LLADA_8B_CONFIG)
    hf.update(d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
              mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=cfg.vocab_size, embedding_size=cfg.vocab_size,
              max_sequence_length=cfg.max_sequence_length, rope_theta=cfg.rope_theta, torch_dtype=cfg.save_dtype,
              **special)
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_curve(curve, out)
    summary = {
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "params": n_params(model), "steps_done": step, "stopped_by": stopped,
        "examples_seen": stream.examples, "train_seconds": round(train_s, 1), "eval_seconds": round(eval_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "final_probe_accuracy": curve[-1]["probe_accuracy"],
        "probe": {"split": "test", "seed": cfg.eval_seed, "n": len(probe), "context_facts": cfg.eval_facts,
                  "decoding": f"greedy low-confidence, gen_length=steps=block={cfg.window}",
                  "metric": "strict-match"},
        "learned_tokens": sum(1 for t in tok.get_vocab() if not t.startswith("<|")),
        "curve": curve,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log(f"saved {out} ({step} steps, {train_s / 60:.1f} min training + {eval_s / 60:.1f} min probes)")
    return summary


def write_curve(curve: list[dict], out: Path) -> None:
    if not curve:
        return
    with open(out / "learning_curve.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(curve[0]))
        w.writeheader()
        w.writerows(curve)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = [r["train_seconds"] / 60 for r in curve]
    ax.plot(xs, [100 * r["probe_accuracy"] for r in curve], marker="o", color="tab:blue",
            label="answer correct (strict-match)")
    if "probe_token_accuracy" in curve[0]:
        ax.plot(xs, [100 * r["probe_token_accuracy"] for r in curve], marker=".", color="tab:cyan",
                label="answer tokens correct")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_xlabel(f"training time (minutes, {curve[-1]['step']} steps)")
    ax.set_ylabel("held-out synth probe (%)", color="tab:blue")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(xs, [r["loss"] for r in curve], color="tab:red", alpha=0.6, linestyle="--")
    ax2.set_ylabel("train loss", color="tab:red")
    ax.set_title("tiny LLaDA on synth: learning curve", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "learning_curve.png", dpi=110)
    plt.close(fig)
