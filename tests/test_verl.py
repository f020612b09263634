"""klear_lib.integrations.verl against the real verl (CPU): the registered losses equal klear_lib.losses plus
α · positive_sample_loss, verl's own baselines equal ours (a second, independent implementation), split-invariant
aggregation over micro-batches and data-parallel ranks (the α term included), the hooks (entropies, fully-correct
flags, positive counts), verl's own group filter against ours on the same rewards, and the reward function; every
verl internal relied on is pinned to the verl release it was written for.

verl is installed by `make test` with `pip install --no-deps --target <venv>/verl-nodeps`, outside site-packages so
that pip neither sees nor checks it (its hydra dependency is left out: its antlr4 clashes with math-verify's build);
the few packages its loss code imports come with the `verl-test` extra. This module puts that folder on sys.path
(and on PYTHONPATH for the subprocesses it starts); KLEAR_VERL_DIR names another. Without verl these tests skip,
unless KLEAR_REQUIRE_VERL=1 (set by `make test`), where a missing verl is a failure.
"""

import functools
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

VERL_DIR = pathlib.Path(os.environ.get("KLEAR_VERL_DIR") or pathlib.Path(sys.prefix) / "verl-nodeps")
if VERL_DIR.is_dir() and str(VERL_DIR) not in sys.path:
    sys.path.append(str(VERL_DIR))  # before klear_lib.integrations.verl, which loads verl when it can find it
if importlib.util.find_spec("verl") is None:
    if os.environ.get("KLEAR_REQUIRE_VERL") == "1":
        raise RuntimeError(f"KLEAR_REQUIRE_VERL=1 but verl is not installed (neither importable nor in {VERL_DIR}; "
                           "make test installs it there)")
    pytest.skip("verl is not installed", allow_module_level=True)

import verl
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from klear_lib import losses
from klear_lib.integrations import verl as kv


@pytest.fixture(autouse=True, scope="module")
def _verl_dir_on_subprocess_path():
    """The subprocesses these tests start import verl from the same folder."""
    with pytest.MonkeyPatch.context() as mp:
        if VERL_DIR.is_dir():
            mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(VERL_DIR)])))
        yield


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


def positives(B, seed=0):
    """(B,) bool fully-correct flags with both values present."""
    pos = torch.rand(B, generator=torch.Generator().manual_seed(seed)) < 0.5
    pos[0], pos[1] = True, False
    return pos


@pytest.mark.parametrize("name", list(kv.LOSSES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_registered_losses_equal_klear_losses(name, agg, monkeypatch):
    """policy_loss = pg_loss + α · positive_loss (reference §2), against klear_lib on the same tensors."""
    monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"beta_low": 0.5, "erc_low": 0.85, "erc_high": 1.25,
                                                   "sft_alpha": 0.2}))
    old, new, adv, mask, ent, ent_old = batch(1)
    pos = positives(len(new))
    cfg = actor_config()
    fn = core_algos.get_policy_loss_fn(name)
    got, g_got, m = value_and_grad(fn, new, old, new, adv, mask, agg, cfg, entropy=ent, old_entropy=ent_old,
                                   is_positive=pos)
    klear_name, erc = kv.LOSSES[name]
    kcfg = losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, beta_low=0.5,
                                   erc_low=0.85 if erc else None, erc_high=1.25 if erc else None)

    def klear_loss(new):
        pg, metrics = losses.POLICY_LOSSES[klear_name](old, new, adv, mask, agg, kcfg, entropy=ent,
                                                         old_entropy=ent_old)
        return pg + 0.2 * losses.positive_sample_loss(new, mask, pos, loss_agg_mode=agg), metrics

    want, g_want, km = value_and_grad(klear_loss, new, new)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)
    # the α term is not zero here: without it the value differs
    pg_only, _ = losses.POLICY_LOSSES[klear_name](old, new, adv, mask, agg, kcfg, entropy=ent, old_entropy=ent_old)
    assert abs(float(got) - float(pg_only.detach())) > 1e-3
    assert m["actor/erc_frac_low"] == km["actor/erc_frac_low"]
    assert (m["actor/erc_frac_low"] + m["actor/erc_frac_high"] > 0) == erc  # the batch does trigger ERC
    assert m["actor/pg_clipfrac"] == pytest.approx(km["actor/pg_clipfrac_low"] + km["actor/pg_clipfrac_high"])


