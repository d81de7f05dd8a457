"""Visualisation: attention heatmaps, position tables, loss curves and an HTML explorer.

Pure functions over NumPy arrays or torch tensors; :mod:`~attnlab.viz.views` makes the
attention views of a trained run on a text. The plots need matplotlib
(``pip install 'attnlab[viz]'``), imported only when a plot is drawn; the HTML explorer needs
nothing beyond NumPy.
"""

from .attention import plot_alignment, plot_attention
from .curves import plot_loss_csv, plot_loss_curve
from .explorer import AttentionView, attention_html, write_attention_html
from .positions import plot_positions, sinusoidal_table
from .views import attention_views, view_names

__all__ = [
    "AttentionView",
    "attention_html",
    "attention_views",
    "plot_alignment",
    "plot_attention",
    "plot_loss_csv",
    "plot_loss_curve",
    "plot_positions",
    "sinusoidal_table",
    "view_names",
    "write_attention_html",
]
