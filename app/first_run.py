"""First run: offer the model libraries of the user's other tools (engine.discover), asking before anything
is scanned, or the demo library when none is found; the answer is remembered in the app's settings and
the question is never asked again unless `reset_first_run` clears it (or the settings file is removed).

The window, shown with no library folders, starts a `FirstRun`: when `first_run_due`, it submits
FindLibraries (the search runs in the engine client's IO thread, never the GUI's), hands what was found to
`ask_first_run` and emits the chosen folders for the library (nothing when the user declined). The demo
library is written by a WriteDemo request, in the engine thread.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
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

from app import settings as app_settings
from engine.formatting import human_bytes
from engine.requests import FindLibraries, WriteDemo

if TYPE_CHECKING:
    from engine.discover import Install

KEY_CHOICE = "first_run/choice"  # "scan" | "demo" | "none"
KEY_PATHS = "first_run/paths"
KEY_FOLDERS = "library/folders"  # the window's saved library folders (app.settings)


def demo_dir() -> Path:
    """Where the demo library is written: the user data folder (platformdirs; XDG_DATA_HOME on Linux)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("loadout", appauthor=False)) / "demo-library"


class FirstRunDialog(QDialog):
    """ "Scan these folders?" with one checkbox per install found, or the demo library when none was
    (written through `client`, an app.bridge.EngineClient; only the demo needs one)."""

    def __init__(
        self,
        installs: list[Install],
        parent: QWidget | None = None,
        *,
        client=None,
        demo_path: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Welcome to Loadout")
        self.setMinimumWidth(620)
        self.installs = list(installs)
        self.demo_path = demo_path or demo_dir()
        self.client = client
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
        """Have the engine write the demo library (it imports torch for its small dense files) while the
        dialog stays responsive, then accept; an existing demo library of this version is reused (an
        older one is written again)."""
        from engine.catalog.demo import demo_is_current

        if demo_is_current(self.demo_path):
            self.choice = "demo"
            self.accept()
            return
        for b in self.buttons.buttons():
            b.setEnabled(False)
        self.status.setText(f"Writing the demo library to {self.demo_path}…")
        self.client.submit(WriteDemo(str(self.demo_path)), self._on_demo_written, self._on_demo_failed)

    def _on_demo_written(self, _files) -> None:
        self.choice = "demo"
        self.accept()

    def _on_demo_failed(self, info) -> None:
        self.error = info.message
        self.status.setText(f"Could not write the demo library: {info.message}")
        for b in self.buttons.buttons():
            b.setEnabled(True)


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


def first_run_due(settings: QSettings) -> bool:
    """Whether to ask: not answered yet and no library folders saved (an existing user is never asked,
    and that is remembered as the answer "none")."""
    if first_run_done(settings):
        return False
    if settings.value(KEY_FOLDERS, []):
        remember(settings, "none", [])
        return False
    return True


def ask_first_run(
    parent: QWidget | None,
    settings: QSettings,
    installs: list[Install],
    *,
    client=None,
    demo_path: Path | None = None,
) -> list[Path]:
    """Ask (modal) which of the found libraries to scan, or offer the demo; remember the answer and
    return the chosen folders (empty when declined)."""
    dlg = FirstRunDialog(installs, parent, client=client, demo_path=demo_path)
    dlg.setWindowModality(Qt.WindowModality.ApplicationModal)
    try:
        dlg.exec()
        paths = dlg.chosen_paths()
        remember(settings, dlg.choice, paths)
        return paths
    finally:
        dlg.deleteLater()


class FirstRun(QObject):
    """The first start's question, once the window is up: look for libraries off the GUI thread, ask."""

    chosen = Signal(list)  # the folders (str) the user chose, for the library
    demo_latent = Signal(str)  # the demo library's latent, for Decode

    def __init__(self, window: QWidget, client) -> None:
        super().__init__(window)
        self.window = window
        self.client = client

    def start(self) -> None:
        if first_run_due(app_settings.settings()):
            self.client.submit(FindLibraries(), self._on_found)

    def _on_found(self, installs) -> None:
        # The dialog runs its own event loop: not inside the client's delivery of this job's result.
        QTimer.singleShot(0, partial(self._ask, list(installs)))

    def _ask(self, installs: list[Install]) -> None:
        paths = ask_first_run(self.window, app_settings.settings(), installs, client=self.client)
        if paths:
            self.open_chosen(paths)

    def open_chosen(self, paths) -> None:
        """Hand the chosen folders to the library; opening the demo library also puts its latent in Decode
        (the VAE is chosen as the library fills), so the first Decode press shows a picture."""
        from engine.catalog.demo import DEMO_LATENT

        self.chosen.emit([str(p) for p in paths])
        latents = [os.path.join(p, DEMO_LATENT) for p in map(str, paths)]
        latent = next((p for p in latents if os.path.isfile(p)), None)
        if latent is not None:
            self.demo_latent.emit(latent)
