# %% [markdown]
# # 03 · RL clip variants: PPO-clip (DAPO) vs CISPO vs GPPO
#
# Klear-Reasoner's RL stage replaces PPO's clipping with **GPPO**, gradient-preserving clipping
# (Klear-Reasoner report, arXiv 2508.07629, §2; `../shared/docs/klear_reference.md` §1 in the project's docs):
#
# $$
# \mathcal{L}_{\text{GPPO}} = \mathbb{E}\Big[\tfrac{1}{\sum_j T_j}\sum_j\sum_t \min\big(r_{j,t} A_j,\;
# \mathrm{clip}\big(r_{j,t},\; \tfrac{(1-\varepsilon_l)\, r_{j,t}}{\mathrm{sg}(r_{j,t})},\;
# \tfrac{(1+\varepsilon_h)\, r_{j,t}}{\mathrm{sg}(r_{j,t})}\big) A_j\big)\Big]
# $$
#
# Its forward value equals PPO-clip's. Only the gradient differs: where PPO-clip zeroes the gradient of a token
# whose ratio left the trust region in the direction the advantage pushes (`r > 1+ε_h, A > 0` or `r < 1-ε_l, A < 0`),
# GPPO keeps it, bounded at `β_h(1+ε_h)` or `β_l(1-ε_l)` times `A·∇log π`.
#
# This notebook trains the same SFT start with four losses from `klear_lib.losses` over several seeds:
# `ppo_clip` (DAPO's clip-higher, ε 0.2/0.28), `cispo`, `gppo` and `gppo` with β_l = 0.5 (CE-GPPO's setting).
# Each rollout batch feeds several optimizer steps, so all but the first are off-policy: with one update per
# rollout the ratio is always 1 and every variant gives the same gradient (reference §1, "on-policy steps hide GPPO").
#
# **The tiny stand-in.** On the `tiny` preset a ≈1M-parameter Qwen3-architecture model, built and trained here
# from scratch, learns modular arithmetic with a `<think>` chain of thought by SFT on a synthetic teacher that errs
# on 20% of its steps; RL then removes the imitated errors. This
# reproduces the *mechanism* (clip fractions, preserved gradients, their effect on entropy and accuracy), not the
# paper's numbers. The `gpu` preset runs the same code on a real hub model with vLLM rollouts.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `tiny` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
variants = "ppo_clip,cispo,gppo,gppo_beta_low_0.5"
seeds = "0,1,2"
model = "tiny"
n_train = 6000
n_heldout = 128
sft_lr = 2e-3
sft_epochs = 2.0
sft_batch_size = 32
sft_error_rate = 0.2                           # the synthetic teacher's per-step error rate
rollouts = 10
rollout_prompts = 32                           # Klear: 128 prompts per rollout batch ...
mini_batch_prompts = 4                         # ... and 16 per optimizer step: 8 updates per rollout, as here
num_generations = 8
max_completion_length = 56                     # level 4's teacher answer is 50 tokens
rl_lr = 5e-5
sft_alpha = 0.1
eval_every = 2                                 # rollouts between held-out evaluations
eval_n = 4
eval_temperature = 1.0                         # the paper evaluates at 0.6; see the note below
use_vllm = False
use_cpu = True
bf16 = False

# %% [markdown]
# ## Configuration
# The cell after the parameters builds one strict, typed config (`RLExperimentConfig`) and derives everything
# else. Each variant is a *diff* against the base config: it changes only the keys it names.

# %%
import dataclasses, json, time
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display

from klear_lib import models, plots, runs
from klear_lib.notebook import quiet
from klear_lib.config import RLExperimentConfig
from klear_lib.train.rl import run_rl
from klear_lib.train.sft import arithmetic_warm_start

quiet()
base = RLExperimentConfig.from_params(dict(
    model=model, n_train=n_train, n_heldout=n_heldout, sft_lr=sft_lr, sft_epochs=sft_epochs,
    sft_batch_size=sft_batch_size, sft_error_rate=sft_error_rate, rollouts=rollouts, rollout_prompts=rollout_prompts,
    mini_batch_prompts=mini_batch_prompts, num_generations=num_generations,
    max_completion_length=max_completion_length, rl_lr=rl_lr, sft_alpha=sft_alpha, eval_every=eval_every,
    eval_n=eval_n, eval_temperature=eval_temperature, use_vllm=use_vllm, use_cpu=use_cpu, bf16=bf16,
))
VARIANTS = {  # name -> the keys it changes (paper: DAPO clip 0.2/0.28, GPPO β=1; CE-GPPO β_l=0.5)
    "ppo_clip": dict(loss="ppo_clip"),
    "cispo": dict(loss="cispo"),
    "gppo": dict(loss="gppo"),
    "gppo_beta_low_0.5": dict(loss="gppo", beta_low=0.5),
}
chosen = [v.strip() for v in variants.split(",") if v.strip()]
unknown = [v for v in chosen if v not in VARIANTS]
if unknown:
    raise ValueError(f"unknown variant(s) {unknown}; valid: {sorted(VARIANTS)}")
seed_list = [int(s) for s in seeds.split(",")]
configs = {v: base.replace(**VARIANTS[v]) for v in chosen}

run_path = Path(run_dir) if run_dir else runs.create_run_dir("outputs", "03_rl_clip_variants")
run_path.mkdir(parents=True, exist_ok=True)
runs.write_run_metadata(run_path, {"base": base, "variants": {v: VARIANTS[v] for v in chosen}, "seeds": seed_list})
print(f"run dir: {run_path}")
print(f"{len(chosen)} variants x {len(seed_list)} seeds; {base.rollouts} rollouts x {base.updates_per_rollout} "
      f"updates each = {base.max_steps} optimizer steps per run")