def global_counts(mask, pos):
    """What verl's engine and our train_batch hook compute for a whole mini-batch (all ranks)."""
    pos_mask = mask & pos[:, None]
    return ({"batch_num_tokens": int(mask.sum()), "global_batch_size": int(mask.shape[0])},
            {"tokens": int(pos_mask.sum()), "seqs": int((pos_mask.sum(-1) > 0).sum())})


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("dp", [1, 2])
def test_micro_batches_and_ranks_with_global_counts_add_up_to_the_whole_batch(agg, dp, monkeypatch):
    """verl splits a mini-batch over dp ranks and each rank's share into micro-batches, normalises each by the
    mini-batch's global counts and multiplies by dp; micro-batch losses add up on a rank and DP averages ranks. That
    average (value and gradient) must equal the whole mini-batch's loss, the α term included."""
    monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"sft_alpha": 0.1}))
    old, new, adv, mask, _, _ = batch(2, B=8)
    pos = positives(8, seed=2)
    fn = core_algos.get_policy_loss_fn("gppo")
    whole, g_whole, _ = value_and_grad(fn, new, old, new, adv, mask, agg, actor_config(), is_positive=pos)
    counts, totals = global_counts(mask, pos)
    cfg = actor_config()
    cfg.global_batch_info.update(dp_size=dp, **counts)
    ranks = [[slice(0, 3), slice(3, 8)]] if dp == 1 else [[slice(0, 1), slice(1, 4)], [slice(4, 6), slice(6, 8)]]
    per_rank = [sum(fn(old[s], new[s], adv[s], mask[s], agg, cfg, is_positive=pos[s], positive_totals=totals)[0]
                    for s in micro) for micro in ranks]
    total = sum(per_rank) / dp  # DDP's gradient average over ranks
    (g_total,) = torch.autograd.grad(total, new)
    torch.testing.assert_close(total.detach(), whole)
    torch.testing.assert_close(g_total, g_whole)


def test_alpha_needs_the_flags_and_the_global_counts(monkeypatch):
    old, new, adv, mask, _, _ = batch(4)
    fn = core_algos.get_policy_loss_fn("gppo")
    monkeypatch.delenv(kv.OPTIONS_ENV, raising=False)  # α defaults to Klear's 0.1
    with pytest.raises(ValueError, match="fully-correct flags"):
        fn(old, new, adv, mask, "token-mean", actor_config())
    cfg = actor_config()
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(mask))
    with pytest.raises(ValueError, match="no global count of fully-correct tokens"):
        fn(old, new, adv, mask, "token-mean", cfg, is_positive=positives(len(mask)))
    with pytest.raises(ValueError, match="supports loss_agg_mode"):
        fn(old, new, adv, mask, "seq-mean-token-sum-norm", actor_config(), is_positive=positives(len(mask)))
    # α = 0: no flags needed, and the loss is the plain policy loss
    monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"sft_alpha": 0}))
    got, _ = fn(old, new, adv, mask, "seq-mean-token-sum-norm", actor_config())
    kcfg = losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0)
    torch.testing.assert_close(got, losses.gppo_loss(old, new, adv, mask, "seq-mean-token-sum-norm", kcfg)[0])


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
    assert kv.sft_alpha() == 0.1  # Klear's α
    for bad in ("-0.1", "true", '"0.1"'):
        monkeypatch.setenv(kv.OPTIONS_ENV, f'{{"sft_alpha": {bad}}}')
        with pytest.raises(ValueError, match="sft_alpha"):
            kv.sft_alpha()


# ------------------------------------------------------------------------------------------------ the hooks
def source(module: str) -> str:
    return pathlib.Path(importlib.util.find_spec(module).origin).read_text()


def verl_file(relative: str) -> str:
    """A verl source file that cannot be imported here (it needs transfer_queue, aiohttp or uvicorn)."""
    return (pathlib.Path(verl.__file__).parent / relative).read_text()


