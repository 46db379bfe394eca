"""The mix of target-written prompts: one seeded steer per conversation (pure functions, no I/O).

A bare chat template cut at the user turn makes an instruct model write much the same request again
and again (for SmolLM2-135M: English only, most opening "Can you" or "I'm planning"). Magpie steers it
with the system prompt (arXiv 2406.08464, which controls task and language through it); so does
this module: each conversation draws a language (Simplified Chinese at `chinese_share`), tool use (at
`tool_share`: the tool schemas of a demo record go into the system prompt, and the request should need
one of them), a topic, a persona and a task type, phrased by one of several system-prompt templates.
The steer is only the writing context: the conversation written out keeps its tools, not the steer.
Optionally (`opener_share`) the first user turn also starts with a few words in the steer's language
(`OPENERS`) that the target continues: the turn written out is those words and the continuation.

Each conversation's steer depends on (seed, its index) alone, so more conversations do not change the
first ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# (English, Simplified Chinese) pairs
TOPICS = [
    ("cooking", "烹饪"), ("world history", "世界历史"), ("physics", "物理"), ("biology", "生物"),
    ("chemistry", "化学"), ("astronomy", "天文"), ("mathematics", "数学"), ("programming", "编程"),
    ("machine learning", "机器学习"), ("music", "音乐"), ("painting", "绘画"), ("literature", "文学"),
    ("travel", "旅行"), ("sports", "体育"), ("health", "健康"), ("nutrition", "营养"),
    ("psychology", "心理学"), ("economics", "经济学"), ("personal finance", "个人理财"), ("law", "法律"),
    ("the environment", "环境保护"), ("climate", "气候"), ("geography", "地理"), ("philosophy", "哲学"),
    ("education", "教育"), ("learning a language", "学习外语"), ("film", "电影"), ("gardening", "园艺"),
    ("pets", "宠物"), ("parenting", "育儿"), ("architecture", "建筑"), ("fashion", "时尚"),
    ("video games", "电子游戏"), ("cars", "汽车"), ("space exploration", "太空探索"), ("medicine", "医学"),
    ("agriculture", "农业"), ("marketing", "市场营销"), ("careers", "职业发展"), ("friendship", "人际关系"),
    ("mythology", "神话"), ("electronics", "电子"), ("databases", "数据库"), ("cybersecurity", "网络安全"),
    ("statistics", "统计学"), ("poetry", "诗歌"), ("chess", "国际象棋"), ("oceans", "海洋"),
]  # fmt: skip
PERSONAS = [
    ("a student", "一名学生"), ("a teacher", "一位老师"), ("a software engineer", "一名软件工程师"),
    ("a retiree", "一位退休老人"), ("a parent", "一位家长"), ("a small-business owner", "一位小店老板"),
    ("a doctor", "一名医生"), ("a novelist", "一位小说家"), ("a scientist", "一位科学家"),
    ("a tourist", "一名游客"), ("a chef", "一名厨师"), ("a farmer", "一位农民"), ("a journalist", "一名记者"),
    ("a lawyer", "一名律师"), ("a high-school student", "一名高中生"), ("a data analyst", "一名数据分析师"),
    ("a musician", "一位音乐家"), ("a designer", "一名设计师"),
]  # fmt: skip
TASKS = [
    ("explain a concept", "解释一个概念"), ("answer a factual question", "回答一个事实性问题"),
    ("write a short story", "写一个短故事"), ("write a poem", "写一首诗"),
    ("write Python code", "编写Python代码"),
    ("solve a math problem", "解一道数学题"), ("translate a sentence", "翻译一句话"),
    ("summarize a paragraph they give", "总结一段给定的文字"), ("brainstorm ideas", "想一些点子"),
    ("give advice", "给出建议"), ("compare two things", "比较两样东西"),
    ("classify a list of items", "给一组事物分类"),
    ("rewrite a sentence they give", "改写一个给定的句子"), ("make a plan", "制定一个计划"),
    ("write an email", "写一封邮件"), ("give step-by-step instructions", "给出分步骤的说明"),
    ("list examples", "列举一些例子"), ("find the bug in a piece of code", "找出一段代码中的错误"),
]  # fmt: skip
SYSTEM_TEMPLATES = {
    "en": [
        "You are a helpful AI assistant. The user is {persona} and asks you to {task} about {topic}.",
        "You are an assistant who knows {topic} well. The user, {persona}, wants you to {task}.",
        "You are a knowledgeable assistant. Expect a request from {persona}: to {task}, on {topic}.",
    ],
    "zh": [
        "你是一个乐于助人的AI助手。用户是{persona}，用中文请你{task}，主题是{topic}。",
        "你是一位精通{topic}的助手。{persona}会用简体中文向你提出请求：{task}。",
        "你是知识渊博的助手。接下来，{persona}会用中文请你{task}，话题与{topic}有关。",
    ],
}
TOOL_TEMPLATES = {
    "en": [
        "You are a helpful assistant with access to the functions below. The user, {persona}, asks for "
        "something that one of them can do.",
        "You can call the functions below. The user asks you to do a task that needs one of them.",
    ],
    "zh": [
        "你是一个可以调用下列函数的助手。用户是{persona}，会用中文提出需要用到其中某个函数的请求。",
        "你可以调用下列函数。用户会用中文请你完成一项需要其中某个函数的任务。",
    ],
}
LANGUAGES = ("en", "zh")
# The first words of a user turn, written for the target to continue (`opener_share`). SmolLM2-135M
# opened 21% of its requests with "I'm" and 17% with "Can you" without them, 7% at most with one
# opener; it stays in the opener's language where a system prompt's "write in Chinese" did not hold
# (wrong-language rejections 28 -> 1 of 192), though its Chinese is then broken and runs on until cut
# off (CPU, bench/results/prompt-openers-cpu-smollm2.json).
OPENERS = {
    "en": [
        "Explain", "Write", "How do I", "What is the difference between", "Can you help me", "Give me",
        "Why does", "List", "Summarize", "I need", "Create", "Describe", "What are", "Please",
        "Compare", "Suggest", "Translate", "Is it true that",
    ],
    "zh": [
        "请", "请问", "帮我", "我想", "如何", "为什么", "什么是", "请解释", "写一", "给我", "你能",
        "怎样", "我需要", "有没有", "请列出", "比较", "请总结", "能不能",
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Steer:
    """What one conversation is steered to; `system` is the system prompt it is written under."""

    language: str  # "en" | "zh"
    tools: str | None  # canonical JSON of the tool schemas, or None
    topic: str
    persona: str
    task: str
    system: str
    opener: str = ""  # the first words of the first user turn, or "" (the target writes it all)

    def summary(self) -> dict:
        return {"language": self.language, "tools": self.tools is not None, "topic": self.topic,
                "persona": self.persona, "task": self.task, "opener": self.opener}  # fmt: skip


def steer(
    index: int,
    *,
    seed: int,
    chinese_share: float,
    tool_share: float,
    tool_sets: dict,
    opener_share: float = 0.0,
) -> Steer:
    """The steer of conversation `index`; `tool_sets` maps a language to its tool-schema JSON texts
    (a language without any borrows the other's). An opener (`OPENERS`) at `opener_share`, drawn after
    everything else, so the other fields are those of `opener_share` 0."""
    rng = random.Random(f"eyas-prompts:{seed}:{index}")  # a str seed is hashed with sha512: stable
    language = "zh" if rng.random() < chinese_share else "en"
    wants_tools = rng.random() < tool_share
    column = LANGUAGES.index(language)
    topic, persona, task = (rng.choice(table)[column] for table in (TOPICS, PERSONAS, TASKS))
    tools = None
    if wants_tools:
        choices = tool_sets.get(language) or [t for texts in tool_sets.values() for t in texts]
        if not choices:
            raise ValueError("tool_share > 0 but no tool schemas were read from tool_files")
        tools = rng.choice(choices)
    templates = (TOOL_TEMPLATES if tools else SYSTEM_TEMPLATES)[language]
    system = rng.choice(templates).format(topic=topic, persona=persona, task=task)
    opener = rng.choice(OPENERS[language]) if rng.random() < opener_share else ""
    return Steer(language, tools, topic, persona, task, system, opener)


def plan(
    count: int,
    *,
    seed: int,
    chinese_share: float,
    tool_share: float,
    tool_sets: dict,
    opener_share: float = 0.0,
) -> list[Steer]:
    """The steers of conversations 0 .. count - 1."""
    shares = dict(chinese_share=chinese_share, tool_share=tool_share, opener_share=opener_share)
    return [steer(i, seed=seed, tool_sets=tool_sets, **shares) for i in range(count)]
