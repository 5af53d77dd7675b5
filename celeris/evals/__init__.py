"""Judging a model on the synthetic world (``celeris.synthetic``): the held-out evaluation
(``evaluate``; ``celeris eval``), story continuations and infills scored by the story grammar
(``stories``) and the model cards written from them (``card``; ``celeris eval --card``).
``celeris bench --suite stories`` scores long stories with ``celeris.synthetic.longcheck``.

Evaluation reuses the training objectives for its held-out losses, so this package imports
``celeris.train``; nothing in ``celeris.train`` imports this package.
"""
