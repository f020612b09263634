# %% [markdown]
# # 07 · Evaluation under the paper's protocol
#
# Klear-Reasoner reports **avg@64** on AIME24, AIME25 and HMMT25 and **avg@8** on LiveCodeBench v5
# (2024-08-01..2025-02-01) and v6 (2025-02-01..2025-05-01), sampling at T 0.6, top-p 0.95, top-k 20, repetition
# penalty 1.05, with 32K response tokens, or 64K with YaRN (factor 2.5 over a 32K original context)
# (`docs/reference.md` §7). Math is judged by math-verify, a code sample is correct only if every
# test passes. avg@n is an unbiased pass@1; its interval here is a 95% bootstrap over problems (the paper reports
# none: with 30 problems per benchmark, one problem is 3.3 points).
#
# This notebook evaluates one or more checkpoints on chosen benchmarks at n samples and one or more response
# budgets (`klear_lib.evaluation`: `benchmarks` loads and judges, `rollout` samples with vLLM or HF `generate`,
# `evaluate` scores), and sets the result beside the paper's Table 1. Samples are written as they are generated:
# rerunning with the same `run_dir` resumes an interrupted evaluation without redoing finished problems.
#
# Parameters in brief: `checkpoints` is a comma-separated list of `label=path-or-hub-name` pairs (e.g.
# `SFT=outputs/x/sft/final,RL=Kwai-Klear/Klear-Reasoner-8B`), `benchmark_paths` a list of `name=path` pairs for
# benchmarks read from local files (Klear's JSONL in either schema, LiveCodeBench's JSONL), `budgets` the
# response-token budgets, `n` the samples per problem (0: the paper's), `engine` `hf` or `vllm`.
#
# **The tiny stand-in** (`tiny` preset): the two rows of Table 1 are the SFT model and the SFT model after RL
# (Klear-Reasoner = SFT + GPPO RL). Here: the tiny SFT model (a teacher that errs on 20% of steps, as in notebooks
# 03/04) and the same model after a short GPPO run, on the tiny task's held-out problems, at two response budgets
# (the short one cuts the longest chains, as 32K cuts some of Klear's responses). The `gpu` preset evaluates
# released checkpoints on the real benchmarks with vLLM.
#
# *Evaluation temperature.* Every preset samples at the paper's T 0.6, top-k 20, repetition penalty 1.05. The tiny
# SFT model is the RL notebooks' start (03, 04, 06; the same cached model): its teacher wrote four addition facts
# wrong 80% of the time, so its mode on them is wrong and T 0.6 does not hide what RL has to build.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `tiny` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
benchmarks = "tiny_arithmetic"                 # names in klear_lib.evaluation.benchmarks.BENCHMARKS
benchmark_paths = ""                           # local files instead of the hub, e.g. Klear JSONL (format: see above)
checkpoints = ""                               # checkpoints to evaluate as given (format: see above)
train_tiny = True                              # first build the tiny SFT and SFT+RL checkpoints (the stand-in rows)
engine = "hf"                                  # "hf" (transformers generate) or "vllm"
n = 8                                          # samples per problem; 0: each benchmark's paper n (64 math, 8 code)
budgets = "40,56"                              # response-token budgets (paper: 32768 and 65536)
yarn_factor = 0.0                              # > 0: YaRN for budgets above original_context (paper: 2.5)
original_context = 32768
temperature = 0.6                              # the paper's
top_p = 0.95
top_k = 20
repetition_penalty = 1.05
seed = 0
limit = 0                                      # first `limit` problems of each benchmark (0: all)
batch_size = 128                               # HF engine: sequences per generate call
judge_workers = "auto"                         # math-verify judge processes: "auto" is this machine's cores
format_rule = "released"                       # the math judge's think-format rule (released / paper / none)
# The tiny task and the tiny training (used when train_tiny): notebook 03's SFT start, then Klear's recipe at tiny
# scale (GPPO ε 0.2/0.28, α 0.1, 16 updates per rollout)
model = "tiny"
n_train = 6000
n_heldout = 128
levels = "1,2,3,4"
sft_lr = 2e-3
sft_epochs = 2.0
sft_batch_size = 16
fork_facts = "2+3->6,5+1->7,7+2->8,9+3->1"
fork_wrong_rate = 0.8
rollouts = 3                                   # notebook 03's GPPO schedule: 3 rollouts of 16 prompts, 16 updates
rollout_prompts = 16                           # each, lr 5e-5 (at α 0 it lifted all six of 03's starts, +0.07-0.19)
mini_batch_prompts = 1
num_generations = 8
max_completion_length = 56
rl_lr = 5.0e-5
sft_alpha = 0.1
eval_every = 3
eval_n = 4
report_to = "none"                             # or tensorboard / trackio / wandb (installed): <run dir>/tracking
use_vllm = False
use_cpu = True
bf16 = False

