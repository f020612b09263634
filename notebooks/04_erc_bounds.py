# %% [markdown]
# # 04 · Entropy Ratio Clipping: does ERC stabilise RL, and is it the entropy criterion that does it?
#
# ERC (arXiv 2512.05591; `docs/reference.md` §3) stops the gradient of a response token when the entropy of the
# current policy's next-token distribution has moved too far from the rollout policy's:
#
# $$ \rho_t = \frac{H_t(\pi_\theta) + 10^{-8}}{H_t(\pi_{\text{old}}) + 10^{-8}}, \qquad
# \text{token } t \text{ keeps its gradient iff } \rho_t \in (\beta_{\text{low}}, \beta_{\text{high}}) $$
#
# The stopped tokens keep their loss value and their place in the token-mean denominator. The paper reports that
# ERC stabilises entropy and gradient norms and improves accuracy, on DAPO (clip 0.2/0.28) and on GPPO (0.2/0.2),
# with bounds (0.8, 1.2) in its config and (0.95, 1.05) in its scripts; a third-party summary adds that ERC stops
# about 20% of tokens, mostly low-entropy ones, where PPO-clip clips about 0.02%.
#
# **Why controls.** Stopping the gradient of some tokens while keeping them in the denominator shrinks the update
# whatever the criterion: the gradient norm and its fluctuation fall with the stopped fraction alone. So ERC is
# compared not only with DAPO but with **DAPO plus a random token mask at the fraction ERC stopped** (the control
# for "fewer gradients") and with **DAPO at half the learning rate** (the control for "smaller steps"). A claim
# that ERC stabilises training survives only if ERC beats those too. And a stabiliser needs something unstable:
# the baseline here runs at a learning rate where DAPO without ERC loses accuracy it had (notebook 03's start, a
# learning rate 2.8× 03's first, 8 off-policy updates per rollout).
#
# **Read-outs** (per seed, then paired differences with bootstrap intervals): the coefficient of variation of the
# gradient norm (std/mean over steps: a scale-free fluctuation, not the raw spread that shrinks with the norm), the
# largest rollout-to-rollout change of the mean entropy, the collapse rate (held-out accuracy ending below the
# start, or the entropy rising above `collapse_entropy_factor` × its first value), final and area-under-curve
# held-out accuracy.
#
# **A noise-floor probe.** The paper computes old entropies in its inference engine and new ones in training, in
# bf16; two passes that disagree by rounding give ρ ≠ 1 with no policy change at all. The probe measures, on one
# on-policy batch, what ERC would stop when the old entropies come from a bf16 pass or a differently chunked fp32
# pass. This project computes both in fp32 with the same code, so it has no such floor; the probe says how much
# of a "≈20% of tokens" such noise could be on this model.
#
# **What the tiny stand-in can and cannot show.** It can show whether ERC's criterion adds anything over random
# masking and a smaller step when training wobbles, on a 1M-parameter model. It cannot show the paper's entropy
# dynamics over thousands of steps of a 7B model, nor bf16 noise of a large model (whose logits are far less exact
# than this one's).

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `tiny` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
variants = "dapo,dapo_erc_0.8_1.2,dapo_erc_0.95_1.05,dapo_random_mask,dapo_half_lr,gppo,gppo_erc_0.8_1.2"
random_mask_matches = "dapo_erc_0.95_1.05"     # the ERC arm whose stopped fraction the random mask copies
seeds = "0,1,2,3"
model = "tiny"
n_train = 6000
n_heldout = 128
levels = "1,2,3,4"
sft_lr = 2e-3
sft_epochs = 2.0
sft_batch_size = 32
fork_facts = "2+3->6,5+1->7,7+2->8,9+3->1"
fork_wrong_rate = 0.8
rollouts = 6
rollout_prompts = 8
mini_batch_prompts = 1                         # 8 off-policy updates per rollout
oversample_factor = 2.0
max_gen_batches = 1
num_generations = 8
max_completion_length = 56
rl_lr = 1.4e-4                                 # high enough that DAPO alone collapses in some seeds (03: 5e-5, 1e-4)
eval_every = 2
eval_n = 4
eval_temperature = 0.6
collapse_entropy_factor = 3.0                  # an entropy above this × its first step's value counts as a collapse
probe_prompts = 32                             # the noise-floor probe's prompts, 4 completions each
workers = 2
report_to = "none"                             # or tensorboard / trackio / wandb (installed): <run dir>/tracking
use_vllm = False
use_cpu = True
bf16 = False

