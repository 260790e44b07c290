"""The shapes a forward's inputs must have (engine.denoise.inputs checks them against these), per family."""

from __future__ import annotations


def axes_of(model) -> int:
    """The position axes of a FLUX forward's ids: FLUX.1's (0, row, column), FLUX.2's (t, h, w, l)."""
    return 4 if getattr(model, "family", "") == "flux2" else 3


def batch_axis(name: str) -> int:
    """The axis of an input that holds the batch: HiDream's Llama states are a stack of layers, each [B, T, D]."""
    return 1 if name == "encoder_hidden_states_llama3" else 0


def shapes(model, got) -> dict:
    """The shape each input of `got` must have for `model` (None: any size on that axis), a variant's own inputs
    (`model.shapes_extra`: Wan Animate's, Z-Image Omni's) with its family's."""
    extra = getattr(model, "shapes_extra", None)
    return {**_family_shapes(model, got), **(extra(got) if extra is not None else {})}


def _family_shapes(model, got) -> dict:
    from .inputs import names

    if hasattr(model, "step_shapes"):  # a self-described family (engine.denoise.SELF_DESCRIBED)
        return model.step_shapes(got)
    if getattr(model, "family", "") == "text":
        return {"input_ids": (None, None)}
    if getattr(model, "family", "") in ("qwen_image", "nextdit", "auraflow"):  # a latent, its time, its text
        x, t, text = names(model)
        out = {x: (None, model.in_channels, None, None), t: (None,), text: (None, None, model.context_dim)}
        if "ref_latents" in got:  # Qwen-Image-Edit's reference image
            out["ref_latents"] = out[x]
        if getattr(model, "layered", False):  # Qwen-Image-Layered: [B, 16, layers + 1, h, w]
            out[x] = (None, model.in_channels, None, None, None)
        if "cap_mask" in got:  # Lumina 2's caption mask: one value per text token
            out["cap_mask"] = (None, got[text].shape[1] if got[text].dim() == 3 else None)
        return out
    if getattr(model, "family", "") == "qwen_image21":  # its optional inputs: the model's shapes_extra
        return {
            "x": (None, model.in_channels, None, None),
            "timesteps": (None,),
            "context": (None, None, model.context_dim),
        }
    if getattr(model, "family", "") == "mmdit":
        return {
            "x": (None, model.in_channels, None, None),
            "t": (None,),
            "y": (None, model.pooled_dim),
            "context": (None, None, model.context_dim),
        }
    if getattr(model, "family", "") == "hunyuan_video":
        out = {
            "x": (None, model.in_channels, None, None, None),
            "t": (None,),
            "text_states": (None, None, model.context_dim),
            "text_states_2": (None, model.vec_dim),
        }
        if model.guidance_in is not None:
            out["guidance"] = (None,)
        if "text_mask" in got:
            out["text_mask"] = (None, got["text_states"].shape[1] if got["text_states"].dim() == 3 else None)
        if "guiding_frame_index" in got:
            out["guiding_frame_index"] = (None,)
        return _framepack_shapes(model, got, out)
    if getattr(model, "family", "") == "pixart":
        out = {
            "x": (None, model.in_channels, None, None),
            "timestep": (None,),
            "y": (None, None, model.context_dim),
        }
        if "mask" in got:
            out["mask"] = (None, got["y"].shape[1] if got["y"].dim() == 3 else None)
        out.update({n: (None, s) for n, s in (("img_hw", 2), ("aspect_ratio", 1)) if n in got})
        return out
    if getattr(model, "family", "") == "stable_cascade":
        return model.shapes(got)
    if getattr(model, "family", "") == "mochi":
        out = {
            "x": (None, model.in_channels, None, None, None),
            "sigma": (None,),
            "y_feat": (None, None, model.context_dim),
        }
        if "y_mask" in got:
            out["y_mask"] = (None, got["y_feat"].shape[1] if got["y_feat"].dim() == 3 else None)
        return out
    if getattr(model, "family", "") == "hunyuan_dit":  # the text lengths are the file's (padding, pooler)
        clip, t5 = (None, model.clip_tokens, model.clip_dim), (None, model.t5_tokens, model.t5_dim)
        out = {"x": (None, model.in_channels, None, None), "t": (None,), "encoder_hidden_states": clip,
               "encoder_hidden_states_t5": t5}  # fmt: skip
        out.update({n: s for n, s in (("text_embedding_mask", clip[:2]), ("text_embedding_mask_t5", t5[:2]),
                                      ("image_meta_size", (None, 6)), ("style", (None,))) if n in got})  # fmt: skip
        return out
    if getattr(model, "family", "") == "sana":
        out = {
            "x": (None, model.in_channels, None, None),
            "timesteps": (None,),
            "context": (None, None, model.context_dim),
        }
        if "context_mask" in got:
            out["context_mask"] = (None, got["context"].shape[1] if got["context"].dim() == 3 else None)
        if model.guidance is not None:  # SANA-Sprint
            out["guidance"] = (None,)
        return out
    if getattr(model, "family", "") in ("hunyuan_video15", "hunyuan_image21"):
        return _hunyuan15_shapes(model, got)
    if getattr(model, "family", "") == "minimax_h3":
        from .minimax_h3 import input_shapes as minimax_shapes

        return minimax_shapes(model, got)
    if getattr(model, "family", "") == "flux3":
        from .flux3 import input_shapes

        return input_shapes(model, got)
    if getattr(model, "family", "") == "hidream":
        out = {"hidden_states": (None, model.in_channels, None, None), "timesteps": (None,),
               "encoder_hidden_states_t5": (None, None, model.t5_dim),
               "encoder_hidden_states_llama3": (model.llama_layers, None, None, model.llama_dim),
               "pooled_embeds": (None, model.pooled_dim)}  # fmt: skip
        if "max_seq" in got:
            out["max_seq"] = (None,)
        return out
    if getattr(model, "family", "") == "ltxv":
        return _ltxv_shapes(model, got)
    if getattr(model, "family", "") == "ltx2":
        return _ltx2_shapes(model, got)
    if getattr(model, "family", "") == "cosmos":
        return _cosmos_shapes(model, got)
    if getattr(model, "family", "") == "krea2":
        out = {"x": (None, model.in_channels, None, None), "timesteps": (None,),
               "context": (None, None, model.text_layers, model.context_dim)}  # fmt: skip
        if "context_mask" in got:
            out["context_mask"] = (None, got["context"].shape[1] if got["context"].dim() == 4 else None)
        return out
    if getattr(model, "family", "") == "wan_animate2":
        return model.family_shapes(got)
    if getattr(model, "family", "") == "wan":
        out = {
            "x": (None, model.in_channels, None, None, None),
            "t": (None,),
            "context": (None, None, model.context_dim),
        }
        if model.image_dim:
            out["clip_fea"] = (None, model.image_tokens, model.image_dim)
        if model.vace_channels:  # the control video: the latents' frames and size
            fhw = tuple(got["x"].shape[2:]) if got["x"].dim() == 5 else (None, None, None)
            out["vace_context"] = (None, model.vace_channels, *fhw)
            if "vace_context_scale" in got:
                out["vace_context_scale"] = (None,)
        return out
    if hasattr(model, "model_channels"):
        out = {
            "x": (None, model.in_channels, None, None),
            "timesteps": (None,),
            "context": (None, None, model.context_dim),
        }
        if model.adm_channels:
            out["y"] = (None, model.adm_channels)
        return out
    n_img = got["img"].shape[1] if got["img"].dim() == 3 else None
    n_txt = got["txt"].shape[1] if got["txt"].dim() == 3 else None
    out = {
        "img": (None, None, model.in_channels),
        "img_ids": (None, n_img, axes_of(model)),
        "txt": (None, None, model.context_dim),
        "txt_ids": (None, n_txt, axes_of(model)),
        "timesteps": (None,),
    }
    if model.vec_dim:
        out["y"] = (None, model.vec_dim)
    if model.guidance_in is not None:
        out["guidance"] = (None,)
    return out


