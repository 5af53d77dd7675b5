"""Training for the shipped tiny models: the data stream, objectives, trainer, self-distillation
data, weight averaging and the recipes that chain them (read here, run by ``celeris.pipeline``
for ``celeris train --recipe``).

Layer L5: imports only the public ``celeris`` names (lazily, inside functions), L0 modules and
the synthetic data (``celeris.synthetic``); never ``celeris.evals``.
"""

from celeris.train.stream import Item, Mix, Stream
from celeris.train.trainer import PRESETS, TRAIN_PRESETS, train

__all__ = ["train", "PRESETS", "TRAIN_PRESETS", "Stream", "Mix", "Item"]