# %% [markdown]
# ## Configuration
# Every arm is a diff against one base config: the loss and its clip range, the ERC bounds, the random mask, or the
# learning rate.

# %% tags=["config"]
import time

import pandas as pd
from IPython.display import display

from klear_lib import claims, experiment, glossary, mechanism, notebook, plots, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.losses import ENTROPY_BUCKETS
from klear_lib.train.sft import arithmetic_warm_start

notebook.quiet()
notebook.require(globals(), counts=("probe_prompts", "workers"), positive=("collapse_entropy_factor",))
DAPO = dict(loss_name="ppo_clip", clip_ratio_low=0.2, clip_ratio_high=0.28)
GPPO = dict(loss_name="gppo", clip_ratio_low=0.2, clip_ratio_high=0.2)  # the ERC paper's GPPO setting
ARMS = {
    "dapo": dict(DAPO),
    "dapo_erc_0.8_1.2": dict(DAPO, erc_low=0.8, erc_high=1.2),
    "dapo_erc_0.95_1.05": dict(DAPO, erc_low=0.95, erc_high=1.05),
    "dapo_random_mask": dict(DAPO),  # random_stop_frac is set from the matched ERC arm's measured fraction
    "dapo_half_lr": dict(DAPO, rl_lr=rl_lr / 2),
    "gppo": dict(GPPO),
    "gppo_erc_0.8_1.2": dict(GPPO, erc_low=0.8, erc_high=1.2),
}
arm_list = notebook.parse_list(variants, "variants", allowed=ARMS)
if "dapo" not in arm_list:
    raise ValueError(f"variants = {variants!r}: dapo is the baseline every claim compares against")
if "dapo_random_mask" in arm_list and random_mask_matches not in arm_list:
    raise ValueError(f"random_mask_matches = {random_mask_matches!r} must be one of the ERC arms in variants")
seed_list = notebook.parse_list(seeds, "seeds", int)
base = notebook.config_from(RLExperimentConfig, globals(), sft_alpha=0.0)
configs = {a: base.replace(**ARMS[a]) for a in arm_list}  # validates every arm
run_path = notebook.start_run("04_erc_bounds", run_dir, params=globals(), config={
    "base": base, "arms": {a: ARMS[a] for a in arm_list}, "seeds": seed_list,
    "random_mask_matches": random_mask_matches,
    "collapse_entropy_factor": collapse_entropy_factor, "probe_prompts": probe_prompts, "workers": workers})
print(f"run dir: {run_path}")
print(f"{len(arm_list)} arms x {len(seed_list)} seeds; {base.rollouts} rollouts of up to {base.updates_per_rollout} "
      f"updates, lr {base.rl_lr:g}")

# %% [markdown]
# ## SFT warm start (shared with notebooks 03, 06 and 07; cached)

# %%
ws = arithmetic_warm_start(base, run_path / "sft", cache_root=run_path.parent.parent / ".cache")
start = ws.start

# %% [markdown]
# ## Noise-floor probe: what ERC would stop with no policy change
# One on-policy batch of the SFT model; current entropies from an fp32 pass, "old" ones from the same pass, a
# differently chunked fp32 pass, and a bf16 pass. Stopped fraction per old-entropy bucket (nats).

# %%
probe_batch = [tasks.prompt_messages(p) for p in ws.heldout[:probe_prompts]]
floor = mechanism.erc_noise_floor(ws.model, ws.tokenizer, probe_batch, n=4, temperature=base.temperature,
                                  max_new_tokens=base.max_completion_length)
