# %% [markdown]
# # 05 · Code reward: soft (pass rate) vs hard (all tests), under DAPO's and Klear's group filters
#
# Klear-Reasoner rewards code by running the model's program against up to 16 test cases in a sandbox
# (Klear-Reasoner report, arXiv 2508.07629; `docs/reference.md` §5):
#
# $$ r_{\text{soft}} = \frac{\#\text{passed}}{\#\text{tests}}, \qquad
#    r_{\text{hard}} = \mathbb{1}[\#\text{passed} = \#\text{tests}] $$
#
# The paper's soft reward beats the all-or-nothing one on LiveCodeBench v5 (61.0 vs 59.2 after 100 steps at 16K):
# partially right programs still carry signal, which matters where fully right ones are rare.
#
# **What this notebook tests.** "The soft reward beats the hard one", as paired differences over seeds of the
# held-out all-tests accuracy (final, and the area under its curve over the rollouts), under each of two group
# filters of dynamic sampling: DAPO's (keep a group whose rewards vary) and Klear's own (keep a group whose
# *fully-correct* indicator varies). Under Klear's filter a group in which every program passes only some tests is
# dropped with either reward: the soft reward then keeps only its finer advantages inside the groups the hard one
# also keeps. The share of groups with a learning signal is logged per rollout under both rules in every arm.
#
# **The tiny stand-in, where full passes are rare.** From four examples f(0) .. f(3) of a function of period 4, the
# model copies the examples into its chain of thought and writes the lookup program
# `f(x) = {0: c0, 1: c1, 2: c2, 3: c3}[x % 4]` (`tasks.make_branch_code_splits`). The hidden tests are f(4) .. f(7),
# one per branch, so a program with j of 4 values right passes j/4 of them. The SFT teacher gets each value wrong
# with probability `sft_error_rate`, so that at the start (T 1.0, as rollouts sample) about one program in eight
# passes every test while most pass some: the regime in which the paper's partial credit should matter. (The first
# version's two-branch task started at 44% full passes: the hard reward had a signal in nearly every group.) Every
# program runs in the bubblewrap sandbox (`klear_lib.rewards.sandbox`) through a process pool; a response is run
# once per unit (`MemoPool`).
#
# What it cannot show: the paper's numbers, long programs, real test suites, 100 steps at 16K tokens.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `tiny` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
reward_modes = "soft,hard"                     # of soft, hard, signed (2·soft - 1: the released code's)
filter_rules = "dapo,klear"
seeds = "0,1,2"
branches = 4
model = "tiny"
n_train = 4000
n_heldout = 32                                 # functions never seen in training
sft_lr = 2e-3
sft_epochs = 2.0
sft_batch_size = 16                             # 500 SFT steps: the lookup is learned past 250
sft_error_rate = 0.4                           # per value: the teacher writes a fully right program 0.6^4, 13%, of the time
rollouts = 8
rollout_prompts = 8                            # prompts trained on per rollout (Klear 128) ...
mini_batch_prompts = 2                         # ... per optimizer step: 4 updates per rollout
oversample_factor = 2.0                        # prompts generated per rollout / rollout_prompts (Klear 2)
max_gen_batches = 1
num_generations = 8
max_completion_length = 96                     # the teacher writes 77 tokens
rl_lr = 5e-5
eval_every = 4                                 # rollouts between held-out evaluations: start, middle, end
eval_n = 4
eval_temperature = 1.0                         # the rollouts' temperature; see "Evaluation temperature"
reward_workers = 1                             # sandbox processes per unit
test_timeout_s = 2.0
workers = 2                                    # units of work at a time (one CPU thread each)
use_vllm = False
use_cpu = True
bf16 = False
report_to = "none"                             # or tensorboard / trackio / wandb (installed): <run dir>/tracking

# %% [markdown]
# ## Configuration
# One strict config for the shared recipe (GPPO, α 0.1, 8 responses per prompt); each arm changes only the reward
# and the filter.

# %% tags=["config"]
import random
import time

import pandas as pd
import torch
from IPython.display import display

