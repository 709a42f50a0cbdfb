"""The rollout-side rules for environment servers (pure functions over rlfactory's tool records)."""
from __future__ import annotations

from rlfactory.envs.protocol import bind_episode, close_calls, ends_episode, hide_episode_arg, policy_schema, reset_call
from rlfactory.tools.types import ToolCall, ToolResult, ToolSpec


def spec(server: str, tool: str, props: dict, required: list[str] | None = None) -> ToolSpec:
    return ToolSpec(name=f"{server}.{tool}", server=server, tool=tool,
                    input_schema={"type": "object", "properties": props, "required": required or []})


EP = {"episode_id": {"type": "string", "default": ""}}
STEP = spec("textcraft", "step", {"action": {"type": "string"}, **EP}, ["action"])
CLOSE = spec("textcraft", "close", dict(EP))
RESET = spec("textcraft", "reset", {"task_id": {"type": "integer"}, **EP})
CALC = spec("calculator", "calculator", {"expression": {"type": "string"}}, ["expression"])


def test_bind_episode_overrides_what_the_policy_wrote():
    call = ToolCall(name="textcraft.step", arguments={"action": "inventory", "episode_id": "someone-else"})
    assert bind_episode(call, STEP, "traj-1").arguments == {"action": "inventory", "episode_id": "traj-1"}
    calc = ToolCall(name="calculator", arguments={"expression": "1+1"})
    assert bind_episode(calc, CALC, "traj-1") is calc


def test_policy_schema_hides_episode_id():
    params = policy_schema(STEP)["function"]["parameters"]
    assert set(params["properties"]) == {"action"} and params["required"] == ["action"]
    assert "episode_id" in STEP.input_schema["properties"]  # the spec itself is untouched
    assert policy_schema(CALC) == CALC.to_openai()


def test_hide_episode_arg_works_on_openai_schemas_and_copies():
    required = spec("textcraft", "step", {"action": {"type": "string"}, **EP}, ["action", "episode_id"]).to_openai()
    hidden = hide_episode_arg(required)
    assert hidden["function"]["parameters"]["required"] == ["action"]
    assert set(hidden["function"]["parameters"]["properties"]) == {"action"}
    assert "episode_id" in required["function"]["parameters"]["properties"]  # the input is left as it was
    assert hide_episode_arg(CALC.to_openai()) == CALC.to_openai()
    assert hide_episode_arg({"type": "function", "function": {"name": "bare"}}) == {"type": "function",
                                                                                   "function": {"name": "bare"}}


def test_done_ends_the_episode():
    assert ends_episode(ToolResult(name="step", text="", structured={"done": True, "score": 1.0}))
    assert not ends_episode(ToolResult(name="step", text="", structured={"done": False}))
    assert not ends_episode(ToolResult(name="calculator", text="2"))
    assert not ends_episode(ToolResult(name="step", text="", is_error=True, structured={"done": True}))


def test_close_and_reset_calls():
    specs = [STEP, CLOSE, RESET, CALC]
    assert close_calls(specs, ["textcraft", "calculator"], "t") == [
        ToolCall(name="textcraft.close", arguments={"episode_id": "t"})]
    assert close_calls(specs, ["calculator"], "t") == []
    call = reset_call({"prompt": "p", "env": {"server": "textcraft", "task_id": 7}}, specs, "t")
    assert call == ToolCall(name="textcraft.reset", arguments={"task_id": 7, "episode_id": "t"})
    nested = reset_call({"metadata": {"env": {"server": "textcraft", "task_id": 2}}}, specs, "t")
    assert nested is not None and nested.arguments["task_id"] == 2
    assert reset_call({"prompt": "p"}, specs, "t") is None
    assert reset_call({"env": {"server": "babyai"}}, specs, "t") is None
