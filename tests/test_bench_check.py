"""The benchmark regression check (benchmarks/check.py) as pure logic on small JSONL files: no
benchmark runs, no timing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    """benchmarks/ is a folder of scripts, not a package: load a module by path, under a private name."""
    spec = importlib.util.spec_from_file_location(f"loadout_bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _load("check")  # puts benchmarks/ on sys.path for its own `_record` import
_record = _load("_record")


def line(name, ratio=None, *, value=1.0, judged=None, goal=None, better="lower", **extra):
    judged = judged or ("ratio" if ratio is not None else "value")
    return {"name": name, "value": value, "unit": "s", "ratio": ratio, "judged": judged, "goal": goal,
            "better": better, "machine": {"cpus": 2, "torch": "2.13.0"}, **extra}  # fmt: skip


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def report(latest: list[dict], baseline: list[dict]) -> check.Report:
    return check.compare(check.best_of(latest), check.best_of(baseline))


def row(rep: check.Report, name: str) -> check.Row:
    return next(r for r in rep.rows if r.name == name)


def test_a_regression_over_20_percent_is_flagged_and_19_is_not():
    rep = report([line("a", 1.21), line("b", 1.19)], [line("a", 1.0), line("b", 1.0)])
    assert row(rep, "a").regressed and not row(rep, "b").regressed
    assert row(rep, "a").change == pytest.approx(0.21)
    assert [r.name for r in rep.regressions] == ["a"] and not rep.ok


def test_a_better_figure_is_no_regression():
    rep = report([line("a", 0.5)], [line("a", 1.0)])
    assert row(rep, "a").change == pytest.approx(-0.5) and rep.ok


def test_a_missed_goal_is_flagged_even_without_a_baseline():
    rep = report([line("load_warm", 1.2, goal=1.0), line("load_cold", 0.9, goal=1.0)], [])
    assert [r.name for r in rep.missed_goals] == ["load_warm"]
    assert not rep.ok


def test_higher_is_better_turns_both_checks_around():
    base = [line("psnr", value=50.0, goal=40.0, better="higher")]
    rep = report([line("psnr", value=39.0, goal=40.0, better="higher")], base)
    r = row(rep, "psnr")
    assert r.judged == "value" and r.change == pytest.approx(0.22)
    assert r.regressed and r.missed_goal
    rep = report([line("psnr", value=41.0, goal=40.0, better="higher")], base)
    assert not row(rep, "psnr").regressed and not row(rep, "psnr").missed_goal and rep.ok
    rep = report([line("psnr", value=60.0, goal=40.0, better="higher")], base)
    assert row(rep, "psnr").change == pytest.approx(-0.2) and rep.ok


def test_a_figure_missing_from_the_baseline_is_new_not_a_failure():
    rep = report([line("a", 1.0), line("fresh", 5.0)], [line("a", 1.0)])
    r = row(rep, "fresh")
    assert r.new and r.then is None and r.change is None and not r.regressed
    assert rep.ok
    assert "new" in check.format_report(rep, Path("baseline.jsonl"), "best of 1")


def test_a_figure_gone_from_this_run_is_listed_not_failed():
    rep = report([line("a", 1.0)], [line("a", 1.0), line("cuda_only", 1.0)])
    assert rep.not_measured == ("cuda_only",) and rep.ok


def test_a_judged_value_is_compared_instead_of_the_ratio():
    base = [line("disk", ratio=2.0, value=0.04, judged="value", goal=0.05)]
    rep = report([line("disk", ratio=9.0, value=0.045, judged="value", goal=0.05)], base)
    assert not row(rep, "disk").regressed and not row(rep, "disk").missed_goal  # ratio ignored
    rep = report([line("disk", ratio=2.0, value=0.06, judged="value", goal=0.05)], base)
    assert row(rep, "disk").regressed and row(rep, "disk").missed_goal


def test_a_change_within_the_lines_slack_is_no_regression_however_large_its_percentage():
    # the event loop's worst delay: 6 ms -> 12 ms is +100 %, but less than one 60 Hz frame
    base = [line("delay", value=0.006, judged="value", goal=0.05, slack=1 / 60)]
    rep = report([line("delay", value=0.012, judged="value", goal=0.05, slack=1 / 60)], base)
    assert row(rep, "delay").change == pytest.approx(1.0) and not row(rep, "delay").regressed and rep.ok
    assert check._status(row(rep, "delay")) == "ok (within its slack)"  # the table says why it passed
    rep = report([line("delay", value=0.03, judged="value", goal=0.05, slack=1 / 60)], base)
    assert row(rep, "delay").regressed and not row(rep, "delay").missed_goal
    # a baseline line's slack holds for a latest line that does not carry one (and the other way round)
    rep = report([line("delay", value=0.012, judged="value")], base)
    assert not row(rep, "delay").regressed


def ref(name, bench, base_value, *, ratio=1.0, ref_name=None):
    """A ratio line whose reference workload (code that is not ours) took `base_value` seconds."""
    return line(
        name, ratio, bench=bench, baseline=ref_name or f"{name}'s reference", baseline_value=base_value
    )


def timed(name, bench, value, **extra):
    return line(name, value=value, judged="value", bench=bench, **extra)


def test_a_time_judged_by_value_is_divided_by_its_benchmarks_machine_speed():
    then = [ref("cold", "load", 1.0), ref("warm", "load", 0.1), timed("unload", "load", 0.016)]
    # the machine ran both references 2x slower, and our unload with them: no regression
    slow = [ref("cold", "load", 2.0), ref("warm", "load", 0.2), timed("unload", "load", 0.032)]
    rep = report(slow, then)
    r = row(rep, "unload")
    assert r.scale == pytest.approx(2.0) and r.now == pytest.approx(0.016) and not r.regressed and rep.ok
    assert row(rep, "cold").scale == 1.0  # a ratio's reference ran beside it: never scaled
    # the same figure on an unchanged machine is a regression: the factor comes from the references only
    same = [ref("cold", "load", 1.0), ref("warm", "load", 0.1), timed("unload", "load", 0.032)]
    assert row(report(same, then), "unload").regressed
    # unscaled (the old check), the slow machine's figure read as a regression
    assert check.compare(check.best_of(slow), check.best_of(then), scaled=False).regressions


def test_one_reference_workload_is_not_a_benchmarks_speed_the_median_of_all_is():
    then = [ref("a", "x", 1.0), ref("b", "y", 1.0), ref("c", "y", 1.0), ref("d", "z", 1.0),
            ref("g", "gguf", 1.0), timed("build", "gguf", 0.030)]  # fmt: skip
    # gguf's one reader ran faster (0.5x) while the machine ran the others 1.5x: its build is judged by 1.5
    now = [ref("a", "x", 1.5), ref("b", "y", 1.5), ref("c", "y", 1.4), ref("d", "z", 1.6),
           ref("g", "gguf", 0.5), timed("build", "gguf", 0.040)]  # fmt: skip
    speed = check.machine_speed(check.best_of(now), check.best_of(then))
    assert "gguf" not in speed and "x" not in speed and speed["y"] == pytest.approx(1.45)
    assert speed[None] == pytest.approx(1.5)  # the median of the five workloads
    r = row(report(now, then), "build")
    assert r.scale == pytest.approx(1.5) and not r.regressed


def test_a_reference_behind_several_figures_counts_once():
    then = [ref("apply", "patch", 2.0, ref_name="fp32 loop"), ref("key_map", "patch", 2.0, ref_name="fp32 loop"),
            ref("restore", "patch", 0.01), timed("t", "patch", 1.0)]  # fmt: skip
    now = [ref("apply", "patch", 8.0, ref_name="fp32 loop"), ref("key_map", "patch", 8.0, ref_name="fp32 loop"),
           ref("restore", "patch", 0.02), timed("t", "patch", 1.0)]  # fmt: skip
    # two distinct workloads (4x and 2x): their median 3x, not the 4x the duplicated one would make it
    assert check.machine_speed(check.best_of(now), check.best_of(then))["patch"] == pytest.approx(3.0)


def test_goals_bytes_and_decibels_are_judged_as_measured():
    then = [ref("cold", "load", 1.0), ref("warm", "load", 1.0),
            timed("disk", "load", 0.030, goal=0.05), line("peak", value=1e6, judged="value", unit="B", bench="load"),
            line("psnr", value=45.0, judged="value", unit="dB", better="higher", bench="load")]  # fmt: skip
    now = [ref("cold", "load", 2.0), ref("warm", "load", 2.0),
           timed("disk", "load", 0.060, goal=0.05), line("peak", value=1.5e6, judged="value", unit="B", bench="load"),
           line("psnr", value=30.0, judged="value", unit="dB", better="higher", bench="load")]  # fmt: skip
    rep = report(now, then)
    disk = row(rep, "disk")
    assert disk.now == pytest.approx(0.030) and not disk.regressed  # the slow machine's time compares...
    assert disk.missed_goal  # ...but the goal is what this machine must do: 60 ms > 50 ms
    assert row(rep, "peak").scale == 1.0 and row(rep, "peak").regressed
    assert row(rep, "psnr").scale == 1.0 and row(rep, "psnr").regressed


def test_the_report_says_what_each_scaled_time_was_divided_by(tmp_path, capsys):
    then = [ref("cold", "load", 1.0), ref("warm", "load", 1.0), timed("unload", "load", 0.010)]
    now = [ref("cold", "load", 2.0), ref("warm", "load", 2.0), timed("unload", "load", 0.050)]
    latest, baseline = write(tmp_path / "l.jsonl", now), write(tmp_path / "b.jsonl", then)
    argv = [
        "--rounds",
        "0",
        "--latest",
        str(latest),
        "--baseline",
        str(baseline),
        "--best",
        str(tmp_path / "x"),
    ]
    assert check.main(argv) == 1
    out = capsys.readouterr().out
    assert (
        "REGRESSED    unload: value 0.025 (0.05 s measured / 2, the machine) vs baseline 0.01 (+150% worse"
        in out
    )
    assert "machine: the same-run reference workloads took 2.00x their baseline time" in out
    assert "by benchmark: load 2.00x" in out


def test_best_of_rounds_follows_each_figures_direction():
    lines = [
        line("t", 1.3, round=1),
        line("t", 1.1, round=2),
        line("t", 1.2, round=3),
        line("q", value=38.0, better="higher", round=1),
        line("q", value=42.0, better="higher", round=2),
        line("none", None, value=None, round=1),
    ]
    best = check.best_of(lines)
    assert best["t"]["round"] == 2 and best["q"]["round"] == 2 and best["none"]["round"] == 1


def test_a_zero_baseline_figure_is_not_compared():
    rep = report([line("a", 0.5)], [line("a", 0.0)])
    assert row(rep, "a").change is None and rep.ok


def test_a_failed_benchmark_fails_the_check():
    rep = check.compare({}, {}, failed_benches=("bench_gui.py",))
    assert not rep.ok


def test_main_compares_files_prints_the_flags_and_the_table_and_exits_nonzero(tmp_path, capsys):
    latest = write(tmp_path / "latest.jsonl", [line("a", 1.3, round=1), line("a", 1.25, round=2),
                                               line("b", 1.0, goal=0.5), line("c", 1.0)])  # fmt: skip
    baseline = write(tmp_path / "baseline.jsonl", [line("a", 1.0), line("b", 1.0), line("c", 1.0)])
    best = tmp_path / "best.jsonl"
    argv = ["--rounds", "0", "--latest", str(latest), "--baseline", str(baseline), "--best", str(best)]
    assert check.main(argv) == 1
    out = capsys.readouterr().out
    assert "REGRESSED    a: ratio 1.25 vs baseline 1 (+25% worse" in out
    assert "MISSED GOAL  b: ratio 1, goal <= 0.5" in out
    assert "1 regressed > 20%, 1 missed goals" in out and out.rstrip().endswith("FAIL")
    assert [json.loads(s)["ratio"] for s in best.read_text().splitlines()] == [1.25, 1.0, 1.0]
    # the best lines, made the baseline, pass (the goal miss aside)
    write(latest, [line("a", 1.25), line("c", 1.0)])
    assert check.main(argv[:-2] + ["--baseline", str(best), "--best", str(tmp_path / "b2.jsonl")]) == 0


FAKE_BENCH = """
import os, sys
sys.path.insert(0, {benchmarks!r})
from _record import record
n = int(os.environ["LOADOUT_BENCH_ROUND"])
record("noisy", 1.5 if n == 1 else 1.0, "s", baseline="x", baseline_value=1.0)  # round 1 met a burst of load
record("real", 1.5, "s", baseline="x", baseline_value=1.0)  # slower every time: a real regression
"""


def test_a_flag_counts_only_if_it_shows_again_in_the_confirming_rounds(tmp_path, monkeypatch, capsys):
    # a real (tiny) benchmark script, run by the check as it runs the real ones: a subprocess per round
    monkeypatch.setattr(check, "HERE", tmp_path)
    (tmp_path / "bench_fake.py").write_text(FAKE_BENCH.format(benchmarks=str(BENCHMARKS)))
    monkeypatch.setattr(check, "DEFAULT", (check.Bench(("bench_fake.py",)),))
    latest = tmp_path / "latest.jsonl"
    baseline = write(tmp_path / "baseline.jsonl", [line("noisy", 1.0), line("real", 1.0)])
    argv = ["--rounds", "1", "--confirm", "2", "--latest", str(latest), "--baseline", str(baseline),
            "--best", str(tmp_path / "best.jsonl")]  # fmt: skip
    assert check.main(argv) == 1
    out = capsys.readouterr().out
    assert "REGRESSED    real: ratio 1.5" in out and "REGRESSED    noisy" not in out
    assert "2 flag(s); 1 still flagged; cleared: noisy 1.5 -> 1" in out
    assert sorted(json.loads(s)["round"] for s in latest.read_text().splitlines()) == [1, 1, 2, 2, 3, 3]
    # nothing flagged: nothing runs again
    write(baseline, [line("noisy", 2.0), line("real", 2.0)])
    assert check.main(argv) == 0
    assert "confirm" not in capsys.readouterr().out
    assert sorted(json.loads(s)["round"] for s in latest.read_text().splitlines()) == [1, 1]


def test_flagged_figures_name_the_benchmarks_to_run_again():
    best = {
        "a": line("a", 2.0, bench="load"),
        "b": line("b", 1.0, goal=0.5, bench="vae"),
        "c": line("c", 1.0, bench="scan"),
    }
    rep = check.compare(best, check.best_of([line("a", 1.0), line("c", 1.0)]))
    benches = (
        check.Bench(("bench_scan.py",)),
        check.Bench(("bench_vae.py", "--big", "0")),
        check.Bench(("bench_load.py",)),
    )
    assert check.flagged_benches(rep, best, benches) == benches[1:]


def test_main_without_a_baseline_still_checks_goals(tmp_path, capsys):
    latest = write(tmp_path / "latest.jsonl", [line("a", 1.0, goal=1.0)])
    argv = ["--rounds", "0", "--latest", str(latest), "--baseline", str(tmp_path / "none.jsonl"),
            "--best", str(tmp_path / "best.jsonl")]  # fmt: skip
    assert check.main(argv) == 0
    assert "no baseline" in capsys.readouterr().out


def test_record_writes_the_line_format_and_appends_to_the_results_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "results" / "latest.jsonl"
    monkeypatch.setenv(_record.OUT_ENV, str(out))
    monkeypatch.setenv(_record.ROUND_ENV, "2")
    _record.record("x", 2.0, "s", baseline="bare", baseline_value=4.0, goal=1.0, files=3)
    _record.record("psnr", 41.234, "dB", judged="value", goal=40.0, better="higher")
    printed = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    written = check.read_lines(out)
    assert printed == written
    x, p = written
    assert x["ratio"] == 0.5 and x["judged"] == "ratio" and x["goal_met"] is True and x["files"] == 3
    assert x["round"] == 2 and x["machine"]["cpus"] and "torch" in x["machine"]
    assert p["ratio"] is None and p["judged"] == "value" and p["goal_met"] is True
    with pytest.raises(ValueError):
        _record.record("bad", 1.0, "s", better="faster")
    with pytest.raises(ValueError):
        _record.record("bad", 1.0, "s", name_clash=1, ratio_x=2, goal_met=True)


FAKE_TIMED = """
import os, sys
sys.path.insert(0, {benchmarks!r})
from _record import record
n = int(os.environ["LOADOUT_BENCH_ROUND"])
record("r1", 1.0, "s", baseline="ref one", baseline_value=2.0)  # the machine runs its references 2x slower
record("r2", 1.0, "s", baseline="ref two", baseline_value=2.0)
record("t", 3.0 if n == 1 else 2.0, "s", judged="value")  # round 1 met a burst of load
"""


def test_a_cleared_flag_of_a_scaled_time_reads_scaled_on_both_sides(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check, "HERE", tmp_path)
    (tmp_path / "bench_fake.py").write_text(FAKE_TIMED.format(benchmarks=str(BENCHMARKS)))
    monkeypatch.setattr(check, "DEFAULT", (check.Bench(("bench_fake.py",)),))
    base = [dict(line("r1", 1.0), bench="fake", baseline="ref one", baseline_value=1.0),
            dict(line("r2", 1.0), bench="fake", baseline="ref two", baseline_value=1.0),
            dict(line("t", value=1.0, judged="value"), bench="fake")]  # fmt: skip
    baseline = write(tmp_path / "baseline.jsonl", base)
    argv = ["--rounds", "1", "--confirm", "2", "--latest", str(tmp_path / "latest.jsonl"), "--baseline",
            str(baseline), "--best", str(tmp_path / "best.jsonl")]  # fmt: skip
    assert check.main(argv) == 0
    out = capsys.readouterr().out
    # round 1: 3 s / 2 = 1.5 against 1 (flagged); the confirming rounds' 2 s / 2 = 1: as judged, not as measured
    assert "cleared: t 1.5 -> 1" in out
