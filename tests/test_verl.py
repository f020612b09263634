"""klear_lib.integrations.verl against the real verl (CPU): the registered losses equal klear_lib.losses, verl's own
baselines equal ours (a second, independent implementation), split-invariant aggregation, and the entropy hook,
pinned to the verl release it was written for.

verl is installed by `make test` (`pip install --no-deps verl` plus the few packages its loss code imports; its
hydra dependency is left out, see docs/environment notes). Without verl these tests skip, unless
KLEAR_REQUIRE_VERL=1 (set by `make test`), where a missing verl is a failure.
"""

import importlib.util
import inspect
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch

if importlib.util.find_spec("verl") is None:
    if os.environ.get("KLEAR_REQUIRE_VERL") == "1":
        raise RuntimeError("KLEAR_REQUIRE_VERL=1 but verl is not installed (make test installs it)")
    pytest.skip("verl is not installed", allow_module_level=True)

import verl  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

from klear_lib import losses  # noqa: E402
from klear_lib.integrations import verl as kv  # noqa: E402


def actor_config(**kw):
    base = dict(strategy="fsdp", ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
                rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0)
    return ActorConfig(**{**base, **kw})


def batch(seed=0, B=6, T=9):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    new = (old + 0.6 * torch.randn(B, T, generator=g)).requires_grad_()  # ratios well outside 1±ε
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = torch.ones(B, T, dtype=torch.bool)
    for i in range(B):
        mask[i, int(torch.randint(2, T + 1, (1,), generator=g)):] = False
    ent_old = torch.rand(B, T, generator=g) * 2
    ent = ent_old * (0.7 + 0.6 * torch.rand(B, T, generator=g))  # ratios on both sides of (0.8, 1.2)
    return old, new, adv, mask, ent, ent_old


def value_and_grad(fn, new, *args, **kw):
    loss, metrics = fn(*args, **kw)
    (g,) = torch.autograd.grad(loss, new)
    return loss.detach(), g, metrics


def test_written_for_this_verl_release():
    assert verl.__version__ == kv.VERIFIED_VERL, (
        f"verl {verl.__version__} is installed but the hook was verified on {kv.VERIFIED_VERL}: re-check the "
        "pinned internals below, then update VERIFIED_VERL and the Makefile pin")


def test_loaded_through_verl_external_modules(tmp_path):
    code = ("from verl.trainer.ppo import core_algos as c; "
            "print(sorted(n for n in c.POLICY_LOSS_REGISTRY if n in ('gppo', 'gppo_erc', 'ppo_clip_erc')))")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "klear_lib.integrations.verl"}
    out = subprocess.run([sys.executable, "-c", "import verl; " + code], env=env, capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['gppo', 'gppo_erc', 'ppo_clip_erc']"


@pytest.mark.parametrize("name", list(kv.LOSSES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_registered_losses_equal_klear_losses(name, agg, monkeypatch):
    monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"beta_low": 0.5, "erc_low": 0.85, "erc_high": 1.25}))
    old, new, adv, mask, ent, ent_old = batch(1)
    cfg = actor_config()
    fn = core_algos.get_policy_loss_fn(name)
    got, g_got, m = value_and_grad(fn, new, old, new, adv, mask, agg, cfg, entropy=ent, old_entropy=ent_old)
    klear_name, erc = kv.LOSSES[name]
    kcfg = losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, beta_low=0.5,
                                   erc_low=0.85 if erc else None, erc_high=1.25 if erc else None)
    want, g_want, km = value_and_grad(losses.POLICY_LOSSES[klear_name], new, old, new, adv, mask, agg, kcfg,
                                      entropy=ent, old_entropy=ent_old)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)
    assert m["actor/erc_frac_low"] == km["actor/erc_frac_low"]
    assert (m["actor/erc_frac_low"] + m["actor/erc_frac_high"] > 0) == erc  # the batch does trigger ERC
    assert m["actor/pg_clipfrac"] == pytest.approx(km["actor/pg_clipfrac_low"] + km["actor/pg_clipfrac_high"])


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_with_global_counts_add_up_to_the_whole_batch(agg):
    """verl splits a mini-batch into micro-batches and normalises each by the mini-batch's global counts; the
    sum of micro-batch losses (and gradients) must equal the whole mini-batch's loss."""
    old, new, adv, mask, ent, ent_old = batch(2, B=8)
    fn = core_algos.get_policy_loss_fn("gppo")
    whole, g_whole, _ = value_and_grad(fn, new, old, new, adv, mask, agg, actor_config())
    cfg = actor_config()
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=int(mask.shape[0]))
    parts = [fn(old[s], new[s], adv[s], mask[s], agg, cfg)[0] for s in (slice(0, 3), slice(3, 8))]
    total = parts[0] + parts[1]
    (g_total,) = torch.autograd.grad(total, new)
    torch.testing.assert_close(total.detach(), whole)
    torch.testing.assert_close(g_total, g_whole)


