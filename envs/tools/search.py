"""Search MCP server: BM25 (bm25s) over a small corpus the project ships.

Run: `python -m rlfactory.envs.tools.search` (stdio), `--http --port N` (streamable HTTP on 127.0.0.1), or
`--build-index` (build the index and exit; `rlfactory setup-mcp` does this once before training).

The corpus is JSONL with one document per line: `{"id": ..., "title": ..., "text": ...}` — by default
`envs/tools/data/search_corpus.jsonl` (232 short documents: real facts, and a fictional continent, Aurelia, whose
towns, people and inventions exist only in this corpus, so questions about them cannot be answered from memory).
`--corpus PATH` serves another file in the same shape (a bare name picks a corpus shipped beside the default one).

The index is built once and saved beside the corpus (`<corpus>.bm25s/`), or under ~/.cache/rlfactory when that
directory is not writable; it is rebuilt when the corpus changes (its sha256 is stored with the index). Builds
write to a temporary directory and rename it into place, so servers starting together do not corrupt it.
Left out: stemming (no extra dependency), dense retrieval, snippets/highlighting.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

log = logging.getLogger("rlfactory.envs.tools.search")

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_CORPUS = DATA_DIR / "search_corpus.jsonl"
MAX_TOP_K = 10
MAX_QUERY_CHARS = 500
INDEX_FORMAT = 1


def tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s  # noqa: PLC0415 - keeps `--help` fast

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


def load_corpus(path: Path) -> list[dict[str, Any]]:
    docs = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{lineno}: not valid JSON ({e}); each line must be one document") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise SystemExit(f'{path}:{lineno}: each line must be an object with a "text" string')
            docs.append(doc)
    if not docs:
        raise SystemExit(f"{path}: the corpus is empty")
    return docs


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def index_dir_for(corpus: Path) -> Path:
    """Beside the corpus when that folder is writable and not the installed package's own data (a wheel's files stay
    as pip wrote them), else a per-corpus folder under ~/.cache/rlfactory."""
    beside = corpus.with_name(corpus.name + ".bm25s")
    shipped_in_a_wheel = corpus.resolve().parent == DATA_DIR and "site-packages" in DATA_DIR.parts
    if os.access(corpus.parent, os.W_OK) and not shipped_in_a_wheel:
        return beside
    tag = hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:16]
    return Path.home() / ".cache" / "rlfactory" / f"search-{tag}.bm25s"


def _index_is_current(index_dir: Path, digest: str) -> bool:
    try:
        meta = json.loads((index_dir / "rlfactory_meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("corpus_sha256") == digest and meta.get("format") == INDEX_FORMAT


def build_index(corpus: Path, index_dir: Path) -> None:
    import bm25s  # noqa: PLC0415

    docs = load_corpus(corpus)
    retriever = bm25s.BM25()
    retriever.index(tokenize([f"{d.get('title', '')} {d['text']}" for d in docs]), show_progress=False)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=index_dir.name + ".tmp-", dir=index_dir.parent))
    try:
        retriever.save(str(tmp), show_progress=False)
        meta = {"corpus_sha256": _digest(corpus), "format": INDEX_FORMAT, "documents": len(docs)}
        (tmp / "rlfactory_meta.json").write_text(json.dumps(meta))
        if index_dir.exists():
            shutil.rmtree(index_dir, ignore_errors=True)
        try:
            tmp.rename(index_dir)
        except OSError:
            # Another server finished its build first; theirs is equally current.
            if not _index_is_current(index_dir, meta["corpus_sha256"]):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the search index for %s (%d documents) in %s", corpus, len(docs), index_dir)


class Searcher:
    """The loaded index and documents of one corpus."""

    def __init__(self, corpus: Path, index_dir: Path | None = None):
        import bm25s  # noqa: PLC0415

        self.corpus = corpus
        self.index_dir = index_dir or index_dir_for(corpus)
        if not _index_is_current(self.index_dir, _digest(corpus)):
            build_index(corpus, self.index_dir)
        self.docs = load_corpus(corpus)
        self.retriever = bm25s.BM25.load(str(self.index_dir))
        self.vocab = self.retriever.vocab_dict

    def search(self, query: str, top_k: int = 3) -> list[tuple[dict[str, Any], float]]:
        terms = [t for t in tokenize([query])[0] if t in self.vocab]
        if not terms:
            return []
        k = max(1, min(top_k, MAX_TOP_K, len(self.docs)))
        ids, scores = self.retriever.retrieve([terms], k=k, show_progress=False, n_threads=1)
        return [(self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


def format_hits(hits: list[tuple[dict[str, Any], float]]) -> str:
    if not hits:
        return "No documents matched the query. Try different or fewer keywords."
    lines = []
    for rank, (doc, _score) in enumerate(hits, 1):
        title = doc.get("title") or doc.get("id", "")
        lines.append(f"[{rank}] {title}\n{doc['text']}")
    return "\n\n".join(lines)


_searcher: Searcher | None = None
_corpus_path = DEFAULT_CORPUS

server = MCPServer(
    "search",
    instructions="Keyword search over a document collection: call search(query, top_k).",
    log_level="WARNING",
)


@server.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False,
                                         open_world_hint=False))
def search(query: str, top_k: int = 3) -> str:
    """Search the document collection and return the best-matching documents (title and text).

    Args:
        query: Keywords to look for, e.g. "founder of Varnholt" or "capital of Australia".
        top_k: How many documents to return (1 to 10).
    """
    global _searcher
    if not query.strip():
        raise ToolError("the query is empty; give a few keywords")  # ToolError: shown to the model
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"the query is too long ({len(query)} characters; limit {MAX_QUERY_CHARS})")
    if _searcher is None:
        _searcher = Searcher(_corpus_path)
    return format_hits(_searcher.search(query, top_k))


def main() -> None:
    global _corpus_path, _searcher
    parser = argparse.ArgumentParser(description="BM25 search MCP server.")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help="JSONL corpus (id, title, text): a path, or the file name of a corpus shipped in "
                             f"{DATA_DIR} (e.g. deepsearch_corpus.jsonl)")
    parser.add_argument("--build-index", action="store_true", help="build the index if needed, then exit")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8012)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    _corpus_path = args.corpus.resolve()
    if not _corpus_path.exists() and args.corpus.parent == Path(".") and (DATA_DIR / args.corpus).is_file():
        _corpus_path = DATA_DIR / args.corpus  # a shipped corpus, by name
    if not _corpus_path.exists():
        shipped = ", ".join(sorted(p.name for p in DATA_DIR.glob("*corpus*.jsonl")))
        raise SystemExit(f"search corpus not found: {_corpus_path} (pass --corpus PATH, or a shipped corpus: "
                         f"{shipped})")
    # Load (building if needed) before serving, so the first call is not slow and start-up reports problems.
    _searcher = Searcher(_corpus_path)
    if args.build_index:
        print(f"index ready: {_searcher.index_dir} ({len(_searcher.docs)} documents)", file=sys.stderr)
        return
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
