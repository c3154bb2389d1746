"""K3_STEP_TIMING (k3_sglang/serving/step_timing.py) and the report math of `k3 bench plain-decode`: the step record
against a scripted clock, the hooks against the installed SGLang (drift), inertness without the variable, and the
settings' refusal of a prefix in a missing directory."""
from __future__ import annotations

import inspect
import json
import pkgutil
import time

import pytest

from k3_sglang.serving import step_timing
from k3_sglang.tooling.bench.plain_decode import ArmSteps
from k3_sglang.tooling.bench.plain_decode_report import extra_share
from k3_sglang.serving.step_timing import StepTimer, StepTimingSettings, read_steps


class Clock:
    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_a_decode_step_is_written_when_the_next_decode_step_begins(tmp_path):
    path = tmp_path / "steps.7.jsonl"
    timer = StepTimer(path, clock=Clock([10.0, 10.5, 11.25, 12.0]))
    timer.begin(is_decode=True, batch_size=3)  # step 1 opens at 10.0
    timer.add("run", 0.25)
    timer.add("fwd", 0.2)
    timer.add("fwd", 0.05)  # a step with two forwards sums them
    timer.begin(is_decode=True, batch_size=3)  # 10.5: step 1 closes (loop 0.5), step 2 opens
    timer.add("fwd", 0.5)
    timer.begin(is_decode=False, batch_size=1)  # 11.25: a prefill follows step 2, which is dropped
    timer.add("fwd", 9.0)  # not a decode step: nothing is open
    timer.begin(is_decode=True, batch_size=1)  # 12.0: a decode after a prefill opens a fresh step
    timer.flush()
    rows = read_steps(tmp_path / "steps")
    assert rows == [{"t": 10.0, "b": 3, "loop": 0.5, "run": 0.25, "fwd": 0.25}]


def test_the_writer_thread_writes_every_closed_step_once_while_the_loop_runs(tmp_path):
    path = tmp_path / "s.1.jsonl"
    ticks = iter(range(10_000))
    timer = StepTimer(path, clock=lambda: float(next(ticks)))
    timer.begin(True, 1)
    timer.begin(True, 1)
    assert not path.exists()  # the loop itself never writes
    timer.start_writer(every=0.001)
    for _ in range(2_000):  # the loop keeps appending while the writer takes the buffer
        timer.begin(True, 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not path.exists() or len(path.read_text().splitlines()) < 2_001):
        time.sleep(0.01)
    lines = path.read_text().splitlines()
    assert len(lines) == 2_001 and [json.loads(x)["t"] for x in lines] == [float(i) for i in range(2_001)]


def test_hooks_time_the_wrapped_calls_into_the_open_step(tmp_path, monkeypatch):
    timer = StepTimer(tmp_path / "h.1.jsonl")
    monkeypatch.setattr(step_timing, "_timer", timer)

    class Mode:
        def __init__(self, decode):
            self.decode = decode

        def is_decode(self):
            return self.decode

    class Batch:
        forward_mode = Mode(True)
        reqs = [object(), object()]

    calls = []
    out = step_timing.time_run_batch(lambda self, batch: calls.append(batch) or "res", "sched", Batch())
    assert out == "res" and calls and timer._open["b"] == 2 and timer._open["run"] > 0
    step_timing.time_forward(lambda: None)
    assert timer._open["fwd"] > 0
    with pytest.raises(ValueError):  # an exception in the wrapped call still propagates
        step_timing.time_forward(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_every_target_exists_with_the_arguments_the_hooks_pass():
    for target, hook, kind in step_timing.installed_hooks():
        module, attr = target.rsplit(".", 1)
        original = getattr(pkgutil.resolve_name(module), attr)
        assert callable(original) and kind == "AROUND", target
    from sglang.srt.managers.scheduler import Scheduler

    assert list(inspect.signature(Scheduler.run_batch).parameters)[:2] == ["self", "batch"]


def test_without_the_variable_register_installs_nothing(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.delenv("K3_STEP_TIMING", raising=False)
    registered = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, *a, **k: registered.append(a)))
    step_timing.register()
    assert registered == [] and step_timing._timer is None


def test_a_prefix_in_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="K3_STEP_TIMING"):
        StepTimingSettings.from_env({"K3_STEP_TIMING": str(tmp_path / "nope" / "steps")})
    assert StepTimingSettings.from_env({"K3_STEP_TIMING": str(tmp_path / "steps")}).step_timing


