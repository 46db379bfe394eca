"""Writes data/train-0000N-of-00003.parquet with Hugging Face `datasets`, sharded as `push_to_hub` shards
a split: `python -m venv /tmp/ds && /tmp/ds/bin/pip install datasets && /tmp/ds/bin/python make.py`."""

import datasets

ROWS = [
    {
        "conversations": [
            {"from": "human", "value": f"What is {n} + {n}?"},
            {"from": "gpt", "value": f"{n} + {n} = {2 * n}."},
        ],
        **({"system": "Answer with the sum."} if n % 2 == 0 else {}),
    }
    for n in range(6)
]
ROWS.append({"conversations": [{"from": "human", "value": "No answer follows."}]})  # no_assistant_turn
ds = datasets.Dataset.from_list(ROWS)
for index in range(3):
    ds.shard(num_shards=3, index=index, contiguous=True).to_parquet(
        f"data/train-{index:05d}-of-00003.parquet"
    )
print(datasets.__version__, ds)  # committed shards: datasets 5.2.0, pyarrow 26.0.1
