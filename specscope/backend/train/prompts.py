"""The self-distillation prompt set, written by our code: instruction templates filled from slot lists.

Every template has an id and a category; a fifth of each category's templates (those with the smallest hash
of their id) are held out: their prompts are never trained on and are what the held-out
figures and the bench use. A prompt is a conversation (a list of chat messages); follow-up templates make
two-turn ones whose first answer is the model's own, filled in when the data is generated.
`specscope data prompts` writes a prompt set to a JSONL file.
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
HOWTO_TASKS = [
    "unclog a bathroom sink", "remove a coffee stain from a white shirt", "iron a shirt", "tie a tie",
    "hang a picture straight", "fix a squeaky door", "clean a cast iron pan", "get rid of fruit flies",
    "defrost a freezer", "sharpen a kitchen knife", "fold a fitted sheet", "repot a houseplant",
    "patch a bike tire", "jump-start a car", "clean a laptop keyboard", "pack a suitcase so everything fits",
    "descale a kettle", "wrap a present neatly", "paint a small room", "keep cut flowers fresh longer",
    "teach a puppy to sit", "start a small vegetable garden", "remove a splinter", "organize a messy closet",
    "write a thank-you note", "change a light bulb in a ceiling lamp",
]
FUN_TOPICS = [
    "octopuses", "the pyramids", "coffee", "space", "sharks", "dinosaurs", "the deep ocean", "honey", "cats",
    "the moon", "chocolate", "rainforests", "penguins", "lightning", "the olympics", "volcanoes", "owls",
    "pizza", "ancient rome", "crows", "the human brain", "snow", "trains", "mushrooms",
]
WHY = [
    "cats purr", "we yawn", "onions make us cry", "leaves change color in autumn", "we get hiccups",
    "our fingers wrinkle in water", "people snore", "birds fly south for the winter", "dogs wag their tails",
    "we dream", "stars twinkle", "we get goosebumps", "cats knock things off tables", "boats float",
    "some people sneeze when they look at the sun", "we have fingerprints", "metal feel colder than wood",
    "planes leave white trails in the sky", "mosquitoes bite some people more than others", "apples turn brown",
]
BORED_WHEN = ["a rainy afternoon", "a long flight", "a night at home", "a weekend with no plans", "a road trip",
              "a snow day", "a lazy sunday", "a power cut", "a long wait at the airport"]
PETS = ["cat", "dog", "goldfish", "hamster", "parrot", "turtle", "rabbit", "guinea pig"]
PET_TRAITS = ["really fluffy", "super tiny", "very loud", "kind of grumpy", "always hungry", "black and white"]
CASUAL_EVENTS = [
    "job interview", "first date", "driving test", "big exam", "presentation at work", "piano recital",
    "football match", "wedding speech to give", "dentist appointment", "party where i dont know anyone",
]
RELATIVES = ["mom", "dad", "sister", "brother", "best friend", "grandmother", "coworker", "partner"]
HOBBIES = ["gardening", "video games", "cooking", "hiking", "reading", "painting", "football", "photography",
           "music", "board games", "travel", "knitting"]
ROLES = ["nurse", "teacher", "software developer", "student", "sales manager", "librarian", "chef",
         "volunteer firefighter"]
MORNING_GOALS = ["get fitter", "learn a new language", "feel less stressed", "read more books",
                 "get better at drawing", "plan my day better", "eat a healthier breakfast"]
TEAM_PROBLEMS = [
    "priorities keep changing", "people are in too many meetings", "nobody knows who owns which task",
    "we underestimate how long things take", "two senior people left", "requests come in from everywhere",
]
STORY_SETTINGS = ["a small fishing village", "a space station", "a busy hospital", "a medieval castle",
                  "a boarding school", "a desert city", "a floating market"]
CHARACTERS = ["a retired detective", "a shy teenager", "a talking cat", "an ambitious baker", "a lonely robot",
              "a new doctor"]
SCIENCE_TERMS = [
    "an atom", "a molecule", "friction", "evolution", "a chemical reaction", "osmosis", "kinetic energy",
    "an ecosystem", "a cell", "the speed of light", "magnetism", "a food chain", "entropy", "an acid",
    "a gene", "a galaxy", "erosion", "a sound wave", "static electricity", "density", "nuclear fusion",
    "plate tectonics", "a catalyst", "an electric circuit",
]
EXPERIMENTS = [
    "how plants drink water", "that air has weight", "static electricity", "density", "how sound travels",
    "that light bends in water", "how rust forms", "surface tension", "how seeds sprout",
    "that magnets attract some metals but not others", "how warm air rises", "how a rainbow forms",
]
WHAT_IFS = [
    "the moon disappeared", "the Earth stopped spinning", "there were no bees", "humans could photosynthesize",
    "it never rained again", "gravity were twice as strong", "all the ice on Earth melted",
    "there were no friction", "the sun went out for a day", "the oceans were fresh water",
    "we could see infrared light", "the Earth had two moons",
]
MYTHS = [
    "we only use 10 percent of our brains", "lightning never strikes the same place twice",
    "goldfish only remember things for three seconds", "the Great Wall of China is visible from space",
    "bats are blind", "cracking your knuckles causes arthritis", "bulls get angry at the color red",
    "hair grows back thicker after shaving", "we swallow spiders in our sleep", "chameleons change color to hide",
    "sugar makes children hyperactive", "ostriches bury their heads in the sand",
]
EVENTS = [
    "the French Revolution", "the fall of the Roman Empire", "the Industrial Revolution", "the moon landing",
    "the fall of the Berlin Wall", "the Renaissance", "World War I", "the building of the pyramids",
    "the Silk Road trade", "the American Civil War", "the discovery of penicillin", "the Black Death",
    "the Wright brothers' first flight", "the signing of the Magna Carta", "the end of apartheid",
    "the Cold War", "the voyages of Columbus", "the Meiji Restoration", "the invention of the telephone",
    "the abolition of slavery in Britain",
]
ERAS = ["ancient Egypt", "ancient Rome", "medieval England", "Edo-period Japan", "the Viking age",
        "the Aztec empire", "Victorian London", "ancient Greece", "the Ming dynasty", "the 1920s in America",
        "the Stone Age", "the Inca empire"]
HISTORIES = ["the bicycle", "writing", "money", "the calendar", "the Olympic Games", "chess", "the postal service",
             "coffee", "paper", "maps", "clocks", "the internet", "vaccines", "photography", "the piano"]
HABITS = [
    "drinking more water", "getting more sleep", "stretching every morning", "walking every day",
    "eating more vegetables", "cutting down on sugar", "taking screen breaks", "meditating for ten minutes a day",
    "going to bed at the same time every night", "doing strength training", "cooking at home",
    "spending time outdoors", "drinking less coffee", "standing up from my desk every hour", "journaling",
    "cycling to work",
]
WORKOUTS = ["stretching", "bodyweight", "yoga", "low-impact cardio", "core", "balance", "mobility"]
MINUTES = ["5", "10", "15", "20", "30"]
WELLBEING_GOALS = [
    "fall asleep faster", "stay hydrated at work", "feel less tired in the afternoon",
    "keep a good posture at a desk", "handle stress before an exam", "get back into exercise after a break",
    "eat healthier on a budget", "reduce eye strain from screens", "stay active during winter",
    "wind down before bed", "stop snacking late at night", "stay motivated to exercise", "take better breaks",
]
NUTRIENTS = ["protein", "fiber", "vitamin C", "iron", "calcium", "vitamin D", "omega-3 fatty acids", "potassium",
             "magnesium", "carbohydrates", "vitamin B12", "zinc"]
REQUESTS = [
    "reschedule our meeting to next week", "review my draft by Thursday", "share the latest sales figures",
    "join a call with a new client", "approve my vacation days", "send the invoice again",
    "give feedback on the new design", "confirm the project budget", "introduce me to the new marketing lead",
    "extend the deadline by two days", "cover my shift on Friday", "update the team calendar",
]
MEETINGS = [
    "a weekly team check-in", "a project kickoff", "a quarterly review", "a brainstorming session about a new "
    "product", "a one-on-one with a new employee", "a client onboarding call", "a retrospective after a launch",
    "a budget planning meeting", "a parent-teacher meeting", "a volunteer group's monthly meeting",
]
PRODUCTS = [
    "a reusable water bottle", "noise-cancelling headphones", "a standing desk", "a handmade ceramic mug",
    "a smart light bulb", "a waterproof backpack", "an electric toothbrush", "a bamboo cutting board",
    "a portable phone charger", "lightweight running shoes", "a yoga mat", "a manual coffee grinder",
    "a wool scarf", "a mechanical keyboard", "a children's picture book about space", "a camping lantern",
]
COMPLAINTS = [
    "My order arrived two weeks late.", "The product broke after one day.", "I was charged twice this month.",
    "Nobody has answered my emails for a week.", "The size is wrong and I want a refund.",
    "Your app keeps crashing when I log in.", "The delivery driver left my parcel in the rain.",
    "I waited 40 minutes for my food.", "The hotel room was not cleaned.",
]
NEWS = [
    "that we hit our sales target", "that a new team member joins on Monday", "that the office is closed on Friday",
    "a change to our meeting schedule", "the launch of our new website", "that I am leaving the company",
    "a new policy on remote work", "the winner of this month's team award",
]
JOBS = ["software engineer", "sales manager", "graphic designer", "nurse", "primary school teacher",
        "data analyst", "customer support", "marketing", "project manager", "accountant", "barista",
        "receptionist", "warehouse supervisor"]
BUSINESSES = [
    "a small bakery", "a dog-walking service", "a bike repair shop", "an online tutoring business",
    "a food truck", "a language-learning app", "a local cleaning company", "a coffee shop",
    "a handmade jewelry store", "a photography studio", "a plant nursery", "a board game cafe",
]
DISHES = [
    "pancakes", "a simple tomato soup", "guacamole", "fried rice", "banana bread", "a vegetable curry",
    "spaghetti carbonara", "hummus", "chocolate chip cookies", "a Greek salad", "French toast", "lentil soup",
    "a cheese omelette", "mashed potatoes", "vegetable stir-fry", "chicken tacos", "a berry smoothie",
    "pizza dough", "mushroom risotto", "apple crumble", "shakshuka", "a chickpea salad",
]
COOK_TIMES = [
    "boil an egg for a runny yolk", "roast a whole chicken", "cook brown rice", "bake a potato in the oven",
    "steam broccoli", "grill a steak for medium rare", "let bread dough rise", "cook dried pasta",
    "pan-fry a salmon fillet", "roast vegetables", "simmer a beef stew", "soak dried beans",
]
INGREDIENTS = ["eggs", "butter", "milk", "buttermilk", "brown sugar", "flour", "baking powder", "heavy cream",
               "soy sauce", "fresh herbs", "lemon juice", "yogurt", "breadcrumbs", "white wine"]
FRIDGE_A = ["eggs", "chicken", "tofu", "leftover rice", "potatoes", "canned tuna"]
FRIDGE_B = ["spinach", "tomatoes", "cheese", "onions", "peppers", "mushrooms"]
FRIDGE_C = ["garlic", "yogurt", "lemons", "bread", "beans", "carrots"]
MEALS = ["breakfast", "lunch", "dinner", "brunch", "picnic"]
DIETS = ["vegetarian", "vegan", "gluten-free", "dairy-free", "low-budget", "kid-friendly"]
GUEST_DIETS = ["vegetarian", "vegan", "gluten-free", "lactose intolerant", "allergic to nuts", "on a low-salt diet"]
FOOD_WHY = [
    "bread go stale", "my cake sink in the middle", "pasta water need salt", "rice get sticky",
    "meat need to rest after cooking", "an avocado turn brown", "an onion get sweet when it cooks slowly",
    "popcorn pop", "bread dough need to be kneaded", "chili feel hot", "my sauce split",
]
GIT_TASKS = [
    "undo my last commit", "create a new branch", "rename a branch", "see the history of one file",
    "throw away my local changes", "merge a branch into main", "resolve a merge conflict", "stash my changes",
    "delete a remote branch", "change the last commit message", "squash my last three commits",
    "see who last changed a line", "go back to an older commit", "ignore a folder",
]
SHELL_TASKS = [
    "find all .txt files in a folder", "count the lines in a file", "show the biggest files in a directory",
    "replace a word in every file", "see which process uses a port", "copy a folder to another machine",
    "show disk space", "follow a log file as it grows", "make a script executable", "unzip a .tar.gz file",
    "list files sorted by date", "search for a word in all files", "kill a process by its id",
    "rename many files at once",
]
SQL_TASKS = [
    "finds the ten most expensive products", "counts the orders of each customer",
    "lists the employees hired after 2020", "finds duplicate email addresses in a users table",
    "returns the average salary per department", "joins orders with their customers",
    "deletes rows older than 30 days", "finds the customers who never placed an order",
    "returns the total sales per month", "finds the second highest salary", "lists products that are out of stock",
]
REGEXES = [
    "an email address", "a US phone number", "a date like 2024-05-17", "a hex color code",
    "a word that starts with a capital letter", "an IPv4 address", "a five-digit postcode", "a URL",
    "a time like 14:30", "a word repeated twice in a row", "a number with two decimal places",
]
TECH_PROBLEMS = [
    "My laptop is running really slowly", "My phone battery drains very fast", "My printer says it's offline",
    "My Wi-Fi keeps dropping", "My phone is out of storage", "My computer makes a loud fan noise",
    "My emails are going to spam", "My Bluetooth headphones won't connect", "A website won't load in my browser",
    "My laptop won't charge", "My video calls keep freezing",
]
TECH_TERMS = ["an API", "the cloud", "a VPN", "RAM", "an IP address", "two-factor authentication",
              "a browser cookie", "open source software", "a firewall", "a cache", "bandwidth", "encryption",
              "a database", "a pixel", "a compiler", "DNS", "an operating system update"]
TERSE = [
    "python sort dict by value", "js remove duplicates from array", "bash loop over files", "sql count distinct",
    "css center a div", "git undo last commit", "python read file line by line", "excel sum a column",
    "python merge two dicts", "regex for digits only", "python current date as string", "json vs yaml",
    "linux check memory usage", "python virtual environment setup", "convert csv to json python",
    "windows shortcut screenshot",
]
CSV_SNIPPETS = ["name,age\nAnna,31\nBen,25", "city,country\nParis,France\nLima,Peru\nOslo,Norway",
                "product,price,stock\npen,1.50,120\nnotebook,3.20,45", "id,done\n1,true\n2,false\n3,true"]
CHOICES = [
    "working from home", "electric cars", "living alone", "social media", "online classes", "buying a used car",
    "a four-day work week", "open-plan offices", "nuclear power", "homeschooling", "freelancing", "smartwatches",
    "living abroad", "credit cards", "self-checkout machines", "school uniforms", "remote meetings",
]
VERSUS = [
    "cats or dogs", "tea or coffee", "e-books or paper books", "renting or buying a home",
    "a laptop or a desktop", "Python or JavaScript as a first language", "the train or a plane for a 500 km trip",
    "working out at home or at a gym", "the city or the countryside", "an iPhone or an Android phone",
    "a gas stove or an induction hob", "a university degree or an apprenticeship", "morning or evening workouts",
]
QUESTIONS = [
    "What causes the seasons?", "How do airplanes stay in the air?", "Why is the ocean salty?",
    "What is a black hole?", "How does a refrigerator work?", "Why do we pay taxes?", "What is a credit score?",
    "How do vaccines work?", "What makes a good leader?", "How does Wi-Fi work?", "Why is exercise good for you?",
    "What is inflation?", "How do bees make honey?", "Why do we have leap years?", "What is a calorie?",
    "How does a search engine work?", "Why do we need sleep?", "What is a democracy?",
]
WORDS = ["serendipity", "ubiquitous", "ephemeral", "pragmatic", "resilient", "meticulous", "ambiguous", "candid",
         "diligent", "eloquent", "frugal", "nostalgia", "obsolete", "tenacious", "whimsical", "mundane",
         "benevolent", "skeptical", "versatile", "concise"]
COMMON_WORDS = ["happy", "big", "fast", "smart", "tired", "angry", "beautiful", "important", "difficult",
                "funny", "small", "good", "bad", "interesting", "cold", "quiet", "strange", "easy"]
GRAMMAR = [
    "\"fewer people\" or \"less people\"", "\"Who did you call?\" or \"Whom did you call?\"",
    "\"The rain will affect our plans\" or \"The rain will effect our plans\"",
    "\"The dog wagged its tail\" or \"The dog wagged it's tail\"", "\"I need to lay down\" or \"I need to lie down\"",
    "\"She is taller than me\" or \"She is taller then me\"", "\"between you and me\" or \"between you and I\"",
    "\"I could of helped\" or \"I could have helped\"", "\"Me and Anna went\" or \"Anna and I went\"",
    "\"data is\" or \"data are\"", "\"I feel bad\" or \"I feel badly\"",
]
SPELLINGS = ["recieve", "definately", "seperate", "accomodate", "occurence", "neccessary", "embarass",
             "tommorow", "begining", "wierd", "goverment", "calender", "untill", "beleive", "rhythm", "receipt"]
CONFUSED = [
    "\"affect\" and \"effect\"", "\"its\" and \"it's\"", "\"their\", \"there\" and \"they're\"",
    "\"compliment\" and \"complement\"", "\"principal\" and \"principle\"", "\"lose\" and \"loose\"",
    "\"advice\" and \"advise\"", "\"farther\" and \"further\"", "\"stationary\" and \"stationery\"",
    "\"i.e.\" and \"e.g.\"", "\"historic\" and \"historical\"",
]
ORIGINS = ["salary", "quarantine", "robot", "alphabet", "nice", "sandwich", "disaster", "muscle", "window",
           "goodbye", "trivia", "ketchup", "emoji", "avocado", "sabotage", "deadline"]
PHRASES = ["good morning", "thank you very much", "where is the train station", "how much does this cost",
           "im sorry", "nice to meet you", "can i have the bill please", "i dont understand"]
SPOKEN = ["French", "Spanish", "German", "Italian", "Portuguese", "Japanese", "Dutch"]


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
    _t("howto-how", "howto", "How do I {task}?", task=HOWTO_TASKS),
    _t("howto-easiest", "howto", "What's the easiest way to {task}?", task=HOWTO_TASKS),
    _t("howto-steps", "howto", "Give me step-by-step instructions to {task}.", task=HOWTO_TASKS),
    _t("howto-beginner", "howto", "I've never done this before. Could you explain how to {task}, in numbered "
       "steps?", task=HOWTO_TASKS),
    _t("howto-tools", "howto", "What tools or materials do I need to {task}?", task=HOWTO_TASKS),
    _t("howto-mistakes", "howto", "What mistakes do people often make when they try to {task}?", task=HOWTO_TASKS),
    _t("howto-terse", "howto", "how to {task}", task=HOWTO_TASKS),
    _t("howto-follow", "howto", "Can you tell me how to {task}?", "What if that doesn't work?", task=HOWTO_TASKS),
    _t("casual-cool", "casual", "hey can you tell me something cool about {fun}?", fun=FUN_TOPICS),
    _t("casual-eli5", "casual", "can u explain {topic} like im five", topic=TOPICS),
    _t("casual-why", "casual", "ok random question but why do {why}", why=WHY),
    _t("casual-bored", "casual", "im so bored. any ideas for {when}?", when=BORED_WHEN),
    _t("casual-pet", "casual", "whats a good name for my new {pet}? it's {trait} lol", pet=PETS, trait=PET_TRAITS),
    _t("casual-nervous", "casual", "so i have a {event} this weekend and im kinda nervous, any tips??",
       event=CASUAL_EVENTS),
    _t("casual-joke", "casual", "got a good joke about {fun}?", fun=FUN_TOPICS),
    _t("casual-follow", "casual", "tell me a fun fact about {fun} pls", "haha nice, got another one?",
       fun=FUN_TOPICS),
    _t("context-trip", "context", "I'm planning a trip to {c} for {days} days. It's my first time there. What "
       "should I not miss?", c=COUNTRIES, days=["3", "5", "7", "10", "14"]),
    _t("context-gift", "context", "My {rel}'s birthday is next week and they really love {hobby}. What could I get "
       "them as a gift?", rel=RELATIVES, hobby=HOBBIES),
    _t("context-talk", "context", "I'm a {role} and tomorrow I have to give a five-minute talk about {topic}. Can "
       "you help me outline it?", role=ROLES, topic=TOPICS),
    _t("context-learn", "context", "I just started learning {lang} and I know the basics of variables and loops. "
       "What should I learn next?", lang=LANGUAGES),
    _t("context-dinner", "context", "We are {n} people for dinner on Saturday and one of us is {diet}. Could you "
       "suggest a menu?", n=["4", "6", "8", "10"], diet=GUEST_DIETS),
    _t("context-morning", "context", "I have about {mins} minutes every morning before work. How could I use them "
       "to {goal}?", mins=MINUTES, goal=MORNING_GOALS),
    _t("context-team", "context", "I manage a small team, and we keep missing deadlines because {reason}. What "
       "can I do about it?", reason=TEAM_PROBLEMS),
    _t("context-story", "context", "I'm writing a story set in {setting}. The main character is {character}. "
       "Give me three plot ideas.", setting=STORY_SETTINGS, character=CHARACTERS),
    _t("science-why", "science", "Why do {why}?", why=WHY),
    _t("science-term", "science", "What is {term}? Answer in two or three sentences.", term=SCIENCE_TERMS),
    _t("science-experiment", "science", "Describe a simple experiment I can do at home that shows {x}.",
       x=EXPERIMENTS),
    _t("science-whatif", "science", "What would happen if {x}?", x=WHAT_IFS),
    _t("science-myth", "science", "Is it true that {claim}?", claim=MYTHS),
    _t("science-everyday", "science", "How does {term} show up in everyday life? Give two examples.",
       term=SCIENCE_TERMS),
    _t("science-follow", "science", "Can you explain what {term} is?", "How do scientists study it?",
       term=SCIENCE_TERMS),
    _t("history-cause", "history", "How did {event} come about?", event=EVENTS),
    _t("history-timeline", "history", "Give me a short timeline of {event}.", event=EVENTS),
    _t("history-why", "history", "Why was {event} important? Answer in one paragraph.", event=EVENTS),
    _t("history-who", "history", "When did {event} happen, and who were the main people involved?", event=EVENTS),
    _t("history-life", "history", "What was daily life like for ordinary people in {era}?", era=ERAS),
    _t("history-of", "history", "Summarize the history of {thing} in five sentences.", thing=HISTORIES),
    _t("history-journal", "history", "Imagine you lived in {era}. Write a short diary entry about your day.",
       era=ERAS),
    _t("history-follow", "history", "What led to {event}?", "What happened afterwards?", event=EVENTS),
    _t("health-benefits", "health", "What are the benefits of {habit}?", habit=HABITS),
    _t("health-habit", "health", "How can I make a habit of {habit}?", habit=HABITS),
    _t("health-routine", "health", "Suggest a simple {mins}-minute {workout} routine I can do at home.",
       mins=MINUTES, workout=WORKOUTS),
    _t("health-tips", "health", "What are some tips to {goal}?", goal=WELLBEING_GOALS),
    _t("health-plan", "health", "I want to start {habit}. Could you give me a plan for the first week?",
       habit=HABITS),
    _t("health-nutrient", "health", "What does {n} do in the body, and which foods contain it?", n=NUTRIENTS),
    _t("health-follow", "health", "I want to {goal}. Any ideas?", "Which of these is the easiest to start with?",
       goal=WELLBEING_GOALS),
    _t("work-email", "work", "Write a short, professional email to {name} asking them to {request}.", name=NAMES,
       request=REQUESTS),
    _t("work-agenda", "work", "Draft a meeting agenda for {meeting}.", meeting=MEETINGS),
    _t("work-product", "work", "Write a product description for {product} in under 80 words.", product=PRODUCTS),
    _t("work-complaint", "work", "A customer wrote to us: \"{complaint}\" How should I reply?",
       complaint=COMPLAINTS),
    _t("work-announce", "work", "Could you please write a friendly message to my team announcing {news}?",
       news=NEWS),
    _t("work-interview", "work", "Give me {n} interview questions for a {job} job.", n=["3", "5", "8"], job=JOBS),
    _t("work-plan", "work", "What should a one-page business plan for {biz} include?", biz=BUSINESSES),
    _t("work-follow", "work", "Describe {product} for an online shop listing.", "Now make it sound more fun.",
       product=PRODUCTS),
    _t("food-recipe", "food", "Give me a recipe for {dish}.", dish=DISHES),
    _t("food-time", "food", "How long should I {q}?", q=COOK_TIMES),
    _t("food-swap", "food", "I ran out of {ing}. What can I use instead?", ing=INGREDIENTS),
    _t("food-fridge", "food", "i have {a}, {b} and {c} in the fridge, what can i make for dinner?", a=FRIDGE_A,
       b=FRIDGE_B, c=FRIDGE_C),
    _t("food-menu", "food", "Suggest a {diet} {meal} menu for six people.", diet=DIETS, meal=MEALS),
    _t("food-why", "food", "Why does {q}?", q=FOOD_WHY),
    _t("food-quick", "food", "What's a quick way to make {dish} on a weeknight?", dish=DISHES),
    _t("food-follow", "food", "How do you make {dish}?", "How can I make it healthier?", dish=DISHES),
    _t("tech-git", "tech", "How do I {task} with git?", task=GIT_TASKS),
    _t("tech-shell", "tech", "What's the shell command to {task} on Linux?", task=SHELL_TASKS),
    _t("tech-sql", "tech", "Write an SQL query that {task}.", task=SQL_TASKS),
    _t("tech-regex", "tech", "Give me a regular expression that matches {x}, and explain it.", x=REGEXES),
    _t("tech-csv", "tech", "Convert this CSV to JSON:\n{csv}", csv=CSV_SNIPPETS),
    _t("tech-fix", "tech", "{problem}. What can I try to fix it?", problem=TECH_PROBLEMS),
    _t("tech-term", "tech", "What is {term}, in plain English?", term=TECH_TERMS),
    _t("tech-terse", "tech", "{q}", q=TERSE),
    _t("tech-follow", "tech", "I need an SQL query that {task}. Can you write it?",
       "Now explain what each part of the query does.", task=SQL_TASKS),
    _t("opinion-pros", "opinion", "What are the pros and cons of {choice}?", choice=CHOICES),
    _t("opinion-better", "opinion", "Which is better: {vs}? Give reasons for both sides.", vs=VERSUS),
    _t("opinion-decide", "opinion", "I can't decide: {vs}? Can you help me choose?", vs=VERSUS),
    _t("opinion-args", "opinion", "Give me two arguments for and two against {choice}.", choice=CHOICES),
    _t("opinion-think", "opinion", "What do you think about {choice}? Keep it short and balanced.", choice=CHOICES),
    _t("opinion-debate", "opinion", "Write a short dialogue where two friends argue about {vs}.", vs=VERSUS),
    _t("opinion-follow", "opinion", "Is {choice} a good idea?", "So what would you recommend?",
       choice=CHOICES),
    _t("format-sentence", "format", "Answer in one sentence: {q}", q=QUESTIONS),
    _t("format-short", "format", "{q} Please answer in under 50 words.", q=QUESTIONS),
    _t("format-table", "format", "Make a Markdown table of {n} {things} with a short note on each.",
       n=["3", "4", "5"], things=THINGS),
    _t("format-json", "format", "Give me {n} {things} as a JSON list of strings. Output only the JSON.",
       n=["3", "5"], things=THINGS),
    _t("format-bullets", "format", "Explain {topic} in exactly three bullet points.", topic=TOPICS),
    _t("format-object", "format", "Return a JSON object with the keys \"name\", \"capital\" and \"language\" for "
       "{c}.", c=COUNTRIES),
    _t("format-faq", "format", "Write a short FAQ about {topic}: three questions, each with a one-line answer.",
       topic=TOPICS),
    _t("format-follow", "format", "{q}", "Now say that in one sentence.", q=QUESTIONS),
    _t("language-mean", "language", "What does \"{w}\" mean?", w=WORDS),
    _t("language-synonyms", "language", "Give me five synonyms for \"{w}\".", w=COMMON_WORDS),
    _t("language-opposite", "language", "what's the opposite of {w}", w=COMMON_WORDS),
    _t("language-correct", "language", "Which is correct: {choice}? Explain why.", choice=GRAMMAR),
    _t("language-spell", "language", "Is \"{w}\" spelled correctly? If not, what is the right spelling?",
       w=SPELLINGS),
    _t("language-diff", "language", "What's the difference between {pair}?", pair=CONFUSED),
    _t("language-origin", "language", "Where does the word \"{w}\" come from?", w=ORIGINS),
    _t("language-say", "language", "how do you say \"{phrase}\" in {lang}?", phrase=PHRASES, lang=SPOKEN),
    _t("language-follow", "language", "I keep seeing the word \"{w}\". What does it mean?",
       "Can you use it in a sentence?", w=WORDS),
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
