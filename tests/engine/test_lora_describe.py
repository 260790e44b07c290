"""describe_lora: LoRA facts from the header of real adapters and of synthetic ones in each naming."""

from __future__ import annotations

from lora_fixtures import sparse_from_manifest

from engine.formats.safetensors import read_header, write_sparse
from engine.lora import LoraInfo, describe_lora


def test_real_lokr_is_an_sd1_lokr_on_unet_and_clip_l(shared_data):
    info = describe_lora(read_header(shared_data("weights/smart_falcon_8_lokr.safetensors")))
    assert isinstance(info, LoraInfo)
    assert info.algos == ("lokr",)
    assert info.base == "sd1"
    assert info.targets == ("unet", "clip_l")
    assert info.format == "kohya"
    assert info.rank == 8 and info.alpha == 8.0
    assert info.modules == 350
    assert info.to_json()["targets"] == ["unet", "clip_l"]


def test_sdxl_kohya_key_dump_is_an_sdxl_lora_on_unet_and_both_clips(tmp_path):
    path = sparse_from_manifest(
        "manifests/sdxl_kohya_lora_alien_style.keys.json", tmp_path / "alien.safetensors"
    )
    info = describe_lora(read_header(path))
    assert info is not None
    assert (info.format, info.algos, info.base, info.rank) == ("kohya", ("lora",), "sdxl", 32)
    assert info.targets == ("unet", "clip_l", "clip_g")
    assert info.modules == 986


def test_a_checkpoint_is_not_an_adapter(tmp_path):
    path = sparse_from_manifest("manifests/sd15_ldm_single_file.json", tmp_path / "sd15.safetensors")
    assert describe_lora(read_header(path)) is None


def _lora(tmp_path, name, entries, metadata=None):
    return read_header(write_sparse(tmp_path / name, entries, metadata))


def test_diffusers_flux_lora_is_flux_transformer(tmp_path):
    entries = []
    for i in range(2):
        for proj in ("to_q", "to_k", "to_v", "add_q_proj"):
            base = f"transformer.transformer_blocks.{i}.attn.{proj}"
            entries += [
                (f"{base}.lora_A.weight", "BF16", (16, 3072)),
                (f"{base}.lora_B.weight", "BF16", (3072, 16)),
            ]
        s = f"transformer.single_transformer_blocks.{i}.proj_out"
        entries += [(f"{s}.lora_A.weight", "BF16", (16, 15360)), (f"{s}.lora_B.weight", "BF16", (3072, 16))]
    info = describe_lora(_lora(tmp_path, "flux.safetensors", entries))
    assert (info.format, info.base, info.targets, info.rank, info.algos) == (
        "diffusers",
        "flux1",
        ("transformer",),
        16,
        ("lora",),
    )


def test_kohya_sd3_with_three_text_encoders(tmp_path):
    entries = [
        ("lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight", "F16", (4, 1536)),
        ("lora_unet_joint_blocks_0_x_block_attn_qkv.lora_up.weight", "F16", (4608, 4)),
        ("lora_unet_joint_blocks_0_x_block_attn_qkv.alpha", "F16", ()),
        ("lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", "F16", (4, 768)),
        ("lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", "F16", (768, 4)),
        ("lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight", "F16", (4, 1280)),
        ("lora_te2_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight", "F16", (1280, 4)),
        ("lora_te3_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight", "F16", (4, 4096)),
        ("lora_te3_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight", "F16", (4096, 4)),
    ]
    info = describe_lora(_lora(tmp_path, "sd3.safetensors", entries, {"ss_network_alpha": "2"}))
    assert info.base == "sd3"
    assert info.targets == ("transformer", "clip_l", "clip_g", "t5xxl")
    assert info.alpha == 2.0


def test_sd2_text_encoder_width_decides(tmp_path):
    entries = [
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight",
            "F16",
            (8, 1024),
        ),
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_up.weight",
            "F16",
            (320, 8),
        ),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight", "F16", (8, 1024)),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.lora_up.weight", "F16", (4096, 8)),
    ]
    info = describe_lora(_lora(tmp_path, "sd2.safetensors", entries))
    assert info.base == "sd2" and info.targets == ("unet", "clip_h")


