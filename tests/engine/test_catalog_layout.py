"""Folder layouts (ComfyUI, A1111/Forge), extra_model_paths.yaml, and file discovery."""

from __future__ import annotations

import os
import textwrap

import pytest

from engine.catalog import Root, declared_kind_for_path, discover, read_extra_model_paths
from engine.errors import FormatError


def touch(path, data: bytes = b"x") -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize(
    "rel, kind",
    [
        ("models/checkpoints/a.safetensors", "checkpoint"),
        ("models/diffusion_models/flux/a.safetensors", "diffusion_model"),
        ("models/unet/a.gguf", "diffusion_model"),
        ("models/loras/style/sub/a.safetensors", "lora"),
        ("models/vae_approx/taesd_decoder.safetensors", "vae_approx"),
        ("models/clip/t5xxl.safetensors", "text_encoder"),
        ("models/text_encoders/clip_l.safetensors", "text_encoder"),
        ("models/clip_vision/a.safetensors", "clip_vision"),
        ("models/upscale_models/4x.pth", "upscaler"),
        ("models/ipadapter/a.bin", "ip_adapter"),
        ("models/Stable-diffusion/a.ckpt", "checkpoint"),
        ("models/Lora/a.safetensors", "lora"),
        ("models/LyCORIS/a.safetensors", "lora"),
        ("models/VAE/a.pt", "vae"),
        ("models/ESRGAN/a.pth", "upscaler"),
        ("models/ControlNet/a.pth", "controlnet"),
        ("embeddings/a.pt", "embedding"),
        ("misc/a.safetensors", None),
    ],
)
def test_declared_kind_from_comfyui_and_a1111_folders(tmp_path, rel, kind):
    assert declared_kind_for_path(str(tmp_path / rel), str(tmp_path)) == kind


def test_folders_above_the_root_declare_nothing(tmp_path):
    root = tmp_path / "loras" / "mine"
    assert declared_kind_for_path(str(root / "a.safetensors"), str(root)) is None
    # ... but the root's own name counts: scanning .../models/loras directly
    assert (
        declared_kind_for_path(str(tmp_path / "loras" / "a.safetensors"), str(tmp_path / "loras")) == "lora"
    )


