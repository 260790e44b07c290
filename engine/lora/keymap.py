"""Map adapter module names onto a base model's weight keys, for every naming convention at once.

Kohya names are lossy (dots became underscores), so the map is built forwards, from the base: for
every weight of the base, every name an adapter trainer would give it (see `naming.py` for who writes
which prefix) points back to it. UNet weights get both their LDM/SGM names and their diffusers names
(`unet_names.py`); Flux/SD3 weights their BFL/SAI and diffusers names, the latter through row views
of fused weights (`dit_names.py`); OpenCLIP text encoders (SD2's H, SDXL's G) get the Hugging Face
names kohya and diffusers use, q/k/v being row blocks of `in_proj_weight`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from . import cascade_names
from .dit_names import View, diffusers_to_dit
from .family_names import other_names
from .family_names_dits import prefixed_names
from .fused_names import row_views, split_names
from .naming import underscored
from .unet_names import diffusers_to_ldm, ldm_to_diffusers

# Checkpoint prefixes of each component: (prefix, component, layout).
_COMPONENT_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("model.diffusion_model.", "diffusion", "native"),
    ("net.", "diffusion", "native"),  # NVIDIA's Cosmos checkpoints (and Anima's) keep their DiT under `net.`
    ("cond_stage_model.transformer.", "clip_l", "hf"),
    ("cond_stage_model.model.", "clip_h", "openclip"),
    ("conditioner.embedders.0.transformer.", "clip_l", "hf"),
    ("conditioner.embedders.1.model.", "clip_g", "openclip"),
    ("conditioner.embedders.0.model.", "clip_g", "openclip"),
    ("text_encoders.clip_l.transformer.", "clip_l", "hf"),
    ("text_encoders.clip_g.transformer.", "clip_g", "hf"),
    ("text_encoders.t5xxl.transformer.", "t5xxl", "hf"),
)
_DIFFUSION_BARE = (
    "input_blocks.",
    "middle_block.",
    "output_blocks.",
    "double_blocks.",
    "single_blocks.",
    "joint_blocks.",
)
# Bare module paths of the other DiT families: Wan (`blocks.`, VACE `vace_blocks.`), Qwen-Image, LTX,
# Sana, Cosmos and every diffusers-named DiT (`transformer_blocks.`), NextDiT (Lumina 2, Z-Image:
# `layers.`, `noise_refiner.`), HiDream (`double_stream_blocks.`).
_DIT_BARE = (
    "blocks.",
    "vace_blocks.",
    "transformer_blocks.",
    "single_transformer_blocks.",
    "layers.",
    "noise_refiner.",
    "double_stream_blocks.",
    "single_stream_blocks.",
    "visual_transformer_blocks.",  # Kandinsky 5 (a bare diffusers-named file)
)
_UNET_PATHS = ("input_blocks.", "middle_block.", "output_blocks.")
_DIFFUSERS_UNET = ("down_blocks.", "mid_block.", "up_blocks.")
_PARAM = re.compile(r"^(.*)\.(weight|scale)$")
_OPENCLIP = (
    (r"transformer\.resblocks\.(\d+)\.attn\.out_proj", r"text_model.encoder.layers.\1.self_attn.out_proj"),
    (r"transformer\.resblocks\.(\d+)\.mlp\.c_fc", r"text_model.encoder.layers.\1.mlp.fc1"),
    (r"transformer\.resblocks\.(\d+)\.mlp\.c_proj", r"text_model.encoder.layers.\1.mlp.fc2"),
    (r"transformer\.resblocks\.(\d+)\.ln_1", r"text_model.encoder.layers.\1.layer_norm1"),
    (r"transformer\.resblocks\.(\d+)\.ln_2", r"text_model.encoder.layers.\1.layer_norm2"),
    (r"ln_final", r"text_model.final_layer_norm"),
    (r"token_embedding", r"text_model.embeddings.token_embedding"),
)


@dataclass(frozen=True)
class Target:
    """Where an adapter module lands: a base weight key, an optional view of it, and its bias key; for a module
    placed on several weights (a fused module on a split base), the rows of its change this one receives."""

    component: str
    key: str
    shape: tuple[int, ...]  # the shape of the view the adapter must produce
    view: View = None
    bias_key: str | None = None
    change_rows: tuple[int, int] | None = None  # (first row, rows) of the module's change; None: all of it

    def to_json(self) -> dict:
        out = {"component": self.component, "key": self.key, "view": list(self.view) if self.view else None}
        if self.change_rows:
            out["change_rows"] = list(self.change_rows)
        return out


def _view_shape(shape: tuple[int, ...], view: View) -> tuple[int, ...]:
    if view and view[0] == "rows":
        return (view[2], *shape[1:])
    if view and view[0] == "transpose":
        return (shape[1], shape[0], *shape[2:])
    return shape


def _dit_names(path: str) -> list[str]:
    """The names DiT trainers give a transformer module at `path` (its own naming): diffusers / PEFT /
    ai-toolkit (`transformer.`, `base_model.model.`), OneTrainer (`lora_transformer_`), musubi-tuner and
    kohya (`lora_unet_`), diffusion-pipe and ComfyUI (`diffusion_model.`), LyCORIS, bare."""
    u = underscored(path)
    return [
        f"transformer.{path}",
        f"base_model.model.{path}",
        f"lora_transformer_{u}",
        f"lora_unet_{u}",
        f"lycoris_{u}",
        f"diffusion_model.{path}",
        path,
    ]


def find_components(keys: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, str]]:
    """Component name -> (key prefix, layout) present in a base's keys."""
    found: dict[str, tuple[str, str]] = {}
    for prefix, comp, layout in _COMPONENT_PREFIXES:
        if comp in found:
            continue
        if any(k.startswith(prefix) for k in keys):
            found[comp] = (prefix, layout)
    if "diffusion" not in found and any(k.startswith(_DIFFUSION_BARE) for k in keys):
        found["diffusion"] = ("", "native")
    if "diffusion" not in found and any(k.startswith(_DIT_BARE) for k in keys):
        found["diffusion"] = ("", "native")
    if "diffusion" not in found:
        # A diffusers UNet file (diffusion_pytorch_model.safetensors), bare or under "unet.".
        for prefix in ("", "unet."):
            if any(k.startswith(prefix + b) for k in keys for b in _DIFFUSERS_UNET):
                found["diffusion"] = (prefix, "diffusers")
                break
    return found


