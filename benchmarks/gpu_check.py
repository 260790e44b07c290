"""Every GPU check in one call, for the device tool's lent machine (its python3 holds a CUDA torch;
msgspec, platformdirs, gguf, diffusers and importlib_metadata travel as wheels in `.whl`, see
/work/.library/device/README.md; LOADOUT_TEST_DATA points at a carried copy of the manifests):

    python3 benchmarks/gpu_check.py [--device cuda] [--dim 96] [--skip-tests] [--steps 10] [--dir /tmp] \
        > $OUT/gpu-check.jsonl 2> $OUT/gpu-check.log

(the log holds pytest's whole output). Commit both under benchmarks/gpu/, named by date and card.

1. the `cuda`-marked tests (pytest -m cuda: residency streams and pinned memory, the step, VAE, GGUF);
2. the Wan 2.1 video VAE (its real width 96, random weights, float16) decoding 832x480, 5 latent frames:
   whole frames in one chunk, whole frames in chunks of one latent frame, and 512-px tiles in chunks of
   one -- the device's peak (torch.cuda.max_memory_allocated above the weights) against
   engine.vae.estimate's prediction for the same tiling (its CPU runtime left out), and the seconds.
   The estimate's coefficients (`K_VIDEO_*` in engine/vae/estimate.py) were calibrated on the CPU; on
   an H200 (2026-11-26) they predicted 1.33-1.44x the device's peak, an over-count as on the CPU.
3. the SD VAE's layout at its real width 128 (random weights, float16) decoding 1024^2 and 2048^2: full,
   512-px tiles (states on the device), and tiles under a 1 GiB budget (states in pinned host RAM):
   seconds, peak and PSNR against the full decode;
4. a sampling step of the SD1.5 UNet (every key and shape, dense random float16 weights) at a 64x64 latent:
   Loadout fully resident, 50 % and 10 % resident with the rest streamed from pinned RAM on a side
   stream; against diffusers' UNet2DConditionModel on the same file, plain and with
   `apply_group_offloading(leaf_level, use_stream=True)` on exactly the modules Loadout streams, and on
   the whole model (diffusers' documented use). s/step is the median after the first; peak is torch's
   peak allocated bytes above the level before the weights; each output is compared (relative L2).
   The same for FLUX.1-dev, Wan 2.1 1.3B (T2V, I2V), Z-Image, FLUX.2 [klein], Lumina 2, Qwen-Image (bfloat16) and
   AuraFlow (float16) at their real widths and reduced
   depth (bench_step's).
   Each line has the CPU seconds per step beside the wall seconds (equal: the step is bound by launching
   kernels), and the full run is repeated after the partial ones (a first-run effect shows as a change);
   the card is kept busy for half a second before each timed configuration (warm_gpu).

5. Cosmos 1.0's tokenizer at the release's widths (bfloat16) decoding 1280x704x33: whole frames, chunks of one latent
   frame, 512-px tiles (seconds, peak, estimate), and diffusers' AutoencoderKLCosmos on the same weights.

`--sections tests,video,cosmos,kl,gn,step` picks checks (gn: torch's GroupNorm against ops.group_norm); the whole run takes about 3 minutes on an H200.

Each figure is one JSON line on stdout. `--device cpu --dim 16` runs the same code here (peaks are then
not measured) to check the script before a GPU session spends its minutes on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "engine"))  # vae_fixtures: the KL VAE at a chosen width
TITLES = {
    "sd15": "sd15 64x64",
    "flux": "flux-dev width 1+2 blocks 256x256",
    "wan": "wan21 1.3B width 4 blocks 480x480",
    "wan_narrow": "wan21 30 blocks one head 64x64",
    "wan_i2v": "wan21 i2v width 4 blocks 480x480",  # per-op cost: launches and hand-overs, little arithmetic
    "z_image": "z_image width 1+1+1 blocks 512x512",
    "flux2": "flux2-klein-4b width 1+2 blocks 256x256",
    "lumina2": "lumina2 width 1+1+1 blocks 512x512",
    "qwen_image": "qwen_image width 1 block 512x512",
    "auraflow": "auraflow width 1+2 blocks 512x512",
    "hunyuan_video": "hunyuan_video width 1+2 blocks one 256x256 frame",
    "hunyuan_video15": "hunyuan_video15 width 2 blocks one 512x512 frame",
    "ltxv": "ltxv 2b width 2 blocks one 1024x1024 frame",
    "cosmos": "cosmos_predict2 2b width 2 blocks 512x512",
    "krea2": "krea2 width 1 block 512x512",
    "pixart": "pixart-sigma XL/2 width 2 blocks 1024x1024",
    "hunyuan_dit": "hunyuan-dit v1.2 width 4 blocks 1024x1024",
    "qwen_image21": "qwen_image21 width 1 block 1024x1024",
    "hidream": "hidream-i1 width 1+1 blocks 512x512",
    "mochi": "mochi 1 width 2 blocks one 848x480 frame",
    "minimax_h3": "minimax-h3 width 1+1 refiner blocks 512x512 + 256 text + 7 audio rows",
    "stable_cascade_c": "stable cascade stage c width 1+1 layers per half 1024x1024",
    "flux3": "flux3 width 1+1+1 per-mode + 2 single blocks 256x256 + 256x256 reference",
    "qwen_edit": "qwen_edit 2511 width 1 block 512x512 + 512x512 reference",
    "wan_animate2": "wan_animate2 1.3B width 4 blocks two 480x480 frames + a driving frame",
    "ernie_image": "ernie_image width 2 layers 512x512",
    "bria": "bria 3.2 width 1+2 blocks 512x512",
    "bria_fibo": "bria fibo width 1+2 blocks 512x512",
    "glm_image": "glm_image width 2 blocks 512x512",
    "ideogram4": "ideogram4 width 1 layer 512x512 + 256 text rows",
    "prx": "prx width 2 blocks 512x512",
    "joyimage": "joyimage edit width 2 blocks 512x512 + 512x512 reference",
    "longcat_image": "longcat_image width 1+1 blocks 512x512",
    "ovis_image": "ovis_image width 1+1 blocks 512x512",
    "kandinsky5": "kandinsky5 t2v lite width 2+2 blocks one 768x512 frame",
    "motif_video": "motif_video width 1+1 blocks one 512x512 frame + 512 text",
}
BF16 = (
    "z_image",
    "flux2",
    "lumina2",
    "qwen_image",
    "qwen_edit",
    "qwen_image21",
    "hunyuan_video",
    "ltxv",
    "cosmos",
    "krea2",
    "hidream",
    "mochi",
    "flux3",
    "ernie_image",
    "minimax_h3",
    "stable_cascade_c",
    "bria",
    "bria_fibo",
    "glm_image",
    "ideogram4",
    "prx",
    "joyimage",
    "longcat_image",
    "ovis_image",
    "kandinsky5",
    "motif_video",
)  # families Loadout runs in bfloat16 on a GPU (engine.model.dtypes): both sides so


def _half(family: str):
    import torch

    return torch.bfloat16 if family in BF16 else torch.float16


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def cuda_tests() -> None:
    # the carried wheels (PYTHONPATH=/tmp/site on the lent machine) stay importable
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=path)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/engine", "-m", "cuda", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    print(r.stdout + r.stderr, file=sys.stderr, flush=True)  # the whole log; stdout keeps one line per check
    tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
    emit(check="pytest -m cuda", rc=r.returncode, seconds=round(time.perf_counter() - t0, 1), tail=tail)


def timed_decode(vae, z, device: str, dtype, **kw):
    """engine.vae.decode(vae, z, ...) timed to the device's completion: (image, seconds, the device's
    peak allocated bytes above the level before it -- None on the CPU --, RunInfo)."""
    import torch

    from engine.vae import decode
    from engine.vae.run import RunInfo

    cuda = torch.device(device).type == "cuda"
    info = RunInfo()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    out = decode(vae, z, device=device, dtype=dtype, info=info, **kw)
    if cuda:
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0, torch.cuda.max_memory_allocated() - base if cuda else None, info


def video_vae(device: str, dim: int) -> None:
    import torch
    from bench_vae_video import _vae

    from engine.vae.estimate import RUNTIME_BYTES
    from engine.vae.run import job_of

    cuda = device == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    vae = _vae(dim).to(device=device, dtype=dtype)
    z = torch.randn(1, 16, 5, 60, 104, generator=torch.Generator().manual_seed(1))
    job = job_of(vae, z, "decode", torch.device(device), dtype)
    tiles = dict(tiled=True, tile=512, overlap=64, tile_frames=1)
    # a budget that holds one cache beside the chunk, not two: the retry snapshots wait in pinned host
    # RAM (choice.snapshot_for) -- against the run before it, what their copies cost in time and save
    one, two = (job.video_bytes(512, 1, 64, where) for where in ("host", "device"))
    runs = (("full, one chunk", dict(tiled=False, tile_frames=5)), ("full, chunks of 1", dict(tiled=False, tile_frames=1)),
            ("512-px tiles, chunks of 1", tiles),
            ("512-px tiles, chunks of 1, snapshots in host RAM", dict(tiles, budget=(one + two) // 2)))  # fmt: skip
    for name, kw in runs:
        _, seconds, peak, info = timed_decode(vae, z, device, dtype, **kw)
        weights = sum(p.numel() * p.element_size() for p in vae.parameters())
        tiled = info.mode == "tiled"
        predicted = job.video_bytes(
            info.tile_px if tiled else None,
            info.tile_frames,
            info.overlap_px if tiled else None,
            info.snapshot or "device",
        )
        predicted -= RUNTIME_BYTES + weights
        emit(check=f"wan21 dim{dim} 832x480x17 {name}", device=device, dtype=str(dtype).removeprefix("torch."),
             mode=info.mode, tile_px=info.tile_px, tile_frames=info.tile_frames, oom_retries=info.oom_retries,
             snapshot=info.snapshot,
             seconds=round(seconds, 2), peak_bytes=peak, predicted_bytes=predicted,
             predicted_over_peak=round(predicted / peak, 3) if peak else None)  # fmt: skip


def cosmos_vae(device: str, dim: int) -> None:
    """Cosmos 1.0's tokenizer (engine.vae.cosmos) at decoder widths 2 dim x (1, 2, 2, 2) (dim 128: the release's;
    random weights, bfloat16 on CUDA: its VAE never runs fp16) decoding 1280x704 x 33 frames (5 latent frames): whole
    frames, chunks of one latent frame, 512-px tiles -- seconds, peak, the estimate -- and diffusers'
    AutoencoderKLCosmos.decode on the same weights and latent: seconds, peak and PSNR against ours."""
    import math

    import torch
    from bench_vae_video import _cosmos_sd
    from diffusers import AutoencoderKLCosmos

    from engine.vae.cosmos_loading import build
    from engine.vae.estimate import RUNTIME_BYTES
    from engine.vae.loading import _made, strict_load
    from engine.vae.run import job_of

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    kw, sd = _cosmos_sd(dim)
    vae = build(dict(sd), "gpu-check", strict_load, _made).to(device=device, dtype=dtype)
    z = torch.randn(1, 16, 5, 88, 160, generator=torch.Generator().manual_seed(1))
    job = job_of(vae, z, "decode", torch.device(device), dtype)
    weights = sum(p.numel() * p.element_size() for p in vae.parameters())
    runs = (("full, one chunk", dict(tiled=False, tile_frames=5)), ("full, chunks of 1", dict(tiled=False, tile_frames=1)),
            ("512-px tiles, chunks of 1", dict(tiled=True, tile=512, overlap=64, tile_frames=1)))  # fmt: skip
    ours = None
    for name, kw_run in runs:
        out, seconds, peak, info = timed_decode(vae, z, device, dtype, **kw_run)
        ours = out if ours is None else ours
        tiled = info.mode == "tiled"
        predicted = job.video_bytes(info.tile_px if tiled else None, info.tile_frames, info.overlap_px if tiled else None,
                                    info.snapshot or "device") - RUNTIME_BYTES - weights  # fmt: skip
        emit(check=f"cosmos_predict1 dim{dim} 1280x704x33 {name}", device=device, dtype=str(dtype).removeprefix("torch."),
             mode=info.mode, tile_px=info.tile_px, tile_frames=info.tile_frames, seconds=round(seconds, 2),
             peak_bytes=peak, predicted_bytes=predicted, predicted_over_peak=round(predicted / peak, 3) if peak else None,
             psnr_vs_first=round(_psnr01(out, ours), 2))  # fmt: skip
    del vae
    ref = AutoencoderKLCosmos(**kw).eval()
    ref.load_state_dict(sd, strict=False)
    ref.encoder = None
    ref = ref.to(device=device, dtype=dtype)
    zz = z.to(device=device, dtype=dtype)
    got, seconds, peak = _timed(lambda: ref.decode(zz).sample.float().clamp(-1, 1), device)
    theirs = got.cpu().transpose(1, 2).add(1).div(2)
    emit(check=f"cosmos_predict1 dim{dim} 1280x704x33 diffusers AutoencoderKLCosmos.decode", device=device,
         dtype=str(dtype).removeprefix("torch."), seconds=round(seconds, 2), peak_bytes=peak,
         psnr_vs_ours=round(_psnr01(theirs, ours), 2) if math.isfinite(_psnr01(theirs, ours)) else None)  # fmt: skip


def _timed(fn, device: str):
    """(fn()'s result on the CPU, seconds, peak device bytes above the start) of its second run: the first pays for
    kernel selection."""
    import torch

    cuda = device == "cuda"
    for _ in range(2):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = fn()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return out.float().cpu(), seconds, torch.cuda.max_memory_allocated() - base if cuda else None


def audio(device: str, seconds: float) -> None:
    """LTX-2's sound at the releases' widths (bench_audio's random weights, bf16 in the file): Loadout's audio decoder
    and vocoder in float32 against diffusers' classes in float32 on the same weights -- seconds, peak, difference."""
    import tempfile

    import torch
    from bench_audio import _release_file

    from engine.vae.audio_loading import load_audio

    z = torch.randn(1, 8, round(25 * seconds), 16, generator=torch.Generator().manual_seed(1)).to(device)

    for version in ("2.0", "2.3"):
        with tempfile.TemporaryDirectory() as d:
            path, vae, voc = _release_file(version, Path(d))
            mine = load_audio(str(path)).to(device)
            a, dt, peak = _timed(lambda m=mine: m(m.latent(z)), device)
            emit(check=f"audio ltx-{version} {seconds:g} s loadout", device=device, seconds=round(dt, 3),
                 peak_bytes=peak, sample_rate=mine.sample_rate)  # fmt: skip
            del mine
            vae, voc = vae.to(device), voc.to(device)
            b, dt, peak = _timed(lambda v=vae, w=voc: w(v.decode(z).sample), device)
            emit(check=f"audio ltx-{version} {seconds:g} s diffusers", device=device, seconds=round(dt, 3),
                 peak_bytes=peak, max_abs_diff=float((a - b).abs().max()))  # fmt: skip


def _psnr01(a, b) -> float:
    import math

    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def kl_vae(device: str, ch: int, sizes: list[int]) -> None:
    """The SD VAE's layout at base width `ch` (random weights; float16 on CUDA): full decode against
    512-px tiles with 64 px overlap -- their states kept on the device (the budget holds them), and in
    pinned host RAM (a 1 GiB budget: smaller tiles, one at a time) -- seconds (the best of two),
    peak above the weights, PSNR against the full decode."""
    import torch
    from vae_fixtures import psnr, small_kl

    from engine.vae import decode

    cuda = device == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    vae = small_kl(ch=ch, seed=5).to(device=device, dtype=dtype)
    decode(vae, torch.randn(1, 4, 32, 32), tiled=False, device=device, dtype=dtype)  # warm-up
    from engine.vae import tiling

    tiles = dict(tiled=True, tile=512, overlap=64)
    # "strips given and taken": the same run with the halo exchange a store of copies uses (clone and
    # copy per strip), against the in-place one the device store uses since 3c29467 (one copy)
    runs = (("full", dict(tiled=False)), ("512-px tiles", tiles), ("512-px tiles, strips given and taken", tiles),
            ("tiles under a 1 GiB budget", dict(tiled=True, budget=1 << 30)))  # fmt: skip
    keeps = tiling.TileStore.keeps
    for size in sizes:
        z = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(size))
        full = None
        for name, kw in runs:
            if "given" in name:
                tiling.TileStore.keeps = lambda self, t: False
            # the best of two: a tiled run's first one also pays for each new tile shape's first
            # convolutions (0.29-0.59 s for the same 1024^2 tiling on an H100, 2026-11-26)
            try:
                out, seconds, peak, info = timed_decode(vae, z, device, dtype, **kw)
                c0 = time.process_time()
                again = timed_decode(vae, z, device, dtype, **kw)[1]
            finally:
                tiling.TileStore.keeps = keeps
            # the CPU seconds of that run: close to its wall time, the run waits on launching kernels
            cpu_s, seconds = time.process_time() - c0, min(seconds, again)
            if full is None:
                full = (out, seconds, peak)
            emit(check=f"kl vae ch{ch} {size}x{size}: {name}", device=device, dtype=str(dtype).removeprefix("torch."),
                 mode=info.mode, store=info.store, tile_px=info.tile_px, tiles=info.tiles, seconds=round(seconds, 3),
                 vs_full_time=round(seconds / full[1], 3), cpu_s=round(cpu_s, 3), peak_bytes=peak,
                 vs_full_peak=round(peak / full[2], 3) if peak else None, psnr_db=round(psnr(out, full[0]), 1))  # fmt: skip


def warm_gpu(device: str, seconds: float = 0.5) -> None:
    """Keep the GPU busy for `seconds` before a timed run: steps of a few milliseconds finish before an
    idle card (it idled while the weights were written) has raised its clocks, so the first
    configuration timed would run slower than the ones after it."""
    import torch

    if not device.startswith("cuda"):
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.float16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()
    del a
    torch.cuda.empty_cache()


def _step_loadout(model: str, family: str, budget: float | None, steps: int) -> dict:
    from bench_step import FAMILIES, step_inputs

    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import Step

    e = Engine()
    e.detect(DeviceOptions(vram_budget_gb=budget))
    e.residency.policy = dataclasses.replace(e.residency.policy, offload_tier="ram")
    out = model + f".out{budget}.safetensors"
    try:
        r = e.run(
            Step(model, inputs=step_inputs(model, family), size=FAMILIES[family][0], steps=steps, out=out)
        )
        layers = r.snapshot.get(r.component).layers
        return {"steps": list(r.step_seconds), "cpu": list(r.step_cpu_seconds), "peak": r.peak_device_bytes,
                "resident": r.resident_bytes,
                "streamed": r.streamed_bytes_per_step, "prefetched": r.prefetched, "mode": r.mode,
                "dtype": r.dtype, "streamed_modules": [p for p, tier, _ in layers if tier != "device"],
                "out": SafetensorsFile(out).tensor("out").clone()}  # fmt: skip
    finally:
        e.close()


def _step_diffusers(model: str, family: str, modules: list[str] | None, steps: int, device: str) -> dict:
    """diffusers' own model of the family on the same file, in float16 on the GPU (Z-Image: bfloat16) (float32 on the CPU, for a dry run);
    `modules` group-offloaded (leaf level, prefetched on a side stream from pinned RAM), the rest resident;
    None: the whole model group-offloaded at leaf level, as diffusers' docs use it (nothing resident)."""
    import torch
    from bench_step import _diffusers_model, _inputs, _run_diffusers, weights_only
    from diffusers.hooks import apply_group_offloading
    from safetensors.torch import load_file

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    dtype = _half(family) if cuda else torch.float32
    # positions stay float32 (MiniMax-H3's pipeline passes them in float64; bf16 rounds a place past 256)
    x = {k: v.to(dev, dtype if v.is_floating_point() and k != "position_ids" else v.dtype)
         for k, v in _inputs(model, family).items()}  # fmt: skip
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    unet = _diffusers_model(family)
    # As from_pretrained(torch_dtype=...) does: the modules the class keeps in float32 stay float32 (Wan's
    # norms, modulation tables, time embedder). Even so, diffusers' Wan in fp16 is 2.1 % (relative L2)
    # from its own float32 output (2 blocks at real width, on the CPU); Loadout's is 0.07 %: the 2 %
    # between the two on the GPU is diffusers' rounding.
    keep = tuple(getattr(unet, "_keep_in_fp32_modules", None) or ())
    unet.load_state_dict({k: v.to(torch.float32 if any(n in k for n in keep) else dtype, copy=True)
                          for k, v in weights_only(load_file(model)).items()}, assign=True)  # fmt: skip
    from bench_step import real_rotary_tables

    real_rotary_tables(unet, family)
    unet.eval()
    if modules is None:
        apply_group_offloading(unet, onload_device=dev, offload_device=torch.device("cpu"), offload_type="leaf_level",
                               use_stream=cuda)  # fmt: skip
    for name in modules or ():
        apply_group_offloading(unet.get_submodule(name), onload_device=dev, offload_device=torch.device("cpu"),
                               offload_type="leaf_level", use_stream=cuda)  # fmt: skip
    streamed = tuple(m + "." for m in modules or ())
    for name, mod in unet.named_modules():
        if modules is not None and not (name + ".").startswith(streamed):
            for t in list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)):
                t.data = t.data.to(dev)
    times, cpu = [], []
    with torch.inference_mode():
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            y = _run_diffusers(unet, family, x)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    out = y.float().cpu()
    del unet, y
    if cuda:
        torch.cuda.empty_cache()
    return {"steps": times, "cpu": cpu, "peak": peak, "out": out}


