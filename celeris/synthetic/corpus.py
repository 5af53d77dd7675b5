"""Procedurally generated English stories and story requests: the text of the training data,
from our own generator (no downloaded text), deterministic from a seed.

The story grammar uses a few hundred words (characters, places, objects, verbs, adjectives,
feelings) and small plot arcs (finding something, meeting a friend, losing and finding, wanting
and trying), 2-6 sentences a story. Long stories (150-400 tokens, one named hero kept to the
end) are built from the same arcs; story requests ("Tell me a story about a cat.") come with a
story that honours them. Held-out stories are chosen by a stable hash of their text, and the
training stream never yields one.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------- vocabulary
NAMES_SHE = ("Lily", "Sara", "Mia", "Anna", "Lucy", "Emma", "Zoe", "Rosa", "Bella", "Ruby",
             "Ella", "Nina", "Daisy", "Molly", "Ivy", "Luna")
NAMES_HE = ("Tom", "Max", "Ben", "Sam", "Leo", "Jack", "Tim", "Finn", "Oscar", "Pip",
            "Toby", "Jake", "Milo", "Hugo", "Otto", "Bob")

# kind -> fixed pronoun ("he"/"she") or None (either)
PEOPLE = {"girl": "she", "boy": "he", "king": "he", "queen": "she", "princess": "she",
          "prince": "he", "farmer": None, "baker": None, "teacher": None, "wizard": None,
          "sailor": None, "knight": None, "old man": "he", "old woman": "she", "robot": None,
          "doctor": None, "painter": None}
ANIMALS = ("cat", "dog", "rabbit", "bird", "fox", "bear", "mouse", "frog", "duck", "owl",
           "lion", "horse", "pig", "cow", "sheep", "turtle", "squirrel", "dragon", "fish",
           "bee", "puppy", "kitten", "goat", "monkey", "elephant", "tiger", "deer", "hen")
KINDS = tuple(PEOPLE) + ANIMALS

ADJECTIVES = ("little", "big", "happy", "brave", "shy", "kind", "curious", "clever", "sleepy",
              "friendly", "funny", "gentle", "tiny", "old", "young", "busy", "lazy", "quiet",
              "proud", "silly", "smart", "strong", "fast", "grumpy", "cheerful", "lonely")
COLORS = ("red", "blue", "green", "yellow", "white", "black", "brown", "pink", "purple",
          "orange", "golden", "silver", "shiny")
OBJECTS = ("ball", "kite", "box", "hat", "key", "book", "apple", "cake", "flower", "shell",
           "stone", "map", "boat", "drum", "bell", "lamp", "coin", "ring", "toy", "blanket",
           "basket", "cookie", "feather", "leaf", "umbrella", "sock", "bucket", "cup", "scarf",
           "balloon", "car", "doll", "shoe", "egg", "carrot", "pumpkin", "letter", "crown")
# groups of object traits; a description takes two traits from different groups
OBJECT_TRAITS = (("small", "big", "tiny"), ("heavy", "light"), ("old", "new"),
                 ("shiny", "pretty", "strange", "dirty"), ("soft", "smooth", "round", "warm",
                                                           "cold"))
PLACES = ("in the forest", "in a small village", "by the sea", "on a farm", "in the park",
          "in a big city", "near a river", "in the garden", "on a hill", "in a castle",
          "in the mountains", "near the school", "in a cozy house", "on an island",
          "in the jungle", "in the desert", "by the lake", "in a green meadow", "in a tall tree",
          "under a bridge", "in a busy town", "next to a pond", "in a quiet valley")
FIND_SPOTS = ("under a tree", "near the river", "in the grass", "behind the door", "in the sand",
              "under the bed", "in a hole", "by the road", "on the path", "in the snow",
              "next to a rock", "in an old box", "on the beach", "in the mud")
ACTIVITIES = ("play", "sing", "dance", "run", "jump", "swim", "read", "draw", "climb trees",
              "play outside", "look at the stars", "bake cakes", "build things", "explore",
              "help others", "pick flowers", "tell jokes", "fly kites", "go on adventures",
              "sleep in the sun", "paint pictures", "ride a bike", "count the clouds")
ACTIVITIES_PAST = {"play": "played", "sing": "sang", "dance": "danced", "run": "ran",
                   "jump": "jumped", "swim": "swam", "read": "read", "draw": "drew",
                   "climb trees": "climbed trees", "play outside": "played outside",
                   "look at the stars": "looked at the stars", "bake cakes": "baked cakes",
                   "build things": "built things", "explore": "explored",
                   "help others": "helped others", "pick flowers": "picked flowers",
                   "tell jokes": "told jokes", "fly kites": "flew kites",
                   "go on adventures": "went on adventures",
                   "sleep in the sun": "slept in the sun", "paint pictures": "painted pictures",
                   "ride a bike": "rode a bike", "count the clouds": "counted the clouds"}
GOALS = ("climb the big hill", "cross the river", "reach the top of the tree", "fly",
         "swim across the lake", "find the lost key", "catch a star", "win the race",
         "build a tall tower", "learn to read", "see the sea", "bake a big cake")
FEELINGS = ("happy", "sad", "scared", "excited", "surprised", "tired", "angry", "proud",
            "worried", "lonely", "glad", "curious", "hungry", "sleepy")
GOOD_FEELINGS = ("happy", "glad", "proud", "excited")
TIMES = ("morning", "afternoon", "evening", "night", "day")
WEATHER = ("The sun was shining and the sky was blue.", "It was a cold and windy day.",
           "It began to rain.", "The wind was blowing hard.", "Snow was falling softly.",
           "The birds were singing in the trees.", "It was a warm summer day.",
           "The moon was big and bright.", "Dark clouds filled the sky.")
LESSONS = ("it is good to share", "friends help each other", "it is good to be brave",
           "it is fun to try new things", "being kind is important",
           "you should never give up", "it is nice to say thank you",
           "it is good to listen")


def article(word: str) -> str:
    """'a' or 'an' + word."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# --------------------------------------------------------------------------- characters
