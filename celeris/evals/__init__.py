"""The synthetic world the tiny models learn from and are judged on, and the judging: the story
grammar (``corpus``) and checkable tasks (``tasks``) with their held-out splits, the story
checkers (``storycheck``, ``longcheck``; ``celeris bench --suite stories``), the held-out eval
(``evaluate``; ``celeris eval``) and the model cards written from it (``card``).

``evaluate`` is imported from ``celeris.evals.evaluate`` (it needs the training objectives'
held-out losses, and ``celeris.train`` imports this package's generators).
"""

from celeris.evals.corpus import heldout_stories, stories, story
from celeris.evals.tasks import TASKS, Example, eval_examples, make_examples, score, split_of

__all__ = ["TASKS", "Example", "make_examples", "eval_examples", "score", "split_of", "story",
           "stories", "heldout_stories"]
