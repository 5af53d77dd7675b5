"""The story-grammar recogniser accepts what the generator writes and rejects the model's slips."""

import pytest

from celeris.evals.stories import INFILL_TAGS, infill_items, openings, story_blocks
from celeris.synthetic import corpus, storycheck


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


def test_card_lists_each_story_grammar_measurement():
    from celeris.evals.card import _story_grammar_lines

    results = [{"prompts": 20, "decoding": "block 32", "grammatical": 0.625, "sentences": 40,
                "unfinished": 0, "examples_bad": ["The."]},
               {"prompts": 20, "decoding": "block 1", "grammatical": 0.69, "sentences": 100,
                "unfinished": 7, "examples_bad": []}]
    lines = _story_grammar_lines(results)
    assert "20 held-out story openings" in lines[0]
    assert lines[2:4] == ["- block 32: 62.5% of 40 sentences; e.g. `The.`",
                          "- block 1: 69.0% of 100 sentences (7 cut off unfinished)"]
    assert _story_grammar_lines([]) == []


def test_openings_validate_their_count():
    assert openings(2) == [" ".join(s.split()[:4]) for s in corpus.heldout_stories(2)]
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 200\], got 0"):
        openings(0)


def test_infill_items_hide_one_lexicon_word_of_a_held_out_sentence_with_its_story_before():
    items = infill_items(30)
    assert items == infill_items(30)                             # fixed
    stories = corpus.heldout_stories(30)
    tags, with_context = set(), 0
    for (context, text, word), story in zip(items, stories):
        assert text.count("[MASK]") == 1 and " [MASK]" in text
        restored = text.replace("[MASK]", word)
        # the context and the restored sentence are the story's own text, in order
        assert story.startswith((context + " " if context else "") + restored)
        assert restored in storycheck.sentences(story)[0]
        assert storycheck.score([restored])["grammatical"] == 1.0
        with_context += bool(context)
        tags.add(storycheck.template(word))
    assert {"NAME", "KIND", "ADJ"} <= tags and tags <= set(INFILL_TAGS)
    assert 5 <= with_context < 30              # both first sentences and later ones occur
    with pytest.raises(ValueError, match=r"n must be an integer in \[1, 200\], got 201"):
        infill_items(201)


def test_card_states_the_infill_score_and_what_exact_means():
    from celeris.evals.card import _infill_lines

    result = {"items": 40, "decoding": "fixed, block 32", "grammatical": 0.85,
              "sentences": 40, "unfinished": 0, "exact": 0.05,
              "examples_bad": ["Soon, a lost his hat."]}
    (line, blank) = _infill_lines(result)
    assert "each of 40 held-out stories" in line and "85.0% of the filled sentences" in line
    assert "the story before that sentence pinned as context" in line
    assert "5.0% restore the hidden word exactly" in line and "`Soon, a lost his hat.`" in line
    assert "alone" not in line
    assert blank == "" and _infill_lines(None) == []
    (line, _) = _infill_lines(result, {**result, "grammatical": 0.625})
    assert "The same sentences alone" in line and line.endswith(": 62.5%.")


def test_stories_are_scored_at_the_default_block_the_wide_block_and_one_at_a_time():
    assert story_blocks(8) == (8, 32, 1)
    assert story_blocks(32) == (32, 1)
    assert story_blocks(1) == (1, 32)
