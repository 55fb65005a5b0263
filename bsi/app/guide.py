"""Help tab (the guide): where to start, what each preset costs, and where bsi's defaults depart from the paper.

The presets' times are :data:`bsi.config.PRESET_COSTS` (measured on 2 CPU
cores; "not measured" where nobody timed one) and the table "the paper and
bsi's defaults" is :func:`bsi.teaching.defaults_table_markdown`, the same
table the README and notebook 02 show: nothing here is written twice.
"""

from __future__ import annotations

import re

from bsi.app.form import QUICK_PRESET, preset_order


def presets_markdown() -> str:
    """Every preset with its measured time on 2 cores and what it gives up for it, as a Markdown table."""
    from bsi.config import PRESET_COSTS
    from bsi.shipped import general_text_costs, general_text_sentence

    text = general_text_costs()
    lines = ["| preset | measured time (2 cores) | what it gives up |", "|---|---|---|"]
    for name in preset_order():
        cost = PRESET_COSTS.get(name)
        time = cost.time_text() if cost else "not measured"
        gives_up = " ".join(filter(None, [cost.gives_up if cost else "",
                                          general_text_sentence(text[name]) if name in text else ""]))
        lines.append(f"| `{name}` | {time} | {gives_up} |")
    return "\n".join(lines)


def defaults_markdown() -> str:
    """The table "the paper and bsi's defaults", its links written as the docs' paths (the app serves no files)."""
    from bsi.teaching import defaults_table_markdown

    return re.sub(r"\[([^\]]+)\]\(([^)#]+)(#[^)]*)?\)", lambda m: f"`{m.group(2)}` ({m.group(1).split(' ', 1)[-1]})",
                  defaults_table_markdown())


def help_markdown() -> str:
    """The whole Help tab as Markdown."""
    return f"""### Where to start
* **Look first.** The dashboard opens on a finished run of the embedded model that ships with bsi (`data/`): the
  Compress tab's plots, **Inspect** (every basis of a layer in a round) and **Answers** show it before you press
  anything, and **Compare** opens the shipped study.
* **Run your own.** Pick the `{QUICK_PRESET}` preset (the *Quick look* button) and press **Start**: the whole
  pipeline on the embedded model, fine-tune, pruning rounds, recovery and evaluation, in its measured time below.
* **Set the method as the paper names it.** *Size mode*: choose *the paper's size rule (KeepRatio)*. *Curvature*:
  `hutchinson` is the paper's perturbation estimate, which reads **eps** (*Compute the rule* gives the value the run
  will use).
* **Compare answers fairly.** Chat and Answers set the compressed model against the run's own fine-tuned dense
  model, and say which reference they show.

### Presets
{presets_markdown()}

### The paper and bsi's defaults
Where bsi's defaults (the `tuned` protocol) depart from the published method, why, and where it was measured. The
paper's settings are one choice away: the `paper` protocol (`bsi compress --protocol paper`).

{defaults_markdown()}

More: `docs/dashboard.md` (this app), `docs/method.md` (the method), `docs/benchmarks.md` (the measurements).
"""


def render() -> None:
    """Lay out the Help tab."""
    import gradio as gr

    gr.Markdown(help_markdown(), elem_id="help-text")


__all__ = ["help_markdown", "presets_markdown", "defaults_markdown", "render"]
