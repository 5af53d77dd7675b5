"""Long stories: the recogniser accepts what the long-story generator writes, and the hero and
request checks catch a changed hero, an undeclared name and an ignored request."""

import random

import pytest

from celeris import GenerationParams
from celeris.synthetic import corpus, longcheck, storycheck
from celeris.synthetic.longcheck import Hero

# A hand-written long story in the corpus's own sentence shapes: the base of the corruptions.
STORY = ("Once upon a time, there was a brave fox named Tom. Tom liked to play every day.\n\n"
         "Tom met a shy cat named Mia. \"Let's play together!\" said Mia. "
         "They laughed and had fun.\n\n"
         "Suddenly, Tom lost his kite. He looked everywhere and felt sad. "
         "Then Mia helped him find it under a tree.\n\n"
         "From that day on, Tom and Mia were best friends.")


def _replace_in_paragraphs(text: str, first: int, old: str, new: str) -> str:
    paras = text.split("\n\n")
    return "\n\n".join(paras[:first] + [p.replace(old, new) for p in paras[first:]])


def _requests(n: int, seed: int) -> list[corpus.StoryRequest]:
    rng = random.Random(f"test-long-requests:{seed}")
    return [corpus.long_request(rng) for _ in range(n)]


def _only_unsaid_places_fail(requests: list[corpus.StoryRequest], report: dict) -> None:
    # corpus.long_story(place=...) does not always say the place (~5% of place requests):
    # the checker must report exactly those misses, and nothing else.
    assert report["request_honoured"] >= 0.99
    for fail in report["examples_failed"]:
        req = requests[fail["index"]]
        assert fail["check"] == "request" and fail["reason"].startswith("asked for the place")
        assert req.asks["place"] not in req.story.lower()


def test_long_corpus_stories_are_grammatical_and_keep_their_hero():
    rng = random.Random("celeris-long-story:4321:eval")
    stories = [corpus.random_long_story(rng, "eval") for _ in range(200)]
    report = longcheck.long_score(stories)
    assert report["sentences"] > 4000 and report["grammatical"] >= 0.999
    assert report["hero_kept"] == 1.0 and report["unfinished"] == 0
    assert report["request_honoured"] is None and report["examples_failed"] == []
    assert report["objects_kept"] == 1.0 and report["repeated_sentences"] < 0.02


FOUND = ("Once upon a time, there was a brave fox named Tom. Tom liked to play every day.\n\n"
         "One day, Tom found a shiny coin in the sand. The coin was heavy and old. "
         "Tom took the coin home.\n\n"
         "One day, Tom found an apple under a tree. The apple was small and soft.")


@pytest.mark.parametrize("old,new,reason", [
    ("The coin was", "The pumpkin was", "found a coin, then wrote of the pumpkin"),
    ("took the coin home", "took the key home", "found a coin, then wrote of the key"),
    ("The apple was", "The kite was", "found an apple, then wrote of the kite")])
def test_a_found_object_that_turns_into_another_is_caught(old, new, reason):
    assert longcheck.objects_kept(FOUND) == (True, "")
    assert longcheck.objects_kept(FOUND.replace(old, new)) == (False, reason)


def test_the_first_found_object_is_named_and_none_when_nothing_is_found():
    assert longcheck.first_found_object(FOUND) == "coin"
    assert longcheck.first_found_object(FOUND.replace("a shiny coin", "a Red Kite")) == "kite"
    assert longcheck.first_found_object("Tom found his friend. They played.") is None


def test_repeated_sentences_are_counted_word_for_word():
    assert longcheck.repeated_sentences(FOUND) == (0, 7)
    looped = FOUND.replace("Tom liked to play every day.",
                           "Tom liked to play every day. Tom liked to  play every day.")
    assert longcheck.repeated_sentences(looped) == (1, 8)
    report = longcheck.long_score([FOUND, looped.replace("The coin was", "The kite was")])
    assert report["objects_kept"] == 0.5
    assert report["repeated_sentences"] == pytest.approx(1 / 15)
    assert report["examples_failed"] == [{"index": 1, "check": "objects",
                                          "reason": "found a coin, then wrote of the kite"}]


def test_distinct_sentences_sees_one_story_told_with_other_names_as_one_story():
    renamed = FOUND.replace("Tom", "Mia")
    assert renamed != FOUND
    assert longcheck.distinct_sentences([FOUND]) == 1.0               # 7 sentences, all distinct
    assert longcheck.distinct_sentences([FOUND, renamed]) == 0.5      # the same 7 again
    assert longcheck.distinct_sentences([FOUND, FOUND, FOUND, FOUND]) == 0.25
    other = FOUND.replace("The coin was", "The kite was")              # one sentence differs
    assert longcheck.distinct_sentences([FOUND, other]) == pytest.approx(8 / 14)
    assert longcheck.distinct_sentences([]) == 0.0
    stories = [r.story for r in corpus.heldout_long_requests(40)]
    assert 0.6 < longcheck.distinct_sentences(stories) < 0.7           # the corpus: 0.65
    assert longcheck.long_score([FOUND, renamed])["distinct_sentences"] == 0.5


