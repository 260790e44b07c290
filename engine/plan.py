""" "Will it fit?" — predicted peak device memory of each step (load, patch, decode) from headers alone,
and the mode that fits, by the same rules the residency manager then applies.

* load: the diffusion model at its storage dtype; when it does not fit the budget, the manager keeps
  the smallest modules resident while they fit (the streamed rest costs nothing on the device) — the
  prediction runs that same rule over the header's modules, so it is exact, not a guess. Text encoders
  run before it, on the device only where ComfyUI's rule puts them.
* patch: a LoRA's tensors go to the device, and each patched module is computed in fp32 (weight +
  delta) — at most twice the largest weight × 4 bytes at a time. Streamed modules are patched on the
  fly, so when the patch does not fit the resident part shrinks to make room ("partial").
* decode: the VAE's weights plus its activations, by engine.vae's estimate (calibrated against measured
  decodes: engine/vae/estimate.py). When the whole image does not fit, the tiles engine.vae.choice
  picks for what the budget leaves beside the VAE (the one place that decides), at their estimate.
* sound: a clip of a file that holds LTX-2's sound decoder also decodes its sound (engine.plan_sound).
Sampling itself is out of scope; the minimum inference memory kept free for it is in each detail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1024**3
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float64": 8}


@dataclass(frozen=True)
class ComponentFacts:
    name: str
    file_dtype: str
    unit_sizes: tuple[int, ...]  # bytes per module at the storage dtype, in file order
    must_place: int  # bytes of plain tensors (no castable op) that cannot stream on an accelerator
    largest_weight_numel: int
    castable_sizes: tuple[int, ...] = ()
    unit_must: tuple[bool, ...] = ()  # per module: a plain tensor, which cannot stream (engine.residency)


def component_facts(path: str, prefix: str, name: str, storage: str | None) -> ComponentFacts:
    """Module sizes of one component from the file's header (safetensors, GGUF or torch zip), at `storage` (None =
    file dtypes). Quantized tensors (ggml blocks) and scales count as stored: they stay so when loaded."""
    from .formats import open_weights
    from .formats.dtypes import dominant_float_dtype
    from .model.tree import module_specs
    from .quant.scaled import is_companion

    h = open_weights(path).header
    rel = [(k[len(prefix) :], i) for k, i in h.tensors.items() if k.startswith(prefix)]
    specs = module_specs(rel)
    file_dtype = dominant_float_dtype(i.dtype for _, i in rel)
    sizes, plain, largest, castable, must = [], 0, 0, [], []
    for s in specs:
        n = sum(
            i.numel * _ITEM[storage]
            if storage and i.dtype.startswith(("F", "BF")) and not is_companion(i.name)
            else i.nbytes
            for i in s.tensors.values()
        )
        sizes.append(n)
        must.append(s.kind == "plain")
        if s.kind == "plain":
            plain += n
        else:
            castable.append(n)
        w = s.tensors.get("weight")
        if w is not None and s.kind in ("linear", "conv1d", "conv2d", "conv3d"):
            largest = max(largest, w.numel)
    return ComponentFacts(name, file_dtype, tuple(sizes), plain, largest, tuple(castable), tuple(must))


def _file_dtype(path: str, prefix: str) -> str:
    return component_facts(path, prefix, "", None).file_dtype


def parse_size(text: str) -> tuple[int, ...]:
    """'1024x768' -> (1024, 768); a video 'WxHxF' -> (W, H, F) with F output frames."""
    try:
        parts = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"{text!r} is not a size like 1024x1024 (or 832x480x81 for a video)") from None
    if len(parts) not in (2, 3):
        raise ValueError(f"{text!r} is not a size like 1024x1024 (or 832x480x81 for a video)")
    if any(v <= 0 for v in parts):
        raise ValueError(f"{text!r}: width, height and frames must be positive")
    return parts


def make_plan(
    model: str,
    *,
    loras: tuple[str, ...] = (),
    decode: tuple[int, int] | None = None,
    vram_gb: float | None = None,
    report=None,
    free_bytes: int | None = None,
) -> dict:
    """The Plan JSON of DESIGN.md for `model` on the selected device (or a hypothetical one of
    `vram_gb` GiB; on a CPU-only machine that device is assumed to compute fp16 and bf16)."""
    from .detect import detect_file
    from .detect.result import not_a_model
    from .devices import DeviceInfo, budget_bytes, detect_devices, reserve_bytes_for
    from .errors import InvalidRequest, UnsupportedModel, from_json
    from .model.dtypes import overrides_from_options, place, role_of
    from .residency.placement import place_modules

    report = report or detect_devices()
    det = detect_file(model)
    if det.error is not None:
        raise from_json(det.error.to_json(), model)
    what = not_a_model(det.kind)
    if what is not None:  # weights of no model: there is nothing to place
        raise InvalidRequest(f"{model}: this is {what}; give the model with --model")
    if det.format not in ("safetensors", "gguf", "torch-zip"):  # what engine.formats.open_weights loads
        raise UnsupportedModel(
            f"{model}: a legacy torch file (saved before torch 1.6); plans are made for the files Loadout "
            "loads: .safetensors, .gguf and torch zip checkpoints"
        )
    info = report.selected
    min_inf = report.min_inference_bytes
    if vram_gb is not None:
        total = int(vram_gb * GIB)
        if not info.is_accelerator:
            info = DeviceInfo("cuda", 0, "hypothetical GPU", total, "cuda:0", fp16=True, bf16=True)
        reserve = reserve_bytes_for(report.platform, total, report.options)
        min_inf = report.inference_floor_bytes + reserve
        free = total
        label = f"hypothetical {vram_gb:g} GiB {info.kind} device"
    else:
        if free_bytes is None:
            from . import memory

            free_bytes = memory.MemorySampler(memory.target_for(info)).sample().device_free
        free = free_bytes
        label = info.label
    budget = budget_bytes(free, min_inf, report.vram_budget_bytes)
    device = info.torch_device
    comps = {n: c for n, c in det.components.items() if n != "other"}

    def placement(name: str, fd: str, size: int):
        kw = overrides_from_options(name, report.options)
        if role_of(name) == "vae" and report.options.cpu_vae:
            kw["force_device"] = "cpu"
        return place(name, fd, device, vram_state=report.vram_state.value, size_bytes=size, free_device=budget,
                     free_cpu=report.ram_total, info=info, architecture=det.architecture, **kw)  # fmt: skip

    def placed(name):
        c = comps[name]
        p = placement(name, _file_dtype(model, c.prefix), c.bytes)
        return p, component_facts(model, c.prefix, name, p.storage_dtype)

    steps = []
    diffusion = next((n for n in comps if role_of(n) == "diffusion"), None)
    resident = 0
    if diffusion is not None:
        p, f = placed(diffusion)
        total_b = sum(f.unit_sizes)
        must = f.must_place if info.is_accelerator else 0
        tes = {}
        te_peak = 0
        for n in comps:
            if role_of(n) == "text_encoder":
                tp, tf = placed(n)
                b = sum(tf.unit_sizes)
                tes[n] = {"bytes": b, "device": tp.device, "storage_dtype": tp.storage_dtype or tf.file_dtype}
                if tp.device == device:
                    te_peak += min(b, budget)
        # the manager's own rule (engine.residency.placement), on the header's module sizes
        pl = place_modules(f.unit_sizes, f.unit_must if info.is_accelerator else [False] * len(f.unit_sizes),
                           budget, report.vram_state)  # fmt: skip
        if pl.short is not None:
            resident, count = must, len(f.unit_sizes) - len(f.castable_sizes)
        else:
            resident, count = pl.device_bytes, len(pl.chosen)
        mode = "full" if count == len(f.unit_sizes) else "partial"
        steps.append(
            {
                "step": "load",
                "peak_bytes": max(resident, te_peak),
                "mode": mode,
                "fits": must <= budget,
                "detail": {
                    "component": diffusion,
                    "bytes": total_b,
                    "storage_dtype": p.storage_dtype or f.file_dtype,
                    "compute_dtype": p.compute_dtype,
                    "resident_bytes": resident,
                    "resident_fraction": resident / total_b if total_b else 1.0,
                    "modules_resident": count,
                    "modules": len(f.unit_sizes),
                    "streamed_bytes": total_b - resident,
                    "text_encoders": tes,
                    "min_inference_bytes": min_inf,
                },
            }
        )
        if loras:
            lora_b = sum(_data_bytes(x) for x in loras)
            work = 2 * f.largest_weight_numel * 4
            peak = resident + lora_b + work
            mode = "full" if peak <= budget and resident == total_b else "partial"
            res2 = resident
            if peak > budget:
                res2 = place_modules(f.unit_sizes, f.unit_must, max(0, budget - lora_b - work),
                                     report.vram_state).device_bytes  # fmt: skip
                peak = res2 + lora_b + work
            steps.append(
                {
                    "step": "patch",
                    "peak_bytes": peak,
                    "mode": mode,
                    "fits": peak <= budget or res2 == 0 and lora_b + work <= budget,
                    "detail": {
                        "loras": [os.path.basename(x) for x in loras],
                        "warnings": _lora_warnings(model, det.architecture, loras),
                        "lora_bytes": lora_b,
                        "fp32_work_bytes": work,
                        "resident_bytes": res2,
                        "min_inference_bytes": min_inf,
                    },
                }
            )
    if diffusion is not None:  # the sampling step, after load and patch (DESIGN: load, patch, step, decode)
        # what the step may use: the weights' budget and the reserve kept for it, but never more than
        # the device has (the reserve alone exceeds a small device's memory)
        room = min(free, budget + min_inf)
        step = _sample_step(model, det, diffusion, decode, f, p, total_b, resident, room, info,
                            calibrate=vram_gb is None)  # fmt: skip
        if step is not None:
            steps.append(step)
    if decode is not None and "vae" in comps:
        arch = _vae_architecture(det)
        steps.append(_decode_step(placed("vae"), decode, budget, device, model, comps["vae"].prefix, arch))
    if decode is not None and len(decode) == 3 and det.format == "safetensors":  # a clip: its sound too
        from .formats.safetensors import read_header
        from .plan_sound import holds_sound, sound_step

        header = read_header(model)
        if holds_sound(header.tensors):
            steps.append(sound_step(model, header, decode[2], lambda fd, size: placement("vae", fd, size),
                                    lambda on: _vae_cap(on, device, budget)))  # fmt: skip
    fits = all(s.pop("fits", True) for s in steps)
    return {"device": label, "budget_bytes": budget, "steps": steps, "fits": fits}


def _vae_architecture(det) -> str | None:
    """The family of a video VAE (wan21, ltx2, ...) or of an image VAE that is not an AutoencoderKL (the DC-AE's
    sana, hunyuan_image21): the file's own, or the checkpoint's VAE part's."""
    from .vae.estimate import IMAGE_SPECS

    named = (*VIDEO_VAES, *IMAGE_SPECS)
    if det.architecture in named and det.kind == "vae":
        return det.architecture
    for part in getattr(det, "parts", ()) or ():
        if getattr(part, "component", "vae") == "vae" and getattr(part, "architecture", None) in named:
            return part.architecture
    return None


