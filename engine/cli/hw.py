"""`loadout hw`: the devices torch exposes, the states Loadout chose from them, and memory now."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments, options_from_args
from ._common import EXIT_OK, human_bytes, print_json

NAME = "hw"
HELP = "devices, VRAM state, dtype support and memory now"
DESCRIPTION = (
    "Show the devices the installed torch exposes, the VRAM/CPU state Loadout chose from them and the "
    "device flags, what each device computes well in, the memory kept back for inference, the budget "
    "for weights, and memory use now."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .. import memory
    from ..facade import Engine

    report = Engine().detect(options_from_args(args))  # --device 3 on a one-GPU machine: InvalidRequest
    now = memory.sample()  # the process-wide sampler, which detection pointed at the selected device
    budget = report.budget_bytes(now.device_free)
    if args.json:
        out = report.to_json()
        out["budget_bytes"] = budget
        out["memory"] = now.to_json()
        print_json(out)
    else:
        print(render_text(report, now, budget))
    return EXIT_OK


def _yn(flag: bool) -> str:
    return "yes" if flag else "no "


def render_text(report, now, budget: int) -> str:
    """The human report: devices first, then the decisions, then memory now."""
    lines = [f"Loadout hardware report - torch {report.torch_version} on {report.platform}", "", "Devices"]
    for d in report.devices:
        mark = "*" if d == report.selected else " "
        cap = f"  cc {d.capability[0]}.{d.capability[1]}" if d.capability else ""
        arch = f"  {d.arch}" if d.arch else ""
        mem = ("RAM " if d.kind == "cpu" else "") + human_bytes(d.total_memory)
        lines.append(f"  {mark} {d.torch_device:<7} {d.name}{cap}{arch}  ({mem})")
        lines.append(
            f"      fp16 {_yn(d.fp16)}  bf16 {_yn(d.bf16)}  fp8 compute {_yn(d.fp8_compute)}".rstrip()
        )
    o = report.options
    forced = [f"{k} {v}" for k, v in (("all", o.force_dtype), ("unet", o.unet_dtype), ("vae", o.vae_dtype),
                                        ("text encoder", o.text_encoder_dtype)) if v]  # fmt: skip
    reserve_src = "--reserve-vram" if o.reserve_vram_gb is not None else f"default on {report.platform}"
    lines += [
        "",
        f"Using          {report.selected.label}",
        f"VRAM state     {report.vram_state.value}    CPU state {report.cpu_state.value}",
        f"VAE on         {report.vae_device}",
        f"Forced dtypes  {', '.join(forced) if forced else 'none'}",
        f"Reserved       {human_bytes(report.reserve_bytes)} ({reserve_src})",
        f"Min. inference {human_bytes(report.min_inference_bytes)} "
        f"({report.inference_floor_bytes / 1024**3:.2g} GiB working floor + reserve)",
    ]
    cap = report.vram_budget_bytes
    capped = f", capped at {human_bytes(cap)} by --vram-budget" if cap is not None else ""
    lines.append(
        f"Weight budget  {human_bytes(budget)} (free {human_bytes(now.device_free)} - min. inference{capped})"
    )
    if o.disable_smart_memory:
        lines.append("Smart memory   off (models are unloaded eagerly)")
    lines += ["", "Memory now"]
    pct = 100 * now.device_used / now.device_total if now.device_total else 0
    lines.append(
        f"  {now.device_label:<22} {human_bytes(now.device_used)} used of {human_bytes(now.device_total)} "
        f"({pct:.0f}%), {human_bytes(now.device_free)} free  [{now.device_source}]"
    )
    if now.process_device_bytes is not None and not now.device_is_ram:
        lines.append(f"  {'this process on device':<22} {human_bytes(now.process_device_bytes)}")
    if now.torch_allocated is not None:
        lines.append(
            f"  {'torch allocator':<22} {human_bytes(now.torch_allocated)} allocated, "
            f"{human_bytes(now.torch_reserved)} reserved"
        )
    lines.append(f"  {'process RSS':<22} {human_bytes(now.process_rss)}")
    lines.append(
        f"  {'system RAM':<22} {human_bytes(now.ram_available)} available of {human_bytes(now.ram_total)}"
    )
    for w in report.warnings:
        lines.append(f"warning: {w}")
    if report.selected.kind == "cpu" and len(report.devices) == 1:
        lines.append("")
        lines.append("No GPU found: the CPU's RAM is the device; --vram-budget GB caps what weights may use.")
    return "\n".join(lines)
