"""Loadout's Qt GUI. Never imports torch at module level: the window appears before torch is loaded."""
