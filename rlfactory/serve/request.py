"""What a chat-completions request may ask of `rlfactory serve`, checked before any of it reaches the model.

`ChatRequest` is the part of OpenAI's request the server honours; `parse_request` turns a raw body into one or a
`RequestError` (a JSON 4xx naming the field). The checks here are those a single request could otherwise turn into
a failure for everyone: `chat_template_kwargs` limited to the chat template's own inputs (never the tokenizer's
arguments such as `tokenize` or `return_tensors`, which change what rendering returns), seeds in the range a
generator takes, forced choices bounded in number and length.
Left out: rendering and tokenizing (prompt.py), scoring choices (choices.py), the HTTP app (server.py).
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_SEED = 2**63 - 1
"""Largest `seed` taken: choice i of a request samples with seed + i, and a generator takes at most 2^64 - 1."""
UNSUPPORTED_FIELDS = ("logprobs", "logit_bias", "response_format", "guided_json", "guided_regex", "guided_grammar")
"""Fields refused with a 400 rather than ignored: the reply could not honour them."""
MAX_STOP_STRINGS, MAX_STOP_CHARS = 16, 256
"""Bounds on `stop`: each string is checked against the decoded tail at every step of every sample."""
SET_BY_SERVER = frozenset({"messages", "tools", "documents", "add_generation_prompt", "continue_final_message"})
"""Template inputs the server fills itself; a request sets them through its own fields, not chat_template_kwargs."""
_NOT_INPUTS = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace", "raise_exception",
                         "strftime_now", "loop", "self", "true", "false", "none"})
"""Names a template reads that are Jinja's or transformers' globals, not inputs."""


class ChatRequest(BaseModel):
    """The part of OpenAI's chat-completions request this server honours."""
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = -1
    """vLLM's extension; -1 = off."""
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    guided_choice: list[str] | None = None
    structured_outputs: dict[str, Any] | None = None


    @field_validator("stop")
    @classmethod
    def _short_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"{len(v)} stop strings; at most {MAX_STOP_STRINGS}")
        for s in [v] if isinstance(v, str) else v or []:
            if len(s) > MAX_STOP_CHARS:
                raise ValueError(f"a stop string of {len(s)} characters; at most {MAX_STOP_CHARS}")
        return v


class RequestError(ValueError):
    """A request this server cannot answer; becomes HTTP `status` with an OpenAI-style error body."""
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def describe_validation(exc: ValidationError | Any) -> str:
    """`field.path: what is wrong; ...` from pydantic's (or FastAPI's) errors, without echoing the input."""
    parts = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        parts.append(f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def parse_request(body: bytes) -> ChatRequest:
    """The request in `body` (JSON), or a RequestError naming what is wrong (runs off the event loop for big bodies)."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply") from None
    except ValueError as e:  # bad JSON, bad UTF-8, an integer of thousands of digits
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as e:
        raise RequestError(f"invalid request: {describe_validation(e)}") from None
    except RecursionError:
        raise RequestError("the request nests JSON too deeply") from None


def template_inputs(tokenizer: Any) -> frozenset[str]:
    """Names the tokenizer's chat template reads from its caller and never sets itself, less those the server fills
    (messages, tools, ...) and the special tokens transformers passes: what `chat_template_kwargs` may set."""
    import jinja2
    from jinja2 import meta, nodes

    source = getattr(tokenizer, "chat_template", None)
    sources = list(source.values()) if isinstance(source, dict) else [source] if isinstance(source, str) else []
    names: set[str] = set()
    for src in sources:
        try:
            ast = _template_env(src).parse(src)
        except jinja2.TemplateError:
            continue  # transformers reports it on the first request; nothing can be allowed from it
        assigned = {n.name for a in ast.find_all((nodes.Assign, nodes.AssignBlock, nodes.For))
                    for n in [a.target, *a.target.find_all(nodes.Name)] if isinstance(n, nodes.Name)}
        names |= meta.find_undeclared_variables(ast) - assigned
    special = set(getattr(tokenizer, "special_tokens_map", None) or {})
    return frozenset(n for n in names - SET_BY_SERVER - _NOT_INPUTS - special if not n.endswith("_token"))


def _template_env(source: str) -> Any:
    # transformers' own environment knows its extensions ({% generation %}, loop controls); a plain one otherwise.
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
        return _compile_jinja_template(source).environment
    except Exception:  # noqa: BLE001 - a private helper that may move or reject the template: parse plainly
        import jinja2
        return jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])


def check_template_kwargs(kwargs: dict[str, Any], allowed: frozenset[str]) -> None:
    """RequestError unless every key of `chat_template_kwargs` is an input of the chat template."""
    bad = sorted(k for k in kwargs if k not in allowed)
    if not bad:
        return
    what = (f"this model's chat template takes: {', '.join(sorted(allowed))}" if allowed
            else "this model's chat template takes none")
    reserved = [k for k in bad if k in SET_BY_SERVER]
    why = (f" ({', '.join(reserved)} {'is' if len(reserved) == 1 else 'are'} set by the server from the request's "
           f"own fields)" if reserved else "")
    raise RequestError(f"chat_template_kwargs: {', '.join(repr(k) for k in bad)} not allowed{why}; {what}")


def forced_choices(req: ChatRequest, *, max_choices: int) -> list[str] | None:
    """The request's `guided_choice` / `structured_outputs.choice` (None when it has none), checked for shape and
    number; their length in tokens is checked once tokenized (choices.py)."""
    field, choices = "guided_choice", req.guided_choice
    if choices is None and req.structured_outputs is not None:
        others = sorted(k for k in req.structured_outputs if k != "choice")
        if others:
            raise RequestError(f"structured_outputs: only `choice` is supported here, not {', '.join(others)}")
        field, choices = "structured_outputs.choice", req.structured_outputs.get("choice")
    if choices is None:
        return None
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise RequestError(f"{field} must be a list of strings")
    if not choices:
        raise RequestError(f"{field} is empty; give at least one choice")
    if len(choices) > max_choices:
        raise RequestError(f"{field} has {len(choices)} choices; this server takes at most {max_choices}")
    return choices
