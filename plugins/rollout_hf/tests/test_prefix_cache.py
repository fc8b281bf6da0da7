"""The hf rollout's prefix cache (``polyrl_rollout_hf.prefix_cache``) on the tiny model (float32).

The reference is the same engine with ``prefix_cache=false``, which prefills every prompt whole:
over turns whose prompts extend the last call's prompts with its responses and a few new tokens
(what the multi-turn rollout sends), greedy tokens must be equal and log-probs equal to float32
rounding, on each decode path, with rows of mixed lengths, rows that find nothing and rows that
continue an earlier prompt; the cached engine must prefill fewer tokens. The multi-turn rollout
itself must build the same trajectories with and without the cache.
"""

from __future__ import annotations

import pytest
import torch
from hf_engines import build_gqa_model, hf_engine
from omegaconf import OmegaConf

from polyrl.batch import Batch
from polyrl.interfaces import SamplingParams
from polyrl.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model
from polyrl_rollout_hf.engine import HFRolloutEngine
from polyrl_rollout_hf.prefix_cache import PrefixCache

torch.set_num_threads(1)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
STOPS = list(range(60, 448, 5))  # rows end at mixed steps, so the contexts differ in length
PATHS = {
    "eager": {"static_cache": "false"},
    "static-chunks": {"static_cache": "true", "continuous_batching": "false"},
    "continuous": {"static_cache": "true", "continuous_batching": "true"},
}
CONTINUOUS_SLOTS = {
    "continuous": 8,  # every row in a slot of its own from the start
    "continuous-refills": 2,  # rows wait for slots: refills, and the cache ring wraps
    "continuous-shrink": 16,  # a ladder of 16 and 8 rows: live rows move to the front
}


def make_engine(path, hf, *, prefix_cache, device="cpu", slots=8, multi_turn=None):
    config = {
        "dtype": "float32",
        "micro_batch_size": slots,
        "engine_kwargs": {"hf": {**hf, "prefix_cache": prefix_cache}},
        **({} if multi_turn is None else {"multi_turn": {"enable": multi_turn}}),
    }
    return hf_engine(path, config, device)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


@pytest.fixture(scope="module")
def gqa_dir(tmp_path_factory):
    return build_gqa_model(str(tmp_path_factory.mktemp("gqa")), seed=0)


def left_padded(contexts: list[list[int]]) -> Batch:
    width = max(map(len, contexts))
    ids = torch.full((len(contexts), width), PAD_TOKEN_ID, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, context in enumerate(contexts):
        ids[i, width - len(context) :] = torch.tensor(context)
        mask[i, width - len(context) :] = 1
    return Batch({"input_ids": ids, "attention_mask": mask})


def play_turns(engine: HFRolloutEngine, turns: int, max_new: int) -> list[Batch]:
    """Turns of 7 episodes: each turn's prompts are the last ones + the responses + an
    observation of a few tokens; from the second turn on, one new episode joins (no hit)."""
    generator = torch.Generator().manual_seed(0)
    contexts = [
        torch.randint(3, 400, (int(n),), generator=generator).tolist()
        for n in (3, 9, 5, 12, 4, 7, 6)
    ]
    params = SamplingParams(n=1, max_new_tokens=max_new, greedy=True, stop_token_ids=STOPS)
    outs = []
    for turn in range(turns):
        out = engine.generate(left_padded(contexts), params)
        outs.append(out)
        observation = [turn + 3, 17, 23][: 1 + turn % 3]
        contexts = [
            context + out["responses"][i][out["response_mask"][i].bool()].tolist() + observation
            for i, context in enumerate(contexts)
        ]
        contexts[turn % len(contexts)] = contexts[turn % len(contexts)][:4]  # a fresh episode
    return outs


@pytest.mark.parametrize("path", ["eager", "static-chunks", *CONTINUOUS_SLOTS])
def test_greedy_turns_equal_a_fresh_prefill_of_the_whole_context(model_dir, path):
    assert_cached_turns_equal_fresh_ones(model_dir, path)


@pytest.mark.parametrize("path", ["eager", "continuous-refills"])
def test_grouped_query_attention_turns_equal_fresh_ones(gqa_dir, path):
    """4 query heads over 2 KV heads: the written-out continued prefill folds each KV head's
    query heads and new tokens into one query axis (the static paths), the model's forward
    repeats the KV heads (the eager path)."""
    assert_cached_turns_equal_fresh_ones(gqa_dir, path)


def assert_cached_turns_equal_fresh_ones(model_dir: str, path: str) -> None:
    hf = PATHS["continuous" if path in CONTINUOUS_SLOTS else path]
    slots = CONTINUOUS_SLOTS.get(path, 8)
    cached = make_engine(model_dir, hf, prefix_cache="true", slots=slots)
    fresh = make_engine(model_dir, hf, prefix_cache="false", slots=slots)
    turns_cached, turns_fresh = play_turns(cached, 4, 10), play_turns(fresh, 4, 10)
    lengths = turns_fresh[0]["response_mask"].sum(1)
    assert lengths.min() < lengths.max()  # a real length mix
    for a, b in zip(turns_cached, turns_fresh, strict=True):
        assert torch.equal(a["responses"], b["responses"])
        assert torch.equal(a["response_mask"], b["response_mask"])
        assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5)
    assert cached.stats["prefix_tokens_reused"] > 0
    assert fresh.stats["prefix_tokens_reused"] == 0
    assert cached.stats["prefill_tokens"] < fresh.stats["prefill_tokens"]
    if path.startswith("continuous"):  # the responses' KV kept from the decode slots
        assert cached.stats["decode_rows_kept"] > 0