def test_pinned_verl_internals_the_hooks_rely_on():
    """Fails when verl moves the code the hooks patch or read: then re-check install_hooks and docs/scale.md."""
    # legacy trainer (trainer.use_v1=False): it pops the rollout entropies, our patch keeps a copy
    trainer = source("verl.trainer.ppo.ray_trainer")
    assert "def _compute_old_log_prob(self, batch: DataProto):" in trainer
    assert 'result = {"old_log_probs": log_probs.float(), "entropys": entropy.float()}' in trainer
    assert "old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)" in trainer
    assert 'old_log_prob.batch.pop("entropys")' in trainer
    assert 'reward_tensor = batch.batch["rm_scores"]' in source("verl.trainer.ppo.reward")
    # V1 trainer (the default): the rollout entropies stay in the actor's batch as "entropy"
    assert "use_v1: true" in verl_file("trainer/config/ppo_trainer.yaml")
    v1 = verl_file("trainer/ppo/v1/trainer_base.py")
    assert 'data["entropy"] = response_from_nested(data.pop("entropy"), data["response_mask"])' in v1
    assert 'fields=data.select("old_log_probs", "entropy")' in v1
    # the per-token reward of a trajectory: its score on the last response token
    assert "rm_scores[-1] = reward_score" in verl_file("experimental/agent_loop/agent_loop.py")
    # the actor: ppo_loss bound by name, train_batch called once per mini-batch, global counts set before the split
    workers = verl_file("workers/engine_workers.py")
    assert "from verl.workers.utils.losses import ppo_loss" in workers
    assert "partial(ppo_loss, config=actor_config)" in workers
    assert "actor_output = self.train_batch(mini_batch_td)" in workers
    assert "def train_batch(self, data: TensorDict) -> TensorDict:" in workers
    fsdp = verl_file("workers/engine/fsdp/transformer_impl.py")
    assert fsdp.index("tu.assign_non_tensor(data, batch_num_tokens=") < fsdp.index("= prepare_micro_batches(")
    assert "loss = verl_F.masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size" in source(
        "verl.trainer.ppo.core_algos")
    from verl.workers.utils import losses as vl

    assert list(inspect.signature(vl.ppo_loss.__wrapped__ if hasattr(vl.ppo_loss, "__wrapped__") else vl.ppo_loss)
                .parameters) == ["config", "model_output", "data", "dp_group"]
    ppo_src = source("verl.workers.utils.losses")
    assert 'entropy = model_output.get("entropy", None)' in ppo_src
    assert 'config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]' in ppo_src
    assert "policy_loss_fn(\n        old_log_prob=old_log_prob," in ppo_src


def test_pinned_verl_group_filtering():
    """What docs/scale.md says about verl 0.9.1's dynamic sampling (algorithm.filter_groups, V1 trainer only)."""
    reward_loop = verl_file("experimental/reward_loop/reward_manager/naive.py")
    assert "for key, value in result.items():\n                reward_extra_info[key] = value" in reward_loop
    assert 'reward_extra_info["acc"] = score' in reward_loop  # a float return would make acc the raw score
    assert "await self.loop.run_in_executor(" in reward_loop  # compute_score runs in a thread
    buffer = verl_file("trainer/ppo/v1/replay_buffer.py")
    assert "refill_credit += 2 * dapo_count + failed_count" in buffer
    assert "max_inflight_prompts = self.max_inflight_gen_batches * self.train_batch_size" in buffer
    assert "surplus_uids = sampleable_keys - set(selected_prompt_uids)" in buffer
    v1 = verl_file("trainer/ppo/v1/trainer_base.py")
    assert "max_num_gen_batches=%s is ignored by the built-in V1 ReplayBuffer" in v1
    assert "self.config.data.gen_batch_size = 1" in v1
    assert "filter_groups" not in source("verl.trainer.ppo.ray_trainer")  # the legacy trainer does not filter


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


def rm_scores(mask, pos):
    """verl's per-token reward: the score (1 if fully correct, else -1) on each response's last token, (B, T)."""
    last = mask.long().sum(-1) - 1  # (B,)
    out = torch.zeros(mask.shape)
    out[torch.arange(len(mask)), last] = torch.where(pos, 1.0, -1.0)
    return out


