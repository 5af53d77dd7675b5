"""The story-grammar recogniser accepts what the generator writes and rejects the model's slips."""

from celeris.train import corpus, storycheck


def test_every_sentence_the_generator_writes_is_recognised():
    fresh = corpus.stories(300, seed=99, split="train") + corpus.heldout_stories(50)
    report = storycheck.score(fresh)
    assert report["sentences"] > 1000
    assert report["grammatical"] == 1.0 and report["examples_bad"] == []


def test_a_dropped_noun_or_a_stray_article_is_not_grammatical():
    assert storycheck.template("Once upon a time, there was a curious old man named Oscar.") \
        == "Once upon a time, there was a ADJ KIND named NAME."
    report = storycheck.score([", there was a curious old named Oscar. The."], ["Once upon a time"])
    assert report["sentences"] == 2 and report["grammatical"] == 0.0
    assert report["examples_bad"] == ["Once upon a time, there was a curious old named Oscar.",
                                      "The."]


def test_prompt_is_glued_on_and_an_unfinished_tail_is_counted_apart():
    report = storycheck.score([" fox named Tom. Tom liked to"], ["Once upon a time, there was a brave"])
    assert report == {"grammatical": 1.0, "sentences": 1, "unfinished": 1, "examples_bad": []}
    assert storycheck.sentences("A b. C d! tail") == (["A b.", "C d!"], "tail")