class KeyMap:
    """Every adapter module name the base's weights can be reached by -> Target."""

    def __init__(self, keys: Mapping[str, tuple[int, ...]], architecture: str | None = None):
        self.keys = {k: tuple(v) for k, v in keys.items()}
        self.components = find_components(self.keys)
        self.aliases: dict[str, Target] = {}
        # a fused module of the other naming -> the split weights its change's row blocks land on (fused_names)
        self.splits: dict[str, tuple[Target, ...]] = {}
        diff = self.components.get("diffusion")
        self.dit = bool(diff) and any(
            k.startswith(diff[0] + b) for k in self.keys for b in ("double_blocks.", "joint_blocks.")
        )
        self.flux = bool(diff) and any(k.startswith(diff[0] + "double_blocks.") for k in self.keys)
        # Any other denoiser that is no LDM UNet is a transformer of a newer family (Wan, Qwen-Image, …).
        self.other_dit = (
            bool(diff)
            and diff[1] == "native"
            and not self.dit
            and not any(k.startswith(diff[0] + b) for k in self.keys for b in _UNET_PATHS)
        )
        self.architecture = architecture
        self.diffusion_name = "transformer" if self.dit or self.other_dit else "unet"
        for comp, (prefix, layout) in self.components.items():
            params = self._params(prefix)
            # A denoiser's MultiheadAttention in_proj (Stable Cascade's release) is read from its plain holder, which
            # no patch reaches: a LoRA of it would change nothing, so none is placed there.
            if comp == "diffusion":
                params = {p: k for p, k in params.items() if not k.endswith(".in_proj_weight")}
            if comp == "diffusion" and layout == "diffusers":
                self._add_diffusers_unet(params)
            elif comp == "diffusion":
                self._add_diffusion(prefix, params)
            else:
                self._add_text_encoder(comp, prefix, layout, params)

    # -- building ----------------------------------------------------------------------------------
    def _params(self, prefix: str) -> dict[str, str]:
        """module path (relative to prefix) -> full key of its weight (or Flux norm `scale`)."""
        out: dict[str, str] = {}
        for k in self.keys:
            if not k.startswith(prefix):
                continue
            rel = k[len(prefix) :]
            m = _PARAM.match(rel)
            if m:
                out.setdefault(m.group(1), k)
            elif rel.endswith(".in_proj_weight"):
                out[rel[: -len(".in_proj_weight")] + ".in_proj"] = k
            elif rel == "text_projection":  # OpenCLIP keeps it as a bare (in, out) parameter
                out[rel] = k
        return out

    def _target(self, comp: str, key: str, view: View = None) -> Target:
        bias = None
        if key.endswith(".weight"):
            b = key[: -len(".weight")] + ".bias"
            bias = b if b in self.keys else None
        elif key.endswith(".in_proj_weight"):
            b = key[: -len("_weight")] + "_bias"
            bias = b if b in self.keys else None
        return Target(comp, key, _view_shape(self.keys[key], view), view, bias)

    def _alias(self, names, target: Target) -> None:
        for n in names:
            self.aliases.setdefault(n, target)

    def _add_diffusion(self, prefix: str, params: dict[str, str]) -> None:
        comp = self.diffusion_name
        full_prefixes = ("diffusion_model.", "model.diffusion_model.", "")
        for path, key in params.items():
            t = self._target(comp, key)
            u = underscored(path)
            self._alias([f"lora_unet_{u}", f"lycoris_{u}", *(p + path for p in full_prefixes)], t)
            if self.dit or self.other_dit:
                self._alias(_dit_names(path), t)
        if self.flux:
            self._add_xlabs(params)
        if self.dit or self.other_dit:
            shapes = {p: self.keys[k] for p, k in params.items()}
            names = other_names(shapes)
            for name, at in row_views(
                shapes
            ).items():  # the fused weights' row blocks (engine.lora.fused_names)
                names.setdefault(name, at)
            for name, (path, view) in names.items():
                self._alias(
                    [*_dit_names(name), f"diffusion_model.{name}", f"model.diffusion_model.{name}"],
                    self._target(comp, params[path], view),
                )
            for name, path in prefixed_names(
                shapes
            ).items():  # over the own names: the prefix says the naming
                self.aliases[name] = self._target(comp, params[path])
            for name, pieces in split_names(shapes).items():
                ts = tuple(
                    replace(self._target(comp, params[p], view), change_rows=(start, rows))
                    for p, view, start, rows in pieces
                )
                for n in (*_dit_names(name), f"diffusion_model.{name}", f"model.diffusion_model.{name}"):
                    self.splits.setdefault(n, ts)
        if self.dit:
            shapes = {p: self.keys[k] for p, k in params.items()}
            for d, (path, view) in diffusers_to_dit(shapes).items():
                t = self._target(comp, params[path], view)
                u = underscored(d)
                self._alias(
                    [
                        f"transformer.{d}",
                        f"lora_transformer_{u}",
                        f"base_model.model.{d}",
                        d,
                        f"lycoris_{u}",
                        f"lora_unet_{u}",
                    ],
                    t,
                )
        else:
            for ldm, d in ldm_to_diffusers(params).items():
                t = self._target(comp, params[ldm])
                u = underscored(d)
                self._alias([f"lora_unet_{u}", f"unet.{d}", f"base_model.model.{d}", d, f"lycoris_{u}"], t)

    def _add_xlabs(self, params: dict[str, str]) -> None:
        """XLabs' single-block processors: `qkv_lora` adapts the q/k/v rows of `linear1` (the hidden
        width each: `linear2`'s rows), `proj_lora` the block's output projection `linear2` (diffusers
        `_convert_xlabs_flux_lora_to_diffusers` maps it to `proj_out`). Double blocks are renamed to
        BFL paths when the adapter is parsed (`parts.split_key`)."""
        for path in params:
            m = re.fullmatch(r"single_blocks\.(\d+)\.linear1", path)
            if not m:
                continue
            b = f"single_blocks.{m.group(1)}"
            hidden = self.keys.get(params.get(f"{b}.linear2", ""), (0,))[0]
            names = [f"{b}.processor.qkv_lora", f"diffusion_model.{b}.processor.qkv_lora"]
            if hidden:
                self._alias(names, self._target(self.diffusion_name, params[path], ("rows", 0, 3 * hidden)))
            if f"{b}.linear2" in params:
                t = self._target(self.diffusion_name, params[f"{b}.linear2"])
                self._alias([f"{b}.processor.proj_lora", f"diffusion_model.{b}.processor.proj_lora"], t)

    def _add_diffusers_unet(self, params: dict[str, str]) -> None:
        """A diffusers-named UNet base: its own names, and the LDM names kohya SDXL LoRAs use (Stable Cascade's, in
        either naming, comes here too: its other naming's names)."""
        for d, key in params.items():
            t = self._target("unet", key)
            u = underscored(d)
            self._alias([f"lora_unet_{u}", f"unet.{d}", f"base_model.model.{d}", d, f"lycoris_{u}"], t)
        if cascade_names.is_cascade(params):
            for name, path in cascade_names.other_names(params).items():
                u = underscored(name)
                t = self._target("unet", params[path])
                self._alias([f"lora_unet_{u}", f"unet.{name}", f"base_model.model.{name}", name, f"lycoris_{u}",
                             f"diffusion_model.{name}"], t)  # fmt: skip
            return
        for d, ldm in diffusers_to_ldm(params).items():
            t = self._target("unet", params[d])
            u = underscored(ldm)
            self._alias([f"lora_unet_{u}", f"diffusion_model.{ldm}", f"model.diffusion_model.{ldm}", ldm], t)

    def _te_prefixes(self, comp: str) -> tuple[list[str], list[str]]:
        """(kohya prefixes, diffusers prefixes) under which this text encoder is named for this base."""
        has = self.components
        if comp == "clip_l":
            kohya = ["lora_te1_"] if ("clip_g" in has or "t5xxl" in has) else ["lora_te_", "lora_te1_"]
            return kohya, ["text_encoder."]
        if comp == "clip_h":
            return ["lora_te_"], ["text_encoder."]
        if comp == "clip_g":
            if "clip_l" in has:
                return ["lora_te2_"], ["text_encoder_2."]
            # The SDXL refiner's only encoder: diffusers keeps calling it text_encoder_2.
            return ["lora_te_", "lora_te2_"], ["text_encoder.", "text_encoder_2."]
        if comp == "t5xxl":
            if "clip_g" in has:
                return ["lora_te3_"], ["text_encoder_3."]
            # FLUX.1 (CLIP-L + T5): OneTrainer numbers its encoders as diffusers does, T5 second
            # (`lora_te2_encoder_block_0_layer_0_SelfAttention_q`); kohya's lora_flux says te3.
            return ["lora_te3_", "lora_te2_"], ["text_encoder_2."]
        return [], []

    def _add_text_encoder(self, comp: str, prefix: str, layout: str, params: dict[str, str]) -> None:
        kohya, diffusers = self._te_prefixes(comp)
        for path, key in params.items():
            hf: list[tuple[str, View]] = []
            if layout == "hf":
                hf.append((path, None))
                if comp.startswith("clip") and path.startswith(
                    ("encoder.", "embeddings.", "final_layer_norm")
                ):
                    # Old SD1 checkpoints saved CLIP from transformers < 4.x, without "text_model.".
                    hf.append(("text_model." + path, None))
            else:
                m = re.match(r"^transformer\.resblocks\.(\d+)\.attn\.in_proj$", path)
                if m:
                    rows = self.keys[key][0]
                    h = rows // 3
                    for i, n in enumerate(("q_proj", "k_proj", "v_proj")):
                        hf.append(
                            (f"text_model.encoder.layers.{m.group(1)}.self_attn.{n}", ("rows", i * h, h))
                        )
                for pat, rep in _OPENCLIP:
                    if re.fullmatch(pat, path):
                        hf.append((re.sub(pat, rep, path), None))
                if path == "text_projection":
                    # transformers' text_projection is a Linear: the OpenCLIP matrix transposed.
                    hf.append(("text_projection", ("transpose",)))
            # The checkpoint's own full path (ComfyUI-saved LoRAs) reaches the whole weight.
            self._alias([prefix + path, underscored(prefix + path)], self._target(comp, key))
            for hp, view in hf:
                t = self._target(comp, key, view)
                u = underscored(hp)
                self._alias([*(k + u for k in kohya), *(d + hp for d in diffusers)], t)
                if comp in ("clip_l", "clip_g", "t5xxl"):
                    self._alias([f"text_encoders.{comp}.transformer.{hp}"], t)

    # -- lookup --------------------------------------------------------------------------------------
    def resolve(self, name: str) -> Target | None:
        """The base target of an adapter module name, or None."""
        return self.aliases.get(name)

    def resolve_split(self, name: str) -> tuple[Target, ...] | None:
        """The base weights a fused module of the other naming lands on, each a row block of its change (None
        where the name reaches one weight, or none)."""
        return None if name in self.aliases else self.splits.get(name)