# %% [markdown]
# ## Configuration

# %% tags=["config"]
import contextlib
import json
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

from klear_lib import claims, models, notebook, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.evaluation import benchmarks as B
from klear_lib.evaluation.evaluate import evaluate_benchmark
from klear_lib.notebook import quiet
from klear_lib.rollout import SamplingConfig, make_engine


def pairs(text, what):
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if "=" not in item:
            raise ValueError(f"{what}: {item!r} is not 'label=value'")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


quiet()
notebook.require(globals(), counts=("original_context", "batch_size"),
                 non_negative=("n", "limit", "yarn_factor", "top_k", "seed"))
judge_workers = notebook.workers(judge_workers, "judge_workers")  # "auto" -> this process's cores
bench_names = [b.strip() for b in benchmarks.split(",") if b.strip()]
unknown = [b for b in bench_names if b not in B.BENCHMARKS]
if unknown:
    raise ValueError(f"benchmarks: unknown {unknown}; valid: {sorted(B.BENCHMARKS)}")
paths = pairs(benchmark_paths, "benchmark_paths")
ckpts = pairs(checkpoints, "checkpoints")
budget_list = [int(b) for b in str(budgets).split(",") if b.strip()]
if not (ckpts or train_tiny):
    raise ValueError("nothing to evaluate: set checkpoints='label=path,...' or train_tiny=True")
base = RLExperimentConfig.from_params(dict(
    model=model, n_train=n_train, n_heldout=n_heldout, levels=levels, sft_lr=sft_lr, sft_epochs=sft_epochs,
    sft_batch_size=sft_batch_size, fork_facts=fork_facts, fork_wrong_rate=fork_wrong_rate, rollouts=rollouts,
    rollout_prompts=rollout_prompts, mini_batch_prompts=mini_batch_prompts, num_generations=num_generations,
    max_completion_length=max_completion_length, rl_lr=rl_lr, sft_alpha=sft_alpha, eval_every=eval_every,
    eval_n=eval_n, eval_temperature=temperature, use_vllm=use_vllm, use_cpu=use_cpu, bf16=bf16, loss_name="gppo",
    seed=seed, report_to=report_to, format_rule=format_rule,
))
# the math judge's format rule (the tiny RL run's reward uses the same); a code benchmark keeps its own judge's
judge_options = {name: {"format_rule": format_rule} if B.BENCHMARKS[name].judge is B.MATH_JUDGE else {}
                 for name in bench_names}
if format_rule != "released" and any(not o for o in judge_options.values()):
    print(f"warning: format_rule = {format_rule!r} applies to the math benchmarks only; "
          f"{[n for n, o in judge_options.items() if not o]} keep their own judge's format check")
protocol = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k or None,
                          repetition_penalty=repetition_penalty, max_new_tokens=max(budget_list), seed=seed)

DECLARED = notebook.declared_claims("07_evaluation")
run_path = notebook.start_run("07_evaluation", run_dir, params=globals(), config={
    "claims_declared": DECLARED,
    "seed": seed, "benchmarks": bench_names, "benchmark_paths": paths, "checkpoints": ckpts, "train_tiny": train_tiny,
    "tiny": base, "engine": engine, "n": n, "budgets": budget_list, "yarn_factor": yarn_factor,
    "original_context": original_context, "protocol": protocol, "limit": limit, "judge_workers": judge_workers,
    "format_rule": format_rule})