@dataclass
class Character:
    kind: str
    adj: str
    pron: str                   # "he" / "she"
    name: str | None = None
    mentioned: bool = False

    @property
    def obj(self) -> str:
        return "him" if self.pron == "he" else "her"

    @property
    def poss(self) -> str:
        return "his" if self.pron == "he" else "her"

    def intro(self, rng: random.Random) -> str:
        """First mention: 'a brave fox named Tom' / 'a little girl'."""
        self.mentioned = True
        base = article(f"{self.adj} {self.kind}")
        if self.name:
            return f"{base} {rng.choice(('named', 'called'))} {self.name}"
        return base

    def ref(self, rng: random.Random, pronoun_ok: bool = True) -> str:
        """Later mention: name, 'the fox' or the pronoun."""
        options = [self.name] * 2 if self.name else [f"the {self.kind}", f"the {self.adj} {self.kind}"]
        if pronoun_ok:
            options.append(self.pron)
        return rng.choice(options)

    def full(self) -> str:
        return self.name or f"the {self.kind}"


def make_character(rng: random.Random, kind: str | None = None, adj: str | None = None,
                   name: str | None = None, named: bool | None = None,
                   avoid: Character | None = None) -> Character:
    while True:
        k = kind or rng.choice(KINDS)
        pron = PEOPLE.get(k) or rng.choice(("he", "she"))
        if name is not None:
            pron = "she" if name in NAMES_SHE else "he"
        n = name
        if n is None and (named if named is not None else rng.random() < 0.7):
            n = rng.choice(NAMES_HE if pron == "he" else NAMES_SHE)
        c = Character(kind=k, adj=adj or rng.choice(ADJECTIVES), pron=pron, name=n)
        if avoid is None or (c.name != avoid.name or c.name is None) and c.kind != avoid.kind:
            return c
        kind = None if kind == avoid.kind else kind


