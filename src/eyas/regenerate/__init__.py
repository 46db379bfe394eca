"""The regenerate rule family: text the target writes itself (`responses`: assistant turns regenerated
by the target; `prompts`: user turns the target writes, steered by `mix` and checked by `filters`)."""