floor_table = floor.pivot_table(index=["old entropies from", "bucket"], columns="bounds", values="stopped_frac",
                                sort=False)
display((100 * floor_table).round(3))
print("token share by bucket:", floor[floor["old entropies from"] == "bf16 pass"].drop_duplicates("bucket")
      .set_index("bucket")["token_share"].round(3).to_dict())

# %% [markdown]
# ## RL: every arm × every seed
# The ERC arms run first; the random-mask arm then stops, at random, the mean fraction of tokens that its matched
# ERC arm stopped.

# %%
def job(arm, cfg, seed):
    return experiment.Job(f"{arm}/seed={seed}", "klear_lib.train.rl_jobs:rl_unit", {
        "config": {**vars(cfg.replace(seed=seed))}, "start": str(ws.sft_dir),
        "tags": {"variant": arm, "seed": seed}})


clock = time.perf_counter()
first = [a for a in arm_list if a != "dapo_random_mask"]
jobs = [job(a, configs[a], s) for a in first for s in seed_list]
experiment.run_jobs(jobs, run_path, workers=workers)
matched_frac = None
if "dapo_random_mask" in arm_list:
    df = plots.metrics_frame(run_path)
    steps = df[df["variant"] == random_mask_matches].dropna(subset=["actor/pg_loss"])
    matched_frac = float((steps["actor/erc_frac_low"] + steps["actor/erc_frac_high"]).mean())
    print(f"{random_mask_matches} stopped {100 * matched_frac:.2f}% of response tokens: the random mask stops as many")
    configs["dapo_random_mask"] = configs["dapo_random_mask"].replace(random_stop_frac=round(matched_frac, 6))
    jobs += [job("dapo_random_mask", configs["dapo_random_mask"], s) for s in seed_list]
    experiment.run_jobs(jobs, run_path, workers=workers)  # the done units are not run again
print(f"{len(jobs)} runs in {time.perf_counter() - clock:.0f}s")
df = plots.metrics_frame(run_path)
steps = df.dropna(subset=["actor/pg_loss"]).copy()
random_stop = steps["actor/random_stop_frac"].fillna(0.0) if "actor/random_stop_frac" in steps else 0.0
steps["stopped_frac"] = steps["actor/erc_frac_low"] + steps["actor/erc_frac_high"] + random_stop
steps["clip_frac"] = steps["actor/pg_clipfrac_low"] + steps["actor/pg_clipfrac_high"]

# %% [markdown]
# ## What happened
# Held-out accuracy (T 0.6), entropy, gradient norm, the stopped fraction (ERC or random) against PPO-clip's clip
# fraction, and the spread of the entropy ratio. Mean over seeds, ±1 std.

# %%
fig = plots.plot_curves(df, ["eval/avg_at_n", "eval/avg_at_n_fork", "eval/avg_at_n_rest", "entropy", "grad_norm",
                             "klear/p_correct_fork"], out=run_path / "figures" / "erc_training.png",
                        title="ERC and its controls (mean ± std over seeds)")
fig = plots.plot_curves(steps, ["stopped_frac", "clip_frac", "erc/ratio_p05", "erc/ratio_p95"],
                        out=run_path / "figures" / "erc_stopped.png", ncols=4,
                        title="What is stopped or clipped per step (mean ± std over seeds)")

# %% [markdown]
# ## Which tokens does ERC stop? By the rollout policy's entropy
# Share of the tokens of each old-entropy bucket that ERC stopped (the paper's summary: mostly low-entropy ones).

# %%
buckets = [b for b, *_ in ENTROPY_BUCKETS]
erc_arms = [a for a in arm_list if "erc" in a]
by_bucket = steps[steps["variant"].isin(erc_arms)].groupby("variant", sort=False)[
    [f"erc/masked_frac_{b}" for b in buckets] + [f"erc/token_share_{b}" for b in buckets]].mean()
display((100 * by_bucket).round(2))

# %% [markdown]
# ## Read-outs per seed, and the claims