@pytest.mark.parametrize("verl_name,ours,agg", [("vanilla", "ppo_clip", "token-mean"),
                                                ("vanilla", "ppo_clip", "seq-mean-token-mean"),
                                                ("cispo", "cispo", "token-mean"),
                                                ("gspo", "gspo", "seq-mean-token-mean")])
def test_verl_baselines_equal_ours(verl_name, ours, agg):
    """verl's own implementations of PPO-clip (dual-clip), CISPO and GSPO against klear_lib.losses."""
    old, new, adv, mask, _, _ = batch(3)
    c = 10.0 if verl_name == "vanilla" else None
    cfg = actor_config(clip_ratio_c=c or 3.0)
    theirs, g_theirs, _ = value_and_grad(core_algos.get_policy_loss_fn(verl_name), new, old, new, adv, mask, agg, cfg)
    kcfg = losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=c)
    mine, g_mine, _ = value_and_grad(losses.POLICY_LOSSES[ours], new, old, new, adv, mask, agg, kcfg)
    torch.testing.assert_close(mine, theirs)
    torch.testing.assert_close(g_mine, g_theirs)


def test_erc_without_entropies_fails_loudly():
    old, new, adv, mask, _, _ = batch(4)
    with pytest.raises(ValueError, match="calculate_entropy=True"):
        core_algos.get_policy_loss_fn("gppo_erc")(old, new, adv, mask, "token-mean", actor_config())


def test_options_are_checked(monkeypatch):
    monkeypatch.setenv(kv.OPTIONS_ENV, '{"clip_ratio_low": 0.1}')
    with pytest.raises(ValueError, match="unknown key"):
        kv.klear_config(actor_config(), erc=False)
    monkeypatch.setenv(kv.OPTIONS_ENV, "beta_low=0.5")
    with pytest.raises(ValueError, match="must be a JSON object"):
        kv.klear_config(actor_config(), erc=False)
    monkeypatch.delenv(kv.OPTIONS_ENV)
    cfg = kv.klear_config(actor_config(clip_ratio_c=3.0), erc=True)
    assert (cfg.clip_ratio_c, cfg.erc_low, cfg.erc_high) == (3.0, 0.8, 1.2)


# ------------------------------------------------------------------------------------------- the entropy hook
def source(module: str) -> str:
    return pathlib.Path(importlib.util.find_spec(module).origin).read_text()


def test_pinned_verl_internals_the_hook_relies_on():
    """Fails when verl moves the code the hook patches: then re-check install_entropy_hook."""
    trainer = source("verl.trainer.ppo.ray_trainer")
    assert "def _compute_old_log_prob(self, batch: DataProto):" in trainer
    assert 'result = {"old_log_probs": log_probs.float(), "entropys": entropy.float()}' in trainer
    assert "old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)" in trainer
    assert 'old_log_prob.batch.pop("entropys")' in trainer
    workers = source("verl.workers.engine_workers")
    assert "from verl.workers.utils.losses import ppo_loss" in workers
    assert "partial(ppo_loss, config=actor_config)" in workers
    from verl.workers.utils import losses as vl

    assert list(inspect.signature(vl.ppo_loss.__wrapped__ if hasattr(vl.ppo_loss, "__wrapped__") else vl.ppo_loss)
                .parameters) == ["config", "model_output", "data", "dp_group"]
    ppo_src = source("verl.workers.utils.losses")
    assert 'entropy = model_output.get("entropy", None)' in ppo_src
    assert "policy_loss_fn(\n        old_log_prob=old_log_prob," in ppo_src