# --------------------------------------------------------------------------- story grammar
@dataclass
class _Story:
    rng: random.Random
    hero: Character
    place: str
    obj: str | None = None
    friend: Character | None = None
    sentences: list[str] = field(default_factory=list)
    obj_used: bool = False       # the story's object has been mentioned
    said_one_day: bool = False

    def one_day(self) -> str:
        """'one day' once per story, then other time phrases."""
        if not self.said_one_day:
            self.said_one_day = True
            return "one day"
        return self.rng.choice(("later", "the next day", "after that", "one morning", "soon"))

    def new_obj(self) -> str:
        """The object for a find/lose arc: the constrained one first, then fresh ones."""
        if self.obj is None or self.obj_used:
            choices = [o for o in OBJECTS if o != self.obj]
            self.obj = self.rng.choice(choices)
        self.obj_used = True
        return self.obj

    def say(self, s: str) -> None:
        self.sentences.append(_cap(s))

    def hero_ref(self) -> str:
        return self.hero.ref(self.rng, pronoun_ok=bool(self.sentences))


# Opening sentences, one per form; a form may decline (None) when the hero has no name, and
# the last form is the fallback. ``rng.randrange`` over the forms picks one.
def _open_there_was(st: _Story) -> str:
    return f"once upon a time, there was {st.hero.intro(st.rng)}."


def _open_there_lived(st: _Story) -> str:
    return f"once upon a time, {st.place}, there lived {st.hero.intro(st.rng)}."


def _open_walk(st: _Story) -> str:
    return f"{st.one_day()}, {st.hero.intro(st.rng)} went for a walk {st.place}."


def _open_long_ago(st: _Story) -> str:
    return f"long ago, {st.hero.intro(st.rng)} lived {st.place}."


def _open_loved_to(st: _Story) -> str:
    act = st.rng.choice(ACTIVITIES)
    return f"there was once {st.hero.intro(st.rng)} who loved to {act}."


def _open_named(st: _Story) -> str | None:
    h = st.hero
    if not h.name:
        return None
    h.mentioned = True
    return f"{h.name} was {article(h.adj + ' ' + h.kind)} who lived {st.place}."


def _open_outside(st: _Story) -> str:
    rng = st.rng
    return (f"it was a {rng.choice(('quiet', 'sunny', 'rainy', 'cold', 'warm', 'busy'))} "
            f"{rng.choice(TIMES)} {st.place}, and {st.hero.intro(rng)} was outside.")


OPENINGS = (_open_there_was, _open_there_lived, _open_walk, _open_long_ago, _open_loved_to,
            _open_named, _open_outside)


# the openings that name the story's place: a long story whose request asks for a place opens
# with one, so the opening is where a model learns to copy the place
PLACE_OPENINGS = (_open_there_lived, _open_walk, _open_long_ago, _open_named, _open_outside)


def _opening(st: _Story, forms: tuple = OPENINGS) -> None:
    form = st.rng.randrange(len(forms))
    st.say(forms[form](st) or OPENINGS[-1](st))


def _arc_activity(st: _Story) -> int:
    rng = st.rng
    act = rng.choice(ACTIVITIES)
    form = rng.randrange(3)
    if form == 0:
        st.say(f"{st.hero_ref()} liked to {act} every day.")
    elif form == 1:
        st.say(f"every {rng.choice(TIMES)}, {st.hero_ref()} {ACTIVITIES_PAST[act]} {st.place}.")
    else:
        st.say(f"{st.hero_ref()} {ACTIVITIES_PAST[act]} and felt {rng.choice(GOOD_FEELINGS)}.")
    return 1


def _arc_weather(st: _Story) -> int:
    if any(w in st.sentences for w in WEATHER):   # one weather sentence a story
        return _arc_feeling(st)
    st.say(st.rng.choice(WEATHER))
    return 1


