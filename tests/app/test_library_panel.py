"""Library and Inspector as a user uses them: drop files, read rows, filter, sort, open with a file."""

from __future__ import annotations

import os

from app_test_support import drop
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.models.library_model import COLUMNS


def _row(w, path):
    m = w.library.model
    r = m.row_of(path)
    assert r is not None, f"{path} not in the library"
    return {c: m.index(r, i).data() for i, c in enumerate(COLUMNS)}


def _wait_rows(qtbot, w, n):
    qtbot.waitUntil(lambda: w.library.model.rowCount() >= n, timeout=30_000)


def test_dropped_header_faithful_checkpoints_show_their_architecture(qtbot, files):
    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    drop(w, [files["ckpt"], files["sdxl"]])
    _wait_rows(qtbot, w, 2)
    a, b = _row(w, files["ckpt"]), _row(w, files["sdxl"])
    assert (a["Kind"], a["Architecture"], a["Dtype"]) == ("checkpoint", "sd1", "F16")
    assert (b["Kind"], b["Architecture"]) == ("checkpoint", "sdxl")
    assert a["Size"].endswith("GiB") and a["Params"].endswith("B")
    # the dropped file is selected and inspected, with the evidence that decided
    qtbot.waitUntil(lambda: w.inspector.entry is not None, timeout=5000)
    text = w.inspector.text()
    assert os.path.basename(files["ckpt"]) in text and "Evidence" in text and "unet" in text
    w.close()


def test_open_with_a_file_selects_it_and_shows_its_inspector(qtbot, files):
    """`loadout FILE` and a double-click pass the path: the folder's other files do not steal focus."""
    w = MainWindow(paths=[files["dir"], files["lora"]], restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.inspector.entry is not None, timeout=30_000)
    assert w.library.current_entry().path == files["lora"]
    text = w.inspector.text()
    assert "kohya" in text and "sd1" in text  # LoRA facts
    assert "Training tags" in text  # kohya ss_tag_frequency as chips
    w.close()


def test_filter_by_text_kind_and_architecture_and_sort_by_size(qtbot, files):
    w = MainWindow(paths=[files["dir"]], restore_layout=False)
    qtbot.addWidget(w)
    _wait_rows(qtbot, w, 4)
    p = w.library.proxy
    total = p.rowCount()
    w.library.filter_edit.setText("sdxl")
    assert p.rowCount() == 1
    w.library.filter_edit.clear()
    w.library.kind_box.setCurrentIndex(w.library.kind_box.findData("lora"))
    assert p.rowCount() == 1 and p.index(0, 0).data() == "style.safetensors"
    w.library.kind_box.setCurrentIndex(0)
    w.library.arch_box.setCurrentIndex(w.library.arch_box.findData("sd1"))
    assert {p.index(r, 0).data() for r in range(p.rowCount())} == {
        "sd15_test.safetensors",
        "style.safetensors",
    }
    w.library.arch_box.setCurrentIndex(0)
    assert p.rowCount() == total
    w.library.view.sortByColumn(
        COLUMNS.index("Size"), __import__("PySide6.QtCore").QtCore.Qt.SortOrder.DescendingOrder
    )
    assert p.index(0, 0).data() == "sdxl_test.safetensors"  # 6.5 GiB, the biggest
    w.close()


def test_corrupt_file_and_a_non_model_get_clear_messages(qtbot, files):
    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    drop(w, [files["bad"]])
    qtbot.waitUntil(lambda: w.messages.shown, timeout=30_000)
    assert "broken.safetensors" in w.messages.text
    assert _row(w, files["bad"])["Kind"].endswith("(unreadable)")
    drop(w, [files["txt"]])
    qtbot.waitUntil(lambda: "notes.txt" in w.messages.text, timeout=30_000)
    assert "not a model file" in w.messages.text
    w.close()


def test_context_menu_copies_the_hash_once_hashed(qtbot, files):
    w = MainWindow(paths=[files["lora"]], restore_layout=False)
    qtbot.addWidget(w)
    qtbot.waitUntil(
        lambda: (
            bool(w.library.model.hashes)
            or bool(w.library.model.entries and w.library.model.entries[0].sha256)
        ),
        timeout=30_000,
    )
    e = w.library.model.entries[0]
    sha = w.library.model.sha256(e)
    assert len(sha) == 64
    qtbot.waitUntil(lambda: w.library.model.index(0, COLUMNS.index("Hash")).data() == sha[:10], timeout=5000)
    menu = w.library.context_menu(e)
    acts = {a.text(): a for a in menu.actions() if a.text()}
    assert acts["Add to LoRA stack"].isEnabled() and not acts["Load"].isEnabled()
    acts["Copy hash"].trigger()
    assert QApplication.clipboard().text() == sha
    acts["Add to LoRA stack"].trigger()
    assert [s.file for s in w.stack.stack()] == [files["lora"]]
    menu.close()
    w.close()


def test_dropped_folder_joins_the_saved_library(qtbot, files, tmp_path):
    from app import settings

    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    drop(w, [files["dir"]])
    assert settings.library_folders() == [files["dir"]]
    _wait_rows(qtbot, w, 4)
    w.close()


def test_a_real_lycoris_file_reads_as_a_user_would_type_its_tags(qtbot):
    """The real LoKr from LyCORIS: kohya escapes brackets in tags (`\\(umamusume\\)`) for A1111's prompt
    parser; the Inspector shows the words, chips don't break mid-tag, and an adapter's tensors are not
    listed as a model component called "other"."""
    from loadout_test_support import data_file

    path = str(data_file("weights/smart_falcon_8_lokr.safetensors"))
    w = MainWindow(paths=[path], restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.inspector.entry is not None, timeout=30_000)
    text = w.inspector.text()
    tags = text.split("Training tags", 1)[1].split("Metadata", 1)[0]  # the author's comment stays verbatim
    assert "smart falcon (umamusume)" in tags.replace("\u00a0", " ") and "\\(" not in tags
    assert "lokr" in text and "Components" not in text
    w.close()


def test_the_progress_bar_takes_byte_counts_past_32_bits(qtbot):
    """Hashing a 3.4 GB file reports bytes: QProgressBar's int range overflowed (a slot's exception)."""
    from app.widgets.library import LibraryPanel

    panel = LibraryPanel()
    qtbot.addWidget(panel)
    panel.set_progress("Hashing", 3_000_000_000, 6_000_000_000)
    assert panel.progress.value() * 2 == panel.progress.maximum()
    assert panel.progress.text() == "Hashing 50%"
    panel.set_progress("Scanning", 0, 0)
    assert panel.progress.maximum() == 0