# %%
ev = df.dropna(subset=["eval/avg_at_n"])
per_run = []
for (arm, seed), g in steps.groupby(["variant", "seed"]):
    e = ev[(ev["variant"] == arm) & (ev["seed"] == seed)].sort_values("rollout")
    ent_by_rollout = g.groupby("rollout")["entropy"].mean()
    gn = g["grad_norm"]
    row = {"variant": arm, "seed": seed,
           "grad_norm_cv": float(gn.std() / gn.mean()),
           "max_entropy_jump": float(ent_by_rollout.diff().abs().max()) if len(ent_by_rollout) > 1 else 0.0,
           "entropy_spike": bool(g["entropy"].max()
                                 > collapse_entropy_factor * g.sort_values("step")["entropy"].iloc[0]),
           "auc": claims.area_under_curve(e["rollout"], e["eval/avg_at_n"]),
           "final": float(e["eval/avg_at_n"].iloc[-1]), "start": float(e["eval/avg_at_n"].iloc[0]),
           "stopped_frac": float(g["stopped_frac"].mean()), "clip_frac": float(g["clip_frac"].mean()),
           "low_minus_high_stopped": float(g["erc/masked_frac_low"].mean() - g["erc/masked_frac_high"].mean())}
    row["collapsed"] = row["final"] < row["start"] or row["entropy_spike"]
    per_run.append(row)
per_run = pd.DataFrame(per_run)
summary_table = per_run.groupby("variant", sort=False).agg(
    collapse_rate=("collapsed", "mean"), grad_norm_cv=("grad_norm_cv", "mean"),
    max_entropy_jump=("max_entropy_jump", "mean"), final=("final", "mean"), auc=("auc", "mean"),
    stopped_pct=("stopped_frac", lambda x: 100 * x.mean()), clip_pct=("clip_frac", lambda x: 100 * x.mean()),
    seeds=("seed", "nunique")).reindex(arm_list)
display(summary_table.round(4))


def by_seed(arm, col):
    g = per_run[per_run["variant"] == arm]
    return dict(zip(g["seed"], g[col].astype(float)))


claim_list = []
SRC = "ERC paper (arXiv 2512.05591)"


def add(cid, claim, metric, a, b, col, direction):
    if a in arm_list and b in arm_list:
        claim_list.append(claims.paired_claim(cid, claim, SRC, f"{metric}, {a} - {b}", by_seed(a, col), by_seed(b, col),
                                              direction=direction))


add("erc_vs_dapo.grad_norm_cv", "ERC stabilises the gradient norm", "coefficient of variation of the gradient norm",
    "dapo_erc_0.8_1.2", "dapo", "grad_norm_cv", -1)
add("erc_vs_dapo.entropy_jump", "ERC stabilises entropy", "largest rollout-to-rollout change of mean entropy",
    "dapo_erc_0.8_1.2", "dapo", "max_entropy_jump", -1)
add("erc_vs_dapo.auc", "ERC improves accuracy", "area under the held-out accuracy curve",
    "dapo_erc_0.8_1.2", "dapo", "auc", 1)
add("erc_vs_random_mask.grad_norm_cv", "ERC's entropy criterion, not the number of stopped tokens, stabilises",
    "coefficient of variation of the gradient norm", random_mask_matches, "dapo_random_mask", "grad_norm_cv", -1)
add("erc_vs_random_mask.auc", "ERC's entropy criterion, not the number of stopped tokens, helps accuracy",
    "area under the held-out accuracy curve", random_mask_matches, "dapo_random_mask", "auc", 1)
add("erc_vs_half_lr.auc", "ERC does more than a smaller step", "area under the held-out accuracy curve",
    "dapo_erc_0.8_1.2", "dapo_half_lr", "auc", 1)
add("erc_on_gppo.auc", "ERC improves GPPO too", "area under the held-out accuracy curve", "gppo_erc_0.8_1.2", "gppo",
    "auc", 1)