def gpu_step(folder: Path, family: str, steps: int, device: str) -> None:
    import statistics

    import torch
    from bench_step import write_random

    model = folder / f"{family}_fp16.safetensors"
    t0 = time.perf_counter()
    write_random(model, family, dtype=_half(family))
    total = model.stat().st_size
    title = TITLES[family]
    emit(check=f"step {title}: weights written", bytes=total, seconds=round(time.perf_counter() - t0, 1))

    def rel(a: dict, b: dict) -> float:
        return float((a["out"] - b["out"]).norm() / b["out"].norm())

    def med(r: dict, what: str = "steps") -> float:
        return statistics.median(r[what][1:] or r[what])

    warm_gpu(device)
    full = _step_loadout(str(model), family, None, steps)
    warm_gpu(device)
    plain = _step_diffusers(str(model), family, [], steps, device)
    emit(check=f"step {title}: loadout full vs diffusers plain", dtype=full["dtype"], mode=full["mode"],
         rel_l2=rel(full, plain),
         ours_s=round(med(full), 4), baseline_s=round(med(plain), 4), ratio=round(med(full) / med(plain), 3),
         goal="<= 1.1", ours_peak=full["peak"], baseline_peak=plain["peak"],
         # CPU seconds per step: a step whose CPU time is its wall time is bound by launching kernels
         ours_cpu_s=round(med(full, "cpu"), 4), baseline_cpu_s=round(med(plain, "cpu"), 4))  # fmt: skip
    for pct in (50, 10):
        warm_gpu(device)
        part = _step_loadout(str(model), family, total * pct / 100 / 1024**3, steps)
        warm_gpu(device)
        group = _step_diffusers(str(model), family, part["streamed_modules"], steps, device)
        emit(check=f"step {title}: loadout {pct}% resident (rest from pinned RAM)", mode=part["mode"],
             ours_s=round(med(part), 4), ours_cpu_s=round(med(part, "cpu"), 4), vs_full=round(med(part) / med(full), 3),
             group_offload_s=round(med(group), 4), vs_group_offload=round(med(part) / med(group), 3),
             ours_peak=part["peak"], group_offload_peak=group["peak"], resident=part["resident"],
             streamed_per_step=part["streamed"], prefetched=part["prefetched"],
             equals_full=bool(torch.equal(part["out"], full["out"])), group_vs_plain_rel_l2=rel(group, plain))  # fmt: skip
    # The full run again, after the partial ones: on the H200 (2026-11-26) Wan's full step took 2.4x
    # diffusers' and longer than its own 50 % partial step; a first-run effect shows here as a change.
    warm_gpu(device)
    again = _step_loadout(str(model), family, None, steps)
    emit(check=f"step {title}: loadout full again (after the partial runs)", ours_s=round(med(again), 4),
         ours_cpu_s=round(med(again, "cpu"), 4), vs_first_full=round(med(again) / med(full), 3),
         steps_s=[round(t, 4) for t in again["steps"]], equals_full=bool(torch.equal(again["out"], full["out"])))  # fmt: skip
    warm_gpu(device)
    whole = _step_diffusers(str(model), family, None, steps, device)
    model.unlink()
    emit(check=f"step {title}: diffusers whole-model leaf group offload (nothing resident)",
         s=round(med(whole), 4), vs_loadout_full=round(med(whole) / med(full), 3), peak=whole["peak"],
         rel_l2_vs_plain=rel(whole, plain))  # fmt: skip


