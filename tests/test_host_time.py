"""Host time on the virtual clock: the host-term fit and its rescaling to the machine's speed,
the re-timing of a batch the machine's speed changed under, the wake cost after an idle gap, and
a request's hand-over (the idle sleep's lateness and add_request) through serve's own loop."""
from __future__ import annotations

import pytest

from dllm_bench.serve.loadgen import run_open_loop
from dllm_bench.simulate import drift, hardware
from dllm_bench.simulate.calibrate.host import fit_host
from dllm_bench.simulate.clock import VirtualClock, VirtualTimed
from dllm_bench.simulate.cost_model import CostModel, Efficiency, Forward, HostCost, LayerPass, Seg
from dllm_bench.simulate.implementations import get_impl
from tests.test_cost_model import LLADA_8B


class OneStep:
    """A serving system whose every request takes one step of 10 ms (VirtualTimed stamps it)."""

    def __init__(self, clock: VirtualClock):
        self.clock, self.pending = clock, []

    def add_request(self, prompt, params, request_id, arrival_time=None):
        self.pending.append(request_id)
        return request_id

    def has_unfinished(self):
        return bool(self.pending)

    def stats(self):
        return {}

    def step(self):
        self.clock.advance(0.010)
        # a RequestOutput's fields the clock restamps (one block, committed in this step)
        return [type("Out", (), {"request_id": self.pending.pop(0), "token_ids": [1], "prompt_ids": [1],
                                 "block_times": [0.0]})()]


def _host_forwards() -> list[Forward]:
    """A canvas (40 query rows per sequence) and a block (8 rows) forward at each batch size, as a
    real run mixes them: rows vary apart from the sequence count."""
    return [Forward((LayerPass(32, (Seg(q, 40),) * n),), rows=8 * n, n_seq=n) for n in (1, 2, 4, 8) for q in (40, 8)]


