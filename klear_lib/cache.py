"""Verified model caches: a folder trained once per key, reused only while it is exactly what was written.

An entry is ``<cache root>/<key>/`` with

==================  =========================================================================================
``final/``          the model and tokenizer files, as the builder saved them
``manifest.json``   written last: ``key``, ``made_by`` (the config, source digests and versions the key is a
                    digest of) and ``files`` (every file under ``final/`` with its size and sha256)
==================  =========================================================================================

``ensure`` builds an entry into ``<key>.tmp-<pid>`` and renames it into place (atomic: a concurrent run finds a
whole entry or none), and on every reuse checks the manifest against the key, the config and each file's size and
sha256. A missing or unreadable manifest, another key or config, a missing, extra, truncated or altered file: the
entry is set aside and built again, with one line saying why. Hashing costs about a second per GB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from klear_lib import runs

MANIFEST = "manifest.json"
MODEL_DIR = "final"


def digest(obj: Any) -> str:
    """sha256 of ``obj`` as sorted JSON: what a cache key is made of."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def file_sha256(*paths: Path) -> str:
    """sha256 of the files ``paths`` read one after the other as one stream (of one file: its own sha256)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def weights_sha256(folder: Path) -> str:
    """sha256 of a saved model's weights: its ``*.safetensors`` files read in name order as one stream (an unsharded
    model: the sha256 of its ``model.safetensors``; a sharded one: of its shards one after the other)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    return file_sha256(*files)


def file_table(folder: Path) -> dict[str, dict]:
    """``{relative path: {"bytes", "sha256"}}`` of every file under ``folder``."""
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True))  # tuples as lists, as the manifest reads back


def write_manifest(entry: Path, key: str, made_by: Any) -> None:
    """``entry/manifest.json`` for the files now under ``entry/final`` (written last, atomically)."""
    manifest = {"key": key, "made_by": _normal(made_by), "files": file_table(entry / MODEL_DIR),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    runs.write_atomic(entry / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def verify(entry: Path, key: str, made_by: Any) -> str | None:
    """None when ``entry`` is what its manifest says and the manifest is the one ``key``/``made_by`` would write;
    otherwise why not, in a few words naming the file."""
    path = entry / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (written by an older klear, or never finished)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__})"
    if manifest.get("key") != key:
        return f"{MANIFEST} is for key {manifest.get('key')!r}, not {key!r}"
    if manifest.get("made_by") != _normal(made_by):
        return f"{MANIFEST} records another config than the one that asks for it"
    return _check_files(entry, files)


def verify_files(entry: Path) -> str | None:
    """None when the files under ``entry/final`` are exactly those of its manifest (sizes and sha256), whatever key
    and config it was made for; otherwise why not. What a copy of an entry that crossed to another machine is
    checked against on arrival (``klear_lib.ray_executor``): the key was checked where the entry was made."""
    try:
        files = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__})"
    return _check_files(entry, files)


def _check_files(entry: Path, files: Any) -> str | None:
    if not isinstance(files, dict):
        return f"{MANIFEST} has no file table"
    model = entry / MODEL_DIR
    if not model.is_dir():
        return f"no {MODEL_DIR}/ folder"
    present = {p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()}
    if missing := sorted(set(files) - present):
        return f"{MODEL_DIR}/{missing[0]} is missing"
    if extra := sorted(present - set(files)):
        return f"{MODEL_DIR}/{extra[0]} is not in the manifest"
    for name, want in sorted(files.items()):
        size = (model / name).stat().st_size
        if size != want["bytes"]:
            return f"{MODEL_DIR}/{name} has {size:,} bytes, the manifest {want['bytes']:,} (truncated or replaced)"
        if file_sha256(model / name) != want["sha256"]:
            return f"{MODEL_DIR}/{name} differs from the manifest's sha256 (altered or replaced)"
    return None


def _set_aside(entry: Path) -> None:
    """Move a bad entry out of the key's place (one rename, so no reader sees half of it), then delete it."""
    aside = entry.with_name(f"{entry.name}.bad-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.replace(entry, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _drop_stale_builds(entry: Path) -> None:
    """Delete ``<key>.tmp-<pid>`` folders whose builder process is gone (a run killed while it trained)."""
    for stale in entry.parent.glob(f"{entry.name}.tmp-*"):
        try:
            os.kill(int(stale.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def ensure(cache_root: str | os.PathLike, key: str, made_by: Any, build: Callable[[Path], None], *,
           label: str, progress: Callable[[str], Any] = print) -> tuple[Path, bool]:
    """The model folder (``<cache root>/<key>/final``) of a verified entry, and whether it was reused.

    ``build(work)`` must save the model under ``work/final``; anything else it leaves in ``work`` (checkpoints)
    is deleted. A present entry that fails ``verify`` is reported (``label``: the reason) and built again.
    """
    entry = Path(cache_root) / key
    if entry.exists():
        reason = verify(entry, key, made_by)
        if reason is None:
            progress(f"{label}: reusing the cached model {entry} (key {key}; files match their manifest)")
            return entry / MODEL_DIR, True
        progress(f"{label}: not reusing the cached model {entry}: {reason}; training it again")
        _set_aside(entry)
    _drop_stale_builds(entry)
    work = entry.with_name(f"{key}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        build(work)
        if not (work / MODEL_DIR).is_dir():
            raise RuntimeError(f"{label}: the builder saved no {MODEL_DIR}/ folder in {work}")
        for sub in work.iterdir():  # keep the model only: checkpoints are not needed by anyone
            if sub.name != MODEL_DIR:
                shutil.rmtree(sub) if sub.is_dir() else sub.unlink()
        write_manifest(work, key, made_by)
        try:
            os.replace(work, entry)  # atomic: a concurrent run finds a whole entry or none
        except OSError:  # another run got there first: keep its entry if it is sound, else ours
            if verify(entry, key, made_by) is None:
                shutil.rmtree(work, ignore_errors=True)
            else:
                _set_aside(entry)
                os.replace(work, entry)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return entry / MODEL_DIR, False


def is_entry(folder: Path) -> bool:
    """Whether ``folder`` is a cache entry (a ``manifest.json`` beside a ``final/`` folder)."""
    return (folder / MANIFEST).is_file() and (folder / MODEL_DIR).is_dir()


def pack_entry(entry: Path) -> dict[str, bytes]:
    """An entry's manifest and model files as ``{relative path: bytes}``, to send to another machine (whole files
    in memory: the tiny models are a few MB; a GPU start is its weights' size)."""
    entry = Path(entry)
    files = {MANIFEST: (entry / MANIFEST).read_bytes()}
    for p in sorted((entry / MODEL_DIR).rglob("*")):
        if p.is_file():
            files[p.relative_to(entry).as_posix()] = p.read_bytes()
    return files


def install_entry(entry: Path, files: dict[str, bytes]) -> bool:
    """Put a packed entry (``pack_entry``) at ``entry``, checked against its own manifest before it is renamed into
    place; an entry already there that passes ``verify_files`` is kept. True when installed, False when kept.
    ValueError, naming the file, when the copy does not match its manifest (nothing is left behind)."""
    entry = Path(entry)
    if entry.exists() and verify_files(entry) is None:
        return False
    work = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        for name, data in files.items():
            path = work / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ValueError(f"{name!r}: not a path inside a cache entry")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        reason = verify_files(work)
        if reason is not None:
            raise ValueError(f"the copy of {entry} does not match its manifest: {reason}")
        if entry.exists():
            _set_aside(entry)
        os.replace(work, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True
