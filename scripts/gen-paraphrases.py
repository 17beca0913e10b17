#!/usr/bin/env python3
"""Writes loadtest/data/paraphrase-eval.jsonl: groups of prompts that ask
the same thing in different words, each with near misses that look alike
but ask something else (another city, another number, the reverse
conversion, another language, another property). Used to choose the
semantic cache's threshold (`cargo bench -p server --bench semantic`).

Each family has four phrasings; each slot value makes one group. Near
misses use slot values that are not groups (so no cached answer is right
for them) or change what is asked. Deterministic: rerun to regenerate."""

import json
import os

OUT = os.path.join(os.path.dirname(__file__), "..", "loadtest", "data", "paraphrase-eval.jsonl")

FAMILIES = [
    {
        "name": "capital",
        "phrasings": ["What is the capital of {x}?", "Which city is the capital of {x}?",
                      "Name the capital city of {x}.", "{x}'s capital is which city?"],
        "slots": ["France", "Japan", "Canada", "Brazil", "Egypt", "Kenya", "Norway", "Chile",
                  "Vietnam", "Poland", "Turkey", "Peru"],
        "others": ["Spain", "Italy", "Mexico", "India", "Greece", "Ghana", "Sweden", "Argentina",
                   "Thailand", "Hungary", "Iran", "Colombia"],
        "twists": ["What is the largest city in {x}?", "What language is spoken in {x}?"],
    },
    {
        "name": "celsius",
        "phrasings": ["Convert {x} degrees Celsius to Fahrenheit.", "What is {x} C in Fahrenheit?",
                      "How many degrees Fahrenheit is {x} degrees Celsius?",
                      "{x} Celsius equals how many Fahrenheit degrees?"],
        "slots": ["10", "25", "37", "100", "-40", "0", "15", "60", "80", "5", "200", "42"],
        "others": ["11", "26", "38", "99", "-41", "1", "16", "61", "81", "6", "201", "43"],
        "twists": ["Convert {x} degrees Fahrenheit to Celsius.", "Convert {x} degrees Celsius to Kelvin."],
    },
    {
        "name": "multiply",
        "phrasings": ["What is {x} times {y}?", "Multiply {x} by {y}.", "Calculate {x} multiplied by {y}.",
                      "What do you get when you multiply {x} and {y}?"],
        "slots": [("12", "7"), ("23", "4"), ("9", "9"), ("15", "16"), ("31", "3"), ("8", "125"),
                  ("64", "2"), ("17", "6"), ("45", "11"), ("13", "13"), ("7", "8"), ("250", "4")],
        "others": [("12", "8"), ("23", "5"), ("9", "8"), ("15", "17"), ("31", "4"), ("8", "126"),
                   ("64", "3"), ("17", "7"), ("45", "12"), ("13", "14"), ("7", "9"), ("250", "5")],
        "twists": ["What is {x} plus {y}?", "What is {x} divided by {y}?"],
    },
    {
        "name": "define",
        "phrasings": ["What does the word '{x}' mean?", "Define '{x}'.", "What is the meaning of '{x}'?",
                      "Give me the definition of '{x}'."],
        "slots": ["ephemeral", "ubiquitous", "serendipity", "pragmatic", "ambiguous", "benevolent",
                  "meticulous", "resilient", "candid", "frugal", "lucid", "tenacious"],
        "others": ["transient", "omnipresent", "luck", "practical", "vague", "kind", "careful",
                   "tough", "honest", "thrifty", "clear", "persistent"],
        "twists": ["What is the opposite of '{x}'?", "Use '{x}' in a sentence."],
    },
    {
        "name": "python-howto",
        "phrasings": ["How do I {x} in Python?", "What is the way to {x} using Python?",
                      "In Python, how can I {x}?", "Show me how to {x} with Python."],
        "slots": ["reverse a list", "sort a dictionary by value", "read a CSV file",
                  "remove duplicates from a list", "merge two dictionaries", "get the current date",
                  "split a string by commas", "check if a file exists", "convert a string to an integer",
                  "find the length of a list", "write JSON to a file", "generate a random number"],
        "others": ["reverse a string", "sort a list of tuples", "write a CSV file",
                   "count duplicates in a list", "compare two dictionaries", "get the current time",
                   "join a list into a string", "delete a file", "convert an integer to a string",
                   "find the maximum of a list", "read JSON from a file", "shuffle a list"],
        "twists": ["How do I {x} in JavaScript?", "How do I {x} in Rust?"],
    },
    {
        "name": "population",
        "phrasings": ["What is the population of {x}?", "How many people live in {x}?",
                      "How many inhabitants does {x} have?", "What's the number of residents of {x}?"],
        "slots": ["Tokyo", "Berlin", "Lagos", "Toronto", "Sydney", "Mumbai", "Cairo", "Madrid",
                  "Seoul", "Chicago", "Lima", "Oslo"],
        "others": ["Osaka", "Munich", "Abuja", "Vancouver", "Melbourne", "Delhi", "Alexandria",
                   "Barcelona", "Busan", "Boston", "Quito", "Bergen"],
        "twists": ["What is the area of {x}?", "What is the weather like in {x}?"],
    },
    {
        "name": "units",
        "phrasings": ["How many {x} are in a {y}?", "Convert one {y} to {x}.",
                      "One {y} equals how many {x}?", "What is the number of {x} in a {y}?"],
        "slots": [("centimeters", "meter"), ("ounces", "pound"), ("minutes", "day"), ("grams", "kilogram"),
                  ("feet", "mile"), ("seconds", "hour"), ("milliliters", "liter"), ("inches", "yard"),
                  ("days", "year"), ("meters", "kilometer"), ("cups", "gallon"), ("bytes", "kilobyte")],
        "others": [("millimeters", "meter"), ("grams", "pound"), ("hours", "week"), ("milligrams", "gram"),
                   ("yards", "mile"), ("minutes", "hour"), ("liters", "gallon"), ("inches", "foot"),
                   ("weeks", "year"), ("centimeters", "kilometer"), ("pints", "gallon"), ("bits", "byte")],
        "twists": ["How many {y}s are in a {x_one}?", "How many {x} are in ten {y}s?"],
    },
    {
        "name": "translate",
        "phrasings": ["How do you say '{x}' in {y}?", "Translate '{x}' into {y}.",
                      "What is '{x}' in {y}?", "Give me the {y} translation of '{x}'."],
        "slots": [("good morning", "Spanish"), ("thank you", "German"), ("goodbye", "Italian"),
                  ("how are you", "French"), ("I love you", "Portuguese"), ("good night", "Dutch"),
                  ("please", "Swedish"), ("excuse me", "Japanese"), ("happy birthday", "Polish"),
                  ("where is the station", "Turkish"), ("cheers", "Greek"), ("welcome", "Korean")],
        "others": [("good morning", "French"), ("thank you", "Italian"), ("goodbye", "German"),
                   ("how are you", "Spanish"), ("I love you", "Dutch"), ("good night", "Portuguese"),
                   ("please", "Norwegian"), ("excuse me", "Chinese"), ("happy birthday", "Czech"),
                   ("where is the airport", "Turkish"), ("cheers", "Russian"), ("welcome back", "Korean")],
        "twists": ["How do you spell '{x}' backwards?", "How many letters are in '{x}'?"],
    },
    {
        "name": "boil",
        "phrasings": ["How long should I boil {x}?", "For how many minutes do I boil {x}?",
                      "What is the boiling time for {x}?", "How many minutes does {x} need to boil?"],
        "slots": ["an egg", "rice", "pasta", "potatoes", "broccoli", "corn on the cob", "carrots",
                  "lentils", "shrimp", "green beans", "quinoa", "dumplings"],
        "others": ["a duck egg", "brown rice", "gnocchi", "sweet potatoes", "cauliflower", "peas",
                   "beets", "chickpeas", "lobster", "asparagus", "barley", "ravioli"],
        "twists": ["How long should I bake {x}?", "How long should I steam {x}?"],
    },
    {
        "name": "history",
        "phrasings": ["In which year did {x}?", "What year did {x}?", "When did {x}?",
                      "Around what year did {x}?"],
        "slots": ["World War II end", "the Berlin Wall fall", "humans first land on the Moon",
                  "the Titanic sink", "the French Revolution begin", "Columbus reach the Americas",
                  "the first iPhone come out", "the Roman Empire fall in the West",
                  "the printing press appear in Europe", "India gain independence",
                  "the Wright brothers first fly", "the Soviet Union dissolve"],
        "others": ["World War I end", "the Berlin Wall go up", "humans first reach orbit",
                   "the Lusitania sink", "the American Revolution begin", "Magellan reach the Pacific",
                   "the first iPad come out", "Constantinople fall", "the telegraph appear in Europe",
                   "Pakistan gain independence", "the first jet airliner fly", "Yugoslavia dissolve"],
        "twists": ["Where did {x}?", "Why did {x}?"],
    },
]


def fill(template, slot):
    if isinstance(slot, tuple):
        x, y = slot
        x_one = x[:-1] if x.endswith("s") else x
        return template.format(x=x, y=y, x_one=x_one)
    return template.format(x=slot, y="", x_one=slot)


def main():
    rows = []
    for fam in FAMILIES:
        for slot, other in zip(fam["slots"], fam["others"]):
            prompts = [fill(p, slot) for p in fam["phrasings"]]
            near = [fill(fam["phrasings"][0], other), fill(fam["phrasings"][2], other)]
            near += [fill(t, slot) for t in fam["twists"]]
            key = slot if isinstance(slot, str) else "-".join(slot)
            rows.append({"group": f"{fam['name']}:{key}", "prompts": prompts, "near_misses": near})
    with open(OUT, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} groups, {sum(len(r['near_misses']) for r in rows)} near misses to {OUT}")


if __name__ == "__main__":
    main()
