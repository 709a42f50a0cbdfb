"""The wiki's SQLite content: the Deep Search corpus we ship (envs/tools/data/deepsearch_corpus.jsonl), one row
per article. The content is the shipped corpus whatever the seed (the seed only names the cached file).
"""
from __future__ import annotations

import json
import sqlite3

SCHEMA = "CREATE TABLE articles (id INTEGER PRIMARY KEY, slug TEXT UNIQUE NOT NULL, title TEXT UNIQUE NOT NULL, " \
         "text TEXT NOT NULL);"


def slug(title: str) -> str:
    return title.replace(" ", "_")


def populate(conn: sqlite3.Connection, seed: int) -> None:
    from rlfactory.envs.tools import DATA_DIR

    conn.executescript(SCHEMA)
    with open(DATA_DIR / "deepsearch_corpus.jsonl") as f:
        docs = [json.loads(line) for line in f if line.strip()]
    conn.executemany("INSERT INTO articles (slug, title, text) VALUES (?,?,?)",
                     [(slug(d["title"]), d["title"], d["text"]) for d in docs])
    conn.commit()
