# %% [markdown]
# # 03 · RL clip variants: does GPPO beat DAPO's clip-higher?
#
# Klear-Reasoner's RL stage replaces PPO's clipping with **GPPO**, gradient-preserving clipping (Klear-Reasoner
# report, arXiv 2508.07629; `docs/reference.md` §1):
#
# $$
# \mathcal{L}_{\text{GPPO}} = \mathbb{E}\Big[\tfrac{1}{\sum_j T_j}\sum_j\sum_t \min\big(r_{j,t} A_j,\;
# \mathrm{clip}\big(r_{j,t},\; \tfrac{(1-\varepsilon_l)\, r_{j,t}}{\mathrm{sg}(r_{j,t})},\;
# \tfrac{(1+\varepsilon_h)\, r_{j,t}}{\mathrm{sg}(r_{j,t})}\big) A_j\big)\Big]
# $$
#
# Its forward value is PPO-clip's. Only the gradient differs: where PPO-clip (DAPO's clip-higher, ε 0.2/0.28)
# zeroes the gradient of a token whose ratio left the trust region in the direction the advantage pushes
# (`r > 1+ε_h, A > 0`: exploration; `r < 1-ε_l, A < 0`: negative samples), GPPO keeps it, bounded at `1+ε_h` or
# `1-ε_l` times `A·∇log π`. The paper reports GPPO above DAPO's clip-higher through training (math and code).
#
# **What this notebook tests** (declared before the run in `params/03_rl_clip_variants/claims.yaml`). The primary
# claim: "GPPO learns faster than DAPO's clip-higher", read out as the area under the exact fork probe
# `klear/p_correct_fork` (the probability of the right digit at the four fork facts, one forward pass per rollout,
# no sampling noise) over the rollouts, gppo − ppo_clip, paired by seed, at **16 updates per rollout** (the
# mechanism panel below shows why: GPPO and PPO-clip differ only off-policy, and more the more updates a rollout
# makes). Three secondary claims, Holm-adjusted together: GPPO against PPO-clip at **twice the learning rate** (the
# rival reading "GPPO only takes bigger steps"); GPPO against **CISPO** (Klear's own comparison: CISPO also keeps
# clipped tokens' gradients, through a stop-gradient on a clipped importance weight); and the **final held-out
# fork accuracy** after RL at T 0.6 (the read-out closest to the paper's "accuracy after RL", a second read-out of
# the primary's runs; it went against the paper in 5 of 6 earlier runs and is declared again so that it cannot
# leave the table unseen). With k secondaries at n seeds the smallest Holm-adjusted sign-flip p is k · 2^-(n-1):
# three need 8 seeds (3 · 2^-7 = 2.3%) to be decidable at all. The verdict comes from
# one calibrated rule (`klear_lib.claims`: a paired t-interval, the exact sign-flip test beside it), with the
# smallest effect the run could detect (MDE).
#
# **Where the mechanism acts.** Clipping can only bind where a token's ratio can leave the trust region: since
# `r ≤ 1/π_old`, clip-high needs `π_old < 1/1.28 ≈ 0.78`. The SFT teacher here is right everywhere except on four
# *fork facts* of the addition table, which it writes wrong 80% of the time: after SFT the model's mode is wrong
# there (p(right digit) ≈ 0.2), so RL has to move a mode, and the right digit (π_old ≈ 0.2, `A > 0`) and the wrong
# one (π_old ≈ 0.8, `A < 0`) are exactly GPPO's two cases. A check declared with the claims asks that the mechanism
# acts: GPPO keeps the gradient of a measurable share of the fork tokens.
#
# **Controls.** (1) At one update per rollout the ratio is 1 and every loss must give the same run (a check).
# (2) Seed s gives every arm the same SFT start and the same first rollout; the start is seed s's own (SFT trained
# from seed s), so a replicate is a start and an RL run, and the interval covers how the effect moves between
# starts, not only between RL seeds around one start. A check asks that every start learned its teacher. (3) α = 0
# in every arm (notebook 06's question). (4) PPO-clip at twice the learning rate (the step-size control). (5) GPPO on
# the low side only (β_h 0: PPO-clip's zero gradient above 1 + ε_h, GPPO's below 1 - ε_l), against PPO-clip: the
# paper's reading that the negative samples' kept gradients speed learning (declared 2026-12-07). (6) A mechanism panel: a policy that is
# nothing but fork tokens, trained with `klear_lib.losses` directly, shows each loss's advantage over PPO-clip (CISPO
# and CE-GPPO's β_l = 0.5 too) against updates per rollout and learning rate, in seconds.
#
# **What the tiny stand-in can and cannot show.** It can show whether, when a mode must move, preserving the
# clipped tokens' gradients makes learning faster or less stable, on a 1M-parameter model in minutes. It cannot
# show the paper's numbers, effects of 32K-token responses, or anything that rests on a pretrained model's
# knowledge; its fork tokens are about 1.5% of response tokens, where the paper's forking tokens are spread through
# long chains of thought.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `tiny` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
arms = "ppo_clip,gppo,ppo_clip_2x_lr,cispo,gppo_low_only"  # the pair, the step-size control, CISPO, GPPO below only
seeds = "0,1,2,3,4,5,6,7,8,9,10,11,12,13"        # each seed trains its own SFT start, then RL
model = "tiny"
n_train = 6000
n_heldout = 128
levels = "1,2,3,4"
sft_lr = 2.0e-3
sft_epochs = 2.0
sft_batch_size = 16
fork_facts = "2+3->6,5+1->7,7+2->8,9+3->1"        # the SFT teacher writes these wrong ...
fork_wrong_rate = 0.8                          # ... this often
rl_lr = 5.0e-5
rollouts = 3
rollout_prompts = 16                           # prompts trained on per rollout (Klear 128) ...
mini_batch_prompts = 1                         # ... per optimizer step (Klear 16): 16 updates per rollout
oversample_factor = 2.0                        # prompts generated per rollout / rollout_prompts (Klear 2)
max_gen_batches = 1                            # generation batches a rollout may draw to fill its prompts
num_generations = 8
max_completion_length = 56                     # level 4's teacher answer is 50 tokens
format_rule = "released"                       # the judge's think format: released, paper or none
eval_n = 2                                     # held-out samples per problem, after the last rollout
eval_temperature = 0.6                         # the paper's
control_rollouts = 1                           # rollouts of the one-update-per-rollout control
panel_seeds = 20                               # the mechanism panel's seeds ...
panel_groups = 128                             # ... and groups of samples per run
workers = "auto"                               # runs at a time, one CPU thread each ("auto": the cores)
report_to = "none"                             # or tensorboard / trackio / wandb (installed): <run dir>/tracking
use_vllm = False
use_cpu = True
bf16 = False

