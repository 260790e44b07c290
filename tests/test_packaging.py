"""Packaging files (not the slow PyInstaller build itself, which is `make package`): the Linux desktop entry
and MIME types, the per-user install script, the spec's hidden imports, excludes and macOS document types,
and the Windows registry notes — all naming the same four suffixes."""

from __future__ import annotations

import ast
import configparser
import fnmatch
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "packaging"
DESKTOP = PKG / "linux" / "io.github.loadout.Loadout.desktop"
MIME = PKG / "linux" / "loadout-mime.xml"
SPEC = PKG / "loadout.spec"
SUFFIXES = {"safetensors", "sft", "ckpt", "latent"}
NS = {"m": "http://www.freedesktop.org/standards/shared-mime-info"}


def _desktop_entry(path: Path) -> configparser.SectionProxy:
    cp = configparser.ConfigParser(interpolation=None, strict=True)
    cp.optionxform = str
    cp.read(path, encoding="utf-8")
    return cp["Desktop Entry"]


def _mime_globs() -> dict[str, set[str]]:
    root = ET.parse(MIME).getroot()
    return {
        t.get("type"): {g.get("pattern") for g in t.findall("m:glob", NS)}
        for t in root.findall("m:mime-type", NS)
    }


def test_desktop_file_validates():
    if not shutil.which("desktop-file-validate"):
        pytest.skip("desktop-file-validate not installed (apt-get install desktop-file-utils)")
    r = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


def test_mime_xml_covers_every_suffix_and_matches_the_desktop_entry():
    globs = _mime_globs()
    assert {p.removeprefix("*.") for ps in globs.values() for p in ps} == SUFFIXES
    entry = _desktop_entry(DESKTOP)
    assert set(filter(None, entry["MimeType"].split(";"))) == set(globs)
    assert entry["Exec"].startswith("loadout ") and entry["Exec"].endswith("%F")  # several files per launch
    assert entry["Icon"] == "loadout"


def _spec_tree() -> ast.Module:
    return ast.parse(SPEC.read_text(encoding="utf-8"), filename=str(SPEC))


def _spec_list(name: str) -> list:
    for node in ast.walk(_spec_tree()):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not assigned in the spec")


def test_spec_compiles_and_collects_engine_and_app():
    tree = _spec_tree()
    compile(tree, str(SPEC), "exec")
    calls = {
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "collect_submodules"
    }
    # engine.cli finds its sub-commands with pkgutil: PyInstaller must be told to include them all.
    assert calls == {"collect_submodules('engine')", "collect_submodules('app')"}
    analysis = next(
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Analysis"
    )
    kw = {k.arg: ast.unparse(k.value) for k in analysis.keywords}
    assert kw["hiddenimports"] == "hidden" and kw["excludes"] == "EXCLUDES"
    assert "resources" in kw["datas"]