def _arc_feeling(st: _Story) -> int:
    rng = st.rng
    feel = rng.choice(FEELINGS)
    st.say(rng.choice((f"{st.hero_ref()} felt {feel}.",
                       f"{st.hero_ref()} was very {feel} that day.",
                       f"that {rng.choice(TIMES)}, {st.hero.full()} felt a little {feel}.")))
    return 1


def _arc_find(st: _Story, room: int) -> int:
    rng = st.rng
    obj = st.new_obj()
    color = rng.choice(COLORS)
    st.say(f"{st.one_day()}, {st.hero_ref()} found {article(color + ' ' + obj)} "
           f"{rng.choice(FIND_SPOTS)}.")
    n = 1
    if room > n:
        g1, g2 = rng.sample(OBJECT_TRAITS, 2)
        st.say(f"the {obj} was {rng.choice(g1)} and {rng.choice(g2)}.")
        n += 1
    if room > n:
        st.say(rng.choice((f"{st.hero.full()} took the {obj} home.",
                           f"{st.hero_ref()} showed the {obj} to everyone.",
                           f"{st.hero_ref()} decided to keep it.")))
        n += 1
    return n


def _arc_meet(st: _Story, room: int) -> int:
    rng = st.rng
    if st.friend is None:
        st.friend = make_character(rng, avoid=st.hero)
        st.say(f"{st.hero_ref()} met {st.friend.intro(rng)}.")
    else:
        st.say(f"{st.hero_ref()} went to see {st.friend.full()}.")
    f = st.friend
    n = 1
    if room > n:
        if rng.random() < 0.5:
            st.say(rng.choice((f'"Hello," said {f.full()}. "Do you want to play with me?"',
                               f'"Will you be my friend?" asked {st.hero.full()}.',
                               f'"Let\'s play together!" said {f.full()}.')))
        else:
            act = rng.choice(ACTIVITIES)
            st.say(f"{st.hero.full()} and {f.full()} liked to {act} together.")
        n += 1
    if room > n:
        st.say(rng.choice(("they played all day long.", "they laughed and had fun.",
                           f"{st.hero.full()} said yes, and they became friends.",
                           "soon they were good friends.")))
        n += 1
    return n


def _arc_lose(st: _Story, room: int) -> int:
    rng = st.rng
    obj = st.new_obj()
    h = st.hero
    if room == 1:
        st.say(f"{st.one_day()}, {h.full()} lost {h.poss} {obj}, but {h.pron} found it again "
               f"{rng.choice(FIND_SPOTS)}.")
        return 1
    st.say(rng.choice((f"suddenly, {h.full()} lost {h.poss} {obj}.",
                       f"{st.one_day()}, {h.full()} could not find {h.poss} {obj}.")))
    if room == 2:
        st.say(f"{h.pron} looked everywhere, and at last {h.pron} found it "
               f"{rng.choice(FIND_SPOTS)}.")
        return 2
    st.say(f"{h.pron} looked everywhere and felt {rng.choice(('sad', 'worried', 'upset'))}.")
    n = 2
    if room > n:
        helper = st.friend.full() if st.friend else f"a kind {rng.choice(ANIMALS)}"
        st.say(f"then {helper} helped {h.obj} find it {rng.choice(FIND_SPOTS)}.")
        n += 1
    return n


def _arc_goal(st: _Story, room: int) -> int:
    rng = st.rng
    h = st.hero
    goal = rng.choice(GOALS)
    st.say(f"{h.full()} wanted to {goal}, but {h.pron} was "
           f"{rng.choice(('too small', 'afraid', 'too tired', 'not sure how'))}.")
    n = 1
    if room > n:
        st.say(rng.choice((f"{h.pron} tried again and again.",
                           f"{h.pron} did not give up.",
                           f"{st.friend.full() if st.friend else 'a wise owl'} said, \"You can do it!\"")))
        n += 1
    if room > n:
        st.say(f"at last, {h.pron} did it, and {h.pron} was very {rng.choice(GOOD_FEELINGS)}.")
        n += 1
    return n