def test_old_entropies_survive_the_trainers_pop():
    from verl import DataProto

    class Trainer:
        def _compute_old_log_prob(self, batch):
            ent = torch.rand(2, 3)
            return DataProto.from_dict(tensors={"old_log_probs": -ent, "entropys": ent}), 0.5

    kv._patch_compute_old_log_prob(types.SimpleNamespace(RayPPOTrainer=Trainer))
    old, mfu = Trainer()._compute_old_log_prob(None)
    ent = old.batch.pop("entropys")  # what RayPPOTrainer.fit does after logging the mean
    torch.testing.assert_close(old.batch["old_entropys"], ent)
    assert mfu == 0.5


def verl_actor_inputs(old, new, adv, mask, ent, ent_old, P=3):
    """The TensorDict and model output verl's actor hands ppo_loss: dense prompts/responses without padding
    in the attention mask, and flat (unpadded) per-token model outputs shifted by one position."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    B, T = new.shape
    data = TensorDict({"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
                       "attention_mask": torch.ones(B, P + T, dtype=torch.long), "response_mask": mask.long(),
                       "old_log_probs": old, "advantages": adv, "old_entropys": ent_old}, batch_size=[B])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)

    def flat(x):
        out = torch.zeros(B, P + T, dtype=x.dtype)
        out = out.index_put((torch.arange(B)[:, None], torch.arange(P - 1, P - 1 + T)[None, :]), x)
        return out.reshape(-1)

    return data, {"log_probs": flat(new), "entropy": flat(ent)}


def test_hooked_ppo_loss_gives_the_klear_erc_loss_the_entropies(monkeypatch):
    from verl.workers.utils import losses as vl

    monkeypatch.delenv(kv.OPTIONS_ENV, raising=False)
    old, new, adv, mask, ent, ent_old = batch(5)
    data, out = verl_actor_inputs(old.detach(), new, adv, mask, ent, ent_old)
    cfg = actor_config(calculate_entropy=True, entropy_coeff=0.0, policy_loss=PolicyLossConfig(loss_mode="gppo_erc"))
    hooked = kv.hooked_ppo_loss(vl.ppo_loss.__wrapped__ if hasattr(vl.ppo_loss, "__wrapped__") else vl.ppo_loss)
    loss, metrics = hooked(cfg, out, data)
    (g,) = torch.autograd.grad(loss, new)
    kcfg = losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, erc_low=0.8,
                                   erc_high=1.2)
    want, g_want, km = value_and_grad(losses.gppo_loss, new, old, new, adv, mask, "token-mean", kcfg,
                                      entropy=ent, old_entropy=ent_old)
    torch.testing.assert_close(loss.detach(), want)
    torch.testing.assert_close(g, g_want)
    assert km["actor/erc_frac_low"] + km["actor/erc_frac_high"] > 0
    # verl's own losses go through the hook untouched
    cfg = actor_config(calculate_entropy=True, entropy_coeff=0.0)
    torch.testing.assert_close(hooked(cfg, out, data)[0], vl.ppo_loss(cfg, out, data)[0])


def test_verl_reward_function_judges_math_and_code():
    from klear_lib.integrations.verl_reward import compute_score

    assert compute_score("math_longcot_math_verify", "<think>x</think> \\boxed{12}", "12") == 1.0
    assert compute_score("math_longcot_math_verify", "<think>x</think> \\boxed{13}", "12") == -1.0
    assert compute_score("math_longcot_math_verify", "no think at all \\boxed{12}", "12") == -0.5  # released rule
    tests = json.dumps([{"input": "2\n", "output": "4\n"}, {"input": "5\n", "output": "10\n"}])
    half = "<think>x</think>```python\nn = int(input())\nprint(4 if n == 2 else 0)\n```"
    assert compute_score("coder1_longcot", half, tests) == 0.5  # soft: the fraction of tests passed