def _latent_channels(path: str, prefix: str) -> int:
    """Latent channels of an AutoencoderKL from its decoder's first conv (LDM and diffusers naming)."""
    from .formats.safetensors import read_header

    t = read_header(path).tensors
    for key in ("decoder.conv_in.weight", "post_quant_conv.weight"):
        info = t.get(prefix + key)
        if info is not None and len(info.shape) == 4:
            return int(info.shape[1])
    return 4


def _vae_cap(vae_device: str, device: str, budget: int) -> int:
    """What a decode may use: the plan's budget where the VAE runs on the plan's device; a VAE on the
    CPU (--cpu-vae) has the RAM available now, less the reserve engine.vae.run keeps."""
    if vae_device == device:
        return budget
    import psutil

    from .vae.estimate import CPU_RESERVE_BYTES

    return max(0, int(psutil.virtual_memory().available) - CPU_RESERVE_BYTES)


def _decode_step(pf, size, budget: int, device: str, path: str, prefix: str, architecture=None) -> dict:
    """An image decode, tiled as engine.vae.choice will tile it: the run's budget is what the plan's
    leaves once the runtime and the VAE's weights are resident; its estimate counts what runs at once
    (a batch of tiles) and where the tile states wait."""
    from .vae import estimate
    from .vae.choice import Job, choose, peak_bytes

    p, f = pf
    if architecture in VIDEO_VAES or len(size) == 3:
        return _video_decode_step(pf, size, budget, device, architecture, path, prefix)
    w, h = size
    weights = sum(f.unit_sizes)
    dtype = p.compute_dtype if p.compute_dtype in ("float32", "float16", "bfloat16") else "float32"
    esize = estimate.DTYPE_BYTES[dtype]
    spec = estimate.image_spec(architecture, _latent_channels(path, prefix), weights)
    job = Job(spec, "decode", (max(1, h // spec.downscale), max(1, w // spec.downscale)), 1, spec.downscale,
              esize, p.device != "cpu")  # fmt: skip
    whole = estimate.full_bytes(spec, "decode", job.pixels, esize)
    detail = {
        "width": w,
        "height": h,
        "vae_bytes": weights,
        "vae_device": p.device,
        "compute_dtype": dtype,
        "activation_bytes": whole - weights,
        "estimate": "engine.vae.estimate (calibrated on measured decodes)",
    }
    cap = _vae_cap(p.device, device, budget)
    if whole <= cap:
        return {"step": "decode", "peak_bytes": whole, "mode": "full", "fits": True, "detail": detail}
    run_budget = max(0, cap - estimate.RUNTIME_BYTES - weights)
    tiling = choose(job, run_budget)
    peak = peak_bytes(job, tiling, run_budget)
    detail.update(tile=tiling.tile_px, overlap=tiling.overlap_px, tiles=len(tiling.rects))
    fits = peak <= cap
    if not fits:
        detail["advice"] = "not even the smallest tile fits beside the VAE: try --cpu-vae"
    return {"step": "decode", "peak_bytes": peak, "mode": tiling.mode, "fits": fits, "detail": detail}


def _sample_step(
    model, det, diffusion, size, facts, placed, total_b, resident, free, info, calibrate
) -> dict | None:
    """The sampling step ("step" in the plan): peak memory (the resident weights plus a forward's
    activations, engine.catalog.measured) and seconds per step, full against partial; it fits when that
    peak fits the free memory (the weights' budget plus the reserve kept for inference). Seconds come
    from a step measured on this file and device (Try a step, `loadout step`), scaled to the size and
    the streaming; none without one."""
    from .catalog import measured
    from .catalog.step_families import NATIVE_PX, STEP_KINDS  # the families Loadout steps, their sizes
    from .model.streaming import in_flight_bytes

    kind = STEP_KINDS.get(det.architecture or "")
    if kind is None:
        return None
    w, h = (size[0], size[1]) if size else NATIVE_PX[det.architecture]
    dtype = placed.compute_dtype if placed.compute_dtype in ("float32", "float16", "bfloat16") else "float16"
    esize = 4 if dtype == "float32" or not info.is_accelerator else 2
    n = measured.units(kind, w, h)
    act = measured.activation_bytes(kind, n, esize)
    largest = max(facts.unit_sizes) if facts.unit_sizes else 0
    full_peak = total_b + act
    # the streamer's batches in flight beside the resident weights (engine.model.streaming: its own rule)
    partial_peak = resident + act + in_flight_bytes(largest, total_b - resident, info.is_accelerator)
    mode = "full" if resident >= total_b else "partial"
    detail = {
        "component": diffusion,
        "width": w,
        "height": h,
        "units": n,
        "activation_bytes": act,
        "full_peak_bytes": full_peak,
        "partial_peak_bytes": partial_peak,
        "streamed_bytes_per_step": 0 if mode == "full" else total_b - resident,
        "s_per_step": None,
        "s_per_step_full": None,
        "s_per_step_partial": None,
        "calibrated_from": None,
    }
    rec = measured.latest_step(model, info.label) if calibrate else None
    if rec is not None:
        dev = "cuda" if info.is_accelerator else "cpu"
        full_s = measured.predict_seconds(rec, kind, n, 0, dev)
        part_s = measured.predict_seconds(rec, kind, n, total_b - resident, dev)
        detail.update(s_per_step_full=full_s, s_per_step_partial=part_s,
                      s_per_step=full_s if mode == "full" else part_s,
                      calibrated_from={k: rec.get(k) for k in ("width", "height", "s_per_step", "mode", "time")})  # fmt: skip
    else:
        detail["advice"] = "no step measured for this file on this device: Try a step (or loadout step) once"
    peak = full_peak if mode == "full" else partial_peak
    # the weights were placed within the budget; the activations must fit in what is free beside them
    fits = peak <= free
    if not fits:
        detail["room_bytes"] = free
        detail["advice"] = (
            f"a {w}x{h} step needs {peak / 2**20:,.0f} MiB (activations {act / 2**20:,.0f} MiB) and the device "
            f"has {free / 2**20:,.0f} MiB for it: a smaller size, or the CPU (--cpu)"
        )
    return {"step": "step", "peak_bytes": peak, "mode": mode, "fits": fits, "detail": detail}


VIDEO_VAES = ("wan21", "wan22", "qwen_image21")  # the Wan-network VAEs (Qwen-Image 2.1's: one frame)
VIDEO_VAES += ("minimax_h3",)  # MiniMax-H3's ViT decoder (engine.vae.minimax_h3)
VIDEO_VAES += ("ltxv", "ltx2")  # LTX-Video's and LTX-2's (engine.vae.ltx)
VIDEO_VAES += ("mochi",)  # Mochi 1's (engine.vae.mochi)
VIDEO_VAES += ("kandinsky6_sr",)  # Kandinsky 6 SR's K-VAE (engine.vae.kandinsky6_sr)
VIDEO_VAES += ("hunyuan_video", "hunyuan_video15")  # the HunyuanVideo VAEs (engine.vae.hunyuan_video*)
VIDEO_VAES += ("cosmos_predict1",)  # Cosmos 1.0's tokenizer (engine.vae.cosmos)


def _video_decode_step(pf, size, budget: int, device: str, architecture, path: str, prefix: str) -> dict:
    """A video decode (engine.vae.choice.choose_video on the widths the file's header has, else the
    family's published ones): full frames or tiles, and latent frames per chunk, so that the estimate
    fits."""
    from .errors import UnsupportedModel
    from .vae import estimate
    from .vae.choice import Job, choose_video, peak_bytes, snapshot_for

    if architecture not in VIDEO_VAES:
        raise UnsupportedModel(
            "a video decode (WxHxF) needs a video VAE (Wan 2.1 / 2.2, Qwen-Image, Mochi, LTX, Cosmos 1.0); this file's VAE decodes images"
        )
    p, f = pf
    w, h, frames = size if len(size) == 3 else (*size, 1)
    if architecture == "qwen_image21" and frames > 1:
        raise UnsupportedModel(f"{frames} frames: Qwen-Image 2.1's VAE decodes single images (WxH)")
    spec = estimate.video_spec(
        architecture, sum(f.unit_sizes), estimate.video_widths(path, architecture, prefix)
    )
    ds = spec.downscale
    latent_frames = estimate.latent_frames_for(architecture, frames)
    dtype = p.compute_dtype if p.compute_dtype in ("float32", "float16", "bfloat16") else "float32"
    esize = estimate.DTYPE_BYTES[dtype]
    lat_hw = (max(1, h // ds), max(1, w // ds))
    cuda = p.device != "cpu"
    job = Job(spec, "decode", lat_hw, 1, ds, esize, cuda, latent_frames)
    cap = _vae_cap(p.device, device, budget)
    t = choose_video(job, cap)
    peak = peak_bytes(job, t, cap)  # with its retry snapshot where the run will keep it
    detail = {
        "width": w,
        "height": h,
        "frames": estimate.video_frames(architecture, latent_frames),
        "latent_frames": latent_frames,
        "vae_bytes": spec.weight_bytes,
        "vae_device": p.device,
        "compute_dtype": dtype,
        "tile_frames": t.tile_frames,
        "retry_snapshot": snapshot_for(job, t, cap),
        "full_bytes": job.video_bytes(None, 1),
        "estimate": "engine.vae.estimate (video: calibrated on measured Wan decodes)"
        if architecture not in estimate.VIT_KINDS
        else "engine.vae.estimate (a ViT decoder: one tile's tokens, a chunk's tiles, the result)",
    }
    if t.tiled:
        detail.update(tile=t.tile_px, overlap=t.overlap_px, tiles=len(t.rects))
    fits = peak <= cap
    if not fits:
        detail["advice"] = "not even the smallest tile fits: free memory, or decode on the CPU (--cpu-vae)"
    return {"step": "decode", "peak_bytes": peak, "mode": t.mode, "fits": fits, "detail": detail}


def _lora_warnings(model: str, architecture: str | None, loras: tuple[str, ...]) -> list[str]:
    """ "name: sentence" for each LoRA that does not fit the model (engine.lora.coverage.fit_warning,
    the same sentence the LoRA stack panel shows), from the headers alone."""
    from .formats import open_index
    from .lora.coverage import coverage

    shapes = {k: tuple(v.shape) for k, v in open_index(model).tensors.items()}
    out = []
    for x in loras:
        w = coverage(open_index(x), shapes, lora_path=x, base_architecture=architecture).warning
        if w:
            out.append(f"{os.path.basename(x)}: {w}")
    return out


def _data_bytes(path: str) -> int:
    from .formats.safetensors import read_header

    return read_header(path).data_size
