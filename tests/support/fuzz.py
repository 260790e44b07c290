"""Hostile files through the command line, as a user would meet them: seeded edits of small real layouts
(a denoiser's or a VAE's safetensors header, a GGUF written with wrong shapes or types, LoRA part sets,
pickled LoRAs of odd tensor objects, torch checkpoints as training scripts save them) and of what users
feed them (`--inputs` tensors, latents, images),
each run through the `loadout` commands that read it.

Every run must end as the contract says (exit 0, 2, 3 or 4: done, usage, bad input, out of memory) —
never a traceback (a bug's exit 1), a warning out of Loadout's own code or a file left open. The runs are
in-process calls of `engine.cli.main`, the function the installed `loadout` runs.

    python -m tests.support.fuzz [TARGET…] [--seed S] [-n N]     # `make fuzz`: every target, N=150

The suite runs each target a few times at fixed seeds (tests/engine/test_fuzz_hostile.py); the
findings of longer runs became their own tests and fixes (the commits that say "found by a fuzz").
"""

from __future__ import annotations

import io
import json
import math
import random
import struct
import traceback
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

CONTRACT_EXITS = (0, 2, 3, 4)
ENGINE_DIR = str(Path(__file__).resolve().parents[2] / "engine")
ITEM = {"F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1, "I64": 8, "F64": 8}


Case = tuple[str, list[list[str]]]  # (what was done to the file, the loadout command lines to run on it)


@dataclass
class Finding:
    target: str
    case: str
    argv: list[str]
    what: str  # "exit 1: KeyError: ..." or "warning: ..."


def run(argv: list[str]) -> tuple[int, str | None]:
    """Run `loadout ARGV` in-process: its exit code, and None when it ended as the contract says, else
    what went wrong (a traceback's exit 1, an exit code outside the contract, a warning of ours, a file
    left open)."""
    from engine.cli import main

    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with redirect_stdout(out), redirect_stderr(err):
                code = main(argv)
        except Exception as e:  # what the installed command would print as a traceback, exit 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            at = f"at {where.name}, {Path(where.filename).name}"
            return 1, f"exit 1: {type(e).__name__}: {str(e)[:200]} ({at})"
    if code not in CONTRACT_EXITS:
        return code, f"exit {code}: {err.getvalue().strip()[-200:]}"
    # warnings out of engine/, and any unclosed file (reported wherever the collector happens to run)
    ours = [
        w for w in caught if str(w.filename).startswith(ENGINE_DIR) or issubclass(w.category, ResourceWarning)
    ]
    if ours:
        w = ours[0]
        return (
            code,
            f"warning: {w.category.__name__}: {str(w.message)[:200]} ({Path(w.filename).name}:{w.lineno})",
        )
    return code, None


# -- safetensors header edits that keep every size consistent -------------------------------------------


HEADER_EDITS = ("1d", "dtype", "swap", "drop", "add_dim", "flatten")


def names(base: dict) -> list[str]:
    """The base files' names (keys starting with _ are the fuzz's own bookkeeping)."""
    return sorted(k for k in base if not k.startswith("_"))


def next_kind(base: dict, kinds: tuple[str, ...]) -> str:
    """The kinds of edit in turn, so that a run of len(kinds) cases makes every one (the files and
    tensors they hit stay random)."""
    i = base["_turn"] = base.get("_turn", -1) + 1
    return kinds[i % len(kinds)]


def edit_header(raw: bytes, rng: random.Random, kind: str) -> tuple[bytes, str]:
    """One tensor's entry changed the way a careless converter or a hand edit would, data untouched."""
    n = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8 : 8 + n]), raw[8 + n :]
    key = rng.choice(sorted(k for k in header if k != "__metadata__"))
    e = header[key]
    if kind == "1d":
        e["shape"] = [(e["data_offsets"][1] - e["data_offsets"][0]) // ITEM[e["dtype"]]]
    elif kind == "dtype":  # another type of the same width: int8 for fp8, int32 for float32, ...
        e["dtype"] = rng.choice([d for d, s in ITEM.items() if s == ITEM[e["dtype"]] and d != e["dtype"]])
    elif kind == "swap" and len(e["shape"]) >= 2:
        e["shape"] = list(reversed(e["shape"]))
    elif kind == "add_dim":
        e["shape"] = [*e["shape"], 1]
    elif kind == "flatten" and len(e["shape"]) >= 3:
        e["shape"] = [e["shape"][0], math.prod(e["shape"][1:])]
    else:
        kind = "drop"
        del header[key]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body, f"{kind} {key} -> {e.get('dtype')} {e.get('shape')}"


# -- the targets: set-up once (base files), then one case per call ---------------------------------------


def _weights(rows, seed=0):
    from tests.engine.denoise_files import random_weights

    return random_weights(rows, seed)


def _denoisers(d: Path) -> dict:
    from engine.formats.safetensors import save_tensors
    from tests.engine.denoise_files import FLUX_DEV_TINY, SD1_TINY, SDXL_TINY, flux_rows, unet_rows
    from tests.engine.layouts_2026.image import LUMINA2, Z_IMAGE, nextdit_original
    from tests.engine.layouts_2026.video import WanConfig, wan_original
    from tests.support.synth._build import Builder
    from tests.support.synth.flux import Flux2Config, flux2_bfl

    z_image = Z_IMAGE.with_(dim=256, layers=2, heads=2, kv_heads=2, ffn=512, caption=64)  # heads of 128
    lumina2 = LUMINA2.with_(dim=192, layers=2, heads=2, kv_heads=1, ffn=256, caption=64)  # heads of 96, GQA
    flux2 = Builder("F32")
    flux2_bfl(
        flux2, Flux2Config(context_in_dim=64, hidden_size=256, num_heads=2, depth=1, depth_single_blocks=2)
    )
    wan = WanConfig(dim=256, ffn=512, layers=4, text_dim=64)  # two of Wan's 128-wide heads
    i2v, vace = wan.with_(in_dim=36, clip_image=True, flf=True), wan.with_(vace_layers=(0, 2))
    out = {}
    for name, rows, size in (
        ("sd1", unet_rows(SD1_TINY), "64x64"),
        ("sdxl", unet_rows(SDXL_TINY), "64x64"),
        ("flux", flux_rows(FLUX_DEV_TINY), "128x128"),
        ("wan_flf2v", [(k, "F32", s) for k, s in wan_original(i2v).items()], "64x64"),
        ("wan_vace", [(k, "F32", s) for k, s in wan_original(vace).items()], "64x64"),
        ("z_image", [(k, "F32", s) for k, s in nextdit_original(z_image).items()], "96x64"),
        ("lumina2", [(k, "F32", s) for k, s in nextdit_original(lumina2).items()], "64x96"),
        ("flux2", flux2.rows, "64x64"),
    ):
        out[name] = (save_tensors(d / f"{name}.safetensors", _weights(rows)).read_bytes(), size)
    return out


def denoiser_header(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    name = control or rng.choice(names(base))
    raw, size = base[name]
    edited, what = (raw, "as written") if control else edit_header(raw, rng, next_kind(base, HEADER_EDITS))
    (d / "model.safetensors").write_bytes(edited)
    step = ["step", "--model", str(d / "model.safetensors"), "--cpu", "--size", size, "--steps", "1"]
    return f"{name}: {what}", [step, [*step, "--vram-budget", "0"]]


def _vaes(d: Path) -> dict:
    import torch

    from engine.formats.latent import write_latent
    from engine.formats.safetensors import save_tensors
    from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig
    from tests.support.wan_vae import write_wan_vae

    g = torch.Generator().manual_seed(0)
    kl = {
        k: torch.randn(v.shape, generator=g) * 0.1
        for k, v in AutoencoderKL(KLConfig(ch=32)).state_dict().items()
    }
    write_latent(d / "image.latent", torch.randn(1, 4, 16, 16, generator=g))
    write_latent(d / "clip.latent", torch.randn(1, 16, 2, 4, 4, generator=g))
    return {
        "kl": (
            save_tensors(d / "kl.safetensors", kl).read_bytes(),
            d / "image.latent",
            "out.png",
            ["--tile", "64", "--overlap", "32"],
        ),
        "wan": (
            Path(write_wan_vae(d / "wan.safetensors")).read_bytes(),
            d / "clip.latent",
            "frames/",
            ["--tile-frames", "1"],
        ),  # fmt: skip
    }


def vae_header(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    name = control or rng.choice(names(base))
    raw, latent, out, tiled = base[name]
    edited, what = (raw, "as written") if control else edit_header(raw, rng, next_kind(base, HEADER_EDITS))
    (d / "vae.safetensors").write_bytes(edited)
    decode = ["decode", "--vae", str(d / "vae.safetensors"), "--latent", str(latent), "--out", f"{d}/{out}"]
    return f"{name}: {what}", [[*decode, "--cpu", "--quiet"], [*decode, "--cpu", "--quiet", *tiled]]


# LoRA parts: every name the adapters of LoRA, LoHa, LoKr, DoRA, OFT/BOFT, GLoRA, (IA)^3 and full-diff use
PARTS = (
    "lora_up.weight", "lora_down.weight", "lora_mid.weight", "alpha", "hada_w1_a", "hada_w1_b", "hada_w2_a",
    "hada_w2_b", "hada_t1", "hada_t2", "lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b",
    "lokr_t2", "diff", "diff_b", "dora_scale", "on_input", "weight", "a1.weight", "a2.weight", "b1.weight",
    "b2.weight", "bm.weight", "w_norm", "b_norm", "oft_blocks", "rescale",
)  # fmt: skip


def _sd1(d: Path) -> dict:
    from engine.formats.safetensors import save_tensors
    from tests.engine.denoise_files import SD1_TINY, unet_rows

    weights = _weights(unet_rows(SD1_TINY))
    path = save_tensors(d / "sd1.safetensors", weights)
    prefix = "model.diffusion_model."
    layers = {k[len(prefix) : -len(".weight")]: tuple(t.shape) for k, t in weights.items()}
    layers = {
        k: s
        for k, s in layers.items()
        if k.startswith(("input_blocks", "output_blocks")) and len(s) in (2, 4)
    }
    return {"base": str(path), "layers": sorted(layers.items()), "_controls": ["sd1"]}


def lora_parts(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """Random part sets, of shapes near the target layer's, on one real SD1 layer (kohya naming)."""
    import torch

    from engine.formats.safetensors import save_tensors

    layer, shape = rng.choice(base["layers"])
    name = "lora_unet_" + layer.replace(".", "_")
    parts = set(rng.sample(PARTS, rng.randint(1, 4)))
    for group, p in ((("lora_up.weight", "lora_down.weight"), 0.5), (("hada_w1_a", "hada_w1_b"), 0.15),
                     (("lokr_w1", "lokr_w2"), 0.15), (("weight", "on_input"), 0.1),
                     (("a1.weight", "a2.weight", "b1.weight", "b2.weight"), 0.1)):  # fmt: skip
        if rng.random() < p:
            parts |= set(group)
    dims = [*shape, 4, 2, 1, 3, 0]
    tensors = {}
    for p in sorted(parts):
        nd = 0 if p == "alpha" and rng.random() < 0.8 else rng.choice([0, 1, 2, 2, 2, 4])
        tensors[f"{name}.{p}"] = torch.randn([rng.choice(dims) for _ in range(nd)])
    if "oft_blocks" in parts and rng.random() < 0.7:  # blocks near the layer's rows: (B)OFT shapes
        b = rng.choice([2, 3, 4, 8])
        lead = [rng.choice([1, 2, 3, 5])] if rng.random() < 0.5 else []
        tensors[f"{name}.oft_blocks"] = torch.randn(*lead, shape[0] // b + rng.choice([0, 0, 1]), b, b) * 0.1
    if control:  # a well-formed pair of rank 4 instead
        tail = (1, 1) if len(shape) == 4 else ()
        tensors = {f"{name}.lora_up.weight": torch.randn(shape[0], 4, *tail) * 0.1,
                   f"{name}.lora_down.weight": torch.randn(4, *shape[1:]) * 0.1}  # fmt: skip
    path = save_tensors(d / "lora.safetensors", tensors)
    label = f"{layer} {list(shape)}: " + ", ".join(f"{p.split('.')[-2] if p.count('.') > 1 else p.rsplit('.', 1)[-1]} "
                                                  f"{list(t.shape)}" for p, t in tensors.items())  # fmt: skip
    return label, [
        ["lora", "inspect", str(path), "--base", base["base"], "--json"],
        [
            "step",
            "--model",
            base["base"],
            "--lora",
            f"{path}:0.7",
            "--cpu",
            "--size",
            "64x64",
            "--steps",
            "1",
        ],
    ]


def _pickled(d: Path) -> dict:
    return _sd1(d)


PICKLED_KINDS = ("transposed", "view", "shared", "expanded", "parameter", "grad", "nested", "list", "half",
                 "bfloat16", "float64", "int64", "bool", "complex", "sparse", "legacy")  # fmt: skip


def pickled_lora(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """A LoRA pickled with torch.save from the tensor objects a trainer or a script really holds."""
    import torch

    layer, shape = next((k, s) for k, s in base["layers"] if len(s) == 2)
    n = "lora_unet_" + layer.replace(".", "_")
    out_f, in_f = shape
    t = {f"{n}.alpha": torch.tensor(4.0), f"{n}.lora_down.weight": torch.randn(4, in_f),
         f"{n}.lora_up.weight": torch.randn(out_f, 4)}  # fmt: skip
    down, up = f"{n}.lora_down.weight", f"{n}.lora_up.weight"
    kind = "plain" if control else next_kind(base, PICKLED_KINDS)
    if kind == "transposed":
        t[up] = torch.randn(4, out_f).t()
    elif kind == "view":
        t[down] = torch.randn(4 * in_f + 9)[7 : 7 + 4 * in_f].view(4, in_f)
    elif kind == "shared":
        both = torch.randn(4 * (in_f + out_f))
        t[down], t[up] = both[: 4 * in_f].view(4, in_f), both[4 * in_f :].view(out_f, 4)
    elif kind == "expanded":
        t[down] = torch.randn(1, in_f).expand(4, in_f)
    elif kind == "parameter":
        t = {k: torch.nn.Parameter(v) for k, v in t.items()}
    elif kind == "grad":
        t[down].requires_grad_(True)
    elif kind == "nested":
        t = {"state_dict": t, "epoch": 3}
    elif kind == "list":
        t = list(t.values())
    elif kind in ("half", "bfloat16", "float64", "int64", "bool"):
        t[down] = t[down].to(getattr(torch, kind))
    elif kind == "complex":
        t[down] = torch.complex(t[down], t[down])
    elif kind == "sparse":
        t[down] = t[down].to_sparse()
    path = d / "lora.pt"
    torch.save(t, path, _use_new_zipfile_serialization=kind != "legacy")
    out = d / "baked.safetensors"
    out.unlink(missing_ok=True)
    return kind, [
        ["lora", "inspect", str(path), "--base", base["base"], "--json"],
        ["inspect", str(path), "--json"],
        ["step", "--model", base["base"], "--lora", str(path), "--cpu", "--size", "64x64", "--steps", "1"],
        ["bake", "--base", base["base"], "--lora", str(path), "--out", str(out), "--json"],
    ]


def _ggufs(d: Path) -> dict:
    from tests.engine.denoise_files import FLUX_DEV_TINY, SDXL_TINY, flux_rows, unet_rows

    return {
        "sdxl": (_weights(unet_rows(SDXL_TINY, prefix="")), "sdxl", "64x64"),
        "flux": (_weights(flux_rows(FLUX_DEV_TINY)), "flux", "128x128"),
    }


GGUF_EDITS = ("orig_perm", "orig_flat", "orig_extra", "orig_bad", "orig_zero", "swap", "int32", "int8",
              "float64", "drop", "qtype", "extra")  # fmt: skip


def gguf_model(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """A GGUF as ComfyUI-GGUF writes one (layer weights quantized, the rest float; rows that are not
    whole blocks reshaped, the shape under comfy.gguf.orig_shape) with one tensor written wrong."""
    import gguf
    import numpy as np

    name = control or rng.choice(names(base))
    weights, arch, size = base[name]
    from tests.support.gguf_files import quantize_blocks

    qtype = rng.choice(["Q8_0", "Q4_0", "Q5_1", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0", "F16"])
    edit, target = ("none", None) if control else (next_kind(base, GGUF_EDITS), rng.choice(sorted(weights)))
    w = gguf.GGUFWriter(str(d / "model.gguf"), arch=arch)
    for k, t in weights.items():
        if edit == "drop" and k == target:
            continue
        x = t.float().numpy()
        shape, orig = tuple(x.shape), None
        q = getattr(
            gguf.GGMLQuantizationType,
            rng.choice(["Q4_0", "Q8_0", "Q5_0", "IQ4_XS"]) if edit == "qtype" and k == target else qtype,
        )
        block = gguf.GGML_QUANT_SIZES[q][0]
        pick = k.endswith(".weight") and x.ndim >= 2 and x.size % block == 0
        if pick and shape[-1] % block:
            x, orig = x.reshape(-1, block), list(shape)
        if k == target:
            first = [shape[0] + 1] if edit == "orig_bad" else [0] if edit == "orig_zero" else []
            orig = {"orig_perm": list(reversed(shape)), "orig_flat": [shape[0], math.prod(shape[1:])],
                    "orig_extra": [*shape, 1], "orig_bad": first + list(shape[1:]),
                    "orig_zero": first + list(shape[1:])}.get(edit, orig)  # fmt: skip
            if edit == "swap" and not pick and x.ndim >= 2:
                x = np.ascontiguousarray(x.reshape(tuple(reversed(x.shape))))
            elif edit in ("int32", "int8", "float64"):
                x, pick = (x * 100).astype(getattr(np, edit)), False
        if orig is not None:
            w.add_array(f"comfy.gguf.orig_shape.{k}", orig)
        if pick:
            w.add_tensor(k, quantize_blocks(gguf, x, q, q.name), raw_dtype=q)
        else:
            w.add_tensor(k, x)
    if edit == "extra":
        w.add_tensor("stray.weight", np.zeros((3, 3), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path = str(d / "model.gguf")
    step = ["step", "--model", path, "--cpu", "--size", size, "--steps", "1"]
    return f"{name} {qtype}: {edit} {target}", [
        ["inspect", path, "--json"],
        step,
        [*step, "--vram-budget", "0"],
    ]


# -- what users feed the models: --inputs tensors, latents, images ---------------------------------------

TENSOR_EDITS = ("half", "bfloat16", "float64", "int32", "bool", "float8_e4m3fn", "nan", "inf", "flat",
                "extra_dim", "scalar", "empty", "batch", "drop", "huge", "transposed")  # fmt: skip


def edit_tensor(t, kind: str):
    """`t` changed as a script writing a file by hand might change it (None: left out of the file)."""
    import torch

    if kind in ("half", "bfloat16", "float64", "int32", "bool", "float8_e4m3fn"):
        return t > 0 if kind == "bool" else t.to(getattr(torch, kind))
    if kind in ("nan", "inf"):
        t = t.clone()
        t.view(-1)[0] = float(kind)
        return t
    edits = {"flat": lambda: t.reshape(-1), "extra_dim": lambda: t.unsqueeze(0), "scalar": lambda: t.reshape(-1)[0],
             "empty": lambda: t[:0], "batch": lambda: torch.cat([t, t, t]), "drop": lambda: None,
             "huge": lambda: t * 1e30, "transposed": lambda: t.transpose(-1, -2).contiguous() if t.dim() > 1 else t}  # fmt: skip
    return edits[kind]()


def _inputs(d: Path) -> dict:
    import torch

    base = {name: (raw, size) for name, (raw, size) in _denoisers(d).items()}
    for name, (raw, _) in base.items():
        (d / f"{name}.safetensors").write_bytes(raw)
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    unet = {"x": r(1, 4, 8, 8), "timesteps": torch.tensor([500.0]), "context": r(1, 77, 768)}
    inputs = {
        "sd1": unet,
        "sdxl": {**unet, "context": r(1, 77, 2048), "y": r(1, 2816)},
        "flux": {"img": r(1, 16, 64), "img_ids": torch.zeros(1, 16, 3), "txt": r(1, 8, 4096),
                 "txt_ids": torch.zeros(1, 8, 3), "timesteps": torch.tensor([0.5]), "y": r(1, 768),
                 "guidance": torch.tensor([3.5])},
        "wan_flf2v": {"x": r(1, 36, 1, 8, 8), "t": torch.tensor([500.0]), "context": r(1, 8, 64),
                      "clip_fea": r(1, 514, 1280)},
        "wan_vace": {"x": r(1, 16, 1, 8, 8), "t": torch.tensor([500.0]), "context": r(1, 8, 64),
                     "vace_context": r(1, 96, 1, 8, 8)},
        "z_image": {"x": r(2, 16, 12, 8), "t": torch.tensor([0.5, 0.5]), "cap_feats": r(2, 40, 64),
                    "cap_mask": (torch.arange(40)[None] < torch.tensor([[40], [7]])).float()},
        "lumina2": {"x": r(2, 16, 8, 12), "t": torch.tensor([0.5, 0.7]), "cap_feats": r(2, 20, 64),
                    "cap_mask": (torch.arange(20)[None] < torch.tensor([[12], [20]])).float()},
        "flux2": {"img": r(1, 16, 128), "img_ids": torch.zeros(1, 16, 4), "txt": r(1, 8, 64),
                  "txt_ids": torch.zeros(1, 8, 4), "timesteps": torch.tensor([0.5]), "guidance": torch.tensor([4.0])},
    }  # fmt: skip
    return {name: (d / f"{name}.safetensors", inputs[name]) for name in base}


def step_inputs(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """An --inputs file with one tensor of the wrong type, shape or values."""
    from engine.formats.safetensors import save_tensors

    name = control or rng.choice(names(base))
    model, good = base[name]
    tensors, what = dict(good), "as written"
    if not control:
        key, kind = rng.choice(sorted(good)), next_kind(base, TENSOR_EDITS)
        tensors[key], what = edit_tensor(good[key], kind), f"{kind} {key}"
        tensors = {k: v for k, v in tensors.items() if v is not None}
    save_tensors(d / "inputs.safetensors", tensors)
    step = ["step", "--model", str(model), "--inputs", str(d / "inputs.safetensors"), "--cpu"]
    return f"{name}: {what}", [[*step, "--out", str(d / "out.safetensors")], [*step, "--vram-budget", "0"]]


def latent(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """A .latent (ComfyUI's: safetensors, `latent_tensor`) with its tensor of the wrong type, shape or
    values, decoded full and tiled."""
    from engine.formats.latent import read_latent
    from engine.formats.safetensors import save_tensors

    name = control or rng.choice(names(base))
    raw, good, out, tiled = base[name]
    (d / "vae.safetensors").write_bytes(raw)
    t, what = read_latent(good), "as written"
    if not control:
        kind = next_kind(base, TENSOR_EDITS)
        t, what = edit_tensor(t, kind), kind
    save_tensors(d / "x.latent", {} if t is None else {"latent_tensor": t})
    decode = [
        "decode",
        "--vae",
        str(d / "vae.safetensors"),
        "--latent",
        str(d / "x.latent"),
        "--out",
        f"{d}/{out}",
    ]
    return f"{name}: {what}", [[*decode, "--cpu", "--quiet"], [*decode, "--cpu", "--quiet", *tiled]]


IMAGE_KINDS = ("gray", "rgba", "palette", "i16", "float_tiff", "one_px", "odd", "tall", "cmyk_jpeg", "gif",
               "truncated", "not_a_png", "bomb", "empty", "text", "webp", "la")  # fmt: skip


def _png_claiming(width: int, height: int) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))


def image(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """An image of an odd mode, size or container, or not an image at all, encoded by a KL VAE (full
    and tiled) and a Wan VAE."""
    import numpy as np
    from PIL import Image

    kind = "rgb" if control else next_kind(base, IMAGE_KINDS)
    px = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, (48, 64, 4), dtype=np.uint8)
    suffix = {"float_tiff": ".tiff", "cmyk_jpeg": ".jpg", "gif": ".gif", "webp": ".webp"}.get(kind, ".png")
    path = d / f"image{suffix}"
    modes = {"rgb": "RGB", "gray": "L", "rgba": "RGBA", "la": "LA", "cmyk_jpeg": "CMYK", "webp": "RGB"}
    if kind in modes:
        Image.fromarray(px[..., : len(modes[kind])] if kind not in ("gray", "la") else px[..., :2]).convert(
            modes[kind]
        ).save(path)
    elif kind == "palette":
        Image.fromarray(px[..., :3]).convert("P").save(path)
    elif kind == "i16":
        Image.fromarray(px[..., 0].astype(np.uint16) * 257).save(path)
    elif kind == "float_tiff":
        Image.fromarray(px[..., 0].astype(np.float32) / 255, "F").save(path)
    elif kind in ("one_px", "odd", "tall"):
        Image.new("RGB", {"one_px": (1, 1), "odd": (67, 45), "tall": (8, 1200)}[kind], (9, 99, 200)).save(
            path
        )
    elif kind == "gif":
        frames = [Image.fromarray(px[..., :3]).convert("P") for _ in range(2)]
        frames[0].save(path, save_all=True, append_images=frames[1:])
    elif kind == "truncated":
        Image.fromarray(px[..., :3]).save(path)
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.write_bytes({"not_a_png": b"\x89PNG\r\n\x1a\n" + bytes(100), "bomb": _png_claiming(100_000, 100_000),
                          "empty": b"", "text": b"a prompt saved as the image"}[kind])  # fmt: skip
    runs = []
    for name in names(base):
        raw, _, _, tiled = base[name]
        (d / f"{name}_vae.safetensors").write_bytes(raw)
        encode = ["encode", "--vae", str(d / f"{name}_vae.safetensors"), "--image", str(path)]
        runs.append([*encode, "--out", str(d / "x.latent"), "--cpu", "--quiet"])
        if name == "kl":
            runs.append([*encode, "--out", str(d / "x.latent"), "--cpu", "--quiet", *tiled])
    return kind, runs


CKPT_KINDS = ("transposed", "offset_view", "shared", "parameters", "half", "bfloat16", "nested", "legacy",
              "deflated", "int64", "dropped", "extra_scalars")  # fmt: skip


def _ckpts(d: Path) -> dict:
    from tests.engine.denoise_files import SD1_TINY, unet_rows

    return {"sd1": _weights(unet_rows(SD1_TINY), seed=4), "_controls": ["sd1"]}


def torch_checkpoint(rng: random.Random, base: dict, d: Path, control: str | None = None) -> Case:
    """An SD1 .ckpt written by torch.save from the objects a training script holds: views, Parameters,
    other dtypes, nesting, the legacy container, a re-zipped archive; inspected, planned, loaded and
    stepped (full and streamed)."""
    import zipfile

    import torch

    sd = dict(base["sd1"])
    kind = "plain" if control else next_kind(base, CKPT_KINDS)
    key = rng.choice(sorted(k for k, t in sd.items() if t.dim() == 2))
    if kind == "transposed":
        sd[key] = sd[key].t().contiguous().t()
    elif kind == "offset_view":
        flat = torch.cat([torch.zeros(5), sd[key].reshape(-1)])
        sd[key] = flat[5:].view(sd[key].shape)
    elif kind == "shared":
        other = rng.choice(sorted(k for k, t in sd.items() if t.shape == sd[key].shape))
        sd[other] = sd[key]
    elif kind == "parameters":
        sd = {k: torch.nn.Parameter(t) for k, t in sd.items()}
    elif kind in ("half", "bfloat16", "int64"):
        sd[key] = sd[key].to(getattr(torch, kind))
    elif kind == "dropped":
        del sd[key]
    obj = {"state_dict": sd, "global_step": 3, "epoch": 1}
    if kind == "nested":
        obj = {"model": {"state_dict": sd}}
    elif kind == "extra_scalars":
        obj = {**obj, "hyper": {"lr": 1e-4, "name": "run", "steps": [1, 2]}}
    path = d / "model.ckpt"
    torch.save(obj, path, _use_new_zipfile_serialization=kind != "legacy")
    if kind == "deflated":
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(d / "re.ckpt", "w") as dst:
            for i in src.infolist():
                dst.writestr(i.filename, src.read(i), compress_type=zipfile.ZIP_DEFLATED)
        (d / "re.ckpt").replace(path)
    step = ["step", "--model", str(path), "--cpu", "--size", "64x64", "--steps", "1"]
    return f"{kind} {key}", [["inspect", str(path), "--json"], ["plan", "--model", str(path), "--cpu"],
                             ["load", str(path), "--cpu"], step, [*step, "--vram-budget", "0"]]  # fmt: skip


def _vaes_once(d: Path) -> dict:
    return {**_vaes(d), "_controls": ["kl"]}


TARGETS = {
    "denoiser-header": (_denoisers, denoiser_header),
    "vae-header": (_vaes, vae_header),
    "lora-parts": (_sd1, lora_parts),
    "pickled-lora": (_pickled, pickled_lora),
    "gguf": (_ggufs, gguf_model),
    "step-inputs": (_inputs, step_inputs),
    "latent": (_vaes, latent),
    "image": (_vaes_once, image),
    "torch-checkpoint": (_ckpts, torch_checkpoint),
}


def fuzz(
    target: str, seed: int, n: int, workdir: Path, echo=None, exits: dict | None = None
) -> list[Finding]:
    """`n` cases of `target` from `seed`; the findings (one per distinct failure). `exits` collects
    how often each command ended with each exit code."""
    setup, case = TARGETS[target]
    workdir.mkdir(parents=True, exist_ok=True)
    base = setup(workdir)
    rng = random.Random(seed)
    found: dict[tuple, Finding] = {}

    def note(label: str, argv: list[str], what: str) -> None:
        key = (argv[0], what[:60])
        if key not in found:
            found[key] = Finding(target, label, argv, what)
            if echo:
                echo(f"{target}: {label}\n  loadout {' '.join(argv)}\n  {what}")

    # First each base file as written: every command must succeed on it, or an edit's exit 3 might
    # be the valid file's own (an SDXL GGUF once failed its step as "damaged" that way, unedited).
    for control in base.get("_controls", names(base)):
        label, runs = case(rng, base, workdir, control=control)
        for argv in runs:
            code, what = run(argv)
            if what or code:
                note(f"{control} {label}", argv, what or f"exit {code} on the file as written")
    for _ in range(n):
        label, runs = case(rng, base, workdir)
        for argv in runs:
            code, what = run(argv)
            if exits is not None:
                exits[(argv[0], code)] = exits.get((argv[0], code), 0) + 1
            if what:
                note(label, argv, what)
    return list(found.values())


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(prog="python -m tests.support.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("targets", nargs="*", choices=[[], *TARGETS], default=[], metavar="TARGET")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-n", type=int, default=150, help="cases per target (default 150)")
    args = p.parse_args(argv)
    findings = []
    for target in args.targets or TARGETS:
        exits: dict = {}
        with tempfile.TemporaryDirectory(prefix=f"loadout-fuzz-{target}-") as d:
            got = fuzz(target, args.seed, args.n, Path(d), echo=print, exits=exits)
        ends = ", ".join(f"{cmd} exit {code}: {k}" for (cmd, code), k in sorted(exits.items(), key=str))
        print(f"{target}: {args.n} cases from seed {args.seed}, {len(got)} finding(s) ({ends})", flush=True)
        findings += got
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
