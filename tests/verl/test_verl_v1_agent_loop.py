"""rlfactory's agent loop under verl's v1 trainer machinery (the default when TransferQueue is installed), on CPU.

A local Ray with a real TransferQueue (controller and one storage unit as Ray actors) and verl's own
`AgentLoopWorkerTQ` (instantiated in this process rather than as a Ray actor, so it can drive the in-memory scripted
model). The batch is built as verl's v1 trainer builds it: one row per prompt (the worker runs `rollout.n` sessions
itself), `global_steps` attached, the prompts registered in TransferQueue first. The outputs are read back from
TransferQueue as verl's trainer reads them. Checked: response_mask == the tokens the server generated, rollout
logprobs, the reward on the last token, the horizon following `global_steps`, and one trajectory per session id.
"""
from __future__ import annotations

import asyncio
import re
import shutil

import pytest
import torch
from verl_setup import IM_END, HFServer, build_setup, dataset_batch_dict, expected_mask

pytest.importorskip("transfer_queue", reason="TransferQueue (a dependency of rlfactory) is not installed")


@pytest.fixture(scope="module")
def tq_cluster(tmp_path_factory):
    """A local Ray and a TransferQueue on it; both stopped afterwards."""
    import ray
    import transfer_queue as tq

    from rlfactory.recipe.schema import Recipe
    from rlfactory.verl.launch import fit_transfer_queue, prepare

    root = tmp_path_factory.mktemp("verl_v1")
    recipe_path, model = build_setup(root)
    prep = prepare(Recipe.from_yaml(recipe_path))
    assert prep.config.trainer.use_v1  # verl's default, which rlfactory keeps
    # TransferQueue's actors take one logical CPU each: its storage units are fitted to the CPUs as launch() does
    # (a CPU translation already asks for one)
    cpus = 4
    fit_transfer_queue(prep.config, cpus)
    assert prep.config.transfer_queue.backend.SimpleStorage.num_data_storage_units == 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, namespace="rlf-test")
    try:
        tq.init(prep.config.transfer_queue)
        yield prep, model
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
            shutil.rmtree(root, ignore_errors=True)


def _worker_class():
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    # verl declares it with @ray.remote; the class it wraps is the first base of Ray's modified class
    cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class.__mro__[1]
    assert cls.__name__ == "AgentLoopWorkerTQ"
    return cls


async def _one_step(worker, prep, global_steps: int):
    """Submit one training batch as verl's v1 trainer does and read the finished samples back from TransferQueue."""
    import transfer_queue as tq
    from verl.utils import tensordict_utils as tu

    batch = tu.get_tensordict(dataset_batch_dict(prep))
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    uids = [str(u) for u in batch["uid"]]
    await tq.async_kv_batch_put(keys=uids, partition_id="train",
                                tags=[{"is_prompt": True, "status": "pending",
                                       "global_steps": global_steps}] * len(uids))
    await worker.generate_sequences(batch)
    await asyncio.wait_for(asyncio.gather(*list(worker.background_tasks)), timeout=120)
    listing = (await tq.async_kv_list("train"))["train"]
    assert all(listing[u]["status"] == "finished" for u in uids), {u: listing[u] for u in uids}
    keys = sorted(k for k in listing if k.split("_", 1)[0] in uids and not listing[k].get("is_prompt"))
    data = await tq.async_kv_batch_get(keys=keys, partition_id="train")
    await tq.async_kv_clear(keys=keys + uids, partition_id="train")
    return keys, data


async def test_agent_loop_runs_inside_verls_v1_transfer_queue_worker(tq_cluster):
    from rlfactory.models.tokenizer import load_qwen_tokenizer
    from rlfactory.rollout.engines.hf import HFEngine
    from rlfactory.verl.agent_loop import close_worker_states

    prep, model = tq_cluster
    cfg = prep.config
    n = cfg.actor_rollout_ref.rollout.n
    tok = load_qwen_tokenizer()
    engine = HFEngine(model, pad_token_id=151643, eos_token_ids=[IM_END], max_batch_size=16)
    server = HFServer(engine)
    worker = _worker_class()(cfg, server, None, None)
    results = {}
    try:
        for step in (1, 2):  # step 1 -> horizon stage 0 (1 turn), step 2 -> stage 1 (3 turns)
            server.calls.clear()
            keys, data = await _one_step(worker, prep, step)
            results[step] = keys, data, list(server.calls)
    finally:
        await close_worker_states()
        await engine.close()

    scores, total_calls = [], 0
    for step, (keys, data, calls) in results.items():
        horizon = 1 if step == 1 else 3
        assert len(keys) == 2 * n  # two prompts x rollout.n sessions, one output each
        prompts, responses = data["prompts"].unbind(), data["responses"].unbind()
        masks, logprobs, rm = (data["response_mask"].unbind(), data["rollout_log_probs"].unbind(),
                               data["rm_scores"].unbind())
        ids_by_uid: dict[str, list[str]] = {}
        for i, key in enumerate(keys):
            uid, session, _ = key.split("_")
            extra = data["extra_fields"][i]
            assert extra["rlf_horizon"] == horizon and data["global_steps"][i] == step
            assert extra["rlf_finish_reason"] in {"stop", "max_turns", "token_budget"}, extra
            # the trajectory id carries verl's session id: each sample of a GRPO group has its own
            assert extra["rlf_trajectory_id"] == f"{uid}/{session}" and int(data["session_id"][i]) == int(session)
            ids_by_uid.setdefault(uid, []).append(session)
            prompt, response = prompts[i].tolist(), responses[i].tolist()
            want_mask, want_lp, turns = expected_mask(calls, prompt + response, len(prompt), len(response))
            assert masks[i].tolist() == want_mask  # 1 exactly on tokens the server generated
            torch.testing.assert_close(logprobs[i], torch.tensor(want_lp), rtol=0, atol=0)
            assert 1 <= turns <= horizon
            assert torch.equal(data["loss_mask"].unbind()[i], masks[i])
            # the reward sits on the last response token; it is the exact-match verdict on the last <answer> tag
            score = extra["reward_extra_info"]["score"]
            assert float(rm[i].sum()) == float(rm[i][-1]) == score
            answers = re.findall(r"<answer>(.*?)</answer>", tok.decode(response))
            assert score == float(answers[-1:] == ["42"])
            scores.append(score)
            total_calls += extra["rlf_tool_calls"]
            if step == 1:
                assert extra["rlf_tool_calls"] == 0  # horizon 1: calls in the last turn are not run
        assert len(ids_by_uid) == 2 and all(sorted(s) == [str(k) for k in range(n)] for s in ids_by_uid.values())
    assert total_calls > 0  # step 2 ran real calculator calls
    assert len(set(scores)) == 2  # both verdicts occur, so the reward check above has teeth