def test_only_the_last_call_is_kept_and_a_weight_update_drops_it(model_dir):
    engine = make_engine(model_dir, PATHS["eager"], prefix_cache="true")
    assert isinstance(engine.prefix_cache, PrefixCache)
    play_turns(engine, 2, 6)
    assert len(engine.prefix_cache) == 7  # the second call's prompts only
    engine.update_weights(engine.model.state_dict().items())
    assert len(engine.prefix_cache) == 0
    assert make_engine(model_dir, PATHS["eager"], prefix_cache="false").prefix_cache is None


def test_auto_keeps_kv_for_multi_turn_rollouts_only(model_dir):
    """A single-turn run's prompts never extend an earlier call's, so ``auto`` holds no KV
    through its update; a multi-turn run's next turns do."""
    for multi_turn, kept in ((None, False), (False, False), (True, True)):
        engine = make_engine(model_dir, PATHS["eager"], prefix_cache="auto", multi_turn=multi_turn)
        assert (engine.prefix_cache is not None) == kept, multi_turn


def test_prompts_with_mask_holes_bypass_the_cache(model_dir):
    engine = make_engine(model_dir, PATHS["continuous"], prefix_cache="true")
    holes = Batch(
        {
            "input_ids": torch.tensor([[7, 0, 8, 9], [0, 0, 5, 6]]),
            "attention_mask": torch.tensor([[1, 0, 1, 1], [0, 0, 1, 1]]),
        }
    )
    engine.generate(holes, SamplingParams(max_new_tokens=4, greedy=True))
    assert len(engine.prefix_cache) == 0 and engine.stats["decode_rows_kept"] == 0


def test_a_hash_match_with_other_tokens_is_no_hit():
    cache = PrefixCache()
    cache.begin_call()
    ids = torch.tensor([[0, 5, 6, 7]])
    mask = torch.tensor([[0, 1, 1, 1]])
    layers = [(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))]
    from polyrl_rollout_hf.prefix_cache import Block

    cache.store(ids, mask, Block(layers))
    (key,) = cache._entries
    cache._entries[key].tokens = [5, 6, 8]  # as if another prompt had the same key
    assert cache.lookup(torch.tensor([[5, 6, 7, 9]]), torch.ones(1, 4, dtype=torch.long)) == [None]
    cache._entries[key].tokens = [5, 6, 7]
    (hit,) = cache.lookup(torch.tensor([[5, 6, 7, 9]]), torch.ones(1, 4, dtype=torch.long))
    assert hit is not None and hit.length == 3 and hit.row == 0
    # a prompt equal to a kept one leaves nothing to prefill: no hit
    assert cache.lookup(torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)) == [None]


def test_the_longest_kept_prompt_is_found_under_any_padding():
    """Keys hash the real tokens only (not the padding before them), in wrapping 64-bit
    arithmetic: large ids overflow the products and must still match."""
    from polyrl_rollout_hf.prefix_cache import Block

    big = 2**40 + 3
    cache = PrefixCache()
    cache.begin_call()
    kept = torch.tensor([[0, 0, big, 6], [big, 6, 7, 8]])
    layers = [(torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2))]
    cache.store(kept, (torch.arange(4) >= torch.tensor([[2], [0]])).long(), Block(layers))
    ids = torch.tensor([[0, 0, big, 6, 7, 8, 9], [0, 0, 0, big, 6, 7, 9], [0, 0, 0, big, 5, 7, 8]])
    mask = (torch.arange(7) >= torch.tensor([[2], [3], [3]])).long()
    first, second, third = cache.lookup(ids, mask)
    assert (first.row, first.length) == (1, 4)
    assert (second.row, second.length) == (0, 2)
    assert third is None


