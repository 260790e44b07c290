"""detect_file on real and header-faithful files: the reference manifests, every synth layout, the real
LyCORIS and TAEF2 files, the SDXL kohya key dump, diffusers folders, broken files — and proof that
detection reads headers only."""

from __future__ import annotations

import json
import mmap
import os
import struct

import pytest
from loadout_test_support import data_file

from engine.detect import detect_file
from engine.formats import read_header
from engine.formats.safetensors import write_sparse
from tests.support import synth


def _manifest_rows(name: str, *, optional: bool = False):
    tensors = json.loads(data_file(f"manifests/{name}").read_text())["tensors"]
    return [
        (k, v["dtype"], tuple(v["shape"])) for k, v in tensors.items() if optional or not v.get("optional")
    ]


@pytest.mark.parametrize(
    "manifest, arch, components",
    [
        ("sd15_ldm_single_file.json", "sd1", {"unet", "clip_l", "vae"}),
        ("sdxl_base_sgm_single_file.json", "sdxl", {"unet", "clip_l", "clip_g", "vae"}),
        ("flux1_dev_bfl_all_in_one.json", "flux1_dev", {"transformer", "clip_l", "t5xxl", "vae"}),
    ],
)
def test_reference_manifests(tmp_path, manifest, arch, components):
    path = write_sparse(tmp_path / "m.safetensors", _manifest_rows(manifest))
    d = detect_file(path)
    assert d.error is None
    assert (d.kind, d.architecture, d.variant) == ("checkpoint", arch, "normal")
    assert set(d.components) == components
    header = read_header(path)
    assert sum(c.bytes for c in d.components.values()) == header.data_size
    assert sum(c.tensors for c in d.components.values()) == len(header.tensors)
    assert d.file_bytes == os.path.getsize(path)


def test_sdxl_manifest_with_every_optional_key_is_v_prediction(tmp_path):
    # The manifest lists the v_pred / edm_vpred markers as optional: with them the file says v.
    d = detect_file(
        write_sparse(
            tmp_path / "v.safetensors", _manifest_rows("sdxl_base_sgm_single_file.json", optional=True)
        )
    )
    assert (d.architecture, d.prediction) == ("sdxl", "v")


# Training objectives of single-objective families (ComfyUI comfy/model_base.py: HunyuanDiT
# V_PREDICTION, PixArt EPS). Synth's layouts label these DiTs "flow" or leave them open; the cited
# objective is what detection must report.
_OBJECTIVE = {"hunyuan_dit": "v", "pixart": "eps"}


def _expected_prediction(want) -> str | None:
    if want.architecture in _OBJECTIVE:
        return _OBJECTIVE[want.architecture]
    # Synth leaves prediction open for bare UNets; detection knows SD1's (every SD1 release is eps,
    # whichever container the UNet comes in — see diffusion.py).
    if want.prediction is None and want.architecture == "sd1" and want.kind == "diffusion_model":
        return "eps"
    return want.prediction


# FLUX.1 Depth and Canny both take a 128-wide img_in: the header cannot tell them apart. FLUX.1 Fill is
# variant `fill` and FLUX.2 dev `dev-32b` (issue 16: variants carry the release line and size), whatever
# the synth registry's older names for them.
_KNOWN_VARIANT = {
    "flux1_depth_transformer": "control",
    "flux1_fill_transformer": "fill",
    "flux2_dev_transformer": "dev-32b",
}


@pytest.mark.parametrize("name", synth.names())
def test_every_synth_layout_detects_as_what_it_is(tmp_path, name):
    path = synth.write(name, tmp_path / f"{name}.safetensors")
    want = synth.info(name)
    d = detect_file(path)
    assert d.error is None, d.error
    assert (d.kind, d.architecture) == (want.kind, want.architecture)
    assert d.variant == _KNOWN_VARIANT.get(name, want.variant)
    assert d.prediction == _expected_prediction(want)
    for comp, prefix in want.components.items():
        assert comp in d.components, f"{comp} missing: {sorted(d.components)}"
        assert d.components[comp].prefix == prefix
    assert set(d.components) - set(want.components) <= {"other"}
    assert sum(c.bytes for c in d.components.values()) == read_header(path).data_size


