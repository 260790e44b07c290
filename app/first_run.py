"""First run: offer the model libraries of the user's other tools (engine.discover), asking before anything
is scanned, or the demo library when none is found; the answer is remembered in the app's settings and
the question is never asked again unless `reset_first_run` clears it (or the settings file is removed).

Hook (main window, once it is shown, when it starts with no library folders):

    from app.first_run import maybe_first_run
    paths = maybe_first_run(window, app_settings.settings())
    if paths:
        window.add_paths([str(p) for p in paths])   # persisted as library folders, scanned as usual

`maybe_first_run` returns None when the question was already answered (or library folders are already
saved), else the chosen folders (an empty list when the user declined).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from engine.discover import Install, find_installs
from engine.formatting import human_bytes

KEY_CHOICE = "first_run/choice"  # "scan" | "demo" | "none"
KEY_PATHS = "first_run/paths"
KEY_FOLDERS = "library/folders"  # the window's saved library folders (app.settings)


def demo_dir() -> Path:
    """Where the demo library is written: the user data folder (platformdirs; XDG_DATA_HOME on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("loadout", appauthor=False)) / "demo-library"


def _write_demo(path: Path) -> None:
    from engine.catalog.demo import write_demo

    write_demo(path)


class FirstRunDialog(QDialog):
    """ "Scan these folders?" with one checkbox per install found, or the demo library when none was."""

    def __init__(
        self,
        installs: list[Install],
        parent: QWidget | None = None,
        *,
        demo_path: Path | None = None,
        demo_writer: Callable[[Path], None] = _write_demo,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Welcome to Loadout")
        self.setMinimumWidth(620)
        self.installs = list(installs)
        self.demo_path = demo_path or demo_dir()
        self._demo_writer = demo_writer
        self.choice = "none"
        self.error: str | None = None
        self.boxes: list[QCheckBox] = []
        lay = QVBoxLayout(self)
        self.message = QLabel(wordWrap=True)
        lay.addWidget(self.message)
        self.buttons = QDialogButtonBox()
        if self.installs:
            self._build_installs(lay)
        else:
            self._build_demo()
        self.status = QLabel(wordWrap=True)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.buttons.rejected.connect(self.reject)

    def _build_installs(self, lay: QVBoxLayout) -> None:
        self.message.setText(
            "Loadout found the model libraries of these tools. Scan these folders? Loadout only reads the "
            "files' headers; it never changes them. You can add or remove folders later in Settings."
        )
        inner = QWidget()
        col = QVBoxLayout(inner)
        metrics = self.fontMetrics()
        for inst in self.installs:
            files = f"{inst.files} model file" + ("" if inst.files == 1 else "s")
            root = metrics.elidedText(inst.root, Qt.TextElideMode.ElideMiddle, 520)
            box = QCheckBox(f"{inst.label} · {files} · {human_bytes(inst.bytes)}\n{root}")
            box.setChecked(True)
            box.setToolTip(
                inst.root
                + "\nFolders: "
                + ", ".join(inst.scan_paths)
                + "\nFound by: "
                + ", ".join(os.path.basename(e) for e in inst.evidence)
            )
            box.toggled.connect(self._update_accept)
            col.addWidget(box)
            self.boxes.append(box)
        col.addStretch(1)
        area = QScrollArea(widgetResizable=True)
        area.setWidget(inner)
        area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        area.setMinimumHeight(min(320, 48 * len(self.installs) + 16))
        area.setMaximumHeight(320)
        lay.addWidget(area)
        self.accept_button = QPushButton("Scan selected")
        self.buttons.addButton(self.accept_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(QPushButton("Not now"), QDialogButtonBox.ButtonRole.RejectRole)
        self.accept_button.clicked.connect(self._accept_scan)

    def _build_demo(self) -> None:
        self.message.setText(
            "No ComfyUI, Forge/A1111, InvokeAI, Stability Matrix or SwarmUI library was found. Open a small "
            "demo library to see every panel working? Its big models are header-only sparse files (a few MB "
            f"on disk), written to {self.demo_path}. You can add your own folders at any time."
        )
        self.accept_button = QPushButton("Open the demo library")
        self.buttons.addButton(self.accept_button, QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.addButton(QPushButton("Start empty"), QDialogButtonBox.ButtonRole.RejectRole)
        self.accept_button.clicked.connect(self._accept_demo)

    def _update_accept(self) -> None:
        self.accept_button.setEnabled(any(b.isChecked() for b in self.boxes))

    def selected(self) -> list[Install]:
        return [i for i, b in zip(self.installs, self.boxes, strict=True) if b.isChecked()]

    def chosen_paths(self) -> list[Path]:
        """The folders to scan for the user's answer (empty when declined)."""
        if self.choice == "scan":
            seen: list[Path] = []
            for inst in self.selected():
                seen += [Path(p) for p in inst.scan_paths if Path(p) not in seen]
            return seen
        if self.choice == "demo":
            return [self.demo_path]
        return []

    def _accept_scan(self) -> None:
        if self.selected():
            self.choice = "scan"
            self.accept()

    def _accept_demo(self) -> None:
        """Write the demo library in a worker thread (it imports torch for its small dense files) while the
        dialog stays responsive, then accept; an existing demo library of this version is reused (an older one is written again)."""
        from engine.catalog.demo import demo_is_current

        if demo_is_current(self.demo_path):
            self.choice = "demo"
            self.accept()
            return
        for b in self.buttons.buttons():
            b.setEnabled(False)
        self.status.setText(f"Writing the demo library to {self.demo_path}…")
        result: dict[str, BaseException | None] = {}

        def work() -> None:
            try:
                self._demo_writer(self.demo_path)
                result["error"] = None
            except BaseException as e:  # reported in the dialog, never lost in the thread
                result["error"] = e

        thread = threading.Thread(target=work, name="loadout-demo", daemon=True)
        thread.start()
        timer = QTimer(self)
        timer.setInterval(50)

        def poll() -> None:
            if thread.is_alive():
                return
            timer.stop()
            err = result.get("error")
            if err is None:
                self.choice = "demo"
                self.accept()
            else:
                self.error = str(err)
                self.status.setText(f"Could not write the demo library: {err}")
                for b in self.buttons.buttons():
                    b.setEnabled(True)

        timer.timeout.connect(poll)
        timer.start()


def first_run_done(settings: QSettings) -> bool:
    return settings.value(KEY_CHOICE) is not None


def reset_first_run(settings: QSettings) -> None:
    """Ask again at the next start (a Settings button or `--first-run` can call this)."""
    settings.remove("first_run")
    settings.sync()


def remember(settings: QSettings, choice: str, paths: list[Path]) -> None:
    settings.setValue(KEY_CHOICE, choice)
    settings.setValue(KEY_PATHS, [str(p) for p in paths])
    settings.sync()


def maybe_first_run(
    parent: QWidget | None,
    settings: QSettings,
    *,
    find: Callable[[], list[Install]] = find_installs,
    demo_path: Path | None = None,
) -> list[Path] | None:
    """On the first start, ask (modal) which found libraries to scan, or offer the demo; remember the
    answer. None when already answered or when library folders are already saved (an existing user)."""
    if first_run_done(settings):
        return None
    saved = settings.value(KEY_FOLDERS, [])
    if saved:
        remember(settings, "none", [])
        return None
    dlg = FirstRunDialog(find(), parent, demo_path=demo_path)
    dlg.setWindowModality(Qt.WindowModality.ApplicationModal)
    try:
        dlg.exec()
        paths = dlg.chosen_paths()
        remember(settings, dlg.choice, paths)
        return paths
    finally:
        dlg.deleteLater()
