"""Notes users keep beside their models: Civitai's `.civitai.info` and A1111's `name.json`.

`.civitai.info` is a Civitai model-version record as written by the Civitai Helper extensions
(fields: `name` = version name, `model.name`, `model.type`, `baseModel`, `trainedWords`, `modelId`,
`id`, `description`, and `files[]` with `name`, `primary` and `hashes.SHA256`). A1111's own `name.json` (its "user metadata" editor) has `description`,
`sd version`, `activation text`, `preferred weight` and `notes`. Both are optional and often
hand-edited: a broken one is reported inside the notes, never fatal.
"""

from __future__ import annotations

import html
import json
import os
import re

MAX_NOTE_BYTES = 4 * 1024 * 1024  # a real .civitai.info is a few KB to a few hundred KB
_TAG = re.compile(r"<[^>]+>")


def _text(value, limit: int = 2000) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    plain = html.unescape(_TAG.sub(" ", value))  # Civitai descriptions are HTML
    plain = re.sub(r"\s+", " ", plain).strip()
    return plain[:limit] if plain else None


def _words(value) -> list[str]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        return []
    out = []
    for w in value:
        if isinstance(w, str):
            out += [p.strip() for p in w.split(",") if p.strip()]  # Civitai entries may hold several
    return out


def _civitai_sha256(d: dict, model_file: str | None) -> str | None:
    """The SHA-256 Civitai lists for this model file (`files[].hashes.SHA256`), lower-case hex."""
    files = [f for f in d.get("files") or [] if isinstance(f, dict) and isinstance(f.get("hashes"), dict)]
    named = [f for f in files if model_file and f.get("name") == model_file]
    primary = [f for f in files if f.get("primary")]
    for f in named or primary or files[:1]:
        h = f["hashes"].get("SHA256")
        if isinstance(h, str) and len(h) == 64:
            return h.lower()
    return None


def _civitai(d: dict, model_file: str | None = None) -> dict:
    model = d.get("model") if isinstance(d.get("model"), dict) else {}
    out = {
        "model_name": model.get("name") if isinstance(model.get("name"), str) else None,
        "version_name": d.get("name") if isinstance(d.get("name"), str) else None,
        "model_type": model.get("type") if isinstance(model.get("type"), str) else None,
        "base_model": d.get("baseModel") if isinstance(d.get("baseModel"), str) else None,
        "trained_words": _words(d.get("trainedWords")),
        "description": _text(d.get("description")) or _text(model.get("description")),
        "civitai_model_id": d.get("modelId") if isinstance(d.get("modelId"), int) else None,
        "civitai_version_id": d.get("id") if isinstance(d.get("id"), int) else None,
        "civitai_sha256": _civitai_sha256(d, model_file),
    }
    return {k: v for k, v in out.items() if v not in (None, [])}


def _a1111(d: dict) -> dict:
    out = {
        "description": _text(d.get("description")),
        "base_model": d.get("sd version")
        if isinstance(d.get("sd version"), str) and d.get("sd version")
        else None,
        "trained_words": _words(d.get("activation text")),
        "preferred_weight": d.get("preferred weight")
        if isinstance(d.get("preferred weight"), (int, float))
        else None,
        "notes": _text(d.get("notes")),
    }
    return {k: v for k, v in out.items() if v not in (None, [], 0)}


def read_notes(paths: tuple[str, ...] | list[str], model_file: str | None = None) -> dict | None:
    """Merge the useful fields of the note files found beside a model (civitai.info first wins).
    `model_file` (the model's file name) picks its entry among the files a Civitai version lists."""
    if not paths:
        return None
    merged: dict = {"sources": []}
    problems = []
    for p in paths:
        try:
            if os.path.getsize(p) > MAX_NOTE_BYTES:
                problems.append(f"{os.path.basename(p)}: larger than {MAX_NOTE_BYTES // 2**20} MiB, skipped")
                continue
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            problems.append(f"{os.path.basename(p)}: {getattr(e, 'strerror', None) or e}")
            continue
        if not isinstance(d, dict):
            problems.append(f"{os.path.basename(p)}: not a JSON object")
            continue
        fields = _civitai(d, model_file) if p.endswith(".civitai.info") else _a1111(d)
        merged["sources"].append(p)
        for k, v in fields.items():
            merged.setdefault(k, v)
    if problems:
        merged["problems"] = problems
    return merged