print(f"run dir: {run_path}")

# %% [markdown]
# ## The benchmarks
# Each loads through the same interface: the tiny task's held-out split (the same problems notebooks 03-06 score),
# or Klear's benchmark files / the hub (AIME, HMMT) and LiveCodeBench's windows.

# %%
tiny_opts = {"seed": base.data_seed, "n_train": base.n_train, "n_heldout": base.n_heldout,
             "levels": tuple(base.level_list)}
benches = {}
for name in bench_names:
    opts = dict(tiny_opts) if name == "tiny_arithmetic" else {}
    benches[name] = B.load_benchmark(name, path=paths.get(name), limit=limit or None, **opts)
display(pd.DataFrame([{"benchmark": b.name, "kind": b.kind, "problems": len(b.problems),
                       "n": n or b.n, "source": b.source} for b in benches.values()]).set_index("benchmark"))

# %% [markdown]
# ## Tiny checkpoints: SFT, then SFT + GPPO
# Skipped when `train_tiny` is false. The SFT model is the RL notebooks' cached start; the RL run is Klear's recipe
# at tiny scale (GPPO, ε 0.2/0.28, α 0.1, dynamic sampling); its own held-out curve goes to `metrics.jsonl`.

# %%
if train_tiny:
    from klear_lib.train.rl_run import run_rl
    from klear_lib.train.sft import arithmetic_warm_start

    clock = time.perf_counter()
    ws = arithmetic_warm_start(base, run_path / "sft", cache_root=notebook.cache_root(run_path))
    runs.set_seed(seed)
    rl_model, rl_tok = models.load_model_and_tokenizer(ws.sft_dir, dtype=torch.float32)
    with runs.MetricsWriter(run_path / "metrics.jsonl") as writer:
        rl_model, _ = run_rl(base, rl_model, rl_tok, ws.train, ws.heldout, writer,
                             tags={"variant": "gppo", "seed": seed}, tracking_dir=run_path / "tracking" / "rl")
    rl_dir = models.save_model_and_tokenizer(rl_model, rl_tok, run_path / "rl" / "final")
    ckpts = {"SFT": str(ws.sft_dir), "SFT+RL": str(rl_dir), **ckpts}
    print(f"tiny checkpoints ready in {time.perf_counter() - clock:.0f}s")
else:
    (run_path / "metrics.jsonl").touch()
print("checkpoints:", ckpts)


# %% [markdown]
# ## Sampling and judging
# One engine per checkpoint (and per rope setting: YaRN only for budgets above `original_context`), closed before
# the next is built. Samples go to `samples/<checkpoint>/<budget>/<benchmark>.samples.jsonl` as they are
# generated; judged samples and scores beside them.

# %%
def engine_options(yarn):
    if engine == "hf":
        opts = {"dtype": torch.float32 if use_cpu else torch.bfloat16, "batch_size": batch_size}
        if not use_cpu:
            opts["device"] = "cuda"
    else:
        opts = {"dtype": "bfloat16", "seed": seed}
    if yarn:
        opts.update(yarn_factor=yarn_factor, original_max_position_embeddings=original_context)
    return opts


rows, clock = [], time.perf_counter()
with contextlib.ExitStack() as stack:
    # One judge pool per benchmark, opened once for every checkpoint and budget (each benchmark sets up its own).
    pools = {name: stack.enter_context(B.open_judge_pool(bench, workers=judge_workers))
             for name, bench in benches.items()}
    for label, path in ckpts.items():
        for yarn in sorted({bool(yarn_factor) and b > original_context for b in budget_list}):
            eng = make_engine(engine, path, **engine_options(yarn))
            try:
                for budget in [b for b in budget_list if (bool(yarn_factor) and b > original_context) == yarn]:
                    for name, bench in benches.items():
                        sampling = protocol.replace(n=n or bench.n, max_new_tokens=budget)
                        res = evaluate_benchmark(eng, bench, sampling, run_path / "samples" / label / str(budget),
                                                 pool=pools[name], label=f"{label}@{budget}",
                                                 workers=judge_workers, judge_options=judge_options[name])
                        rows.append({"checkpoint": label, "budget": budget, "yarn": yarn, **res})
                        print(f"{label:>8} @{budget:>6} {name:<16} avg@{res['n']} = {res['avg_at_n']:.4f} "
                              f"[{res['ci_low']:.4f}, {res['ci_high']:.4f}]  format {res['format_rate']:.3f}")
            finally:
                eng.close()
                del eng
