"""Where model files live: ComfyUI and A1111/Forge folder names, and ComfyUI's extra_model_paths.yaml.

The folder a file was found in is only a *hint* (a "declared kind") kept beside detection: users put
files in the wrong folder, and detection from the header is what we believe.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError

# Suffixes of files that may hold model weights (case-insensitive). `.sft` is the short safetensors
# suffix ComfyUI also accepts; `.latent` files are not models and are left out of the library.
MODEL_SUFFIXES = (".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin", ".gguf")

# Folder name (lower case) -> declared kind. Kinds use the Detection vocabulary of DESIGN.md where
# one fits; folders for things Loadout does not detect keep a name of their own.
# ComfyUI: folder_paths.py names (checkpoints, diffusion_models + legacy unet, text_encoders + legacy
# clip, controlnet + t2i_adapter, ...); A1111/Forge: models/Stable-diffusion, Lora, LyCORIS, VAE,
# VAE-approx, ESRGAN/RealESRGAN/SwinIR/..., ControlNet, hypernetworks, `embeddings` at the root.
FOLDER_KINDS: dict[str, str] = {
    # ComfyUI
    "checkpoints": "checkpoint",
    "diffusion_models": "diffusion_model",
    "unet": "diffusion_model",
    "loras": "lora",
    "vae": "vae",
    "vae_approx": "vae_approx",
    "text_encoders": "text_encoder",
    "clip": "text_encoder",
    "clip_vision": "clip_vision",
    "embeddings": "embedding",
    "controlnet": "controlnet",
    "t2i_adapter": "controlnet",
    "upscale_models": "upscaler",
    "latent_upscale_models": "upscaler",
    "ipadapter": "ip_adapter",
    "ip_adapter": "ip_adapter",
    "ip-adapter": "ip_adapter",
    "hypernetworks": "hypernetwork",
    "style_models": "style_model",
    "gligen": "gligen",
    "photomaker": "photomaker",
    "model_patches": "model_patch",
    # A1111 / Forge / SD.Next
    "stable-diffusion": "checkpoint",
    "lora": "lora",
    "lycoris": "lora",
    "vae-approx": "vae_approx",
    "text_encoder": "text_encoder",
    "esrgan": "upscaler",
    "realesrgan": "upscaler",
    "swinir": "upscaler",
    "dat": "upscaler",
    "scunet": "upscaler",
}

# extra_model_paths.yaml keys (ComfyUI folder_paths names) that are not folder names above.
_YAML_KEY_KINDS = {"configs": None, "diffusers": None, "custom_nodes": None}


def declared_kind_for_folder(name: str) -> str | None:
    """The kind a folder called `name` declares, or None for a folder that says nothing."""
    return FOLDER_KINDS.get(name.lower())


# File names the libraries that write a model's folders give every model's weights, so the name says
# nothing about which model it is: diffusers' WEIGHTS_NAME / SAFETENSORS_WEIGHTS_NAME
# (diffusion_pytorch_model.*) and LoRA weights (pytorch_lora_weights.*), transformers' (model.*,
# pytorch_model.*), PEFT's adapter_model.* and Mistral's consolidated.* — with diffusers' variant
# infix (".fp16") and either library's shard suffix ("-00001-of-00003").
_GENERIC = re.compile(
    r"(?:diffusion_pytorch_model|pytorch_model|model|pytorch_lora_weights|adapter_model|consolidated)"
    r"(?:\.(?P<variant>fp16|bf16|fp32|fp8|non_ema|ema))?(?:-(?P<part>\d+)-of-(?P<of>\d+))?"
    r"\.(?:safetensors|sft|bin|pt|pth|ckpt|gguf)",
    re.IGNORECASE,
)


# Memoised: the library's Name column asks it in every sort comparison and repaint, and the Loaded table
# on every ledger change (2.7-4 µs a call uncached, three to five times a basename).
@functools.lru_cache(maxsize=1 << 14)
def display_name(path: str) -> str:
    """The name a person knows a model file by: its own file name, unless that is one of the names a
    diffusers or transformers folder gives every model's weights — then the two folders nearest the
    file, which say which model it is: "ltx2/audio_vae" for ltx2/audio_vae/diffusion_pytorch_model.
    safetensors, with the variant and shard: "flux/transformer (part 2 of 3)". A kind folder such as
    loras/ is left off, unless it is the model's own component folder ("sdxl/unet"). The folders above
    a library's root count as well (a file added alone is its own root). Reads nothing from the disk."""
    path = os.path.normpath(path)
    base = os.path.basename(path)
    m = _GENERIC.fullmatch(base)
    parts = [p for p in os.path.dirname(path).split(os.sep) if p][-2:]
    if m is None or not parts:
        return base
    names = [p for p in parts if not _says_no_model(p)]
    if not names:  # only kind folders above it ("models/clip"): the last with the file's name
        return f"{parts[-1]}/{base}"
    if len(parts) == 2 and names == parts[:1]:
        names = parts  # a model's component folder named like a kind folder: "sdxl/unet", "flux/vae"
    extras = [m["variant"].lower()] if m["variant"] else []
    if m["part"]:
        extras.append(f"part {int(m['part'])} of {int(m['of'])}")
    return "/".join(names) + (f" ({', '.join(extras)})" if extras else "")