# %% [markdown]
# ## Configuration
# One strict, typed config (`RLExperimentConfig`); every arm is a diff against it that changes only the keys it
# names. The held-out evaluation runs once, after the last rollout (the start's is the warm start's, shared by
# every arm of a seed); the curve is the exact probe, recorded every rollout. The claims are read here, before any
# training.

# %% tags=["config"]
import time

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from klear_lib import claims, experiment, glossary, mechanism, notebook, plots, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.train import rl_jobs

notebook.quiet()
notebook.require(globals(), counts=("control_rollouts", "panel_seeds", "panel_groups"))
workers = notebook.workers(workers)  # "auto" -> the cores this process may use (presets.resolve_workers)
NAME = "03_rl_clip_variants"
DECLARED = notebook.declared_claims(NAME, globals())  # the claims this run makes (their `requires`)
ARMS = {  # name -> the keys it changes (paper: DAPO clip 0.2/0.28, GPPO β 1)
    "ppo_clip": dict(loss_name="ppo_clip"),
    "gppo": dict(loss_name="gppo"),
    "ppo_clip_2x_lr": dict(loss_name="ppo_clip", rl_lr=2 * rl_lr),  # the step-size control
    "cispo": dict(loss_name="cispo"),  # Klear's other gradient-keeping baseline
    "gppo_low_only": dict(loss_name="gppo", beta_high=0.0),  # GPPO's gradient below 1 - ε_l only; PPO-clip above
}
PANEL_ARMS = ("ppo_clip", "cispo", "gppo", "gppo_beta_low_0.5")  # the mechanism panel's losses
arm_list = notebook.parse_list(arms, "arms", allowed=ARMS)
if not {"ppo_clip", "gppo"} <= set(arm_list):
    raise ValueError(f"arms = {arms!r}: the claims compare gppo with ppo_clip; both must run")
seed_list = notebook.parse_list(seeds, "seeds", int, minimum=0)
base = notebook.config_from(RLExperimentConfig, globals(), sft_alpha=0.0, eval_every=rollouts, eval_start=False)
configs = {a: base.replace(**ARMS[a]) for a in arm_list}  # validates each arm
run_path = notebook.start_run(NAME, run_dir, params=globals(), config={
    "base": base, "arms": {a: ARMS[a] for a in arm_list}, "seeds": seed_list, "claims_declared": DECLARED,
    "control_rollouts": control_rollouts, "panel_seeds": panel_seeds, "panel_groups": panel_groups,
    "workers": workers})
