"""klear_lib.train.launch on the CPU: RL from a config file into a run directory, on the tiny task and on Klear's
RL record schema (a fixture in the real layout, judged by math-verify in worker processes), and its errors; fp32
master weights from a bf16 checkpoint (launch and SFT), and unsloth only when asked for."""

from pathlib import Path

import pytest
import torch

from klear_lib import models, runs
from klear_lib.data import rows as row_writers
from klear_lib.data import tasks
from klear_lib.train import launch, sft

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "rl" / "cpu_tiny.yaml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny SFT start saved in bf16, as Qwen3's checkpoints are: every weight is bf16-representable."""
    train, _ = tasks.make_splits(1234, 200, 8)
    tok = models.build_tokenizer(tasks.corpus(train))
    model = models.build_tiny_model(tok, seed=0).to(torch.bfloat16)
    return models.save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("tiny") / "sft")


def _changed(after, before) -> tuple[float, float]:
    """The share of weights that moved, and the share that rounded to bf16 would be back at the start."""
    moved = back = total = 0
    for a, b in zip(after.parameters(), before.parameters()):
        moved += int((a != b.float()).sum())
        back += int((a.to(torch.bfloat16) == b).sum())
        total += a.numel()
    return moved / total, back / total


def test_launch_on_the_tiny_task_writes_a_run_directory_and_the_model(tiny_model, tmp_path, capsys):
    """Also: from a bf16 checkpoint at lr 1e-6 the run trains fp32 master weights, and the updates it keeps are
    below bf16's resolution (bf16 weights would have rounded them away)."""
    out = tmp_path / "run"
    assert launch.main(["--config", str(CONFIG), "--out", str(out), "-p", f"model={tiny_model}",
                        "-p", "rl_lr=1.0e-6"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(out))
    assert not runs.check_run_dir(out)
    steps = [r for r in runs.read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r]
    assert len(steps) == 4  # 2 rollouts x (4 prompts / mini-batches of 2)
    assert any(r["actor/erc_frac_low"] + r["actor/erc_frac_high"] >= 0 for r in steps)
    model, _ = models.load_model_and_tokenizer(out / "model", dtype="auto")
    start, _ = models.load_model_and_tokenizer(tiny_model, dtype="auto")
    assert start.dtype == torch.bfloat16 and model.dtype == torch.float32  # trained and saved in fp32
    moved, back = _changed(model, start)
    assert moved > 0.5 and back > 0.9, (moved, back)  # RL moved most weights, by less than bf16 could hold
    cfg = runs.read_summary(out)
    assert cfg["model"] == str(out / "model")


def test_launch_on_klear_math_records_judges_with_math_verify(tiny_model, tmp_path):
    rows = [row_writers.klear_rl_row(f"What is {a} + {b}?", str(a + b)) for a in range(3) for b in range(2)]
    data = row_writers.write_jsonl(rows, tmp_path / "math.jsonl")
    out = tmp_path / "run"
    code = launch.main(["--config", str(CONFIG), "--out", str(out), "-p", f"model={tiny_model}",
                        "-p", f"data={data}", "-p", "reward_workers=2", "-p", "rollouts=1"])
    assert code == 0
    steps = [r for r in runs.read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r]
    assert len(steps) == 2
    # graded by the math judge (TRL names the metric after the reward function): Klear's released scores are
    # +1 correct, -1 wrong, -0.5 no </think>, -2 no <think>; an untrained model is mostly format failures
    # the rewards are logged once per rollout, in its record
    means = [r["rewards/math/mean"] for r in runs.read_metrics(out / "metrics.jsonl") if "rewards/math/mean" in r]
    assert means and all(-2.0 <= m <= 1.0 for m in means) and any(m < 0 for m in means), means


def test_launch_errors_name_the_key(tmp_path, capsys):
    assert launch.main(["--config", str(CONFIG), "--out", str(tmp_path / "x")]) == 2
    assert "model: set it to the SFT checkpoint" in capsys.readouterr().err
    assert launch.main(["--config", str(CONFIG), "--out", str(tmp_path / "x"), "-p", "modle=abc"]) == 2
    assert "unknown key(s) ['modle']" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_weights_dtype_is_a_named_key_and_bf16_only_when_asked(tiny_model, tmp_path):
    rl, launch_cfg = launch.load_config(CONFIG, {"model": str(tiny_model)})
    assert launch_cfg.weights_dtype == "float32"
    assert launch.load_config(CONFIG, {"weights_dtype": "bfloat16"})[1].weights_dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"cpu_tiny.yaml: weights_dtype must be one of \['bfloat16', 'float32'\]"):
        launch.load_config(CONFIG, {"weights_dtype": "fp16"})
    with pytest.raises(ValueError, match="SFTStageConfig.weights_dtype must be one of"):
        sft.SFTStageConfig(weights_dtype="half")
    model, _ = sft.load_for_sft(tiny_model, bf16=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model, _ = sft.load_for_sft(tiny_model, bf16=True, weights_dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_sft_step_of_1e_6_moves_bf16_representable_weights(tiny_model, tmp_path):
    """SFT from the bf16 checkpoint with bf16 autocast (as the GPU presets run): one AdamW step at lr 1e-6 moves most
    weights, each by less than bf16's resolution. With ``weights_dtype: bfloat16``, asked for explicitly, the same
    step leaves almost every weight where it was: what fp32 master weights prevent."""
    train, _ = tasks.make_splits(1234, 8, 2)
    samples = sft.sft_samples(train)
    start, _ = models.load_model_and_tokenizer(tiny_model, dtype="auto")
    results = {}
    for dtype in ("float32", "bfloat16"):
        cfg = sft.SFTStageConfig(learning_rate=1e-6, epochs=1.0, batch_size=8, warmup_ratio=0.0, resume=False,
                                 bf16=True, use_cpu=True, weights_dtype=dtype)
        model, _ = sft.sft_from(tiny_model, sft.chat_rows(samples), tmp_path / dtype, cfg)
        assert {p.dtype for p in model.parameters()} == {models.WEIGHTS_DTYPES[dtype]}
        results[dtype] = _changed(model.float(), start)
    moved, back = results["float32"]
    assert moved > 0.5 and back > 0.9, results
    assert results["bfloat16"][0] < 0.1, results


def test_unsloth_is_opt_in_never_chosen_by_its_presence(tiny_model, monkeypatch):
    """Where unsloth is importable with a GPU, the default loader is still plain transformers; only use_unsloth=True
    (or ``unsloth: full|lora`` in a launch config, ``SFTStageConfig.use_unsloth``) asks for it."""
    import sys

    monkeypatch.setattr(sft, "unsloth_available", lambda: True)  # only the decision is under test: nothing loads it
    model, _ = sft.load_for_sft(tiny_model, bf16=True)
    assert type(model).__name__ == "Qwen3ForCausalLM" and "unsloth" not in sys.modules
    assert sft.SFTStageConfig().use_unsloth is False
    with pytest.raises(TypeError, match="use_unsloth must be True or False"):
        sft.load_for_sft(tiny_model, use_unsloth=None)
    with pytest.raises(TypeError, match="SFTStageConfig.use_unsloth"):
        sft.SFTStageConfig(use_unsloth="yes")


def test_unsloth_needs_a_gpu_and_unsloth(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(sft, "unsloth_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs unsloth installed"):
        launch.launch(*launch.load_config(CONFIG, {"model": str(tiny_model), "unsloth": "lora"}), tmp_path / "u")
    with pytest.raises(ValueError, match="unsloth must be 'off', 'full' or 'lora'"):
        launch.load_config(CONFIG, {"unsloth": "yes"})


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["full", "lora"])
def test_launch_with_unsloth_on_a_gpu(tiny_model, tmp_path, mode):
    pytest.importorskip("unsloth")
    out = tmp_path / mode
    assert launch.main(["--config", str(CONFIG), "--out", str(out), "-p", f"model={tiny_model}",
                        "-p", f"unsloth={mode}", "-p", "lora_rank=8", "-p", "use_cpu=false", "-p", "bf16=true"]) == 0
    steps = [r for r in runs.read_metrics(out / "metrics.jsonl") if "actor/pg_loss" in r]
    assert len(steps) == 4 and all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in steps)
    if mode == "full":  # unsloth's full fine-tuning trained fp32 master weights from the bf16 checkpoint
        model, _ = models.load_model_and_tokenizer(out / "model", dtype="auto")
        assert model.dtype == torch.float32


def test_launch_runs_data_parallel_over_two_cpu_processes(tiny_model, tmp_path):
    """torchrun with two processes (gloo on the CPU), as accelerate launches them on GPUs: the mini-batch is split
    over the processes, only the main one writes the run directory, the model is saved once."""
    import json
    import subprocess
    import sys

    out = tmp_path / "ddp"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                           "klear_lib.train.launch", "--config", str(CONFIG), "--out", str(out), "-p",
                           f"model={tiny_model}"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out) and proc.stdout.count(str(out)) == 1
    assert json.loads((out / "config.json").read_text())["world_size"] == 2
    records = runs.read_metrics(out / "metrics.jsonl")
    assert len([r for r in records if "actor/pg_loss" in r]) == 4  # written by one process, not two
    models.load_model_and_tokenizer(out / "model", dtype=torch.float32)


def test_config_files_read_numbers_as_the_cli_does(tmp_path):
    """One parser for presets, -p overrides and launch configs: `1e-6` is a float, not the string YAML 1.1 makes it."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("model: /m\nrl_lr: 1e-6\nsft_lr: 2e-3\nrollouts: 3\n")
    rl, _ = launch.load_config(cfg_file, {"weight_decay": 0.0})
    assert rl.rl_lr == 1e-6 and isinstance(rl.rl_lr, float) and rl.sft_lr == 2e-3 and rl.rollouts == 3
