"""Filters of target-written user turns, on crafted texts: each reason fires on its case and not on a
clean request; near duplicates are found over the whole set, and only at or above the threshold."""

from __future__ import annotations

import pytest

from eyas.regenerate.filters import (
    REJECT_REASONS,
    DuplicateFilter,
    MinHashLSH,
    TurnLimits,
    check_turn,
    cjk_share,
    distinct_ngram_ratio,
    jaccard,
    language,
    repetition_loop,
    shingles,
    units,
)

LIMITS = TurnLimits(
    max_new_tokens=160, max_tokens=100, near_duplicate_jaccard=0.7, special_texts=("<|im_end|>",)
)
CLEAN_EN = "Explain how photosynthesis turns sunlight into chemical energy in plants."
CLEAN_ZH = "请解释光合作用是如何把阳光转化为植物中的化学能的。"


def test_units_split_words_and_ideographs():
    assert units("Hello, World 42!") == ["hello", "world", "42"]
    assert units("写一首诗 about tea") == ["写", "一", "首", "诗", "about", "tea"]


def test_language_by_cjk_share():
    assert cjk_share("abc") == 0.0 and cjk_share("") == 0.0
    assert cjk_share("诗诗ab") == 0.5
    assert language(CLEAN_ZH) == "zh" and language(CLEAN_EN) == "en"
    assert language("Translate 你好 into English please, thanks") == "en"  # 2 of 33 letters


@pytest.mark.parametrize(
    "text, tokens, wanted, reason",
    [
        ("", 1, "en", "empty"),
        ("   \n", 2, "en", "empty"),
        ("Write a story about a dragon who", 160, "en", "cut_off"),  # reached the cap
        ("Tell me about \ufffd\ufffd cats", 10, "en", "invalid_text"),
        ("Say hi<|im_end|> and bye", 10, "en", "special_token"),
        ("请你烹饪一像；；；；；；；；；；；；", 30, "zh", "repetition_loop"),
        ("Is it? Is it? Is it? Is it? Is it? Is it?", 20, "en", "repetition_loop"),
        (
            "the cat sat on the mat and the cat sat on the mat and the cat sat on the mat and the cat sat",
            30,
            "en",
            "repetition_loop",
        ),  # no piece 5 times in a row, but 15 of 22 3-grams repeat
        (CLEAN_EN, 101, "en", "too_long"),
        (CLEAN_EN, 14, "zh", "wrong_language"),
        (CLEAN_ZH, 20, "en", "wrong_language"),
    ],
)
def test_each_reason_fires_on_its_case(text, tokens, wanted, reason):
    assert reason in REJECT_REASONS
    got = check_turn(text, tokens, wanted, LIMITS)
    assert got is not None and got[0] == reason, got


def test_clean_turns_pass():
    assert check_turn(CLEAN_EN, 14, "en", LIMITS) is None
    assert check_turn(CLEAN_ZH, 25, "zh", LIMITS) is None
    assert check_turn(CLEAN_EN, 159, None, TurnLimits(160, 200, 0.7)) is None  # one below the cap
    assert not repetition_loop("I need a list, a plan, and a budget for a trip to Rome in May.")


def test_exact_and_near_duplicates_over_the_whole_set():
    seen = DuplicateFilter(0.7)
    first = "Can you give me three tips for growing tomatoes on a small balcony in summer?"
    assert seen.check(first) is None
    seen.add("a", first)
    for i in range(50):  # unrelated turns in between: the match is still found
        seen.add(f"x{i}", f"Question number {i} about topic {i * 7} and item {i * 13}")
    exact = seen.check("can you give me three tips for growing tomatoes on a small  balcony in summer?")
    assert exact == ("duplicate", "same text as a")
    near = seen.check("Can you give me three tips for growing tomatoes on a small balcony in winter?")
    assert near is not None and near[0] == "near_duplicate" and "with a" in near[1]
    assert seen.check("What are the rules of chess castling, and when is it not allowed?") is None


def test_near_duplicate_threshold_is_exact_jaccard():
    a = "one two three four five six seven eight nine ten"
    b = "one two three four five six seven eight nine eleven"  # 7 of 9 shared 3-grams: J = 7/9
    similarity = jaccard(shingles(a), shingles(b))
    assert similarity == pytest.approx(7 / 9)
    for threshold, found in ((0.7, True), (0.8, False)):
        index = MinHashLSH(threshold)
        index.add("a", shingles(a))
        hit = index.query(shingles(b))
        assert (hit is not None) == found, (threshold, hit)
        if hit:
            assert hit == ("a", pytest.approx(7 / 9))


def test_minhash_signatures_are_stable_and_seeded():
    items = shingles(CLEAN_EN)
    assert (MinHashLSH(0.7, seed=1).signature(items) == MinHashLSH(0.7, seed=1).signature(items)).all()
    assert (MinHashLSH(0.7, seed=1).signature(items) != MinHashLSH(0.7, seed=2).signature(items)).any()


def test_distinct_ngram_ratio():
    assert distinct_ngram_ratio(["a b c", "a b c"], 2) == pytest.approx(2 / 4)
    assert distinct_ngram_ratio(["a b c d"], 2) == 1.0
    assert distinct_ngram_ratio([], 3) == 1.0