@pytest.mark.parametrize("requests", [_requests(200, seed=1), corpus.heldout_long_requests(200)],
                         ids=["train", "heldout"])
def test_long_request_stories_honour_their_requests(requests):
    report = longcheck.long_score([r.story for r in requests], requests)
    assert report["grammatical"] >= 0.999 and report["hero_kept"] == 1.0
    assert sum(bool(r.asks) for r in requests) > 150          # most ask for something
    _only_unsaid_places_fail(requests, report)


def test_the_hero_is_read_from_either_introduction_form():
    assert longcheck.hero_of(STORY) == Hero("fox", "brave", "Tom")
    assert longcheck.hero_of("Once upon a time, there was a curious old man named Oscar.") \
        == Hero("old man", "curious", "Oscar")
    assert longcheck.hero_of("Mia was a shy cat who lived in the park. She was happy.") \
        == Hero("cat", "shy", "Mia")
    assert longcheck.hero_of("Long ago, an old woman called Ruby lived by the sea.") \
        == Hero("old woman", None, "Ruby")
    assert longcheck.hero_of("Once upon a time, there was a little girl.") is None
    assert longcheck.hero_of("Tom met a shy cat named Mia.") == Hero("cat", "shy", "Mia")
    assert longcheck.hero_of("") is None
    for r in _requests(50, seed=2):
        hero = longcheck.hero_of(r.story)
        assert all(getattr(hero, k) == v for k, v in r.asks.items() if k in Hero._fields)


def test_paragraphs_survive_and_do_not_change_sentences_or_templates():
    story = corpus.random_long_story(random.Random("celeris-long-story:4321:eval"), "eval")
    paras = longcheck.paragraphs(story)
    assert 4 <= len(paras) <= 6 and "\n\n".join(paras) == story
    flat = story.replace("\n\n", " ")
    done, tail = storycheck.sentences(story)
    assert tail == "" and all("\n" not in s for s in done)
    assert done == storycheck.sentences(flat)[0]
    assert [storycheck.template(s) for s in done] == \
        [storycheck.template(s) for s in storycheck.sentences(flat)[0]]
    assert storycheck.score([story]) == storycheck.score([flat])
    assert longcheck.paragraphs(STORY)[-1] == "From that day on, Tom and Mia were best friends."


def test_the_hand_made_story_passes_every_check():
    assert longcheck.hero_kept(STORY) == (True, "")
    assert longcheck.request_honoured(STORY, {"kind": "fox", "adj": "brave", "name": "Tom",
                                              "obj": "kite"}) == (True, "")
    report = longcheck.long_score([STORY])
    assert report["grammatical"] == 1.0 and report["sentences"] == 10


@pytest.mark.parametrize("text, reason", [
    (_replace_in_paragraphs(STORY, 2, "Tom", "Sam"),
     "Sam is named but never introduced (the hero is Tom)"),
    (STORY.replace("Suddenly, Tom lost", "Tom met a little dog named Tom. Suddenly, Tom lost"),
     "the hero Tom (a fox) is introduced again as a dog"),
    (STORY.replace("Suddenly, Tom lost", "Tom met a little cat named Mia. Suddenly, Tom lost"),
     "Mia is introduced twice"),
    (STORY.replace("Then Mia helped", "Then Ben helped"),
     "Ben is named but never introduced (the hero is Tom)"),
    (STORY.replace("Tom liked to play", "Mia liked to play"),
     "Mia is named before it is introduced (the hero is Tom)"),
    (STORY.replace("a brave fox named Tom", "a brave fox"),
     "the first sentence introduces no named hero"),
    (STORY.replace("From that day on, Tom and Mia were best friends.",
                   "In the end, Mia was very happy."),
     "the hero Tom is not named in the last paragraph (it names Mia)"),
])
def test_a_changed_or_undeclared_character_breaks_the_hero(text, reason):
    assert longcheck.hero_kept(text) == (False, reason)


def test_a_pronoun_only_ending_passes_unless_the_name_is_required():
    text = STORY.replace("From that day on, Tom and Mia were best friends.",
                         "And they all lived happily ever after.")
    assert longcheck.hero_kept(text) == (True, "")
    assert longcheck.hero_kept(text, name_in_last=True) == \
        (False, "the hero Tom is not named in the last paragraph")