def test_host_fit_round_trip():
    dev = CostModel(LLADA_8B, 50e12, 1e12, Efficiency(), get_impl("engine"), HostCost())
    truth = HostCost(c_step=3e-3, c_seq=0.8e-3, c_row=20e-6)
    steps = [(fw, dev.step(fw).t_device + truth.time(fw.n_seq, 32, fw.query_tokens)) for fw in _host_forwards()]
    host, fit = fit_host(steps, dev)
    for name in ("c_step", "c_seq", "c_row"):
        assert getattr(host, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fit["max_rel_err"] < 1e-9
    assert fit["mean_rows_by_seqs"] == {"1": 24.0, "2": 48.0, "4": 96.0, "8": 192.0}
    # The two-term fit cannot follow the rows: it charges the block steps for the canvases.
    two, fit2 = fit_host(steps, dev, per_row=False)
    assert two.c_row == 0.0 and fit2["median_err_by_rows"]["<= 64"] > 0.01
    assert fit2["median_err_by_rows"]["> 64"] < -0.01


def test_weighted_host_fit_does_not_trade_a_lone_requests_steps_for_a_large_batch():
    """Host time the three terms cannot follow (1 ms more per doubling of the batch, as a host
    time that flattens with the batch): the unweighted fit is decided by the long steps of the
    batch of 8 and overcharges a lone request by a fifth; weighted by relative error, by a third
    of that, and the batch of 8 carries the misfit instead."""
    import math

    dev = CostModel(LLADA_8B, 5e14, 2e13, Efficiency(), get_impl("engine"), HostCost())
    truth = HostCost(c_step=0.5e-3, c_seq=0.2e-3, c_row=2e-6)
    steps = [(fw, dev.step(fw).t_device + truth.time(fw.n_seq, 32, fw.query_tokens) + 1e-3 * math.log2(fw.n_seq))
             for fw in _host_forwards()]
    _, plain = fit_host(steps, dev, relative=False)
    _, weighted = fit_host(steps, dev)
    assert plain["total_err_by_seqs"]["1"] > 0.15
    assert 0 < weighted["total_err_by_seqs"]["1"] < plain["total_err_by_seqs"]["1"] / 2
    assert weighted["total_err_by_seqs"]["8"] > plain["total_err_by_seqs"]["8"]


def test_host_fit_after_a_speed_change_is_rescaled_to_the_operators_speed():
    """Steps timed while the machine ran 1.3x slower than during the operator timings (the gauge
    read 1.3x its reference): unscaled, the fit blames the host for the device's slowdown;
    rescaled by the gauge, it recovers the host terms of the reference state."""
    dev = CostModel(LLADA_8B, 50e12, 1e12, Efficiency(), get_impl("engine"), HostCost())
    truth = HostCost(c_step=3e-3, c_seq=0.8e-3, c_row=20e-6)
    fws = _host_forwards()
    slow = [(fw, 1.3 * (dev.step(fw).t_device + truth.time(fw.n_seq, 32, fw.query_tokens))) for fw in fws]
    blamed, _ = fit_host(slow, dev)
    canvas = fws[0]
    assert blamed.time(1, 32, canvas.query_tokens) > 1.2 * truth.time(1, 32, canvas.query_tokens)
    host, _ = fit_host(drift.at_reference_speed(slow, reference=1.0, now=1.3), dev)
    for name in ("c_step", "c_seq", "c_row"):
        assert getattr(host, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def _gauge(readings):
    it = iter(readings)
    return lambda: next(it)


def test_a_batch_is_retimed_while_the_machine_changes_speed_during_it():
    """Gauge readings 20, 20 bracket a steady batch: kept at once. 22.5 then 55.9 (the machine
    slowed at the end of the batch: its mean would rescale the steps by 0.6x) -> timed again;
    the attempt whose readings agree is kept, and after RETIMES failed retries the best one."""
    runs = []
    out, now, attempts = drift.bracketed(lambda: runs.append(1) or len(runs), _gauge([20.0, 20.0]))
    assert (out, now, attempts) == (1, 20.0, 1)
    runs.clear()
    out, now, attempts = drift.bracketed(lambda: runs.append(1) or len(runs), _gauge([22.5, 55.9, 22.0, 22.4]))
    assert (out, attempts) == (2, 2) and now == pytest.approx(22.2)
    runs.clear()
    out, now, attempts = drift.bracketed(lambda: runs.append(1) or len(runs),
                                       _gauge([20, 40, 20, 26, 20, 30]), tol=1.15, retimes=2)
    assert (out, attempts) == (2, 3) and now == pytest.approx(23.0)      # 1.30x beats 2.0x and 1.5x


def test_wake_fit_round_trip_and_its_cost():
    truth = HostCost(wake_s=2e-3, wake_tau_s=0.06)
    gaps = (0.0, 0.03, 0.1, 0.3)
    # Each round drifts (the machine's state): the pairing with the round's back-to-back request cancels it.
    times = {g: [0.015 * (1 + 0.05 * r) + truth.wake(g) for r in range(16)] for g in gaps}
    w, tau, fit = drift.fit_wake(times)
    assert w == pytest.approx(truth.wake_s, rel=0.02) and tau == pytest.approx(truth.wake_tau_s, rel=0.1)
    assert fit["extra_s"] == pytest.approx([truth.wake(g) for g in gaps[1:]])
    assert truth.wake(0.0) == 0.0 and truth.wake(10.0) == pytest.approx(2e-3)
    assert HostCost().wake(1.0) == 0.0
    # No slowdown after idling (or a faster machine after it) fits no wake cost.
    assert drift.fit_wake({g: [0.01 - 1e-4 * g] * 4 for g in gaps})[0] == 0.0


def test_a_step_after_an_idle_gap_pays_the_wake_cost():
    clock = VirtualClock()
    host = HostCost(wake_s=2e-3, wake_tau_s=0.05)
    timed = VirtualTimed(OneStep(clock), clock, lambda: [], host.wake)
    timed.add_request([1], None, request_id="a")
    a = timed.step()[0]                  # right after the warm-up: no gap
    timed.add_request([1], None, request_id="b")
    b = timed.step()[0]                  # back to back
    clock.sleep(0.5)
    timed.add_request([1], None, request_id="c")
    c = timed.step()[0]                  # after 0.5 s idle
    for o in (a, b):
        assert o.finished_time - o.admitted_time == pytest.approx(0.010)
    assert c.finished_time - c.admitted_time == pytest.approx(0.010 + host.wake(0.5))


def test_an_arrival_after_an_idle_sleep_is_handed_over_late_and_pays_its_add_cost():
    hw = hardware.Hardware(name="t", kind="cpu", peak_flops=1.0, bandwidth=1.0, memory_bytes=1.0,
                           sleep_overshoot=((0.001, 1e-4), (0.1, 3e-4)))
    # Interpolated in log(seconds asked); the nearest measurement outside them; none for no sleep.
    assert hw.overshoot(0.01) == pytest.approx(2e-4) and hw.overshoot(1e-4) == 1e-4
    assert hw.overshoot(5.0) == 3e-4 and hw.overshoot(0.0) == 0.0
    assert hardware.Hardware(name="u", kind="cpu", peak_flops=1.0, bandwidth=1.0, memory_bytes=1.0).overshoot(1.0) == 0

    clock = VirtualClock(hw.overshoot)
    timed = VirtualTimed(OneStep(clock), clock, lambda: [], add_cost=5e-5)
    items = [{"prompt_ids": [1], "arrival": t} for t in (0.0, 0.1, 0.105)]
    recs = run_open_loop(timed, items, lambda it: None, clock=clock.now, sleep=clock.sleep)["records"]
    lag = [r["admitted_time"] - r["arrival_time"] for r in recs]
    # The first is handed over at once; the second after the sleep from the first's end (its add
    # and step) to 0.1 s, which returns late; the third arrives during the second's step and
    # waits for it (no sleep).
    assert lag[0] == pytest.approx(5e-5)
    assert lag[1] == pytest.approx(hw.overshoot(0.1 - 5e-5 - 0.010) + 5e-5) and lag[1] > 3e-4
    assert lag[2] == pytest.approx(recs[1]["finished_time"] + 5e-5 - 0.105)
