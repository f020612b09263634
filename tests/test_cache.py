"""Verified model caches (klear_lib.cache): an entry is reused only while its files, its key and its config match
the manifest written last; every kind of damage (zeroed at the same size, truncated, swapped for another entry's
file, missing, extra, no or another manifest) is named in one line and the entry is built again."""

import json
import os
import shutil

import pytest

from klear_lib import cache

WEIGHTS = bytes(range(256)) * 64  # 16 KiB standing in for model.safetensors


class Builder:
    """Saves ``final/model.safetensors`` (``content``), ``final/config.json`` and a checkpoint folder."""

    def __init__(self, content: bytes = WEIGHTS):
        self.content, self.calls = content, 0

    def __call__(self, work):
        self.calls += 1
        (work / "final").mkdir(parents=True)
        (work / "final" / "model.safetensors").write_bytes(self.content)
        (work / "final" / "config.json").write_text('{"hidden": 32}')
        (work / "checkpoint-1").mkdir()
        (work / "checkpoint-1" / "optimizer.pt").write_bytes(b"x" * 10)


MADE_BY = {"fields": {"seed": 0, "levels": (1, 2)}, "source": {"sft.py": "abc"}}


def ensure(root, build, key="k1", made_by=MADE_BY):
    said = []
    final, reused = cache.ensure(root, key, made_by, build, label="SFT start", progress=said.append)
    return final, reused, said


def test_built_once_then_reused_with_a_manifest_of_every_file(tmp_path):
    build = Builder()
    final, reused, said = ensure(tmp_path, build)
    assert not reused and build.calls == 1 and said == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1"]  # no temporary folder left
    assert sorted(p.name for p in (tmp_path / "k1").iterdir()) == ["final", "manifest.json"]  # no checkpoint
    manifest = json.loads((tmp_path / "k1" / "manifest.json").read_text())
    import hashlib

    assert manifest["files"]["model.safetensors"] == {"bytes": len(WEIGHTS),
                                                      "sha256": hashlib.sha256(WEIGHTS).hexdigest()}
    assert manifest["key"] == "k1" and manifest["made_by"] == {"fields": {"seed": 0, "levels": [1, 2]},
                                                               "source": {"sft.py": "abc"}}
    again, reused, said = ensure(tmp_path, build)
    assert again == final and reused and build.calls == 1
    assert len(said) == 1 and said[0].startswith("SFT start: reusing the cached model")


def _zero(final):
    path = final / "model.safetensors"
    path.write_bytes(bytes(path.stat().st_size))


def _truncate(final):
    path = final / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])


def _drop_manifest(final):
    (final.parent / "manifest.json").unlink()


def _edit_config(final):
    path = final.parent / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["made_by"]["fields"]["seed"] = 1
    path.write_text(json.dumps(manifest))


def _garble_manifest(final):
    (final.parent / "manifest.json").write_text('{"key": "k1", "files": ')


def _extra_file(final):
    (final / "adapter_config.json").write_text("{}")  # would make transformers load it as a PEFT adapter


def _missing_file(final):
    (final / "config.json").unlink()


