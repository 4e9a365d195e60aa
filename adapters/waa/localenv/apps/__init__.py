"""Simulated applications: Notepad (with its file dialogs), File Explorer and Settings."""
