"""Deep Search: multi-hop question answering with a search tool (the Search-R1 / AgentGym "SearchQA" style task).

An episode is one question (`questions[task_id % len(questions)]`). The agent calls `search(query, top_k)` over a
retrieval corpus as often as it likes and ends the episode with `answer(text)`: reward 1.0 on an exact match
(SQuAD normalisation: case, punctuation, articles, whitespace) with any gold answer, else 0.0.

Corpus rows are JSONL: `{"id", "title", "text"}` (or Search-R1's `{"id", "contents"}`); questions are
`{"question", "answers": [..]}`. The shipped set (envs/tools/data/deepsearch_*.jsonl) is a small invented world
with 2-hop questions, so no answer can come from a model's prior knowledge. Retrieval is BM25 (`bm25s`); a dense
retriever is left out for now (the `Retriever` protocol is where one plugs in).
"""
from __future__ import annotations

import json
import re
import string
import threading
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from rlfactory.envs.types import StepResult

DATA = Path(__file__).resolve().parents[2] / "envs" / "tools" / "data"
DEFAULT_CORPUS = DATA / "deepsearch_corpus.jsonl"
DEFAULT_QUESTIONS = DATA / "deepsearch_questions.jsonl"
MAX_TOP_K = 10


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: list[str]) -> bool:
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in answers)


def _read_jsonl(path: Path, what: str) -> list[dict]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what} file ({e})") from e
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from e
    return rows


class Retriever(Protocol):
    def search(self, query: str, top_k: int) -> list[dict]: ...


class BM25Retriever:
    """BM25 over the corpus; documents render as `(title) text`."""

    def __init__(self, corpus_path: Path):
        import bm25s

        self.docs = []
        for i, row in enumerate(_read_jsonl(corpus_path, "corpus")):
            if "contents" in row:  # Search-R1 format: first line is the title in quotes
                title, _, text = str(row["contents"]).partition("\n")
                row = {"id": row.get("id", i), "title": title.strip('"'), "text": text}
            elif "text" not in row:
                raise ValueError(f"{corpus_path}: row {i + 1} needs 'text' (and 'title') or 'contents'")
            self.docs.append({"id": str(row.get("id", i)), "title": row.get("title", ""), "text": row["text"]})
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize([f"{d['title']} {d['text']}" for d in self.docs], show_progress=False),
                         show_progress=False)
        self._lock = threading.Lock()  # bm25s retrieval is not documented as thread-safe

    def search(self, query: str, top_k: int) -> list[dict]:
        import bm25s

        k = max(1, min(top_k, len(self.docs)))
        with self._lock:
            ids, scores = self._bm25.retrieve(bm25s.tokenize([query], show_progress=False), k=k,
                                              show_progress=False, n_threads=1)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


@lru_cache(maxsize=4)
def load_retriever(corpus_path: str = str(DEFAULT_CORPUS)) -> BM25Retriever:
    return BM25Retriever(Path(corpus_path))


@lru_cache(maxsize=4)
def load_questions(path: str = str(DEFAULT_QUESTIONS)) -> tuple[dict, ...]:
    rows = _read_jsonl(Path(path), "questions")
    for n, row in enumerate(rows, 1):
        if "question" not in row or not isinstance(row.get("answers"), list):
            raise ValueError(f"{path}: row {n} needs 'question' (str) and 'answers' (list of str)")
    return tuple(rows)


class DeepSearchEnv:
    """One question. `step("search: ...")` / `step("answer: ...")` for the generic protocol; the MCP server also
    exposes `search` and `answer` as tools of their own."""

    def __init__(self, corpus_path: str | None = None, questions_path: str | None = None):
        self.retriever = load_retriever(corpus_path or str(DEFAULT_CORPUS))
        self.questions = load_questions(questions_path or str(DEFAULT_QUESTIONS))
        self.task_id: int | None = None
        self.row: dict | None = None
        self.done = False
        self.score = 0.0
        self.searches = 0

    def reset(self, task_id: int = 0) -> StepResult:
        self.task_id = int(task_id)
        self.row = self.questions[self.task_id % len(self.questions)]
        self.done, self.score, self.searches = False, 0.0, 0
        return StepResult(observation=self.observe(), info=self._info())

    def observe(self) -> str:
        if self.row is None:
            return "No task yet: call reset(task_id) first."
        return (f"Question: {self.row['question']}\nUse search(query) to find documents (the answer may need "
                "several searches), then answer(text) with a short answer.")

    def search(self, query: str, top_k: int = 3) -> StepResult:
        if self.row is None:
            return StepResult(observation="No task yet: call reset(task_id) first.")
        if not query.strip():
            return self._result("The query is empty: search for words that describe what you need.", 0.0)
        self.searches += 1
        hits = self.retriever.search(query, max(1, min(int(top_k), MAX_TOP_K)))
        if not hits:
            return self._result(f"No documents match {query!r}. Try other words.", 0.0)
        text = "\n".join(f"Doc {i + 1} ({d['title']}): {d['text']}" for i, d in enumerate(hits))
        return self._result(text, 0.0)

    def answer(self, text: str) -> StepResult:
        if self.row is None:
            return StepResult(observation="No task yet: call reset(task_id) first.")
        if self.done:
            return self._result("The question was already answered. Call reset for a new one.", 0.0)
        self.done = True
        correct = exact_match(text, self.row["answers"])
        self.score = 1.0 if correct else 0.0
        verdict = "Correct." if correct else "Incorrect."
        return self._result(f"Answer recorded: {text!r}. {verdict}", self.score)

    def step(self, action: str) -> StepResult:
        verb, _, arg = action.partition(":")
        if verb.strip().lower() == "search":
            return self.search(arg.strip())
        if verb.strip().lower() == "answer":
            return self.answer(arg.strip())
        return self._result(f"Unknown action {action!r}. Use `search: <query>` or `answer: <text>`.", 0.0)

    def _result(self, observation: str, reward: float) -> StepResult:
        return StepResult(observation=observation, reward=reward, score=self.score, done=self.done,
                          info=self._info())

    def _info(self) -> dict:
        return {"task_id": self.task_id, "searches": self.searches}

    def close(self) -> None:
        self.row = None