def test_synth_options_ema_v_pred_and_bf16(tmp_path):
    path = synth.write("sdxl_checkpoint", tmp_path / "x.safetensors", v_pred=True, dtype="BF16")
    d = detect_file(path)
    assert (d.architecture, d.prediction, d.components["unet"].dtype) == ("sdxl", "v", "BF16")
    path = synth.write("sd1_checkpoint", tmp_path / "e.safetensors", ema=True)
    d = detect_file(path)
    assert (d.kind, d.architecture) == ("checkpoint", "sd1")
    assert d.components["other"].tensors > 600  # the EMA shadow copies


def test_real_lokr_lora():
    d = detect_file(data_file("weights/smart_falcon_8_lokr.safetensors"))
    assert (d.kind, d.architecture, d.error) == ("lora", "sd1", None)
    assert d.lora.algos == ("lokr",)
    assert set(d.lora.targets) == {"unet", "clip_l"}
    assert d.lora.base == "sd1"
    t = d.summary.training
    assert t["network_module"] == "lycoris.kohya" and t["network_args"]["algo"] == "lokr"
    assert t["network_dim"] == 8 and t["epochs"] == 10 and t["steps"] == 3010
    assert t["top_tags"][0][0] == "smart falcon \\(umamusume\\)"
    assert d.metadata["ss_output_name"] == "smart_falcon_8_lokr"


def test_sdxl_kohya_lora_key_dump(tmp_path):
    raw = json.loads(data_file("manifests/sdxl_kohya_lora_alien_style.keys.json").read_text())
    dtypes = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32"}
    rows = [(k, dtypes[v["dtype"]], tuple(v["shape"])) for k, v in raw.items()]
    d = detect_file(write_sparse(tmp_path / "alien.safetensors", rows))
    assert (d.kind, d.architecture, d.error) == ("lora", "sdxl", None)
    assert set(d.lora.targets) == {"unet", "clip_l", "clip_g"}
    assert d.lora.rank == 32


@pytest.mark.parametrize(
    "name, channels", [("taef2_decoder.pth", "32 latent channels → 3"), ("taef2_encoder.pth", "→ 32 latent")]
)
def test_real_taef2_files(name, channels):
    d = detect_file(data_file(f"weights/{name}"))
    assert (d.kind, d.architecture, d.error, d.format) == ("vae_approx", "flux2", None, "torch-zip")
    assert channels in d.evidence[0].reason
    assert d.components["vae"].dtype == "F16"


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_detection_reads_the_header_only(tmp_path, monkeypatch):
    path = synth.write("sdxl_checkpoint", tmp_path / "sdxl.safetensors")
    header = read_header(path)
    assert header.data_size > 6_000_000_000  # a 6.9 GB layout whose data region is a hole
    detect_file(synth.write("sd1_unet", tmp_path / "warm.safetensors"))  # imports done before measuring

    def no_mmap(*a, **k):
        raise AssertionError("detection must not map the file")

    monkeypatch.setattr(mmap, "mmap", no_mmap)
    before = _rchar()
    d = detect_file(path)
    read = _rchar() - before
    assert d.architecture == "sdxl"
    # Everything read: the 8-byte length + the header (~200 KB) twice at most (sniff + reader), no data.
    assert read < 2 * (8 + header.header_size) + 64 * 1024, read


def test_pickled_checkpoints_are_read_without_their_data():
    path = data_file("weights/taef2_decoder.pth")
    detect_file(path)
    before = _rchar()
    detect_file(path)
    assert _rchar() - before < os.path.getsize(path) // 10


