"""diffusers' forward of the 2026 video and image families (HunyuanVideo 1.5, LTX-Video, Cosmos Predict2 and 1.0, Krea 2, Qwen-Image
2.1), PixArt, Mochi 1, Hunyuan-DiT, FLUX.3, Wan-Animate-2, ERNIE-Image, PRX, JoyImage, GLM-Image, Ideogram 4, Bria 3.2 / FIBO, Motif-Video, SANA-Video and Stable Cascade's Stage C on
Loadout's input names, for bench_step.py and gpu_check.py: each family's own conventions (packed tokens, position
coordinates, masks) built here from the same inputs Loadout's step gets."""

from __future__ import annotations


def run_diffusers(model, family: str, x: dict):
    import torch

    if family == "flux3":  # diffusers' own input names; its ids without the batch axis
        cond = x.get("image_cond_hidden_states")
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     timestep=x["timestep"], img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0],
                     image_cond_hidden_states=cond, image_cond_ids=None if cond is None else x["image_cond_ids"][0],
                     target_timestep=x.get("target_timestep")).sample  # fmt: skip

    if family == "hunyuan_video15":  # t2v: a zero image (the pipeline's), no glyph text
        b = x["x"].shape[0]
        dev, dt = x["x"].device, x["text_states"].dtype
        cfg = model.config
        return model(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["text_states"],
                     encoder_attention_mask=torch.ones(x["text_states"].shape[:2], device=dev),
                     encoder_hidden_states_2=torch.zeros(b, 1, cfg.text_embed_2_dim, device=dev, dtype=dt),
                     encoder_attention_mask_2=torch.zeros(b, 1, device=dev),
                     image_embeds=torch.zeros(b, 729, cfg.image_embed_dim, device=dev, dtype=dt)).sample  # fmt: skip
    if family == "ltxv":  # packed tokens; the original pipeline's pixel coordinates at 25 fps
        b, c, f, h, w = x["x"].shape
        dev = x["x"].device
        fi, hi, wi = torch.meshgrid(*(torch.arange(n, device=dev) for n in (f, h, w)), indexing="ij")
        frames = (fi.flatten().float() * 8 + 1 - 8).clamp(min=0) / 25.0
        coords = torch.stack([frames, hi.flatten().float() * 32, wi.flatten().float() * 32])[None].expand(
            b, -1, -1
        )
        out = model(hidden_states=x["x"].flatten(2).transpose(1, 2), encoder_hidden_states=x["context"],
                    timestep=x["timestep"] * 1000, encoder_attention_mask=torch.ones(x["context"].shape[:2], device=dev),
                    video_coords=coords).sample  # fmt: skip
        return out.transpose(1, 2).reshape(b, c, f, h, w)
    if family in ("cosmos", "cosmos1"):  # a zero padding mask, as its pipelines pass (Predict2's and 1.0's)
        _torchvision_resize()
        b, c, f, h, w = x["x"].shape
        pad = torch.zeros(1, 1, h, w, device=x["x"].device, dtype=x["x"].dtype)
        return model(hidden_states=x["x"], timestep=x["timesteps"], encoder_hidden_states=x["context"],
                     padding_mask=pad).sample  # fmt: skip
    if family == "krea2":  # 2x2 patches (c, row, column); text at the origin, image at (0, row, column)
        b, c, h, w = x["x"].shape
        dev = x["x"].device
        packed = x["x"].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, 4 * c)
        t = x["context"].shape[1]
        ids = torch.zeros(t + (h // 2) * (w // 2), 3, device=dev)
        grid = torch.stack(torch.meshgrid(torch.arange(h // 2, device=dev), torch.arange(w // 2, device=dev),
                                          indexing="ij"), dim=-1)  # fmt: skip
        ids[t:, 1:] = grid.reshape(-1, 2).float()
        out = model(hidden_states=packed, encoder_hidden_states=x["context"], timestep=x["timesteps"],
                    position_ids=ids).sample  # fmt: skip
        return out.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    if family == "ernie_image":  # Loadout's names are diffusers' forward's; every text token kept
        b, t = x["text_bth"].shape[:2]
        lens = x.get("text_lens", torch.full((b,), t, device=x["text_bth"].device))
        return model(hidden_states=x["hidden_states"], timestep=x["timestep"], text_bth=x["text_bth"],
                     text_lens=lens.long()).sample  # fmt: skip
    # Bria 3.2 / FIBO: diffusers' own names; its ids without the batch axis, FIBO's layers as one list
    if family in ("bria", "bria_fibo"):
        more = {}
        if family == "bria_fibo":
            more["text_encoder_layers"] = list(x["text_encoder_layers"].unbind(1))
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     timestep=x["timestep"], img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0], **more).sample  # fmt: skip
    if family == "glm_image":  # Loadout's names are diffusers' forward's (ids and drop flags as their dtypes)
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     prior_token_id=x["prior_token_id"].long(), prior_token_drop=x["prior_token_drop"].bool(),
                     timestep=x["timestep"], target_size=x["target_size"], crop_coords=x["crop_coords"]).sample  # fmt: skip
    if (
        family == "ideogram4"
    ):  # Loadout's names are diffusers' forward's (its packed layout's ids as integers)
        return model(hidden_states=x["hidden_states"], timestep=x["timestep"],
                     encoder_hidden_states=x["encoder_hidden_states"], position_ids=x["position_ids"].long(),
                     segment_ids=x["segment_ids"].long(), indicator=x["indicator"].long()).sample  # fmt: skip
    if (
        family == "nucleus_image"
    ):  # Loadout's names are diffusers' forward's (img_shapes as its list of tuples)
        shapes = [tuple(int(v) for v in row) for row in x["img_shapes"]]
        mask = x.get("encoder_hidden_states_mask")
        return model(hidden_states=x["hidden_states"], timestep=x["timestep"], img_shapes=shapes,
                     encoder_hidden_states=x["encoder_hidden_states"],
                     encoder_hidden_states_mask=None if mask is None else mask.bool()).sample  # fmt: skip
    if (
        family == "bria_fibo2"
    ):  # Loadout's names are diffusers' forward's (a random step: no mask, no context)
        return model(**x).sample
    if family in (
        "prx",
        "joyimage",
        "sana_video",
    ):  # Loadout's names are diffusers' forward's (JoyImage: the Edit class's)
        return model(**x).sample
    if family == "motif_video":  # Loadout's names are diffusers' forward's (no mask, no image: t2v)
        return model(**x).sample
    if family in ("longcat_image", "ovis_image"):  # Loadout's names are diffusers' forward's
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     timestep=x["timestep"], img_ids=x["img_ids"], txt_ids=x["txt_ids"]).sample  # fmt: skip
    if family == "qwen_image21":
        # text to image: unpatched tokens, the target's slots in img_mask, its tokens out
        b, c, h, w = x["x"].shape
        dev = x["x"].device
        t = x["context"].shape[1]
        img_mask = torch.cat([torch.zeros(b, t, dtype=torch.bool, device=dev),
                              torch.ones(b, h * w // 4, dtype=torch.bool, device=dev)], 1)  # fmt: skip
        out = model(hidden_states=x["x"].flatten(2).transpose(1, 2), encoder_hidden_states=x["context"],
                    timestep=x["timesteps"], img_shapes=[[(1, h, w)]] * b, img_mask=img_mask).sample  # fmt: skip
        return out[:, -h * w :].transpose(1, 2).reshape(b, c, h, w)
    if family == "pixart":  # Σ: no size conditions, every caption token kept
        return model(hidden_states=x["x"], encoder_hidden_states=x["y"], timestep=x["timestep"],
                     added_cond_kwargs={"resolution": None, "aspect_ratio": None}).sample  # fmt: skip
    if family == "mochi":  # its timestep is 1000 (1 - sigma); every T5 token kept; its output is Genmo's
        mask = x.get("y_mask", torch.ones(x["y_feat"].shape[:2], device=x["x"].device))
        return model(hidden_states=x["x"], encoder_hidden_states=x["y_feat"], timestep=1000 * (1 - x["sigma"]),
                     encoder_attention_mask=mask).sample  # fmt: skip
    if family == "kandinsky5":  # diffusers' names; the pipelines' aranges, one RoPE scale for the batch
        _, t, h, w, _ = x["hidden_states"].shape
        dev = x["hidden_states"].device
        pos = [torch.arange(n, device=dev) for n in (t, h // 2, w // 2)]
        scale = x["scale_factor"][0].tolist() if "scale_factor" in x else (1.0, 1.0, 1.0)
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     timestep=x["timestep"], pooled_projections=x["pooled_projections"], visual_rope_pos=pos,
                     text_rope_pos=torch.arange(x["encoder_hidden_states"].shape[1], device=dev),
                     scale_factor=scale).sample  # fmt: skip
    if family == "kandinsky6":  # diffusers' names; its config's RoPE scale (1, 2, 2); the video's velocity
        return model(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                     pooled_projections=x["pooled_projections"], timestep=x["timestep"],
                     audio_hidden_states=x.get("audio_hidden_states")).sample  # fmt: skip
    if family == "kandinsky6_sr":  # diffusers' names
        return model(hidden_states=x["hidden_states"], timestep=x["timestep"]).sample
    if family == "minimax_h3":  # Loadout's input names are diffusers' forward's; the layout's rows as indices
        layout = ("timestep_indices", "token_tags", "video_indices", "audio_indices", "text_indices")
        return model(**{k: v.long() if k in layout else v for k, v in x.items()}).sample
    if family == "hunyuan_dit":
        # v1.2: every text token kept; its pipeline's RoPE (the release's on a square grid)
        from diffusers.models.embeddings import get_2d_rotary_pos_embed
        from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

        dev = x["x"].device
        grid = (x["x"].shape[-2] // 2, x["x"].shape[-1] // 2)
        head = model.inner_dim // model.num_heads
        rope = get_2d_rotary_pos_embed(head, get_resize_crop_region_for_grid(grid, 32), grid, device=dev)
        clip, t5 = x["encoder_hidden_states"], x["encoder_hidden_states_t5"]
        return model(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=clip,
                     text_embedding_mask=torch.ones(clip.shape[:2], device=dev), encoder_hidden_states_t5=t5,
                     text_embedding_mask_t5=torch.ones(t5.shape[:2], device=dev), image_rotary_emb=rope).sample  # fmt: skip
    if family == "wan_animate2":
        return _wan_animate2(model, x)
    if family == "stable_cascade_c":  # sample = x, timestep_ratio = r (StableCascadeUNet's names)
        return model(x["x"], x["r"], clip_text_pooled=x["clip_text_pooled"], clip_text=x["clip_text"],
                     clip_img=x["clip_img"]).sample  # fmt: skip
    raise ValueError(family)


def _wan_animate2(model, x: dict):
    """Its pipeline's two calls: the reference pass (`extract`) once per run (kept on the model for the later steps, as
    Loadout keeps it), then the step against the cached keys and values."""
    import torch
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    _, _, f, h, w = x["hidden_states"].shape
    grid = torch.tensor([[f - 1, h // 2, w // 2]])
    held = getattr(model, "_bench_reference", None)
    if held is None or held[0] is not x["driving_video_latents"]:
        cache = WanAnimate2KVCache(len(model.blocks))
        model(list(x["driving_video_latents"]), timestep=x["timestep"], encoder_hidden_states=list(x["prompt_ref_embeds"]),
              encoder_hidden_states_image=x["condition_clip_context"], condition_latents=list(x["driving_video_condition"]),
              kv_cache=cache, kv_cache_mode="extract", seq_len=(f - 1) * h * w // 4, offset_grid_sizes=grid)  # fmt: skip
        model._bench_reference = held = (x["driving_video_latents"], cache)
    out = model(list(x["hidden_states"]), timestep=x["timestep"], encoder_hidden_states=list(x["encoder_hidden_states"]),
                encoder_hidden_states_image=x["encoder_hidden_states_image"], condition_latents=list(x["condition_latents"]),
                kv_cache=held[1], kv_cache_mode="cached", seq_len=f * h * w // 4, reference_grid_sizes=grid,
                origin_len=4 * (f - 2) + 1, origin_area=[8 * h, 8 * w]).sample  # fmt: skip
    return torch.stack(out)


def _torchvision_resize() -> None:
    """diffusers' Cosmos resizes its padding mask with torchvision, which this project does not install: the same
    nearest-neighbour resize through torch where it is missing."""
    import types

    import torch.nn.functional as F
    from diffusers.models.transformers import transformer_cosmos

    if hasattr(transformer_cosmos, "transforms"):
        return

    def resize(t, size, interpolation=None):
        return F.interpolate(t, size=tuple(size), mode="nearest")

    transformer_cosmos.transforms = types.SimpleNamespace(
        functional=types.SimpleNamespace(resize=resize),
        InterpolationMode=types.SimpleNamespace(NEAREST="nearest"),
    )