def test_extra_model_paths_yaml_real_format(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARED_MODELS", str(tmp_path / "shared"))
    y = tmp_path / "cfg" / "extra_model_paths.yaml"
    y.parent.mkdir()
    y.write_text(
        textwrap.dedent(
            """\
            a111:
                base_path: ../webui/

                checkpoints: models/Stable-diffusion
                vae: models/VAE
                loras: |
                     models/Lora
                     models/LyCORIS
                upscale_models: |
                              models/ESRGAN
                              models/SwinIR
                embeddings: embeddings
                controlnet: models/ControlNet
            comfyui:
                base_path: $SHARED_MODELS
                is_default: true
                checkpoints: models/checkpoints/
                text_encoders: |
                    models/text_encoders/
                    models/clip/
            nobase:
                loras: relative/loras
                vae: /abs/vae
            empty:
            """
        )
    )
    roots = read_extra_model_paths(y)
    webui = os.path.normpath(tmp_path / "webui")
    shared = str(tmp_path / "shared")
    got = [(r.path, r.kind, r.is_default) for r in roots]
    assert got == [
        (os.path.join(webui, "models/Stable-diffusion"), "checkpoint", False),
        (os.path.join(webui, "models/VAE"), "vae", False),
        (os.path.join(webui, "models/Lora"), "lora", False),
        (os.path.join(webui, "models/LyCORIS"), "lora", False),
        (os.path.join(webui, "models/ESRGAN"), "upscaler", False),
        (os.path.join(webui, "models/SwinIR"), "upscaler", False),
        (os.path.join(webui, "embeddings"), "embedding", False),
        (os.path.join(webui, "models/ControlNet"), "controlnet", False),
        (os.path.join(shared, "models/checkpoints"), "checkpoint", True),
        (os.path.join(shared, "models/text_encoders"), "text_encoder", True),
        (os.path.join(shared, "models/clip"), "text_encoder", True),
        (str(tmp_path / "cfg" / "relative" / "loras"), "lora", False),
        ("/abs/vae", "vae", False),
    ]
    assert all(r.source == str(y) for r in roots)


def test_extra_model_paths_yaml_errors_are_format_errors(tmp_path):
    y = tmp_path / "extra_model_paths.yaml"
    y.write_text("a:\n  base_path: x\n loras: [unclosed\n")
    with pytest.raises(FormatError, match="not valid YAML"):
        read_extra_model_paths(y)
    y.write_text("- just\n- a list\n")
    with pytest.raises(FormatError, match="must map"):
        read_extra_model_paths(y)
    with pytest.raises(FormatError, match="cannot read"):
        read_extra_model_paths(tmp_path / "missing.yaml")


def test_discover_comfyui_tree_with_sidecars_diffusers_and_hidden_files(tmp_path):
    m = tmp_path / "ComfyUI" / "models"
    touch(m / "checkpoints" / "a.safetensors")
    touch(m / "checkpoints" / "a.preview.png")
    touch(m / "checkpoints" / "a.png")  # .preview.png is preferred
    touch(m / "checkpoints" / "a.civitai.info", b"{}")
    touch(m / "loras" / "b.safetensors")
    touch(m / "loras" / "b.webp")
    touch(m / "loras" / "b.json", b"{}")
    touch(m / "loras" / "readme.txt")
    touch(m / "loras" / ".b.safetensors.x1y2.part")  # an atomic writer's temporary file
    touch(m / "loras" / ".hidden" / "c.safetensors")
    touch(m / "embeddings" / "e.PT")  # suffixes are case-insensitive
    touch(m / "embeddings" / "E.Preview.JPEG")  # and so are sidecar names
    touch(m / "diffusers" / "sd15" / "model_index.json", b"{}")
    touch(m / "diffusers" / "sd15" / "unet" / "diffusion_pytorch_model.safetensors", b"y" * 10)
    found, problems, _ = discover([Root(str(tmp_path / "ComfyUI"))])
    assert problems == []
    by = {os.path.relpath(f.path, tmp_path / "ComfyUI"): f for f in found}
    assert sorted(by) == [
        "models/checkpoints/a.safetensors",
        "models/diffusers/sd15",
        "models/embeddings/e.PT",
        "models/loras/b.safetensors",
    ]
    a = by["models/checkpoints/a.safetensors"]
    assert a.declared_kind == "checkpoint" and a.preview.endswith("a.preview.png")
    assert [os.path.basename(n) for n in a.notes] == ["a.civitai.info"]
    b = by["models/loras/b.safetensors"]
    assert b.declared_kind == "lora" and b.preview.endswith("b.webp") and b.notes[0].endswith("b.json")
    assert by["models/embeddings/e.PT"].preview.endswith("E.Preview.JPEG")
    d = by["models/diffusers/sd15"]
    assert d.is_dir and d.size == 2 + 10 and d.declared_kind is None


def test_discover_follows_symlinks_without_looping_and_lists_each_file_once(tmp_path):
    lib = tmp_path / "lib"
    real = touch(lib / "loras" / "real.safetensors")
    os.symlink(lib, lib / "loras" / "loop")  # a folder link back up: must not loop
    os.symlink(real, lib / "loras" / "alias.safetensors")  # the same file twice: listed once
    outside = touch(tmp_path / "elsewhere" / "x.safetensors")
    os.symlink(os.path.dirname(outside), lib / "linked")  # a linked folder outside the root is followed
    os.symlink(tmp_path / "nothing.safetensors", lib / "broken.safetensors")
    found, problems, _ = discover([Root(str(lib)), Root(str(lib / "loras"))])  # overlapping roots too
    names = sorted(os.path.relpath(f.path, lib) for f in found)
    assert names == ["linked/x.safetensors", "loras/alias.safetensors"]  # sorted walk: alias before real
    assert [(os.path.basename(p.path), p.type) for p in problems] == [("broken.safetensors", "unreadable")]
    assert "broken link" in problems[0].message


def test_discover_reports_missing_roots_and_takes_single_files(tmp_path):
    f = touch(tmp_path / "vae" / "v.safetensors")
    found, problems, _ = discover([Root(f), Root(str(tmp_path / "nope"))])
    assert [x.path for x in found] == [f] and found[0].declared_kind == "vae"
    assert [(p.path, p.type) for p in problems] == [(str(tmp_path / "nope"), "missing")]


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root reads everything")
def test_discover_reports_unreadable_files_and_folders(tmp_path):
    touch(tmp_path / "ok.safetensors")
    bad = touch(tmp_path / "bad.safetensors")
    os.chmod(bad, 0)
    sub = tmp_path / "locked"
    touch(sub / "x.safetensors")
    os.chmod(sub, 0)
    try:
        found, problems, unlisted = discover([Root(str(tmp_path))])
    finally:
        os.chmod(sub, 0o755)
    assert [os.path.basename(f.path) for f in found] == ["ok.safetensors"]
    assert sorted(os.path.basename(p.path) for p in problems) == ["bad.safetensors", "locked"]
    assert unlisted == [str(sub)]


@pytest.mark.parametrize(
    "rel, name",
    [
        # diffusers' and transformers' weight names say nothing: the folders name the model
        ("ltx2/audio_vae/diffusion_pytorch_model.safetensors", "ltx2/audio_vae"),
        ("ltx2/vocoder/diffusion_pytorch_model.safetensors", "ltx2/vocoder"),
        ("sdxl/unet/diffusion_pytorch_model.fp16.safetensors", "sdxl/unet (fp16)"),  # unet: its last folder
        (
            "flux/transformer/diffusion_pytorch_model-00002-of-00003.safetensors",
            "flux/transformer (part 2 of 3)",
        ),
        ("text_encoders/t5_xxl/model-00001-of-00002.safetensors", "t5_xxl (part 1 of 2)"),
        ("models/clip/pytorch_model.bin", "clip/pytorch_model.bin"),  # kind folders alone name no model
        ("flux/vae/diffusion_pytorch_model.safetensors", "flux/vae"),
        ("loras/my_style/pytorch_lora_weights.safetensors", "my_style"),
        ("loras/adapter/adapter_model.safetensors", "adapter"),
        ("model.safetensors", "me/lib"),  # right in a library's root: the folders it is in
        # a file's own name is kept
        ("checkpoints/sd15.safetensors", "sd15.safetensors"),
        ("ltx2/audio_vae/my_model.safetensors", "my_model.safetensors"),
        ("vae/model_v2.safetensors", "model_v2.safetensors"),
    ],
)
def test_a_model_is_named_by_its_folders_when_its_file_name_is_generic(rel, name):
    from engine.catalog.layout import display_name

    path = os.path.join(os.sep, "home", "me", "lib", *rel.split("/"))
    assert display_name(path) == name  # nothing is read: the file need not exist
    assert display_name(os.path.join(os.sep, "model.safetensors")) == "model.safetensors"  # no folder
