"""`loadout [PATH...]`: the QApplication, the exception hooks and the main window. The window is shown
and painted before the engine thread starts importing torch."""

from __future__ import annotations

import argparse
import logging
import signal

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.excepthooks import install_excepthooks
from app.main_window import MainWindow, app_icon
from engine.devices import add_device_arguments, options_from_args


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="loadout", description="Open the Loadout window.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="model files or folders for the library")
    add_device_arguments(p)
    return p.parse_args(argv)


def _options(args):
    """The command line's device flags, with Settings' saved choices for flags not given."""
    from dataclasses import replace

    from app.settings_dialog import saved_device_options
    from engine.devices import DeviceOptions

    opts = options_from_args(args)
    default = DeviceOptions()
    saved = {k: v for k, v in saved_device_options().items() if getattr(opts, k) == getattr(default, k)}
    try:
        return replace(opts, **saved) if saved else opts
    except ValueError:  # a saved combination the device rules refuse: the command line alone
        return opts


def create_window(argv: list[str], *, first_run: bool = False) -> MainWindow:
    """Make (or reuse) the QApplication, show the window and paint it; the engine starts from the
    event loop right after, so the first frame never waits for torch."""
    args = parse_args(argv)
    # argv[0] "loadout" names the X11 WM_CLASS / Wayland app id (not "launch.py").
    app = QApplication.instance() or QApplication(["loadout"])
    app.setApplicationName("Loadout")
    app.setDesktopFileName("loadout")
    app.setWindowIcon(app_icon())
    window = MainWindow(_options(args), args.paths)
    window.offer_first_run = first_run
    install_excepthooks(window.reporter)
    window.show()
    app.processEvents()  # first paint now, before torch
    QTimer.singleShot(0, window.start)
    return window


def run(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    try:
        window = create_window(argv, first_run=True)
    except SystemExit as e:  # argparse: --help or a usage error
        return int(e.code or 0)
    app = QApplication.instance()
    app.aboutToQuit.connect(window.client.shutdown)  # also when quit without closing the window
    # Ctrl+C in the terminal closes the window cleanly; the sampling timer lets Python see the signal.
    signal.signal(signal.SIGINT, lambda *_: window.close())
    return app.exec()