def _says_no_model(folder: str) -> bool:
    """A folder whose name says what kind of file lies in it, not which model: loras/, vae/, models/."""
    return folder.lower() == "models" or declared_kind_for_folder(folder) is not None


def declared_kind_for_path(path: str, root: str, root_kind: str | None = None) -> str | None:
    """The nearest folder hint for a file below `root`: the deepest known folder name on the way from
    the root's own folder down to the file's folder wins; `root_kind` (from extra_model_paths.yaml) is
    the fallback. Folders above the root are ignored: they belong to the user's machine, not the library.
    """
    rel = os.path.relpath(os.path.dirname(path), root)
    parts = [os.path.basename(os.path.normpath(root))]
    if rel != os.curdir:
        parts += rel.split(os.sep)
    for part in reversed(parts):
        kind = declared_kind_for_folder(part)
        if kind is not None:
            return kind
    return root_kind


def is_model_file(name: str) -> bool:
    return name.lower().endswith(MODEL_SUFFIXES)


@dataclass(frozen=True)
class Root:
    """One folder to scan; `kind` is the hint from extra_model_paths.yaml (None for a plain folder)."""

    path: str
    kind: str | None = None
    source: str | None = None  # the yaml file that named it
    is_default: bool = False


def read_extra_model_paths(yaml_path: str | os.PathLike) -> list[Root]:
    """The folders a ComfyUI extra_model_paths.yaml adds, in file order.

    Format (ComfyUI utils/extra_config.py): top-level sections; each may have `base_path` (with ~ and
    $VARS expanded, relative to the yaml's folder when relative) and `is_default`; every other key is
    a folder_paths name whose value holds one or more paths, one per line (YAML `|` blocks), each
    joined to base_path, or to the yaml's folder when there is no base_path and the path is relative.
    """
    import yaml

    p = Path(yaml_path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file ({e.strerror or e})") from e
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FormatError(
            f"{p}: not valid YAML ({e}); check the indentation of extra_model_paths.yaml"
        ) from e
    if config is None:
        return []
    if not isinstance(config, dict):
        raise FormatError(f"{p}: extra_model_paths.yaml must map section names to folder settings")
    yaml_dir = os.path.dirname(os.path.abspath(p))
    roots: list[Root] = []
    for section, conf in config.items():
        if conf is None:
            continue
        if not isinstance(conf, dict):
            raise FormatError(f"{p}: section {section!r} must map folder names to paths")
        conf = dict(conf)
        base = conf.pop("base_path", None)
        if base is not None:
            base = os.path.expandvars(os.path.expanduser(str(base)))
            if not os.path.isabs(base):
                base = os.path.join(yaml_dir, base)
        is_default = bool(conf.pop("is_default", False))
        for key, value in conf.items():
            if value is None:
                continue
            kind = _YAML_KEY_KINDS.get(key, declared_kind_for_folder(str(key)))
            for line in str(value).split("\n"):
                line = line.strip()
                if not line:
                    continue
                if base:
                    full = os.path.join(base, line)
                elif not os.path.isabs(line):
                    full = os.path.join(yaml_dir, line)
                else:
                    full = line
                roots.append(Root(os.path.normpath(full), kind, str(p), is_default))
    return roots