def test_loha_dora_and_peft(tmp_path):
    entries = [
        (
            "base_model.model.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.lora_A.weight",
            "F32",
            (4, 2048),
        ),
        (
            "base_model.model.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.lora_B.weight",
            "F32",
            (640, 4),
        ),
        (
            "base_model.model.down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.lora_magnitude_vector",
            "F32",
            (640,),
        ),
    ]
    info = describe_lora(_lora(tmp_path, "peft.safetensors", entries))
    assert (info.format, info.base, info.algos) == ("peft", "sdxl", ("dora", "lora"))
    loha = [
        ("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.hada_w1_a", "F16", (320, 4)),
        ("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.hada_w1_b", "F16", (4, 768)),
        ("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.hada_w2_a", "F16", (320, 4)),
        ("lora_unet_mid_block_attentions_0_transformer_blocks_0_attn2_to_k.hada_w2_b", "F16", (4, 768)),
    ]
    info = describe_lora(_lora(tmp_path, "loha.safetensors", loha))
    assert (info.algos, info.base, info.rank) == (("loha",), "sd1", 4)


def test_broken_factor_pair_is_refused_with_the_module_named():
    import pytest
    import torch

    from engine.errors import FormatError
    from engine.lora.adapter import adapter_from_tensors

    t = {"lora_unet_x.lora_up.weight": torch.zeros(8, 4), "lora_unet_x.lora_down.weight": torch.zeros(2, 8)}
    with pytest.raises(FormatError, match="lora_unet_x.*do not share a rank"):
        adapter_from_tensors(t)
    with pytest.raises(FormatError, match="not a LoRA"):
        adapter_from_tensors({"model.diffusion_model.out.2.weight": torch.zeros(4, 4)})


def _hostile_adapters():
    import torch

    q = "lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q"
    up, down = f"{q}.lora_up.weight", f"{q}.lora_down.weight"
    pair = {up: torch.randn(32, 4), down: torch.randn(4, 32)}
    return [
        ("alpha holds 3 values", {**pair, f"{q}.alpha": torch.ones(3)}),
        ("alpha is nan.*diverged", {**pair, f"{q}.alpha": torch.tensor(float("nan"))}),
        (
            "1 module.*NaN or infinite.*diverged",
            {up: torch.full((32, 4), float("inf")), down: torch.randn(4, 32)},
        ),
        ("NaN or infinite", {up: torch.randn(32, 4).half(), down: torch.full((4, 32), float("nan")).half()}),
        ("lacks its up/down partner", {down: torch.randn(4, 32)}),
        (
            r"(up|down) has shape \[(32, 0|0, 32)\]: it holds no values",
            {up: torch.zeros(32, 0), down: torch.zeros(0, 32)},
        ),
        ("do not share a rank", {up: torch.randn(32, 4), down: torch.tensor(1.0)}),
        ("DoRA magnitude holds 7 values", {**pair, f"{q}.dora_scale": torch.randn(7, 1)}),
    ]


def test_hostile_adapters_are_refused_before_any_weight_is_touched():
    """Adapters whose parts cannot make a finite weight change are FormatErrors that name the module and
    what is wrong. Each of these reached the patch before (a 0-d down, an empty rank, a DoRA magnitude
    of the wrong size: torch's IndexError or reshape error out of `loadout step --lora`) or was taken
    silently (a vector alpha as none; NaN alphas and factors: every output NaN)."""
    import pytest
    import torch

    from engine.errors import FormatError
    from engine.lora.adapter import adapter_from_tensors

    for match, tensors in _hostile_adapters():
        with pytest.raises(FormatError, match=match):
            adapter_from_tensors(tensors, path="bad.safetensors")
    # large finite halves are finite (the norms are taken in float32), and int8 factors are cast
    big = {"lora_unet_x.lora_up.weight": torch.full((32, 4), 60000.0).half(),
           "lora_unet_x.lora_down.weight": torch.full((4, 32), 60000.0).half()}  # fmt: skip
    assert adapter_from_tensors(big).modules["lora_unet_x"].rank == 4
    # float64 factors (a pickled LoRA trained in double) are checked in their own width: torch refuses
    # a float32 norm of them; and a float32 tensor whose norm overflows while every value is finite
    # is finite, while one infinity among float64 values is not
    wide = {"lora_unet_x.lora_up.weight": torch.randn(32, 4, dtype=torch.float64),
            "lora_unet_x.lora_down.weight": torch.full((4, 32), 3e38)}  # fmt: skip
    assert adapter_from_tensors(wide).modules["lora_unet_x"].rank == 4
    wide["lora_unet_x.lora_up.weight"][3, 1] = float("inf")
    with pytest.raises(FormatError, match="1 module.* NaN or infinite values .lora_unet_x"):
        adapter_from_tensors(wide)