def legacy_actor_inputs(old, new, adv, mask, ent, ent_old, pos, P=3):
    """The TensorDict and model output the legacy trainer's actor hands ppo_loss: dense prompts/responses without
    padding in the attention mask, flat per-token model outputs shifted by one position, our old_entropys copy."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    B, T = new.shape
    data = TensorDict({"prompts": torch.ones(B, P, dtype=torch.long), "responses": torch.ones(B, T, dtype=torch.long),
                       "attention_mask": torch.ones(B, P + T, dtype=torch.long), "response_mask": mask.long(),
                       "old_log_probs": old, "advantages": adv, "old_entropys": ent_old,
                       "rm_scores": rm_scores(mask, pos)}, batch_size=[B])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)

    def flat(x):
        out = torch.zeros(B, P + T, dtype=x.dtype)
        out = out.index_put((torch.arange(B)[:, None], torch.arange(P - 1, P - 1 + T)[None, :]), x)
        return out.reshape(-1)

    return data, {"log_probs": flat(new), "entropy": flat(ent)}


def klear_erc_cfg():
    return losses.PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, erc_low=0.8,
                                   erc_high=1.2)


def unhooked_ppo_loss():
    from verl.workers.utils import losses as vl

    return vl.ppo_loss.__wrapped__ if hasattr(vl.ppo_loss, "__wrapped__") else vl.ppo_loss


def test_hooked_ppo_loss_gives_the_klear_loss_entropies_and_flags_legacy_batch(monkeypatch):
    from verl.workers.utils import losses as vl

    monkeypatch.delenv(kv.OPTIONS_ENV, raising=False)  # ERC 0.8/1.2, α 0.1
    old, new, adv, mask, ent, ent_old = batch(5)
    pos = positives(len(new), seed=5)
    data, out = legacy_actor_inputs(old.detach(), new, adv, mask, ent, ent_old, pos)
    cfg = actor_config(calculate_entropy=True, entropy_coeff=0.0, policy_loss=PolicyLossConfig(loss_mode="gppo_erc"))
    loss, metrics = kv.hooked_ppo_loss(unhooked_ppo_loss())(cfg, out, data)
    (g,) = torch.autograd.grad(loss, new)

    def klear_loss(new):
        pg, m = losses.gppo_loss(old, new, adv, mask, "token-mean", klear_erc_cfg(), entropy=ent, old_entropy=ent_old)
        return pg + 0.1 * losses.positive_sample_loss(new, mask, pos), m

    want, g_want, km = value_and_grad(klear_loss, new, new)
    torch.testing.assert_close(loss.detach(), want)
    torch.testing.assert_close(g, g_want)
    assert km["actor/erc_frac_low"] + km["actor/erc_frac_high"] > 0
    assert metrics["klear/positive_frac"].aggregate() == pytest.approx(float(pos.float().mean()))
    # verl's own losses go through the hook untouched
    cfg = actor_config(calculate_entropy=True, entropy_coeff=0.0)
    hooked = kv.hooked_ppo_loss(unhooked_ppo_loss())
    torch.testing.assert_close(hooked(cfg, out, data)[0], vl.ppo_loss(cfg, out, data)[0])


def jagged(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def v1_minibatch(old, adv, mask, ent_old, pos, P):
    """An actor mini-batch as verl 0.9.1's V1 trainer builds it from its store: jagged per-response fields, the
    rollout entropies under "entropy", the per-token reward under "rm_scores"."""
    from tensordict import TensorDict

    T = mask.long().sum(-1).tolist()
    rm = rm_scores(mask, pos)
    return TensorDict({
        "prompts": jagged([torch.ones(p, dtype=torch.long) for p in P]),
        "responses": jagged([torch.ones(t, dtype=torch.long) for t in T]),
        "response_mask": jagged([torch.ones(t, dtype=torch.long) for t in T]),
        "loss_mask": jagged([torch.ones(t, dtype=torch.long) for t in T]),
        "old_log_probs": jagged([old[i, :t] for i, t in enumerate(T)]),
        "advantages": jagged([adv[i, :t] for i, t in enumerate(T)]),
        "entropy": jagged([ent_old[i, :t] for i, t in enumerate(T)]),
        "rm_scores": jagged([rm[i, :t] for i, t in enumerate(T)]),
    }, batch_size=[len(T)])


def v1_model_output(x, mask, P, rows):
    """A per-token model output of `rows`, flat over prompt + response tokens, shifted by one as verl's is."""
    parts = []
    for i in rows:
        t = int(mask[i].sum())
        parts += [torch.zeros(P[i] - 1), x[i, :t], torch.zeros(1)]
    return torch.cat(parts)


