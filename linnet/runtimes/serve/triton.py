"""The Triton Python-backend model of `linnet export triton`: one model instance (one stub process) loads the model
with Linnet's runtime and drives Linnet's serving engine (`linnet.runtimes.serve.engine`), streaming a response per
piece of new text.

Runs inside Triton's stub only: `pb_utils` is the stub's `triton_python_backend_utils`, handed in by the
repository's model.py (linnet/runtimes/serve/triton_entry.py), which has already put Linnet's environment on sys.path.

Per request (`execute` returns at once; Triton may send the next batch of requests while these run):
- the inputs are read and checked on Triton's thread (a bad value is answered with an INVALID_ARG error and the
  FINAL flag; nothing else is affected), and the request is submitted to the engine (its full queue is UNAVAILABLE,
  a prompt plus max_tokens over the cache INVALID_ARG, as the HTTP server's 429/503 and 400);
- a thread of the instance relays the engine's events: with `stream` true, one response per `Delta` (its text),
  then the FINAL flag alone; otherwise one response holding the whole text, with the FINAL flag. A request the
  client cancelled (`sender.is_cancelled()`, Triton 23.10+) is cancelled in the engine, which frees its row at the
  next step; it still ends with the FINAL flag, as the Python backend requires.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from linnet.errors import LinnetError

from ..sampling import SamplingParams
from .engine import ContextLengthExceeded, Delta, Engine, Finished, QueueFull, Request

__all__ = ["DEFAULT_MAX_TOKENS", "INPUTS", "LinnetModel", "TritonInputs"]

# (name, Triton data type, dims) of the model's inputs; all but text_input are optional.
INPUTS = (
    ("text_input", "TYPE_STRING", "[ 1 ]"),
    ("max_tokens", "TYPE_INT32", "[ 1 ]"),
    ("temperature", "TYPE_FP32", "[ 1 ]"),
    ("top_p", "TYPE_FP32", "[ 1 ]"),
    ("top_k", "TYPE_INT32", "[ 1 ]"),
    ("seed", "TYPE_INT64", "[ 1 ]"),
    ("stop", "TYPE_STRING", "[ -1 ]"),
    ("ignore_eos", "TYPE_BOOL", "[ 1 ]"),
    ("stream", "TYPE_BOOL", "[ 1 ]"),
)

# `max_tokens` when a request gives none: `linnet generate --max-new-tokens`'s default.
DEFAULT_MAX_TOKENS = 128


@dataclass(frozen=True)
class TritonInputs:
    """One request's inputs, read from its tensors (names: `INPUTS`)."""

    prompt: str
    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    ignore_eos: bool
    stream: bool


