# %% [markdown]
# # 00 · Reproduction report
#
# Gathers every run directory under the output root (`<output root>/<notebook>/<stamp>/`, the contract of
# `klear_lib.runs`) and writes **`report.html`**: one self-contained page (figures embedded) that opens with a
# card (the primary claims with verdict, effect, interval and seeds; the counts of verdicts and checks; the
# wall-clock and CPU time; the commit and the processor), then every claim, and per ablation notebook its latest
# run's status, the table it set beside the paper's, its figures, its headline numbers, its seeds, config, commit
# and package versions, and the older runs of the same notebook. Failed runs show the error and the cell it came
# from; `make reproduce` also records notebooks that never produced a run directory (`reproduce.json`). The card
# is also written as **`report.md`** beside the page (Markdown: what `klear reproduce` prints at its end).
#
# `make reproduce` runs this notebook last; `klear report` runs it alone (e.g. after `klear run` of one notebook).
# This page shows the same sections as the HTML file.

# %% tags=["parameters"]
# Parameters: flat scalars only (papermill injects overrides after this cell).
run_dir = ""                                   # set by `klear run`; this notebook's own run directory
output_root = ""                               # where the runs are; empty: the folder above this run's own
report_path = ""                               # empty: <output_root>/report.html

# %%
from pathlib import Path

import pandas as pd
from IPython.display import HTML, Markdown, display

from klear_lib import notebook, report, runs

run_path = Path(run_dir) if run_dir else runs.create_run_dir(output_root or notebook.output_root(), "00_report")
run_path.mkdir(parents=True, exist_ok=True)
root = Path(output_root) if output_root else run_path.resolve().parent.parent  # <root>/00_report/<stamp>
out = Path(report_path) if report_path else root / "report.html"
runs.write_run_metadata(run_path, {"output_root": str(root.resolve()), "report_path": str(out.resolve())})
all_runs = [r for r in report.collect_runs(root) if not r.notebook.startswith("00_")]
latest = report.latest_runs(all_runs)
log = report.read_reproduce_log(root)
print(f"{len(all_runs)} run directories of {len(latest)} notebooks under {root}"
      + (f"; reproduce.json: preset {log['preset']}, {log['total_s']:.0f}s" if log else ""))

# %% [markdown]
# ## The card (what the page opens with, and `report.md`)

# %%
display(Markdown(report.card_markdown(report.gather(root).card)))

# %% [markdown]
# ## Status of every notebook's latest run

# %%
overview = pd.DataFrame([{"notebook": nb, "status": r.status, "run": r.stamp, "preset": r.preset,
                          "seeds": ",".join(map(str, r.seeds)), "commit": (r.git.get("commit") or "")[:10],
                          "error": r.error or ""} for nb, r in sorted(latest.items())])
if log:
    secs = {row["notebook"]: row["seconds"] for row in log["rows"]}
    overview["seconds"] = overview["notebook"].map(secs)
display(overview.set_index("notebook") if len(overview) else "no runs yet: run `make reproduce` or `klear run`")

# %% [markdown]
# ## Per notebook

# %%
for nb, run in sorted(latest.items()):
    older = [r for r in all_runs if r.notebook == nb and r.stamp != run.stamp]
    display(HTML(report.run_section_html(run, older)))

# %% [markdown]
# ## The HTML report

# %%
path = report.render_report(root, out)
size = path.stat().st_size
card_path = report.write_card(root, out.with_suffix(".md"))
print(f"wrote {path} ({size / 1e6:.2f} MB) and {card_path}")
failed = sorted(nb for nb, r in latest.items() if r.status != "ran")
runs.write_summary(run_path, {"report": str(path), "bytes": size, "notebooks": sorted(latest),
                              "not_ok": failed, "runs": len(all_runs)})
with runs.MetricsWriter(run_path / "metrics.jsonl"):
    pass  # the report trains nothing; the file keeps the run-directory contract

# %%
# NBVAL_CHECK_OUTPUT
# Invariants of the report, printed in a form that is the same on every machine (nbval compares this output).
html = path.read_text(encoding="utf-8")
print("run-dir contract complete:", not runs.check_run_dir(run_path))
print("at least one notebook has a run:", bool(latest))
print("every latest run ran:", not failed)
print("the claims table comes first:", html.index("<h2>Claims</h2>") < html.index("<h2>Overview</h2>"))
print("every notebook has a section in the HTML:", all(f'<section id="{nb}">' in html for nb in latest))
print("figures embedded:", html.count("data:image/png;base64,") >= sum(len(r.figures) for r in latest.values()))
print("the card opens the page and is written as Markdown:", html.index('class="card"') < html.index("<h2>Claims</h2>")
      and card_path.read_text(encoding="utf-8").startswith("# "))
