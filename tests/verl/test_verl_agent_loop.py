"""rlfactory's agent loop inside verl's own agent-loop machinery, on CPU.

verl's `AgentLoopWorker` is built from the config our translation composes (so the loop is found through the
generated `agent_loop_config_path`, as in a Ray worker), with an LLM server object that wraps rlfactory's HFEngine on
a scripted tiny Qwen3. The batch comes from verl's RLHFDataset reading the parquet rows `prepare` wrote, repeated
`rollout.n` times like verl's trainer does. Tools are the real calculator MCP server. Checked: verl's output tensors,
response_mask == the policy tokens the server generated, rollout logprobs, rewards on the last token, and the
ScalingInter-RL horizon following `global_steps`.
"""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import torch
from verl_setup import IM_END, HFServer, build_setup, dataset_batch_dict, expected_mask


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import prepare

    root = tmp_path_factory.mktemp("verl_loop")
    recipe_path, model = build_setup(root)
    recipe = Recipe.from_yaml(recipe_path)
    yield prepare(recipe), model
    shutil.rmtree(root, ignore_errors=True)


def _batch(prepared, global_steps: int):
    from verl.protocol import DataProto

    cfg = prepared.config
    batch = DataProto.from_single_dict(dataset_batch_dict(prepared))
    batch = batch.repeat(repeat_times=cfg.actor_rollout_ref.rollout.n, interleave=True)  # as verl's trainer does
    batch.non_tensor_batch["global_steps"] = np.array([global_steps] * len(batch), dtype=object)
    return batch


async def test_agent_loop_runs_inside_verl_worker(prepared):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from rlfactory.models.tokenizer import load_qwen_tokenizer
    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.verl.agent_loop import close_worker_states
    from rlfactory.verl.reward import compute_score

    prep, model = prepared
    cfg = prep.config
    tok = load_qwen_tokenizer()
    engine = HFEngine(model, pad_token_id=151643, eos_token_ids=[IM_END], max_batch_size=16)
    server = HFServer(engine)
    worker = AgentLoopWorker(cfg, server, None, None)
    try:
        outs = {}
        for step in (1, 2):  # verl's global_steps: step 1 -> horizon stage 0 (1 turn), step 2 -> stage 1 (3 turns)
            server.calls.clear()
            outs[step] = (await worker.generate_sequences(_batch(prep, step)), list(server.calls))
    finally:
        await close_worker_states()
        await engine.close()

    n_rows = 2 * cfg.actor_rollout_ref.rollout.n
    p_len, r_len = cfg.actor_rollout_ref.rollout.prompt_length, cfg.actor_rollout_ref.rollout.response_length
    total_calls, scores, answered = 0, [], 0
    for step, (out, calls) in outs.items():
        b, nt = out.batch, out.non_tensor_batch
        assert b["prompts"].shape == (n_rows, p_len) and b["responses"].shape == (n_rows, r_len)
        assert b["input_ids"].shape == b["attention_mask"].shape == (n_rows, p_len + r_len)
        assert "rm_scores" in b.keys() and "rollout_log_probs" in b.keys()
        horizon = 1 if step == 1 else 3
        assert list(nt["rlf_horizon"]) == [horizon] * n_rows
        for i in range(n_rows):
            attn = b["attention_mask"][i]
            prompt = b["prompts"][i][attn[:p_len].bool()].tolist()
            resp_len = int(attn[p_len:].sum())
            response = b["responses"][i][:resp_len].tolist()
            want_mask, want_lp, assistant_turns = expected_mask(calls, prompt + response, len(prompt), r_len)
            assert b["response_mask"][i].tolist() == want_mask  # 1 exactly on tokens the server generated
            torch.testing.assert_close(b["rollout_log_probs"][i], torch.tensor(want_lp), rtol=0, atol=0)
            assert 1 <= assistant_turns <= horizon
            # the reward sits on the last response token, and it is the exact-match verdict on the last <answer>
            # tag the policy wrote (checked here on the decoded tokens, independently of the reward code)
            rm = b["rm_scores"][i]
            assert float(rm.sum()) == float(rm[resp_len - 1]) == float(nt["score"][i])
            answers = re.findall(r"<answer>(.*?)</answer>", tok.decode(response))
            assert float(nt["score"][i]) == float(answers[-1:] == ["42"])
            scores.append(float(nt["score"][i]))
            answered += tok.decode(response).count("<tool_response>\n42\n</tool_response>")
            # verl's reward path (our bridge, fed text as verl's reward managers decode it) agrees with the loop
            for skip in (True, False):
                bridged = await compute_score(nt["data_source"][i], tok.decode(response, skip_special_tokens=skip),
                                              nt["reward_model"][i]["ground_truth"], nt["extra_info"][i],
                                              recipe_path=str(prep.files.recipe))
                for key, value in bridged.items():
                    assert value == float(nt[key][i]), (key, skip)
            total_calls += int(nt["rlf_tool_calls"][i])
        # each sample of a GRPO group has its own index: trajectory ids `uid/0 .. uid/n-1`, none repeated
        ids = [str(x) for x in nt["rlf_trajectory_id"]]
        groups: dict[str, list[str]] = {}
        for tid in ids:
            uid, _, k = tid.rpartition("/")
            groups.setdefault(uid, []).append(k)
        assert len(set(ids)) == n_rows and len(groups) == 2
        assert all(sorted(ks) == [str(k) for k in range(cfg.actor_rollout_ref.rollout.n)] for ks in groups.values())
        # clean endings only; `token_budget` is one too: the chain's rare junk token (1e-4 a token) can derail a
        # turn until it hits max_new_tokens_per_turn, which the loop ends cleanly (CI drew it once in ~10 runs)
        assert set(nt["rlf_finish_reason"]) <= {"stop", "max_turns", "token_budget"}
        assert float(nt["reward_failed"].sum()) == 0.0
        if step == 1:
            assert all(int(c) == 0 for c in nt["rlf_tool_calls"])  # horizon 1: calls in the last turn are not run
    assert total_calls > 0 and answered > 0  # step 2 ran real calculator calls (60% of first turns are calls)
    assert len(set(scores)) == 2  # both verdicts occur (40% of turns answer "42"), so the check above has teeth



