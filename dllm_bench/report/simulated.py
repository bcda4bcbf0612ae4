"""The report's simulated section: a `dllm-bench simulate` run (its points carry
`simulated: true`) rendered apart from every measured row, labelled simulated, with the hardware
profile it ran on, and the serving claims checked on it (section `simulate:<hardware>`)."""
from __future__ import annotations

from pathlib import Path

from dllm_bench import results
from dllm_bench.console import num
from dllm_bench.report.claims import Claims
from dllm_bench.report.sections import _figures
from dllm_bench.report.serving import points_frame, serve_claims, serve_table
from dllm_bench.simulate.hardware import validation_label


def hardware_line(hw: dict) -> str:
    """The hardware profile of a simulated run, in one line."""
    def unit(v, scale, fmt):
        v = num(v)
        return "?" if v is None else fmt.format(v / scale)
    return (f"{hw.get('name', '?')} ({hw.get('kind', '?')}{', ' + hw['description'] if hw.get('description') else ''}): "
            f"peak {unit(hw.get('peak_flops'), 1e12, '{:.1f}')} TFLOP/s, bandwidth "
            f"{unit(hw.get('bandwidth'), 1e9, '{:.0f}')} GB/s, memory {unit(hw.get('memory_bytes'), 2**30, '{:.0f}')} GiB")


def simulated_section(run_dir: Path, claims: Claims, files_dir: Path, rel_base: Path) -> str:
    cfg = results.load_config(run_dir).get("config", {})
    hw = cfg.get("hardware") or {}
    name = hw.get("name", "?")
    df = points_frame(run_dir, simulated=True)
    out = [f"## Simulated, not measured: serving on {name}\n\n",
           f"Run `{run_dir.name}` (`dllm-bench simulate`): the real schedulers on a virtual clock with the "
           f"cost model of the hardware profile {hardware_line(hw)}"
           + (f", from `{cfg['hardware_file']}`" if cfg.get("hardware_file") else "")
           + f"; implementations {cfg.get('impls', {})}. Every row below is **simulated** "
           f"({validation_label(hw.get('kind', ''), name, hw.get('validation'))}).\n\n"]
    if df.empty:
        return "".join(out) + "_(the run has no simulated points)_\n"
    table, per_ds = serve_table(df)
    out.append(table)
    out.append(_figures(run_dir / "plots", "*.png", files_dir, f"simulate-{name}", rel_base))
    out.append(f"\n### Claims on the simulated {name} (heaviest load per dataset)\n\n")
    out.append(serve_claims(per_ds, df, claims, f"simulate:{name}", f" (simulated on {name})"))
    return "".join(out)
