"""Kernel autotuner and shape-screening service for LLM inference.

One module per pipeline stage (see DESIGN.md): harvest, device, bench, parity, budget, search,
rank, export, runtime; `cli` only parses arguments and calls them.
"""

__version__ = "0.1.0"