def _ending(st: _Story) -> None:
    rng, h = st.rng, st.hero
    options = [f"in the end, {h.full()} was very {rng.choice(GOOD_FEELINGS)}.",
               f"{h.full()} smiled and went to sleep.",
               f"that night, {h.full()} had sweet dreams.",
               f"{h.full()} learned that {rng.choice(LESSONS)}.",
               f"it was the best day ever for {h.full()}."]
    if st.friend:
        options += [f"from that day on, {h.full()} and {st.friend.full()} were best friends.",
                    "and they all lived happily ever after."]
    if st.obj_used:
        options += [f"{h.full()} kept the {st.obj} forever.",
                    f"{h.full()} was happy to have the {st.obj}."]
    st.say(rng.choice(options))


# The arcs of a short story, by cumulative probability: a uniform draw r picks the first arc
# whose bound is above r (activity 15%, weather 7%, feeling 8%, find 20%, meet 20%, lose 15%,
# goal 15%). An arc gets the sentences left (``room``) and returns how many it wrote.
STORY_ARCS = ((0.15, lambda st, room: _arc_activity(st)),
              (0.22, lambda st, room: _arc_weather(st)),
              (0.30, lambda st, room: _arc_feeling(st)),
              (0.50, _arc_find), (0.70, _arc_meet), (0.85, _arc_lose), (1.01, _arc_goal))


def _arc_at(r: float):
    return next(arc for bound, arc in STORY_ARCS if r < bound)


def story(rng: random.Random, *, kind: str | None = None, name: str | None = None,
          adj: str | None = None, place: str | None = None, obj: str | None = None,
          sentences: int | None = None) -> str:
    """One story of 2-6 sentences; optional constraints pick the hero, place or object."""
    hero = make_character(rng, kind=kind, adj=adj, name=name)
    st = _Story(rng=rng, hero=hero, place=place or rng.choice(PLACES), obj=obj)
    target = sentences or rng.randint(2, 6)
    _opening(st)
    room = target - 2          # sentences between the opening and the ending
    while room > 0:
        r = rng.random()
        if obj is not None and st.sentences and len(st.sentences) == 1:
            r = 0.30 if rng.random() < 0.5 else 0.70   # make sure the object appears
        room -= _arc_at(r)(st, room)
    _ending(st)
    return " ".join(st.sentences)


# --------------------------------------------------------------------------- splits
STORY_EVAL_BUCKETS = 20
STORY_EVAL_SEED = 4321


def story_split(text: str) -> str:
    """'eval' or 'train' for a story, by a stable hash of its text."""
    d = hashlib.sha256(("story:" + text).encode("utf-8")).digest()
    return "eval" if int.from_bytes(d[:8], "big") % STORY_EVAL_BUCKETS == 0 else "train"


REQUEST_EVAL_BUCKETS = 10


def request_split(text: str) -> str:
    """'eval' or 'train' for a request's text, by a stable hash: a held-out request's text is
    never a training prompt (every training request draws again until its text is 'train')."""
    d = hashlib.sha256(("request:" + text).encode("utf-8")).digest()
    return "eval" if int.from_bytes(d[:8], "big") % REQUEST_EVAL_BUCKETS == 0 else "train"


def _in_split(make, rng: random.Random, split: str, **constraints) -> str:
    """The first story ``make`` draws that falls in ``split``."""
    while True:
        s = make(rng, **constraints)
        if story_split(s) == split:
            return s


def random_story(rng: random.Random, split: str = "train", **constraints) -> str:
    return _in_split(story, rng, split, **constraints)


def stories(n: int, seed: int = 0, split: str = "train") -> list[str]:
    """``n`` stories of a split, deterministic for ``seed``."""
    rng = random.Random(f"celeris-story:{seed}:{split}")
    return [random_story(rng, split) for _ in range(n)]


