"""Imported once by the forkserver that starts ``klear_lib.experiment.run_jobs``' workers: the heavy imports that
every unit of work shares (torch, transformers with its trainer, generation and model classes, datasets, pandas,
accelerate, peft: ≈8 CPU-seconds a process), so that each worker is forked with them in place instead of paying
them again. Nothing here may read a per-run setting at import, since the forkserver outlives one ``run_jobs``:
TRL, which imports trackio with itself where it is installed (trackio reads ``TRACKIO_DIR`` once, at import), is
left to the worker (0.5 s on top of these). Importing must not start work: no thread pool, no CUDA (a forked child
of a process that used either can hang), which ``tests/test_experiment.py`` checks.
"""

import datasets  # noqa: F401
import pandas  # noqa: F401
import peft  # noqa: F401
import torch  # noqa: F401
import transformers.generation.utils  # noqa: F401
import transformers.trainer  # noqa: F401
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3ForCausalLM  # noqa: F401