def test_a_longer_held_ladder_serves_a_shorter_call(model_dir):
    engine = make_engine(model_dir, PATHS["continuous"], prefix_cache="true")
    pool = engine.static_decode
    long_ladder = pool.ladder(8, 300)
    assert pool.ladder(8, 100) is long_ladder
    assert pool.ladder(8, 500) is not long_ladder


def test_the_multi_turn_rollout_builds_the_same_trajectories_and_releases_the_kv(model_dir):
    from transformers import AutoTokenizer

    from polyrl.envs.chat import ChatTokens
    from polyrl.envs.episode import Environment, Episode, EpisodeStart, Observation
    from polyrl.envs.rollout import MultiTurnRollout

    class Reply(Episode):
        async def start(self):
            return EpisodeStart(messages=None)

        async def step(self, turn):
            if turn.index >= 2:
                return Observation(done=True, reward=1.0)
            return Observation([{"role": "user", "content": "go on " * (turn.index + 1)}])

    class Replies(Environment):
        def __init__(self) -> None:  # no config to read
            pass

        def episode(self, row):
            return Reply()

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = OmegaConf.create(
        {
            "format": "hermes",
            "env_timeout_s": 30.0,
            "max_assistant_turns": 3,
            "max_user_turns": None,
            "max_tool_response_length": 64,
            "tool_response_truncate_side": "middle",
            "max_tokens_per_turn": 12,
        }
    )
    prompts = [tokenizer(text)["input_ids"] for text in ("hi", "What is 3 + 4?", "a b c", "ok")]
    rows = [{"index": i} for i in range(len(prompts))]
    params = SamplingParams(n=1, max_new_tokens=48, greedy=True, stop_token_ids=STOPS)
    results = []
    for prefix_cache in ("true", "false"):
        engine = make_engine(model_dir, PATHS["continuous"], prefix_cache=prefix_cache)
        rollout = MultiTurnRollout(
            Replies(),
            ChatTokens(tokenizer, [EOS_TOKEN_ID]),
            settings,
            max_response_length=200,
            max_prompt_length=64,
        )
        events = []

        def generate(batch, turn_params, engine=engine, events=events):
            events.append(("generate", len(engine.prefix_cache or ())))
            return engine.generate(batch, turn_params)

        def release(engine=engine, events=events):
            events.append(("release", len(engine.prefix_cache or ())))
            engine.reset_prefix_cache()

        trajectories, _ = rollout.run(rows, prompts, generate, params, release=release)
        results.append((trajectories, engine.stats["prefix_tokens_reused"]))
        # released once, after the last turn, with the last turn's KV in it; nothing kept after
        assert [name for name, _ in events] == ["generate"] * 3 + ["release"]
        assert (events[-1][1] > 0) == (prefix_cache == "true")
        assert len(engine.prefix_cache or ()) == 0
    (cached, reused), (fresh, none) = results
    assert reused > 0 and none == 0
    for a, b in zip(cached, fresh, strict=True):
        assert a.tokens == b.tokens and a.assistant == b.assistant
        assert a.assistant_turns == b.assistant_turns == 3
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)


@pytest.mark.gpu
@CUDA
def test_cuda_cached_turns_equal_fresh_ones_and_capture_no_more_graphs(model_dir):
    hf = {"static_cache": "true", "continuous_batching": "true"}
    cached = make_engine(model_dir, hf, prefix_cache="true", device="cuda")
    fresh = make_engine(model_dir, hf, prefix_cache="false", device="cuda")
    assert cached.static_decode.use_graphs
    for engine in (cached, fresh):  # the longest turn's ladder first: later turns reuse it
        engine.generate(left_padded([[5] * 100]), SamplingParams(max_new_tokens=10, greedy=True))
    captures = cached.static_decode.captures
    turns_cached, turns_fresh = play_turns(cached, 4, 10), play_turns(fresh, 4, 10)
    for a, b in zip(turns_cached, turns_fresh, strict=True):
        assert torch.equal(a["responses"], b["responses"])
        assert torch.allclose(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-4)
    assert cached.stats["prefix_tokens_reused"] > 0
    assert cached.static_decode.captures == captures