print(f"run dir: {run_path}")
print(f"{len(arm_list)} arms x {len(seed_list)} seeds, one SFT start per seed; {base.rollouts} rollouts of up to "
      f"{base.updates_per_rollout} updates each, lr {base.rl_lr:g}; primary claim: "
      f"{next(i for i, d in DECLARED.items() if d['role'] == 'primary')}")

# %% [markdown]
# ## The gradient each loss gives, and the mechanism alone
# The coefficient F in each loss's per-token gradient `-F·A·∇log π`, computed by autograd through
# `klear_lib.losses` (not drawn by hand). PPO-clip's F drops to 0 outside the trust region on the side the
# advantage pushes; GPPO keeps it at the bound; CISPO clips every token's weight, the "optimistic" sides too.

# %%
coef = mechanism.gradient_coefficients({a: mechanism.CLIP_ARMS[a] for a in PANEL_ARMS},
                                       [x / 100 for x in range(30, 181, 2)])
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True, layout="constrained")
for ax, sign in zip(axes, (1, -1)):
    for i, (arm, g) in enumerate(coef[coef["A"] == sign].groupby("arm", sort=False)):
        ax.plot(g["r"], g["F"] + 0.015 * i, label=arm)  # a small offset keeps overlapping lines visible
    ax.axvline(0.8, ls=":", c="grey")
    ax.axvline(1.28, ls=":", c="grey")
    ax.set_title(f"A {'> 0' if sign > 0 else '< 0'}: gradient coefficient F(r)")
    ax.set_xlabel("ratio r = π/π_old")
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=8)
(run_path / "figures").mkdir(exist_ok=True)
fig.savefig(run_path / "figures" / "gradient_coefficients.png", dpi=110)

# %% [markdown]
# The panel: independent binary choices ("forks"), right with probability 0.2 at the start, reward 1 when every
# fork is right; GRPO advantages, Adam, each loss from the registry, one group per optimizer step and 1 to 16
# updates per rollout at three learning rates, `panel_seeds` seeds at once. Shown: each loss's area under
# p(all right) minus PPO-clip's, paired by seed (same start, same first rollout), with a 95% paired t-interval. At
# one update per rollout the difference must be exactly 0.

# %%
clock = time.perf_counter()
panel = mechanism.dose_response(updates=(1, 2, 4, 8, 16), lrs=(0.05, 0.1, 0.2),
                                arms={a: mechanism.CLIP_ARMS[a] for a in PANEL_ARMS}, seeds=panel_seeds,
                                groups=panel_groups)
rows = []
for (u, lr), g in panel.groupby(["updates", "lr"]):
    ref = g[g["arm"] == "ppo_clip"].set_index("seed")["auc_p_all"]
    for arm in PANEL_ARMS[1:]:
        diff = g[g["arm"] == arm].set_index("seed")["auc_p_all"] - ref
        t = claims.paired_t(diff.tolist())
        rows.append({"arm": arm, "updates": u, "lr": lr, "advantage": t["mean"], "ci_low": t["ci_low"],
                     "ci_high": t["ci_high"], "ppo_clip_clip_frac": g[g["arm"] == "ppo_clip"]["clip_frac"].mean()})
