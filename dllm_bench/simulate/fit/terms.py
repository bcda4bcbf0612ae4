"""The terms a fit to measured serve runs sets, and the profile they make.

A step's time on the fitted profile is linear in them (so the fit is least squares):

    t = k · device(fw) + host(fw)

* `device`: the forward's operator time on the base profile (GEMMs at the calibrated rate for
  their row count, attention by its keys, LM head, KV and elementwise traffic) and `k` the one
  scale that maps isolated operators to operators inside a served step; written into the profile
  as its efficiencies divided by k (every rate and per-call cost scaled alike).
* `host`, per family of code (the engine's step loop; the baselines' shared static-batch loop):
  c_step + c_seq·sequences + c_refresh·Refresh canvases + c_logit·logit rows, and for the engine
  c_graph (a step replayed through a CUDA graph, over an eager one), c_capture (a graph captured
  during the point) and c_start (a point's first step: what a one-request warm-up left cold).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from dllm_bench.simulate.cost_model import CostModel, Forward, HostCost
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.implementations import MEASURED_HOST, get_impl
from dllm_bench.systems.spec import ENGINE as SYSTEM_ENGINE

HOST_TERMS = ("c_step", "c_seq", "c_refresh", "c_logit", "c_graph", "c_capture", "c_start")
# A term's typical size: the unit the prior's pull is measured in (seconds, or x for the scale).
SCALES = {"device": 1.0, "c_step": 10e-3, "c_seq": 1e-3, "c_refresh": 10e-3, "c_logit": 10e-6, "c_graph": 10e-3,
          "c_capture": 1.0, "c_start": 1.0}
ENGINE, STATIC = SYSTEM_ENGINE, "static-batch"


def family(system: str) -> str:
    """The code whose host time a system shares: the engine's loop, or the baselines' static batch."""
    return ENGINE if system == SYSTEM_ENGINE else STATIC


def host_features(fw: Forward) -> dict[str, float]:
    return {"c_step": 1.0, "c_seq": float(fw.n_seq), "c_refresh": float(fw.refresh), "c_logit": float(fw.rows),
            "c_graph": float(fw.graph), "c_capture": float(fw.capture), "c_start": float(fw.first)}


@dataclass
class Terms:
    device: float = 1.0
    host: dict[str, HostCost] = field(default_factory=dict)     # family -> its terms

    @classmethod
    def from_vector(cls, columns: list[str], x) -> Terms:
        t = cls()
        vals: dict[str, dict[str, float]] = {}
        for c, v in zip(columns, x, strict=True):
            if c == "device":
                t.device = float(v)
            else:
                fam, term = c.split(".")
                vals.setdefault(fam, {})[term] = float(v)
        t.host = {fam: HostCost(**v) for fam, v in vals.items()}
        return t

    def vector(self, columns: list[str]) -> list[float]:
        return [self.device if c == "device" else getattr(self.host.get(c.split(".")[0], HostCost()), c.split(".")[1])
                for c in columns]

    def step(self, device_cost: CostModel, fw: Forward, system: str) -> float:
        """A step's time on these terms (what the fitted profile charges)."""
        h = self.host.get(family(system), HostCost())
        return self.device * device_cost.step(fw).t_device + h.step_time(fw, device_cost.m.layers)


def device_model(hw: Hardware, shape) -> CostModel:
    """The base profile's operators alone, in this project's implementation."""
    return CostModel(shape, hw.peak_flops, hw.bandwidth, hw.efficiency, get_impl(MEASURED_HOST), HostCost())


def profile(base: Hardware, terms: Terms, systems: list[str], name: str) -> Hardware:
    """`base` with its operators scaled by `terms.device` and the fitted host terms for every
    system measured (`dllm-bench/<system>`) plus the static-batch family's as the default of the
    baselines not measured (`dllm-bench`)."""
    k = terms.device
    eff = replace(base.efficiency.scaled(1.0 / k), c_op=base.efficiency.c_op * k, c_attn=base.efficiency.c_attn * k)
    host = {f"{MEASURED_HOST}/{s}": terms.host[family(s)] for s in systems if family(s) in terms.host}
    if STATIC in terms.host:
        host[MEASURED_HOST] = terms.host[STATIC]
    return replace(base, name=name, efficiency=eff, host=host, impl=MEASURED_HOST, path="", validation={},
                   sleep_overshoot=())
