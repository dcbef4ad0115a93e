"""Where a sweep's requests go: the in-process engine, a running router, or a router the sweep
starts on a Ray cluster. The sweep only needs ``Backend``; the three differ in what they can do
beyond answering a prompt (cold answers on demand, fidelity probes) and say so by flags.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from kvwire.validate.probe import ProbedModel, ProbeResult, Recorder


class BackendError(RuntimeError):
    """The backend cannot serve what the sweep asks (e.g. no pool for a format)."""


# Seconds to wait for a router to accept the connection. `kvwire serve` opens its port only once its
# pools serve, and the Ray backend's router is up before it is asked, so a longer wait finds nothing more.
READY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    token_ids: tuple[int, ...]
    prompt_tokens: int
    prefix_pages_reused: int


class Backend(Protocol):
    description: str
    supports_cold: bool       # complete_cold(): an answer computed with no prefix-cache hit
    supports_probe: bool      # complete(..., probe=...): fidelity internals (in-process only)

    def open_format(self, fmt: str) -> None:
        """Get ready to serve ``fmt`` (the sweep runs one format at a time)."""

    def close_format(self, fmt: str) -> None: ...

    def bytes_per_token(self, fmt: str) -> float: ...

    def complete(self, fmt: str, prompt_ids: list[int], max_tokens: int,
                 probe: list[int] | None = None) -> tuple[Answer, ProbeResult | None]: ...

    def complete_cold(self, fmt: str, prompt_ids: list[int], max_tokens: int) -> Answer: ...

    def close(self) -> None: ...


class InProcessBackend:
    """One Engine per format in this process: fast to start, and the only one with probes."""

    supports_cold = True
    supports_probe = True

    def __init__(self, model, tokenizer, page_size: int = 16, chunk_size: int = 512) -> None:
        from kvwire.calibration import CALIBRATION_TEXT

        self.model = ProbedModel(model)
        self.page_size = page_size
        self.chunk_size = chunk_size
        self.calibration_ids = tokenizer.encode(CALIBRATION_TEXT)
        self.description = f"in-process engine ({model.device})"
        self._engines: dict[str, object] = {}

    def _engine(self, fmt: str, num_pages: int | None = None):
        from kvwire.engine import Engine, EngineConfig

        config = EngineConfig(kv_format=fmt, page_size=self.page_size, chunk_size=self.chunk_size,
                              num_pages=num_pages)
        return Engine(self.model, config, calibration_ids=self.calibration_ids)

    def open_format(self, fmt: str) -> None:
        self._engines = {fmt: self._engine(fmt)}   # one pool at a time: memory stays flat

    def close_format(self, fmt: str) -> None:
        self._engines.pop(fmt, None)

    def bytes_per_token(self, fmt: str) -> float:
        from kvwire.formats import KVFormat, PageFormat

        c = self.model.config
        return PageFormat(KVFormat.parse(fmt), self.page_size, c.num_layers, c.num_kv_heads, c.head_dim).bytes_per_token

    def _run(self, engine, prompt_ids: list[int], max_tokens: int) -> Answer:
        from kvwire.sampling import SamplingParams

        gen = engine.generate(prompt_ids, SamplingParams(max_tokens=max_tokens))
        tokens = tuple(gen)
        return Answer(tokens, gen.summary.prompt_tokens, gen.summary.prefix_pages_reused)

    def complete(self, fmt: str, prompt_ids: list[int], max_tokens: int,
                 probe: list[int] | None = None) -> tuple[Answer, ProbeResult | None]:
        if fmt not in self._engines:
            raise BackendError(f"format {fmt} is not open")
        engine = self._engines[fmt]
        if probe is None:
            return self._run(engine, prompt_ids, max_tokens), None
        recorder = Recorder(probe, self.model.config.num_layers)
        self.model.recorder = recorder
        try:
            answer = self._run(engine, prompt_ids, max_tokens)
        finally:
            self.model.recorder = None
        return answer, recorder.result(engine, prompt_ids)

    def complete_cold(self, fmt: str, prompt_ids: list[int], max_tokens: int) -> Answer:
        """A fresh engine with room for just this request: nothing cached, same static scales
        (calibration is deterministic)."""
        pages = math.ceil((len(prompt_ids) + max_tokens) / self.page_size) + 2
        answer = self._run(self._engine(fmt, num_pages=pages), prompt_ids, max_tokens)
        if answer.prefix_pages_reused:
            raise BackendError("a fresh engine reported a prefix-cache hit")
        return answer

    def close(self) -> None:
        self._engines.clear()


class RouterBackend:
    """A running router (`kvwire serve`): each format goes to a pool serving it."""

    supports_cold = False
    supports_probe = False

    def __init__(self, target: str, timeout_s: float = 1800.0, formats: tuple[str, ...] = ()) -> None:
        """``formats``: every format the sweep will ask for, checked against the router's pools here, so
        that a missing pool fails before any cell runs (not after the bf16 cells, whose prompts would then
        sit in the router's prefix cache and make a rerun's first asks warm)."""
        from router.client import RouterClient

        self.target = target
        self.client = RouterClient(target, timeout_s=timeout_s)
        self.description = f"router at {target}"
        self._pools: dict[str, tuple[str, float]] = {}
        try:
            self.refresh()
            self.check_formats(formats)
        except BaseException:
            self.client.close()
            raise

    def _wait_ready(self) -> None:
        """A router that is up connects at once; waiting long for a wrong --target only looks like a hang."""
        import grpc

        try:
            self.client.wait_ready(timeout_s=READY_TIMEOUT_S)
        except grpc.FutureTimeoutError:
            raise BackendError(f"no router answering at {self.target} within {READY_TIMEOUT_S:g} s: "
                               "start one with `kvwire serve` or pass --target") from None

    def refresh(self) -> None:
        """Learn the pools (kv format -> first pool serving it, bytes per token)."""
        self._wait_ready()
        self._pools = {}
        for p in self.client.list_pools().pools:
            from kvwire.formats import KVFormat

            self._pools.setdefault(KVFormat.parse(p.kv_format).name, (p.name, float(p.bytes_per_token)))

    def check_formats(self, formats: tuple[str, ...]) -> None:
        """Refuse, naming them all, the formats no pool of the router serves."""
        missing = [f for f in formats if f not in self._pools]
        if missing:
            raise BackendError(f"the router at {self.target} has no pool for {', '.join(missing)} (it serves "
                               f"{', '.join(sorted(self._pools)) or 'none'}); add pools to its config or "
                               "drop those --formats")

    def open_format(self, fmt: str) -> None:
        self.check_formats((fmt,))

    def close_format(self, fmt: str) -> None:
        pass

    def bytes_per_token(self, fmt: str) -> float:
        self.open_format(fmt)
        return self._pools[fmt][1]

    def complete(self, fmt: str, prompt_ids: list[int], max_tokens: int,
                 probe: list[int] | None = None) -> tuple[Answer, ProbeResult | None]:
        if probe is not None:
            raise BackendError("fidelity probes need the in-process engine")
        self.open_format(fmt)
        done = self.client.complete(None, prompt_ids=prompt_ids, pool=self._pools[fmt][0],
                                    max_tokens=max_tokens, temperature=0.0)
        if done.finished is None:
            raise BackendError(f"the router ended a request without a Finished message ({fmt})")
        f = done.finished
        return Answer(tuple(done.token_ids), int(f.prompt_tokens), int(f.prefix_pages_reused)), None

    def complete_cold(self, fmt: str, prompt_ids: list[int], max_tokens: int) -> Answer:
        raise BackendError("a running router cannot forget its prefix cache; only first asks are cold")

    def close(self) -> None:
        self.client.close()