def _top_level_imports(folder: Path) -> set[str]:
    names = set()
    for py in folder.rglob("*.py"):
        for n in ast.walk(ast.parse(py.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Import):
                names |= {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names.add(n.module.split(".")[0])
    return names


def test_excluded_packages_are_not_used_by_the_app():
    """Excluding a package the code imports would break the built app only at run time."""
    excludes = {e for e in _spec_list("EXCLUDES") if "." not in e}
    used = _top_level_imports(ROOT / "engine") | _top_level_imports(ROOT / "app")
    assert excludes & used == set()
    assert {"diffusers", "hypothesis", "pytest"} <= excludes and "transformers" not in excludes


def test_no_fixture_generator_ships():
    """The test-fixture generators live in tests/support/synth: the engine and the app hold no such
    package (collect_submodules('engine') would bundle it), import none (checked above, with `tests`
    among the excludes), and the spec names none."""
    product = [
        p for top in ("engine", "app") for p in (ROOT / top).rglob("*") if "__pycache__" not in p.parts
    ]
    assert [p for p in product if p.stem in ("synth", "fixtures") or "synth" in p.parts] == []
    spec = SPEC.read_text(encoding="utf-8")
    assert "tests" in _spec_list("EXCLUDES") and "engine.synth" not in spec and "engine/synth" not in spec
    assert (ROOT / "tests" / "support" / "synth" / "__init__.py").is_file()


def _package_data() -> dict[str, list[str]]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return doc["tool"]["setuptools"].get("package-data", {})


def test_engine_data_files_ship_with_pip_and_pyinstaller():
    """A data file the engine reads (the demo library's layouts) is package data for pip and is collected
    by the spec, or the installed and the bundled app would miss it at run time."""
    data = [
        p
        for p in (ROOT / "engine").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert any(p.name == "demo_layouts.json.gz" for p in data)
    globs = _package_data()
    for p in data:
        pkg = ".".join(p.parent.relative_to(ROOT).parts)
        assert any(fnmatch.fnmatch(p.name, g) for g in globs.get(pkg, []) + globs.get("*", [])), p
    analysis = next(
        n
        for n in ast.walk(_spec_tree())
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Analysis"
    )
    datas = next(ast.unparse(k.value) for k in analysis.keywords if k.arg == "datas")
    assert "collect_data_files('engine')" in datas


def test_macos_document_types_cover_the_same_suffixes():
    exts = set()
    for node in ast.walk(_spec_tree()):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "CFBundleTypeExtensions":
                    exts |= set(ast.literal_eval(v))
    assert exts == SUFFIXES


def test_windows_registry_notes_cover_the_same_suffixes():
    text = (PKG / "windows" / "associations.reg").read_text(encoding="utf-8")
    assert text.startswith("Windows Registry Editor Version 5.00")
    keys = {line.strip("[]") for line in text.splitlines() if line.startswith("[")}
    assert {k.split("\\")[3].lstrip(".") for k in keys if k.endswith("OpenWithProgids")} == SUFFIXES
    # The windowed executable the spec builds on Windows is the one the association starts.
    assert "Loadout.exe" in text
    assert 'name="Loadout", console=False' in SPEC.read_text(encoding="utf-8")


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG desktop install is for Linux")
def test_install_script_installs_and_uninstalls_in_a_temporary_xdg_home(tmp_path):
    exe = Path(sys.executable).with_name("loadout")
    if not exe.exists():
        pytest.skip(f"no loadout script beside {sys.executable} (pip install -e . makes it)")
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env["HOME"] = str(tmp_path / "home")
    script = PKG / "linux" / "install-desktop.sh"
    r = subprocess.run(["bash", str(script), "--exec", str(exe)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    data = tmp_path / "data"
    desktop = data / "applications" / DESKTOP.name
    assert _desktop_entry(desktop)["Exec"] == f'"{exe}" %F'
    if shutil.which("desktop-file-validate"):
        v = subprocess.run(["desktop-file-validate", str(desktop)], capture_output=True, text=True)
        assert v.returncode == 0, v.stdout
    assert (data / "mime" / "packages" / "loadout-mime.xml").read_bytes() == MIME.read_bytes()
    for size in (16, 24, 32, 48, 64, 128, 256):
        assert (data / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "loadout.png").is_file()
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / "loadout.svg").is_file()
    globs2 = data / "mime" / "globs2"
    if shutil.which("update-mime-database"):
        assert "application/x-safetensors:*.safetensors" in globs2.read_text()
        assert "application/x-comfyui-latent:*.latent" in globs2.read_text()

    r = subprocess.run(["bash", str(script), "--uninstall"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    left = [p.relative_to(data) for p in data.rglob("*") if p.is_file() and "loadout" in p.name.lower()]
    assert left == []
    assert not desktop.exists()
    if globs2.exists():
        assert "safetensors" not in globs2.read_text()


def test_install_script_refuses_a_missing_executable(tmp_path):
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    r = subprocess.run(
        ["bash", str(PKG / "linux" / "install-desktop.sh"), "--exec", str(tmp_path / "nope")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert r.returncode == 1 and "no loadout executable" in r.stderr
    assert not (tmp_path / "data" / "applications").exists()


def test_spec_trims_torch_test_programs_but_keeps_the_shm_manager():
    fn = next(n for n in _spec_tree().body if isinstance(n, ast.FunctionDef) and n.name == "keep")
    ns: dict = {"Path": Path}
    exec(compile(ast.Module([fn], []), str(SPEC), "exec"), ns)
    keep = ns["keep"]
    assert (
        not keep("torch/test/atest") and not keep("torch/bin/protoc") and not keep("torch\\bin\\test_jit.exe")
    )
    assert keep("torch/bin/torch_shm_manager") and keep("torch/bin/torch_shm_manager.exe")
    assert (
        keep("torch/lib/libtorch_cpu.so")
        and keep("torch/testing/_comparison.py")
        and keep("resources/loadout.svg")
    )