DAMAGE = {  # what is done to the entry -> the words the line must hold
    "zeroed, same size": (_zero, "model.safetensors differs from the manifest's sha256"),
    "truncated": (_truncate, "model.safetensors has 1,000 bytes, the manifest 16,384"),
    "no manifest": (_drop_manifest, "no manifest.json"),
    "unreadable manifest": (_garble_manifest, "manifest.json is unreadable"),
    "another config": (_edit_config, "records another config"),
    "an extra file": (_extra_file, "final/adapter_config.json is not in the manifest"),
    "a missing file": (_missing_file, "final/config.json is missing"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damage_is_named_and_the_entry_is_built_again(tmp_path, case):
    damage, words = DAMAGE[case]
    build = Builder()
    final, _, _ = ensure(tmp_path, build)
    damage(final)
    assert cache.verify(final.parent, "k1", MADE_BY) is not None
    again, reused, said = ensure(tmp_path, build)
    assert not reused and build.calls == 2
    assert len(said) == 1 and words in said[0] and str(final.parent) in said[0] and "training it again" in said[0]
    assert (again / "model.safetensors").read_bytes() == WEIGHTS  # the rebuilt entry is whole again
    assert cache.verify(again.parent, "k1", MADE_BY) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1"]  # the bad entry is gone, nothing half-moved


def test_swapped_files_and_swapped_manifests_are_caught(tmp_path):
    """Another entry's weights (same size, other content) in this entry, then another entry's manifest."""
    mine, other = Builder(WEIGHTS), Builder(WEIGHTS[::-1])
    a, _, _ = ensure(tmp_path, mine, key="k1")
    b, _, _ = ensure(tmp_path, other, key="k2", made_by={**MADE_BY, "fields": {"seed": 1}})
    shutil.copy(b / "model.safetensors", a / "model.safetensors")
    assert "differs from the manifest's sha256" in cache.verify(a.parent, "k1", MADE_BY)
    _, reused, said = ensure(tmp_path, mine, key="k1")
    assert not reused and (a / "model.safetensors").read_bytes() == WEIGHTS
    # the whole of k2 (its weights and its manifest, consistent with each other) under k1's name
    shutil.rmtree(a.parent)
    shutil.copytree(b.parent, a.parent)
    assert "is for key 'k2', not 'k1'" in cache.verify(a.parent, "k1", MADE_BY)
    _, reused, said = ensure(tmp_path, mine, key="k1")
    assert not reused and "is for key 'k2'" in said[0] and (a / "model.safetensors").read_bytes() == WEIGHTS


def test_a_failed_build_leaves_no_entry_and_no_temporary_folder(tmp_path):
    def fails(work):
        (work / "final").mkdir(parents=True)
        raise RuntimeError("out of memory, say")

    with pytest.raises(RuntimeError, match="out of memory"):
        ensure(tmp_path, fails)
    assert list(tmp_path.iterdir()) == []


def test_the_folder_of_a_build_killed_midway_is_removed_by_the_next_build(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"k1.tmp-{dead.pid}"
    (stale / "final").mkdir(parents=True)  # what a run killed during its SFT leaves
    live = tmp_path / f"k1.tmp-{os.getppid()}"  # a build in progress in a live process: left alone
    live.mkdir()
    ensure(tmp_path, Builder())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["k1", live.name])


def test_the_weights_digest_reads_every_shard_in_name_order_and_names_a_folder_without_weights(tmp_path):
    import hashlib

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"second")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"first")
    assert cache.weights_sha256(tmp_path) == hashlib.sha256(b"firstsecond").hexdigest()
    single = tmp_path / "single"
    single.mkdir()
    (single / "model.safetensors").write_bytes(b"w" * 3_000_000)  # several read blocks
    assert cache.weights_sha256(single) == hashlib.sha256(b"w" * 3_000_000).hexdigest()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights in .*empty"):
        cache.weights_sha256(empty)


def test_a_copy_of_an_entry_sent_to_another_machine_is_checked_against_its_manifest_on_arrival(tmp_path):
    """The Ray executor ships a start as ``pack_entry``'s bytes; ``install_entry`` puts it in place only when every
    file matches the manifest that came with it (an altered or missing file: one line naming it, nothing left
    behind), and keeps an intact entry already there."""
    final, _, _ = ensure(tmp_path / "a", Builder())
    files = cache.pack_entry(final.parent)
    assert sorted(files) == ["final/config.json", "final/model.safetensors", "manifest.json"]
    dest = tmp_path / "b" / "k1"
    altered = {**files, "final/model.safetensors": b"\xff" + files["final/model.safetensors"][1:]}
    with pytest.raises(ValueError, match=r"final/model\.safetensors differs from the manifest's sha256"):
        cache.install_entry(dest, altered)
    missing = {k: v for k, v in files.items() if k != "final/config.json"}
    with pytest.raises(ValueError, match=r"final/config\.json is missing"):
        cache.install_entry(dest, missing)
    with pytest.raises(ValueError, match="not a path inside a cache entry"):
        cache.install_entry(dest, {**files, "../outside": b"x"})
    assert not (tmp_path / "b").exists() or list((tmp_path / "b").iterdir()) == []  # nothing left behind
    assert cache.install_entry(dest, files) is True
    assert cache.verify(dest, "k1", MADE_BY) is None  # the copy is the entry: its key and config check too
    assert cache.install_entry(dest, altered) is False  # an intact entry stays, whatever arrives
    assert (dest / "final" / "model.safetensors").read_bytes() == WEIGHTS