def _distinct(draw, n: int, key=lambda x: x) -> list:
    """The first ``n`` distinct (by ``key``) values ``draw()`` returns."""
    out, seen = [], set()
    while len(out) < n:
        x = draw()
        if key(x) not in seen:
            seen.add(key(x))
            out.append(x)
    return out


def heldout_stories(n: int = 200, seed: int = STORY_EVAL_SEED) -> list[str]:
    """The fixed held-out stories used for the masked-loss evaluation."""
    rng = random.Random(f"celeris-story:{seed}:eval")
    return _distinct(lambda: random_story(rng, "eval"), n)


# --------------------------------------------------------------------------- story requests
REQUEST_FORMS = ("Tell me a story about {a_kind}.", "Write a short story about {a_kind}.",
                 "Can you tell me a story about {a_adj_kind}?", "Tell me a story about {name}.",
                 "Write a story about {name} the {kind}.", "Tell me a story that happens {place}.",
                 "Tell me a story about {a_kind} and {a_obj}.", "Tell me a story.",
                 "Write a story with {a_obj} in it.", "Please tell me a short story.")


def story_request(rng: random.Random, split: str = "train") -> tuple[str, str]:
    """A chat request for a story and a story that satisfies it: (user text, story); the
    text and the story both fall in ``split``."""
    while True:
        form = rng.choice(REQUEST_FORMS)
        kind = rng.choice(KINDS)
        values = {"kind": kind, "adj": rng.choice(ADJECTIVES), "obj": rng.choice(OBJECTS),
                  "place": rng.choice(PLACES)}
        pron = PEOPLE.get(kind) or rng.choice(("he", "she"))
        values["name"] = rng.choice(NAMES_HE if pron == "he" else NAMES_SHE)
        text, cons = request_text(form, values)
        if request_split(text) == split:
            break
    if "obj" in cons:
        cons["sentences"] = rng.randint(3, 6)
    return text, random_story(rng, split, **cons)


# --------------------------------------------------------------------------- long stories
# Long stories: several paragraphs, one named hero kept from the first sentence to the last, a
# plot of two to four arcs, built from the short stories' sentence arcs (so ``storycheck``
# recognises every sentence); the bounds in words put every story at 150-400 tokens.
LONG_WORDS = (125, 300)
LONG_PLOT_ARCS = ("find", "meet", "lose", "goal")
# filler sentences between arcs, by weight (name, weight)
LONG_FILLERS = (("activity", 0.45), ("feeling", 0.35), ("weather", 0.20))


FILLER_ARCS = {"activity": _arc_activity, "feeling": _arc_feeling, "weather": _arc_weather}
PLOT_ARCS = {"find": _arc_find, "meet": _arc_meet, "lose": _arc_lose, "goal": _arc_goal}


def _fillers(st: _Story, n: int) -> None:
    names, weights = zip(*LONG_FILLERS)
    for _ in range(n):
        FILLER_ARCS[st.rng.choices(names, weights)[0]](st)


def _arc_paragraph(st: _Story, arc: str) -> list[str]:
    """One plot paragraph of a long story: the arc's sentences, then 1-3 fillers."""
    fill, start = st.rng.randint(1, 3), len(st.sentences)   # drawn first: the corpus's order
    PLOT_ARCS[arc](st, 3)
    _fillers(st, fill)
    return st.sentences[start:]


def _long_story_once(rng: random.Random, hero: Character, place: str, obj: str | None,
                     place_asked: bool = False) -> str:
    st = _Story(rng=rng, hero=hero, place=place, obj=obj)
    paragraphs: list[list[str]] = []
    # opening paragraph: who and where, then a few everyday sentences
    _opening(st, PLACE_OPENINGS if place_asked else OPENINGS)
    first = len(st.sentences) - 1
    _fillers(st, rng.randint(1, 3))
    paragraphs.append(st.sentences[first:])
    arcs = rng.sample(LONG_PLOT_ARCS, rng.randint(2, 4))
    if obj is not None:              # the requested object is found in the first plot paragraph
        arcs = ["find"] + [a for a in arcs if a != "find"][:len(arcs) - 1]
    paragraphs += [_arc_paragraph(st, arc) for arc in arcs]
    start = len(st.sentences)                      # closing paragraph
    _fillers(st, rng.randint(0, 2))
    _ending(st)
    paragraphs.append(st.sentences[start:])
    return "\n\n".join(" ".join(p) for p in paragraphs if p)