def test_sd2_value_check_is_opt_in(tmp_path):
    import numpy as np

    path = synth.write("sd2_unet", tmp_path / "sd2.safetensors", dtype="F32")
    h = read_header(path)
    info = h.tensors["output_blocks.11.1.transformer_blocks.0.norm1.bias"]
    assert detect_file(path).prediction is None
    assert detect_file(path, read_values=True).prediction == "eps"  # a hole reads as zeros: std 0
    values = np.random.default_rng(0).normal(0, 0.2, info.numel).astype("<f4")
    with open(path, "r+b") as f:
        f.seek(h.data_start + info.begin)
        f.write(values.tobytes())
    d = detect_file(path, read_values=True)
    assert d.prediction == "v"
    assert any("std" in e.reason and "> 0.09" in e.reason for e in d.evidence)
    assert detect_file(path).prediction is None


def test_files_that_are_no_model(tmp_path):
    img = detect_file(data_file("images/reconstruction_example.jpg"))
    assert img.error.type == "format" and "JPEG image" in img.error.message
    txt = tmp_path / "notes.safetensors"
    txt.write_text("these are my notes about models\n")
    assert "text file" in detect_file(txt).error.message
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    e = detect_file(empty)
    assert e.error.type == "format" and "empty" in e.error.message and e.file_bytes == 0
    missing = detect_file(tmp_path / "nope.safetensors")
    assert missing.error.type == "format"


def test_truncated_download(tmp_path):
    path = synth.write("sd1_unet", tmp_path / "full.safetensors")
    cut = tmp_path / "cut.safetensors"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        cut.write_bytes(f.read(8 + n + 1000))
    d = detect_file(cut)
    assert d.error.type == "format" and "truncated" in d.error.message
    assert d.kind == "unknown" and d.to_json()["error"] == d.error.to_json()


def test_diffusers_pipeline_folder(tmp_path):
    root = tmp_path / "sdxl-diffusers"
    (root / "unet").mkdir(parents=True)
    (root / "vae").mkdir()
    (root / "text_encoder").mkdir()
    (root / "scheduler").mkdir()
    (root / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionXLPipeline",
                "unet": ["diffusers", "UNet2DConditionModel"],
                "vae": ["diffusers", "AutoencoderKL"],
                "text_encoder": ["transformers", "CLIPTextModel"],
                "scheduler": ["diffusers", "EulerDiscreteScheduler"],
            }
        )
    )
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": "v_prediction"}))
    write_sparse(
        root / "unet" / "diffusion_pytorch_model.safetensors",
        [
            ("conv_in.weight", "F16", (320, 4, 3, 3)),
            ("time_embedding.linear_1.weight", "F16", (1280, 320)),
            ("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight", "F16", (640, 2048)),
            ("add_embedding.linear_1.weight", "F16", (1280, 2816)),
        ],
    )
    synth.write("sd_vae_diffusers", root / "vae" / "diffusion_pytorch_model.safetensors")
    synth.write("clip_l", root / "text_encoder" / "model.safetensors")
    d = detect_file(root)
    assert d.error is None
    assert (d.kind, d.architecture, d.prediction, d.format) == ("checkpoint", "sdxl", "v", "diffusers")
    assert set(d.components) == {"unet", "clip_l", "vae"}
    assert d.components["unet"].prefix == "unet."
    assert any("StableDiffusionXLPipeline" in e.reason for e in d.evidence)


def test_single_component_folder(tmp_path):
    folder = tmp_path / "vae"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    synth.write("flux1_vae_diffusers", folder / "diffusion_pytorch_model.safetensors")
    d = detect_file(folder)
    assert (d.kind, d.error) == ("vae", None)
    assert detect_file(tmp_path / "vae" / "config.json").error.type == "format"


