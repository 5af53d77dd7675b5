"""Document filters of the celeris harness tasks (lm_eval's ``!function``)."""


def only_mc(dataset):
    """The problems whose answer is one digit: the multiple-choice task's."""
    return dataset.filter(lambda doc: doc["task"] in ("max", "count"))
