"""Bad input raises a typed error naming the bad field, with a message a client can act on."""

import pytest

from sits.engine import (EngineConfig, InvalidRequestError, LLMEngine, QueueFullError, SamplingParams,
                    UnknownModelError)
from sits.engine.errors import ContextLengthError
from tests.engine.helpers import run_to_completion


@pytest.mark.parametrize("kwargs,param,words", [
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"max_tokens": 2.5}, "max_tokens", "integer"),
    ({"temperature": -0.1}, "temperature", "[0, 100]"),
    ({"temperature": "hot"}, "temperature", "number"),
    ({"top_p": 0.0}, "top_p", "(0, 1]"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"seed": -5}, "seed", "seed"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"stop_token_ids": [-1]}, "stop_token_ids", ">= 0"),
    ({"logprobs": 21}, "logprobs", "[0, 20]"),
    ({"ignore_eos": "yes"}, "ignore_eos", "boolean"),
])
def test_sampling_params_validation(kwargs, param, words):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kwargs)
    assert e.value.param == param and words in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_single_stop_string_is_accepted():
    assert SamplingParams(stop="###").stop == ["###"]


@pytest.mark.parametrize("kwargs,param", [
    ({"block_size": 0}, "block_size"), ({"device": "tpu"}, "device"), ({"dtype": "int4"}, "dtype"),
    ({"quantization": "int4"}, "quantization"), ({"max_num_seqs": -1}, "max_num_seqs"),
    ({"num_kv_blocks": 0}, "num_kv_blocks"), ({"model": ""}, "model"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
])
def test_engine_config_validation(kwargs, param):
    with pytest.raises(InvalidRequestError) as e:
        EngineConfig(**kwargs)
    assert e.value.param == param


def test_unknown_kernel_set_and_model():
    with pytest.raises(InvalidRequestError) as e:
        LLMEngine(EngineConfig(kernels="triton-v99", device="cpu", num_kv_blocks=4))
    assert e.value.param == "kernels" and "triton-v99" in str(e.value) and "torch" in str(e.value)
    with pytest.raises(UnknownModelError, match="llama3-8b"):
        LLMEngine(EngineConfig(model="llama-9000", device="cpu"))
    with pytest.raises(InvalidRequestError, match="needs a CUDA GPU") as e:
        LLMEngine(EngineConfig(model="llama3-8b", device="cpu"))
    assert e.value.param == "device"


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=4, max_waiting=3))  # 256-token context


@pytest.mark.parametrize("prompt,kwargs,param,words", [
    ("", {}, "prompt", "empty"),
    ([], {}, "prompt", "non-empty"),
    ([1, 2, 512], {}, "prompt", "[0, 512)"),
    ([1, "a"], {}, "prompt", "integers"),
    ("x" * 300, {}, "prompt", "context is 256"),
    ("x" * 200, {"params": SamplingParams(max_tokens=100)}, "max_tokens", "exceeds"),
    ("hi", {"priority": 4}, "priority", "[0, 3]"),
    ("hi", {"tenant": ""}, "tenant", "tenant"),
    ("hi", {"params": {"max_tokens": 3}}, "params", "SamplingParams"),
])
def test_add_request_validation(engine, prompt, kwargs, param, words):
    params = kwargs.pop("params", SamplingParams(max_tokens=4))
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("bad", prompt, params, **kwargs)
    assert e.value.param == param and words in str(e.value), str(e.value)
    assert not engine.has_unfinished_requests()


def test_context_length_is_a_typed_error(engine):
    with pytest.raises(ContextLengthError) as e:
        engine.add_request("long", [1] * 200, SamplingParams(max_tokens=100))
    assert (e.value.prompt_tokens, e.value.max_tokens, e.value.context, e.value.param) == (200, 100, 256, "max_tokens")
    assert str(e.value) == ("prompt (200 tokens) + max_tokens (100) = 300 exceeds the model's context of 256 tokens: "
                            "at most 56 tokens can be generated")
    assert isinstance(e.value, InvalidRequestError) and not engine.has_unfinished_requests()
    engine.add_request("fits", [1] * 200, SamplingParams(max_tokens=56))   # exactly the context: accepted
    engine.abort_request("fits")
    while engine.has_unfinished_requests():
        engine.step()


def test_duplicate_ids_and_full_queue(engine):
    p = SamplingParams(max_tokens=2)
    engine.add_request("a", "one", p)
    with pytest.raises(InvalidRequestError) as e:
        engine.add_request("a", "two", p)
    assert e.value.param == "request_id" and "already in use" in str(e.value)
    engine.add_request("b", "two", p)
    engine.add_request("c", "three", p)
    with pytest.raises(QueueFullError, match="3 requests"):
        engine.add_request("d", "four", p)
    assert set(run_to_completion(engine)) == {"a", "b", "c"}
    engine.add_request("d", "four", p)  # room again
    run_to_completion(engine)


def test_full_queue_holds_while_a_step_runs():
    # requests leave the inbox for the scheduler at the start of a step: admission must still count them while the
    # step runs (a server's HTTP thread calls add_request concurrently with the engine thread's step)
    engine = LLMEngine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=8, max_num_seqs=1, max_waiting=2))
    p = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("hog", "hog", p)
    engine.step()                                   # the hog takes the only running slot
    engine.add_request("w1", "one", p)
    engine.add_request("w2", "two", p)
    seen = []
    schedule = engine.scheduler.schedule

    def schedule_and_try_to_add():
        try:
            engine.add_request("late", "three", p)
            seen.append("admitted")
        except QueueFullError:
            seen.append("queue full")
        return schedule()
    engine.scheduler.schedule = schedule_and_try_to_add
    engine.step()
    assert seen == ["queue full"] and engine.stats().num_waiting == 2