from klear_lib import claims, experiment, glossary, models, notebook, plots, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.evaluation.code_heldout import evaluate_code_heldout
from klear_lib.rewards.code import score_code
from klear_lib.rewards.pool import MemoPool, RewardPool
from klear_lib.train import sft_jobs
from klear_lib.train.sft import SFTStageConfig

notebook.quiet()
notebook.require(globals(), counts=("branches", "reward_workers", "workers"), positive=("test_timeout_s",))
base = notebook.config_from(RLExperimentConfig, globals(), loss_name="gppo", fork_facts="")
mode_list = notebook.parse_list(reward_modes, "reward_modes", allowed=("soft", "hard", "signed"))
filter_list = notebook.parse_list(filter_rules, "filter_rules", allowed=("dapo", "klear"))
seed_list = notebook.parse_list(seeds, "seeds", int)
if not {"soft", "hard"} <= set(mode_list):
    raise ValueError(f"reward_modes = {reward_modes!r}: the claims compare soft with hard; both must run")
ARMS = {f"{m}/{f}": dict(reward_mode=m, filter_rule=f) for f in filter_list for m in mode_list}
configs = {a: base.replace(filter_rule=v["filter_rule"]) for a, v in ARMS.items()}  # validates every arm
run_path = notebook.start_run("05_code_reward", run_dir, params=globals(), config={
    "base": base, "arms": ARMS, "seeds": seed_list, "branches": branches, "reward_workers": reward_workers,
    "test_timeout_s": test_timeout_s, "workers": workers})
print(f"run dir: {run_path}")
print(f"{len(ARMS)} arms x {len(seed_list)} seeds; {base.rollouts} rollouts of up to {base.updates_per_rollout} "
      f"updates, {base.num_generations} responses per prompt")

# %% [markdown]
# ## SFT warm start (shared by every arm; trained once and cached)
# Then the design figure: at the start, the share of held-out samples that pass every test and that pass some
# (T 1.0, the rollouts' temperature).

# %%
clock = time.perf_counter()
train, heldout = tasks.make_branch_code_splits(base.data_seed, base.n_train, base.n_heldout, branches)
rng = random.Random(base.data_seed)
samples = [{"prompt": tasks.code_prompt_messages(p), "completion": [{"role": "assistant", "content":
            tasks.branch_code_solution(p, rng, error_rate=base.sft_error_rate)}]} for p in train]
sft_dir = sft_jobs.base_model(base, tasks.branch_code_corpus(train), samples, SFTStageConfig.from_experiment(base),
                              cache_root=run_path.parent.parent / ".cache", out_dir=run_path / "sft")
model0, tokenizer = models.load_model_and_tokenizer(sft_dir, dtype=torch.float32)
runs.set_seed(base.seed)
with RewardPool(score_code, workers=2, timeout_s=test_timeout_s * 20 + 5, failure_score=0.0) as pool:
    judge = MemoPool(pool)
    start = evaluate_code_heldout(model0, tokenizer, heldout, judge, n=base.eval_n, temperature=base.eval_temperature,
                                  top_p=base.eval_top_p, max_new_tokens=base.max_completion_length)
    items = [{"response": tasks.branch_code_solution(p, rng, error_rate=base.sft_error_rate), "tests": p.tests,
              "mode": "soft"} for p in heldout for _ in range(8)]
    teacher_full = sum(r.reason == "all_passed" for r in judge.score_batch(items)) / len(items)
del model0
print(f"SFT start: all-tests avg@{start['n']} = {start['avg_at_n']:.3f} (the teacher's: {teacher_full:.3f}), mean "
      f"pass rate {start['pass_rate']:.3f}, format {start['format_rate']:.2f} ({time.perf_counter() - clock:.0f}s)")

# %% [markdown]
# ## RL: every reward × filter × seed
# GPPO (the Klear recipe) throughout. Each run is a unit of work in a worker process with its own sandbox pool
# (`klear_lib.train.code_jobs.code_unit`), recorded when it finishes and not redone on a re-run into the same run
# directory. Seed s gives every arm the same SFT start and the same first rollout.

