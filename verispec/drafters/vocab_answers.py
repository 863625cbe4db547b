"""The draft's own answers as a corpus for the reduced head's ranking: which tokens the draft actually writes.

A fixed list of code and prose ranks what text in general uses; a reduced head loses acceptance where the draft (and
the target) put probability on tokens outside it. So the third corpus of `verispec.drafters.vocab_ranking` is the
draft's expected token mass over its own answers: the draft answers instructions written here (templates × subjects,
none taken from an evaluation prompt set), and every answer position adds the draft's whole next-token distribution
q(·) at T = 1 to the mass of each token (an expected count, smoother than counting the sampled tokens; the tokens
a top-N cut leaves out are exactly those with the least q-mass over these positions).

With a target (`answers --weight acceptance`) each position adds min(p(·), q(·)) instead: what each token contributes
to the probability that speculative sampling accepts a drafted token there (α = Σ_x min(p(x), q(x)),
docs/algorithms.md §2). A head that keeps the tokens with the most of that mass keeps the most acceptance; tokens the
draft favours but the target does not weigh little, however often the draft would write them.

    python -m verispec.drafters.vocab_cli answers --out answer-mass.npy   # then: build --answers answer-mass.npy
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

# Instruction templates by kind of request: chat answers (explanations, lists, letters, stories, opinions, plans),
# reasoning and arithmetic, code, and rewriting. {s} is a subject from SUBJECTS.
TEMPLATES = (
    "Explain {s} to someone who has never heard of it.",
    "Write a short blog post about {s}.",
    "Give me five practical tips about {s}, with a sentence on each.",
    "What are the main advantages and disadvantages of {s}? Answer with a table.",
    "Write a friendly email to a colleague proposing a meeting about {s}.",
    "Write a short story of about 150 words in which {s} plays a role.",
    "Write a poem with four stanzas about {s}.",
    "Summarise the history of {s} in one paragraph.",
    "Imagine you are a tour guide. Describe {s} to a group of visitors.",
    "Pretend to be a sceptical journalist and ask three sharp questions about {s}.",
    "Draft a one-week plan for a beginner who wants to learn about {s}.",
    "Compare {s} with a related topic of your choice, point by point.",
    "What are common misconceptions about {s}? Correct each one.",
    "Write a persuasive paragraph arguing that schools should teach {s}.",
    "Give a step-by-step explanation of how {s} works, using a numbered list.",
    "Write a product description for an app that helps people with {s}.",
    "Create a quiz of five multiple-choice questions about {s}, with the answers.",
    "Describe a typical day of a professional who works with {s}.",
    "Write a Python function that solves a small problem related to {s}, with a docstring and an example.",
    "Write a JSON object describing three facts about {s}, with keys 'fact' and 'source_type'.",
    "Explain {s} in Markdown with a heading, a short introduction and a bulleted list of key ideas.",
    "A friend asks whether {s} is worth their time. Give a balanced answer.",
    "Rewrite this sentence in a formal register and then in a casual one: 'I think {s} is kind of overrated.'",
    "Estimate, with a short calculation, how many hours a person might spend on {s} in a year.",
)
SUBJECTS = (
    "photosynthesis", "the stock market", "public transport in large cities", "sleep hygiene", "machine learning",
    "the French Revolution", "climate change", "home gardening", "electric cars", "the human immune system",
    "learning a second language", "remote work", "the history of jazz", "personal budgeting", "volcanoes",
    "renewable energy", "chess openings", "the Roman Empire", "healthy breakfasts", "black holes",
    "time management", "recycling plastics", "the printing press", "marathon training", "cloud computing",
    "ancient Egyptian pyramids", "vaccines", "urban beekeeping", "the Olympic Games", "cryptography",
    "coral reefs", "job interviews", "impressionist painting", "inflation", "smartphone addiction",
    "the water cycle", "databases", "Shakespeare's plays", "mountain hiking safety", "probability",
    "supply chains", "meditation", "the Industrial Revolution", "3D printing", "classical music",
    "customer service", "the Moon landing", "nutrition labels", "open-source software", "bird migration",
)
# Self-contained tasks: code, arithmetic word problems and logic, the other half of what a chat draft writes.
TASKS = (
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Write a Python class for a bank account with deposit, withdraw and balance methods, raising on overdraft.",
    "Write a function in Python that merges two sorted lists into one sorted list, and explain its complexity.",
    "Write a SQL query that returns the five customers with the highest total order value.",
    "Write a JavaScript function that debounces another function.",
    "Write a bash script that counts the lines of every .txt file in a directory.",
    "Write a C function that reverses a linked list in place.",
    "Write Python code that reads a CSV file and prints the average of its 'price' column.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Find and fix the bug: def mean(xs): return sum(xs) / len(xs) + 1",
    "Write unit tests with pytest for a function add(a, b) that adds two numbers.",
    "Write a recursive Python function for the n-th Fibonacci number and then an iterative one.",
    "A train travels 240 km in 3 hours. How far does it travel in 5 hours at the same speed? Show your work.",
    "If 3 pencils cost 75 cents, how much do 10 pencils cost? Explain step by step.",
    "Solve for x: 3x + 7 = 22. Show each step.",
    "A rectangle has a perimeter of 36 cm and one side of 10 cm. What is its area?",
    "Alice is older than Bob, and Bob is older than Carol. Who is the youngest? Explain your reasoning.",
    "What is the probability of rolling two sixes with two fair dice? Explain.",
    "A shop gives 20% off and then another 10% off. Is that the same as 30% off? Explain.",
    "Convert 98.6 degrees Fahrenheit to Celsius and show the formula.",
    "Sort these numbers and give their median: 12, 5, 19, 7, 3, 15.",
    "Extract the names and dates from: 'On 4 May 2021, Maria Lopez met John Chen in Madrid.' Return JSON.",
    "Translate into English and explain any idioms: 'Il pleut des cordes, alors on reste à la maison.'",
    "Summarise in three bullet points: 'The city council voted to expand bike lanes, citing safety data and "
    "lower emissions, while some shop owners worried about parking.'",
)


def ranking_instructions(count: int, seed: int = 0) -> list[str]:
    """Return `count` distinct instructions: every task of TASKS, then template × subject pairs in a seeded order."""
    pairs = [template.format(s=subject) for template in TEMPLATES for subject in SUBJECTS]
    random.Random(seed).shuffle(pairs)
    instructions = [*TASKS, *pairs]
    if not 1 <= count <= len(instructions):
        raise ValueError(f"count must be between 1 and {len(instructions)}, got {count}")
    return instructions[:count]


def teacher_forced_probs(model: Any, ids: list[int], n: int) -> torch.Tensor:
    """Return `model`'s softmax probabilities `[n, V]` (float32) predicting the last n tokens of `ids`, from one
    forward over ids[:-1] after a reset."""
    model.reset()
    return torch.softmax(model.forward(ids[:-1], n_logits=n).logits.float(), dim=-1)


def acceptance_probs(target: Any, draft: Any, ids: list[int], n: int) -> torch.Tensor:
    """Return min(p, q) `[n, V]` at the last n positions of `ids`: each token's share of the exact probability that
    speculative sampling at T = 1 accepts the draft's token there (p the target's law, q the draft's)."""
    return torch.minimum(teacher_forced_probs(target, ids, n), teacher_forced_probs(draft, ids, n))


def answer_mass(generate: Callable[[str, int], Any], score: Callable[[list[int], int], torch.Tensor],
                encode: Callable[[str], list[int]], instructions: Sequence[str],
                progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, int]:
    """Return (mass, positions): Σ over the answers' positions of each position's weights, as float64 `[V]`.

    generate(instruction, seed) -> the draft's answer (a `verispec.api.Generation`); score(ids, n) -> the weights
    `[n, V]` of the positions that predict the last n tokens of ids (the draft's probabilities, or `acceptance_probs`);
    encode(instruction) -> the prompt's ids (chat template applied), as the generation saw them.
    """
    mass: np.ndarray | None = None
    positions = 0
    for index, instruction in enumerate(instructions):
        answer = generate(instruction, index).tokens
        if not answer:
            continue
        probs = score(encode(instruction) + list(answer), len(answer)).to(torch.float64).sum(0).numpy()
        mass = probs if mass is None else mass + probs
        positions += len(answer)
        if progress is not None:
            progress(index + 1, positions)
    if mass is None:
        raise ValueError("the draft answered none of the instructions")
    return mass, positions
