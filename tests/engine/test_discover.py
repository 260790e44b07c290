"""engine.discover on fake installs laid out as the real tools lay them out, under a temporary home."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.discover import count_models, find_installs, identify


def _file(path: Path, size: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        if size:
            f.truncate(size)  # sparse: the size is what stat reports, no data written
    return path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(h / ".config"))
    monkeypatch.delenv("INVOKEAI_ROOT", raising=False)
    monkeypatch.delenv("APPDATA", raising=False)
    return h


def comfy_git(root: Path) -> Path:
    _file(root / "main.py")
    _file(root / "folder_paths.py")
    _file(root / "comfy" / "sd.py")
    _file(root / "models" / "checkpoints" / "sdxl.safetensors", 6_000_000)
    _file(root / "models" / "checkpoints" / "put_checkpoints_here")
    _file(root / "models" / "loras" / "styles" / "a.safetensors", 1000)
    _file(root / "models" / "vae" / "ae.sft", 300)
    (root / "models" / "controlnet").mkdir(parents=True)
    return root


def test_comfyui_git_install_with_extra_model_paths(home):
    root = comfy_git(home / "src" / "ComfyUI")
    a1111_models = home / "shared" / "sd-webui" / "models"
    _file(a1111_models / "Stable-diffusion" / "v15.ckpt", 4000)
    _file(a1111_models / "Lora" / "l.safetensors", 50)
    (root / "extra_model_paths.yaml").write_text(
        f"a111:\n  base_path: {home / 'shared' / 'sd-webui'}\n  checkpoints: models/Stable-diffusion\n"
        "  loras: |\n    models/Lora\n    models/LyCORIS\n"
    )
    (found,) = find_installs(home, system=False)
    assert found.app == "comfyui" and found.root == str(root)
    by = {os.path.relpath(f.path, home): (f.kind, f.files, f.bytes) for f in found.folders}
    assert by == {
        "src/ComfyUI/models/checkpoints": ("checkpoint", 1, 6_000_000),
        "src/ComfyUI/models/loras": ("lora", 1, 1000),
        "src/ComfyUI/models/vae": ("vae", 1, 300),
        "shared/sd-webui/models/Stable-diffusion": ("checkpoint", 1, 4000),
        "shared/sd-webui/models/Lora": ("lora", 1, 50),
    }
    assert found.files == 5 and found.bytes == 6_005_350
    assert str(root / "extra_model_paths.yaml") in found.evidence and str(root / "main.py") in found.evidence
    # The scan is given the models folder and the yaml's folders that exist (LyCORIS does not).
    assert found.scan_paths == (
        str(root / "models"), str(a1111_models / "Stable-diffusion"), str(a1111_models / "Lora"),
    )  # fmt: skip
    json.dumps(found.to_json())


def test_portable_comfyui_and_forge_side_by_side(home):
    portable = home / "AI" / "ComfyUI_windows_portable"
    (portable / "python_embeded").mkdir(parents=True)
    comfy_git(portable / "ComfyUI")
    forge = home / "Desktop" / "webui_forge" / "webui"
    _file(forge / "webui.py")
    _file(forge / "launch.py")
    (forge / "modules_forge").mkdir(parents=True)
    _file(forge / "models" / "Stable-diffusion" / "big.safetensors", 7_000_000)
    _file(forge / "embeddings" / "neg.pt", 10)
    found = find_installs(home, system=False)
    assert [(i.app, i.label) for i in found] == [("forge", "Forge"), ("comfyui", "ComfyUI (portable)")]
    assert found[0].scan_paths == (str(forge / "models"), str(forge / "embeddings"))
    assert {f.kind for f in found[0].folders} == {"checkpoint", "embedding"}


def test_a1111_needs_its_models_folder(home):
    d = home / "stable-diffusion-webui"
    _file(d / "webui.py")
    assert identify(str(d)) is None  # a webui.py alone is not evidence enough
    _file(d / "models" / "Stable-diffusion" / "x.safetensors", 5)
    inst = identify(str(d))
    assert inst.app == "a1111" and inst.label == "AUTOMATIC1111 WebUI"


def test_invokeai_root_from_env_with_models_dir(home, tmp_path, monkeypatch):
    root = tmp_path / "invoke-root"
    elsewhere = tmp_path / "bigdisk" / "invoke-models"
    _file(elsewhere / "sdxl" / "main" / "juggernaut.safetensors", 123)
    root.mkdir()
    (root / "invokeai.yaml").write_text(f"schema_version: 4.0.2\nmodels_dir: {elsewhere}\n")
    monkeypatch.setenv("INVOKEAI_ROOT", str(root))
    (found,) = find_installs(home, system=False)
    assert found.app == "invokeai" and found.root == str(root)
    assert found.scan_paths == (str(elsewhere),) and found.files == 1 and found.bytes == 123


def test_invokeai_default_root_in_home(home):
    root = home / "invokeai"
    _file(root / "invokeai.yaml").write_text("schema_version: 4.0.2\n")
    _file(root / "models" / "sd-1" / "lora" / "x.safetensors", 9)
    (found,) = find_installs(home, system=False)
    assert found.app == "invokeai" and found.scan_paths == (str(root / "models"),)


def test_comfyui_desktop_config_and_base_path(home):
    base = home / "Documents" / "ComfyUI"
    for d in ("user", "custom_nodes", ".venv"):
        (base / d).mkdir(parents=True)
    _file(base / "models" / "checkpoints" / "flux.safetensors", 2048)
    cfg = home / ".config" / "ComfyUI"
    cfg.mkdir(parents=True)
    (cfg / "extra_models_config.yaml").write_text(
        f"comfyui_desktop:\n  base_path: {base}\n  is_default: true\n  checkpoints: models/checkpoints/\n"
        "  loras: models/loras/\n"
    )
    (found,) = find_installs(home, system=False, platform="linux")
    assert found.app == "comfyui_desktop" and found.root == str(base)
    assert str(cfg / "extra_models_config.yaml") in found.evidence
    assert found.files == 1 and found.scan_paths == (str(base / "models" / "checkpoints"),)


def test_comfyui_desktop_base_without_config(home):
    base = home / "Documents" / "ComfyUI"
    for d in ("user", "custom_nodes"):
        (base / d).mkdir(parents=True)
    _file(base / "models" / "loras" / "l.safetensors", 7)
    (found,) = find_installs(home, system=False, platform="linux")
    assert found.app == "comfyui_desktop" and found.scan_paths == (str(base / "models"),)


def test_stability_matrix_and_swarmui(home):
    sm = home / "apps" / "StabilityMatrix" / "Data"
    (sm / "Packages" / "ComfyUI").mkdir(parents=True)
    _file(sm / "Models" / "StableDiffusion" / "m.safetensors", 100)
    _file(sm / "Models" / "Lora" / "l.safetensors", 10)
    sw = home / "src" / "SwarmUI"
    _file(sw / "launch-linux.sh")
    (sw / "src").mkdir(parents=True)
    _file(sw / "Models" / "Stable-Diffusion" / "x.safetensors", 55)
    found = {i.app: i for i in find_installs(home, system=False)}
    assert set(found) == {"stability_matrix", "swarmui"}
    assert found["stability_matrix"].root == str(sm) and found["stability_matrix"].files == 2
    assert found["swarmui"].scan_paths == (str(sw / "Models"),) and found["swarmui"].bytes == 55


def test_bounded_depth_and_skipped_folders(home):
    comfy_git(home / "a" / "b" / "c" / "d" / "ComfyUI")  # deeper than the search goes
    comfy_git(home / "node_modules" / "ComfyUI")  # in a folder never searched
    comfy_git(home / ".hidden" / "ComfyUI")
    assert find_installs(home, system=False) == []
    assert [i.app for i in find_installs(home, system=False, max_depth=5)] == ["comfyui"]


def test_same_install_through_a_symlink_once(home):
    root = comfy_git(home / "src" / "ComfyUI")
    (home / "git").mkdir()
    os.symlink(root, home / "git" / "ComfyUI")
    assert len(find_installs(home, system=False)) == 1


def test_bad_yaml_is_reported_not_fatal(home):
    root = comfy_git(home / "src" / "ComfyUI")
    (root / "extra_model_paths.yaml").write_text("a111:\n  base_path: [unclosed\n")
    (found,) = find_installs(home, system=False)
    assert found.files == 3 and "not valid YAML" in found.problems[0]


def test_count_models_ignores_other_files_and_hidden_folders(tmp_path):
    _file(tmp_path / "a.safetensors", 10)
    _file(tmp_path / "notes.txt", 99)
    _file(tmp_path / "sub" / "b.GGUF", 5)
    _file(tmp_path / ".cache" / "c.safetensors", 1000)
    f = count_models(str(tmp_path))
    assert (f.files, f.bytes, f.truncated) == (2, 15, False)


def test_libraries_cli_json(home, cli):
    comfy_git(home / "src" / "ComfyUI")
    r = cli("libraries", "--json", "--no-system", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    (inst,) = json.loads(r.stdout)
    assert inst["app"] == "comfyui" and inst["files"] == 3 and inst["bytes"] == 6_001_300
    r = cli("libraries", "--no-system", env={"HOME": str(home)})
    assert "ComfyUI" in r.stdout and "3 model files" in r.stdout