def test_v1_actor_path_adds_up_to_the_whole_batch_loss(monkeypatch):
    """The V1 actor path in miniature: train_batch (hooked: positive counts) -> the engine's global token count and
    micro-batch split -> the hooked ppo_loss per micro-batch, summed. Equals GPPO+ERC + α · positive_sample_loss on
    the whole mini-batch in value and gradient; the rollout entropies come from V1's "entropy" field."""
    from verl.utils import tensordict_utils as tu

    monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"sft_alpha": 0.3}))
    old, new, adv, mask, ent, ent_old = batch(6, B=6)
    pos = positives(6, seed=6)
    P = [3, 2, 4, 2, 3, 5]
    cfg = actor_config(calculate_entropy=True, entropy_coeff=0.0, policy_loss=PolicyLossConfig(loss_mode="gppo_erc"))
    ppo_loss = functools.partial(kv.hooked_ppo_loss(unhooked_ppo_loss()), config=cfg)

    class Worker:  # verl's TrainingWorker, reduced to what train_batch does with a mini-batch on one rank
        loss_fn = ppo_loss
        engine = types.SimpleNamespace(get_data_parallel_group=lambda: None)

        def train_batch(self, data):
            tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(data["loss_mask"].values().sum()),
                                 global_batch_size=len(data))
            total, start = 0, 0
            for micro in tu.chunk_tensordict(data, 2):
                rows = range(start, start + len(micro))
                start += len(micro)
                out = {"log_probs": v1_model_output(new, mask, P, rows), "entropy": v1_model_output(ent, mask, P, rows)}
                total = total + self.loss_fn(model_output=out, data=micro)[0]
            return total

    Worker.train_batch = kv.hooked_train_batch(Worker.train_batch)
    total = Worker().train_batch(v1_minibatch(old, adv, mask, ent_old, pos, P))
    (g,) = torch.autograd.grad(total, new)

    def klear_loss(new):
        pg, m = losses.gppo_loss(old, new, adv, mask, "token-mean", klear_erc_cfg(), entropy=ent, old_entropy=ent_old)
        return pg + 0.3 * losses.positive_sample_loss(new, mask, pos), m

    want, g_want, km = value_and_grad(klear_loss, new, new)
    assert km["actor/erc_frac_low"] + km["actor/erc_frac_high"] > 0
    torch.testing.assert_close(total.detach(), want)
    torch.testing.assert_close(g, g_want)


def test_positive_counts_are_summed_over_the_data_parallel_group(monkeypatch):
    old, new, adv, mask, _, ent_old = batch(7)
    pos = positives(len(new), seed=7)
    data = v1_minibatch(old, adv, mask, ent_old, pos, [2] * len(new))
    local = {"tokens": int(mask[pos].sum()), "seqs": int(pos.sum())}
    assert kv.positive_totals(data) == local  # no process group: this rank's counts
    calls = []

    def all_reduce(t, op, group):  # as if a second rank held the same counts
        calls.append(group)
        t.mul_(2)

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    monkeypatch.setattr("verl.utils.device.get_device_id", lambda: "cpu")
    assert kv.positive_totals(data, dp_group="dp") == {"tokens": 2 * local["tokens"], "seqs": 2 * local["seqs"]}
    assert calls == ["dp"]


def test_train_batch_hook_counts_only_for_klear_losses_with_alpha(monkeypatch):
    from verl.utils import tensordict_utils as tu

    seen = []

    class Worker:
        engine = types.SimpleNamespace(get_data_parallel_group=lambda: None)

        def train_batch(self, data):
            seen.append(tu.get_non_tensor_data(data, kv.POSITIVE_TOKENS_KEY, None))

    Worker.train_batch = kv.hooked_train_batch(Worker.train_batch)
    old, new, adv, mask, _, ent_old = batch(8)
    pos = positives(len(new), seed=8)
    w = Worker()
    for mode, alpha in (("gppo", 0.1), ("gppo", 0.0), ("vanilla", 0.1)):
        monkeypatch.setenv(kv.OPTIONS_ENV, json.dumps({"sft_alpha": alpha}))
        w.loss_fn = functools.partial(print, config=actor_config(policy_loss=PolicyLossConfig(loss_mode=mode)))
        w.train_batch(v1_minibatch(old, adv, mask, ent_old, pos, [2] * len(new)))
    assert seen == [int(mask[pos].sum()), None, None]