def _hunyuan15_shapes(model, got) -> dict:
    def tokens(name: str):
        return got[name].shape[1] if name in got and got[name].dim() == 3 else None

    x = (None, model.in_channels, None, None) + ((None,) if model.family == "hunyuan_video15" else ())
    out = {"x": x, "t": (None,), "text_states": (None, None, model.context_dim)}
    if getattr(model, "guidance_in", None) is not None:
        out["guidance"] = (None,)
    if "text_mask" in got:
        out["text_mask"] = (None, tokens("text_states"))
    if "byt5_text_states" in got:
        out["byt5_text_states"] = (None, None, model.byt5_dim)
        if "byt5_text_mask" in got:
            out["byt5_text_mask"] = (None, tokens("byt5_text_states"))
    if "vision_states" in got and model.family == "hunyuan_video15":
        out["vision_states"] = (None, None, model.image_dim)
    if "timestep_r" in got:
        out["timestep_r"] = (None,)
    return out


def _ltxv_shapes(model, got) -> dict:
    x = got["x"]
    tokens = x.shape[2] * x.shape[3] * x.shape[4] if x.dim() == 5 else None
    t = got["timestep"]
    out = {"x": (None, model.in_channels, None, None, None), "timestep": (None,) if t.dim() == 1 else (None, tokens),
           "context": (None, None, model.context_dim)}  # fmt: skip
    if "attention_mask" in got:
        out["attention_mask"] = (None, got["context"].shape[1] if got["context"].dim() == 3 else None)
    if "frame_rate" in got:
        out["frame_rate"] = (None,)
    return out