# %%
jobs = [experiment.Job(f"{a}/seed={s}", "klear_lib.train.code_jobs:code_unit", {
    "config": {**vars(configs[a].replace(seed=s))}, "start": str(sft_dir), "reward_mode": v["reward_mode"],
    "branches": branches, "reward_workers": reward_workers, "test_timeout_s": test_timeout_s,
    "tags": {"variant": a, **v, "seed": s}}) for a, v in ARMS.items() for s in seed_list]
clock = time.perf_counter()
results = experiment.run_jobs(jobs, run_path, workers=workers)
print(f"{len(jobs)} runs in {time.perf_counter() - clock:.0f}s; sandbox runs "
      f"{sum(r['sandbox_runs'] for r in results.values())}, answered from the memo "
      f"{sum(r['memo_hits'] for r in results.values())}")
display(pd.DataFrame({k: r["reasons"] for k, r in results.items()}).T.fillna(0).astype(int))
df = plots.metrics_frame(run_path)
steps = df.dropna(subset=["actor/pg_loss"])
rollouts_df = df[df["klear/generated_groups"].notna()] if "klear/generated_groups" in df else df.iloc[0:0]

# %% [markdown]
# ## What happened
# Held-out all-tests accuracy (a sample counts only if every test passes, as the paper evaluates code) and mean pass
# rate; per rollout, the share of generated groups with a learning signal under DAPO's and Klear's rule, the share
# of groups the arm kept (capped at `rollout_prompts`: half the generated ones), and the shares of programs that
# pass every test and some. Mean over seeds, ±1 std.

# %%
fig = plots.plot_curves(df, ["eval/avg_at_n", "eval/pass_rate", "klear/group_signal_dapo", "klear/group_signal_klear",
                             "klear/kept_group_frac", "klear/full_pass_frac", "klear/partial_pass_frac", "entropy"],
                        out=run_path / "figures" / "code_reward.png",
                        title="Soft vs hard code reward under two group filters (mean ± std over seeds)")

# %% [markdown]
# ## Read-outs per seed, and the claims
# Per run: the final all-tests accuracy, the area under its curve over the rollouts (its mean level), and the mean
# share of groups with a signal under the arm's own filter. Each claim is soft minus hard under one filter, paired
# by seed.

# %%
ev = df.dropna(subset=["eval/avg_at_n"])
per_run = []
for (arm, seed), g in ev.groupby(["variant", "seed"]):
    g = g.sort_values("rollout")
    r = rollouts_df[(rollouts_df["variant"] == arm) & (rollouts_df["seed"] == seed)]
    own = "klear/group_signal_" + ARMS[arm]["filter_rule"]
    per_run.append({"variant": arm, **ARMS[arm], "seed": seed,
                    "final": g["eval/avg_at_n"].iloc[-1], "auc": claims.area_under_curve(g["rollout"], g["eval/avg_at_n"]),
                    "final_pass_rate": g["eval/pass_rate"].iloc[-1], "signal_own_filter": r[own].mean(),
                    "signal_dapo": r["klear/group_signal_dapo"].mean(), "signal_klear": r["klear/group_signal_klear"].mean(),
                    "kept_frac": r["klear/kept_group_frac"].mean(),
                    "steps": int(((steps["variant"] == arm) & (steps["seed"] == seed)).sum())})
per_run = pd.DataFrame(per_run)
display(plots.seed_table(per_run, ["final", "auc", "final_pass_rate", "signal_own_filter", "signal_dapo",
                                   "signal_klear", "kept_frac", "steps"], by="variant"))


def by_seed(arm, col):
    g = per_run[per_run["variant"] == arm]
    return dict(zip(g["seed"], g[col]))


SRC = "Klear-Reasoner §5 (soft vs hard code reward); reference §5"
claim_list = []
for f in filter_list:
    for col, what in (("final", "final"), ("auc", "area under the curve of")):
        claim_list.append(claims.paired_claim(
            f"{f}_filter.soft_vs_hard.{col}", "The soft (pass-rate) code reward beats the all-or-nothing one", SRC,
            f"{what} held-out all-tests avg@{base.eval_n} (T {base.eval_temperature:g}), soft - hard, "
            f"{'DAPO' if f == 'dapo' else 'Klear'}'s group filter", by_seed(f"soft/{f}", col), by_seed(f"hard/{f}", col)))