def test_coverage_of_factors_that_make_no_change_is_a_shape_mismatch(tmp_path):
    """`loadout lora inspect` reads shapes from the header only: a 0-d down is reported, not an IndexError."""
    from engine.lora.coverage import coverage

    q = "lora_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q"
    rows = [(f"{q}.lora_up.weight", "F32", (32, 4)), (f"{q}.lora_down.weight", "F32", ())]
    base = {"model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight": (32, 32)}
    cov = coverage(_lora(tmp_path, "scalar.safetensors", rows), base)
    (tc,) = cov.targets.values()
    assert tc.mapped == 0 and tc.shape_mismatch[0]["lora_shape"] == {"up": [32, 4], "down": []}
    # half a LoHa, a 1-D LoKr half: described (module_facts) and reported, not a TypeError / IndexError
    for rows in ([(f"{q}.hada_w1_a", "F32", (32, 4))],
                 [(f"{q}.lokr_w1", "F32", (4,)), (f"{q}.lokr_w2_a", "F32", (8,)), (f"{q}.lokr_w2_b", "F32", (2,))]):  # fmt: skip
        cov = coverage(_lora(tmp_path, "half.safetensors", rows), base)
        assert sum(t.mapped for t in cov.targets.values()) == 0


def test_header_side_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, engine.lora, engine.lora.coverage, engine.cli.lora, engine.cli.bake;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    from loadout_test_support import ROOT

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_load_adapter_reads_pickled_adapters_and_names_what_it_found(tmp_path):
    import pytest
    import torch

    from engine.errors import FormatError
    from engine.lora.adapter import load_adapter

    t = {"lora_unet_x.lora_up.weight": torch.ones(8, 2), "lora_unet_x.lora_down.weight": torch.ones(2, 4)}
    torch.save(t, tmp_path / "old.pt")
    a = load_adapter(tmp_path / "old.pt")
    assert a.modules["lora_unet_x"].delta().shape == (8, 4)
    # a trainer's nn.Parameters come back as plain tensors: no autograd graph behind any delta
    torch.save({k: torch.nn.Parameter(v) for k, v in t.items()}, tmp_path / "params.pt")
    a = load_adapter(tmp_path / "params.pt")
    parts = [p for m in a.modules.values() for p in m.parts.values()]
    assert parts and all(type(p) is torch.Tensor and not p.requires_grad for p in parts)
    assert not a.modules["lora_unet_x"].delta().requires_grad
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 32)
    with pytest.raises(FormatError, match="this is a PNG image, not a LoRA"):
        load_adapter(tmp_path / "x.png")
    (tmp_path / "notes.txt").write_text("a prompt, saved by mistake as the LoRA")
    with pytest.raises(FormatError, match="this is a text file, not a LoRA"):
        load_adapter(tmp_path / "notes.txt")


def _grouped_by_split_key(keys):
    """group_modules' contract, spelled out through split_key one key at a time."""
    from engine.lora.parts import WEIGHT_PARTS, split_key

    modules, other = {}, []
    for key in keys:
        sp = split_key(key)
        if sp is None:
            other.append(key)
        else:
            modules.setdefault(sp[0], {})[sp[1]] = key
    for name, parts in modules.items():  # (IA)³: the flag's module takes its bare `.weight`
        if "on_input" in parts and f"{name}.weight" in other:
            parts["ia3"] = f"{name}.weight"
            other.remove(f"{name}.weight")
    for name in [n for n, parts in modules.items() if not (parts.keys() & WEIGHT_PARTS)]:
        other.extend(modules.pop(name).values())
    return modules, other