print(f"evaluation done in {time.perf_counter() - clock:.0f}s")

# %% [markdown]
# ## Results
# avg@n with its 95% bootstrap interval per checkpoint, budget and benchmark; pass@k for every k ≤ n (how much
# more often *some* sample is right than a given one is); the share of samples that kept the format, and the judge's
# reasons.

# %%
res = pd.DataFrame(rows)
res["cell"] = [f"{a:.3f} [{lo:.3f}, {hi:.3f}]" for a, lo, hi in zip(res.avg_at_n, res.ci_low, res.ci_high)]
table = res.pivot_table(index=["checkpoint", "budget"], columns="benchmark", values="cell", aggfunc="first",
                        sort=False)
display(table)
detail = res.set_index(["checkpoint", "budget", "benchmark"])[["problems", "n", "avg_at_n", "ci_low", "ci_high",
                                                               "format_rate"]]
display(detail.style.format({c: "{:.4f}" for c in ["avg_at_n", "ci_low", "ci_high", "format_rate"]}))
display(pd.DataFrame({(r["checkpoint"], r["budget"], r["benchmark"]): r["reasons"] for r in rows}).fillna(0)
        .astype(int).T)

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
labels = [f"{r['checkpoint']}@{r['budget']}\n{r['benchmark']}" for r in rows]
y = res.avg_at_n.to_numpy()
axes[0].bar(range(len(rows)), y, yerr=[y - res.ci_low.to_numpy(), res.ci_high.to_numpy() - y], capsize=4,
            color=["C0" if r["checkpoint"] == "SFT" else "C1" for r in rows])
axes[0].set_xticks(range(len(rows)), labels, fontsize=8)
axes[0].set_ylabel("avg@n (95% bootstrap CI)")
axes[0].set_ylim(0, 1)
axes[0].set_title("accuracy per checkpoint, budget and benchmark")
for r in rows:
    ks = [int(k) for k in r["pass_at_k"]]
    axes[1].plot(ks, list(r["pass_at_k"].values()), marker="o",
                 label=f"{r['checkpoint']}@{r['budget']} {r['benchmark']}")
axes[1].set_xscale("log", base=2)
axes[1].set_xlabel("k")
axes[1].set_ylabel("unbiased pass@k")
axes[1].set_title("pass@k")
axes[1].legend(fontsize=7)
fig.tight_layout()
(run_path / "figures").mkdir(exist_ok=True)
fig.savefig(run_path / "figures" / "evaluation.png", dpi=110)
plt.show()
if any("by_level" in r for r in rows):
    display(pd.DataFrame({f"{r['checkpoint']}@{r['budget']}": r["by_level"] for r in rows if "by_level" in r})
            .rename_axis("level").style.format("{:.3f}"))

# %% [markdown]
# ## Beside the paper (Table 1)
# Klear-Reasoner-8B and its SFT model (reference §7). The paper's rows map onto ours as: SFT model ↔ `SFT`,
# Klear-Reasoner-8B (SFT + GPPO RL) ↔ `SFT+RL`; 32K ↔ the shorter budget, 64K + YaRN ↔ the longer one. On the
# tiny task only the direction can be compared (RL above SFT; a longer budget never below a shorter one), not
# the numbers: the tasks differ.

# %%
PAPER = pd.DataFrame(
    {"AIME24": [75.6, 83.2, 90.5], "AIME25": [70.1, 75.6, 83.2], "HMMT25": [57.6, 60.3, 70.8],
     "LCB v5": [58.5, 61.6, 66.0], "LCB v6": [49.6, 53.1, 58.1]},
    index=["SFT model (as reported)", "Klear-Reasoner-8B, 32K", "Klear-Reasoner-8B, 64K + YaRN"])