# %% [markdown]
# ## SFT warm start
# One SFT start shared by every variant and seed (the runs differ only in the RL loss and the RL seed), so that
# the comparison isolates the loss. The model learns the `<think>` format and most of the arithmetic.

# %%
ws = arithmetic_warm_start(base, run_path / "sft")
train, heldout, sft_dir, start = ws.train, ws.heldout, ws.sft_dir, ws.start

# %% [markdown]
# ## RL: every variant × every seed
# Each run starts from the SFT model, sets its seed in one place (`runs.set_seed`), and writes one record per
# optimizer step and per held-out evaluation to `metrics.jsonl`, tagged with its variant and seed.

# %%
clock = time.perf_counter()
with runs.MetricsWriter(run_path / "metrics.jsonl") as writer:
    for variant in chosen:
        for seed in seed_list:
            cfg = configs[variant].replace(seed=seed)
            runs.set_seed(seed)
            model, tok = models.load_model_and_tokenizer(sft_dir, dtype=torch.float32)
            run_rl(cfg, model, tok, train, heldout, writer, tags={"variant": variant, "seed": seed})
print(f"RL done in {time.perf_counter() - clock:.0f}s")

# %% [markdown]
# ## What happened
# Held-out accuracy (avg@n, top-p 0.95), rollout reward, entropy, the clip fractions and GPPO's preserved
# fraction per optimizer step, and the gradient norm. Lines are the mean over seeds, bands ±1 std.
#
# *Evaluation temperature.* The paper evaluates at T 0.6. The `tiny` preset evaluates at T 1.0, the rollout
# temperature: the tiny SFT model learned the arithmetic from a teacher that errs on 20% of steps, and sampling at
# 0.6 already removes most of that noise (≈94% held-out accuracy at 0.6 against ≈50% at 1.0), leaving RL nothing
# to show. The `gpu` preset evaluates at 0.6.

# %%
df = plots.metrics_frame(run_path)
fig = plots.plot_curves(df, ["eval/avg_at_n", "reward", "entropy", "actor/pg_clipfrac_high", "actor/pg_clipfrac_low",
                             "actor/gppo_preserved_frac", "grad_norm", "klear/kept_group_frac"],
                        out=run_path / "figures" / "clip_variants.png", title="RL clip variants (mean ± std over seeds)")

# %%
table = plots.final_table(df)
display(table.style.format("{:.4f}"))
PAPER_ROLE = {"ppo_clip": "DAPO clip-higher (ε 0.2/0.28): below GPPO", "gppo": "GPPO β 1: best",
              "cispo": "CISPO: keeps gradients, clips every weight", "gppo_beta_low_0.5": "CE-GPPO β_l 0.5: entropy higher"}
summary = {
    "sft_start_avg_at_n": start["avg_at_n"],
    "variants": json.loads(table.to_json(orient="index")),
    "figures": ["figures/clip_variants.png"],
    "beside_paper": {
        "caption": "Clip variants: what the paper reports for each (Klear-Reasoner, Fig. 3) beside ours (held-out "
                   "avg@n %, final and change over RL)",
        "columns": ["variant", "paper", "ours start", "ours final", "ours final std", "ours change (min over seeds)",
                    "seeds"],
        "rows": [[v, PAPER_ROLE.get(v, ""), round(100 * r["start"], 2), round(100 * r["final"], 2),
                  round(100 * r["final_std"], 2), f"{100 * r['delta']:+.2f} ({100 * r['delta_min']:+.2f})",
                  int(r["seeds"])] for v, r in table.iterrows()],
        "note": "The paper: GPPO above DAPO's clip-higher on AIME and LCB across training. Read the spread before "
                "reading an ordering into the means.",
    },
}
runs.write_summary(run_path, summary)

# %% [markdown]
# ## Beside the paper
# | claim (Klear-Reasoner report) | what this notebook can check |
# |---|---|
# | GPPO beats DAPO's clip-higher on AIME/LCB across training (report Fig. 3; math AIME24 ≈ +1-2 points at the same step) | the same ordering of held-out accuracy on the tiny task, if the effect survives at this scale; the spread over seeds says whether it is resolvable |
# | GPPO keeps the gradient of clipped tokens, which speeds up exploration and learning from negative samples | `gppo_preserved_frac` > 0 for GPPO and = 0 for PPO-clip; PPO-clip's clip fractions show what it discards |
# | CISPO also keeps gradients but clips every token's weight (including the optimistic cases) | the `cispo` curves |
# | β_l < 1 (CE-GPPO) damps negative-sample gradients and keeps entropy higher | entropy of `gppo_beta_low_0.5` against `gppo` |
#
# What the tiny stand-in **cannot** show: the paper's absolute numbers, long-response effects (32K tokens),
# anything that depends on a pretrained model's knowledge. The task is synthetic and easy to saturate, and
# differences between variants are often within the seed spread: read the table's `delta_min` and `final_std`
# before reading an ordering into the means.

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine (nbval compares this output).
missing = runs.check_run_dir(run_path)
print("run-dir contract complete:", not missing)
print("every requested variant ran:", sorted(table.index) == sorted(chosen))
print("every variant has a start and a final evaluation for every seed:", bool((table["seeds"] == len(seed_list)).all()))
steps = df.dropna(subset=["actor/pg_loss"])
print("all step metrics finite:", bool(steps[["actor/pg_loss", "entropy", "grad_norm"]].notna().all().all()))
pres = steps.groupby("variant")["actor/gppo_preserved_frac"].max()
print("GPPO-preserved fraction is 0 for the non-GPPO losses:", bool((pres[[v for v in pres.index if not v.startswith("gppo")]] == 0).all()))