def _ltx2_shapes(model, got) -> dict:
    """LTX-2's two streams: each latent, its timesteps (one per item or per token), its text (and mask)."""
    x, a = got["video_latent"], got["audio_latent"]
    tokens = x.shape[2] * x.shape[3] * x.shape[4] if x.dim() == 5 else None
    audio = a.shape[1] if a.dim() == 3 else None
    out = {"video_latent": (None, model.in_channels, None, None, None), "audio_latent": (None, None, model.audio_channels),
           "video_context": (None, None, model.context_dim), "audio_context": (None, None, model.audio_context_dim)}  # fmt: skip
    for name, n in (("video_timesteps", tokens), ("audio_timesteps", audio)):
        out[name] = (None,) if got[name].dim() == 1 else (None, n)
    for name, ctx in (("video_context_mask", "video_context"), ("audio_context_mask", "audio_context")):
        if name in got:
            out[name] = (None, got[ctx].shape[1] if got[ctx].dim() == 3 else None)
    for name in ("video_sigma", "audio_sigma", "fps"):
        if name in got:
            out[name] = (None,)
    if "video_keyframes_mask" in got:
        out["video_keyframes_mask"] = (None, tokens)
    return out


def _cosmos_shapes(model, got) -> dict:
    x = got["x"]
    fhw = tuple(x.shape[2:]) if x.dim() == 5 else (None, None, None)
    t = got["timesteps"]
    out = {"x": (None, model.in_channels, None, None, None), "timesteps": (None,) if t.dim() == 1 else (None, fhw[0]),
           "context": (None, None, model.context_dim)}  # fmt: skip
    if "condition_mask" in got:
        out["condition_mask"] = (None, 1, *fhw)
    if "fps" in got:
        out["fps"] = (None,)
    if "t5xxl_ids" in got:
        ids = got["t5xxl_ids"]
        out["t5xxl_ids"] = (None, None)
        if "t5xxl_weights" in got:
            out["t5xxl_weights"] = (None, ids.shape[1] if ids.dim() == 2 else None)
    return out


def _framepack_shapes(model, got, out: dict) -> dict:
    """FramePack's image states and history latents (each with its [B, frames] indices)."""
    if "image_embeddings" in got and getattr(model, "image_proj", None) is not None:
        from .common import wshape

        out["image_embeddings"] = (None, None, wshape(model.image_proj[0])[1])
    c = model.in_channels
    for lat, idx in (("x", "latent_indices"), ("clean_latents", "clean_latent_indices"),
                     ("clean_latents_2x", "clean_latent_2x_indices"), ("clean_latents_4x", "clean_latent_4x_indices")):  # fmt: skip
        if lat != "x" and lat in got:
            out[lat] = (None, c, None, None, None)
        if idx in got:
            t = got.get(lat)
            out[idx] = (None, t.shape[2] if t is not None and t.dim() == 5 else None)
    return out