if "dapo_erc_0.95_1.05" in arm_list:
    g = per_run[per_run["variant"] == "dapo_erc_0.95_1.05"]
    mean, lo, hi = claims.paired_bootstrap(g["low_minus_high_stopped"].tolist())
    claim_list.append({"id": "erc_stops_low_entropy_tokens", "claim": "ERC stops mostly low-entropy tokens",
                       "source": "a third-party summary of the ERC paper",
                       "metric": "stopped share of low-entropy tokens (H_old < 0.1) - of high-entropy ones "
                                 "(H_old >= 1), "
                                 "dapo_erc_0.95_1.05",
                       "effect": mean, "ci_low": lo, "ci_high": hi, "seeds": len(g), "direction": 1,
                       "verdict": claims.verdict(lo, hi, 1)})
display(pd.DataFrame(claim_list)[["id", "metric", "effect", "ci_low", "ci_high", "seeds", "verdict"]].round(4))

# %% [markdown]
# ## Beside the paper

# %%
summary = {
    "sft_start": start,
    "noise_floor": floor.to_dict(orient="records"),
    "random_mask_frac": matched_frac,
    "per_run": per_run.to_dict(orient="records"),
    "arms": summary_table.reset_index().to_dict(orient="records"),
    "figures": ["figures/erc_training.png", "figures/erc_stopped.png"],
    "claims": claim_list,
    "beside_paper": {
        "caption": "ERC beside its controls (ours: mean over seeds; accuracy = held-out avg@n at T 0.6, %)",
        "columns": ["arm", "paper", "ours: collapse rate", "ours: grad-norm CV", "ours: largest entropy jump",
                    "ours: final", "ours: AUC", "ours: stopped %", "seeds"],
        "rows": [[a, {"dapo": "baseline: entropy and gradient norm fluctuate",
                      "dapo_erc_0.8_1.2": "stable entropy and gradient norm, higher accuracy",
                      "dapo_erc_0.95_1.05": "the scripts' bounds; ≈20% of tokens stopped",
                      "gppo_erc_0.8_1.2": "ERC helps on GPPO too"}.get(a, "(a control; not in the paper)"),
                  round(r["collapse_rate"], 2), round(r["grad_norm_cv"], 3), round(r["max_entropy_jump"], 4),
                  round(100 * r["final"], 1), round(100 * r["auc"], 1), round(r["stopped_pct"], 2), int(r["seeds"])]
                 for a, r in summary_table.iterrows()],
        "note": "Controls: a random mask at ERC's stopped fraction, and half the learning rate. A claim that ERC "
                "stabilises training holds here only if ERC beats them too (see the claims table).",
    },
}
notebook.write_summary(run_path, summary)

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine and preset (nbval compares it).
print("run-dir contract complete:", not runs.check_run_dir(run_path))
print("every requested arm and seed ran:", len(per_run) == len(arm_list) * len(seed_list))
updates = steps[(steps["actor/response_tokens"] > 0) & (steps["grad_norm"] > 0)].groupby(["variant", "seed"]).size()
print("every run made an update with a non-zero gradient on response tokens:", len(updates) == len(per_run))
print("without ERC or a mask nothing is stopped:",
      bool((steps[steps["variant"].isin(["dapo", "dapo_half_lr", "gppo"])]["stopped_frac"] == 0).all()))
masked = per_run[per_run["variant"] == "dapo_random_mask"]["stopped_frac"]
print("the random mask stops about the matched fraction:",
      matched_frac is None or bool(abs(masked.mean() - matched_frac) <= 0.5 * matched_frac + 1e-3))
print("the exact fp32 path has no noise floor:",
      bool((floor[floor["old entropies from"] != "bf16 pass"]["stopped_frac"] == 0).all()))
shares = steps[[f"erc/token_share_{b}" for b in buckets]].sum(axis=1)
print("bucket shares sum to 1:", bool(((shares - 1).abs() < 1e-6).all()))
print("every logged metric is defined in the glossary:", not glossary.undefined(df.columns))
print("every claim has a verdict from its interval:", bool(claims.validate_claims(claim_list)))
