"""The drawing of one :class:`~pipeline.training.report_curves.ParameterPlot` on a matplotlib
axes: the validation metric over the values tried of one parameter, on the values' own axis
(a log axis when they span a decade or more; categories in the order tried), the chosen value
starred and named.

>>> from matplotlib.figure import Figure
>>> from pipeline.training.report_curves import Curve, parameter_plots
>>> curve = Curve("ease", [{"lambda": 1.0}, {"lambda": 100.0}, {"lambda": 10.0}],
...               [0.30, 0.31, 0.32], chosen=2)
>>> ax = Figure().subplots()
>>> plot_parameter(ax, parameter_plots(curve)[0], "ndcg@10", higher=True)
>>> ax.lines[0].get_xdata().tolist(), ax.get_xscale()
([1.0, 10.0, 100.0], 'log')
"""

from __future__ import annotations

from pipeline.training.report_curves import ParameterPlot, profile

MAX_VALUE_TICKS = 8      # more values tried than this: matplotlib's own ticks


def plot_parameter(ax, plot: ParameterPlot, metric: str, higher: bool, *,
                   color: str = "#4c72b0", chosen_color: str = "#c44e52") -> None:
    """The validation metric over the values tried of one parameter, the chosen one starred;
    several points at one value (other parameters varied) are dots under the profile line."""
    categories = list({repr(x): x for x in plot.xs}.values())     # in the order tried
    positions = [repr(x) for x in categories]
    where = ((lambda x: positions.index(repr(x))) if plot.scale == "category"
             else (lambda x: x))
    xs, ys = profile(plot, higher)
    if plot.others_vary:
        ax.plot([where(x) for x in plot.xs], plot.values, "o", color=color,
                alpha=0.35, markersize=5)
    ax.plot([where(x) for x in xs], ys, "-o", color=color, markersize=5,
            linewidth=1.5)
    if plot.chosen is not None:
        x, y = where(plot.xs[plot.chosen]), plot.values[plot.chosen]
        ax.plot([x], [y], "*", color=chosen_color, markersize=18, label="chosen",
                zorder=3)
        ax.annotate(f"chosen: {plot.xs[plot.chosen]:.3g}" if plot.scale != "category"
                    else f"chosen: {plot.xs[plot.chosen]}", (x, y),
                    textcoords="offset points", xytext=(0, -18), ha="center",
                    color=chosen_color, fontsize=8)
    if plot.scale == "category":
        ax.set_xticks(range(len(categories)), [str(x) for x in categories], fontsize=8)
    else:
        if plot.scale == "log":
            ax.set_xscale("log")
            ax.minorticks_off()
        ticks = sorted(set(plot.xs))
        if len(ticks) <= MAX_VALUE_TICKS:      # the values tried, as the config spells them
            ax.set_xticks(ticks, [f"{x:.3g}" for x in ticks])
    ax.set_title(plot.title, fontsize=9)
    ax.set_xlabel(plot.xlabel, fontsize=8)
    ax.set_ylabel(f"validation {metric}", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.margins(x=0.08, y=0.2)