dose = pd.DataFrame(rows)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True, layout="constrained")
for ax, (lr, g) in zip(axes, dose.groupby("lr")):
    for arm, h in g.groupby("arm", sort=False):
        ax.errorbar(h["updates"], h["advantage"], yerr=[h["advantage"] - h["ci_low"], h["ci_high"] - h["advantage"]],
                    marker="o", capsize=3, label=arm)
    ax.axhline(0, c="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_title(f"lr {lr}")
    ax.set_xlabel("updates per rollout")
axes[0].set_ylabel("Δ area under p(all forks right)")
fig.suptitle("The mechanism alone: each loss's advantage over ppo_clip (fork-only policy, 95% t-interval)")
fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
fig.savefig(run_path / "figures" / "mechanism_dose_response.png", dpi=110)
on_policy = dose[dose["updates"] == 1]
print(f"mechanism panel: {len(panel)} runs in {time.perf_counter() - clock:.0f}s; at one update per rollout the "
      f"largest |advantage| is {on_policy['advantage'].abs().max():.2e}")
display(dose[dose["updates"] == 16].round(4))
assert (on_policy["advantage"].abs() < 1e-12).all(), "on-policy, every loss must give the same trajectory"

# %% [markdown]
# ## SFT warm starts, one per seed
# Seed s's start is SFT from seed s (initialisation and data order; the teacher's samples are the same for every
# seed), trained side by side, once, and cached: notebooks 04 and 06 reuse them, 07 seed 0's. Held-out accuracy at
# T 0.6 is split into the *fork problems* (their correct chain uses a fork fact) and the rest; the fork probe is
# p(right digit) at the four fork facts (the teacher's: 0.2).

# %%
ss = rl_jobs.seed_starts(base, seed_list, run_path, cache_root=notebook.cache_root(run_path), workers=workers)
display(ss.table.round(3))
print(ss.describe())

# %% [markdown]
# ## Control: one update per rollout
# With a single update per rollout the ratio is exactly 1 and the losses give the same gradient, so their runs
# must be identical: same probe, same held-out accuracy. (`mini_batch_prompts = rollout_prompts`; the first seed
# and its start.)

# %%
control_arms = ("ppo_clip", "gppo")
control_jobs = [experiment.Job(f"control/{a}", "klear_lib.train.rl_jobs:rl_unit", {
    "config": {**vars(configs[a].replace(mini_batch_prompts=base.rollout_prompts, rollouts=control_rollouts,
                                         eval_every=control_rollouts, rl_lr=2 * rl_lr, seed=seed_list[0]))},
    "start": ss.dirs[seed_list[0]], "tags": {"variant": a, "seed": seed_list[0], "arm": "control"}})
    for a in control_arms]
experiment.run_jobs(control_jobs, run_path / "control", workers=workers)
cdf = plots.metrics_frame(run_path / "control")
probe = cdf.dropna(subset=["klear/p_correct_fork"]).pivot_table(index="rollout", columns="variant",
                                                                  values="klear/p_correct_fork")
evals = cdf.dropna(subset=["eval/avg_at_n"]).pivot_table(index="rollout", columns="variant", values="eval/avg_at_n")
display(probe.round(6))
control_probe_spread = float((probe.max(axis=1) - probe.min(axis=1)).max())
control_eval_spread = float((evals.max(axis=1) - evals.min(axis=1)).max())
control_steps = cdf.dropna(subset=["actor/pg_loss"]) if "actor/pg_loss" in cdf else cdf.iloc[0:0]
control_ratio_max = float(control_steps["actor/ratio_max"].max()) if len(control_steps) else float("nan")
control_ok = control_probe_spread < 1e-5 and control_eval_spread == 0 and abs(control_ratio_max - 1) < 1e-5
print(f"control: largest spread across losses: probe {control_probe_spread:.1e}, held-out {control_eval_spread:.1e}; "
      f"largest ratio {control_ratio_max:.6f}")

# %% [markdown]
# ## The experiment: every arm × seed
# Each run is a unit of work in a worker process (`klear_lib.experiment`): recorded when it finishes, not redone if
# the notebook is run again into the same run directory.

# %%
jobs = [experiment.Job(f"{a}/seed={s}", "klear_lib.train.rl_jobs:rl_unit", {
    "config": {**vars(configs[a].replace(seed=s))}, "start": ss.dirs[s],
    "tags": {"variant": a, "seed": s}}) for s in seed_list for a in arm_list]
clock = time.perf_counter()
experiment.run_jobs(jobs, run_path, workers=workers)
print(f"{len(jobs)} runs in {time.perf_counter() - clock:.0f}s")
df = plots.metrics_frame(run_path)
steps = df.dropna(subset=["actor/pg_loss"])

# %% [markdown]
# ## What happened
# The fork probe and the rest probe (p(right digit) off the forks: what the start knows), the rollout reward, and
# the clip statistics at the fork tokens. Mean over seeds, ±1 std.

# %%
fig = plots.plot_curves(df, ["klear/p_correct_fork", "klear/p_correct_rest", "reward"],
                        out=run_path / "figures" / "clip_variants_probes.png",
                        title="The fork probe, the rest probe and the reward (mean ± std over seeds)")
fig = plots.plot_curves(df, ["actor/pg_clipfrac_low_fork", "actor/pg_clipfrac_high_fork",
                             "actor/gppo_preserved_frac_fork", "entropy", "grad_norm", "klear/updates_this_rollout"],
                        out=run_path / "figures" / "clip_variants_mechanism.png",
                        title="Where the losses differ: the fork tokens (mean ± std over seeds)")

# %% [markdown]
# ## Does the mechanism act? Clip statistics, overall and at the fork tokens
# Per arm, the mean over optimizer steps and seeds (% of tokens), and the mean update norm after clipping (the
# step each arm took: gradient norm capped at `max_grad_norm`, times the learning rate).

# %%
cols = {"actor/pg_clipfrac_low": "clip low", "actor/pg_clipfrac_high": "clip high",
        "actor/gppo_preserved_frac": "GPPO-preserved", "actor/pg_clipfrac_low_fork": "clip low @fork",
        "actor/pg_clipfrac_high_fork": "clip high @fork", "actor/gppo_preserved_frac_fork": "GPPO-preserved @fork",
        "klear/fork_token_frac": "fork tokens"}
mech = (100 * steps.groupby("variant", sort=False)[list(cols)].mean()).rename(columns=cols)
mech["updates per rollout"] = steps.groupby(["variant", "seed", "rollout"]).size().groupby("variant").mean()
lr_of = {a: configs[a].rl_lr for a in arm_list}
mech["step (lr × clipped grad norm)"] = steps.assign(
    step_size=steps["grad_norm"].clip(upper=base.max_grad_norm) * steps["variant"].map(lr_of)).groupby(
    "variant")["step_size"].mean()
display(mech.round(6))
preserved_fork = float(mech.loc["gppo", "GPPO-preserved @fork"]) / 100
ppo_clip_fork = float(mech.loc["ppo_clip", ["clip low @fork", "clip high @fork"]].sum()) / 100
print(f"ppo_clip clips {ppo_clip_fork:.1%} of the fork tokens; gppo keeps the gradient of {preserved_fork:.1%} of them")

# %% [markdown]
# ## Read-outs per seed, and the claims
# Per run: the area under the fork probe over the rollouts (its mean level; the declared primary read-out), the
# rest probe's area, and the held-out accuracy after the last rollout (fork problems, the rest); beside them, the
# seed's start. Each claim is a paired difference at the same seed (the same start); a secondary is Holm-adjusted
# with the notebook's other secondaries (the final fork accuracy, the step-size control, CISPO, the entropy).

# %%
pr = df.dropna(subset=["klear/p_correct_fork"])
ev = df.dropna(subset=["eval/avg_at_n_fork"])
per_run = []
for (arm, seed), g in pr.groupby(["variant", "seed"]):
    last = ev[(ev["variant"] == arm) & (ev["seed"] == seed)].sort_values("rollout").iloc[-1]
    per_run.append({"variant": arm, "seed": seed,
                    "probe_auc": claims.area_under_curve(g["rollout"], g["klear/p_correct_fork"]),
                    "rest_probe_auc": claims.area_under_curve(g["rollout"], g["klear/p_correct_rest"]),
                    "final_fork": last["eval/avg_at_n_fork"], "final_rest": last["eval/avg_at_n_rest"]})
per_run = pd.DataFrame(per_run)
ent = steps.groupby(["variant", "seed"])["entropy"].mean().rename("entropy").reset_index()
per_run = per_run.merge(ent, on=["variant", "seed"])
per_run["start_probe"] = per_run["seed"].map({s: st["p_correct_fork"] for s, st in ss.starts.items()})
display(plots.seed_table(per_run, ["probe_auc", "rest_probe_auc", "final_fork", "final_rest", "entropy",
                                   "start_probe"]))


def by_seed(arm, col):
    g = per_run[per_run["variant"] == arm]
    return dict(zip(g["seed"], g[col]))


claim_list = [
    claims.declared_claim(DECLARED, "gppo_vs_ppo_clip.probe_auc", by_seed("gppo", "probe_auc"),
                          by_seed("ppo_clip", "probe_auc")),
    claims.declared_check(DECLARED, "on_policy_control", control_ok, control_probe_spread,
                          criterion="probe spread < 1e-5, held-out spread 0 and every ratio 1 at one update per "
                                    "rollout", seeds=1),
    claims.declared_check(DECLARED, "clipping_binds", preserved_fork >= 0.05, preserved_fork,
                          criterion="GPPO keeps the gradient of >= 5% of the fork tokens", seeds=len(seed_list)),
    ss.check(DECLARED),
]
secondaries = {  # claim id -> (the arm, the other arm, the read-out); each made where its arms ran
    "gppo_vs_ppo_clip.final_fork": ("gppo", "ppo_clip", "final_fork"),
    "gppo_vs_ppo_clip_2x_lr.probe_auc": ("gppo", "ppo_clip_2x_lr", "probe_auc"),
    "gppo_vs_cispo.probe_auc": ("gppo", "cispo", "probe_auc"),
    "gppo_vs_ppo_clip.entropy": ("gppo", "ppo_clip", "entropy"),
    "gppo_low_only_vs_ppo_clip.probe_auc": ("gppo_low_only", "ppo_clip", "probe_auc"),
}
for k, (cid, (arm, other, col)) in enumerate((c, v) for c, v in secondaries.items() if c in DECLARED):
    claim_list.insert(1 + k, claims.declared_claim(DECLARED, cid, by_seed(arm, col), by_seed(other, col)))
claim_list = claims.finalize(claim_list, DECLARED, where=f"{NAME} claims")  # exactly the claims made
display(notebook.claims_frame(claim_list))

# %% [markdown]
# ## Beside the paper

# %%
table = per_run.groupby("variant", sort=False).agg(
    probe_auc=("probe_auc", "mean"), final_fork=("final_fork", "mean"), final_rest=("final_rest", "mean"),
    seeds=("seed", "nunique"))
PAPER_ROLE = {"ppo_clip": "DAPO clip-higher (ε 0.2/0.28): the baseline",
              "gppo": "GPPO (β 1): above DAPO through training",
              "ppo_clip_2x_lr": "(not in the paper) DAPO clip-higher at twice the learning rate: the step-size control",
              "cispo": "CISPO (MiniMax-M1): below GPPO in Klear's comparison",
              "gppo_low_only": "(not in the paper's figures) GPPO's gradient on the low side only: §2.2's "
                               "negative-sample reading"}
summary = {
    **ss.summary(),
    "mechanism": mech.reset_index().to_dict(orient="records"),
    "control": {"probe_spread": control_probe_spread, "eval_spread": control_eval_spread,
                "ratio_max": control_ratio_max},
    "panel": dose.to_dict(orient="records"),
    "per_run": per_run.to_dict(orient="records"),
    "figures": ["figures/clip_variants_probes.png", "figures/clip_variants_mechanism.png",
                "figures/gradient_coefficients.png", "figures/mechanism_dose_response.png"],
    "claims": claim_list,
    "beside_paper": {
        "caption": "Clip variants: the paper's finding for each arm beside ours (the fork probe's area over the "
                   "rollouts; held-out accuracy at T 0.6 after the last rollout, %; mean over seeds)",
        "columns": ["arm", "paper", "ours: fork-probe area", "ours: final fork", "ours: final rest", "seeds"],
        "rows": [[arm, PAPER_ROLE.get(arm, ""), round(r["probe_auc"], 3), round(100 * r["final_fork"], 1),
                  round(100 * r["final_rest"], 1), int(r["seeds"])] for arm, r in table.iterrows()],
        "note": "The paper: GPPO above DAPO's clip-higher on AIME and LiveCodeBench through RL (Klear-Reasoner 8B). "
                "Ours: the claims give each paired difference with its interval, p, MDE and verdict.",
    },
}
notebook.write_summary(run_path, summary)

# %% [markdown]
# ## What this run says
# The claims table above is the result: each verdict comes from its interval and p, by one rule, not from the
# plots. Read it with the mechanism table and the MDE: an `inconclusive` says that no effect as large as the MDE
# was there to see, not that there is none. Dated results of the `tiny` preset, with their reading, are in
# `docs/results.md`.

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine and preset (nbval compares it).
print("run-dir contract complete:", not runs.check_run_dir(run_path))
print("every requested arm and seed ran:", len(per_run) == len(arm_list) * len(seed_list))
print("on-policy control: every loss gave the same run, with updates at ratio 1:", control_ok)
first = df[(df["rollout"] == 1) & df["reward"].notna()].groupby("seed")["reward"].nunique()
print("every arm saw the same first rollout at each seed:", bool((first == 1).all()))
updates = steps[(steps["actor/response_tokens"] > 0) & (steps["grad_norm"] > 0)].groupby(["variant", "seed"]).size()
print("every run made an update with a non-zero gradient on response tokens:", len(updates) == len(per_run))
print("GPPO-preserved fraction is 0 for the non-GPPO losses:",
      bool((steps[~steps["variant"].str.startswith("gppo")]["actor/gppo_preserved_frac"] == 0).all()))
print("every logged metric is defined in the glossary:", not glossary.undefined(df.columns))
print("every claim was declared and follows from the rule:", bool(claims.validate_claims(claim_list)))