def test_pickled_embedding_and_ip_adapter(tmp_path):
    import torch

    emb = tmp_path / "bad-hands.pt"
    torch.save(
        {
            "string_to_token": {"*": 265},
            "string_to_param": {"*": torch.zeros(3, 1024)},
            "name": "bh",
            "step": 9,
        },
        emb,
    )
    d = detect_file(emb)
    assert (d.kind, d.architecture, d.error) == ("embedding", "sd2", None)
    ip = tmp_path / "ip-adapter_sd15.bin"
    torch.save(
        {
            "image_proj": {"proj.weight": torch.zeros(3072, 1024)},
            "ip_adapter": {"1.to_k_ip.weight": torch.zeros(320, 768)},
        },
        ip,
    )
    d = detect_file(ip)
    assert (d.kind, d.architecture, d.error) == ("ip_adapter", "sd1", None)


def test_gguf_model_is_named_and_loadable(tmp_path):
    from engine.formats.gguf import write_sparse_gguf

    rows = [
        (k, "Q8_0" if len(s) == 2 and s[1] % 32 == 0 else "F32", s)
        for k, _, s in synth.layout("flux1_schnell_transformer")
    ]
    path = tmp_path / "flux1-schnell-Q8_0.gguf"
    write_sparse_gguf(path, {"general.architecture": "flux", "general.quantization_version": 2}, rows)
    d = detect_file(path)
    assert (d.format, d.kind, d.architecture) == ("gguf", "diffusion_model", "flux1_schnell")
    assert d.error is None  # every type engine.quant reads
    assert d.components["transformer"].dtype == "Q8_0"
    assert d.metadata["general.architecture"] == "flux"


def test_sd2_value_check_on_a_torch_zip_checkpoint(tmp_path):
    import torch

    g = torch.Generator().manual_seed(0)
    mdm = "model.diffusion_model."
    sd = {
        f"{mdm}input_blocks.0.0.weight": torch.zeros(320, 4, 3, 3),
        f"{mdm}time_embed.0.weight": torch.zeros(1280, 320),
        f"{mdm}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": torch.zeros(320, 1024),
        f"{mdm}out.2.weight": torch.zeros(4, 320, 3, 3),
        f"{mdm}output_blocks.11.1.transformer_blocks.0.norm1.bias": torch.randn(320, generator=g) * 0.2,
    }
    path = tmp_path / "768-v-ema.ckpt"
    torch.save({"state_dict": sd, "global_step": 140000}, path)
    d = detect_file(path)
    assert (d.format, d.architecture, d.prediction) == ("torch-zip", "sd2", None)
    assert detect_file(path, read_values=True).prediction == "v"


def test_diffusers_folder_shards_and_variants(tmp_path):
    root = tmp_path / "flux-schnell"
    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(
        json.dumps({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})
    )
    rows = synth.layout("flux1_schnell_transformer_diffusers", dtype="BF16")
    half = len(rows) // 2
    t = root / "transformer"
    write_sparse(t / "diffusion_pytorch_model-00001-of-00002.safetensors", rows[:half])
    write_sparse(t / "diffusion_pytorch_model-00002-of-00002.safetensors", rows[half:])
    write_sparse(
        t / "diffusion_pytorch_model.fp16-00001-of-00001.safetensors", [(k, "F16", s) for k, _, s in rows]
    )
    d = detect_file(root)
    assert (d.kind, d.architecture, d.error) == ("checkpoint", "flux1_schnell", None)
    assert d.components["transformer"].tensors == len(rows)  # both shards, not the fp16 variant
    assert d.components["transformer"].dtype == "BF16"


def test_a_plain_folder_of_models_is_not_merged_into_one(tmp_path):
    synth.write("sd_vae", tmp_path / "a.safetensors")
    synth.write("clip_l", tmp_path / "b.safetensors")
    d = detect_file(tmp_path)
    assert d.error.type == "format" and "loadout scan" in d.error.message


_PIPELINE_COMPONENTS = {
    "sd1": {"unet", "clip_l", "vae"},
    "sd2": {"unet", "clip_h", "vae"},
    "sdxl": {"unet", "clip_l", "clip_g", "vae"},
    "flux1_dev": {"transformer", "clip_l", "t5xxl", "vae"},
    "flux1_schnell": {"transformer", "clip_l", "t5xxl", "vae"},
    "sd3_medium": {"transformer", "clip_l", "clip_g", "t5xxl", "vae"},
}


