"""What each memory writes into its own TensorBoard run: one ``SummaryWriter`` per run, and a judgment
memory's figures, texts and tables.

A run is a subfolder of the logger's version folder named after the memory (``version_0/seed``);
the version folder itself is the root run (the logger's own writer), which holds what belongs to
no memory: the stream's drift, the Custom Scalars layout and the hyperparameters. The tag names
are the same in every run, so TensorBoard draws one tag of all the memories on one chart.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from gae import JudgmentMemory
from training.plots import criterion_weights

GATE_LOG_ROWS = 100  # the gate log text shows the most recent events; the count says how many in all


class RunWriters:
    """The root writer (the logger's ``experiment``) and one writer of the same class per run.

    Args:
        root: the logger's ``SummaryWriter``.
        folder: its folder, the version's (``root.get_logdir()``).
        runs: the run names, each a folder name under ``folder``.
    """

    def __init__(self, root: Any, folder: str, runs: Iterable[str]) -> None:
        self.root = root
        self.runs = {name: type(root)(os.path.join(folder, name)) for name in runs}

    def __getitem__(self, run: str) -> Any:
        return self.runs[run]

    def flush(self) -> None:
        for writer in (self.root, *self.runs.values()):
            writer.flush()

    def close(self) -> None:
        """Close the runs' writers (the logger closes its own)."""
        for writer in self.runs.values():
            writer.close()
        self.root.flush()


def log_figures(writer: Any, memory: JudgmentMemory, decision: int) -> None:
    """Each category's criterion attention (and, with ``learning='lvq'``, relevance) as an image
    (``attention_chart/<category>``, ``relevance_chart/<category>``), one scalar per criterion, and
    each category's prototype histogram."""
    attention = memory.criterion_attention().detach().cpu()
    # learning='lvq' learns relevances online (GRLVQ): K x relevance, so that 1 is neutral as for attention
    relevance = memory.relevances().detach().cpu() * memory.n_factors if memory.config.learning == "lvq" else None
    for c, category in enumerate(memory.category_names):
        writer.add_figure(f"attention_chart/{category}", criterion_weights(
            attention[c], memory.factor_names, f"{category}: criterion attention"), decision)
        if relevance is not None:
            writer.add_figure(f"relevance_chart/{category}", criterion_weights(
                relevance[c], memory.factor_names, f"{category}: relevance (K x, learned online)"), decision)
        for k, criterion in enumerate(memory.factor_names):
            writer.add_scalar(f"attention/{category}/{criterion}", float(attention[c, k]), decision)
            if relevance is not None:
                writer.add_scalar(f"relevance/{category}/{criterion}", float(relevance[c, k]), decision)
        known = memory.initialized[c]
        if bool(known.any()):
            writer.add_histogram(f"prototypes/{category}", memory.centroids[c][known].cpu(), decision)


def log_tracking(writer: Any, memory: JudgmentMemory, decision: int) -> None:
    """``drift_mode='adaptive'``: how many categories score with their tracking prototypes, and each
    one's lead (its evidence: above 0, they score)."""
    lead = memory.tracking_lead.detach().cpu()
    writer.add_scalar("gate/tracking_categories", float((lead > 0).sum()), decision)
    for name, value in zip(memory.category_names, lead.tolist(), strict=True):
        writer.add_scalar(f"tracking_lead/{name}", value, decision)


def log_trust(writer: Any, memory: JudgmentMemory, decision: int) -> None:
    """A memory with judges (docs/judges.md): each category's trust in each judge (``trust/<category>/<judge>``,
    summing to 1 over the judges) and the mean over the categories (``trust_mean/<judge>``: apart from
    the categories' tags, which a category named ``mean`` would share)."""
    trust = memory.trust().detach().cpu()
    for j, judge in enumerate(memory.judge_names()):
        writer.add_scalar(f"trust_mean/{judge}", float(trust[:, j].mean()), decision)
        for c, category in enumerate(memory.category_names):
            writer.add_scalar(f"trust/{category}/{judge}", float(trust[c, j]), decision)


def log_promotions(writer: Any, memory: JudgmentMemory, count: int) -> None:
    """Each of the last ``count`` promotions as text at its decision, with its evidence."""
    for r in memory.promotion_records(last=count):
        writer.add_text("gate/promotion", f"decision {r['step']}: the prototypes of **{r['category']}** "
                        f"were promoted to their run means (mean shift {r['shift']:.3f}); "
                        f"CUSUM {r['statistic']:.2f} after {r['shadow_right']} decisions closer to the shadows "
                        f"and {r['main_right']} closer to the prototypes", r["step"] + 1)


def log_recycles(writer: Any, memory: JudgmentMemory, count: int) -> None:
    """Each of the last ``count`` recycled prototypes as text at its decision."""
    log = memory.recycle_log
    names = memory.category_names, memory.action_names
    for s, c, a, p, d in zip(*(field[-count:] for field in log), strict=True):
        writer.add_text("gate/recycle", f"decision {int(s)}: prototype {int(p)} of **{names[1][int(a)]}** in "
                        f"**{names[0][int(c)]}** had the fewest recent wins and was replaced by a decision "
                        f"{float(d):.3f} from every prototype of its action", int(s) + 1)


def log_explanation(writer: Any, memory: JudgmentMemory, x: Any, category: Any, verified: int, position: int,
                    decision: int) -> None:
    """One decision (``x`` (1, K), ``category`` (1,)), explained by the memory as it stands, as text."""
    explanation = memory.explain(x, category)
    text = "\n".join("    " + line for line in str(explanation).splitlines())  # a Markdown code block
    writer.add_text("explain/decision", f"decision {position}, verified action **{memory.action_names[verified]}**:"
                    f"\n\n{text}", decision)


def gate_log_table(memory: JudgmentMemory, decisions: int) -> str:
    """The most recent learning events (gate steps, promotions, recycled prototypes) of ``memory``
    after ``decisions`` decisions, as a Markdown table for TensorBoard's text plugin; every
    promotion is listed with its evidence."""
    records = memory.gate_records()
    promotions = [r for r in records if r["event"] == "promoted"]
    recycles = [r for r in records if r["event"] == "recycled"]
    lines = [f"{len(records) - len(promotions) - len(recycles)} gate events, {len(promotions)} promotions and "
             f"{len(recycles)} recycled prototypes in {decisions} decisions"
             + (f"; the last {GATE_LOG_ROWS} events shown" if len(records) > GATE_LOG_ROWS else ""), "",
             "| step | event | category | action | displacement | eta | evidence |",
             "|---:|---|---|---|---:|---:|---|"]
    for r in records[-GATE_LOG_ROWS:]:
        if r["event"] == "gated":
            lines.append(f"| {r['step']} | gated | {r['category']} | {r['action']} | {r['disp']:.3f} | "
                         f"{r['eta']:.4f} | |")
        elif r["event"] == "recycled":
            lines.append(f"| {r['step']} | recycled | {r['category']} | {r['action']} | {r['disp']:.3f} | 1 | "
                         f"prototype {r['prototype']}, the fewest recent wins |")
        else:
            lines.append(f"| {r['step']} | **promoted** | {r['category']} | all | {r['shift']:.3f} | | "
                         f"CUSUM {r['statistic']:.2f}; {r['shadow_right']} decisions closer to the shadows, "
                         f"{r['main_right']} closer to the prototypes |")
    return "\n".join(lines)
