"""The demo's seed corpus: short review sentences, positive / negative / neutral, for Model 0.

Every sentence is written for this project: about forty by hand per label, the rest composed
from the phrase lists below with a seeded random generator. The corpus is deterministic
(the same sentences in the same order on every machine), balanced, and free of duplicates,
so its hash can key the cache of the trained Model 0 (:mod:`dynaloop.model_zero`).

It only has to make a *plausible* Model 0 for the demo: one that gets plain sentences right,
so that writers have to think to fool it (DynaSent's Model 0 was trained on external
sentiment data, §2). It is not a benchmark and no result should be reported on it.

>>> corpus = seed_corpus(per_label=50)
>>> len(corpus), sorted({label for _, label in corpus})
(150, ['negative', 'neutral', 'positive'])
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import lru_cache

SEED_LABELS = ("positive", "negative", "neutral")
DEFAULT_PER_LABEL = 300
_SEED = 20210601  # fixed: the corpus, and so the cache key of Model 0, never changes by accident

# --- hand-written sentences ---------------------------------------------------------------

_HAND_WRITTEN: dict[str, tuple[str, ...]] = {
    "positive": (
        "The lemon cake was moist and not too sweet.",
        "Our server checked on us just often enough.",
        "I left with a full stomach and a big smile.",
        "The new owners have really turned this place around.",
        "Check-in took two minutes and the room was ready early.",
        "Best brunch spot in the neighbourhood, no contest.",
        "The tailor fixed my jacket overnight and it fits perfectly.",
        "Such a calm, welcoming little café.",
        "The portions are generous and the prices are fair.",
        "I would happily drive an hour for their dumplings.",
        "The nurse put my nervous son completely at ease.",
        "Everything we tried was fresh and full of flavour.",
        "The view from the terrace is worth the trip alone.",
        "They found a table for our group of nine without fuss.",
        "My bike rides like new after the tune-up.",
        "The host was charming and gave us great tips for the city.",
        "A lovely evening from the first drink to the last bite.",
        "The soup warmed me right up on a freezing day.",
        "The instructor was patient and made the class fun.",
        "I have recommended this florist to all my friends.",
        "The shower pressure was fantastic and the towels were fluffy.",
        "Quick, honest and reasonably priced, just what I wanted.",
        "The cinnamon rolls are worth waking up early for.",
        "Their return policy made the whole thing painless.",
        "We felt looked after from the moment we walked in.",
        "The playlist, the lighting and the food were all spot on.",
        "A real gem hidden behind a plain door.",
        "I am already planning my next visit.",
        "The pharmacist took time to explain every side effect.",
        "Delivery was early and the driver was lovely.",
        "This vacuum picks up everything, even dog hair.",
        "The spicy noodles had me coming back for seconds.",
        "Ten out of ten, would stay here again.",
        "They remembered my allergy without being reminded.",
        "The garden seating is peaceful and shady.",
        "Honest advice, fair price, great result.",
        "The croissants flake perfectly and taste of real butter.",
        "The staff went out of their way to help us.",
        "My new glasses are comfortable and look great.",
        "It was a joy to shop somewhere so well organised.",
    ),
    "negative": (
        "The lemon cake was dry and tasted of the fridge.",
        "Our server vanished for half an hour at a time.",
        "I left hungry and forty dollars poorer.",
        "The new owners have really run this place down.",
        "Check-in took an hour and the room still was not ready.",
        "Worst brunch I have had in years.",
        "The tailor lost a button and charged me for the repair anyway.",
        "Loud, cramped and sticky tables everywhere.",
        "The portions are tiny and the prices are outrageous.",
        "I would not go back even if it were free.",
        "The nurse rolled her eyes at every question I asked.",
        "Everything we tried was stale or overcooked.",
        "The view is of a car park and a row of bins.",
        "They made our group of nine wait outside in the rain.",
        "My bike came back with a new scratch and the same squeak.",
        "The host was cold and barely looked up from his phone.",
        "An awful evening from the first drink to the last bite.",
        "The soup was lukewarm and far too salty.",
        "The instructor spent the class shouting at us.",
        "I have warned all my friends to avoid this florist.",
        "The shower dribbled and the towels were stained.",
        "Slow, dishonest and overpriced, avoid.",
        "The cinnamon rolls were hard as rocks.",
        "Their return policy is a maze designed to wear you down.",
        "We felt like an inconvenience from the moment we walked in.",
        "The music was deafening and the food was forgettable.",
        "A tourist trap with a nice sign and nothing else.",
        "I am never setting foot in here again.",
        "The pharmacist handed me the wrong pills and argued about it.",
        "Delivery was two hours late and the bag was torn.",
        "This vacuum barely picks up crumbs.",
        "The spicy noodles were bland and oily.",
        "Zero stars if I could, would not stay here again.",
        "They ignored my allergy even though I mentioned it twice.",
        "The garden seating is dirty and full of wasps.",
        "Bad advice, inflated price, sloppy result.",
        "The croissants were soggy and tasted of margarine.",
        "The staff could not have cared less about helping us.",
        "My new glasses pinch my nose and keep slipping.",
        "It was exhausting to shop somewhere so chaotic.",
    ),
    "neutral": (
        "The lemon cake is sold by the slice or whole.",
        "Our server brought the bill to the table.",
        "I left at around nine in the evening.",
        "The new owners took over in January.",
        "Check-in is at three and check-out is at eleven.",
        "Brunch is served on Saturdays and Sundays.",
        "The tailor also does alterations for wedding dresses.",
        "The café has about twenty seats inside.",
        "The menu has a separate page for children.",
        "It is the second dumpling shop on this street.",
        "The clinic shares a building with a dentist.",
        "We tried three starters and two main courses.",
        "The terrace is on the roof of the building.",
        "They have a private room for larger groups.",
        "I brought my bike in for its yearly service.",
        "The host asked whether we had a booking.",
        "We had dinner there before the concert.",
        "The soup of the day is written on a chalkboard.",
        "The class runs for fifty minutes on Thursday nights.",
        "The florist delivers within the city limits.",
        "The bathroom has a shower but no bathtub.",
        "I paid by card at the counter.",
        "They bake cinnamon rolls on weekend mornings.",
        "Returns are accepted within thirty days with a receipt.",
        "We arrived a few minutes before they opened.",
        "The restaurant plays music from the seventies.",
        "The entrance is around the corner from the main road.",
        "I was there for about an hour.",
        "The pharmacy is inside the supermarket.",
        "The package arrived on Thursday afternoon.",
        "This vacuum comes with three attachments.",
        "The noodles are listed under the chef's specials.",
        "We stayed two nights on the fourth floor.",
        "They ask about allergies when you order.",
        "The garden seating closes when it rains.",
        "I asked for a quote before booking the repair.",
        "The croissants come plain or with almonds.",
        "The staff wear green aprons.",
        "I picked up my new glasses on Monday.",
        "The shop is divided into four sections.",
    ),
}

# --- phrase lists for composed sentences --------------------------------------------------

# Subjects by kind, each with predicates that fit it; the generic predicates fit every kind.
_PEOPLE = (
    "our waiter",
    "the delivery driver",
    "the barista",
    "the mechanic",
    "the manager",
    "the tour guide",
    "the cashier",
    "the bartender",
    "the receptionist",
    "the instructor",
    "the nurse",
    "the host",
    "the hairdresser",
    "the plumber",
    "the pharmacist",
    "the estate agent",
)
_VENUES = (
    "the hotel room",
    "the gym",
    "the bakery",
    "the pool",
    "the spa",
    "the cinema",
    "the lobby",
    "the check-in",
    "the room service",
    "the booking app",
    "the help line",
    "the airport shuttle",
    "the car wash",
    "the laundromat",
    "the hostel",
    "the hair salon",
    "the dental clinic",
    "the bookshop",
    "the repair shop",
    "the yoga studio",
    "the pet groomer",
    "the bike shop",
    "the food truck",
    "the breakfast buffet",
)
_FOODS = (
    "the pasta",
    "the pizza",
    "the curry",
    "the sushi",
    "the espresso",
    "the dessert",
    "the ramen",
    "the burger",
    "the salad",
    "the steak",
    "the ice cream",
    "the soup",
    "the lasagne",
    "the fish of the day",
    "the pancake stack",
    "the club sandwich",
    "the lamb stew",
    "the cheesecake",
)
_ITEMS = (
    "kettle",
    "backpack",
    "desk lamp",
    "phone case",
    "umbrella",
    "rain jacket",
    "coffee grinder",
    "water bottle",
    "office chair",
    "toaster",
    "blender",
    "mattress",
)
_SUBJECTS = {"people": _PEOPLE, "venues": _VENUES, "foods": _FOODS}
_PREDICATES = {
    ("positive", "generic"): (
        "exceeded every expectation",
        "made our evening",
        "was better than I had hoped",
        "left us smiling",
        "impressed the whole family",
        "was the highlight of our trip",
        "won me over immediately",
        "was simply wonderful",
        "deserves every good review",
        "was a lovely surprise",
        "was a delight",
        "has never let me down",
        "was superb",
        "put me in a great mood",
        "was fantastic from start to finish",
        "was a real treat",
    ),
    ("positive", "people"): (
        "was friendly and quick",
        "could not have been nicer",
        "was a pleasure to deal with",
        "went above and beyond",
        "was fast, polite and helpful",
        "got everything right",
        "was genuinely kind to us",
        "did the job with real care",
        "was patient with all our questions",
    ),
    ("positive", "venues"): (
        "was spotless",
        "felt warm and cosy",
        "felt like a little luxury",
        "made the whole day easier",
        "was calm and welcoming",
        "was excellent value",
        "was worth every penny",
        "ran like clockwork",
    ),
    ("positive", "foods"): (
        "was absolutely delicious",
        "was cooked to perfection",
        "was fresh and full of flavour",
        "was the best I have had in years",
        "tasted homemade in the best way",
        "was worth every penny",
    ),
    ("positive", "items"): (
        "works perfectly",
        "feels solid and well made",
        "arrived quickly and works great",
        "is the best purchase I made this year",
        "was worth every penny",
        "still looks brand new",
    ),
    ("negative", "generic"): (
        "was worse than I had feared",
        "ruined our evening",
        "left us furious",
        "disappointed the whole family",
        "was the low point of our trip",
        "was simply dreadful",
        "deserves every bad review",
        "was an unpleasant shock",
        "was miserable",
        "has let me down again",
        "was terrible",
        "put me in a foul mood",
        "was awful from start to finish",
        "was a huge letdown",
    ),
    ("negative", "people"): (
        "was rude from start to finish",
        "could not have been less helpful",
        "was a nightmare to deal with",
        "ignored us for twenty minutes",
        "was slow and sloppy",
        "got everything wrong",
        "was openly dismissive of us",
        "overcharged us without an apology",
        "did the job with no care at all",
    ),
    ("negative", "venues"): (
        "was filthy",
        "smelled awful",
        "made the whole day harder",
        "was chaotic and unwelcoming",
        "was a rip-off",
        "was a waste of money",
        "felt cramped and shabby",
        "was badly run",
    ),
    ("negative", "foods"): (
        "was cold and tasteless",
        "was burnt and greasy",
        "was stale and bland",
        "was a waste of money",
        "was the worst I have had in years",
        "tasted like it came out of a tin",
    ),
    ("negative", "items"): (
        "broke after two days",
        "felt cheap and flimsy",
        "stopped working within a week",
        "arrived scratched and dented",
        "is the worst purchase I made this year",
        "was a waste of money",
    ),
}
# Shared by every label, so that no opener gives the label away.
_OPENERS = (
    "",
    "",
    "",
    "Honestly, ",
    "I have to say ",
    "To be fair, ",
    "Overall, ",
    "In short, ",
    "For the record, ",
    "Well, ",
)
_CLOSERS = {
    "positive": (
        "",
        "",
        " Highly recommended.",
        " We will be back.",
        " Five stars.",
        " Thank you!",
        " Go there.",
        " Can't wait to return.",
    ),
    "negative": (
        "",
        "",
        " Avoid.",
        " Never again.",
        " One star.",
        " So disappointing.",
        " Stay away.",
        " What a shame.",
    ),
}
_VERDICTS = {
    "positive": ("I really love", "We adore", "I keep coming back to", "I can't praise enough"),
    "negative": ("I really dislike", "We regret trying", "I keep avoiding", "I can't recommend"),
}
_PLACES = (
    "café",
    "hotel",
    "bakery",
    "salon",
    "garage",
    "bookshop",
    "clinic",
    "gym",
    "restaurant",
    "pharmacy",
    "hostel",
    "bar",
    "laundromat",
    "bike shop",
    "spa",
    "deli",
    "cinema",
    "florist",
    "market stall",
    "noodle bar",
)
_DISHES = (
    "the lasagne",
    "a veggie burger",
    "a flat white",
    "the fish of the day",
    "a pot of tea",
    "the tasting menu",
    "a club sandwich",
    "the pancakes",
    "a bowl of pho",
    "the house salad",
    "a margherita pizza",
    "the lamb curry",
    "a scoop of pistachio ice cream",
    "the chicken wings",
    "a slice of cheesecake",
    "the breakfast platter",
    "a glass of red wine",
    "the lentil soup",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_TIMES = ("seven", "eight", "nine", "ten", "eleven", "noon")
_CLOSING = ("five", "six", "seven", "eight", "nine", "ten", "midnight")
_LANDMARKS = (
    "the station",
    "the town hall",
    "the river",
    "the old bridge",
    "the post office",
    "the main square",
    "the university",
    "the bus stop",
    "the harbour",
    "the library",
)
_DISTANCES = ("a five minute walk", "two blocks", "ten minutes by bus", "across the road", "a short drive")
_NUMBERS = ("two", "three", "four", "five", "six", "eight", "ten", "twelve")
_COLOURS = ("black", "white", "grey", "navy", "red", "green", "silver")
_MONTHS = ("January", "March", "April", "June", "August", "October", "November")
_PAYMENTS = ("cash and cards", "cards only", "cash only", "mobile payments")
_TOPICS = (
    "opening hours",
    "parking",
    "gift cards",
    "a booking for Friday",
    "wheelchair access",
    "the price list",
    "group discounts",
)
_FLOORS = ("ground", "first", "second", "third")


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text[0].upper() + text[1:]


def _opinion(rng: random.Random, label: str) -> str:
    """``subject predicate`` with a predicate that fits the subject."""
    kind = rng.choice(tuple(_SUBJECTS))
    predicate = rng.choice(_PREDICATES[(label, kind)] + _PREDICATES[(label, "generic")])
    return f"{rng.choice(_SUBJECTS[kind])} {predicate}"


def _compose(rng: random.Random, label: str) -> str:
    """One composed sentence for ``label``."""
    opener = rng.choice(_OPENERS)
    if label in ("positive", "negative"):
        templates: Sequence[Callable[[], str]] = (
            lambda: f"{opener}{_opinion(rng, label)}.{rng.choice(_CLOSERS[label])}",
            lambda: f"{opener}{_opinion(rng, label)}.{rng.choice(_CLOSERS[label])}",
            lambda: f"{opener}we ordered {rng.choice(_DISHES)} and it {rng.choice(_PREDICATES[(label, 'foods')])}.",
            lambda: f"{rng.choice(_VERDICTS[label])} this {rng.choice(_PLACES)}; {_opinion(rng, label)}.",
            lambda: f"The {rng.choice(_ITEMS)} I bought {rng.choice(_PREDICATES[(label, 'items')])}.",
            lambda: f"{opener}{_opinion(rng, label)}, and {_opinion(rng, label)}.",
        )
    else:
        place = rng.choice(_PLACES)
        templates = (
            lambda: f"{opener}we ordered {rng.choice(_DISHES)} and {rng.choice(_DISHES)}.",
            lambda: f"The {place} is {rng.choice(_DISTANCES)} from {rng.choice(_LANDMARKS)}.",
            lambda: f"{opener}I went to the {place} on a {rng.choice(_DAYS)}.",
            lambda: f"The {place} opens at {rng.choice(_TIMES)} and closes at {rng.choice(_CLOSING)}.",
            lambda: f"The {rng.choice(_ITEMS)} comes in {rng.choice(_COLOURS)} and {rng.choice(_COLOURS)}.",
            lambda: f"They moved the {place} to a new address in {rng.choice(_MONTHS)}.",
            lambda: f"The {place} takes {rng.choice(_PAYMENTS)}.",
            lambda: f"I called the {place} to ask about {rng.choice(_TOPICS)}.",
            lambda: f"Does the {place} take bookings for {rng.choice(_NUMBERS)} people?",
            lambda: f"We were a group of {rng.choice(_NUMBERS)} at the {place} on {rng.choice(_DAYS)}.",
            lambda: f"{opener}{rng.choice(_VENUES)} was on the {rng.choice(_FLOORS)} floor.",
            lambda: f"The {place} is closed on {rng.choice(_DAYS)}s.",
            lambda: f"{opener}{rng.choice(_PEOPLE)} asked for {rng.choice(_DISHES)} to take away.",
            lambda: f"The {rng.choice(_ITEMS)} arrived on {rng.choice(_DAYS)} in a {rng.choice(_COLOURS)} box.",
        )
    return _sentence(rng.choice(templates)())


@lru_cache(maxsize=8)
def _corpus(per_label: int) -> tuple[tuple[str, str], ...]:
    rng = random.Random(_SEED)
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for label in SEED_LABELS:
        texts = list(_HAND_WRITTEN[label][:per_label])
        seen.update(text.lower() for text in texts)
        tries = 0
        while len(texts) < per_label:
            tries += 1
            if tries > 200 * per_label:  # pragma: no cover - only if the phrase lists shrink a lot
                raise ValueError(f"cannot compose {per_label} distinct {label} sentences; add phrases")
            text = _compose(rng, label)
            if text.lower() not in seen:
                seen.add(text.lower())
                texts.append(text)
        rows.extend((text, label) for text in texts)
    # Interleave the labels so any prefix of the corpus is balanced too.
    by_label = [rows[i * per_label : (i + 1) * per_label] for i in range(len(SEED_LABELS))]
    return tuple(row for group in zip(*by_label, strict=True) for row in group)


def seed_corpus(per_label: int = DEFAULT_PER_LABEL) -> list[tuple[str, str]]:
    """``(text, label)`` pairs, ``per_label`` of each label in :data:`SEED_LABELS`, interleaved."""
    if per_label < 1:
        raise ValueError("per_label must be at least 1")
    return list(_corpus(per_label))