@pytest.mark.parametrize("name", sorted(synth.DIFFUSERS_PIPELINES))
def test_synth_diffusers_pipelines(tmp_path, name):
    root = synth.write_diffusers(name, tmp_path / name, shard_bytes=2 * 1024**3)
    d = detect_file(root)
    assert d.error is None, d.error
    assert (d.kind, d.format) == ("checkpoint", "diffusers")
    assert d.architecture == {"sd3_medium": "sd3"}.get(name, name)
    assert set(d.components) == _PIPELINE_COMPONENTS[name]
    for comp in d.components.values():
        assert comp.prefix.endswith(".") and comp.tensors > 0


def test_lora_object_has_exactly_the_design_fields():
    j = detect_file(data_file("weights/smart_falcon_8_lokr.safetensors")).to_json()
    assert list(j["lora"]) == ["format", "algos", "rank", "alpha", "targets", "base"]
    assert j["lora"]["rank"] == 8 and j["lora"]["alpha"] == 8.0
    assert any("350 modules" in e["reason"] for e in j["evidence"])


def test_gguf_t5_text_encoder(tmp_path):
    from engine.formats.gguf import write_sparse_gguf

    rows = [("token_embd.weight", "Q8_0", (32128, 4096)), ("enc.output_norm.weight", "F32", (4096,))]
    for i in range(24):
        for n in ("attn_q", "attn_k", "attn_v", "attn_o"):
            rows.append((f"enc.blk.{i}.{n}.weight", "Q8_0", (4096, 4096)))
    path = tmp_path / "t5-v1_1-xxl-encoder-Q8_0.gguf"
    write_sparse_gguf(path, {"general.architecture": "t5encoder"}, rows)
    d = detect_file(path)
    # llama.cpp's names are read under transformers' (engine.formats.gguf_names): a loadable T5-XXL
    assert (d.kind, list(d.components), d.error) == ("text_encoder", ["t5xxl"], None)


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("name", ["sd1_checkpoint", "sd2_checkpoint", "sdxl_checkpoint"])
def test_sparse_pickled_checkpoints_detect_from_their_pickle_alone(tmp_path, name):
    path = synth.write_ckpt(name, tmp_path / f"{name}.ckpt")
    want = synth.info(name)
    detect_file(path)  # warm
    before = _rchar()
    d = detect_file(path)
    read = _rchar() - before
    assert (d.format, d.kind, d.architecture, d.error) == ("torch-zip", "checkpoint", want.architecture, None)
    assert set(want.components) <= set(d.components)
    total = sum(c.bytes for c in d.components.values())
    assert total > 2_000_000_000 and read < total // 1000  # GBs of tensors, a few hundred KB read


def test_tiny_and_binary_junk(tmp_path):
    tiny = tmp_path / "cut.safetensors"
    tiny.write_bytes(b"\x10\x27\x00\x00")
    assert "truncated" in detect_file(tiny).error.message
    junk = tmp_path / "random.bin"
    junk.write_bytes(bytes(range(200, 256)) * 4)
    assert "no format Loadout knows" in detect_file(junk).error.message
    lfs = tmp_path / "model.safetensors"
    lfs.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    assert "git lfs pull" in detect_file(lfs).error.message


def test_a_zip_the_reader_cannot_handle_is_reported_not_raised(tmp_path):
    # A zip whose member claims a newer zip version: Python's zipfile raises NotImplementedError.
    import zipfile

    path = tmp_path / "odd.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 6 : cd + 8] = (64).to_bytes(2, "little")  # "version needed to extract": 6.4
    lh = raw.find(b"PK\x03\x04")
    raw[lh + 4 : lh + 6] = (64).to_bytes(2, "little")
    path.write_bytes(bytes(raw))
    d = detect_file(path)
    assert d.error is not None and d.error.type in ("format", "error")
