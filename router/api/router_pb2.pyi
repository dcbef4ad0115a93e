from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_ids", "kv_format", "pool", "max_tokens", "temperature", "top_p", "seed", "chat", "request_id", "ignore_eos")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_format: str
    pool: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    chat: bool
    request_id: str
    ignore_eos: bool
    def __init__(self, prompt: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., kv_format: _Optional[str] = ..., pool: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., chat: _Optional[bool] = ..., request_id: _Optional[str] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("token_ids", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("request_id", "finish_reason", "prompt_tokens", "completion_tokens", "ttft_s", "total_s", "kv_format", "pool", "wire_bytes", "wire_bf16_bytes", "prefix_pages_reused", "prefill_worker", "decode_worker", "attempts")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BF16_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_PAGES_REUSED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    kv_format: str
    pool: str
    wire_bytes: int
    wire_bf16_bytes: int
    prefix_pages_reused: int
    prefill_worker: str
    decode_worker: str
    attempts: int
    def __init__(self, request_id: _Optional[str] = ..., finish_reason: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., ttft_s: _Optional[float] = ..., total_s: _Optional[float] = ..., kv_format: _Optional[str] = ..., pool: _Optional[str] = ..., wire_bytes: _Optional[int] = ..., wire_bf16_bytes: _Optional[int] = ..., prefix_pages_reused: _Optional[int] = ..., prefill_worker: _Optional[str] = ..., decode_worker: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("delta", "finished")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    delta: TokenDelta
    finished: Finished
    def __init__(self, delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("name", "role", "alive", "pages_in_use", "pages_free", "requests")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    PAGES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    alive: bool
    pages_in_use: int
    pages_free: int
    requests: int
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., alive: _Optional[bool] = ..., pages_in_use: _Optional[int] = ..., pages_free: _Optional[int] = ..., requests: _Optional[int] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("name", "model", "kv_format", "is_default", "max_context", "page_size", "bytes_per_token", "bf16_bytes_per_token", "workers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BF16_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    kv_format: str
    is_default: bool
    max_context: int
    page_size: int
    bytes_per_token: float
    bf16_bytes_per_token: float
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., kv_format: _Optional[str] = ..., is_default: _Optional[bool] = ..., max_context: _Optional[int] = ..., page_size: _Optional[int] = ..., bytes_per_token: _Optional[float] = ..., bf16_bytes_per_token: _Optional[float] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("pool", "kv_format", "requests_ok", "requests_failed", "requests_cancelled", "requests_rejected", "retries", "wire_bytes", "wire_bf16_bytes", "prompt_tokens", "completion_tokens", "prefix_pages_reused", "workers_replaced", "workers")
    POOL_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_OK_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FAILED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WIRE_BF16_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_PAGES_REUSED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_REPLACED_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    kv_format: str
    requests_ok: int
    requests_failed: int
    requests_cancelled: int
    requests_rejected: int
    retries: int
    wire_bytes: int
    wire_bf16_bytes: int
    prompt_tokens: int
    completion_tokens: int
    prefix_pages_reused: int
    workers_replaced: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, pool: _Optional[str] = ..., kv_format: _Optional[str] = ..., requests_ok: _Optional[int] = ..., requests_failed: _Optional[int] = ..., requests_cancelled: _Optional[int] = ..., requests_rejected: _Optional[int] = ..., retries: _Optional[int] = ..., wire_bytes: _Optional[int] = ..., wire_bf16_bytes: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., prefix_pages_reused: _Optional[int] = ..., workers_replaced: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("pools", "inflight", "queued")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    inflight: int
    queued: int
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ..., inflight: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...
