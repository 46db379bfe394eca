"""eyas: EAGLE-3 drafters trained from a target LLM's hidden states."""

__version__ = "0.1.0"