# ------------------------------------------------------------------------------------ group filter and reward
def load_verl_replay_buffer(monkeypatch):
    """verl 0.9.1's V1 ReplayBuffer module with a dict standing in for its TransferQueue store (not installed
    here): what is exercised is verl's own group classification, ``ReplayBuffer._dapo_filtered_keys``."""
    store = {}
    tq = types.ModuleType("transfer_queue")
    tq.KVBatchMeta = type("KVBatchMeta", (), {})
    tq.kv_batch_get = lambda keys, partition_id, select_fields: {
        f: [store[k][f] for k in keys] for f in select_fields}
    monkeypatch.setitem(sys.modules, "transfer_queue", tq)
    path = pathlib.Path(verl.__file__).parent / "trainer/ppo/v1/replay_buffer.py"
    spec = importlib.util.spec_from_file_location("_verl_v1_replay_buffer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, store


def test_verl_filter_groups_with_our_reward_keys_is_klears_and_dapos_rule(monkeypatch):
    """Rewards -> our compute_score's dict -> verl's reward_extra_info -> verl's group filter, against
    zero_advantage_group_mask on the same rewards: metric=acc keeps Klear's groups, metric=score and verl's
    canonical metric=reward keep DAPO's."""
    from klear_lib.advantages import zero_advantage_group_mask
    from klear_lib.integrations import verl_reward

    n = 4
    groups = [[1, 1, 1, 1], [-1, -1, -1, -1], [1, -1, -1, -0.5], [0.5, 0.25, 0.5, 0.5], [1, 0.75, 1, 1],
              [-0.5, -2, -1, -1], [0.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]
    g = torch.Generator().manual_seed(0)
    values = torch.tensor([1.0, -1.0, -0.5, 0.5, 0.25])
    groups += values[torch.randint(0, 5, (24, n), generator=g)].tolist()
    rewards = torch.tensor(groups).reshape(-1)  # (G·n,)
    scores = iter(rewards.tolist())
    monkeypatch.setattr(verl_reward, "_score", lambda *a: next(scores))
    module, store = load_verl_replay_buffer(monkeypatch)
    for j in range(len(groups)):
        for i in range(n):
            result = verl_reward.compute_score("math", "", "")
            rm = torch.zeros(5)
            rm[-1] = result["score"]  # verl's rm_scores: the score on the last token
            store[f"g{j}_{i}_0"] = {"extra_fields": {"reward_extra_info": result}, "rm_scores": rm}
    for metric, rule in (("acc", "klear"), ("score", "dapo"), ("reward", "dapo")):
        buffer = module.ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                                     max_off_policy_strategy="drop", sampler_kwargs={}, refill_fn=lambda k: None,
                                     filter_groups_metric=metric, train_batch_size=4, gen_batch_size=1)
        buffer.finished_keys["train"] = {f"g{j}" for j in range(len(groups))}
        buffer.partitions["train"] = {key: {} for key in store}
        dropped, _ = buffer._dapo_filtered_keys("train")
        kept = [f"g{j}" not in dropped for j in range(len(groups))]
        want = zero_advantage_group_mask(rewards, n, rule=rule)[::n].tolist()
        assert kept == want, metric
    # the hand-made groups: Klear keeps mixed correct/incorrect only; DAPO also keeps partial and format scores
    assert zero_advantage_group_mask(rewards, n, rule="klear")[:8 * n:n].tolist() == [0, 0, 1, 0, 1, 0, 1, 0]
    assert zero_advantage_group_mask(rewards, n, rule="dapo")[:8 * n:n].tolist() == [0, 0, 1, 1, 1, 1, 1, 0]


def test_verl_reward_function_judges_math_and_code():
    from klear_lib.integrations.verl_reward import compute_score

    think = "<think>x</think> \\boxed{%s}"
    assert compute_score("math_longcot_math_verify", think % 12, "12") == {"score": 1.0, "acc": 1.0}
    assert compute_score("math_longcot_math_verify", think % 13, "12") == {"score": -1.0, "acc": 0.0}
    # released format rule: no </think> scores -0.5
    assert compute_score("math_longcot_math_verify", "no think \\boxed{12}", "12") == {"score": -0.5, "acc": 0.0}
    tests = json.dumps([{"input": "2\n", "output": "4\n"}, {"input": "5\n", "output": "10\n"}])
    half = "<think>x</think>```python\nn = int(input())\nprint(4 if n == 2 else 0)\n```"
    assert compute_score("coder1_longcot", half, tests) == {"score": 0.5, "acc": 0.0}  # soft: fraction passed
    full = "<think>x</think>```python\nprint(2 * int(input()))\n```"
    assert compute_score("coder1_longcot", full, tests) == {"score": 1.0, "acc": 1.0}


def test_verl_reward_function_grades_math_off_the_main_thread():
    """verl's reward loop calls compute_score from a thread pool, where math-verify's SIGALRM timeouts do not work:
    math then goes through the process pool."""
    import concurrent.futures as cf

    from klear_lib.integrations import verl_reward

    think = "<think>x</think> \\boxed{%s}"
    try:
        with cf.ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda a: verl_reward.compute_score("math_longcot_math_verify", think % a, "12"),
                              ["12", "13", "\\frac{24}{2}"]))
    finally:
        verl_reward.close_pool()
    assert [r["score"] for r in got] == [1.0, -1.0, 1.0]
    assert [r["acc"] for r in got] == [1.0, 0.0, 1.0]


