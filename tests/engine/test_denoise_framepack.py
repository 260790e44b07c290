"""FramePack's transformer (engine.denoise.framepack) against diffusers' HunyuanVideoFramepackTransformer3DModel on the
same weights (diffusers' naming, as FramePack's files are), reduced width and depth, float32, CPU: a section with its
clean, 2x and 4x history (sizes that need padding) at their frame indices, the first frame's image states and a
padded prompt; its op order and a step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_steps_alike, recorded_order, rel_l2, write
from hunyuan_files import diffusers_framepack

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4


@pytest.fixture(scope="module")
def framepack(tmp_path_factory):
    ref, sd = diffusers_framepack()
    return write(tmp_path_factory.mktemp("framepack") / "FramePackI2V_HY.safetensors", sd), ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert (
        det.architecture,
        det.components["transformer"].variant
        if hasattr(det.components["transformer"], "variant")
        else "framepack",
    ) == ("hunyuan_video", "framepack")
    return denoise.bind(Component("transformer", path, ""), "hunyuan_video")


def _inputs(den, batch: int = 2) -> dict:
    g = torch.Generator().manual_seed(3)
    x = den.random_inputs(64, 64, batch=batch, seed=1)
    assert x["image_embeddings"].shape == (batch, 729, 40)
    x["image_embeddings"] = x["image_embeddings"][:, :9]
    x["text_states"] = x["text_states"][:, :16]
    x["text_mask"] = torch.ones(batch, 16)
    x["text_mask"][-1, 10:] = 0
    x["x"] = torch.randn(batch, 4, 2, 8, 12, generator=g)
    x["latent_indices"] = torch.tensor([[9.0, 10.0]]).expand(batch, -1)
    x["clean_latents"] = torch.randn(batch, 4, 2, 8, 12, generator=g)
    x["clean_latent_indices"] = torch.tensor([[0.0, 11.0]]).expand(batch, -1)
    x["clean_latents_2x"] = torch.randn(batch, 4, 3, 8, 12, generator=g)  # 3 frames: padded to 4
    x["clean_latent_2x_indices"] = torch.tensor([[12.0, 13.0, 14.0]]).expand(batch, -1)
    x["clean_latents_4x"] = torch.randn(
        batch, 4, 5, 8, 12, generator=g
    )  # 5 frames, 12 columns: padded to 8, 16
    x["clean_latent_4x_indices"] = torch.arange(15.0, 20.0)[None].expand(batch, -1)
    return den.check_inputs(x, "inputs")


def _diffusers(ref, x: dict) -> torch.Tensor:
    """diffusers' forward: its frame indices one row for the batch (the test's rows are the same)."""
    x = {k: (v[0] if "indices" in k else v) for k, v in x.items()}
    return ref(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["text_states"],
               encoder_attention_mask=x["text_mask"], pooled_projections=x["text_states_2"],
               image_embeds=x["image_embeddings"], indices_latents=x["latent_indices"], guidance=x["guidance"],
               latents_clean=x["clean_latents"], indices_latents_clean=x["clean_latent_indices"],
               latents_history_2x=x["clean_latents_2x"], indices_latents_history_2x=x["clean_latent_2x_indices"],
               latents_history_4x=x["clean_latents_4x"], indices_latents_history_4x=x["clean_latent_4x_indices"]).sample  # fmt: skip


@pytest.mark.parametrize("batch", [1, 2])
def test_a_section_with_its_history_equals_diffusers(framepack, batch):
    path, ref, _ = framepack
    den = _bound(path)
    x = _inputs(den, batch)
    with torch.inference_mode():
        want = _diffusers(ref, x)
        err = rel_l2(den(x), want)
        print(f"framepack (batch {batch}): relative L2 {err:.2e}")
        assert err <= TOL and want.shape == x["x"].shape
        # the history reaches the output
        assert rel_l2(den({k: v for k, v in x.items() if not k.startswith("clean")}), want) > 100 * TOL


def test_op_order_is_the_call_order(framepack):
    c = Component("transformer", framepack[0], "")
    den = denoise.bind(c, "hunyuan_video")
    seen = recorded_order(den, c, _inputs(den, 1))
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()] and len(seen) == len(c.units)


def test_steps_fully_and_partially_alike(framepack, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(framepack[0], tmp_path, 0.004, "hunyuan_video", (1, 4, 1, 8, 8))