@pytest.mark.parametrize("asks, reason", [
    ({"kind": "cat"}, "asked for kind 'cat', the hero's is 'fox'"),
    ({"name": "Sam", "kind": "fox"}, "asked for name 'Sam', the hero's is 'Tom'"),
    ({"adj": "shy"}, "asked for adj 'shy', the hero's is 'brave'"),
    ({"obj": "ball"}, "asked for the object 'ball', which the story never mentions"),
    ({"place": "in the park"}, "asked for the place 'in the park', which the story never mentions"),
])
def test_a_request_the_story_ignores_is_not_honoured(asks, reason):
    assert longcheck.request_honoured(STORY, asks) == (False, reason)


def test_request_checks_read_words_and_places_not_substrings():
    text = STORY.replace("Tom liked to play every day.", "Tom liked to bake cakes in the park.")
    assert longcheck.request_honoured(text, {"obj": "cake"})[0] is False
    assert longcheck.request_honoured(text, {"place": "In the Park"}) == (True, "")
    assert longcheck.request_honoured("Once upon a time, there was a little girl.",
                                      {"kind": "girl"}) == \
        (False, "asked for kind 'girl', but no named hero is introduced")
    with pytest.raises(ValueError, match=r"asks: unknown key\(s\) colour"):
        longcheck.request_honoured(STORY, {"colour": "red"})


def test_long_score_counts_grammar_hero_requests_and_unfinished_texts():
    odd = STORY.replace("They laughed and had fun.", "The fox named Tom was a happy.")
    cut = STORY[:STORY.index(" He looked")] + " He looked every"
    quoted = 'Once upon a time, there was a brave fox named Tom. Tom said, "You can do it!"'
    renamed = STORY.replace("Then Mia helped", "Then Ben helped")
    ask = lambda asks: corpus.StoryRequest("", asks, "")  # noqa: E731
    report = longcheck.long_score(
        [STORY, odd, cut, quoted, renamed],
        [ask({"obj": "kite"}), ask({"kind": "cat"}), ask({}), ask({}), ask({"name": "Tom"})])
    assert report["texts"] == 5 and report["unfinished"] == 1       # the quote is finished
    assert "The fox named Tom was a happy." in report["examples_bad"]
    assert report["grammatical"] < 1.0
    assert report["hero_kept"] == 0.8 and report["request_honoured"] == 0.8
    assert report["examples_failed"] == [
        {"index": 1, "check": "request", "reason": "asked for kind 'cat', the hero's is 'fox'"},
        {"index": 4, "check": "hero",
         "reason": "Ben is named but never introduced (the hero is Tom)"}]
    assert report["request_fields"] == {"kind": {"asked": 1, "honoured": 0},
                                        "name": {"asked": 1, "honoured": 1},
                                        "obj": {"asked": 1, "honoured": 1}}
    with pytest.raises(ValueError, match=r"requests: expected one per text \(2\), got 1"):
        longcheck.long_score([STORY, STORY], [ask({})])


def test_request_fields_count_every_miss_of_a_story_not_only_the_first():
    asks = [{"kind": "fox", "adj": "shy", "place": "in the park", "obj": "kite"},
            {"kind": "cat", "adj": "brave", "name": "Tom"}, {}]
    stories = [STORY, STORY, STORY]
    assert longcheck.request_misses(STORY, asks[0]) == [
        ("adj", "asked for adj 'shy', the hero's is 'brave'"),
        ("place", "asked for the place 'in the park', which the story never mentions")]
    fields = longcheck.long_score(
        stories, [corpus.StoryRequest("", a, "") for a in asks])["request_fields"]
    assert fields == {"kind": {"asked": 2, "honoured": 1}, "adj": {"asked": 2, "honoured": 1},
                      "name": {"asked": 1, "honoured": 1}, "place": {"asked": 1, "honoured": 0},
                      "obj": {"asked": 1, "honoured": 1}}
    assert longcheck.fields_line(fields) == \
        "kind 1/2, adj 1/2, name 1/1, place 0/1, obj 1/1"
    nobody = "Once upon a time, there was a little girl."
    assert [k for k, _ in longcheck.request_misses(nobody, {"kind": "girl", "name": "Mia"})] \
        == ["kind", "name"]


def test_long_decoding_keeps_the_default_steps_per_block():
    base = GenerationParams(gen_length=64, block_length=32, steps=64)
    long = longcheck.long_params(base, 448)
    assert (long.gen_length, long.block_length, long.steps) == (448, 32, 448)
    half = longcheck.long_params(base.replace(steps=32), 448)
    assert half.steps == 14 * 16 and half.steps_per_block == 16
    assert longcheck.long_params(GenerationParams(block_length=8), 20).steps is None
