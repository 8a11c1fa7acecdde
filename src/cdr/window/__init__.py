"""The window step: decompose, pack, prompt, write, verify and measure each window.

`loop` holds `Generator` and its one window step; the other modules are its parts — the
envelope (`envelope`, `fit`), the prompt and headers, decomposition and Stage 8 (`dpe`), the
opt-in guards (`memory`, `repeat_guard`, `stale`), the assembled document and its length.
"""