# How each plot arc shows in a story's text (its first sentence; fillers and endings use none
# of these words): "found a red coin", "met a kind fox" / "went to see Max", "lost her
# coin" / "could not find his kite", "wanted to fly".
ARC_MARKERS = {"find": re.compile(r"\bfound an? "),
               "meet": re.compile(r"\b(?:met an? |went to see )"),
               "lose": re.compile(r"\b(?:lost (?:his|her) |could not find (?:his|her) )"),
               "goal": re.compile(r"\bwanted to ")}


def paragraphs(text: str) -> list[str]:
    """A story's paragraphs (blank-line separated), stripped, empty ones dropped."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def plot_arcs(text: str) -> list[str]:
    """The plot arcs a story's text shows (``ARC_MARKERS``), in LONG_PLOT_ARCS order."""
    return [arc for arc in LONG_PLOT_ARCS if ARC_MARKERS[arc].search(text)]


def lengthen_story(text: str, rng: random.Random, *, kind: str, adj: str | None, name: str,
                   arcs: int = len(LONG_PLOT_ARCS)) -> tuple[str, list[str]] | None:
    """``text`` with plot paragraphs added until it shows ``arcs`` plot arcs (hindsight
    lengthening: a greedy decoder takes the shortest story the corpus allows), and the arcs
    added; None when it already shows that many, when its last paragraph is not a closing one
    or when it has fewer than three paragraphs. The new paragraphs are the corpus's own
    (``_arc_paragraph``) for the story's hero, each an arc the story lacks, in a random order
    before the closing paragraph; new objects differ from those the story names."""
    if not 1 <= arcs <= len(LONG_PLOT_ARCS):
        raise ValueError(f"arcs must be in [1, {len(LONG_PLOT_ARCS)}], got {arcs!r}")
    paras = paragraphs(text)
    have = plot_arcs(text)
    if len(have) >= arcs or len(paras) < 3 or plot_arcs(paras[-1]):
        return None
    pron = PEOPLE.get(kind) or ("she" if name in NAMES_SHE else "he")
    low = text.lower()
    named = [o for o in OBJECTS if re.search(rf"(?<![a-z]){re.escape(o)}(?![a-z])", low)]
    said = re.split(r"(?<=[.!?\"])\s+", " ".join(paras))
    missing = [arc for arc in LONG_PLOT_ARCS if arc not in have]
    added = rng.sample(missing, arcs - len(have))
    for _ in range(50):            # redraw paragraphs that repeat a sentence of the story
        hero = Character(kind=kind, adj=adj or "", pron=pron, name=name, mentioned=True)
        st = _Story(rng=rng, hero=hero, place=next((p for p in PLACES if p in low), PLACES[0]),
                    said_one_day="one day" in low, sentences=list(said))
        objs, new = list(named), []
        for arc in added:
            if arc in ("find", "lose"):      # an object the story does not name yet
                st.obj, st.obj_used = rng.choice([o for o in OBJECTS if o not in objs]), False
                objs.append(st.obj)
            new.append(" ".join(_arc_paragraph(st, arc)))
        fresh = st.sentences[len(said):]
        if len(set(fresh)) == len(fresh) and not set(fresh) & set(said):
            break
    else:
        return None
    return "\n\n".join(paras[:-1] + new + paras[-1:]), added


