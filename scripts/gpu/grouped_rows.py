"""Rewrite a harvested table's repeated-KV decode attention rows (kv_heads = heads, what a
compiled transformers step or transformers < 5.2 records after repeat_kv) to the grouped call
tuner.serving runs on the cache itself (kv_heads from the model's config), so a search can tune
head stacking (HEADS_PER_BLOCK > 1) for it. A GPU-session helper, not a product stage: an eager
trace of transformers >= 5.2 already harvests the grouped call (tuner.harvest.shapes).
Usage: python3 scripts/gpu/grouped_rows.py SHAPES.parquet MODEL_CONFIG.json OUT.parquet"""

import json
import sys

import pandas as pd


def main(src: str, config: str, out: str) -> None:
    cfg = json.loads(open(config).read())
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    rows = pd.read_parquet(src)
    repeated = (rows["family"] == "attention") & (rows["heads"] == heads) & (rows["kv_heads"] == heads)
    rows.loc[repeated, "kv_heads"] = kv_heads
    rows.to_parquet(out)
    print(f"{int(repeated.sum())} attention row(s): kv_heads {heads} -> {kv_heads}; wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