def groupnorm(device: str) -> None:
    """torch's GroupNorm against ops.group_norm (per-channel statistics above ops.FAST_GN_ELEMS) on
    the VAE's and a UNet's shapes, fp16: milliseconds and errors against float64 (GPU only)."""
    if not device.startswith("cuda"):
        return
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    from groupnorm_probe import SHAPES, one_shape

    g = torch.Generator(device=device).manual_seed(0)
    for shape in SHAPES:
        row = one_shape(shape, g)
        emit(check=f"groupnorm {'x'.join(map(str, shape))} fp16", **row,
             speedup=round(row["native"]["ms"] / row["ops"]["ms"], 3))  # fmt: skip
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--skip-tests", action="store_true")
    # 20: a reduced model's step takes milliseconds, and the median of 7 after the first did not settle
    ap.add_argument("--steps", type=int, default=20, help="forward passes per step configuration")
    ap.add_argument("--dir", type=Path, default=None, help="where the step's weights are written")
    ap.add_argument(
        "--families",
        default="sd15,flux,wan,wan_narrow,wan_i2v,z_image,flux2,lumina2,qwen_image,auraflow,hunyuan_video,hunyuan_video15,ltxv,cosmos,krea2,pixart,hidream,qwen_image21,flux3,hunyuan_dit,mochi,stable_cascade_c,minimax_h3,ernie_image,kandinsky5,longcat_image,ovis_image,prx,joyimage,glm_image,ideogram4,bria,bria_fibo,motif_video",
        help="denoisers to step (bench_step's families)",
    )
    ap.add_argument("--sections", default="tests,video,cosmos,audio,kl,gn,step", help="which checks run")
    ap.add_argument("--audio-seconds", type=float, default=10.0, help="seconds of LTX-2 sound to decode")
    ap.add_argument(
        "--cosmos-dim", type=int, default=128, help="Cosmos tokenizer's width (128: the release's)"
    )
    ap.add_argument("--kl-ch", type=int, default=128, help="the KL VAE's base width (128: the real SD VAE)")
    ap.add_argument("--kl-sizes", default="1024,2048", help="output sizes of the KL VAE decodes")
    a = ap.parse_args()
    import torch

    emit(check="machine", torch=torch.__version__, cuda=torch.cuda.is_available(),
         gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)  # fmt: skip
    sections = a.sections.split(",")
    if "tests" in sections and not a.skip_tests:
        cuda_tests()
    if "video" in sections:
        video_vae(a.device, a.dim)
    if "cosmos" in sections:
        cosmos_vae(a.device, a.cosmos_dim)
    if "audio" in sections:
        audio(a.device, a.audio_seconds)
    if "kl" in sections:
        kl_vae(a.device, a.kl_ch, [int(v) for v in a.kl_sizes.split(",")])
    if "gn" in sections:
        groupnorm(a.device)
    if "step" in sections:
        import tempfile

        with tempfile.TemporaryDirectory(dir=a.dir) as d:
            for family in a.families.split(","):
                gpu_step(Path(d), family, a.steps, a.device)


if __name__ == "__main__":
    main()
