"""README's "GPPO+ERC in your own trainer", run as printed: the code blocks are read from README.md, not copied.

The TRL block runs in a fresh process in a scratch folder (its `outputs/` lands there) and must train its planned
optimizer steps, GPPO+ERC in the logs, in at most 12 lines; the bare-loss block prints and backpropagates the values
computed by hand below; the verl block runs in bash in the verl environment (verl's loss code from
<venv>/verl-nodeps, as tests/test_verl.py), with the venv's python first on PATH.
"""

import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SECTION = "## GPPO+ERC in your own trainer"
VERL_DIR = pathlib.Path(os.environ.get("KLEAR_VERL_DIR") or pathlib.Path(sys.prefix) / "verl-nodeps")


def blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the section, in order."""
    text = (ROOT / "README.md").read_text()
    assert text.count(SECTION + "\n") == 1, f"README.md has no single {SECTION!r} section"
    body = text.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```(\w+)\n(.*?)^```$", body, re.M | re.S)


def test_the_section_has_the_trl_the_loss_and_the_verl_blocks():
    assert [lang for lang, _ in blocks()] == ["python", "python", "bash"]
    trl_block = blocks()[0][1]
    assert len(trl_block.splitlines()) <= 12, trl_block  # TRL's own GRPO quickstart is 7 lines
    assert "KlearGRPOTrainer" in trl_block and "erc_low=0.8, erc_high=1.2" in trl_block


def _python(code: str, cwd, suffix: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code + suffix], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600)


@pytest.mark.slow  # a fresh process imports TRL and trains 4 steps: about 30 s on 2 busy cores
def test_the_trl_block_trains_its_planned_steps_with_gppo_and_erc(tmp_path):
    """2 rollouts × steps_per_generation 2 = 4 optimizer steps on kept groups, the second of each rollout
    off-policy; the loss is klear's GPPO with ERC (its actor/* metrics in TRL's log, averaged over the 4 steps, as
    TRL's default logging_steps logs them once here), and the run saved where it says."""
    report = ("\nimport json\nlog = [h for h in trainer.state.log_history if 'actor/pg_loss' in h][-1]\n"
              "print(json.dumps({'steps': trainer.state.global_step, 'log': log, 'loss': trainer.klear.loss_name, "
              "'erc': [trainer.klear.policy_loss.erc_low, trainer.klear.policy_loss.erc_high]}))\n")
    out = _python(blocks()[0][1], tmp_path, report)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] == 4 and got["loss"] == "gppo" and got["erc"] == [0.8, 1.2]
    log = got["log"]
    assert log["klear/rollout"] == pytest.approx(1.5)  # steps of rollouts 1, 1, 2, 2
    assert log["klear/informative_completions"] == 8  # 2 kept groups of 4 per step: every mini-batch full
    assert "actor/erc_frac_low" in log and "actor/gppo_preserved_frac" in log
    assert log["actor/ratio_max"] > 1.0  # mean of (1, r, 1, r'): the second step of each rollout is off-policy
    assert (tmp_path / "outputs" / "grpo-tiny").is_dir()


# By hand, token-mean over 6 tokens, ε = (0.2, 0.28), A = (+1, -1):
#   r = (1.0, 1.6, 0.6 | 1.0, 0.4, 1.2); values -min(rA, clip(r)A): (-1, -1.28, -0.6 | 1, 0.8, 1.2) -> 0.12 / 6
#   ∂/∂log π · 6: (-1, -1.28 [GPPO: the clipped token keeps F = 1+ε_h], 0 [ERC: ρ = 1.5] | 1, 0.8 [F = 1-ε_l], 1.2)
HAND_LOSS = 0.12 / 6
HAND_GRAD = [[-1 / 6, -1.28 / 6, 0.0], [1 / 6, 0.8 / 6, 1.2 / 6]]


def test_the_loss_block_prints_and_backpropagates_the_hand_values(tmp_path):
    out = _python(blocks()[1][1], tmp_path, "\nprint(log_prob.grad.tolist())\n")
    assert out.returncode == 0, out.stderr[-3000:]
    printed, grad = out.stdout.strip().splitlines()[-2:]
    loss, preserved, erc = printed.split()
    assert float(loss) == pytest.approx(HAND_LOSS, abs=5e-5) and loss == "0.0200"
    assert float(preserved) == pytest.approx(2 / 6) and float(erc) == pytest.approx(1 / 6)
    for row, want in zip(eval(grad), HAND_GRAD):  # noqa: S307 (our own print of a list of floats)
        assert row == pytest.approx(want, abs=1e-6)
    assert not any(math.isnan(x) for row in eval(grad) for x in row)  # noqa: S307


def test_the_verl_block_registers_the_losses_and_prints_verls_command(tmp_path):
    if importlib.util.find_spec("verl") is None and not VERL_DIR.is_dir():
        if os.environ.get("KLEAR_REQUIRE_VERL") == "1":
            pytest.fail(f"KLEAR_REQUIRE_VERL=1 but verl is not installed (neither importable nor in {VERL_DIR})")
        pytest.skip("verl is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "ROLLOUT_TP")}
    env.update(PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH"), str(VERL_DIR)])))
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks()[2][1]], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "klear_gppo_erc"  # verl's registry hands back the Klear loss
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=gppo_erc" in lines
    assert "actor_rollout_ref.model.path=/path/to/your/sft" in lines
    assert ("klear_lib.integrations.verl: registered ['gppo', 'gppo_erc', 'ppo_clip_erc'] in verl 0.9.1's policy-loss "
            "registry; KLEAR_VERL_LOSS={\"erc_low\": 0.8, \"erc_high\": 1.2, \"sft_alpha\": 0.1}: sft_alpha=0.1, "
            "beta_low=1.0, beta_high=1.0, ERC bounds {'gppo_erc': (0.8, 1.2), 'ppo_clip_erc': (0.8, 1.2)} (clip "
            "ranges: verl's actor config)") in out.stderr