display(pd.DataFrame(claim_list)[["id", "effect", "ci_low", "ci_high", "seeds", "verdict"]].round(4))
first = rollouts_df[rollouts_df["rollout"] == 1]
start_full = float(first["klear/full_pass_frac"].mean())
start_partial = float(first["klear/partial_pass_frac"].mean())
first_signal = {a: float(g["klear/group_signal_" + ARMS[a]["filter_rule"]].mean()) for a, g in first.groupby("variant")}
print(f"first rollout (T {base.temperature:g}, the same programs in every arm): {start_full:.3f} of programs pass every "
      f"test, {start_partial:.3f} some; groups with a signal under the arm's filter: "
      + ", ".join(f"{a} {v:.2f}" for a, v in first_signal.items()))

# %% [markdown]
# ## Beside the paper

# %%
PAPER_MODES = {"soft": 61.0, "hard": 59.2}  # LiveCodeBench v5 avg@n (%), 16K, 100 steps, reference §5
means = per_run.groupby("variant", sort=False).mean(numeric_only=True)
summary = {
    "sft_start": start, "teacher_full_pass": teacher_full,
    "first_rollout": {"full_pass_frac": start_full, "partial_pass_frac": start_partial,
                      "group_signal_own_filter": first_signal},
    "per_run": per_run.to_dict(orient="records"),
    "figures": ["figures/code_reward.png"],
    "claims": claim_list,
    "beside_paper": {
        "caption": "Code reward: the paper's LiveCodeBench v5 (%) beside ours (held-out all-tests avg@n %, start, final "
                   "and area under the curve; share of groups with a signal under the arm's filter)",
        "columns": ["arm", "paper LCB v5", "ours start", "ours final", "ours AUC", "ours groups with signal",
                    "seeds"],
        "rows": [[a, PAPER_MODES.get(ARMS[a]["reward_mode"]), round(100 * start["avg_at_n"], 2),
                  round(100 * r["final"], 2), round(100 * r["auc"], 2), round(r["signal_own_filter"], 3),
                  int((per_run["variant"] == a).sum())] for a, r in means.iterrows()],
        "note": "The paper: soft above hard, with DAPO-style training. Ours: the claims table, under each filter.",
    },
}
notebook.write_summary(run_path, summary)

# %% [markdown]
# ## Reading it
# The claims table is the result; each verdict comes from its interval. Read it beside the signal shares: under
# DAPO's rule the soft reward gives a signal in every group whose programs pass different numbers of tests, the hard
# one only where some program passes all; under Klear's rule both train on the same groups, and the soft reward's
# partial credit acts only inside them.
#
# *Evaluation temperature.* T 1.0, the rollouts' own: the design figure (full passes rare at the start) and the
# read-out are about the policy that generates the training signal. At the paper's T 0.6 a model whose most likely
# value is right for most branches passes far more often, before and after RL.
# Dated results of the `tiny` preset are in `docs/results.md`.

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine and preset (nbval compares it).
print("run-dir contract complete:", not runs.check_run_dir(run_path))
print("every arm and seed ran:", len(per_run) == len(ARMS) * len(seed_list))
print("every arm saw the same first rollout at each seed:",
      bool((first.groupby("seed")["klear/full_pass_frac"].nunique() == 1).all()))
print("every run made at least one update on response tokens with a gradient:",
      bool((steps.groupby(["variant", "seed"])["actor/response_tokens"].sum() > 0).all())
      and bool((steps.groupby(["variant", "seed"])["grad_norm"].max() > 0).all())
      and len(steps.groupby(["variant", "seed"])) == len(per_run))
print("Klear's rule never keeps a group DAPO's drops:",
      bool((rollouts_df["klear/group_signal_klear"] <= rollouts_df["klear/group_signal_dapo"] + 1e-12).all()))
print("pass rates within [0, 1]:", bool(df["eval/pass_rate"].dropna().between(0, 1).all()))
print("every logged metric is defined in the glossary:", not glossary.undefined(df.columns))
print("every claim has a verdict from its interval:", bool(claims.validate_claims(claim_list)))