def long_story(rng: random.Random, *, kind: str | None = None, name: str | None = None,
               adj: str | None = None, place: str | None = None,
               obj: str | None = None) -> str:
    """A story of 4-6 paragraphs (125-300 words) with one named hero kept throughout;
    optional constraints pick the hero's kind, name and adjective, the place or an object."""
    while True:
        hero = make_character(rng, kind=kind, adj=adj, name=name, named=True)
        where = place or rng.choice(PLACES)
        text = _long_story_once(rng, hero, where, obj, place is not None)
        # redraw a story that is too short or long, whose last paragraph forgets the hero's
        # name ("And they all lived happily ever after." after a pronoun), or that never
        # says a requested place (some openings leave the place out)
        if (LONG_WORDS[0] <= len(text.split()) <= LONG_WORDS[1]
                and hero.name in text.rsplit("\n\n", 1)[-1]
                and (place is None or place in text)):
            return text


def random_long_story(rng: random.Random, split: str = "train", **constraints) -> str:
    return _in_split(long_story, rng, split, **constraints)


# Requests for a long story; every field the request names is honoured by the story.
LONG_REQUEST_FORMS = (
    (0.16, "Tell me a story about {a_kind}."),
    (0.10, "Write a long story about {a_adj_kind}."),
    (0.14, "Tell me a story about {a_kind} named {name}."),
    (0.10, "Tell me a story about {a_adj_kind} called {name}."),
    (0.10, "Write a story about {name} the {kind}."),
    (0.10, "Tell me a story about {a_kind} who lives {place}."),
    (0.10, "Tell me a story about {a_kind} and {a_obj}."),
    (0.08, "Please write a story about {name}."),
    (0.06, "Tell me a long story."),
    (0.06, "Write a story with {a_obj} in it."),
)
# which request fields each placeholder asks for
_FIELDS = {"{a_kind}": ("kind",), "{kind}": ("kind",), "{a_adj_kind}": ("kind", "adj"),
           "{name}": ("name",), "{place}": ("place",), "{a_obj}": ("obj",)}


@dataclass(frozen=True)
class StoryRequest:
    """A request for a story, what it asks for, and a story that honours it."""

    text: str
    asks: dict          # subset of kind / adj / name / place / obj
    story: str
    form: str = ""      # the LONG_REQUEST_FORMS template ``text`` was written from


def request_text(form: str, values: dict) -> tuple[str, dict]:
    """(request text, asks) for a LONG_REQUEST_FORMS template filled with ``values`` (kind,
    adj, name, place, obj; only the fields the template names are needed)."""
    asks = {f: values[f] for ph, fs in _FIELDS.items() if ph in form for f in fs}
    get = values.get
    text = form.format(a_kind=article(get("kind", "x")),
                       a_adj_kind=article(f"{get('adj', 'x')} {get('kind', 'x')}"),
                       name=get("name"), kind=get("kind"), place=get("place"),
                       a_obj=article(get("obj", "x")))
    return text, asks


def long_request(rng: random.Random, split: str = "train") -> StoryRequest:
    """A long-story request whose text and story both fall in ``split``."""
    weights, forms = zip(*LONG_REQUEST_FORMS)
    while True:
        form = rng.choices(forms, weights)[0]
        kind = rng.choice(KINDS)
        pron = PEOPLE.get(kind) or rng.choice(("he", "she"))
        values = {"kind": kind, "adj": rng.choice(ADJECTIVES),
                  "name": rng.choice(NAMES_HE if pron == "he" else NAMES_SHE),
                  "place": rng.choice(PLACES), "obj": rng.choice(OBJECTS)}
        text, asks = request_text(form, values)
        if request_split(text) == split:
            break
    return StoryRequest(text, asks, random_long_story(rng, split, **asks), form)


def heldout_long_requests(n: int = 40, seed: int = STORY_EVAL_SEED) -> list[StoryRequest]:
    """Fixed held-out long-story requests: their texts (``request_split``) and stories are in
    the eval split, so no training prompt is one of them."""
    rng = random.Random(f"celeris-long-request:{seed}:eval")
    return _distinct(lambda: long_request(rng, "eval"), n, key=lambda r: r.text)

