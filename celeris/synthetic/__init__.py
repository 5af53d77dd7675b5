"""The synthetic world the tiny models learn from and are judged on: the story grammar
(``corpus``: stories, long stories and story requests, with their held-out split), the
checkable tasks (``tasks``: problems with exact answers, with their held-out split) and the
text checks that say whether a story is right (``storycheck``: is each sentence a shape the
grammar writes; ``longcheck``: does a long story keep its hero and give what was asked).

Everything here is deterministic from a seed and imports nothing else from celeris: the
training data (``celeris.train``), the evaluations (``celeris.evals``) and the benchmarks
(``celeris.bench``) all read it, and it reads none of them.
"""