def test_every_override_of_the_launch_script_is_a_verl_config_key():
    """hydra rejects an override of a key its config lacks (without `+`): check scripts/verl_klear.sh's keys against
    verl 0.9.1's composed trainer config, so a typo fails here and not on a GPU cluster."""
    import re

    from omegaconf import OmegaConf

    config = OmegaConf.to_container(OmegaConf.load(pathlib.Path(verl.__file__).parent /
                                                   "trainer/config/_generated_ppo_trainer.yaml"), resolve=False)
    script = (pathlib.Path(__file__).parents[1] / "scripts/verl_klear.sh").read_text()
    keys = set(re.findall(r"[\s(]((?:algorithm|trainer|data|actor_rollout_ref|reward)\.[a-z_0-9.]+)=", script))
    assert {"algorithm.filter_groups.metric", "algorithm.filter_groups.enable", "trainer.use_v1",
            "data.train_batch_size", "actor_rollout_ref.actor.policy_loss.loss_mode"} <= keys

    def has(path):
        node = config
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert sorted(k for k in keys if not has(k)) == []
    assert "klear) FILTER_ARGS=(algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc" in script
    assert "algorithm.filter_groups.metric=score" in script


def _dry_run(env: dict) -> subprocess.CompletedProcess:
    """scripts/verl_klear.sh with DRY_RUN=1: verl's command line, one argument a line; nothing runs."""
    script = pathlib.Path(__file__).parents[1] / "scripts/verl_klear.sh"
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "GPUS_PER_NODE", "ROLLOUT_TP")}
    base.update(PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                PY=sys.executable, DRY_RUN="1", SFT_MODEL="/models/sft",
                PYTHONPATH=os.pathsep.join([str(pathlib.Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(["bash", str(script), "trainer.total_epochs=1"], env={**base, **env}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("gpus, tp", [("1", "1"), ("2", "2"), ("3", "1"), ("8", "2")])
def test_launch_script_sizes_tensor_parallel_from_the_gpus(gpus, tp):
    """One node with one GPU as well as many: vLLM's tensor-parallel size is the largest divisor of the node's GPU
    count up to ROLLOUT_TP (default 2), never more than the GPUs present; the dry run's every key is verl's."""
    from omegaconf import OmegaConf

    proc = _dry_run({"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(int(gpus)))})
    assert proc.returncode == 0, proc.stderr
    argv = proc.stdout.splitlines()
    assert argv[:3] == [sys.executable, "-m", "verl.trainer.main_ppo"]
    args = dict(a.split("=", 1) for a in argv[3:])
    assert args["actor_rollout_ref.rollout.tensor_model_parallel_size"] == tp
    assert args["trainer.n_gpus_per_node"] == gpus and args["trainer.nnodes"] == "1"
    assert args["trainer.total_epochs"] == "1"  # extra arguments reach verl
    config = OmegaConf.to_container(OmegaConf.load(pathlib.Path(verl.__file__).parent /
                                                   "trainer/config/_generated_ppo_trainer.yaml"), resolve=False)

    def has(path):  # a key of verl's config (its value may be a mandatory "???")
        node = config
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert [k for k in args if not has(k)] == []


def test_launch_script_refuses_more_parallelism_than_gpus():
    proc = _dry_run({"CUDA_VISIBLE_DEVICES": "0", "GPUS_PER_NODE": "2"})
    assert proc.returncode == 2 and "GPUS_PER_NODE=2 but this node has 1 GPU(s)" in proc.stderr
    proc = _dry_run({"GPUS_PER_NODE": "2", "ROLLOUT_TP": "4"})
    assert proc.returncode == 2 and "ROLLOUT_TP=4 must be between 1 and GPUS_PER_NODE=2" in proc.stderr
    assert _dry_run({"GPUS_PER_NODE": "4", "ROLLOUT_TP": "4"}).stdout.count("tensor_model_parallel_size=4") == 1
