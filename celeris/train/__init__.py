"""Training pipeline for the shipped tiny models (celeris-tiny and its AR twin).

Layer L5: imports only the public ``celeris`` names (lazily, inside functions) and L0 modules.
"""

from celeris.train.corpus import heldout_stories, stories, story
from celeris.train.evaluate import evaluate
from celeris.train.stream import Item, Mix, Stream
from celeris.train.tasks import TASKS, Example, eval_examples, make_examples, score, split_of
from celeris.train.trainer import PRESETS, TRAIN_PRESETS, train

__all__ = ["train", "evaluate", "PRESETS", "TRAIN_PRESETS", "TASKS", "Example",
           "make_examples", "eval_examples", "score", "split_of", "story", "stories",
           "heldout_stories", "Stream", "Mix", "Item"]