def test_arm_medians_and_the_share_above_the_base_arm():
    rows = [{"b": 1, "loop": 0.030, "run": 0.0292, "fwd": 0.029} for _ in range(20)]
    rows += [{"b": 4, "loop": 9.0, "run": 9.0, "fwd": 1.0}]  # other batch sizes are left out
    base = ArmSteps.of(rows[2:])
    assert base.steps == 18 and base.host == pytest.approx(0.001) and base.forward == pytest.approx(0.029)
    assert base.run_outside_forward == pytest.approx(0.0002) and base.after_run == pytest.approx(0.0008)
    slower = ArmSteps.of([{**r, "loop": r["loop"] + 0.0003} for r in rows[2:]])
    assert extra_share(slower, base) == pytest.approx(0.01)
    with pytest.raises(RuntimeError, match="too few"):
        ArmSteps.of(rows[:5])


def test_paired_shares_compare_each_request_with_the_base_arms_same_request():
    from k3_sglang.tooling.bench.plain_decode_report import paired_shares

    def rows(t0, host, fwd, n=12):
        return [{"t": t0 + i, "b": 1, "loop": fwd + host, "run": fwd, "fwd": fwd} for i in range(n)]

    # request 0 ran on a fast machine, request 1 on one twice as slow: the pair still shows the arm's extra host time
    base = rows(0, 0.001, 0.020) + rows(100, 0.002, 0.040)
    arm = rows(50, 0.0012, 0.020) + rows(150, 0.0024, 0.040)
    win = lambda rs, t: ArmSteps.window(rs, t, t + 20)  # noqa: E731
    shares = paired_shares([win(arm, 50), win(arm, 150)], [win(base, 0), win(base, 100)])
    assert shares == pytest.approx([0.0002 / 0.021, 0.0004 / 0.042])
    assert ArmSteps.window(base, 1000, 2000) is None  # no steps in that request: left out
    assert paired_shares([None, win(arm, 150)], [win(base, 0), None]) == []


def test_a_concurrency_section_times_only_its_rounds_steps_of_its_batch_size():
    from k3_sglang.tooling.bench.plain_decode import arm_result
    from k3_sglang.tooling.bench.verify import RequestResult

    def rows(t0, b, host, n=12):
        return [{"t": t0 + i, "b": b, "loop": 0.030 + host, "run": 0.030, "fwd": 0.030}
                for i in range(n)]

    # warm-up at batch 1 before the rounds, each round's ramp at batch 3, a stray batch-1 step inside a round
    steps = rows(0, 1, 0.5) + rows(100, 3, 0.9, 3) + rows(103, 4, 0.001) + rows(115, 1, 0.7, 1) + rows(200, 4, 0.003)
    reqs = [RequestResult(f"r{i}", 0.1, 1.0, (1, 2, 3), None) for i in range(4)]
    out = arm_result(steps, [(reqs, 100, 150), (reqs, 200, 250)], 4)
    assert out["steps"].steps == 24 and out["steps"].host_mean == pytest.approx(0.002)
    assert [w.host for w in out["per_request"]] == pytest.approx([0.001, 0.003])
    assert out["decode_tps"] == pytest.approx(4 * 8 * 2 / 8.0) and len(out["outputs"]) == 8


@pytest.mark.parametrize("argv, message", [
    (["bench", "plain-decode", "--requests", "1", "--out", "-"], "--requests must be >= 2"),
    (["bench", "plain-decode", "--max-new-tokens", "8", "--out", "-"], "--max-new-tokens >= 16"),
    (["bench", "plain-decode", "--width", "32", "--out", "-"], "--width must be in 2..16"),
    (["bench", "plain-decode", "--concurrency", "1", "65", "--out", "-"], "--concurrency values must be in 1..64"),
])
def test_bad_plain_decode_arguments_exit_2_before_starting_servers(argv, message, capsys):
    from k3_sglang.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_arm_c_without_a_cost_table_exits_2(tmp_path, monkeypatch, capsys):
    from k3_sglang.cli import main

    monkeypatch.chdir(tmp_path)  # docs/verify-cost-cpu.json is relative to the working directory
    assert main(["bench", "plain-decode", "--arms", "C", "--out", "-"]) == 2
    assert "run `k3 bench profile-verify` first" in capsys.readouterr().err
