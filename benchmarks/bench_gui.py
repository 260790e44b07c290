"""GUI responsiveness: the event loop's worst delay (a 10 ms timer's lateness) while the engine loads a
160 MiB dense VAE and decodes a latent (goal <= 50 ms; the idle window's worst beside it); and the
memory graph's CPU cost per second of sampling (GUI-thread CPU time with the graph fed at 10 samples/s,
its dock shown and then hidden, above an event loop whose 10 Hz timer only takes the memory sample;
goal <= 1 % of a core). One JSON line per measurement.

    python benchmarks/bench_gui.py            (offscreen; about a minute)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _record import record  # noqa: E402

TICK_MS = 10
ROUNDS, SLICE_S = 5, 2.0  # the memory graph's interleaved slices


def _files(d: Path) -> dict:
    import torch

    from engine.formats.latent import write_latent
    from tests.support import synth

    vae = synth.write("sd_vae", d / "vae.safetensors", dense=True, max_dense_bytes=200 << 20)
    taesd = synth.write("taesd_decoder", d / "taesd_decoder.safetensors", dense=True, seed=7)
    lat = d / "x.latent"
    write_latent(lat, torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(0)))
    return {"vae": str(vae), "taesd": str(taesd), "latent": str(lat)}


class LatenessProbe:
    """A 10 ms timer; records how late each tick fires (the event loop's delay)."""

    def __init__(self) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.delays: list[float] = []
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self._on_tick)
        self._last = 0.0

    def start(self) -> None:
        self.delays.clear()
        self._last = time.perf_counter()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _on_tick(self) -> None:
        now = time.perf_counter()
        self.delays.append(max(0.0, now - self._last - TICK_MS / 1000))
        self._last = now

    def worst(self) -> float:
        return max(self.delays) if self.delays else 0.0

    def p99(self) -> float:
        d = sorted(self.delays)
        return d[int(0.99 * (len(d) - 1))] if d else 0.0


def _run_for(app, seconds: float, until=None) -> float:
    """Run the real event loop (QEventLoop.exec) for `seconds` and until `until()` holds."""
    from PySide6.QtCore import QEventLoop, QTimer

    t0 = time.perf_counter()
    loop = QEventLoop()

    def check() -> None:
        el = time.perf_counter() - t0
        if el > 150:
            loop.exit(1)
        elif el >= seconds and (until is None or until()):
            loop.exit(0)

    t = QTimer()
    t.setInterval(20)
    t.timeout.connect(check)
    t.start()
    if loop.exec() != 0:
        raise TimeoutError("the engine jobs took more than 150 s")
    t.stop()
    return time.perf_counter() - t0


