"""Presets per (algorithm, env): see :mod:`rlloop.presets`, which holds the files and the
format (kept there, torch-free, so ``rlloop presets`` starts fast)."""

from rlloop.presets import PresetFile, all_files, file_name, load_file, preset

__all__ = ["PresetFile", "all_files", "file_name", "load_file", "preset"]
