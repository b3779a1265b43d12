"""The self-distillation prompt set, written by our code: instruction templates filled from slot lists.

Every template has an id and a category; a fifth of each category's templates (those with the smallest hash
of their id) are held out: their prompts are never trained on and are what the held-out
figures and the bench use. A prompt is a conversation (a list of chat messages); follow-up templates make
two-turn ones whose first answer is the model's own, filled in when the data is generated.
`python -m tools.chat_prompts` writes a prompt set to a JSONL file.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

LANGUAGES = ["Python", "JavaScript", "C", "Rust", "Go", "Java", "Bash", "SQL", "TypeScript", "C++"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the largest element of a list",
    "counts the vowels in a string", "computes the factorial of n", "sums the even numbers of a list",
    "removes duplicates from a list", "checks whether a string is a palindrome", "returns the n-th Fibonacci "
    "number", "converts Celsius to Fahrenheit", "merges two sorted lists", "finds the index of a value in a "
    "sorted array with binary search", "counts the words in a sentence", "returns the average of a list of "
    "numbers", "swaps two variables", "prints the multiplication table of 7", "computes the greatest common "
    "divisor of two numbers", "capitalizes the first letter of every word", "flattens a nested list",
    "reads a file and prints its line count",
]
TOPICS = [
    "photosynthesis", "the water cycle", "gravity", "the internet", "vaccines", "volcanoes", "inflation",
    "democracy", "the immune system", "black holes", "recycling", "electric cars", "the moon's phases",
    "earthquakes", "machine learning", "the stock market", "rainbows", "tides", "sleep", "exercise",
    "climate change", "the printing press", "bees", "solar panels", "antibiotics", "coral reefs", "DNA",
    "batteries", "time zones", "compound interest",
]
AUDIENCES = ["a child", "a beginner", "a high school student", "a busy manager", "someone new to the topic"]
THINGS = [
    "fruits", "vegetables", "programming languages", "planets", "countries in Europe", "animals that live in the "
    "ocean", "musical instruments", "board games", "ways to save money", "tips for studying", "healthy breakfast "
    "ideas", "kinds of clouds", "famous painters", "sports played with a ball", "colors of the rainbow", "capital "
    "cities", "types of trees", "hobbies for a rainy day", "ways to reduce stress", "things to pack for a trip",
]
COUNTRIES = [
    "France", "Japan", "Italy", "Germany", "Spain", "Canada", "Brazil", "Egypt", "India", "China", "Mexico",
    "Australia", "Russia", "Kenya", "Norway", "Greece", "Portugal", "Argentina", "Turkey", "Sweden",
]
PEOPLE = ["Albert Einstein", "Marie Curie", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci",
          "William Shakespeare", "Charles Darwin", "Nikola Tesla", "Galileo Galilei", "Alan Turing"]
SENTENCES = [
    "the meeting has been moved to friday because many people are away",
    "i think we should maybe try to finish the project sooner if possible",
    "Our product is very good and people like it a lot.",
    "The cat sat on the mat and looked at the bird outside the window.",
    "Please send me the report by the end of the day.",
    "It was raining so we stayed inside and played cards all afternoon.",
    "The new library opens next month and will have a big reading room.",
    "He forgot his keys again and had to wait outside for an hour.",
    "We are happy to announce that our store is now open on Sundays.",
    "The train was late, so I missed the first part of the movie.",
]
STYLES = ["more formal", "simpler", "shorter", "more polite", "more exciting", "in the passive voice"]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jack"]
ITEMS = ["apples", "pencils", "books", "stickers", "cookies", "marbles", "cards", "balloons"]


@dataclass(frozen=True)
class Template:
    tid: str
    category: str
    pattern: str
    slots: tuple[tuple[str, tuple[str, ...]], ...]
    follow_up: str | None = None

    @property
    def held_out(self) -> bool:
        return self.tid in HELD_OUT


def _t(tid: str, category: str, pattern: str, follow_up: str | None = None, **slots: list[str]) -> Template:
    return Template(tid, category, pattern, tuple((k, tuple(v)) for k, v in slots.items()), follow_up)


NUMS = [str(n) for n in range(2, 30)]
BIG = [str(n) for n in (12, 15, 18, 24, 25, 36, 42, 48, 55, 64, 72, 81, 99, 120, 144)]

TEMPLATES: tuple[Template, ...] = (
    _t("code-fn", "code", "Write a {lang} function that {task}.", lang=LANGUAGES, task=CODE_TASKS),
    _t("code-short", "code", "In {lang}, how do I write code that {task}? Keep it short.", lang=LANGUAGES,
       task=CODE_TASKS),
    _t("code-explain", "code", "Show me {lang} code that {task}, and explain each line.", lang=LANGUAGES,
       task=CODE_TASKS),
    _t("code-test", "code", "Write a {lang} function that {task}, then a small test for it.", lang=LANGUAGES,
       task=CODE_TASKS),
    _t("code-follow", "code", "Write a {lang} function that {task}.", "Now add comments to it.",
       lang=LANGUAGES, task=CODE_TASKS),
    _t("code-what", "code", "What does a for loop do in {lang}? Give an example.", lang=LANGUAGES),
    _t("list-n", "list", "List {n} {things}.", n=["3", "4", "5", "6", "7", "8", "10"], things=THINGS),
    _t("list-name", "list", "Name {n} {things}, one per line.", n=["3", "5", "6", "8"], things=THINGS),
    _t("list-bullets", "list", "Give me a bulleted list of {things}.", things=THINGS),
    _t("list-follow", "list", "List {n} {things}.", "Which one is your favourite, and why?",
       n=["3", "4", "5"], things=THINGS),
    _t("count-to", "list", "Count from 1 to {n}.", n=NUMS),
    _t("count-by", "list", "Count by {k} from {k} to {end}.", k=["2", "3", "5", "10"],
       end=["20", "30", "50", "100"]),
    _t("alphabet", "list", "Write the first {n} letters of the alphabet, separated by commas.",
       n=["5", "8", "10", "12", "15", "20", "26"]),
    _t("explain-simple", "explain", "Explain {topic} in simple terms.", topic=TOPICS),
    _t("explain-to", "explain", "Explain {topic} to {who}.", topic=TOPICS, who=AUDIENCES),
    _t("explain-why", "explain", "Why is {topic} important?", topic=TOPICS),
    _t("explain-para", "explain", "Write a short paragraph about {topic}.", topic=TOPICS),
    _t("explain-facts", "explain", "Tell me three facts about {topic}.", topic=TOPICS),
    _t("explain-follow", "explain", "What is {topic}?", "Can you give an example?", topic=TOPICS),
    _t("explain-how", "explain", "How does {topic} work?", topic=TOPICS),
    _t("rewrite-style", "rewrite", "Rewrite this sentence to be {style}: \"{s}\"", style=STYLES, s=SENTENCES),
    _t("rewrite-fix", "rewrite", "Fix the grammar and punctuation: \"{s}\"", s=SENTENCES),
    _t("rewrite-summary", "rewrite", "Summarize in a few words: \"{s}\"", s=SENTENCES),
    _t("rewrite-translate", "rewrite", "Translate into {lang}: \"{s}\"", lang=["French", "Spanish", "German"],
       s=SENTENCES),
    _t("rewrite-email", "rewrite", "Write a short email to {name} saying: \"{s}\"", name=NAMES, s=SENTENCES),
    _t("math-add", "math", "What is {a} + {b}?", a=BIG, b=BIG),
    _t("math-mul", "math", "What is {a} times {b}?", a=NUMS, b=NUMS),
    _t("math-sub", "math", "Calculate {a} minus {b}.", a=["100", "250", "75", "60", "500"], b=BIG),
    _t("math-word", "math", "{name} has {a} {items} and buys {b} more. How many {items} does {name} have now?",
       name=NAMES, a=NUMS, b=NUMS, items=ITEMS),
    _t("math-share", "math", "{name} shares {a} {items} equally among {b} friends. How many does each get?",
       name=NAMES, a=BIG, b=["2", "3", "4", "6"], items=ITEMS),
    _t("math-steps", "math", "Solve step by step: {a} x {b} + {c}.", a=NUMS, b=NUMS, c=NUMS),
    _t("math-percent", "math", "What is {p} percent of {a}?", p=["10", "20", "25", "50", "75"], a=BIG),
    _t("math-follow", "math", "What is {a} + {b}?", "And what is that number times 2?", a=BIG, b=BIG),
    _t("know-capital", "knowledge", "What is the capital of {c}?", c=COUNTRIES),
    _t("know-lang", "knowledge", "What language is spoken in {c}?", c=COUNTRIES),
    _t("know-food", "knowledge", "What is a famous food from {c}?", c=COUNTRIES),
    _t("know-person", "knowledge", "Who was {p}?", p=PEOPLE),
    _t("know-known", "knowledge", "What is {p} best known for?", p=PEOPLE),
    _t("know-follow", "knowledge", "Who was {p}?", "When did they live?", p=PEOPLE),
    _t("know-country", "knowledge", "Tell me about {c}.", c=COUNTRIES),
    _t("know-planets", "knowledge", "How many {what} are there?", what=[
        "planets in the solar system", "days in a leap year", "continents", "legs on a spider", "hours in a week",
        "sides on a hexagon", "minutes in a day", "players on a soccer team"]),
    _t("creative-story", "creative", "Write a short story about {name} and {things}.", name=NAMES,
       things=["a lost dog", "a rainy day", "a robot", "a treasure map", "a birthday party", "a dragon"]),
    _t("creative-poem", "creative", "Write a short poem about {topic}.", topic=TOPICS),
    _t("creative-slogan", "creative", "Suggest three names for a shop that sells {things}.", things=THINGS),
    _t("advice", "advice", "Give me some advice on {what}.", what=[
        "learning to code", "staying focused", "writing a CV", "cooking for friends", "running a first 5k",
        "learning a language", "saving money", "public speaking", "sleeping better", "making friends"]),
    _t("advice-steps", "advice", "What are the steps to {what}?", what=[
        "make a cup of tea", "plant a tree", "change a tire", "bake bread", "start a blog", "wash a car",
        "write a resume", "set up a fish tank", "learn to swim", "boil an egg"]),
    _t("compare", "explain", "What is the difference between {a} and {b}?", a=[
        "a list", "weather", "a virus", "speed", "a lake", "a noun"], b=[
        "a tuple", "climate", "bacteria", "velocity", "a sea", "a verb"]),
    _t("define", "explain", "Define the word \"{w}\" and use it in a sentence.", w=[
        "curious", "generous", "ancient", "fragile", "brilliant", "humble", "vivid", "reluctant", "swift"]),
)


CATEGORIES = tuple(sorted({t.category for t in TEMPLATES}))


def _held_out(templates: tuple[Template, ...], share: float = 0.2) -> frozenset[str]:
    """Per category, the `share` of its templates (at least one) with the smallest hash of their id."""
    chosen: set[str] = set()
    for category in {t.category for t in templates}:
        ids = sorted((t.tid for t in templates if t.category == category),
                     key=lambda tid: hashlib.sha256(tid.encode()).hexdigest())
        chosen.update(ids[:max(1, round(share * len(ids)))])
    return frozenset(chosen)


HELD_OUT = _held_out(TEMPLATES)


def expand(t: Template) -> list[dict]:
    """Every filled prompt of a template, in a fixed order."""
    keys = [k for k, _ in t.slots]
    out = []
    for values in itertools.product(*(v for _, v in t.slots)):
        fill = dict(zip(keys, values, strict=True))
        out.append({"template": t.tid, "category": t.category, "held_out": t.held_out,
                    "messages": [{"role": "user", "content": t.pattern.format(**fill)}],
                    "follow_up": t.follow_up})
    return out


def prompt_set(count: int, seed: int = 0, held_out: bool | None = None) -> list[dict]:
    """`count` prompts drawn evenly across templates (all of a template's when it has fewer), shuffled by seed;
    held_out=True / False keeps only held-out / training templates."""
    rng = random.Random(seed)
    pools = [expand(t) for t in TEMPLATES if held_out is None or t.held_out == held_out]
    for pool in pools:
        rng.shuffle(pool)
    chosen: list[dict] = []
    for row in _round_robin(pools):
        if len(chosen) >= count:
            break
        chosen.append(row)
    rng.shuffle(chosen)
    return chosen


def _round_robin(pools: list[list[dict]]) -> Iterator[dict]:
    for layer in itertools.zip_longest(*pools):
        yield from (row for row in layer if row is not None)
