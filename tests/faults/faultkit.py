"""Shared pieces of the fault tests: the extraction setup and a child process paused at a named point."""

from __future__ import annotations

LAYER_IDS = [0, 1, 2]
EXTRACT_KW = {"layer_ids": LAYER_IDS, "model_id": "tiny", "progress": False, "token_budget": 96, "threads": 1}
CONVERSATIONS = [
    ("Hi", "Hello! How can I help you today?"),
    ("What is the capital of France?", "The capital of France is Paris, on the Seine."),
    (
        "Write a haiku about rain.",
        "Soft rain on the roof,\nthe garden drinks in silence,\nclouds drift east.",
    ),
    ("2+2?", "4"),
    ("Name three colours.", "Red, green and blue are three primary colours of light."),
    ("Explain recursion briefly.", "A function that calls itself on a smaller problem until a base case."),
    ("Translate 'cat' to French.", "Chat."),
    ("Give me a prime above 100.", "101 is prime: no integer from 2 to 10 divides it."),
]