class LinnetModel:
    """One Triton model instance: the model on its backend, an engine over it, and a relay thread per request.

    `args` are Triton's `initialize` arguments, `config` the parsed model config, whose string `parameters` say
    what to load (linnet/runtimes/export/triton.py). Raises `pb_utils.TritonModelException` when the model cannot be
    loaded (the message names the source, the weights and the reason; Triton marks the model UNAVAILABLE and logs
    it)."""

    def __init__(self, args: dict[str, str], config: dict[str, Any], pb_utils: Any) -> None:
        from linnet.runtimes.backends import get_backend

        self.pb = pb_utils
        check_stub_numpy(pb_utils)
        parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        source = parameters.get("source", "")
        weights = parameters.get("weights") or None
        try:
            backend = get_backend(parameters.get("backend", "torch"))
            # every instance is a process: each gets an equal share of the cores (on PyTorch, its thread count)
            backend.setup_process(instances=sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1)
            model = backend.load(
                source,
                weights,
                preset=parameters.get("preset") or None,
                dtype=parameters.get("dtype", "f32"),
                max_batch=int(parameters.get("max_batch", "8")),
                max_positions=int(parameters.get("max_positions", "768")),
                progress=False,
            )
            self.tokenizer = model.tokenizer()
            if self.tokenizer is None:
                raise LinnetError(f"{model.weights} has no tokenizer (tokenizer.json); text_input needs one")
            self.engine = Engine(model.step_model(), self.tokenizer)
        except (LinnetError, OSError, ValueError) as err:
            raise pb_utils.TritonModelException(f"linnet: cannot load {source} with weights {weights}: {err}") from err
        self.engine.start()
        self._relays: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def execute(self, requests: list[Any]) -> None:
        """Read, check and submit each request; its relay thread answers it. Returns None (decoupled)."""
        for request in requests:
            sender = request.get_response_sender()
            try:
                inputs = self.read_inputs(request)
                prompt_ids = self.tokenizer.encode(inputs.prompt)
                handle = self.engine.submit(
                    Request(
                        prompt_ids, inputs.params, inputs.max_tokens, stop=inputs.stop, ignore_eos=inputs.ignore_eos
                    )
                )
            except QueueFull as err:
                self._fail(sender, f"server busy: {err}; retry later", self.pb.TritonError.UNAVAILABLE)
                continue
            except (ContextLengthExceeded, ValueError) as err:
                self._fail(sender, str(err), self.pb.TritonError.INVALID_ARG)
                continue
            relay = threading.Thread(target=self._relay, args=(handle, sender, inputs.stream), daemon=True)
            with self._lock:
                self._relays.add(relay)
            relay.start()
        return None

    def finalize(self) -> None:
        """Cancel what is running (each request still gets its FINAL flag) and stop the engine."""
        self.engine.shutdown()
        with self._lock:
            relays = list(self._relays)
        for relay in relays:
            relay.join(timeout=10)

    def read_inputs(self, request: Any) -> TritonInputs:
        """The request's inputs. Raises ValueError naming the input for a value out of range, a missing prompt, a
        prompt or stop string that is not UTF-8, or a parameter that is no input (a misspelt field of the generate
        endpoint)."""
        unknown = sorted(json.loads(request.parameters() or "{}"))
        if unknown:  # the generate endpoint turns JSON fields that are not inputs into parameters
            names = ", ".join(n for n, _, _ in INPUTS)
            raise ValueError(f"unknown parameter {', '.join(unknown)}; the inputs are {names}")
        # config.pbtxt declares text_input required, but the HTTP generate endpoint passes a body without it
        if (text_input := self._first(request, "text_input")) is None:
            raise ValueError("input text_input is required: the prompt as text")
        prompt = _text(text_input, "text_input")
        max_tokens = self._first(request, "max_tokens")
        stop = self._all(request, "stop")
        params = SamplingParams(
            temperature=float(self._first(request, "temperature", 0.0)),
            top_p=float(self._first(request, "top_p", 1.0)),
            top_k=int(self._first(request, "top_k", 0)),
            seed=None if (seed := self._first(request, "seed")) is None else int(seed),
        )
        return TritonInputs(
            prompt=prompt,
            params=params,
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens),
            stop=tuple(_text(s, "stop") for s in ([] if stop is None else stop)),
            ignore_eos=bool(self._first(request, "ignore_eos", False)),
            stream=bool(self._first(request, "stream", False)),
        )

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _all(self, request: Any, name: str) -> list[Any] | None:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy().reshape(-1).tolist()

    def _first(self, request: Any, name: str, default: Any = None) -> Any:
        """The one value of input `name` ([1]), `default` when the request does not give it. Raises ValueError
        when it holds another number of values."""
        values = self._all(request, name)
        if values is None:
            return default
        if len(values) != 1:
            raise ValueError(f"input {name} must hold one value, got {len(values)}")
        return values[0]

    def _relay(self, handle: Any, sender: Any, stream: bool) -> None:
        """Send the engine's events for one request to Triton (module docstring)."""
        pieces: list[str] = []
        try:
            for event in handle.events():
                if sender.is_cancelled():
                    handle.cancel()  # the engine frees the row at its next step and ends with Finished
                if isinstance(event, Delta) and event.text:
                    if stream:
                        sender.send(self._response(event.text))
                    else:
                        pieces.append(event.text)
                elif isinstance(event, Finished):
                    if event.finish_reason == "error":
                        self._fail(sender, f"generation failed: {event.error}", self.pb.TritonError.INTERNAL)
                    elif stream or event.finish_reason == "cancelled":
                        sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        sender.send(self._response("".join(pieces)), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
        except Exception as err:  # Triton refused a response (the client is gone): free the row, say why
            handle.cancel()
            self.pb.Logger.log_error(f"linnet: request {handle.id} stopped: {err}")
        finally:
            with self._lock:
                self._relays.discard(threading.current_thread())

    def _response(self, text: str) -> Any:
        out = self.pb.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))
        return self.pb.InferenceResponse(output_tensors=[out])

    def _fail(self, sender: Any, message: str, code: Any) -> None:
        error = self.pb.TritonError(f"linnet: {message}", code)
        sender.send(self.pb.InferenceResponse(output_tensors=[], error=error),
                    flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # fmt: skip


def check_stub_numpy(pb_utils: Any) -> None:
    """Raise `pb_utils.TritonModelException` when the stub turns Triton's buffers into numpy arrays wrongly.

    The Python backend stubs of Triton 2.51 (nvidia-pytriton 0.7.0) and earlier were built with a pybind11 that
    reads numpy's array descriptor with numpy 1's struct layout; under numpy 2 the item size comes back 0, so every
    array the stub makes from a Triton buffer has stride 0 (all its elements are the first one). A BYTES input
    then crashes the stub (`unpack_from requires a buffer of at least N bytes`) and a numeric input of more than
    one element is silently wrong. A DLPack round trip goes through the same code: [1, 2, 3] comes back
    [1, 1, 1]. docs/triton.md."""
    import numpy

    probe = pb_utils.Tensor("probe", np.arange(1, 4, dtype=np.uint8))
    back = pb_utils.Tensor.from_dlpack("probe", probe.to_dlpack()).as_numpy()
    if back.tolist() != [1, 2, 3]:
        raise pb_utils.TritonModelException(
            f"linnet: this Triton Python backend stub mangles numpy {numpy.__version__} arrays ([1, 2, 3] came back "
            f"{back.tolist()}): it needs numpy < 2 first on its sys.path; set the parameter python_path in "
            "config.pbtxt to tools/tritonserver.sh's stub-numpy folder (docs/triton.md)"
        )


def _text(value: Any, name: str) -> str:
    """A TYPE_STRING element (bytes) as text. Raises ValueError naming the input when it is not UTF-8."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"input {name} is not UTF-8 ({err.reason} at byte {err.start})") from None