def main() -> None:
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine import memory
    from engine.requests import Decode, Load, Unload

    os.environ.setdefault("LOADOUT_CONFIG_DIR", tempfile.mkdtemp(prefix="loadout-bench-cfg-"))
    os.environ.setdefault("LOADOUT_CACHE_DIR", tempfile.mkdtemp(prefix="loadout-bench-cache-"))
    app = QApplication.instance() or QApplication([])
    d = Path(tempfile.mkdtemp(prefix="loadout-bench-"))
    files = _files(d)
    w = MainWindow(restore_layout=False)
    w.show()
    w.start()
    _run_for(app, 0, until=lambda: w.device_status.report is not None)
    probe = LatenessProbe()

    # 1) event-loop lateness: idle baseline, then while the engine loads and decodes
    probe.start()
    _run_for(app, 5.0)
    probe.stop()
    idle_worst, idle_p99, idle_n = probe.worst(), probe.p99(), len(probe.delays)

    done: list[type] = []
    w.client.finished.connect(lambda job, _r: done.append(type(job.request)))
    probe.start()
    t0 = time.perf_counter()
    w.client.submit(Load(files["vae"]))
    w.client.submit(Decode(files["vae"], files["latent"], "tiled", 128, 32))
    w.client.submit(Decode(files["taesd"], files["latent"], "full"))
    w.client.submit(Unload(files["vae"], "vae"))
    _run_for(app, 0, until=lambda: len([k for k in done if k in (Load, Decode, Unload)]) >= 4)
    busy_s = time.perf_counter() - t0
    probe.stop()
    worst, p99 = probe.worst(), probe.p99()
    # Judged by the worst delay itself, not by its ratio to the idle window's worst: that denominator is
    # one scheduler hiccup of 1-4 ms here, and moved the ratio by 3x between identical runs. What a user
    # feels is a frozen window, so the goal is absolute (50 ms: well under the ~100 ms at which a
    # response stops feeling instant), and a change of less than one 60 Hz frame is never a regression:
    # on two shared cores the same code's worst delay varied 6-16 ms from run to run.
    record("event_loop_worst_delay_during_load_and_decode", worst, "s", judged="value", goal=0.05,
           slack=round(1 / 60, 4), baseline="idle window event loop (5 s)", baseline_value=idle_worst,
           p99_s=round(p99, 4), baseline_p99_s=round(idle_p99, 4), ticks=len(probe.delays), baseline_ticks=idle_n,
          engine_busy_s=round(busy_s, 2), tick_ms=TICK_MS)  # fmt: skip

    # 2) the graph's CPU cost: GUI-thread CPU per wall second, graph fed at 10 Hz vs sample only
    w.device_status.timer.stop()
    from PySide6.QtCore import QTimer

    # The three loops -- sampling only, the graph fed with its dock shown, and hidden -- run in
    # interleaved slices (ROUNDS of SLICE_S each, the dock switched between slices, outside the
    # measured time), each mode's CPU summed over its slices. Run one after the other in 10 s windows,
    # whatever drifted between the windows (this shared machine's load, the engine thread settling)
    # went into the difference: on unchanged code it read 4.1 and 7.6 ms/s shown, -0.5 and 2.0 hidden.
    modes = ("sample", "shown", "hidden")
    cpu, wall, ticks, draws = ({m: 0.0 for m in modes} for _ in range(4))

    def measure(mode: str) -> None:
        w.docks["graph"].setVisible(mode != "hidden")
        _run_for(app, 0.3)  # the dock's show/hide and layout settle outside the measured slice
        n = [0]

        def tick() -> None:
            s = memory.sample()
            if mode != "sample":
                w.graph.add_sample(s)
            n[0] += 1

        t = QTimer()
        t.setInterval(100)
        t.timeout.connect(tick)
        d0, c0, t0 = w.graph.draws, time.thread_time(), time.perf_counter()
        t.start()
        _run_for(app, SLICE_S)
        t.stop()
        cpu[mode] += time.thread_time() - c0
        wall[mode] += time.perf_counter() - t0
        ticks[mode] += n[0]
        draws[mode] += w.graph.draws - d0

    for _ in range(ROUNDS):
        for mode in modes:
            measure(mode)
    rate = {m: cpu[m] / wall[m] for m in modes}
    base = rate["sample"]
    # Judged by the graph's own cost (its CPU per second above the loop that only samples), not by
    # the ratio of the two: the sampling loop's 5-18 ms/s moved with the machine, and the ratio with
    # it (1.22 -> 1.49-1.92 on unchanged code), while the graph's own cost read 3.8-4.5 ms/s throughout.
    # Goal: at most 1 % of a core; a change under 2 ms/s (that noise, doubled) is none.
    for name, mode, goal in (("graph_cpu_per_second_at_10hz", "shown", 0.01),
                             ("graph_cpu_per_second_at_10hz_dock_hidden", "hidden", 0.002)):  # fmt: skip
        record(name, rate[mode] - base, "s/s", judged="value", goal=goal, slack=0.002,
               baseline="event loop with a 10 Hz timer taking memory.sample() only", baseline_value=base,
               ratio=rate[mode] / base, total_cpu_s_per_s=round(rate[mode], 5), samples=ticks[mode],
               redraws=draws[mode], points_kept=len(w.graph.t), dock=mode.replace("shown", "visible"),
               slices=ROUNDS, slice_s=SLICE_S)  # fmt: skip
    w.docks["graph"].show()
    w.close()


if __name__ == "__main__":
    main()