display(PAPER)
ours = res.pivot_table(index=["checkpoint", "budget"], columns="benchmark", values="avg_at_n", sort=False) * 100
display(ours.style.format("{:.1f}"))
# The directions Table 1 shows, as claims: a paired difference over problems (each problem's avg@n under two
# conditions; one training seed, so the interval covers the problems and the sampling, not training runs).
def per_problem(label, budget, bench):
    path = run_path / "samples" / label / str(budget) / f"{bench}.judged.jsonl"
    rows_ = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: float(np.mean(r["correct"])) for r in rows_}


claim_list = []
hi_b, lo_b = max(budget_list), min(budget_list)
first_bench = next(iter(benches))
if {"SFT", "SFT+RL"} <= set(res.checkpoint):
    claim_list.append(claims.declared_claim(
        DECLARED, "rl_above_sft", per_problem("SFT+RL", hi_b, first_bench), per_problem("SFT", hi_b, first_bench),
        note=f"{first_bench} at {hi_b} tokens; one training seed: the interval is over problems (and samples)"))
if hi_b != lo_b:
    ck = [c for c in ("SFT+RL", "SFT") if c in set(res.checkpoint)][0]
    claim_list.append(claims.declared_claim(
        DECLARED, "longer_budget", per_problem(ck, hi_b, first_bench), per_problem(ck, lo_b, first_bench),
        note=f"{first_bench}, {ck}: {hi_b} - {lo_b} tokens; one training seed: the interval is over problems"))
made = {c["id"] for c in claim_list}
claim_list = claims.finalize(claim_list, {k: v for k, v in DECLARED.items() if k in made}, where="07 checks")
display(notebook.claims_frame(claim_list) if claim_list else "no checks")
checks = {c["id"]: c["verdict"] for c in claim_list}

beside = {"caption": "Table 1: the paper's avg@n (%) beside ours (avg@n %, 95% bootstrap CI)",
          "columns": ["row", *[f"{c}" for c in PAPER.columns], *[f"ours: {b}" for b in ours.columns]],
          "rows": [], "note": "; ".join(f"{k}: {v}" for k, v in checks.items())}
for idx, prow in PAPER.iterrows():
    beside["rows"].append([f"paper: {idx}", *prow.tolist(), *[None] * len(ours.columns)])
for (ck, bud), orow in ours.iterrows():
    beside["rows"].append([f"ours: {ck} @ {bud} tokens", *[None] * len(PAPER.columns),
                           *[round(float(v), 2) for v in orow.tolist()]])
notebook.write_summary(run_path, {"results": rows, "checks": checks, "claims": claim_list, "beside_paper": beside,
                                  "figures": ["figures/evaluation.png"]})

# %% [markdown]
# What the stand-in **cannot** show: anything about the real benchmarks' difficulty, long-context effects of
# YaRN (the tiny model's context is 512 positions), or code (the tiny RL model is an arithmetic model). The code
# path of this notebook (LiveCodeBench windows, the sandboxed all-tests judge) is exercised by
# `tests/test_benchmarks.py` and by the `gpu` preset.

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine (nbval compares this output).
print("run-dir contract complete:", not runs.check_run_dir(run_path))
cells = {(r["checkpoint"], r["budget"], r["benchmark"]) for r in rows}
print("one row per checkpoint x budget x benchmark:",
      len(rows) == len(cells) == len(budget_list) * len(benches) * len({r["checkpoint"] for r in rows}))
print("every row has n samples per problem:", all(r["n"] == (n or benches[r["benchmark"]].n) for r in rows))
print("intervals contain their estimate:", all(r["ci_low"] <= r["avg_at_n"] <= r["ci_high"] for r in rows))
print("pass@k never falls with k:", all(np.all(np.diff(list(r["pass_at_k"].values())) >= -1e-12) for r in rows))
print("samples written for every row:", all((run_path / "samples" / r["checkpoint"] / str(r["budget"]) /
                                              f"{r['benchmark']}.samples.jsonl").is_file() for r in rows))
print("every check was declared and follows from the rule:", claims.validate_claims(claim_list) == claim_list)
