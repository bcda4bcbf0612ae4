"""Systems built in this process over one checkpoint (generate, accuracy, frontier, the lm-eval
model): the model is loaded once, and only when a system needs it whole on this device (an engine
over several ranks loads its shards on each rank instead); every engine gets the run's device,
dtype and parallel size, and its token and logit budgets resolved for the device
(dllm_bench.systems.step_budgets)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dllm_bench.checkpoints.load import load_model
from dllm_bench.errors import UserError
from dllm_bench.systems.build import check_tensor_parallel, make_system
from dllm_bench.systems.spec import ENGINE
from dllm_bench.systems.step_budgets import AUTO, StepBudgets, engine_budgets
from engine.config import DTYPES, EngineConfig
from engine.models import DenseLM, ModelConfig, config_from_pretrained
from engine.parallel.driver import launched_by_torchrun

# A command's own step budgets on a CPU, where nothing scales with device memory.
CPU_BUDGETS = (8192, 1024)


@dataclass
class InProcess:
    """The systems of one checkpoint: `model_dir` in `dtype` on `device`, the engine over
    `tensor_parallel_size` ranks (checked when made: a size that cannot run is one UserError
    before anything is spawned or loaded); `in_turn`: the run builds engine after engine, each on
    fresh ranks, which torchrun's processes (one group for the whole command) cannot be;
    `loaded`: the model, when already loaded."""
    model_dir: str
    dtype: str
    device: str
    tensor_parallel_size: int = 1
    in_turn: bool = False
    loaded: DenseLM | None = None

    def __post_init__(self) -> None:
        if self.in_turn and self.tensor_parallel_size > 1 and launched_by_torchrun():
            raise UserError("this command starts fresh tensor-parallel ranks for every engine it builds: "
                            "run it without torchrun")
        check_tensor_parallel(self.model_dir, self.tensor_parallel_size, self.device)

    @classmethod
    def over(cls, model: DenseLM) -> InProcess:
        """The systems of a model already loaded (one device)."""
        dtype = next(k for k, v in DTYPES.items() if v == model.dtype)
        return cls("", dtype, str(model.device), loaded=model)

    @property
    def model(self) -> DenseLM:
        """The whole model on this device, loaded on first use."""
        if self.loaded is None:
            self.loaded = load_model(self.model_dir, self.dtype, self.device)
        return self.loaded

    def ranks_of(self, system: str) -> int:
        """The ranks `system` runs on: the engine the run's, a baseline always one device."""
        return self.tensor_parallel_size if system == ENGINE else 1

    def needs_model(self, system: str) -> bool:
        """Whether `system` runs over the whole model here (all but an engine over several ranks)."""
        return self.ranks_of(system) == 1

    @property
    def config(self) -> ModelConfig:
        return self.loaded.config if self.loaded is not None else config_from_pretrained(self.model_dir)

    def release(self) -> None:
        """Drop the loaded model (the next checkpoint's turn)."""
        self.loaded = None

    def budgets(self, *, tokens: int | None = None, logits: int | str | None = AUTO, max_num_seqs: int,
                block_length: int, longest_canvas: int | None = None, budget_bytes: int | None = None,
                cpu: tuple[int, int | None] = CPU_BUDGETS) -> StepBudgets:
        """An engine's token and logit budgets (None / AUTO: not given): scaled with the GPU's
        `budget_bytes` on CUDA (at least `longest_canvas`, default the model's length), `cpu` on a
        CPU. Over several ranks nothing here knows a GPU's share: `cpu` too."""
        if self.tensor_parallel_size > 1:
            return StepBudgets(cpu[0] if tokens in (None, AUTO) else int(tokens),
                               cpu[1] if logits == AUTO else logits, "", "")
        return engine_budgets(self.model, tokens=tokens, logits=logits, max_num_seqs=max_num_seqs,
                              block_length=block_length,
                              longest_canvas=longest_canvas or self.model.config.max_sequence_length,
                              budget_bytes=budget_bytes, cpu=cpu)

    def engine(self, cfg: EngineConfig, label: str | None = None) -> Any:
        """The engine of `cfg`'s knobs on this checkpoint's device and ranks (close it: over
        several ranks that stops them)."""
        cfg = replace(cfg, model=self.model_dir, dtype=self.dtype, device=self.device,
                      tensor_parallel_size=self.tensor_parallel_size)
        return make_system("engine", self.model if self.needs_model("engine") else None,
                           engine_config=cfg, label=label)

    def baseline(self, name: str, *, batch: int, knobs: dict, label: str | None = None) -> Any:
        """Baseline `name` at static batch `batch` (always one device)."""
        return make_system(name, self.model, batch=batch, knobs=knobs, label=label)