def test_horizon_follows_verls_one_based_steps():
    from rlfactory.recipe.rollout import ScalingInterHorizon
    from rlfactory.verl.agent_loop import horizon_at

    sched = ScalingInterHorizon(horizons=[2, 5, 9], interval_steps=10)
    # verl's first update is global_steps=1 (= our step 0); v0 trainers send no step (first stage)
    assert [horizon_at(sched, s) for s in (None, 1, 10, 11, 20, 21, 10_000)] == [2, 2, 2, 5, 5, 9, 9]
    assert horizon_at(sched, np.int64(11)) == 5  # verl's non-tensor batch holds numpy scalars


def test_a_prompt_longer_than_verls_prompt_length_is_not_trained_on():
    from types import SimpleNamespace

    from rlfactory.rollout.trajectory import Trajectory, TurnSpan
    from rlfactory.verl.agent_loop import RLFactoryAgentLoop

    traj = Trajectory(id="x", prompt_ids=list(range(10)), response_ids=[1, 2, 3, 4], loss_mask=[1, 1, 0, 1],
                      logprobs=[-1.0, -2.0, 0.0, -3.0], turns=[TurnSpan(role="assistant", start=0, end=4)])
    fake = SimpleNamespace(rollout_config=SimpleNamespace(prompt_length=16, response_length=8))
    ok = RLFactoryAgentLoop._output(fake, traj, 1.0, {"score": 1.0}, 2, {"logprobs": True}, (0, 0))
    assert ok.prompt_ids == list(range(10)) and ok.response_mask == [1, 1, 0, 1]
    assert ok.response_logprobs == [-1.0, -2.0, 0.0, -3.0] and ok.reward_score == 1.0
    assert ok.extra_fields["reward_extra_info"] == {"score": 1.0}
    fake.rollout_config.prompt_length = 6
    cut = RLFactoryAgentLoop._output(fake, traj, 1.0, {"score": 1.0}, 2, {"logprobs": False}, (0, 0))
    assert cut.prompt_ids == list(range(4, 10)) and cut.response_mask == [0, 0, 0, 0]
    assert cut.response_logprobs is None and "cut to 6" in cut.extra_fields["rlf_error"]
