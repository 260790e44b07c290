"""PyInstaller entry: the same dispatch as the installed `loadout` script (a sub-command runs the
CLI; nothing, or file paths from a double-click, opens the window)."""

import sys

from app.launch import main

if __name__ == "__main__":
    sys.exit(main())