def test_group_modules_splits_every_key_as_split_key_does():
    """The inlined grouping a scan runs gives split_key's answer for each key: every suffix under
    every naming, the special names (attention processors, Flux norm scales) and edge cases."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from engine.lora.parts import _SUFFIXES, group_modules

    suffixes = [s for s, _ in _SUFFIXES] + ["weight", "bias", "scale", "up.weight", "lora.weight", "x.alpha"]
    heads = [
        "lora_unet_down_blocks_0_attentions_0_proj_in",
        "unet.down_blocks.0.attentions.0.proj_in",
        "double_blocks.0.img_attn.norm.query_norm",
        "single_blocks.3.norm.key_norm",
        "unet.mid_block.attentions.0.transformer_blocks.0.attn1.processor",
        "double_blocks.1.processor",
        "",
        "lora",
        "a.lora_linear_layer",
        "lora_unet_x",  # with "weight" and "on_input": an (IA)³ module
    ]
    tails = [
        ".processor.to_q_lora.up.weight",
        ".processor.to_out_lora.down.weight",
        ".processor.qkv_lora1.down.weight",
        ".processor.proj_lora.up.weight",
        ".scale",
    ]
    key = st.one_of(
        st.builds(lambda h, s: f"{h}.{s}" if h else s, st.sampled_from(heads), st.sampled_from(suffixes)),
        st.builds(lambda h, t: h + t, st.sampled_from(heads), st.sampled_from(tails)),
        st.text(alphabet="ab._\n", max_size=12),
    )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(key, max_size=30, unique=True))
    def agree(keys):
        assert group_modules(keys) == _grouped_by_split_key(keys)

    agree()


def test_kandinsky_loras_name_kandinsky5_only_where_its_own_blocks_say_so(tmp_path):
    """Kandinsky 5's text blocks or its visual blocks' cross-attention name it; Kandinsky 6's nested blocks name
    Kandinsky 6; Kandinsky 6 SR's MLP names it, while a LoRA of the visual self-attention alone (both hold it) names
    none."""

    def base(name, modules):
        entries = []
        for m in modules:
            entries += [
                (f"transformer.{m}.lora_A.weight", "BF16", (8, 64)),
                (f"transformer.{m}.lora_B.weight", "BF16", (64, 8)),
            ]
        return describe_lora(_lora(tmp_path, name, entries)).base

    k5 = (
        "visual_transformer_blocks.0.self_attention.to_query",
        "visual_transformer_blocks.0.cross_attention.to_key",
    )
    assert base("k5.safetensors", k5) == "kandinsky5"
    assert base("k5_text.safetensors", ("text_transformer_blocks.1.feed_forward.in_layer",)) == "kandinsky5"
    k6 = ("visual_transformer_blocks.0.video_dec_block.cross_attention.to_key",
          "video_text_transformer_blocks.0.self_attention.to_query")  # fmt: skip
    assert base("k6.safetensors", k6) == "kandinsky6"
    for m in ("audio_text_transformer_blocks.3.feed_forward.net.2", "visual_transformer_blocks.7.va_cross_attention.to_key",
              "visual_transformer_blocks.0.audio_dec_block.feed_forward.net.0.proj"):  # fmt: skip
        assert base("k6_one.safetensors", (m,)) == "kandinsky6", m
    assert base("sr.safetensors", ("visual_transformer_blocks.0.self_attention.to_query",)) not in (
        "kandinsky5",
        "kandinsky6_sr",
    )
    sr = (
        "visual_transformer_blocks.0.self_attention.to_query",
        "visual_transformer_blocks.3.feed_forward.net.2",
    )
    assert base("sr_mlp.safetensors", sr) == "kandinsky6_sr"  # its MLP's names are its own
