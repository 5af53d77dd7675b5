"""Training for the shipped tiny models: the data stream, objectives, trainer, self-distillation
data, weight averaging and the recipes that chain them (``celeris train --recipe``).

Layer L5: imports only the public ``celeris`` names (lazily, inside functions) and L0 modules.
"""

from celeris.train.stream import Item, Mix, Stream
from celeris.train.trainer import PRESETS, TRAIN_PRESETS, train

__all__ = ["train", "PRESETS", "TRAIN_PRESETS", "Stream", "Mix", "Item"]
