"""Experiment trackers (``report_to``: TensorBoard, trackio, wandb) for TRL's trainers, kept inside the run.

transformers' callbacks find their folders in environment variables (``TENSORBOARD_LOGGING_DIR``, ``WANDB_DIR``,
``TRACKIO_DIR``) and their names in the trainer's arguments (``run_name``; ``project`` for trackio,
``WANDB_PROJECT`` for wandb). ``tracking_env`` sets all of them from a ``klear_lib.experiment.UnitTracking`` while
a trainer is built and trains: the files land under ``<run dir>/tracking/``, the project is the notebook, the run is
the unit (``gppo/lr=0.0001/seed=0``). How this departs from transformers' defaults:

- Metric keys keep their own names. transformers' ``rewrite_logs`` prefixes every key but ``eval_*`` with
  ``train/``, so klear's held-out ``eval/avg_at_n`` became ``train/eval/avg_at_n``. While a trainer trains, a key
  that already names its namespace (it holds a ``/``: ``eval/avg_at_n``, ``actor/pg_loss``, ``clip_ratio/low_mean``)
  is left as it is; flat keys (``loss``, ``grad_norm``, ``reward``) get ``train/`` as before.
- TensorBoard also gets the resolved config as hparams (its HPARAMS tab), not only the arguments as text.
- trackio reads ``TRACKIO_DIR`` once, when it is first imported: the folder is set before any import (units run in
  fresh worker processes, and every unit of a run logs to the run's one trackio folder); a process that imported it
  for another folder is refused. wandb runs offline (files only) unless ``WANDB_MODE`` says otherwise, keeps its
  cache in the unit's folder, and its run is closed with the unit (transformers leaves it open, and the next unit
  of the same worker process would log into it).
- A tracker that is not installed is refused when the config is built (``klear_lib.config.check_tracker``),
  before any work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any


# report_to -> the distribution that provides it (TensorBoard: torch's writer needs the tensorboard package)
def names(tracking) -> dict:
    """The trainer arguments that name a tracked run: ``run_name`` (the unit) and ``project`` (the notebook)."""
    if tracking is None:
        return {}
    run_name = getattr(tracking, "run_name", None) or Path(tracking).name
    return {"run_name": run_name, "project": getattr(tracking, "project", None) or "klear"}


def _namespaced_rewrite(original):
    def rewrite_logs(d):
        flat = {k: v for k, v in d.items() if "/" not in k}
        return {**{k: v for k, v in d.items() if "/" in k}, **original(flat)}

    rewrite_logs.klear = True
    return rewrite_logs


def _check_trackio(folder: str) -> None:
    """trackio copies TRACKIO_DIR into module globals when it is first imported (trackio.utils, sqlite_storage,
    media ...): one process can log to one folder. Units run in fresh worker processes, all of a run's units to the
    run's one ``tracking/trackio``; a process that imported it for another folder is an error, not a silent move."""
    utils = sys.modules.get("trackio.utils")
    held = getattr(utils, "TRACKIO_DIR", None)
    if held is not None and Path(held).resolve() != Path(folder).resolve():
        raise RuntimeError(f"trackio was imported in this process for {held}; it reads its folder once, at import, "
                           f"and cannot log to {folder} too: run this training in a fresh process (a new kernel)")


@contextlib.contextmanager
def tracking_env(tracking):
    """Point the experiment trackers at ``tracking`` (a ``UnitTracking``, or a plain folder) while a trainer is
    built and trains, and keep metric keys' own names; None: nothing changes."""
    if tracking is None:
        yield
        return
    folder = os.fspath(tracking)
    os.makedirs(folder, exist_ok=True)
    tracker = getattr(tracking, "tracker", None)  # None: a plain folder (klear_lib.train.launch), every tracker
    values = {"TENSORBOARD_LOGGING_DIR": folder, "WANDB_DIR": folder, "WANDB_PROJECT": names(tracking)["project"],
              # wandb stays in the run unless its user asks for a sync (WANDB_MODE=online, with a login)
              "WANDB_MODE": os.environ.get("WANDB_MODE") or "offline",
              # wandb's service logs and artifact staging, which default to the home cache
              "WANDB_CACHE_DIR": os.path.join(folder, "wandb-cache"),
              "WANDB_DATA_DIR": os.path.join(folder, "wandb-data")}
    if tracker in (None, "trackio"):
        values["TRACKIO_DIR"] = folder
    if tracker == "trackio":
        _check_trackio(folder)
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    from transformers.integrations import integration_utils

    original = integration_utils.rewrite_logs
    if not getattr(original, "klear", False):
        integration_utils.rewrite_logs = _namespaced_rewrite(original)
    try:
        yield
    finally:
        # transformers' wandb callback leaves its run open at the end of training, and the next trainer of the same
        # worker process then logs into it (two units, one wandb run): close it with its unit, and tear down wandb's
        # process-wide settings, which hold the first unit's WANDB_DIR.
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish()
            if hasattr(wandb, "teardown"):
                wandb.teardown()
        integration_utils.rewrite_logs = original
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def hparams(config: Any) -> dict:
    """A config (a dataclass, nested ones flattened as ``a.b``) as TensorBoard hparams: numbers, bools and text;
    None as ``"None"``."""
    raw = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    out: dict = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    walk("", raw)
    return out


def hparams_callback(config: Any):
    """A trainer callback that writes ``hparams(config)`` to the TensorBoard run, after transformers' TensorBoard
    callback opened it (at train begin)."""
    from transformers import TrainerCallback
    from transformers.integrations import TensorBoardCallback

    class HParams(TrainerCallback):
        def __init__(self):
            self.trainer = None

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero or self.trainer is None:
                return
            for cb in self.trainer.callback_handler.callbacks:
                if isinstance(cb, TensorBoardCallback) and cb.tb_writer is not None:
                    from torch.utils.tensorboard.summary import hparams as hp_summary

                    writer = cb.tb_writer._get_file_writer()
                    for summary in hp_summary(hparams(config), {}):
                        writer.add_summary(summary)
                    cb.tb_writer.flush()

    return HParams()


def add_hparams(trainer, config: Any, report_to) -> None:
    """With TensorBoard among the trackers (``report_to``: a name or TrainingArguments' list of them), give
    ``trainer`` the callback that writes ``config`` as hparams."""
    if "tensorboard" not in ([report_to] if isinstance(report_to, str) else list(report_to or [])):
        return
    cb = hparams_callback(config)
    cb.trainer = trainer
    trainer.add_callback(cb)
