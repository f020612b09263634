"""Notebook set-up shared by every ablation notebook."""

from __future__ import annotations

import logging
import warnings


def quiet() -> None:
    """Keep notebook output to what a reader needs: no per-row progress bars from `datasets`, no library
    deprecation chatter (TRL 1.16 on transformers 5.24 warns about gradient checkpointing names on every run)."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="IProgress not found")
    logging.getLogger("transformers").setLevel(logging.ERROR)
